"""A message in flight sent again, on a connection whose server kept the session (Session
Present 1) but now says smaller limits (its 5.0 CONNACK: Maximum Packet Size, Maximum QoS),
as a server restarted with another configuration does: it is answered with the refusal a
new publish gets (0x95, 0x9B) and the connection stays up, against a real Mosquitto. It was
sent as it was; the server closed the connection; the client connected again and sent it
again, for ever, with no wait (each CONNACK started the back-off again). Also: the back-off
starts again only once a connection has lasted (client/backoff.py's STABLE_AFTER)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from edgebroker.client import backoff as B
from edgebroker.client.events import Acked, Connected, Disconnected
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import Request, to_state


def until(lp: EventLoop, pred, timeout: float = 10.0) -> list:
    """``lp``'s events up to the first one for which ``pred`` holds."""
    events = []
    deadline = time.monotonic() + timeout
    while not events or not pred(events[-1]):
        left = deadline - time.monotonic()
        assert left > 0, f"not within {timeout} s: {len(events)} events, last {events[-4:]}"
        event = lp.poll(left)
        if event is not None:
            events.append(event)
    return events


@pytest.mark.parametrize("limit, qos, size, code", [
    ("max_packet_size 300", 1, 400, 0x95),
    ("max_qos 1", 2, 10, 0x9B),
], ids=["maximum-packet-size", "maximum-qos"])
def test_a_message_in_flight_beyond_the_servers_new_limit_is_answered_not_sent_again(
        mosquitto_broker, uid, tmp_path, limit, qos, size, code):
    """The session is made with Mosquitto; the state then holds a message in flight sent
    under no limit (as before a restart of the server with ``limit``). On the next
    connection it is answered ``code``, not sent; no Disconnected follows, and a message
    within the limits then goes and is acknowledged on the same connection."""
    mq = mosquitto_broker(extra=[limit])
    state = tmp_path / "state.json"
    opts = dict(client_id=f"{uid}c", protocol=5, clean_start=False,
                properties={0x11: 3600}, reconnect="always", backoff_base=0.05,
                backoff_cap=0.2, state_file=state)
    first = EventLoop(mq.host, mq.port, **opts)
    until(first, lambda e: type(e) is Connected)
    doc = first.shutdown()
    big = Request("publish", "big", f"{uid}/t", b"x" * size, qos)
    big.packet_id = 7
    doc["inflight"].append(to_state(big))
    state.write_text(json.dumps(doc))
    lp = EventLoop(mq.host, mq.port, **opts)
    assert lp.conn.inflight == 1
    events = until(lp, lambda e: type(e) is Acked and e.request.token == "big")
    assert events[0] == Connected(True, 0, events[0].properties)
    assert events[-1].reason_code == code and lp.conn.inflight == 0
    small = lp.conn.publish(f"{uid}/t", b"small", 1, token="small")
    events = until(lp, lambda e: type(e) is Acked)
    # (0x10: no matching subscribers, a success)
    assert events in ([Acked(small, 0)], [Acked(small, 0x10)]), "the connection went down"
    lp.close()


def test_the_back_off_starts_again_only_once_a_connection_lasted():
    b = B.Backoff(B.ALWAYS, 1.0, 60.0, rng=lambda: 1.0)
    assert [b.delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    b.succeeded(100.0)
    b.lost(100.0 + B.STABLE_AFTER - 0.1)      # closed soon after its CONNACK
    assert b.delay() == 8.0
    b.succeeded(200.0)
    b.lost(200.0 + B.STABLE_AFTER)            # lasted
    assert b.delay() == 1.0
    b.succeeded()                             # no time given: at once, as before
    assert b.attempts == 0 and b.up_since is None


def test_a_server_closing_each_connection_after_its_connack_meets_a_growing_wait(uid):
    """A server that answers each CONNECT with a CONNACK and closes at once: the loop's
    back-off count grows with each loss (it was set back to 0 by each CONNACK)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(10)
    accepted = []

    def serve():
        for _ in range(4):
            try:
                s, _ = srv.accept()
            except OSError:
                return
            accepted.append(time.monotonic())
            s.settimeout(5)
            s.recv(1024)                              # CONNECT
            s.sendall(bytes((0x20, 2, 0, 0)))         # CONNACK, accepted
            s.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    lp = EventLoop("127.0.0.1", srv.getsockname()[1], client_id=f"{uid}c", keepalive=0,
                   reconnect="always", backoff_base=0.05, backoff_cap=5.0)
    counts = []
    deadline = time.monotonic() + 15
    while len(counts) < 3:
        assert time.monotonic() < deadline, f"losses seen: {counts}"
        event = lp.poll(0.5)
        if type(event) is Disconnected:
            counts.append(lp.backoff.attempts)
    assert counts == [1, 2, 3]
    lp.close()
    srv.close()
    t.join(5)
