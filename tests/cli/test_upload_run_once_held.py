"""`upload run --once` on a log another process holds: it said "its uploader ships the
batches" for a running broker with uploading off too, where nothing ships (ops5). Now it says
what holds the log: a broker that uploads, one with uploading off (add [upload] and restart
it), or a process whose admin socket does not answer (another `run --once`)."""

from __future__ import annotations

from conftest import run_cli
from edgebroker.commitlog import CommitLog, LogOptions


def _run_once(tmp_path, data) -> str:
    config = tmp_path / "up.toml"
    config.write_text(f'data_dir = "{data}"\n[upload]\nurl = "file://{tmp_path}/landing"\n')
    r = run_cli("upload", "run", "--once", "-c", str(config))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "landing").exists()
    return r.stderr.removeprefix("edgebroker: ").rstrip("\n")


def test_a_running_broker_with_uploading_off(broker, tmp_path):
    data = tmp_path / "data"
    broker(data_dir=str(data))                                  # no [upload]
    assert _run_once(tmp_path, data) == (
        f"a running broker owns the log in {data / 'log'} and has uploading off (no [upload] "
        f"url in its configuration): nothing ships while it runs; add [upload] to its "
        f"configuration and restart it, or stop it and run this again")


def test_a_running_broker_that_uploads(broker, tmp_path):
    data = tmp_path / "data"
    broker(data_dir=str(data), upload={"url": f"file://{tmp_path}/elsewhere"})
    assert _run_once(tmp_path, data) == (
        f"a running broker owns the log in {data / 'log'}: its uploader ships the batches; use "
        f"`edgebroker upload status|pause|resume --data-dir {data}` instead")


def test_a_lock_held_with_no_admin_socket(tmp_path):
    data = tmp_path / "data"
    cl = CommitLog.open(str(data / "log"), LogOptions())       # (as another run --once)
    try:
        assert _run_once(tmp_path, data) == (
            f"another process holds the lock of {data / 'log'} (a broker, or another `upload "
            f"run --once`) and nobody answers on its admin socket; `edgebroker upload status "
            f"--data-dir {data}` tells more")
    finally:
        cl.close()
