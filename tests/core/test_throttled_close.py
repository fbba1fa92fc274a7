"""A throttled client whose peer closes (docs/limits.md, "Control packet rate"): the broker does
not read it while it is over its rate, yet sees the close. It still serves the client at its
rate for a grace of 10 s (what it sent is handled in order: a DISCONNECT at its end is handled
as usual, no will); if the client is still throttled then, it is closed as a lost connection,
what it sent that was not read yet dropped and counted, and its place in clients_connected and
max_connections is free again. A read of stray PUBACKs is charged packet by packet: the one
that takes the last token is the last handled, not the whole read at once."""

import re
import time

import mqttraw as m

GRACE = 10.0    # core.throttling.GRACE_SECONDS


def _stray_pubacks(n: int) -> bytes:
    return b"".join(m.puback(i % 65535 + 1) for i in range(n))


def test_a_throttled_client_that_closes_is_let_go_after_its_grace(broker, uid):
    b = broker(limits={"max_connections": 2})           # default control_rate: 100/s
    keep = b.client(f"{uid}-keep")
    flood = b.client(f"{uid}-flood")
    mark = b.mark()
    flood.send(_stray_pubacks(16384))   # 64 KB: minutes of debt at 100/s
    line = b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=10, start=mark)
    assert line and f"{uid}-flood" in line, line
    # The packet that took the last token stopped the handling: a throttle of about 20 ms,
    # not the read's whole debt (it was 31 s for 16 KB).
    assert float(re.search(r"for ([0-9.]+) s", line).group(1)) < 1.0, line
    flood.close()
    closed = time.monotonic()
    lost = b.wait_log(lambda ln: f"{uid}-flood" in ln and "connection lost" in ln,
                      timeout=GRACE + 10, start=mark)
    assert lost and "while throttled" in lost and "not read yet are dropped" in lost, lost
    assert GRACE - 1 <= time.monotonic() - closed < GRACE + 5
    unread = int(re.search(r"the (\d+) bytes it sent", lost).group(1))
    assert 0 < unread < 65536, lost
    s = b.stats()
    assert s["clients_connected"] == 1
    assert s["counters"]["throttled_closed_unread"] == 1
    assert s["counters"]["throttled_unread_bytes"] == unread
    again = b.client(f"{uid}-again")                     # its slot is free again
    assert again.ping() == [] and keep.ping() == []


def test_a_client_closing_during_one_long_throttle_is_let_go_after_its_grace(broker, uid):
    """One packet can cost a long throttle (a SUBSCRIBE of 20,000 filters: 2,000 tokens, 20 s
    at 100/s): the client is let go when the grace after its peer's close ends, not when its
    debt is paid."""
    b = broker(limits={"control_rate": 100, "control_burst": 10})
    c = b.client(f"{uid}-subs")
    mark = b.mark()
    c.send(m.subscribe(1, [f"{uid}/{i}" for i in range(20000)]))
    assert c.expect(m.SUBACK, 15)
    line = b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=10, start=mark)
    assert line and float(re.search(r"for ([0-9.]+) s", line).group(1)) > GRACE + 5, line
    c.send(m.pingreq() * 10)             # not read: the client is throttled
    c.close()
    closed = time.monotonic()
    lost = b.wait_log(lambda ln: f"{uid}-subs" in ln and "connection lost" in ln,
                      timeout=GRACE + 10, start=mark)
    assert lost and "the 20 bytes it sent that were not read yet are dropped" in lost, lost
    assert time.monotonic() - closed < GRACE + 3
    s = b.stats()
    assert s["clients_connected"] == 0
    assert s["counters"]["throttled_unread_bytes"] == 20


def test_a_publisher_over_its_rate_that_disconnects_and_closes_is_read_to_its_end(broker, uid):
    """45 messages over messages_rate 20/s (2 s of debt), a DISCONNECT, and the socket closed
    at once: within the grace, all are delivered in order and the DISCONNECT is handled, so
    the will is not published."""
    rate, burst, n = 20, 5, 45
    b = broker(limits={"messages_rate": rate, "messages_burst": burst})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/#")
    pub = b.client(f"{uid}-pub", will=(f"{uid}/will", b"gone"))
    mark = b.mark()
    pub.send(b"".join(m.publish(f"{uid}/t", b"%d" % i) for i in range(n)) + m.disconnect())
    pub.close()
    got = [int(sub.recv_publish(timeout=5).payload) for _ in range(n)]
    assert got == list(range(n))
    line = b.wait_log(lambda ln: f"{uid}-pub" in ln and ("disconnected" in ln or "lost" in ln),
                      timeout=5, start=mark)
    assert line and "disconnected" in line, line
    assert sub.ping() == []                              # no will
    assert b.stats()["counters"]["throttled_closed_unread"] == 0


def test_stray_pubacks_keep_to_the_control_rate(broker, uid):
    b = broker(limits={"control_rate": 100, "control_burst": 10})
    c = b.client(f"{uid}-c", keepalive=600)
    mark = b.mark()
    sent = time.monotonic()
    c.send(_stray_pubacks(210))         # 200 past the burst: about 2 s at 100/s
    assert b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=10, start=mark)
    assert c.ping(15) == []             # answered once the PUBACKs before it are handled
    assert time.monotonic() - sent >= 1.5
    assert b.stats()["limit_hits"]["control_rate"] >= 10     # many short throttles
