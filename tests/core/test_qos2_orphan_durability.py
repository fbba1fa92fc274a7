"""A restart's unclaimed inbound QoS 2 ids (core.exchange_restore, docs/persistence.md) when
the journal file carrying them cannot be made durable (diff44):

- its fdatasync fails, or the power goes while it runs: the snapshot naming that file is not
  written before the file is on disk (a restart reads the journal from the generation the
  snapshot names: a snapshot on disk pointing at a file the power cut emptied lost the ids);
- a stop on a full disk: the carry's write fails (ENOSPC), so the final snapshot is not
  written either, and the next start finds the ids in the older snapshot's journal.

Either way the publisher's re-send after the restart is not delivered twice."""

import glob
import os
import signal
from pathlib import Path

import pytest

import powercut
import shims
from conftest import until, wait_for_snapshot
from core.test_qos2_orphan_ids import Publisher, _crash_after_pubrec, _sessions
from diskfull import fill_up, in_private_mount_namespace, mount_tmpfs

KEPT = "1 packet ids of 1 clients kept"


def _journal_files(data_dir) -> list[str]:
    return glob.glob(os.path.join(str(data_dir), "exchanges-*.jsonl"))


def _resend_not_delivered_twice(b, uid: str) -> None:
    sub = b.client(f"{uid}-s", clean=False)
    assert sub.connack.session_present
    assert sub.recv_publish().payload == b"once"
    pub = Publisher(b, f"{uid}-p", False)
    pub.publish(f"{uid}/t", b"once", dup=True)      # the re-send
    assert sub.ping() == [], "the re-send was delivered twice"


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_the_power_goes_while_the_carrying_journal_is_not_on_disk(
        broker, uid, tmp_path, monkeypatch, mode):
    data = Path(_crash_after_pubrec(broker, uid, False))
    shadow = tmp_path / "shadow"
    powercut.sync_all(data, shadow)
    env = powercut.environment(data, shadow)
    fault = shims.build("fsync_fault", tmp_path)
    flag = tmp_path / "flag"
    flag.write_text("")
    faults = {"LD_PRELOAD": f"{fault} {env['LD_PRELOAD']}", "EB_FAULT_FLAG": str(flag),
              "EB_FAULT_PATH": "exchanges-", "EB_POWER_DIR": env["EB_POWER_DIR"],
              "EB_POWER_SHADOW": env["EB_POWER_SHADOW"]}
    if mode == "hang":
        faults["EB_FAULT_MODE"] = "hang"
    for name, value in faults.items():
        monkeypatch.setenv(name, value)
    b2 = broker(data_dir=str(data))
    for name in faults:
        monkeypatch.delenv(name)
    line = b2.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and KEPT in line, line
    if mode == "fail":
        assert b2.wait_log(lambda ln: "cannot fsync the QoS 2 exchange journal" in ln)
    else:
        until(lambda: Path(f"{flag}.waiting").exists(), 5, "the journal's fdatasync begun")
    assert b2.stop(signal.SIGKILL) == -signal.SIGKILL   # the power cut
    after = tmp_path / "after"
    powercut.rebuild(data, shadow, after)
    b3 = broker(data_dir=str(after))
    line = b3.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and KEPT in line, line
    _resend_not_delivered_twice(b3, uid)


def test_a_stop_on_a_full_disk_keeps_the_ids(broker, uid, tmp_path, request):
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "4m")
    data_dir = str(small / "data")
    b = broker(data_dir=data_dir)
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    sub.disconnect()
    wait_for_snapshot(data_dir, f"{uid}-s")
    pub = Publisher(b, f"{uid}-p", False)
    pub.publish(f"{uid}/t", b"once")
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL
    pub.close()
    assert f"{uid}-p" not in _sessions(data_dir), "the snapshot came first: no crash case"
    b2 = broker(data_dir=data_dir)
    line = b2.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and KEPT in line, line
    until(lambda: len(_journal_files(data_dir)) == 1, 5, "the start's snapshot")
    fill_up(small / "filler")
    b2.stop()
    os.unlink(small / "filler")
    b3 = broker(data_dir=data_dir)
    line = b3.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and KEPT in line, line
    _resend_not_delivered_twice(b3, uid)
