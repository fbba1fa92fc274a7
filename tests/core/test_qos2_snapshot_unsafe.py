"""A snapshot taken while an inbound QoS 2 message's record is not yet written.

Before, the packet id went into the session's ids awaiting PUBREL as the PUBLISH was handled,
and a snapshot taken before its record was written (here: the disk is full, the small
snapshot still fits) kept it. After a crash the restart restored the id, the publisher's
re-send (DUP, it never got PUBREC) was taken for a duplicate: PUBREC, PUBCOMP, and the message
was neither logged nor delivered. Now the snapshot leaves such an id out and the QoS 2
exchange journal's new file carries its ``I`` record, which a restart applies only when the
log holds the record. (A real full disk: a private tmpfs, tests/diskfull.py.)"""

import os
import signal

from conftest import wait_for_snapshot
from diskfull import broker_on_a_small_disk, fill_up, in_private_mount_namespace
from mqttraw import PUBCOMP, PUBREC, pubrel, publish

BIG = b"exactly once " * 8000       # about 100 KB: more than the room left on the disk
ROOM = 32 * 1024                    # what the disk keeps free: a snapshot fits, BIG does not


def _held_by_a_full_disk(broker, uid, tmp_path):
    """A broker whose disk cannot take BIG, a persistent subscriber offline, and the
    publisher's BIG (packet id 7) held in memory when a snapshot is taken."""
    b, data_dir, small, sub, pub = broker_on_a_small_disk(broker, tmp_path, uid)
    sub.disconnect()
    filler = small / "filler"
    fill_up(filler)
    os.truncate(filler, os.path.getsize(filler) - ROOM)
    pub.send(publish(f"{uid}/t", BIG, qos=2, packet_id=7))
    assert b.wait_log(lambda line: "commit log cannot write" in line, timeout=5)
    # (The publisher is not read meanwhile: its PUBREC waits for the record.)
    other = b.client(f"{uid}-o", clean=False)      # a change: a snapshot within a second
    other.subscribe(f"{uid}/other", qos=1)
    doc = wait_for_snapshot(data_dir, f"{uid}-o", pred=lambda s: s["subscriptions"])
    mine = [s for s in doc["sessions"] if s["client_id"] == f"{uid}-p"]
    assert mine and mine[0]["awaiting_release"] == [], mine
    return b, pub, data_dir, filler


def _resend_and_receive_once(b2, uid):
    sub = b2.client(f"{uid}-s", clean=False)
    pub = b2.client(f"{uid}-p", clean=False)
    pub.send(publish(f"{uid}/t", BIG, qos=2, packet_id=7, dup=True))   # the re-send
    assert pub.expect(PUBREC).packet_id == 7
    pub.send(pubrel(7))
    assert pub.expect(PUBCOMP).packet_id == 7
    assert sub.recv_publish().payload == BIG, "the message is lost"
    assert sub.ping() == [], "delivered twice"


def test_id_of_an_unwritten_qos2_message_is_not_restored(broker, uid, tmp_path, request):
    if not in_private_mount_namespace(request):
        return
    b, _, data_dir, filler = _held_by_a_full_disk(broker, uid, tmp_path)
    b.stop(signal.SIGKILL)          # the record was never written
    os.unlink(filler)
    _resend_and_receive_once(broker(data_dir=data_dir), uid)


def test_id_left_out_of_a_snapshot_is_journaled_once_written(broker, uid, tmp_path, request):
    if not in_private_mount_namespace(request):
        return
    b, pub, data_dir, filler = _held_by_a_full_disk(broker, uid, tmp_path)
    os.unlink(filler)
    assert pub.expect(PUBREC, timeout=5).packet_id == 7     # written once there is room
    b.stop(signal.SIGKILL)          # before any other snapshot: the journal has the id
    _resend_and_receive_once(broker(data_dir=data_dir), uid)
