"""MQTT over WebSockets with real clients against the real broker: MQTT.js in Node (ws://,
wss://), paho-mqtt with transport="websockets", and the tests' own raw client over wsproto's
client side (tests/wsclient.py). Messages cross between TCP and WebSocket clients at QoS 0/1/2;
retained messages, wills, a persistent session's backlog and large messages; ping, close and
text frames; the HTTP refusals (400, 404); limits, the ACL, the counters and the admin view the
same as on TCP; a WebSocket listener on a Unix socket.

Node and MQTT.js are installed by ``make test`` (Debian's nodejs and npm; ``npm ci`` in
tests/js). Without them these tests fail, they are not skipped.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess

import pytest
from wsproto.events import CloseConnection, Message, Ping

import mqttraw as m
from conftest import REPO, LineCollector, _close_all_clients, _start, _teardown, run_cli
from secfiles import write_acl, write_passwords
from wsclient import HandshakeRefused, WebSocketSocket, over_websocket

JS = REPO / "tests" / "js"
PASSWORDS = {"alice": "alice-ws-pw"}
# Listeners of the shared broker, by index.
TCP, WS, WSS, WS_CUSTOM, WS_UNIX = range(5)
CUSTOM_PATH = "/custom/mqtt"


@pytest.fixture(scope="module")
def wssrv(tmp_path_factory, pki):
    """TCP (anonymous); ws (anonymous); wss with a password and an ACL; ws on another path;
    ws on a Unix socket."""
    d = tmp_path_factory.mktemp("ws")
    pw = write_passwords(d / "passwd", PASSWORDS)
    acl = write_acl(d / "acl", "user alice\ntopic readwrite alice/#\ntopic read public/#\n")
    anonymous = {"allow_anonymous": True, "password_file": ""}
    b = _start(d, {"password_file": str(pw), "listener": [
        {"host": "127.0.0.1", "port": 0, **anonymous},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets", **anonymous},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets", "acl_file": str(acl),
         "certfile": str(pki.server.cert), "keyfile": str(pki.server.key)},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets",
         "websocket_path": CUSTOM_PATH, **anonymous},
        {"unix_socket": str(d / "mqtt-ws.sock"), "protocol": "websockets", **anonymous},
    ]})
    assert len(b.listeners) == 4 and len(b.unix_paths) == 1, b.log_text()
    yield b
    _close_all_clients()
    _teardown([b])


def port(b, i):
    return b.listeners[i][1]


def url(b, i, scheme="ws", path="/mqtt"):
    return f"{scheme}://127.0.0.1:{port(b, i)}{path}"


def tls_context(pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca.cert))


def ws_client(b, client_id, listener=WS, path="/mqtt", expect_rc=0, pki=None, **connect_kw):
    """A raw MQTT client (tests/mqttraw.py) over a WebSocket, connected."""
    if listener == WS_UNIX:
        c = b.raw(unix_path=b.unix_paths[0])
    elif listener == WSS:
        c = b.raw(port(b, WSS), ssl_context=tls_context(pki))
    else:
        c = b.raw(port(b, listener))
    over_websocket(c, path)
    ack = c.connect(client_id, **connect_kw)
    assert ack.rc == expect_rc, f"CONNACK rc {ack.rc}, expected {expect_rc}"
    return c


# -- MQTT.js in Node ---------------------------------------------------------------------------

class MqttJs:
    """One Node process running tests/js/mqttjs_client.js: commands in, events out (JSON)."""

    def __init__(self, node: str):
        self.p = subprocess.Popen([node, str(JS / "mqttjs_client.js")], cwd=JS,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace")
        self.out = LineCollector(self.p.stdout)
        self._next = 0
        self.messages: list[dict] = []

    def send(self, op: str, **args) -> None:
        self.p.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.p.stdin.flush()

    def wait(self, event: str, timeout: float = 10.0) -> dict:
        """The next event named ``event``; messages meanwhile are kept; an error fails."""
        while True:
            line = self.out.wait(lambda _: True, timeout, start=self._next)
            assert line is not None, (f"MQTT.js: no {event!r} within {timeout} s (exit code "
                                      f"{self.p.poll()}); output:\n{self.out.text()}")
            self._next += 1
            try:
                got = json.loads(line)
            except ValueError:
                continue        # Node's own warnings
            if got["event"] == event:
                return got
            if got["event"] == "message":
                self.messages.append(got)
            elif got["event"] == "error":
                raise AssertionError(f"MQTT.js {got['op']}: {got['message']}\n{self.out.text()}")

    def connect(self, address: str, ca=None, **options) -> dict:
        self.send("connect", url=address, options={"protocolVersion": 4, **options},
                  ca=str(ca) if ca else None)
        return self.wait("connect")

    def subscribe(self, topic: str, qos: int = 0) -> list:
        self.send("subscribe", topic=topic, qos=qos)
        return self.wait("suback")["granted"]

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: dict | None = None) -> None:
        self.send("publish", topic=topic, payload_hex=payload.hex(), qos=qos, retain=retain,
                  properties=properties)
        self.wait("published")

    def message(self, timeout: float = 10.0) -> dict:
        got = self.messages.pop(0) if self.messages else self.wait("message", timeout)
        return {**got, "payload": bytes.fromhex(got["payload_hex"])}

    def end(self) -> None:
        self.send("end")
        self.wait("end")
        assert self.p.wait(10) == 0

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(5)


@pytest.fixture
def mqttjs():
    """Factory of MQTT.js processes. A machine without node or MQTT.js fails here: ``make test``
    installs both."""
    node = shutil.which("node")
    assert node, "node is not installed (make test installs Debian's nodejs)"
    assert (JS / "node_modules" / "mqtt" / "package.json").is_file(), \
        "MQTT.js is not installed in tests/js/node_modules (make test runs npm ci there)"
    started: list[MqttJs] = []

    def start() -> MqttJs:
        js = MqttJs(node)
        started.append(js)
        return js

    yield start
    for js in started:
        js.kill()


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqttjs_over_ws_and_tcp_both_ways(wssrv, mqttjs, uid, qos):
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    tcp.subscribe(f"{uid}/from-ws", qos=qos)
    js = mqttjs()
    assert js.connect(url(wssrv, WS), clientId=f"{uid}-js")["sessionPresent"] is False
    assert js.subscribe(f"{uid}/from-tcp", qos) == [qos]
    tcp.publish(f"{uid}/from-tcp", b"over tcp", qos=qos)
    got = js.message()
    assert (got["topic"], got["payload"], got["qos"]) == (f"{uid}/from-tcp", b"over tcp", qos)
    js.publish(f"{uid}/from-ws", b"over ws", qos=qos)
    p = tcp.recv_publish()
    assert (p.topic, p.payload, p.qos) == (f"{uid}/from-ws", b"over ws", qos)
    js.end()


def test_mqttjs_over_wss_with_a_password(wssrv, mqttjs, pki, uid):
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    tcp.subscribe("alice/#", qos=1)
    js = mqttjs()
    js.connect(url(wssrv, WSS, "wss"), ca=pki.ca.cert, clientId=f"{uid}-js", username="alice",
               password=PASSWORDS["alice"])
    js.publish(f"alice/{uid}", b"over wss", qos=1)
    p = tcp.recv_publish()
    assert (p.topic, p.payload) == (f"alice/{uid}", b"over wss")
    js.end()


def test_mqttjs_wrong_password_over_wss(wssrv, mqttjs, pki, uid):
    js = mqttjs()
    js.send("connect", url=url(wssrv, WSS, "wss"), ca=str(pki.ca.cert),
            options={"clientId": uid, "username": "alice", "password": "wrong",
                     "protocolVersion": 4})
    with pytest.raises(AssertionError, match="Bad username or password"):
        js.wait("connect")


def test_mqttjs_on_the_configured_path(wssrv, mqttjs, uid):
    js = mqttjs()
    js.connect(url(wssrv, WS_CUSTOM, path=CUSTOM_PATH), clientId=uid)
    assert js.subscribe(f"{uid}/t", 1) == [1]
    js.publish(f"{uid}/t", b"loop", qos=1)
    assert js.message()["payload"] == b"loop"
    js.end()


def test_mqttjs_retained_message(wssrv, mqttjs, uid):
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    tcp.publish(f"{uid}/r", b"kept", qos=1, retain=True)
    js = mqttjs()
    js.connect(url(wssrv, WS), clientId=f"{uid}-js")
    js.subscribe(f"{uid}/r", 1)
    got = js.message()
    assert (got["payload"], got["retain"]) == (b"kept", True)
    js.publish(f"{uid}/r2", b"kept too", qos=1, retain=True)   # acknowledged: stored
    sub = wssrv.client(f"{uid}-tcp2", port=port(wssrv, TCP))
    sub.subscribe(f"{uid}/r2")
    p = sub.recv_publish()
    assert (p.payload, p.retain) == (b"kept too", True)
    js.end()


def test_mqttjs_will_when_node_dies(wssrv, mqttjs, uid):
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    tcp.subscribe(f"{uid}/will", qos=1)
    js = mqttjs()
    js.connect(url(wssrv, WS), clientId=f"{uid}-js", keepalive=60,
               will={"topic": f"{uid}/will", "payload": "js gone", "qos": 1, "retain": False})
    js.kill()       # the TCP connection drops: no DISCONNECT, no close frame
    p = tcp.recv_publish(timeout=10)
    assert (p.topic, p.payload) == (f"{uid}/will", b"js gone")


def test_mqttjs_large_messages(wssrv, mqttjs, uid):
    payload = bytes(range(256)) * 2400        # 600 KiB: frames with a 64-bit length
    js = mqttjs()
    js.connect(url(wssrv, WS), clientId=uid)
    js.subscribe(f"{uid}/big", 1)
    js.publish(f"{uid}/big", payload, qos=1)
    assert js.message(timeout=20)["payload"] == payload
    js.end()


# -- paho-mqtt, transport="websockets" ---------------------------------------------------------

@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_paho_over_websockets(wssrv, paho, pki, uid, scheme, qos):
    if scheme == "ws":
        kw = {"port": port(wssrv, WS)}
        topic = f"{uid}/t"
    else:
        kw = {"port": port(wssrv, WSS), "tls": {"ca_certs": str(pki.ca.cert)}, "username": "alice",
              "password": PASSWORDS["alice"]}
        topic = f"alice/{uid}"
    sub = paho(client_id=f"{uid}-s", websocket_path="/mqtt", **kw)
    assert sub.connect_rc == 0
    assert sub.subscribe(topic, qos) == [qos]
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    tcp.publish(topic, b"tcp to paho", qos=qos)
    msg = sub.get()
    assert (msg.topic, msg.payload, msg.qos) == (topic, b"tcp to paho", qos)
    tcp.subscribe(topic, qos=qos)
    sub.publish(topic, b"paho to all", qos=qos)
    assert sub.get().payload == b"paho to all"
    assert tcp.recv_publish().payload == b"paho to all"


def test_paho_persistent_session_backlog_over_websocket(wssrv, paho, uid):
    """Messages queued while a persistent session was offline come from the log when it comes
    back over a WebSocket (the backlog path: a frame header in front of each stored chunk)."""
    sub = paho(port(wssrv, WS), client_id=f"{uid}-s", clean_session=False, websocket_path="/mqtt")
    sub.subscribe(f"{uid}/q", 1)
    sub.disconnect()
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    payloads = [bytes([i]) * (1000 + 37 * i) for i in range(150)]
    for p in payloads:
        tcp.publish(f"{uid}/q", p, qos=1)
    sub = paho(port(wssrv, WS), client_id=f"{uid}-s", clean_session=False, websocket_path="/mqtt")
    assert sub.session_present
    assert [sub.get(10).payload for _ in payloads] == payloads


# -- the raw client over wsproto: frames, pings, close, refusals ------------------------------

def test_mqtt_packets_split_across_frames_and_together_in_one(wssrv, uid):
    c = wssrv.raw(port(wssrv, WS))
    ws = WebSocketSocket(c.sock)
    c.sock = ws
    assert ws.subprotocol == "mqtt"
    stream = (m.connect(uid) + m.subscribe(1, [(f"{uid}/t", 1)])
              + m.publish(f"{uid}/t", b"x" * 3000, qos=1, packet_id=7) + m.pingreq())
    # one byte, then the rest of CONNECT with the start of SUBSCRIBE, then one message of three
    # frames for everything else
    cut = len(m.connect(uid)) + 3
    ws.send_raw(ws.ws.send(Message(data=stream[:1])) + ws.ws.send(Message(data=stream[1:cut])))
    rest = stream[cut:]
    ws.send_raw(ws.ws.send(Message(data=rest[:10], message_finished=False))
                + ws.ws.send(Message(data=rest[10:2000], message_finished=False))
                + ws.ws.send(Message(data=rest[2000:])))
    got = [c.recv_packet() for _ in range(5)]
    # In order; the PUBACK and the delivery wait for the log write at the end of the pass, so
    # they may follow the PINGRESP.
    assert [p.type for p in got if p.type not in (m.PUBACK, m.PINGRESP)] == [
        m.CONNACK, m.SUBACK, m.PUBLISH]
    assert any(p.type == m.PINGRESP for p in got)
    assert any(p.type == m.PUBACK and p.packet_id == 7 for p in got)


def test_ping_is_answered_and_a_close_is_answered_then_closed(wssrv, uid):
    c = ws_client(wssrv, uid)
    ws = c.sock
    ws.send_event(Ping(b"are you there"))
    assert ws.wait_pong() == b"are you there"
    assert c.ping() == []        # MQTT still works after the ping
    ws.send_event(CloseConnection(code=1000, reason="done"))
    assert ws.wait_close() == 1000


UPGRADE = (b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
           b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")


def masked(opcode: int, payload: bytes) -> bytes:
    """A client frame (masked), of up to 65,535 bytes."""
    mask = b"\x01\x02\x03\x04"
    n = len(payload)
    length = bytes((0x80 | n,)) if n < 126 else b"\xfe" + n.to_bytes(2, "big")
    return (bytes((0x80 | opcode,)) + length + mask
            + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def test_upgrade_connect_and_close_in_one_write_get_the_connack_before_the_close(wssrv, uid):
    """No data frame after a close frame (RFC 6455 5.5.1), also when the handshake, a CONNECT
    and the client's close come in one read: 101, then the CONNACK, then the close."""
    c = wssrv.raw(port(wssrv, WS))
    c.send(UPGRADE + masked(2, m.connect(uid)) + masked(8, (1000).to_bytes(2, "big")))
    reply = c.read_until_closed()
    head, _, frames = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    opcodes, payloads, i = [], [], 0
    while i + 2 <= len(frames):                             # server frames: unmasked, short
        n = frames[i + 1] & 0x7F
        opcodes.append(frames[i] & 0x0F)
        payloads.append(frames[i + 2:i + 2 + n])
        i += 2 + n
    assert opcodes == [2, 8], opcodes
    assert payloads[0][:1] == bytes((m.CONNACK << 4,))


@pytest.mark.parametrize("held_by", ["messages_rate", "password check"])
def test_a_close_frame_waits_for_the_packets_before_it(broker, tmp_path, uid, held_by):
    """PUBLISHes, DISCONNECT and the close frame in one write, from a client whose packets
    wait (over its publish rate, or behind its password check): the close was acted on at
    once, the packets behind the throttle were thrown away and the will published (MQTT-
    3.1.2-10: not after a DISCONNECT). Now the close waits for them, as a TCP FIN does."""
    listeners = [{"host": "127.0.0.1", "port": 0},
                 {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}]
    login = {}
    if held_by == "messages_rate":
        b = broker(listener=listeners, limits={"messages_rate": 10, "messages_burst": 5})
    else:
        pw = write_passwords(tmp_path / "passwd", {"dev": "secret"})
        listeners[0].update(allow_anonymous=True, password_file="")
        b = broker(listener=listeners, password_file=str(pw))
        login = {"username": "dev", "password": "secret"}
    sub = b.client(f"{uid}-sub", port=port(b, 0))
    sub.subscribe(f"{uid}/#")
    n = 12
    data = (m.connect(f"{uid}-ws", will=(f"{uid}/will", b"gone", 0, False), **login)
            + b"".join(m.publish(f"{uid}/m", b"%d" % i) for i in range(n)) + m.disconnect())
    c = b.raw(port(b, 1))
    c.send(UPGRADE + masked(2, data) + masked(8, (1000).to_bytes(2, "big")))
    assert [sub.recv_publish(10).payload for _ in range(n)] == [b"%d" % i for i in range(n)]
    assert c.read_until_closed(10).startswith(b"HTTP/1.1 101 ")
    assert b.wait_log(lambda ln: f"'{uid}-ws'" in ln and "disconnected" in ln, timeout=5)
    assert sub.ping() == []                      # no will


def test_websocket_close_without_disconnect_publishes_the_will(wssrv, uid):
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    tcp.subscribe(f"{uid}/will")
    c = ws_client(wssrv, f"{uid}-ws", will=(f"{uid}/will", b"ws closed", 0, False))
    c.sock.send_event(CloseConnection(code=1001))
    assert c.sock.wait_close() == 1001
    assert tcp.recv_publish().payload == b"ws closed"


def test_text_frame_closes_the_connection_with_1003(wssrv, uid):
    c = ws_client(wssrv, uid)
    c.sock.send_event(Message(data="MQTT as text"))
    assert c.sock.wait_close() == 1003
    assert wssrv.wait_log("text frame", timeout=5)


def test_server_closes_with_a_close_frame(wssrv, uid):
    """A protocol violation closes the connection: a close frame first, then the socket, its
    code 1002 (protocol error), not 1000: a 3.1.1 client gets no DISCONNECT to say why."""
    c = ws_client(wssrv, uid)
    c.send(m.publish(f"{uid}/t", b"", qos=3))     # QoS 3 is a malformed packet
    assert (c.sock.wait_close(), c.sock.close_reason) == (1002, "Malformed Packet")
    c = ws_client(wssrv, f"{uid}-2")
    c.send(bytes((0xF0, 0)))                        # packet type 15: reserved
    assert c.sock.wait_close() == 1002


def test_the_close_code_says_why_the_broker_ends_the_connection(wssrv, uid):
    """A session taken over: 1000; a keepalive timeout: 1001 (going away)."""
    first = ws_client(wssrv, uid)
    ws_client(wssrv, uid)
    assert (first.sock.wait_close(), first.sock.close_reason) == (1000, "Session taken over")
    c = ws_client(wssrv, f"{uid}-ka", keepalive=1)
    assert (c.sock.wait_close(), c.sock.close_reason) == (1001, "Keep Alive timeout")


def test_a_packet_over_max_packet_size_closes_with_1009_and_a_stop_with_1001(broker, uid):
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "protocol": "websockets"}],
               limits={"max_packet_size": 1000})
    big = over_websocket(b.raw(port(b, 0)))
    big.connect(f"{uid}-big")
    big.send(m.publish(f"{uid}/t", b"x" * 2000))
    assert (big.sock.wait_close(), big.sock.close_reason) == (1009, "Packet too large")
    c = over_websocket(b.raw(port(b, 0)))
    c.connect(uid)
    b.send_signal(signal.SIGTERM)
    assert (c.sock.wait_close(), c.sock.close_reason) == (1001, "Server shutting down")
    assert b.stop() == 0


def test_a_connect_refused_without_a_connack_closes_with_its_reason(broker, uid):
    """A 3.1.1 CONNECT whose will topic is over max_topic_levels is refused without a CONNACK
    (3.1.1 has no code for it): the close said 1000, a normal end, as for a clean one."""
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "protocol": "websockets"}],
               limits={"max_topic_levels": 4})
    c = over_websocket(b.raw(port(b, 0)))
    c.send(m.connect(uid, will=(f"{uid}/a/b/c/d/e", b"w")))
    assert (c.sock.wait_close(), c.sock.close_reason) == (1008, "Quota exceeded")


@pytest.mark.parametrize("request_bytes, status, reason", [
    (b"GET /mqtt HTTP/1.1\r\nHost: broker\r\n\r\n", 400, "not a WebSocket upgrade request"),
    (b"GET / HTTP/1.1\r\nHost: broker\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n", 400,
     "not a WebSocket upgrade request"),
    (m.connect("raw-mqtt"), 400, "not an HTTP request (first byte 0x10"),
    (UPGRADE.replace(b"HTTP/1.1", b"HTTP/1.0", 1), 400,
     "not a WebSocket upgrade request: HTTP/1.0 (a WebSocket upgrade needs HTTP/1.1 or later)"),
    (UPGRADE.replace(b"\r\n\r\n", b"\r\nContent-Length: 5\r\n\r\nhello"), 400,
     "not a WebSocket upgrade request: it has a body (Content-Length)"),
])
def test_not_a_websocket_upgrade_gets_400(wssrv, request_bytes, status, reason):
    """Counted once, as a refused connection, not also as a protocol violation."""
    before = wssrv.stats()
    c = wssrv.raw(port(wssrv, WS))
    c.send(request_bytes)
    reply = c.read_until_closed()
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply
    assert reason.encode() in reply.partition(b"\r\n\r\n")[2]
    after = wssrv.stats()
    assert after["refused"]["websocket"] == before["refused"]["websocket"] + 1
    assert (after["counters"]["connections_refused"]
            == before["counters"]["connections_refused"] + 1)
    assert after["counters"]["protocol_errors"] == before["counters"]["protocol_errors"]


def test_refusals_are_counted_and_logged_once_a_minute(broker):
    """A port scanner cannot flood the log: the first refusal from an address is logged with
    its reason, the next ones within the minute only counted (a line at the end of the minute
    says how many: tests/core/test_refusal_log.py)."""
    b = broker(refusal_log_interval=60,
               listener=[{"host": "127.0.0.1", "port": 0, "protocol": "websockets",
                          "allow_anonymous": True}])
    mark = b.mark()
    for path in ("/first", "/second"):
        c = b.raw()
        c.send(f"GET {path} HTTP/1.1\r\nHost: broker\r\n\r\n".encode())
        assert c.read_until_closed().startswith(b"HTTP/1.1 400 ")
    assert b.stats()["refused"]["websocket"] == 2
    line = b.wait_log("WebSocket upgrade from", timeout=5, start=mark)
    assert line and "not a WebSocket upgrade request" in line and "refused" in line
    assert b.log_text().count("WebSocket upgrade from") == 1


def test_upgrade_on_another_path_gets_404(wssrv):
    with socket.create_connection(("127.0.0.1", port(wssrv, WS)), timeout=5) as s:
        with pytest.raises(HandshakeRefused) as info:
            WebSocketSocket(s, path="/elsewhere")
    assert info.value.status == 404 and b"/elsewhere" in info.value.body
    with socket.create_connection(("127.0.0.1", port(wssrv, WS_CUSTOM)), timeout=5) as s:
        with pytest.raises(HandshakeRefused) as info:
            WebSocketSocket(s, path="/mqtt")
    assert info.value.status == 404 and CUSTOM_PATH.encode() in info.value.body


def test_upgrade_without_the_mqtt_subprotocol_gets_400(wssrv):
    with socket.create_connection(("127.0.0.1", port(wssrv, WS)), timeout=5) as s:
        with pytest.raises(HandshakeRefused) as info:
            WebSocketSocket(s, subprotocols=("chat",))
    assert info.value.status == 400 and b"subprotocol mqtt or mqttv3.1 required" in info.value.body


def test_mqttv31_subprotocol(wssrv, uid):
    c = wssrv.raw(port(wssrv, WS))
    over_websocket(c, subprotocols=("mqttv3.1",))
    assert c.sock.subprotocol == "mqttv3.1"
    assert c.connect(uid).rc == 0


def test_unix_socket_websocket_listener(wssrv, uid):
    c = ws_client(wssrv, f"{uid}-unix", listener=WS_UNIX)
    c.subscribe(f"{uid}/t")
    tcp = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    tcp.publish(f"{uid}/t", b"to unix ws")
    assert c.recv_publish().payload == b"to unix ws"


# -- the same rules as on TCP ------------------------------------------------------------------

def test_acl_applies_over_wss(wssrv, pki, uid):
    reader = wssrv.client(f"{uid}-tcp", port=port(wssrv, TCP))
    reader.subscribe("other/#", f"alice/{uid}")
    dropped = wssrv.stats()["dropped"]["acl"]
    c = ws_client(wssrv, f"{uid}-ws", listener=WSS, pki=pki, username="alice",
                  password=PASSWORDS["alice"])
    assert c.subscribe("other/#", f"public/{uid}").codes == [0x80, 0]
    c.publish(f"other/{uid}", b"not allowed", qos=1)     # acknowledged, not routed
    c.publish(f"alice/{uid}", b"allowed", qos=1)
    p = reader.recv_publish()
    assert (p.topic, p.payload) == (f"alice/{uid}", b"allowed")
    assert wssrv.stats()["dropped"]["acl"] == dropped + 1
    ws_client(wssrv, f"{uid}-anon", listener=WSS, pki=pki, expect_rc=5)


def test_admin_view_shows_the_websocket_listener(wssrv, uid):
    c = ws_client(wssrv, f"{uid}-ws")
    c.publish(f"{uid}/t", b"12345", qos=1)
    row = wssrv.client_row(f"{uid}-ws")
    assert row["listener"] == f"127.0.0.1:{port(wssrv, WS)}"
    assert row["msgs_in"] == 1 and row["bytes_in"] > 0
    cli = run_cli("inspect", "clients", "--data-dir", wssrv.config["data_dir"])
    assert cli.returncode == 0, cli.stderr
    assert f"{uid}-ws" in cli.stdout


def test_limits_are_the_same_as_on_tcp(broker, uid):
    b = broker(limits={"max_packet_size": 1000}, listener=[
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets", "max_connections": 1}])
    first = ws_client(b, f"{uid}-1", listener=1)
    ws_client(b, f"{uid}-2", listener=1, expect_rc=3)        # over the listener's limit
    assert b.stats()["refused"]["listener_max_connections"] == 1
    first.send(m.publish(f"{uid}/t", b"x" * 2000))           # over max_packet_size
    assert first.expect_closed()
    assert b.stats()["limit_hits"]["max_packet_size"] == 1


def test_config_check_names_websocket_listeners(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[listener]]\nport = 0\nprotocol = "websockets"\nwebsocket_path = "/ws"\n')
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert "127.0.0.1:0 (WebSockets /ws)" in r.stdout


def test_reload_says_a_changed_websocket_path_needs_a_restart(broker, uid):
    listeners = [{"host": "127.0.0.1", "port": 0, "protocol": "websockets",
                  "allow_anonymous": True}]
    b = broker(listener=listeners)
    mark = b.mark()
    text = b.config_path.read_text()
    assert 'protocol = "websockets"' in text, text
    b.config_path.write_text(text.replace('protocol = "websockets"',
                                          'protocol = "websockets"\nwebsocket_path = "/other"'))
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("take effect after a restart", timeout=5, start=mark)
    c = ws_client(b, uid, listener=0)       # still served on /mqtt
    assert c.ping() == []


def test_mqttjs_speaks_mqtt_5_over_tcp_and_websocket(broker, mqttjs, uid):
    """MQTT.js with protocolVersion 5 on both transports: properties go through, a 3.1.1
    MQTT.js on the same topic gets the message."""
    b = broker(listener=[
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}])
    tcp, ws = port(b, 0), port(b, 1)
    sub = mqttjs()
    sub.connect(f"mqtt://127.0.0.1:{tcp}", clientId=f"{uid}-s", protocolVersion=5)
    assert sub.subscribe(f"{uid}/t", 1) == [1]
    old = mqttjs()
    old.connect(f"ws://127.0.0.1:{ws}/mqtt", clientId=f"{uid}-old")
    assert old.subscribe(f"{uid}/t", 1) == [1]
    pub = mqttjs()
    pub.connect(f"ws://127.0.0.1:{ws}/mqtt", clientId=f"{uid}-p", protocolVersion=5)
    pub.publish(f"{uid}/t", b"21.5", 1, properties={
        "contentType": "text/plain", "responseTopic": f"{uid}/r", "correlationData": "0102",
        "userProperties": {"unit": "C"}, "messageExpiryInterval": 60})
    m = sub.message()
    assert (m["topic"], m["payload"], m["qos"]) == (f"{uid}/t", b"21.5", 1)
    props = m["properties"]
    assert props["contentType"] == "text/plain" and props["responseTopic"] == f"{uid}/r"
    assert props["correlationData"] == "0102" and props["userProperties"] == {"unit": "C"}
    assert 58 <= props["messageExpiryInterval"] <= 60
    assert old.message()["payload"] == b"21.5"
    for c in (sub, old, pub):
        c.end()


def test_frames_past_one_read_behind_a_connect_being_checked_are_all_handled(broker, tmp_path,
                                                                           uid):
    """A CONNECT whose password check runs on the worker pool, then 1,500 PUBLISH frames in
    the same write: past the 1,024 frames of one read, the rest stayed in the WebSocket
    endpoint once the check answered (the client was halted, so no later read was planned)
    until the client sent something else: 1,023 of 1,500 were acknowledged."""
    pw = write_passwords(tmp_path / "passwd", {"ws-user": "ws-user-pw"})
    b = broker(password_file=str(pw),
               listener=[{"host": "127.0.0.1", "port": 0, "protocol": "websockets"}])
    c = over_websocket(b.raw(b.port))
    ws = c.sock
    n = 1500
    frames = [ws.ws.send(Message(data=m.connect(f"{uid}-ws", username="ws-user",
                                                password="ws-user-pw")))]
    frames += [ws.ws.send(Message(data=m.publish(f"{uid}/t", b"x", qos=1, packet_id=i + 1)))
               for i in range(n)]
    ws.send_raw(b"".join(frames))
    assert c.expect(m.CONNACK, 15).rc == 0
    assert [c.expect(m.PUBACK, 15).packet_id for _ in range(n)] == list(range(1, n + 1))
