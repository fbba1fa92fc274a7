"""The broker on a disk that fills up, for real (a private tmpfs; see tests/diskfull.py):
QoS 1 is not acknowledged and its publisher not read until space returns, QoS 0 keeps
flowing to live subscribers, and nothing acknowledged is lost."""

import json
import os

from conftest import run_cli
from diskfull import fill_up, in_private_mount_namespace, mount_tmpfs
from mqttraw import PINGRESP, PUBACK, pingreq, publish


def test_disk_full_withholds_acks_and_recovers(broker, uid, tmp_path, request):
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "4m")
    b = broker(data_dir=str(small / "data"))
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/#", qos=1)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/before", b"fine", qos=1)
    assert sub.recv_publish().payload == b"fine"

    fill_up(small / "filler")
    # Large enough to need pages the full disk cannot give (a small record could still fit
    # in the last page the segment file already has).
    big = b"must not be lost " * 1200
    pub.send(publish(f"{uid}/q1", big, qos=1, packet_id=7))
    assert b.wait_log(lambda line: "commit log cannot write" in line and "No space" in line,
                      timeout=5), "no clear log line about the full disk"
    # Neither acknowledged nor routed while the disk is full (a crash now would make the
    # publisher send it again: delivered twice), and the publisher is no longer read: its
    # PINGREQ gets no answer either.
    pub.send(pingreq())
    # QoS 0 from another client still reaches live subscribers, unlogged.
    other = b.client(f"{uid}-o")
    other.publish(f"{uid}/q0", b"qos0 flows")
    assert sub.recv_publish().payload == b"qos0 flows", "the QoS 1 message went out unwritten"
    try:
        got = pub.recv_packet(timeout=1.5)
    except TimeoutError:
        got = None
    assert got is None, f"{got!r} sent while the record could not be written"

    os.unlink(small / "filler")
    # The PUBACK waits for the log write; the PINGRESP only for reading to resume: either first.
    answers = {p.type: p for p in (pub.recv_packet(timeout=5), pub.recv_packet(timeout=5))}
    assert set(answers) == {PUBACK, PINGRESP} and answers[PUBACK].packet_id == 7
    assert sub.recv_publish().payload == big              # routed once written
    assert b.wait_log(lambda line: "writes work again" in line, timeout=5)
    pub.publish(f"{uid}/after", b"again", qos=1)          # read and acknowledged again
    assert sub.recv_publish().payload == b"again"
    b.stop()
    tail = run_cli("inspect", "tail", "--data-dir", b.config["data_dir"], "--format", "json")
    payloads = [json.loads(line)["payload"] for line in tail.stdout.splitlines()]
    assert payloads == ["fine", big.decode(), "again"], tail.stdout[:300]
