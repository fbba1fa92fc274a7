"""What a client sends right behind a CONNECT whose password check runs on the worker pool:
kept as the bytes it came in (not decoded into packets, which took ~12 times the memory),
then decoded and handled in order once the check accepts the login."""

import threading
import time

import psutil

import mqttraw as m
from secfiles import write_passwords

TAIL = 256 * 1024 - 100     # one read of the broker (server/loop.py READ_BUFFER) with the CONNECT


def _peak_while_checked(b, conns, tail: bytes) -> float:
    """Each of ``conns`` sends a CONNECT with a wrong password and ``tail`` in one write: the
    broker's peak RSS growth (MB) until every check has answered (CONNACK 4)."""
    proc = psutil.Process(b.proc.pid)
    start = proc.memory_info().rss
    peak = [start]
    done = threading.Event()

    def watch():
        while not done.wait(0.005):
            peak[0] = max(peak[0], proc.memory_info().rss)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for cid, c in conns:
            c.send(m.connect(cid, username="alice", password=f"wrong-{cid}") + tail)
        for _, c in conns:
            assert c.expect(m.CONNACK, 60).rc == 4
    finally:
        done.set()
        watcher.join(5)
    for _, c in conns:
        c.close()
    return (max(peak[0], proc.memory_info().rss) - start) / 2**20


def test_packets_behind_a_connect_being_checked_cost_about_their_bytes(broker, tmp_path, uid):
    """40 connections, each a CONNECT and 256 KB of 5-byte PUBLISHes in one write, behind
    40 password checks (scrypt, two at a time): held decoded, 3 MB each (120 MB); as bytes,
    about what was read. Measured against the same logins without the PUBLISHes (the hash
    workers' own memory)."""
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw"})
    b = broker(password_file=str(pw), max_login_failures=1000)
    n = 40
    tiny = m.publish("a", b"")
    assert len(tiny) == 5
    tail = tiny * (TAIL // len(tiny))
    without = _peak_while_checked(b, [(f"{uid}-a{i}", b.raw()) for i in range(n)], b"")
    held = _peak_while_checked(b, [(f"{uid}-b{i}", b.raw()) for i in range(n)], tail)
    assert held - without < n * 1.0, (held, without)     # MB: 0.25 read, the rest margin
    assert b.client(f"{uid}-ok", username="alice", password="alice-pw").ping() == []


def test_packets_behind_a_connect_being_checked_are_all_handled_in_order(broker, tmp_path,
                                                                         uid):
    """A read of a CONNECT (its check on the worker pool), a SUBSCRIBE, 5,000 QoS 1
    PUBLISHes to it and a PINGREQ, and more of them in the reads after: each answered, in
    order, once CONNACK 0 is sent."""
    pw = write_passwords(tmp_path / "passwd", {"dev": "dev-secret-never-cached"})
    b = broker(password_file=str(pw))
    n = 5000
    c = b.raw()
    topic = f"{uid}/t"
    c.send(m.connect(uid, username="dev", password="dev-secret-never-cached")
           + m.subscribe(1, [(topic, 0)])
           + b"".join(m.publish(topic, b"%d" % i, qos=1, packet_id=i + 1) for i in range(n))
           + m.pingreq())
    ack = c.expect(m.CONNACK, 20)
    assert ack.rc == 0
    assert c.expect(m.SUBACK, 10).packet_id == 1
    got, acks, pong = [], [], False
    deadline = time.monotonic() + 60
    while (len(got) < n or len(acks) < n or not pong) and time.monotonic() < deadline:
        p = c.recv_packet(20)
        if p.type == m.PUBLISH:
            got.append(p.payload)
        elif p.type == m.PUBACK:
            acks.append(p.packet_id)
        else:
            assert p.type == m.PINGRESP, p
            pong = True
    assert got == [b"%d" % i for i in range(n)]
    assert acks == list(range(1, n + 1))
    assert pong
    assert c.ping() == []
