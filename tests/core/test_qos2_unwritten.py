"""A QoS 2 message the log cannot write yet is not delivered (issue 26, item 6).

Before, a message held in memory while the disk was full went to live subscribers at once
while its PUBREC waited; a crash then lost the record, the publisher sent the message again,
and the QoS 2 subscriber got it twice. Now it is routed only once written: across the crash
the subscriber gets it once, from the publisher's re-send. (A real full disk: a private
tmpfs, tests/diskfull.py.)"""

import os
import signal

from diskfull import broker_on_a_small_disk, fill_up, in_private_mount_namespace
from mqttraw import PUBCOMP, PUBREC, pubrel, publish


def test_qos2_held_by_a_full_disk_then_a_crash_is_delivered_once(broker, uid, tmp_path,
                                                                   request):
    if not in_private_mount_namespace(request):
        return
    b, data_dir, small, sub, pub = broker_on_a_small_disk(broker, tmp_path, uid)
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
