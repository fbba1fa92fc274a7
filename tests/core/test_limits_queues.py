"""Queue, window and output-buffer limits with real clients (docs/limits.md), including a
subscriber that stops reading next to a normal pair."""

import threading
import time

import psutil
import pytest

import mqttraw as m
from mqttraw import PUBLISH

KB = b"x" * 1000


def _offline_session(b, uid):
    """A persistent QoS 1 subscription to {uid}/q whose client has gone; returns a publisher."""
    s = b.client(f"{uid}-s", clean=False)
    s.subscribe(f"{uid}/q", qos=1)
    s.disconnect()
    return b.client(f"{uid}-p")


@pytest.mark.parametrize("policy, kept", [("drop_new", [1, 2, 3]), ("drop_old", [4, 5, 6])])
def test_offline_queue_full_drops_new_or_old(broker, uid, policy, kept):
    b = broker(limits={"max_queued_messages": 3, "queue_full": policy})
    pub = _offline_session(b, uid)
    mark = b.mark()
    for i in range(1, 7):
        pub.publish(f"{uid}/q", b"%d" % i, qos=1)
    stats = b.stats()
    assert stats["queued_messages"] == 3
    assert stats["dropped"]["max_queued_messages"] == 3
    assert stats["limit_hits"]["max_queued_messages"] == 3
    line = b.wait_log("queue full", start=mark)
    assert line and f"{uid}-s" in line and ("the oldest" if policy == "drop_old" else "new") in line
    assert "queue full (3 messages" in line       # as the limit found it, before a drop
    s = b.client(f"{uid}-s", clean=False)
    assert [int(s.recv_publish().payload) for _ in kept] == kept
    assert s.ping() == []
    assert b.stats()["queued_messages"] == 0
    assert b.wait_log("queue drained; 3 messages were dropped", start=mark)


def test_max_queued_bytes(broker, uid):
    b = broker(limits={"max_queued_bytes": 250})
    pub = _offline_session(b, uid)
    for i in range(5):  # ~110 bytes each: queued while less than 250 are queued
        pub.publish(f"{uid}/q", b"%d" % i + b"." * 99, qos=1)
    stats = b.stats()
    assert stats["queued_messages"] == 3 and stats["queued_bytes"] > 250
    assert stats["dropped"]["max_queued_bytes"] == 2
    s = b.client(f"{uid}-s", clean=False)
    assert [s.recv_publish().payload[:1] for _ in range(3)] == [b"0", b"1", b"2"]


def test_max_inflight_bytes(broker, uid):
    b = broker(limits={"max_inflight_bytes": 250})
    s = b.client(f"{uid}-s")
    s.subscribe(f"{uid}/q", qos=1)
    pub = b.client(f"{uid}-p")
    for i in range(6):
        pub.publish(f"{uid}/q", b"%d" % i + b"." * 99, qos=1)
    window = [s.recv_publish(ack=False) for _ in range(3)]
    assert s.ping() == []  # nothing more until acknowledged
    s.ack(window[0])
    assert s.recv_publish(ack=False).payload[:1] == b"3"
    assert b.stats()["limit_hits"]["max_inflight_bytes"] == 1
    row = b.client_row(f"{uid}-s")
    assert row["inflight"] == 3 and row["queued"] == 2


def test_a_returning_session_gets_its_queue_within_the_window(broker, uid):
    # The session had nothing in flight when it came back: its queue goes out
    # max_inflight_messages at a time all the same.
    b = broker(limits={"max_inflight_messages": 5})
    pub = _offline_session(b, uid)
    for i in range(12):
        pub.publish(f"{uid}/q", b"%d" % i, qos=1)
    s = b.client(f"{uid}-s", clean=False)
    window = [s.recv_publish(ack=False) for _ in range(5)]
    assert s.ping() == []  # nothing more until acknowledged
    row = b.client_row(f"{uid}-s")
    assert row["inflight"] == 5 and row["queued"] == 7
    s.ack(window[0])
    assert s.recv_publish(ack=False).payload == b"5"
    assert s.ping() == []


@pytest.mark.parametrize("mode", ["log", "queue"])
def test_stuck_qos0_subscriber_is_bounded_and_does_not_slow_a_normal_pair(broker, uid, mode):
    """A QoS 0 subscriber that stops reading costs the broker no memory and the others no
    time. At the defaults it falls behind and reads from the log when it reads again, losing
    nothing; with max_queued_messages set (in-memory queues, Mosquitto's meaning) what does
    not fit max_pending_write_bytes is dropped, counted and logged once per episode."""
    limit = 64 * 1024
    limits = {"max_pending_write_bytes": limit}
    if mode == "queue":
        limits["max_queued_messages"] = 1000
    # Durability is not what this tests (and "none" keeps the log's flusher out of the timing).
    b = broker(limits=limits, log={"durability": "none"})
    stuck = b.client(f"{uid}-stuck", rcvbuf=4096)
    stuck.subscribe("#")                        # everything, and never reads
    normal_sub = b.client(f"{uid}-nsub")
    normal_sub.subscribe(f"{uid}/normal", qos=1)
    normal_pub = b.client(f"{uid}-npub")
    flood = b.client(f"{uid}-flood")
    rss0 = psutil.Process(b.proc.pid).memory_info().rss
    mark = b.mark()

    n_flood, n_normal = 8000, 300               # 8 MB of QoS 0 to the stuck client
    flooder = threading.Thread(
        target=flood.send, args=(b"".join(m.publish(f"{uid}/flood/{i % 10}", b"%05d" % i + KB)
                                          for i in range(n_flood)),))
    flooder.start()
    t0 = time.monotonic()
    for i in range(n_normal):
        normal_pub.publish(f"{uid}/normal", b"%d" % i, qos=1)
    got = [int(normal_sub.recv_publish().payload) for _ in range(n_normal)]
    normal_time = time.monotonic() - t0
    flooder.join(10)
    assert not flooder.is_alive()
    assert flood.ping(timeout=10) == []         # the broker has handled the whole flood
    assert got == list(range(n_normal))
    assert normal_time < 10

    row = b.client_row(f"{uid}-stuck")
    assert row["pending_write_bytes"] <= limit + len(KB) + 100, row
    assert psutil.Process(b.proc.pid).memory_info().rss - rss0 < 6 * 2 ** 20
    stats = b.stats()
    if mode == "log":
        assert row["cursor"] is not None and row["lag_records"] > n_flood // 2, row
        assert row["dropped"] == 0 and stats["dropped"]["max_pending_write_bytes"] == 0
        assert stats["sessions_behind"] == 1
        # The hit is logged once, with whom and from where it reads now.
        lines = [ln for ln in b.logs[mark:] if "does not read fast enough" in ln]
        assert len(lines) == 1 and f"{uid}-stuck" in lines[0], lines
        assert "max_pending_write_bytes" in lines[0] and "from offset" in lines[0]
        # Once it reads again, everything arrives in order: what it had been sent, then the
        # rest from the log, then it is routed to again.
        flood_got, normal_got = [], []
        while len(flood_got) < n_flood or len(normal_got) < n_normal:
            p = stuck.recv_publish(timeout=10)
            if p.topic.startswith(f"{uid}/flood/"):
                flood_got.append(int(p.payload[:5]))
            else:
                normal_got.append(int(p.payload))
        assert flood_got == list(range(n_flood)) and normal_got == list(range(n_normal))
        normal_pub.publish(f"{uid}/normal", b"live", qos=1)
        assert stuck.recv_publish(timeout=10).payload == b"live"
        assert b.stats()["sessions_behind"] == 0
        return
    assert row["drops"]["max_pending_write_bytes"] > n_flood // 2, row
    assert stats["dropped"]["max_pending_write_bytes"] == row["dropped"]
    line = b.wait_log("does not read fast enough", start=mark)
    assert line and f"{uid}-stuck" in line and "max_pending_write_bytes" in line

    # Once it reads again, what was kept arrives and the episode is summed up in the log.
    kept = stuck.ping(timeout=10)
    assert kept and all(p.type == PUBLISH for p in kept)
    line = b.wait_log("output drained", start=mark)
    assert line and "QoS 0 messages were dropped" in line and f"{uid}-stuck" in line, line
    assert len([ln for ln in b.logs[mark:] if "does not read fast enough" in ln]) == 1


def test_stuck_qos1_subscriber_keeps_messages_in_its_queue_until_it_reads(broker, uid):
    limit = 16 * 1024
    # Durability is not what this tests (the 200 QoS 1 publishes go one by one, each waiting for
    # its PUBACK).
    b = broker(limits={"max_pending_write_bytes": limit, "max_inflight_messages": 1000,
                       "max_inflight_bytes": 10 ** 8, "max_queued_messages": 500},
               log={"durability": "none"})
    stuck = b.client(f"{uid}-stuck", rcvbuf=4096)
    stuck.subscribe(f"{uid}/q", qos=1)
    pub = b.client(f"{uid}-p")
    n, big = 200, b"y" * 32_000    # 6.4 MB: more than the kernel's send buffer takes (4 MB)
    for i in range(n):
        pub.publish(f"{uid}/q", b"%04d" % i + big, qos=1)
    row = b.client_row(f"{uid}-stuck")
    assert row["pending_write_bytes"] <= limit + len(big) + 100, row
    assert row["queued"] > 0 and row["queued"] + row["inflight"] == n, row
    assert row["dropped"] == 0
    assert b.stats()["limit_hits"]["max_pending_write_bytes"] >= 1
    # It starts reading and acknowledging: everything arrives, in order, pumped as it drains.
    got = [int(stuck.recv_publish(timeout=5).payload[:4]) for _ in range(n)]
    assert got == list(range(n))
    assert b.client_row(f"{uid}-stuck")["queued"] == 0


def test_a_reading_qos0_subscriber_loses_nothing_when_one_pass_routes_more_than_the_limit(
        broker, uid):
    """One loop pass can route a whole burst (here 100 kB) to a subscriber before the loop
    writes to it; past max_pending_write_bytes the broker sends what the socket takes
    first, so only a client that does not read loses messages."""
    b = broker(limits={"max_pending_write_bytes": 8192}, log={"durability": "none"})
    sub = b.raw(rcvbuf=1 << 20)
    sub.connect(f"{uid}-sub")
    sub.subscribe(f"{uid}/burst")
    pub = b.raw()
    pub.connect(f"{uid}-pub")
    n = 1000
    pub.send(b"".join(m.publish(f"{uid}/burst", b"%04d" % i + b"." * 96) for i in range(n)))
    got = [int(sub.expect(PUBLISH).payload[:4]) for _ in range(n)]
    assert got == list(range(n))
    assert b.stats()["dropped"].get("max_pending_write_bytes", 0) == 0


def test_live_qos0_waits_behind_retained_qos0_queued_at_subscribe(broker, uid):
    """MQTT-4.6.0-6: a retained QoS 0 message that waits in the session queue (the SUBACK alone
    fills max_pending_write_bytes) is not overtaken by a newer QoS 0 message on its topic."""
    b = broker(limits={"max_pending_write_bytes": 1})
    t = f"{uid}/x"
    c = b.client(f"{uid}-c")
    c.publish(t, b"old", qos=0, retain=True)
    c.ping()
    c.send(m.subscribe(c.next_pid(), [(t, 0)]) + m.publish(t, b"new", qos=0))
    c.expect(m.SUBACK)
    got = [c.recv_publish() for _ in range(2)]
    assert [(p.payload, p.retain) for p in got] == [(b"old", True), (b"new", False)]
    assert c.ping() == [] and b.client_row(f"{uid}-c")["queued"] == 0


def test_qos0_is_not_held_behind_a_backlog_of_qos1(broker, uid):
    """Order is per topic and QoS: a QoS 0 message for a subscriber whose queue holds only QoS 1
    messages (its window is full) goes out at once."""
    b = broker(limits={"max_inflight_messages": 1})
    s = b.client(f"{uid}-s")
    s.subscribe(f"{uid}/q", qos=1)
    s.subscribe(f"{uid}/z", qos=0)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/q", b"1", qos=1)
    pub.publish(f"{uid}/q", b"2", qos=1)   # waits: the window holds 1
    pub.publish(f"{uid}/z", b"now", qos=0)
    first, second = s.recv_publish(ack=False), s.recv_publish()
    assert (first.payload, second.payload) == (b"1", b"now")
    assert b.client_row(f"{uid}-s")["queued"] == 1
    s.ack(first)
    assert s.recv_publish().payload == b"2"
