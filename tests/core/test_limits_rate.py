"""Publish rate limits with real clients (docs/limits.md): a client over its rate is throttled by
not reading its socket, not disconnected, and other clients are not slowed."""

import time

import mqttraw as m


def test_messages_rate_throttles_one_publisher_not_the_others(broker, uid, mosq):
    rate, burst, n = 20, 5, 45
    b = broker(limits={"messages_rate": rate, "messages_burst": burst})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/#")
    other = b.client(f"{uid}-other")
    mark = b.mark()
    t0 = time.monotonic()
    # mosquitto_pub -l: one message per stdin line, as fast as the broker reads them.
    fast = mosq("pub", b.port, "-i", f"{uid}-fast", "-t", f"{uid}/fast", "-l",
                stdin_data="".join(f"{i}\n" for i in range(n)))
    got, other_latency, t_other = [], None, 0.0
    while len(got) < n:
        p = sub.recv_publish(timeout=5)
        if p.topic == f"{uid}/other":
            other_latency = time.monotonic() - t_other
            continue
        got.append(int(p.payload))
        if len(got) == burst + 5 and other_latency is None:
            # The fast publisher is being throttled now: another publisher is not.
            assert b.stats()["throttled_clients"] == 1
            assert b.client_row(f"{uid}-fast")["throttled"] is True
            t_other = time.monotonic()
            other.publish(f"{uid}/other", b"o")
    elapsed = time.monotonic() - t0
    assert got == list(range(n))
    expected = (n - burst) / rate
    assert expected * 0.8 <= elapsed <= expected + 3.0, elapsed
    assert other_latency is not None and other_latency < 0.5, other_latency
    assert fast.wait() == 0                   # throttled, never disconnected
    s = b.stats()
    assert s["limit_hits"]["messages_rate"] >= n - burst - 5
    assert s["throttled_seconds"] > expected * 0.5
    lines = [ln for ln in b.logs[mark:] if "over its publish rate" in ln]
    assert len(lines) == 1 and f"{uid}-fast" in lines[0] and "messages_rate 20/s" in lines[0]


def test_bytes_rate_throttles_and_keeps_the_connection(broker, uid):
    rate = 20_000
    b = broker(limits={"bytes_rate": rate})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/t")
    pub = b.client(f"{uid}-pub")
    topic = f"{uid}/t"
    size = len(topic) + 1000
    n = 50
    t0 = time.monotonic()
    pub.send(b"".join(m.publish(topic, b"%03d" % i + b"." * 997) for i in range(n)))
    got = [int(sub.recv_publish(timeout=5).payload[:3]) for _ in range(n)]
    elapsed = time.monotonic() - t0
    assert got == list(range(n))
    expected = (n * size - rate) / rate        # the first second's worth passes at once
    assert expected * 0.8 <= elapsed <= expected + 3.0, elapsed
    assert pub.ping() == []
    row = b.client_row(f"{uid}-pub")
    assert row["throttled_seconds"] > expected * 0.5 and row["msgs_in"] == n
    assert b.stats()["limit_hits"]["bytes_rate"] >= 1


def test_throttled_longer_than_keepalive_is_not_disconnected(broker, uid):
    """While the broker is not reading a client, its keepalive is not held against it."""
    b = broker(limits={"messages_rate": 1, "messages_burst": 1})
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/t")
    pub = b.client(f"{uid}-pub", keepalive=1)   # expires after 1.5 s of silence
    t0 = time.monotonic()
    pub.send(b"".join(m.publish(f"{uid}/t", b"%d" % i) for i in range(4)))
    got = [int(sub.recv_publish(timeout=5).payload) for _ in range(4)]
    assert got == [0, 1, 2, 3]
    assert time.monotonic() - t0 >= 2.5          # 3 s of throttling at 1/s, minus slack
    assert pub.ping() == []                      # still connected


def test_one_long_throttle_holds_off_the_keepalive_and_keeps_the_clients_disconnect(broker, uid):
    """One PUBLISH six times the byte rate: the client is not read for about 5 s, while its
    keepalive (2 s) would expire three times over. What it sent meanwhile (PINGREQs, then
    DISCONNECT) is read once the throttle ends: answered, and no will published."""
    b = broker(limits={"bytes_rate": 1000})
    watcher = b.client(f"{uid}-w")
    watcher.subscribe(f"{uid}/will")
    pub = b.client(f"{uid}-p", keepalive=2, will=(f"{uid}/will", b"gone"))
    pub.send(m.publish(f"{uid}/big", b"x" * 6000))
    pings = 0
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:          # 7 PINGREQs, none read while throttled (the
        time.sleep(0.5)                         # first after the PUBLISH's read)
        pub.send(m.pingreq())
        pings += 1
    mark = b.mark()
    pub.send(m.disconnect())
    got = [pub.expect(m.PINGRESP, timeout=10) for _ in range(pings)]
    assert len(got) == pings
    assert b.wait_log(f"client '{uid}-p' from 127.0.0.1:{pub.local_port} disconnected",
                      timeout=10, start=mark)
    assert not any("keepalive expired" in ln for ln in b.logs)
    assert watcher.ping() == []                 # no will (MQTT-3.14.4-3)


def test_bytes_rate_charges_a_5_0_publishs_properties(broker, uid):
    """A 5.0 client cannot carry its bytes past bytes_rate in User Properties: the properties
    forwarded with a message are charged as its payload is."""
    import mqttraw5 as R
    b = broker(limits={"bytes_rate": 10_000})
    pub = R.RawClient5(b.host, b.port)
    assert pub.connect(f"{uid}-pub").reason == 0
    mark = b.mark()
    padding = [(R.USER_PROPERTY, ("pad", "x" * 6000))]
    pub.send(b"".join(R.publish5(f"{uid}/t", b"1", props=padding) for _ in range(5)))
    assert b.wait_log(lambda ln: "over its publish rate" in ln and "bytes_rate" in ln,
                      start=mark) is not None
    row = b.client_row(f"{uid}-pub")
    assert row["throttled"] is True and row["msgs_in"] >= 2
    assert b.stats()["limit_hits"]["bytes_rate"] >= 1
