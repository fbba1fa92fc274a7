"""Large PUBLISH packets through a running broker: payloads that arrive in many pieces are
received into buffers of their own, routed, logged, and come out byte for byte."""

import json
import random
import threading

import mqttraw as m
from conftest import run_cli

SIZES = [70_000, 300, 100_000, 65_536, 20_000, 10, 900_000, 16_384, 40_000]


def payloads():
    rnd = random.Random(6)
    return [rnd.randbytes(n) for n in SIZES]


def test_large_and_small_publishes_in_odd_pieces_arrive_whole_and_are_logged(broker, uid):
    b = broker(limits={"max_packet_size": 2_000_000})
    sub = b.raw()
    sub.connect(uid + "-sub")
    sub.subscribe("big/#", qos=1)
    pub = b.raw()
    pub.connect(uid + "-pub")
    bodies = payloads()
    stream = b"".join(m.publish(f"big/{i}", p, qos=i % 2, packet_id=i + 1 if i % 2 else None)
                      for i, p in enumerate(bodies))
    # Pieces of every size, some ending inside a header, some inside a payload.
    rnd = random.Random(7)
    pos = 0
    while pos < len(stream):
        n = rnd.choice((1, 3, 17, 1000, 4096, 50_000, 200_000))
        pub.send(stream[pos:pos + n])
        pos += n
    acks = [pub.expect(m.PUBACK).packet_id for _ in range(len(bodies) // 2)]
    assert acks == [i + 1 for i in range(len(bodies)) if i % 2]
    got = [sub.recv_publish(timeout=10) for _ in bodies]
    assert [p.topic for p in got] == [f"big/{i}" for i in range(len(bodies))]
    assert [p.payload for p in got] == bodies
    pub.close()
    sub.close()
    b.stop()
    data_dir = str(b.workdir / "data")
    verify = run_cli("inspect", "verify", "--data-dir", data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    topics = json.loads(run_cli("inspect", "topics", "--data-dir", data_dir, "--format",
                                "json").stdout)
    assert {t["topic"]: (t["messages"], t["bytes"]) for t in topics} == {
        f"big/{i}": (1, len(p)) for i, p in enumerate(bodies)}


def subscriber_and_publisher(b, uid):
    """A raw subscriber of ``uid/#`` (QoS 1) and a raw publisher, connected to ``b``."""
    sub = b.raw()
    sub.connect(uid + "-sub")
    sub.subscribe(f"{uid}/#", qos=1)
    pub = b.raw()
    pub.connect(uid + "-pub")
    return sub, pub


def test_runs_of_alike_large_publishes_and_what_breaks_them(broker, uid):
    # After two alike large PUBLISHes the broker reads the next as another one (header and
    # payload apart); everything that differs is decoded as usual, in order.
    b = broker(limits={"max_packet_size": 2_000_000})
    sub, pub = subscriber_and_publisher(b, uid)
    rnd = random.Random(11)
    same, other = f"{uid}/dev/1", f"{uid}/dev/2"
    sent = []   # (topic, payload, qos, packet id)
    for i in range(1, 7):
        sent.append((same, rnd.randbytes(65_536), 1, i))
    sent.append((other, rnd.randbytes(65_536), 1, 7))     # another topic of the same length
    sent += [(same, rnd.randbytes(65_536), 1, i) for i in (8, 9, 10)]
    sent.append((same, rnd.randbytes(65_537), 1, 11))     # one byte longer
    sent += [(same, rnd.randbytes(65_536), 0, None) for _ in range(3)]
    frames = [m.publish(t, p, qos=q, packet_id=pid) for t, p, q, pid in sent]
    frames.insert(9, m.pingreq())                        # a small packet between two alike
    stream = b"".join(frames)
    # In pieces of one frame and a bit, so that reads end inside headers and payloads.
    step = 65_536 + 1000
    for pos in range(0, len(stream), step):
        pub.send(stream[pos:pos + step])
    answers = [pub.recv_packet(timeout=10) for _ in range(12)]
    assert [p.packet_id for p in answers if p.type == m.PUBACK] == list(range(1, 12))
    assert [p.type for p in answers].count(m.PINGRESP) == 1
    got = [sub.recv_publish(timeout=10) for _ in sent]
    assert [(p.topic, p.payload) for p in got] == [(t, p) for t, p, _, _ in sent]
    # The same header with packet identifier 0: a protocol violation, as always.
    mark = b.mark()
    pub.send(m.publish(same, rnd.randbytes(65_536), qos=1, packet_id=0))
    assert pub.expect_closed(10)
    assert b.wait_log(lambda ln: "packet identifier 0" in ln, start=mark)


def test_many_alike_large_publishes_sent_at_once_arrive_in_order_also_when_throttled(
        broker, uid):
    # Sent in one go, so that the broker's reads take several alike frames at a time (its
    # header and payload buffers for each); a publish rate limit throttles the publisher in
    # the middle of such reads. A differing frame inside the run and one after it.
    b = broker(limits={"max_packet_size": 2_000_000, "messages_rate": 100,
                       "messages_burst": 10})
    sub, pub = subscriber_and_publisher(b, uid)
    rnd = random.Random(12)
    same = f"{uid}/dev/1"
    sent = [(same, rnd.randbytes(65_536), 1, i) for i in range(1, 31)]
    sent.insert(20, (f"{uid}/dev/2", rnd.randbytes(65_536), 1, 100))
    sent.append((same, rnd.randbytes(1000), 1, 31))
    pub.send(b"".join(m.publish(t, p, qos=q, packet_id=pid) for t, p, q, pid in sent))
    acks = [pub.expect(m.PUBACK, timeout=20).packet_id for _ in sent]
    assert acks == [pid for _, _, _, pid in sent]
    got = [sub.recv_publish(timeout=20) for _ in sent]
    assert [(p.topic, p.payload) for p in got] == [(t, p) for t, p, _, _ in sent]
    s = b.stats()
    assert s["limit_hits"]["messages_rate"] >= 1   # it was throttled on the way


def test_large_qos0_publishes_of_two_topics_and_sizes_each_keep_their_own_header(broker, uid):
    # The broker keeps the QoS 0 frame head of a large message for the next message of the
    # same topic and size; two subscribers share it. Another topic of the same length,
    # another size, and a small message in between must each get their own.
    b = broker(limits={"max_packet_size": 2_000_000})
    subs = []
    for k in range(2):
        s = b.raw()
        s.connect(f"{uid}-sub{k}")
        s.subscribe(f"{uid}/#", qos=k)
        subs.append(s)
    pub = b.raw()
    pub.connect(uid + "-pub")
    rnd = random.Random(13)
    a, c = f"{uid}/a", f"{uid}/c"
    shapes = [(a, 65_536), (a, 65_536), (c, 65_536), (a, 65_536), (a, 65_537), (a, 65_537),
              (c, 5_000), (a, 300), (a, 65_536), (a, 65_536)]
    sent = [(t, rnd.randbytes(n)) for t, n in shapes]
    pub.send(b"".join(m.publish(t, p, qos=0) for t, p in sent))
    for s in subs:
        got = [s.recv_publish(timeout=10) for _ in sent]
        assert [(p.topic, p.qos, p.retain, p.payload) for p in got] == [
            (t, 0, False, p) for t, p in sent]


def test_two_senders_of_alike_large_publishes_at_once_share_the_passes_and_lose_nothing(
        broker, uid):
    # Each connection's share of a pass is what is left of the pass's 1 MiB for large
    # packets, at least 256 KiB: with two senders at once, the second one read in a pass
    # gets what the first left, or the floor. Both send a run of alike 64 KiB frames from
    # threads started together, in pieces, so that both are ready in the same passes.
    b = broker(limits={"max_packet_size": 2_000_000})
    sub = b.raw()
    sub.connect(uid + "-sub")
    sub.subscribe(f"{uid}/#", qos=1)
    rnd = random.Random(14)
    pubs, sent = [], {}
    for k in range(2):
        pub = b.raw()
        pub.connect(f"{uid}-pub{k}")
        topic = f"{uid}/dev/{k}"
        sent[topic] = [rnd.randbytes(65_536) for _ in range(40)]
        pubs.append((pub, topic))
    start = threading.Barrier(len(pubs))

    def send(pub, topic):
        stream = b"".join(m.publish(topic, p, qos=0) for p in sent[topic])
        start.wait(10)
        for pos in range(0, len(stream), 300_000):
            pub.send(stream[pos:pos + 300_000])

    senders = [threading.Thread(target=send, args=pair) for pair in pubs]
    for t in senders:
        t.start()
    got: dict = {topic: [] for topic in sent}
    for _ in range(80):
        p = sub.recv_publish(timeout=20)
        got[p.topic].append(p.payload)
    for t in senders:
        t.join(10)
    assert got == sent
