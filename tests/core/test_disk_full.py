"""The broker on a disk that fills up, for real (a private tmpfs; see tests/diskfull.py):
QoS 1 is not acknowledged and its publisher not read until space returns, QoS 0 keeps
flowing to live subscribers, and nothing acknowledged is lost."""

import json
import os
import signal
import time

import pytest

from conftest import run_cli
from diskfull import fill_up, in_private_mount_namespace, mount_tmpfs
from mqttraw import PINGRESP, PUBACK, pingreq, publish


def _no_answer(client) -> None:
    try:
        got = client.recv_packet(timeout=1.5)
    except TimeoutError:
        got = None
    assert got is None, f"{got!r} sent while the record could not be written"


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
    _no_answer(pub)

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


def _small_disk(tmp_path):
    small = tmp_path / "small"
    mount_tmpfs(small, "4m")
    return small, str(small / "data")


def _held(b, pub, topic: str, payload: bytes, packet_id: int) -> None:
    """Publish at QoS 1 on a full disk: the write fails, the PUBACK waits."""
    pub.send(publish(topic, payload, qos=1, packet_id=packet_id))
    assert b.wait_log(lambda line: "commit log cannot write" in line, timeout=5)


def _log_payloads(data_dir: str) -> list[str]:
    tail = run_cli("inspect", "tail", "--data-dir", data_dir, "--format", "json", "-n", "1000")
    assert tail.returncode == 0, tail.stderr
    return [json.loads(line)["payload"] for line in tail.stdout.splitlines()]


def _verifies(data_dir: str) -> None:
    r = run_cli("inspect", "verify", "--data-dir", data_dir)
    assert r.returncode == 0, f"the log does not verify:\n{r.stdout}\n{r.stderr}"


def test_start_on_a_full_disk_serves_and_recovers(broker, uid, tmp_path, request):
    """A broker started on a full disk listens, routes QoS 0, withholds a QoS 1
    acknowledgement until space returns, then acknowledges it with the message in the log."""
    if not in_private_mount_namespace(request):
        return
    small, data_dir = _small_disk(tmp_path)
    first = broker(data_dir=data_dir)
    first.client(f"{uid}-p0").publish(f"{uid}/before", b"kept", qos=1)
    assert first.stop() == 0

    fill_up(small / "filler")
    b = broker(data_dir=data_dir)          # before: "cannot open the commit log ... No space"
    assert b.alive()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/#", qos=1)
    b.client(f"{uid}-o").publish(f"{uid}/q0", b"qos0 flows")
    assert sub.recv_publish().payload == b"qos0 flows"
    pub = b.client(f"{uid}-p")
    big = b"acknowledged once written " * 1000
    _held(b, pub, f"{uid}/q1", big, 9)
    _no_answer(pub)

    os.unlink(small / "filler")
    ack = pub.recv_packet(timeout=5)
    assert ack.type == PUBACK and ack.packet_id == 9
    assert b.stop() == 0
    payloads = _log_payloads(data_dir)
    assert payloads[0] == "kept" and big.decode() in payloads, payloads
    _verifies(data_dir)


def test_a_publisher_not_read_while_the_disk_is_full_is_not_cut_off_by_its_keepalive(
        broker, uid, tmp_path, request):
    """The broker, not the client, stops reading while the log cannot write: the client's
    PINGREQs wait in the kernel, and its keepalive (1 s) is not held against it."""
    if not in_private_mount_namespace(request):
        return
    small, data_dir = _small_disk(tmp_path)
    b = broker(data_dir=data_dir)
    watcher = b.client(f"{uid}-w")
    watcher.subscribe(f"{uid}/will")
    pub = b.client(f"{uid}-p", keepalive=1, will=(f"{uid}/will", b"gone"))
    fill_up(small / "filler")
    _held(b, pub, f"{uid}/q1", b"held " * 4000, 3)
    for _ in range(6):          # 3 s: twice 1.5 x the keepalive
        time.sleep(0.5)
        pub.send(pingreq())
    os.unlink(small / "filler")
    got = [pub.recv_packet(timeout=5).type for _ in range(7)]
    assert sorted(got) == [PUBACK] + [PINGRESP] * 6, got
    assert not any("keepalive expired" in ln for ln in b.logs)
    assert watcher.ping() == []


def test_stop_while_full_writes_when_room_returns(broker, uid, tmp_path, request):
    """A stop while the disk is full waits a bounded time for room: space that returns then
    gets the held records written and their acknowledgements sent before the broker exits."""
    if not in_private_mount_namespace(request):
        return
    small, data_dir = _small_disk(tmp_path)
    b = broker(data_dir=data_dir)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/a", b"acknowledged before", qos=1)
    fill_up(small / "filler")
    big = b"held in memory " * 1200
    _held(b, pub, f"{uid}/b", big, 5)
    mark = b.mark()
    b.send_signal(signal.SIGTERM)
    assert b.wait_log(lambda line: "stopping while the commit log cannot write" in line,
                      timeout=5, start=mark)
    os.unlink(small / "filler")
    # The write, the flusher's last fsync and then the PUBACK: generous on a loaded machine.
    ack = pub.recv_packet(timeout=20)
    assert ack.type == PUBACK and ack.packet_id == 5
    assert b.stop() == 0
    assert _log_payloads(data_dir) == ["acknowledged before", big.decode()]
    _verifies(data_dir)


def test_stop_while_full_keeps_every_acknowledged_message(broker, uid, tmp_path, request):
    """A stop while the disk stays full says exactly which records are lost (none of them
    acknowledged); after space returns, a restart has every acknowledged message and a log
    that verifies, and takes new messages."""
    if not in_private_mount_namespace(request):
        return
    small, data_dir = _small_disk(tmp_path)
    b = broker(data_dir=data_dir)
    pub = b.client(f"{uid}-p")
    acked = [f"acknowledged {i}" for i in range(20)]
    for text in acked:
        pub.publish(f"{uid}/a", text.encode(), qos=1)
    fill_up(small / "filler")
    big = b"never acknowledged " * 1200
    _held(b, pub, f"{uid}/b", big, 6)
    b.client(f"{uid}-o").publish(f"{uid}/c", b"qos0 while full")
    assert b.stop() == 0
    lost = b.wait_log(lambda line: "are lost, none of them acknowledged" in line, timeout=1)
    # (QoS 0 is not logged while writes fail: only the QoS 1 record waits.)
    assert lost is not None and "1 records (offsets 20..20" in lost and "No space" in lost, b.log_text()

    os.unlink(small / "filler")
    _verifies(data_dir)
    assert _log_payloads(data_dir) == acked
    again = broker(data_dir=data_dir)
    again.client(f"{uid}-p2").publish(f"{uid}/d", b"after", qos=1)
    assert again.stop() == 0
    assert _log_payloads(data_dir) == acked + ["after"]
    _verifies(data_dir)


@pytest.mark.parametrize("where", ["online", "offline"])
def test_unlogged_qos0_does_not_pass_the_backlog_of_a_session_behind(
        broker, uid, tmp_path, request, where):
    """While the disk is full, a QoS 0 message the log cannot take is dropped for a session
    behind (catching up from the log, or offline with queue_qos0_messages), counted
    ``not_logged``: sent at once, it would pass the older messages of the same topic and QoS
    from the same publisher that the session has yet to read from the log (MQTT-4.6.0-6).
    A subscriber in step still gets it."""
    if not in_private_mount_namespace(request):
        return
    small, data_dir = _small_disk(tmp_path)
    b = broker(data_dir=data_dir, limits={"queue_qos0_messages": True})
    topic = f"{uid}/t"
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(topic, qos=1)
    live = b.client(f"{uid}-l")
    live.subscribe(topic, qos=0)
    pub1, pub0 = b.client(f"{uid}-p1"), b.client(f"{uid}-p0")
    if where == "offline":
        sub.disconnect()
        assert b.wait_log(lambda ln: f"'{uid}-s'" in ln and "disconnected" in ln)
    else:
        for i in range(400):    # not read, never acknowledged: past its window and queue
            pub1.publish(topic, b"m%d" % i, qos=1)
        assert b.client_row(f"{uid}-s")["cursor"] is not None, "not behind"
    older = [b"n%d" % i for i in range(100)]
    for payload in older:       # logged: in the session's backlog
        pub0.publish(topic, payload)
    assert pub0.ping() == []
    pub1.publish(topic, b"m-written", qos=1)     # acknowledged: the records before are written
    fill_up(small / "filler")
    _held(b, pub1, f"{uid}/big", b"held " * 4000, 999)
    newer = [b"u%d" % i for i in range(50)]
    for payload in newer:       # not logged
        pub0.publish(topic, payload)
    assert pub0.ping() == []    # all handled
    got_live = [live.recv_publish().payload for _ in range(len(older) + len(newer) + 1
                                                          + (400 if where == "online" else 0))]
    assert got_live[-len(newer) - len(older) - 1:] == older + [b"m-written"] + newer

    os.unlink(small / "filler")
    if where == "offline":
        sub = b.client(f"{uid}-s", clean=False)
    got = []
    for _ in range(600):
        got.append(sub.recv_publish().payload)
        if got[-1] == b"m-written":
            break
    assert sub.ping() == []     # nothing after the last one
    assert [p for p in got if p[:1] in b"nu"] == older, got
    # Dropped for the session behind only, and counted.
    assert b.stats()["dropped"]["not_logged"] == len(newer)


def test_small_segments_under_load_stay_within_a_retention_bytes_below_the_disk(
        broker, uid, tmp_path, request):
    """(retention1 #2: retention counted a sealed segment's index at its entries while the
    file kept its 64 KiB room until the flusher trimmed it: with 64 KiB segments a 1 MiB
    disk filled under a retention_bytes of 300,000, and QoS 1 acknowledgements waited.)"""
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "1m")
    b = broker(data_dir=str(small / "data"),
               log={"segment_bytes": 65536, "retention_bytes": 240_000})
    pub = b.client(f"{uid}-p")
    payload = bytes(200)
    for burst in range(40):                # 12,000 records, about 40 segments
        for i in range(1, 301):
            pub.send(publish(f"{uid}/t", payload, qos=1, packet_id=i))
        for i in range(1, 301):
            assert pub.expect(PUBACK).packet_id == i
    assert b.stats()["counters"]["log_write_failures"] == 0
    assert not [line for line in b.logs if "commit log" in line and "cannot" in line]
    assert b.stop() == 0
