"""A QoS 2 message the log cannot write yet is not delivered (issue 26, item 6).

Before, a message held in memory while the disk was full went to live subscribers at once
while its PUBREC waited; a crash then lost the record, the publisher sent the message again,
and the QoS 2 subscriber got it twice. Now it is routed only once written: across the crash
the subscriber gets it once, from the publisher's re-send. (A real full disk: a private
tmpfs, tests/diskfull.py.)"""

import os
import signal

from conftest import wait_for_snapshot
from diskfull import fill_up, in_private_mount_namespace, mount_tmpfs
from mqttraw import PUBCOMP, PUBREC, pubrel, publish


def test_qos2_held_by_a_full_disk_then_a_crash_is_delivered_once(broker, uid, tmp_path,
                                                                   request):
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "4m")
    data_dir = str(small / "data")
    b = broker(data_dir=data_dir)
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p", clean=False)
    wait_for_snapshot(data_dir, f"{uid}-s", pred=lambda s: s["subscriptions"])
    fill_up(small / "filler")
    big = b"exactly once " * 1200      # needs pages the full disk cannot give
    pub.send(publish(f"{uid}/t", big, qos=2, packet_id=7))
    assert b.wait_log(lambda line: "commit log cannot write" in line, timeout=5)
    # Neither acknowledged nor delivered while it is only in memory.
    assert sub.ping() == [], "delivered before its record was written"
    b.stop(signal.SIGKILL)
    os.unlink(small / "filler")

    b2 = broker(data_dir=data_dir)
    sub = b2.client(f"{uid}-s", clean=False)
    pub = b2.client(f"{uid}-p", clean=False)
    pub.send(publish(f"{uid}/t", big, qos=2, packet_id=7, dup=True))   # the re-send
    assert pub.expect(PUBREC).packet_id == 7
    pub.send(pubrel(7))
    assert pub.expect(PUBCOMP).packet_id == 7
    assert sub.recv_publish().payload == big
    assert sub.ping() == [], "delivered twice"
