"""Large PUBLISH packets through a running broker: payloads that arrive in many pieces are
received into buffers of their own, routed, logged, and come out byte for byte."""

import json
import random

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
