"""The final session snapshot of a stop on a full disk (a private tmpfs; see tests/diskfull.py):
written in the room kept for it (core.snapshot_reserve), or, when even that is missing, an
error saying what is lost and exit status 1 (docs/persistence.md)."""

import errno
import json
import os
import threading
import time

from conftest import wait_for_snapshot
from diskfull import fill_up, in_private_mount_namespace, mount_tmpfs

RESERVE = "sessions.json.reserve"


def _full_disk_with_a_new_session(broker, uid, tmp_path):
    """A broker whose disk fills up after its reserve is made, and a persistent session made
    while it is full (SUBACK sent; no snapshot can hold it): (broker, data_dir, small)."""
    small = tmp_path / "small"
    mount_tmpfs(small, "4m")
    data_dir = str(small / "data")
    b = broker(data_dir=data_dir)
    reserve = os.path.join(data_dir, RESERVE)
    deadline = time.monotonic() + 10
    while not (os.path.exists(reserve) and os.stat(reserve).st_blocks > 0):
        assert time.monotonic() < deadline, "no reserve made for the final snapshot"
        threading.Event().wait(0.05)
    fill_up(small / "filler")
    mark = b.mark()
    late = b.client(f"{uid}-late", clean=False)
    late.subscribe(f"{uid}/t", qos=1)
    late.disconnect()
    assert b.wait_log("cannot write the session snapshot", timeout=10, start=mark)
    return b, data_dir, small


def test_a_stop_on_a_full_disk_writes_the_final_snapshot_in_the_room_kept_for_it(
        broker, uid, tmp_path, request):
    """The session made while the disk was full survives the stop (it was gone after the
    restart, the stop saying only "stopped")."""
    if not in_private_mount_namespace(request):
        return
    b, data_dir, small = _full_disk_with_a_new_session(broker, uid, tmp_path)
    mark = b.mark()
    assert b.stop() == 0
    assert b.wait_log("writing it in the space kept for it", timeout=1, start=mark)
    assert not any("final session snapshot" in ln and "ERROR" in ln for ln in b.logs[mark:])
    # Only the room the snapshot needed was cut from the reserve: the rest is still kept.
    assert os.stat(os.path.join(data_dir, RESERVE)).st_size > 0
    os.unlink(small / "filler")
    again = broker(data_dir=data_dir)
    late = again.raw()
    assert late.connect(f"{uid}-late", clean=False).session_present
    again.client(f"{uid}-p").publish(f"{uid}/t", b"to the session", qos=1)
    assert late.recv_publish().payload == b"to the session"


def test_a_stop_that_cannot_write_the_final_snapshot_says_what_is_lost(
        broker, uid, tmp_path, request):
    """No room and no reserve (deleted here; as when it could not be made): an error names the
    snapshot, the error and the sessions lost, and the exit status is 1 (was: "stopped", 0)."""
    if not in_private_mount_namespace(request):
        return
    b, data_dir, small = _full_disk_with_a_new_session(broker, uid, tmp_path)
    os.unlink(os.path.join(data_dir, RESERVE))
    fill_up(small / "filler2")
    mark = b.mark()
    assert b.stop() == 1
    line = b.wait_log("cannot write the final session snapshot", timeout=1, start=mark)
    assert line and "ERROR" in line and os.path.join(data_dir, "sessions.json") in line
    assert "No space left on device" in line and f"1 made since are lost: '{uid}-late'" in line
    assert b.wait_log("stopped without the final session snapshot (exit status 1)", timeout=1,
                      start=mark)


def test_a_retained_message_set_while_the_disk_is_full_is_written_in_the_room_kept(
        broker, uid, tmp_path, request):
    """The stop's snapshot then writes the retained messages' side file too (core.
    retained_side), the only copy of the message (the log could not take it): the room it
    cuts from the reserve is for both files."""
    if not in_private_mount_namespace(request):
        return
    b, data_dir, small = _full_disk_with_a_new_session(broker, uid, tmp_path)
    payload = bytes(range(256)) * 32                    # 8 KiB
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/r", payload, qos=0, retain=True)   # (QoS 0: taken, not logged)
    assert pub.ping() == []
    mark = b.mark()
    assert b.stop() == 0
    assert b.wait_log("writing it in the space kept for it", timeout=1, start=mark)
    assert not any("final session snapshot" in ln and "ERROR" in ln for ln in b.logs[mark:])
    with open(os.path.join(data_dir, "sessions.json")) as fh:
        side = json.load(fh)["retained_file"]
    assert os.path.getsize(os.path.join(data_dir, side[0])) == side[1] > len(payload)
    # The room cut from the reserve was enough for both files: the rest is still kept.
    assert os.stat(os.path.join(data_dir, RESERVE)).st_size > 0
    os.unlink(small / "filler")
    again = broker(data_dir=data_dir)
    assert again.raw().connect(f"{uid}-late", clean=False).session_present
    c = again.client(f"{uid}-c")
    c.subscribe(f"{uid}/r", qos=1)
    assert c.recv_publish().payload == payload


def test_a_retained_message_appended_at_a_stop_on_a_full_disk_takes_only_its_room(
        broker, uid, tmp_path, request):
    """A retained message changed while the disk is full: the stop's snapshot appends it to the
    side file (core.retained_side) in room cut from the reserve, for the appended bytes
    only (not for the whole file)."""
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "4m")
    data_dir = str(small / "data")
    b = broker(data_dir=data_dir)
    pub = b.client(f"{uid}-p")
    for i in range(16):
        pub.publish(f"{uid}/r/{i}", bytes([i]) * (16 << 10), qos=1, retain=True)
    s = b.client(f"{uid}-s", clean=False)
    s.subscribe(f"{uid}/none", qos=1)
    side = wait_for_snapshot(data_dir, f"{uid}-s")["retained_file"]
    reserve = os.path.join(data_dir, RESERVE)
    deadline = time.monotonic() + 10
    while not os.path.exists(reserve) or os.stat(reserve).st_size < 2 * side[1]:
        assert time.monotonic() < deadline, "no reserve made for the final snapshot"
        threading.Event().wait(0.05)
    kept = os.stat(reserve).st_size
    fill_up(small / "filler")
    changed = b"\xab" * (16 << 10)
    pub.publish(f"{uid}/r/3", changed, qos=0, retain=True)    # (QoS 0: taken, not logged)
    assert pub.ping() == []
    mark = b.mark()
    assert b.stop() == 0
    assert b.wait_log("writing it in the space kept for it", timeout=1, start=mark)
    with open(os.path.join(data_dir, "sessions.json")) as fh:
        now = json.load(fh)["retained_file"]
    assert now[:2] == [side[0], side[1] + len(changed)]
    assert 0 < kept - os.stat(reserve).st_size < side[1], (kept, side)
    os.unlink(small / "filler")
    c = broker(data_dir=data_dir).client(f"{uid}-c")
    c.subscribe(f"{uid}/r/#", qos=0)
    got = {}
    for _ in range(16):
        p = c.recv_publish()
        got[p.topic] = p.payload
    assert got == {f"{uid}/r/{i}": changed if i == 3 else bytes([i]) * (16 << 10)
                   for i in range(16)}


def test_an_append_that_finds_the_disk_full_gives_its_blocks_back(tmp_path, request):
    """An append to the side file that runs out of room left what it had written past the
    committed size, holding the disk's last free blocks until the next snapshot (the commit
    log then could not grow its index: diff29). It is cut back to the committed size."""
    if not in_private_mount_namespace(request):
        return
    from edgebroker.core.retained_side import RetainedFile
    from edgebroker.core.snapshot_retained import RetainedState
    small = tmp_path / "small"
    mount_tmpfs(small, "8m")
    side = RetainedFile(str(small))
    a = RetainedState("a", os.urandom(1 << 20), 0, None)
    head = side.write(side.plan([a]))
    side.written(head, [a])
    fill_up(small / "filler")
    os.truncate(small / "filler", os.path.getsize(small / "filler") - (2 << 20))  # 2 MiB free
    free = os.statvfs(small).f_bavail
    b = RetainedState("b", os.urandom(5 << 20), 0, None)
    try:
        side.write(side.plan([a, b]))
        raise AssertionError("the append found room")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    assert os.path.getsize(small / head[0]) == head[1]
    assert os.statvfs(small).f_bavail == free
