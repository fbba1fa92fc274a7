"""The client's TLS and WebSocket transports (client/tls.py, client/websocket.py) against the real
broker's TLS and WebSocket listeners, spoken through with the tests' own MQTT encoder
(tests/mqttraw.py over blocking.Blocking): round trips at QoS 0/1, messages far larger than a
frame or a socket buffer both ways, certificate checks and their errors, the WebSocket refusals
and close; and against a hand-made WebSocket server (wsproto's server side, here) for what the
broker never sends: pings, a text frame, a server's close."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Message, Ping, Pong,
                            Request)

import mqttraw as m
from certs import make_pki
from conftest import _start, _teardown

from .blocking import raw_over
from edgebroker.client.address import Dialer
from edgebroker.client.events import ConnectFailed
from edgebroker.client.events import Message as LoopMessage
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import make_publish, make_subscribe
from edgebroker.client.tls import TLSError, open_tls, tls_context
from edgebroker.client.websocket import WebSocketRefused, open_websocket

# The hint of a plain TCP link the server closed before its CONNACK (client/transport.py)
NO_CONNACK = ("(before the CONNACK: the server did not take the CONNECT; a TLS port (use "
              "mqtts://)? not an MQTT server? a CONNECT it found malformed?)")

TCP, TLS, MTLS, WS, WSS = range(5)
BIG = 1_000_000     # bytes: many frames, many TLS records, more than a socket buffer


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tsrv(tmp_path_factory, pki):
    """TCP; TLS; TLS with a client certificate required; ws; wss — all anonymous."""
    d = tmp_path_factory.mktemp("transports")
    server = {"certfile": str(pki.server.cert), "keyfile": str(pki.server.key)}
    b = _start(d, {"limits": {"max_inflight_bytes": 16 << 20,
                              "max_pending_write_bytes": 16 << 20}, "listener": [
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, **server},
        {"host": "127.0.0.1", "port": 0, **server, "cafile": str(pki.ca.cert),
         "require_certificate": True},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets"},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets", **server},
    ]})
    yield b
    _teardown([b])


def port(b, i):
    return b.listeners[i][1]


def plain_stream(host, port, sndbuf=None):
    """A non-blocking TCP stream with the transports' interface (the test's own)."""
    sock = socket.create_connection((host, port), timeout=5)
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.setblocking(False)
    return PlainStream(sock)


class PlainStream:
    def __init__(self, sock):
        self.sock = sock

    def fileno(self):
        return self.sock.fileno()

    def send(self, data):
        return self.sock.send(data)

    def recv(self, n):
        return self.sock.recv(n)

    def pending(self):
        return False

    def close(self):
        self.sock.close()


def roundtrip(b, client, uid, qos=1, payload=b"hello"):
    """``client`` subscribes, a TCP client publishes to it and it publishes back."""
    client.connect(f"{uid}-t")
    client.subscribe(f"{uid}/in", qos=qos)
    other = b.client(f"{uid}-o", port=port(b, TCP))
    other.subscribe(f"{uid}/out", qos=qos)
    other.publish(f"{uid}/in", payload, qos=qos)
    got = client.recv_publish(timeout=10)
    assert (got.topic, got.payload) == (f"{uid}/in", payload)
    client.publish(f"{uid}/out", payload[::-1], qos=qos, timeout=10)
    back = other.recv_publish(timeout=10)
    assert back.payload == payload[::-1]
    other.close()


# -- TLS --------------------------------------------------------------------------------------

@pytest.mark.parametrize("qos", [0, 1])
def test_tls_round_trip(tsrv, pki, uid, qos):
    t = open_tls("127.0.0.1", port(tsrv, TLS), timeout=5,
                 context=tls_context(cafile=str(pki.ca.cert)))
    c = raw_over(t)
    roundtrip(tsrv, c, uid, qos)
    c.disconnect()
    t.close()


def test_tls_large_messages_both_ways_through_pending_and_partial_writes(tsrv, pki, uid):
    payload = bytes(range(256)) * (BIG // 256)
    t = open_tls("localhost", port(tsrv, TLS), timeout=5,
                 context=tls_context(cafile=str(pki.ca.cert)))
    roundtrip(tsrv, raw_over(t), uid, 1, payload)
    t.close()


def test_tls_refuses_a_server_signed_by_another_ca(tsrv, pki):
    with pytest.raises(TLSError, match="CERTIFICATE_VERIFY_FAILED.*--cafile"):
        open_tls("127.0.0.1", port(tsrv, TLS), timeout=5,
                 context=tls_context(cafile=str(pki.other_ca.cert)))


def test_tls_checks_the_server_name_unless_insecure(tsrv, pki, uid):
    with pytest.raises(TLSError, match="example.com"):
        open_tls("127.0.0.1", port(tsrv, TLS), timeout=5, server_name="example.com",
                 context=tls_context(cafile=str(pki.ca.cert)))
    t = open_tls("127.0.0.1", port(tsrv, TLS), timeout=5, server_name="example.com",
                 context=tls_context(cafile=str(pki.other_ca.cert), verify=False))
    assert raw_over(t).connect(f"{uid}-i").rc == 0
    t.close()


def test_tls_client_certificate(tsrv, pki, uid):
    with pytest.raises(TLSError, match="requires a client certificate"):
        t = open_tls("127.0.0.1", port(tsrv, MTLS), timeout=5,
                     context=tls_context(cafile=str(pki.ca.cert)))
        raw_over(t).connect(f"{uid}-nocert")   # TLS 1.3: refused after the handshake
    ctx = tls_context(cafile=str(pki.ca.cert), certfile=str(pki.client.cert),
                      keyfile=str(pki.client.key))
    t = open_tls("127.0.0.1", port(tsrv, MTLS), timeout=5, context=ctx)
    assert raw_over(t).connect(f"{uid}-cert").rc == 0
    t.close()


def test_tls_errors_name_the_file_and_the_port(tsrv, tmp_path, pki):
    with pytest.raises(TLSError, match=f"CA file {tmp_path}/none.crt"):
        tls_context(cafile=str(tmp_path / "none.crt"))
    with pytest.raises(TLSError, match=f"client certificate {pki.ca.cert}"):
        tls_context(certfile=str(pki.ca.cert), keyfile=str(pki.client.key))
    with pytest.raises(TLSError, match=rf"127.0.0.1:{port(tsrv, TCP)}"):
        open_tls("127.0.0.1", port(tsrv, TCP), timeout=5,
                 context=tls_context(cafile=str(pki.ca.cert)))


# -- WebSocket --------------------------------------------------------------------------------

@pytest.mark.parametrize("qos", [0, 1])
def test_websocket_round_trip(tsrv, uid, qos):
    t = open_websocket(plain_stream("127.0.0.1", port(tsrv, WS)), "127.0.0.1",
                       port(tsrv, WS), timeout=5)
    roundtrip(tsrv, raw_over(t), uid, qos)
    t.close()


def test_websocket_large_message_over_a_small_send_buffer(tsrv, uid):
    """Frames cut by the stream: the rest of a frame goes out with the caller's next send."""
    payload = bytes(range(251)) * (BIG // 251)
    t = open_websocket(plain_stream("127.0.0.1", port(tsrv, WS), sndbuf=4096), "127.0.0.1",
                       port(tsrv, WS), timeout=5)
    roundtrip(tsrv, raw_over(t), uid, 1, payload)
    t.close()


def test_secure_websocket_round_trip(tsrv, pki, uid):
    stream = open_tls("localhost", port(tsrv, WSS), timeout=5,
                      context=tls_context(cafile=str(pki.ca.cert)))
    t = open_websocket(stream, "localhost", port(tsrv, WSS), timeout=5)
    roundtrip(tsrv, raw_over(t), uid, 1, b"x" * 200_000)
    t.close()


def test_websocket_refusal_gives_the_status_and_the_servers_reason(tsrv):
    with pytest.raises(WebSocketRefused, match=r"HTTP 404: no WebSocket endpoint at '/other'") \
            as info:
        open_websocket(plain_stream("127.0.0.1", port(tsrv, WS)), "127.0.0.1",
                       port(tsrv, WS), timeout=5, path="/other")
    assert info.value.status == 404


def test_websocket_close_sends_a_close_frame(tsrv, uid):
    t = open_websocket(plain_stream("127.0.0.1", port(tsrv, WS)), "127.0.0.1",
                       port(tsrv, WS), timeout=5)
    c = raw_over(t)
    c.connect(f"{uid}-close")
    mark = tsrv.mark()
    t.close()
    assert tsrv.wait_log("WebSocket closed by the client (code 1000)", start=mark)


def test_websocket_upgrade_times_out_on_a_silent_server(uid):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        stream = plain_stream("127.0.0.1", server.getsockname()[1])
        with pytest.raises(TimeoutError, match="WebSocket upgrade on 127.0.0.1"):
            open_websocket(stream, "127.0.0.1", server.getsockname()[1], timeout=0.3)


class HandMadeServer:
    """One WebSocket connection served by a thread, with wsproto's server side: it accepts
    with subprotocol mqtt, then runs ``script(conn, ws)``."""

    def __init__(self, script):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.received: list = []
        self.thread = threading.Thread(target=self._serve, args=(script,), daemon=True)
        self.thread.start()

    def _serve(self, script):
        conn, _ = self.sock.accept()
        conn.settimeout(5)
        ws = WSConnection(ConnectionType.SERVER)
        while not any(isinstance(e, Request) for e in self._read(conn, ws)):
            pass
        conn.sendall(ws.send(AcceptConnection(subprotocol="mqtt")))
        script(conn, ws, self)
        conn.close()
        self.sock.close()

    def _read(self, conn, ws):
        data = conn.recv(65536)
        ws.receive_data(data if data else None)
        events = list(ws.events())
        self.received += events
        return events

    def wait_for(self, conn, ws, kind):
        while not any(isinstance(e, kind) for e in self.received):
            self._read(conn, ws)


def test_websocket_answers_pings_and_a_servers_close():
    def script(conn, ws, server):
        conn.sendall(ws.send(Ping(b"are you there")) + ws.send(Message(data=b"\x20\x02\x00\x00")))
        server.wait_for(conn, ws, Pong)
        conn.sendall(ws.send(CloseConnection(1001, "going away")))
        server.wait_for(conn, ws, CloseConnection)

    server = HandMadeServer(script)
    t = open_websocket(plain_stream("127.0.0.1", server.port), "127.0.0.1", server.port,
                       timeout=5)
    c = raw_over(t)
    assert c.recv_packet().type == m.CONNACK
    assert c.read_until_closed() == b""         # the close frame reads as the end
    server.thread.join(5)
    pongs = [e for e in server.received if isinstance(e, Pong)]
    closes = [e for e in server.received if isinstance(e, CloseConnection)]
    assert [p.payload for p in pongs] == [b"are you there"]
    assert [c.code for c in closes] == [1001]   # the server's close, answered
    t.close()


def test_websocket_text_frame_closes_with_1003():
    def script(conn, ws, server):
        server.wait_for(conn, ws, BytesMessage)
        conn.sendall(ws.send(Message(data="not mqtt")))
        server.wait_for(conn, ws, CloseConnection)

    server = HandMadeServer(script)
    t = open_websocket(plain_stream("127.0.0.1", server.port), "127.0.0.1", server.port,
                       timeout=5)
    c = raw_over(t)
    c.send(m.connect("text"))
    with pytest.raises(ConnectionError, match="text frame"):
        c.recv_packet()
    server.thread.join(5)
    assert [e.code for e in server.received if isinstance(e, CloseConnection)] == [1003]
    t.close()


def publish_then_close(conn, ws, server):
    """CONNACK, a QoS 1 PUBLISH (the client owes a PUBACK) and the server's close frame, in
    one write; then read until the client ends the connection."""
    server.wait_for(conn, ws, BytesMessage)                      # CONNECT
    conn.sendall(ws.send(Message(data=m.connack()))
                 + ws.send(Message(data=m.publish("ws/t", b"last", qos=1, packet_id=7)))
                 + ws.send(CloseConnection(1000)))
    for _ in range(100):
        data = conn.recv(65536)
        if not data:
            break
        ws.receive_data(data)
        server.received += ws.events()


def test_the_event_loop_reads_a_close_behind_a_publish_as_the_links_end():
    """The PUBACK owed goes to a WebSocket closed by the server: BrokenPipeError (an OSError)
    from the transport, the link's loss for the loop, not wsproto's LocalProtocolError out of
    poll(). The message is given out, the close answered."""
    server = HandMadeServer(publish_then_close)
    lp = EventLoop(client_id="wsclose", reconnect="never",
                   transport_factory=Dialer(f"ws://127.0.0.1:{server.port}"))
    events = []
    for _ in range(20):
        event = lp.poll(5)
        if event is None:
            break
        events.append(event)
    lp.close()
    server.thread.join(5)
    assert [type(e).__name__ for e in events] == ["Connected", "Message", "Disconnected"]
    assert events[1].payload == b"last"
    assert [e.code for e in server.received if isinstance(e, CloseConnection)] == [1000]


def test_the_asyncio_client_reads_a_close_behind_a_publish_as_the_links_end():
    """As above, through the asyncio adapter: no exception escapes its write callback."""
    from edgebroker.client.aio import AsyncClient
    server = HandMadeServer(publish_then_close)
    errors = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        c = AsyncClient(f"ws://127.0.0.1:{server.port}", "wsclose-aio", reconnect="never")
        await c.connect()
        return [event async for event in c]

    events = asyncio.run(asyncio.wait_for(main(), 10))
    server.thread.join(5)
    assert not errors, [str(e.get("exception") or e.get("message")) for e in errors]
    assert [type(e).__name__ for e in events] == ["Connected", "Message", "Disconnected"]
    assert events[1].payload == b"last"
    assert [e.code for e in server.received if isinstance(e, CloseConnection)] == [1000]


@pytest.mark.parametrize("listener, reason", [
    (WS, "the server answered with HTTP, not MQTT ('HTTP/1.1 400 Bad Request'): a WebSocket "
         "port? use ws://"),
    (TLS, NO_CONNACK)], ids=["ws", "tls"])
def test_the_asyncio_client_names_a_port_of_another_scheme(tsrv, listener, reason):
    """mqtt:// to a WebSocket or TLS listener: ConnectError says which (the same Connection
    and hint as the event loop's, tests/client/test_cli_pubsub.py)."""
    from edgebroker.client.aio import AsyncClient, ConnectError

    async def main():
        c = AsyncClient(f"mqtt://127.0.0.1:{port(tsrv, listener)}", "scheme", reconnect="never")
        with pytest.raises(ConnectError) as err:
            await c.connect()
        await c.close()
        return str(err.value)

    assert asyncio.run(asyncio.wait_for(main(), 10)).endswith(reason)


# -- the synchronous event loop's dial (Dialer.steps in its selector) -----------------------

def test_the_event_loop_dials_tls_and_websocket_in_its_selector(tsrv, pki, uid):
    ca = str(pki.ca.cert)
    loops = [EventLoop("127.0.0.1", port(tsrv, TLS), client_id=f"{uid}t",
                       transport_options={"tls": True, "cafile": ca}),
             EventLoop(client_id=f"{uid}w", transport_factory=Dialer(
                 f"wss://127.0.0.1:{port(tsrv, WSS)}", cafile=ca))]
    for i, lp in enumerate(loops):
        res = lp.run([make_subscribe([(f"{uid}/{i}", 1)]),
                      make_publish(f"{uid}/{i}", b"over %d" % i, 1)], timeout=10)
        assert res.complete, res
        got = [e for e in res.events if type(e) is LoopMessage]
        while not got:
            event = lp.poll(10)
            assert event is not None, "the message did not come back"
            got += [event] if type(event) is LoopMessage else []
        assert got[0].payload == b"over %d" % i
        lp.close()


def test_the_event_loop_is_not_held_by_a_silent_tls_server(uid):
    """The server takes the TCP connection (its backlog) and never answers the TLS
    handshake: the loop goes on (its poll returns, the source is read) until the connect
    timeout, then reports the handshake's failure."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        where = f"127.0.0.1:{server.getsockname()[1]}"
        lp = EventLoop("127.0.0.1", server.getsockname()[1], client_id=uid,
                       transport_options={"tls": True, "verify": False}, connect_timeout=2,
                       reconnect="never")
        lp.set_source([make_publish(f"{uid}/q", b"queued", 1)])
        assert lp.poll(0.3) is None          # not a ConnectFailed after a 2 s wait in a call
        assert lp.conn.queued == 1 and lp.conn.state == "disconnected"
        events = list(lp)                    # the policy "never": the failure ends it
        assert [type(e) for e in events] == [ConnectFailed]
        assert events[0].reason == f"TLS handshake with {where}: no answer in time"
        assert lp.shutdown()["queued"][0]["topic"] == f"{uid}/q"
        lp.close()
