"""The session snapshot writer at the open-files limit (diff38): the listing of the state
directory it makes for side files of retained messages, and the snapshot's own file, fail
with EMFILE for a while. The writer says so once ("will retry"), goes on, and writes the
snapshot again once descriptors are free: a SIGKILL after that keeps the subscriptions made
meanwhile. (Before, a failed listing ended the writer's thread: no snapshot for the rest of
the run, nothing logged, and a crash lost every session change since.)"""

import json
import os
import subprocess
from pathlib import Path

from conftest import until


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _subscriptions(state_dir: str, client_id: str) -> list:
    doc = json.loads(Path(state_dir, "sessions.json").read_text())
    return sorted(s["topic"] if isinstance(s, dict) else s[0] for c in doc["sessions"]
                  if c["client_id"] == client_id for s in c["subscriptions"])


def test_snapshots_go_on_after_the_open_files_limit_was_reached(broker, uid):
    b = broker()
    data = b.config["data_dir"]
    until(lambda: Path(data, "sessions.json").exists(), 10, "the start's snapshot")
    c = b.client(f"{uid}-keep", clean=False)
    c.subscribe(f"{uid}/before", qos=1)
    until(lambda: _subscriptions(data, f"{uid}-keep") == [f"{uid}/before"], 10,
          "the first subscription in the snapshot")
    pid = b.proc.pid
    limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    soft = next(line.split()[3] for line in limits if line.startswith("Max open files"))
    mark = b.mark()
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={_open_files(pid)}:"], check=True)
    try:
        c.subscribe(f"{uid}/during", qos=1)        # (the connection exists: no descriptor)
        assert b.wait_log(lambda ln: "cannot write the session snapshot" in ln, timeout=10,
                          start=mark), b.log_text()
    finally:
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:"], check=True)
    c.subscribe(f"{uid}/after", qos=1)
    assert b.wait_log(lambda ln: "session snapshot written again" in ln, timeout=10,
                      start=mark), b.log_text()
    until(lambda: _subscriptions(data, f"{uid}-keep") == sorted(
        [f"{uid}/before", f"{uid}/during", f"{uid}/after"]), 10, "all three in the snapshot")
    assert "Traceback" not in b.log_text()
    b.stop(9)
    b2 = broker(data_dir=data)
    c2 = b2.client(f"{uid}-keep", clean=False)
    assert c2.connack.session_present
