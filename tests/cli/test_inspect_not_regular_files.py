"""A FIFO where a segment or an index file of the log should be (a mistake, a restored backup,
a broken copy): a read-only open of a FIFO waits for a writer, so every `inspect` command hung
with no output. Each command, and the broker's start, now refuse with an error naming the file
and change nothing. A `.lock` made a folder is named too (the error named only `log/`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commitlog.logutil import append_n, open_log, segment_files

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data(tmp_path):
    """A data dir whose log has 4 segments, cleanly closed, and an offline session."""
    data = tmp_path / "data"
    log = open_log(data / "log", segment_bytes=4096)
    append_n(log, 200)
    log.write_pending()
    log.close()
    assert len(segment_files(data / "log")) >= 4
    (data / "sessions.json").write_text(
        '{"format":2,"written_ms":1700000000000,"log_next_offset":200,"exchanges":1,'
        '"sessions":[{"client_id":"sub","subscriptions":[["t/#",1]],"inflight":[],"queue":[],'
        '"awaiting_release":[],"next_id":0,"cursor":0,"since":[],"offline":[[0,null]],'
        '"drops":{},"offline_ms":1700000000000}],"retained":[]}')    # (its lag reads the log)
    return data


def _fifo_at(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def _second(data: Path, suffix: str) -> Path:
    return segment_files(data / "log")[1].with_suffix(suffix)


@pytest.mark.parametrize("command", [["segments"], ["verify"], ["tail", "-n", "2"],
                                     ["topics"], ["sessions"]])
@pytest.mark.parametrize("which", ["segment", "index", "last segment"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_inspect_command_names_a_fifo_in_the_log_and_waits_for_nothing(
        data, command, which, fmt):
    path = (segment_files(data / "log")[-1] if which == "last segment"
            else _second(data, ".seg" if which == "segment" else ".idx"))
    _fifo_at(path)
    r = subprocess.run([sys.executable, "-m", "edgebroker", "inspect", *command, "--data-dir",
                        str(data), "--format", fmt], cwd=REPO, capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"not a regular file (a FIFO) ({path})" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert os.path.exists(path) and not path.is_file()


@pytest.mark.parametrize("suffix", [".seg", ".idx"])
def test_the_broker_refuses_a_fifo_segment_or_index_naming_it(broker, data, suffix):
    fifo = _fifo_at(_second(data, suffix))
    gw = broker(data_dir=str(data), wait=False)
    assert gw.proc.wait(15) == 1
    gw.stopped = True
    assert gw.wait_log(lambda ln: f"cannot open the commit log in {data / 'log'}: not a "
                                  f"regular file (a FIFO) ({fifo})" in ln), gw.log_text()
    assert not fifo.is_file() and fifo.exists()


def test_a_lock_file_made_a_folder_is_named(broker, data):
    lock = data / "log" / ".lock"
    if lock.exists():
        lock.unlink()
    lock.mkdir()
    gw = broker(data_dir=str(data), wait=False)
    assert gw.proc.wait(15) == 1
    gw.stopped = True
    assert gw.wait_log(lambda ln: f"cannot open the commit log directory {data / 'log'}: "
                                  f"Is a directory ({lock})" in ln), gw.log_text()
