"""WebSocket frames that carry no MQTT byte (pings, pongs, empty binary and continuation frames)
against the real broker with a real WebSocket client (tests/wsclient.py): each costs the loop
about as much as a packet, so they are charged to the client's control packet rate like
PINGREQ (docs/limits.md, "Control packet rate"): a flood is throttled (not read, not
disconnected), counted in limit_hits control_rate and logged once per connection, while every
ping is still answered, in order, and the MQTT bytes around them arrive intact. Frames that
carry MQTT bytes are not charged."""

from __future__ import annotations

from wsproto.events import Message, Ping, Pong

import mqttraw as m
from wsclient import over_websocket

LINE = "over its control packet rate"


def _broker(broker, **limits):
    return broker(limits=limits, listener=[
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}])


def _ws_client(b, client_id: str):
    c = over_websocket(b.raw(b.listeners[1][1]))
    assert c.connect(client_id).rc == 0
    return c


def _pongs(ws, n: int) -> list:
    """The next ``n`` pongs (bounded: 15 s for each)."""
    return [ws.wait_pong(15.0) for _ in range(n)]


def test_a_ping_flood_is_throttled_answered_in_order_counted_and_logged_once(broker, uid):
    b = _broker(broker, control_rate=200, control_burst=20)
    probe = b.client(f"{uid}-probe")
    flood = _ws_client(b, f"{uid}-flood")
    ws = flood.sock
    mark = b.mark()
    n = 300
    ws.send_raw(b"".join(ws.ws.send(Ping(b"%d" % i)) for i in range(n)))
    line = b.wait_log(lambda ln: LINE in ln, timeout=10, start=mark)
    assert line and f"{uid}-flood" in line and "control_rate 200/s" in line, line
    assert "WebSocket pings, pongs or empty frames" in line, line
    assert probe.ping() == []                   # another client is served meanwhile
    assert _pongs(ws, n) == [b"%d" % i for i in range(n)]   # each answered: not dropped
    assert flood.ping() == []                   # and still connected, MQTT still works
    s = b.stats()
    # 280 past the burst, about 4 (20 ms of 200/s) let through per throttle.
    assert s["limit_hits"]["control_rate"] >= 10, s["limit_hits"]
    assert b.client_row(f"{uid}-flood")["throttled_seconds"] > 0
    assert b.client_row(f"{uid}-probe")["throttled_seconds"] == 0
    assert len([ln for ln in b.logs[mark:] if LINE in ln]) == 1


def test_empty_frames_inside_a_message_are_charged_and_the_message_arrives_whole(broker, uid):
    """A binary message opened with part of a PUBLISH, then empty continuation frames and
    unasked-for pongs, then the rest of the PUBLISH: throttled, and the message arrives."""
    b = _broker(broker, control_rate=100, control_burst=10)
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/t", qos=1)
    flood = _ws_client(b, f"{uid}-frag")
    ws = flood.sock
    mark = b.mark()
    packet = m.publish(f"{uid}/t", b"whole", qos=1, packet_id=5)
    frames = [ws.ws.send(Message(data=packet[:3], message_finished=False))]
    for i in range(60):
        frames.append(ws.ws.send(Message(data=b"", message_finished=False)))
        frames.append(ws.ws.send(Pong(b"")))
    frames.append(ws.ws.send(Message(data=packet[3:])))
    ws.send_raw(b"".join(frames))
    assert flood.expect(m.PUBACK, 15).packet_id == 5
    got = sub.expect(m.PUBLISH, 15)
    assert (got.topic, got.payload) == (f"{uid}/t", b"whole")
    assert b.stats()["limit_hits"]["control_rate"] >= 1
    line = b.wait_log(lambda ln: LINE in ln, timeout=10, start=mark)
    assert line and f"{uid}-frag" in line, line
    assert flood.ping() == []


def test_frames_carrying_mqtt_are_not_charged(broker, uid):
    b = _broker(broker, control_rate=50, control_burst=10)
    c = _ws_client(b, f"{uid}-data")
    n = 200        # one frame each, past the burst many times over: PUBLISH has its own rates
    for i in range(n):
        c.send(m.publish(f"{uid}/t", b"x", qos=1, packet_id=i + 1))
    assert [c.expect(m.PUBACK, 15).packet_id for _ in range(n)] == list(range(1, n + 1))
    assert b.stats()["limit_hits"]["control_rate"] == 0


def test_control_rate_0_lets_pings_through_unthrottled(broker, uid):
    b = _broker(broker, control_rate=0, control_burst=1)
    c = _ws_client(b, f"{uid}-free")
    ws = c.sock
    n = 2000
    ws.send_raw(b"".join(ws.ws.send(Ping(b"%d" % i)) for i in range(n)))
    assert _pongs(ws, n) == [b"%d" % i for i in range(n)]
    assert b.stats()["limit_hits"]["control_rate"] == 0


def test_pings_before_connect_are_throttled_and_answered(broker, uid):
    """A throttle before CONNECT ends when its budget is back, not at connect_timeout."""
    b = _broker(broker, control_rate=200, control_burst=20, connect_timeout=60)
    c = over_websocket(b.raw(b.listeners[1][1]))
    ws = c.sock
    mark = b.mark()
    n = 300
    ws.send_raw(b"".join(ws.ws.send(Ping(b"%d" % i)) for i in range(n)))
    assert _pongs(ws, n) == [b"%d" % i for i in range(n)]
    line = b.wait_log(lambda ln: LINE in ln, timeout=10, start=mark)
    assert line and "(before CONNECT)" in line, line
    assert c.connect(f"{uid}-late").rc == 0
    assert c.ping() == []


def test_a_throttle_before_connect_past_the_connect_timeout_ends_at_the_timeout(broker, uid):
    """Pings before CONNECT throttle the caller for about 10 s (control_rate 0.1/s), past its
    connect_timeout of 1 s: it is closed as a connect timeout when that comes, and the loop
    serves others meanwhile (the timer found the caller due again and again in one pass: the
    broker spun until the throttle ended)."""
    b = _broker(broker, control_rate=0.1, control_burst=1, connect_timeout=1)
    c = over_websocket(b.raw(b.listeners[1][1]))
    ws = c.sock
    mark = b.mark()
    ws.send_raw(b"".join(ws.ws.send(Ping(b"%d" % i)) for i in range(2)))
    assert b.wait_log(lambda ln: LINE in ln and "(before CONNECT)" in ln, timeout=10,
                      start=mark)
    probe = b.client(f"{uid}-probe")      # connects while the caller is throttled
    assert probe.ping() == []
    line = b.wait_log(lambda ln: "no CONNECT within 1 s" in ln, timeout=5, start=mark)
    assert line, b.logs[mark:]
    assert c.expect_closed(timeout=5)
    assert b.stats()["limit_hits"]["connect_timeout"] == 1
