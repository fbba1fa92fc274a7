"""The offline commands on a log of many segments (1500: segment_ms 10 min and 7 days of
retention keep about 1,008 on a quiet gateway) run from a shell whose open files soft limit is
1024 and hard limit 4096: they raise the soft limit to the hard one and hold two descriptors
per segment; a hard limit too low for the log is named, with the value it needs."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from commitlog.logutil import open_log

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000
SEGMENTS = 1500


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A data dir whose log holds one record in each of SEGMENTS segments."""
    data = tmp_path_factory.mktemp("many") / "data"
    log = open_log(data / "log", segment_bytes=4096, retention_ms=1 << 50)
    for i in range(SEGMENTS):
        log.append(T0 + i, 1, False, b"dev", b"site/%d" % (i % 5), b"p" * 3500)
        log.write_pending()
        log.housekeeping()
    log.close()
    assert len(list((data / "log").glob("*.seg"))) == SEGMENTS
    return data


def run(limits: tuple[int, int], *args) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    return subprocess.run([sys.executable, "-m", "edgebroker", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, preexec_fn=limit)


@pytest.mark.parametrize("command", [["inspect", "segments"], ["inspect", "tail", "-n", "2"],
                                     ["inspect", "topics"], ["inspect", "verify"],
                                     ["upload", "status"]])
def test_1500_segments_under_a_soft_limit_of_1024(many, command):
    r = run((1024, 4096), *command, "--data-dir", str(many), "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout) if command[1] != "tail" else r.stdout.splitlines()
    if command[1] == "segments":
        assert len(out) == SEGMENTS and out[-1]["last_offset"] == SEGMENTS - 1
    elif command[1] == "tail":
        assert [json.loads(line)["offset"] for line in out] == [SEGMENTS - 2, SEGMENTS - 1]
    elif command[1] == "topics":
        assert sum(t["messages"] for t in out) == SEGMENTS
    elif command[1] == "verify":
        assert out["ok"] and out["segments"] == SEGMENTS and out["records"] == SEGMENTS
    assert "Too many open files" not in r.stderr


def test_a_hard_limit_too_low_is_named_with_what_the_log_needs(many):
    r = run((1024, 1024), "inspect", "segments", "--data-dir", str(many))
    assert r.returncode == 1
    log_dir = os.path.join(many, "log")
    assert r.stderr.strip() == (
        f"edgebroker: {log_dir}: Too many open files ({SEGMENTS} segments, two descriptors "
        f"each; the open files limit is 1024, its hard limit 1024): raise the hard limit "
        f"(ulimit -Hn, as root; systemd LimitNOFILE=) to {2 * SEGMENTS + 64} or more")
