"""$SYS topics: published every sys_interval seconds as retained messages, Mosquitto's names."""

import re
import time

import pytest

import edgebroker

BASIC = [
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/bytes/received",
    "$SYS/broker/bytes/sent",
    "$SYS/broker/process/rss",
    "$SYS/broker/process/cpu",
]
LOAD = [f"$SYS/broker/load/{what}/{period}"
        for what in ("messages/received", "messages/sent", "bytes/received", "bytes/sent",
                     "publish/received", "publish/sent", "publish/dropped", "connections", "sockets")
        for period in ("1min", "5min", "15min")]
ALL = BASIC + LOAD


def collect(c, topics, timeout=6.0):
    """Latest payload per topic until every topic in ``topics`` has been seen."""
    seen = {}
    deadline = time.monotonic() + timeout
    while not set(topics) <= set(seen):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"$SYS topics never published: {sorted(set(topics) - set(seen))}"
        try:
            p = c.recv_publish(timeout=remaining)
        except TimeoutError:
            continue
        seen[p.topic] = p
    return seen


def number(payload: bytes) -> float:
    m = re.match(rb"\s*(-?\d+(?:\.\d+)?)", payload)
    assert m, f"not a number: {payload!r}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def sysbroker(tmp_path_factory):
    from conftest import _close_all_clients, _start, _teardown

    b = _start(tmp_path_factory.mktemp("sys"), {"sys_interval": 1})
    yield b
    _close_all_clients()
    _teardown([b])


def test_all_sys_topics_published(sysbroker, uid):
    c = sysbroker.client(uid)
    c.subscribe("$SYS/#")
    seen = collect(c, ALL)
    assert edgebroker.__version__ in seen["$SYS/broker/version"].payload.decode()
    # The retained value may predate this client; the next live report counts it.
    while True:
        p = c.recv_publish(timeout=5.0)
        if p.topic == "$SYS/broker/clients/connected" and not p.retain:
            break
    assert number(p.payload) >= 1
    assert number(seen["$SYS/broker/uptime"].payload) >= 0
    for t in ("messages/received", "messages/sent", "bytes/received", "bytes/sent"):
        assert number(seen[f"$SYS/broker/{t}"].payload) >= 0
    assert number(seen["$SYS/broker/process/rss"].payload) > 0
    assert number(seen["$SYS/broker/process/cpu"].payload) >= 0
    for t in LOAD:
        assert number(seen[t].payload) >= 0, t


def test_sys_messages_are_retained(sysbroker, uid):
    first = sysbroker.client(f"{uid}-1")
    first.subscribe("$SYS/broker/#")
    collect(first, BASIC)  # they have been published at least once
    late = sysbroker.client(f"{uid}-2")
    late.subscribe("$SYS/broker/#")
    seen = {}
    while not set(BASIC) <= set(seen):
        p = late.recv_publish()
        if p.retain:
            seen[p.topic] = p
        else:
            break  # live publications start once the retained ones are sent
    assert set(BASIC) <= set(seen), f"not sent as retained on subscribe: {sorted(set(BASIC) - set(seen))}"


def test_sys_published_every_interval(sysbroker, uid):
    c = sysbroker.client(uid)
    c.subscribe("$SYS/broker/uptime")
    stamps = []
    while len(stamps) < 3:
        p = c.recv_publish(timeout=3)
        if not p.retain:
            stamps.append(time.monotonic())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert all(0.5 <= g <= 2.0 for g in gaps), f"uptime published at intervals {gaps} with sys_interval=1"


def test_sys_counters_follow_traffic(sysbroker, uid):
    watch = sysbroker.client(f"{uid}-w")
    watch.subscribe("$SYS/broker/messages/received", "$SYS/broker/clients/connected")
    base = collect(watch, ["$SYS/broker/messages/received"])
    before = number(base["$SYS/broker/messages/received"].payload)
    pub = sysbroker.client(f"{uid}-p")
    extra = [sysbroker.client(f"{uid}-x{i}") for i in range(3)]
    for i in range(20):
        pub.publish(f"{uid}/t", str(i), qos=1)
    deadline = time.monotonic() + 5
    got_msgs = got_clients = False
    while not (got_msgs and got_clients):
        assert time.monotonic() < deadline, "$SYS counters did not reflect the traffic"
        p = watch.recv_publish(timeout=3)
        if p.topic.endswith("messages/received") and number(p.payload) >= before + 20:
            got_msgs = True
        if p.topic.endswith("clients/connected") and number(p.payload) >= 5:
            got_clients = True
    assert extra


def test_hash_subscriber_gets_no_sys(sysbroker, uid):
    """4.7.2 [MQTT-4.7.2-1]: '#' and '+/...' do not match '$SYS' topics."""
    everything = sysbroker.client(f"{uid}-all")
    everything.subscribe("#", "+/broker/#", "+/+/uptime", qos=1)
    watch = sysbroker.client(f"{uid}-w")
    watch.subscribe("$SYS/broker/uptime")
    while watch.recv_publish(timeout=3).retain:
        pass  # a live publication: $SYS was published after '#' was subscribed
    watch.publish(f"{uid}/marker", b"MARKER", qos=1)
    p = everything.recv_publish()
    assert p.topic == f"{uid}/marker", f"'#' subscriber got {p!r}"


def test_sys_interval_zero_publishes_nothing(broker, uid):
    b = broker(sys_interval=0)
    c = b.client(uid)
    c.subscribe("$SYS/#", f"{uid}/marker")
    assert not c.expect_closed(1.5)  # longer than a 1 s interval would need
    c.publish(f"{uid}/marker", b"MARKER")
    p = c.recv_publish()
    assert p.topic == f"{uid}/marker", f"$SYS published with sys_interval=0: {p!r}"


def test_sys_dropped_counter(broker, uid):
    """Messages dropped because a session queue is full are counted in publish/messages/dropped."""
    b = broker(sys_interval=1, limits={"max_inflight_messages": 1, "max_queued_messages": 1})
    slow = b.client(f"{uid}-slow")
    slow.subscribe(f"{uid}/t", qos=1)
    pub = b.client(f"{uid}-p")
    for i in range(10):
        pub.publish(f"{uid}/t", str(i), qos=1)
    watch = b.client(f"{uid}-w")
    watch.subscribe("$SYS/broker/publish/messages/dropped")
    deadline = time.monotonic() + 5
    while True:
        assert time.monotonic() < deadline, "dropped messages not counted"
        p = watch.recv_publish(timeout=3)
        if number(p.payload) >= 8:
            break


def test_clients_cannot_publish_to_sys(broker, uid):
    """A client's PUBLISH to $SYS is acknowledged, not delivered or retained, counted and logged once."""
    b = broker(sys_interval=0)
    watch = b.client(f"{uid}-w")
    watch.subscribe("$SYS/#", f"{uid}/marker", qos=1)
    forger = b.client(f"{uid}-f")
    forger.publish("$SYS/broker/uptime", b"999999 seconds", qos=1, retain=True)  # waits for PUBACK
    forger.publish("$SYS/fake", b"x", qos=2)                                     # full QoS 2 flow
    forger.publish(f"{uid}/marker", b"MARKER", qos=1)
    assert watch.recv_publish().topic == f"{uid}/marker"
    late = b.client(f"{uid}-late")
    late.subscribe("$SYS/broker/uptime", f"{uid}/marker")
    forger.publish(f"{uid}/marker", b"MARKER", qos=1)
    assert late.recv_publish().payload == b"MARKER", "a forged $SYS message was retained"
    lines = [line for line in b.logs if "$SYS topics are written only by the broker" in line]
    assert len(lines) == 1 and f"{uid}-f" in lines[0] and "$SYS/broker/uptime" in lines[0]
