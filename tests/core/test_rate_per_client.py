"""The rates per client id (docs/limits.md, "Publish rate"): a client that reconnects starts
from what it still owed, a takeover of a throttled connection counts and logs what it had not
read, a reload that changes a rate ends or shortens a throttle already running, and turning
memory_limit off while over it says so."""

import re
import signal
import time

import pytest

import mqttraw as m
from conftest import toml_dumps


def _reload(b, **limits) -> None:
    """``[limits]`` rewritten and applied (waits for the reload's line)."""
    mark = b.mark()
    config = dict(b.config, limits=dict(b.config.get("limits", {}), **limits))
    b.config_path.write_text(toml_dumps(config))
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=5, start=mark)


def test_a_takeover_of_a_throttled_connection_counts_and_logs_what_it_had_not_read(broker, uid):
    """100 QoS 0 messages at once over messages_rate 10 (burst 10), then the same client id
    connects again: the messages not read yet are counted (throttled_closed_unread,
    throttled_unread_bytes) and logged in the takeover line, and every other one is
    delivered: none goes missing uncounted."""
    b = broker(limits={"messages_rate": 10, "messages_burst": 10})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/#")
    dev = b.client(f"{uid}-dev")
    mark = b.mark()
    frames = [m.publish(f"{uid}/t", b"%03d" % i) for i in range(100)]
    dev.send(b"".join(frames))
    assert b.wait_log(lambda ln: "over its publish rate" in ln, timeout=5, start=mark)
    dev.close()
    again = b.client(f"{uid}-dev")
    line = b.wait_log(lambda ln: "takes over the session" in ln, timeout=5, start=mark)
    found = re.search(r"the (\d+) bytes it sent that were not read yet are dropped", line or "")
    assert found, line
    unread = int(found.group(1))
    assert unread % len(frames[0]) == 0 and 0 < unread < 100 * len(frames[0]), unread
    delivered = 100 - unread // len(frames[0])
    got = [int(sub.recv_publish(timeout=5).payload) for _ in range(delivered)]
    assert got == list(range(delivered))
    assert sub.ping() == []                             # and no more than that
    counters = b.stats()["counters"]
    assert counters["throttled_closed_unread"] == 1
    assert counters["throttled_unread_bytes"] == unread
    again.close()


def test_a_client_reconnecting_for_each_message_is_held_to_its_rate(broker, uid):
    """A connection per message (connect, QoS 1 PUBLISH, DISCONNECT: mosquitto_pub, firmware
    that connects per reading) under messages_rate 4, burst 1: the client id's bucket carries
    over, so 9 messages take 2 s as on one connection, and its rate is logged once."""
    b = broker(limits={"messages_rate": 4, "messages_burst": 1})
    mark = b.mark()
    t0 = time.monotonic()
    for i in range(9):
        c = b.client(f"{uid}-dev", keepalive=60)
        c.publish(f"{uid}/t", b"%d" % i, qos=1, timeout=10)
        c.disconnect()
    elapsed = time.monotonic() - t0
    assert elapsed >= 1.5, elapsed                      # (8 past the burst at 4/s: 2 s)
    lines = [ln for ln in b.logs[mark:] if "over its publish rate" in ln]
    assert len(lines) == 1 and "messages_rate 4/s" in lines[0], lines
    assert "logged once per connection, and not again for a connection of this client id" \
        in lines[0]


def test_a_reload_that_raises_or_ends_a_rate_ends_the_throttle_running(broker, uid):
    """A SUBSCRIBE of 20,000 filters owes 20 s at control_rate 100; 30 messages at
    messages_rate 1 owe about 30 s: reloads that turn control_rate off and raise
    messages_rate end both throttles at once, on the connections already there."""
    b = broker(limits={"control_rate": 100, "control_burst": 10, "messages_rate": 1,
                       "messages_burst": 1})
    subs = b.client(f"{uid}-subs", keepalive=600)
    mark = b.mark()
    subs.send(m.subscribe(1, [f"{uid}/f/{i}" for i in range(20000)]))
    assert subs.expect(m.SUBACK, 15)
    assert b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=10, start=mark)
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/t")
    pub = b.client(f"{uid}-pub", keepalive=600)
    pub.send(b"".join(m.publish(f"{uid}/t", b"%d" % i) for i in range(30)))
    assert b.wait_log(lambda ln: "over its publish rate" in ln, timeout=5, start=mark)
    _reload(b, control_rate=0, messages_rate=100000)
    t0 = time.monotonic()
    assert subs.ping(timeout=3) == []                   # was 20 s away
    got = [int(sub.recv_publish(timeout=3).payload) for _ in range(30)]
    assert got == list(range(30))
    assert time.monotonic() - t0 < 3
    assert b.stats()["throttled_clients"] == 0


def test_a_reload_that_lowers_control_rate_lengthens_the_debt(broker, uid):
    """What a client owes is in packets: control_rate lowered from 100 to 10 makes a 20 s
    throttle about 200 s, for a client already throttled (its PINGREQ stays unanswered)."""
    b = broker(limits={"control_rate": 100, "control_burst": 10})
    c = b.client(f"{uid}-subs", keepalive=600)
    mark = b.mark()
    c.send(m.subscribe(1, [f"{uid}/f/{i}" for i in range(2000)]))   # 200 packets: 2 s
    assert c.expect(m.SUBACK, 15)
    assert b.wait_log(lambda ln: "over its control packet rate" in ln, timeout=10, start=mark)
    _reload(b, control_rate=10)
    c.send(m.pingreq())
    with pytest.raises(TimeoutError):
        c.expect(m.PINGRESP, timeout=4)                 # (the 2 s debt would be paid by then)


def test_turning_memory_limit_off_while_over_it_says_so(broker, uid):
    b = broker()
    mark = b.mark()
    _reload(b, memory_limit=1_000_000)                  # far below any Python process
    assert b.wait_log("above memory_limit", timeout=5, start=mark)
    mark = b.mark()
    _reload(b, memory_limit=0)
    line = b.wait_log(lambda ln: "memory_limit" in ln and "accepting" in ln, timeout=5,
                      start=mark)
    assert line and "memory_limit turned off" in line and "below" not in line, line
