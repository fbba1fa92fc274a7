"""A WebSocket client whose QoS 1/2 PUBLISHes are followed, in the same write, by its close frame
(or by the end of its TCP stream) gets their PUBACK/PUBREC before the broker's close frame.

The messages were accepted and routed, but their acknowledgements waited for the pass's log
write and the close dropped them: the client sent them again after reconnecting (a duplicate).
A DISCONNECT, a bad packet or a text frame in their place already got them (core/violations.py,
core/handlers/connect.py); a close frame or a FIN now does too (``Client.connection_lost``).
"""

from __future__ import annotations

import socket
import ssl
import time

import pytest
from wsproto.events import CloseConnection, Message

from edgebroker import config
from edgebroker.core.broker import prompt_gap
import mqttraw as m
from conftest import _close_all_clients, _start, _teardown
from wsclient import over_websocket

pytestmark = pytest.mark.timeout(60)
# A connection quiet for longer than prompt_gap (at the default coalesce_ms) has its
# acknowledgements held while the loop gathers more input: the end of its stream, come
# meanwhile, is read before they are released.
QUIET = 3 * prompt_gap(config.Config())

TCP, WS, WSS = range(3)


@pytest.fixture(scope="module")
def acksrv(tmp_path_factory, pki):
    """TCP, ws and wss listeners, anonymous."""
    b = _start(tmp_path_factory.mktemp("wsacks"), {"listener": [
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets"},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets",
         "certfile": str(pki.server.cert), "keyfile": str(pki.server.key)},
    ]})
    assert len(b.listeners) == 3, b.log_text()
    yield b
    _close_all_clients()
    _teardown([b])


def ws_client(b, pki, client_id: str, listener: int):
    """A raw MQTT client over ws:// or wss://, connected."""
    port = b.listeners[listener][1]
    if listener == WSS:
        c = b.raw(port, ssl_context=ssl.create_default_context(cafile=str(pki.ca.cert)))
    else:
        c = b.raw(port)
    over_websocket(c)
    assert c.connect(client_id).rc == 0
    return c


def frames(ws, packets) -> bytes:
    """One masked binary frame per packet."""
    return b"".join(ws.ws.send(Message(data=p)) for p in packets)


@pytest.mark.parametrize("listener", [WS, WSS], ids=["ws", "wss"])
def test_publishes_then_a_close_frame_get_their_acks_before_the_close(acksrv, pki, uid,
                                                                       listener):
    sub = acksrv.client(f"{uid}-s", port=acksrv.listeners[TCP][1])
    sub.subscribe(f"{uid}/t", qos=1)
    c = ws_client(acksrv, pki, f"{uid}-c", listener)
    ws = c.sock
    ws.send_raw(frames(ws, [m.publish(f"{uid}/t", b"one", qos=1, packet_id=1),
                            m.publish(f"{uid}/t", b"two", qos=2, packet_id=2)])
                + ws.ws.send(CloseConnection(code=1000)))
    assert c.expect_closed(10)
    # Before the close frame: nothing comes after it (RFC 6455 5.5.1).
    assert [(p.type, p.packet_id) for p in c.before_close] == [(m.PUBACK, 1), (m.PUBREC, 2)]
    assert ws.close_code == 1000
    assert [sub.recv_publish().payload for _ in range(2)] == [b"one", b"two"]


def test_more_frames_than_one_read_takes_then_a_close_frame_are_all_acknowledged(acksrv, pki,
                                                                                  uid):
    """1500 PUBLISHes, one frame each, and the close: past MAX_FRAMES (server/websocket.py)
    the rest are read in a later pass, the close frame last."""
    n = 1500
    c = ws_client(acksrv, pki, f"{uid}-c", WS)
    ws = c.sock
    ws.send_raw(frames(ws, [m.publish(f"{uid}/t", b"%d" % i, qos=1, packet_id=i + 1)
                            for i in range(n)])
                + ws.ws.send(CloseConnection(code=1000)))
    assert c.expect_closed(20)
    assert [(p.type, p.packet_id) for p in c.before_close] == [
        (m.PUBACK, i + 1) for i in range(n)]
    assert ws.close_code == 1000


def test_publishes_then_the_end_of_the_tcp_stream_get_their_acks(acksrv, pki, uid):
    """No close frame: the client shuts down its sending side (it still reads), the FIN in
    the same segment as the frames (TCP_CORK holds them until it joins them)."""
    c = ws_client(acksrv, pki, f"{uid}-c", WS)
    ws = c.sock
    ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    time.sleep(QUIET)
    # One frame: the second of two frames would count as sent soon after the first (prompt_gap)
    ws.send_raw(frames(ws, [m.publish(f"{uid}/t", b"one", qos=1, packet_id=1)
                            + m.publish(f"{uid}/t", b"two", qos=2, packet_id=2)]))
    ws.sock.shutdown(socket.SHUT_WR)
    assert c.expect_closed(10)
    assert [(p.type, p.packet_id) for p in c.before_close] == [(m.PUBACK, 1), (m.PUBREC, 2)]
