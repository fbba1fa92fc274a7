"""WebSocketEndpoint with plain bytes (no sockets): the upgrade handshake fed whole, byte by
byte and with bytes after it; the HTTP refusals (400, 404, 426, 431); binary frames in any
split; ping, close, text frames, oversized messages; ``frame_head`` and ``close_frame`` read
back by wsproto's client side, an implementation independent of the endpoint's own writing."""

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Message, Ping, Pong,
                            RejectConnection, RejectData, Request, TextMessage)

from edgebroker import errors
from edgebroker.server.websocket import WebSocketEndpoint, frame_head

CONNECT = bytes.fromhex("100c00044d5154540402003c0000")     # an MQTT 3.1.1 CONNECT, id ""
UPGRADE = (b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
           b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")


def client_request(target="/mqtt", subprotocols=("mqtt",)):
    client = WSConnection(ConnectionType.CLIENT)
    data = client.send(Request(host="localhost", target=target, subprotocols=list(subprotocols)))
    return client, data


def events(client, data):
    client.receive_data(data)
    return list(client.events())


def opened(**kw):
    """An endpoint and a wsproto client with the upgrade done."""
    ep = WebSocketEndpoint(**kw)
    client, request = client_request()
    got = ep.receive(request)
    assert got.open and got.close is None and got.mqtt == [] and got.send == b""
    [accept] = events(client, got.reply)
    assert isinstance(accept, AcceptConnection) and accept.subprotocol == "mqtt"
    return ep, client


def masked_frames():
    """A wsproto client past its handshake, to write client frames sent before any reply."""
    return opened()[1]


def binary(client, data, finished=True):
    return client.send(Message(data=data, message_finished=finished))


def feed_bytewise(ep, data):
    """Feed one byte at a time; the inputs that carried something."""
    results = [ep.receive(data[i:i + 1]) for i in range(len(data))]
    return [r for r in results if r.mqtt or r.send or r.reply or r.close]


def refusal(got):
    """(status line, body) of an HTTP refusal; the endpoint is closed."""
    assert not got.open and got.close is not None and got.mqtt == []
    head, _, body = got.send.partition(b"\r\n\r\n")
    assert b"\r\nConnection: close" in head
    assert f"Content-Length: {len(body)}".encode() in head
    return head.split(b"\r\n")[0].decode(), body.decode()


# -- the handshake ---------------------------------------------------------------------------

def test_upgrade_fed_whole():
    ep = WebSocketEndpoint()
    got = ep.receive(UPGRADE)
    assert got.open and ep.open and got.close is None and got.mqtt == []
    assert got.reply.startswith(b"HTTP/1.1 101 ") and got.send == b""
    # RFC 6455 §1.3's worked example of the accept token
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in got.reply
    assert b"Sec-WebSocket-Protocol: mqtt\r\n" in got.reply
    assert b"Sec-WebSocket-Extensions" not in got.reply


def test_upgrade_fed_byte_by_byte():
    ep = WebSocketEndpoint()
    for i in range(len(UPGRADE) - 1):
        got = ep.receive(UPGRADE[i:i + 1])
        assert (got.mqtt, got.send, got.reply, got.close, got.open) == (
            [], b"", b"", None, False), i
    got = ep.receive(UPGRADE[-1:])
    assert got.open and got.reply.startswith(b"HTTP/1.1 101 ")


def test_frames_sent_with_the_request_are_read_after_the_upgrade():
    ep = WebSocketEndpoint()
    client, request = client_request()
    got = ep.receive(request + binary(masked_frames(), CONNECT))
    assert got.open and got.mqtt == [CONNECT] and got.close is None
    assert isinstance(events(client, got.reply)[0], AcceptConnection) and got.send == b""


def test_junk_after_the_request_is_a_websocket_protocol_error():
    ep = WebSocketEndpoint()
    client, request = client_request()
    got = ep.receive(request + b"\x82\x03abc")       # an unmasked client frame (RFC 6455 §5.1)
    assert got.open and got.mqtt == [] and "protocol error" in got.close
    [accept] = events(client, got.reply)         # the answer first, the close frame apart
    [close] = events(client, got.send)
    assert isinstance(accept, AcceptConnection)
    assert isinstance(close, CloseConnection) and close.code == 1002


def test_lone_newlines_end_the_head():
    ep = WebSocketEndpoint()
    assert ep.receive(UPGRADE.replace(b"\r\n", b"\n")).open


@pytest.mark.parametrize("offered, chosen", [
    (["mqtt"], "mqtt"), (["mqttv3.1"], "mqttv3.1"), (["foo", "mqtt"], "mqtt"),
    (["mqttv3.1", "mqtt"], "mqtt"),         # "mqtt" when offered (MQTT-6.0.0-4)
    (["foo", "mqttv3.1"], "mqttv3.1"),
])
def test_subprotocol_chosen_from_the_clients_list(offered, chosen):
    client, request = client_request(subprotocols=offered)
    got = WebSocketEndpoint().receive(request)
    [accept] = events(client, got.reply)
    assert accept.subprotocol == chosen


@pytest.mark.parametrize("offered", [[], ["foo", "mqttv5"]])
def test_request_without_the_mqtt_subprotocol_is_refused(offered):
    _, request = client_request(subprotocols=offered)
    status, body = refusal(WebSocketEndpoint().receive(request))
    assert status == "HTTP/1.1 400 Bad Request"
    assert "subprotocol mqtt or mqttv3.1 required" in body
    assert ("offered: none" if not offered else "offered: foo, mqttv5") in body


def test_configured_path_and_subprotocols():
    ep = WebSocketEndpoint(path="/ws", subprotocols=("mqtt",))
    client, request = client_request(target="/ws?client=1", subprotocols=["mqttv3.1", "mqtt"])
    [accept] = events(client, ep.receive(request).reply)
    assert accept.subprotocol == "mqtt"


@pytest.mark.parametrize("target", ["http://localhost:1883/mqtt", "HTTP://h/mqtt?x=1",
                                    "ws://[::1]:80/mqtt", "wss://h/mqtt"])
def test_absolute_form_target_is_read_by_its_path(target):
    """RFC 7230 §5.3.2: a server accepts the absolute form (it gave 404)."""
    client, request = client_request(target=target)
    [accept] = events(client, WebSocketEndpoint().receive(request).reply)
    assert isinstance(accept, AcceptConnection)


@pytest.mark.parametrize("target, path", [("http://h", "/"), ("http://h/other", "/other"),
                                          ("/http://h/mqtt", "/http://h/mqtt")])
def test_absolute_form_with_another_path_gets_404(target, path):
    _, request = client_request(target=target)
    status, body = refusal(WebSocketEndpoint().receive(request))
    assert status == "HTTP/1.1 404 Not Found" and f"no WebSocket endpoint at {path!r}" in body


def test_wrong_path_gets_404():
    _, request = client_request(target="/other")
    got = WebSocketEndpoint().receive(request)
    status, body = refusal(got)
    assert status == "HTTP/1.1 404 Not Found"
    assert "no WebSocket endpoint at '/other'" in body and "'/mqtt'" in body
    assert got.close.startswith("HTTP 404: ")


@pytest.mark.parametrize("request_bytes, missing", [
    (b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\n\r\n", "Connection: Upgrade"),
    (b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: a2V5a2V5a2V5a2V5a2V5aw==\r\n\r\n",
     "Upgrade: websocket"),
    (UPGRADE.replace(b"Host: localhost\r\n", b""), "Bad HTTP message: Missing mandatory Host"),
    (UPGRADE.replace(b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b""),
     "Sec-WebSocket-Key"),
    (UPGRADE.replace(b"GET", b"POST"), "must be GET"),
    (UPGRADE.replace(b"Host: localhost", b"Host: xn--a"), "bad Host: "),
    (UPGRADE.replace(b"Host: localhost", b"Host: localhost\r\nSec-WebSocket-Protocol: mq\xff"),
     "a header value is not ASCII: "),
    (b"GET /mqtt HTTP/1.1 extra\r\n\r\n", "Bad HTTP message"),
    (UPGRADE.replace(b"HTTP/1.1", b"HTTP/1.0"), "HTTP/1.0 (a WebSocket upgrade needs HTTP/1.1"),
    (UPGRADE.replace(b"HTTP/1.1\r\n", b"HTTP/0.9\n"), "HTTP/0.9 (a WebSocket upgrade"),
    (UPGRADE.replace(b"\r\n\r\n", b"\r\nContent-Length: 5\r\n\r\nhello"),
     "it has a body (Content-Length)"),
    (UPGRADE.replace(b"\r\n\r\n", b"\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello"),
     "it has a body (transfer-encoding)"),
])
def test_not_an_upgrade_gets_400(request_bytes, missing):
    """A body too: its bytes would be read as WebSocket frames."""
    got = WebSocketEndpoint().receive(request_bytes)
    status, body = refusal(got)
    assert status == "HTTP/1.1 400 Bad Request"
    assert body.startswith("not a WebSocket upgrade request: ") and missing in body, body
    assert got.close == "HTTP 400: " + body.strip()


def test_a_header_line_that_cannot_be_read_is_named_without_its_value():
    """h11 quotes such a line whole, and it went into the log and the answer: a credential
    with a space before its colon (``Authorization : Bearer ...``) too."""
    request = UPGRADE.replace(b"\r\n\r\n", b"\r\nAuthorization : Bearer SECRETTOKEN2\r\n\r\n")
    got = WebSocketEndpoint().receive(request)
    status, body = refusal(got)
    assert status == "HTTP/1.1 400 Bad Request"
    assert "illegal header line (header 'Authorization'; its value not shown)" in body, body
    assert "SECRET" not in body and "SECRET" not in got.close


KEY = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"


@pytest.mark.parametrize("keys, why", [
    (b"Sec-WebSocket-Key: \r\n", "Sec-WebSocket-Key '' is not the base64 of 16 bytes"),
    (KEY + KEY, "Sec-WebSocket-Key given 2 times"),
    (KEY + b"sec-websocket-key: a2V5a2V5a2V5a2V5a2V5aw==\r\n", "given 2 times"),
    (b"Sec-WebSocket-Key: a2V5a2V5a2V5a2V5a2V5\r\n", "'a2V5a2V5a2V5a2V5a2V5' is not the"),
    (b"Sec-WebSocket-Key: not base64!!\r\n", "'not base64!!' is not the base64"),
])
def test_key_must_be_one_base64_of_16_bytes(keys, why):
    got = WebSocketEndpoint().receive(UPGRADE.replace(KEY, keys))
    status, body = refusal(got)
    assert status == "HTTP/1.1 400 Bad Request"
    assert body.startswith("not a WebSocket upgrade request: ") and why in body, body


def test_key_with_spaces_around_it_is_accepted():
    got = WebSocketEndpoint().receive(
        UPGRADE.replace(KEY, b"sec-websocket-key:   dGhlIHNhbXBsZSBub25jZQ==  \r\n"))
    assert got.open and got.reply.startswith(b"HTTP/1.1 101 ") and got.close is None


def test_other_websocket_version_gets_426_naming_13():
    got = WebSocketEndpoint().receive(
        UPGRADE.replace(b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8"))
    status, body = refusal(got)
    assert status == "HTTP/1.1 426 Upgrade Required"
    assert "WebSocket version '8' not supported (Sec-WebSocket-Version: 13 only)" in body
    assert b"\r\nSec-WebSocket-Version: 13\r\n" in got.send
    # No version header at all: said so (400), not taken for another version.
    got = WebSocketEndpoint().receive(UPGRADE.replace(b"Sec-WebSocket-Version: 13\r\n", b""))
    status, body = refusal(got)
    assert "Missing header, 'Sec-WebSocket-Version'" in body and "not supported" not in body


@pytest.mark.parametrize("first", [CONNECT, b"\x16\x03\x01\x02\x00", b"get / HTTP/1.1\r\n"])
def test_raw_mqtt_or_tls_is_refused_at_the_first_byte(first):
    got = WebSocketEndpoint().receive(first[:1])
    status, body = refusal(got)
    assert status == "HTTP/1.1 400 Bad Request"
    assert f"not an HTTP request (first byte 0x{first[0]:02x}" in body


def test_request_head_is_bounded():
    ep = WebSocketEndpoint(max_request=1024)
    line = b"GET /mqtt HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 990 + b"\r\n"
    assert len(line) <= 1024
    got = ep.receive(line)
    assert not got.send and got.close is None
    got = ep.receive(b"X-More: " + b"b" * 100 + b"\r\n")
    status, body = refusal(got)
    assert status == "HTTP/1.1 431 Request Header Fields Too Large"
    assert "longer than 1024 bytes" in body
    assert ep.receive(UPGRADE).send == b""     # closed: nothing more is read


def test_request_head_at_the_bound_is_accepted():
    pad = b"X-Pad: " + b"a" * (1024 - len(UPGRADE) - 9) + b"\r\n"
    request = UPGRADE[:-2] + pad + b"\r\n"
    assert len(request) == 1024
    assert WebSocketEndpoint(max_request=1024).receive(request).open
    assert not WebSocketEndpoint(max_request=1023).receive(request).open


def test_default_bound_is_8_kib():
    got = WebSocketEndpoint().receive(b"GET /mqtt HTTP/1.1\r\nX: " + b"a" * 8192)
    assert refusal(got)[0] == "HTTP/1.1 431 Request Header Fields Too Large"


# -- frames ----------------------------------------------------------------------------------

def test_binary_frames_carry_mqtt_bytes_in_any_split():
    ep, client = opened()
    stream = CONNECT + bytes(range(256)) * 3
    # one message split into three frames, then two messages in one read
    data = (binary(client, stream[:5], finished=False) + binary(client, stream[5:400], False)
            + binary(client, stream[400:]) + binary(client, b"ab") + binary(client, b"c"))
    got = ep.receive(data)
    assert b"".join(got.mqtt) == stream + b"abc" and got.send == b"" and got.close is None
    assert all(type(piece) is bytes for piece in got.mqtt)
    # byte by byte: the pieces arrive as the bytes do, never held back for the whole message
    ep, client = opened()
    pieces = [p for r in feed_bytewise(ep, binary(client, stream)) for p in r.mqtt]
    assert b"".join(pieces) == stream and len(pieces) == len(stream)


def test_empty_read_means_nothing():
    ep, _ = opened()
    got = ep.receive(b"")
    assert (got.mqtt, got.send, got.close, got.open) == ([], b"", None, True)


def test_frames_without_mqtt_are_counted_and_reading_stops_at_noise_left():
    """Pings, pongs and empty binary or continuation frames are ``noise``; ``receive`` stops
    after the one that takes the last of ``noise_left``, the rest read on by receive(b"")."""
    ep, client = opened()
    data = (binary(client, b"a", finished=False) + binary(client, b"", finished=False)
            + client.send(Ping(b"1")) + client.send(Pong(b"")) + binary(client, b"b")
            + binary(client, b"") + client.send(Ping(b"2")) + binary(client, b"c"))
    got = ep.receive(data, noise_left=2)
    assert (got.mqtt, got.noise, got.more, ep.more) == ([b"a"], 2, True, True)
    assert events(client, got.send) == [Pong(b"1")]
    got = ep.receive(b"", noise_left=1)
    assert (got.mqtt, got.noise, got.more) == ([], 1, True)
    ep.hold(binary(client, b"d"))              # kept behind what is left, in order
    got = ep.receive(b"")                      # 0: no bound
    assert (got.mqtt, got.noise, got.more, ep.more) == ([b"b", b"c", b"d"], 2, False, False)
    assert events(client, got.send) == [Pong(b"2")]
    got = ep.receive(b"")
    assert (got.mqtt, got.noise, got.send) == ([], 0, b"")


def test_ping_is_answered_with_pong_between_fragments():
    ep, client = opened()
    got = ep.receive(binary(client, b"one", finished=False) + client.send(Ping(b"hi"))
                     + binary(client, b"two"))
    assert got.mqtt == [b"one", b"two"] and got.close is None
    [pong] = events(client, got.send)
    assert isinstance(pong, Pong) and pong.payload == b"hi"
    assert ep.receive(client.send(Pong(b"x"))).send == b""      # an unasked pong: nothing


def test_close_from_the_client_is_answered_then_the_connection_ends():
    ep, client = opened()
    got = ep.receive(binary(client, CONNECT) + client.send(CloseConnection(1001, "going")))
    assert got.mqtt == [CONNECT]
    assert got.close == "WebSocket closed by the client (code 1001)"
    [reply] = events(client, got.send)
    assert isinstance(reply, CloseConnection) and reply.code == 1001
    assert ep.receive(b"\x82\x81abcd!").send == b""       # closed: later bytes are ignored
    assert ep.close_frame() == b""


def test_text_frame_closes_with_1003():
    ep, client = opened()
    got = ep.receive(binary(client, b"x") + client.send(Message(data="hello"))
                     + binary(client, b"after"))
    assert got.mqtt == [b"x"] and "text frame" in got.close
    [close] = events(client, got.send)
    assert isinstance(close, CloseConnection) and close.code == 1003


def test_message_longer_than_max_message_closes_with_1009():
    ep, client = opened(max_message=10)
    got = ep.receive(binary(client, b"0123456789"))     # exactly the bound: passes
    assert got.mqtt == [b"0123456789"] and got.close is None
    got = ep.receive(binary(client, b"012345", finished=False))
    assert got.close is None
    got = ep.receive(binary(client, b"6789X"))          # the same message goes past it
    assert got.mqtt == [] and got.close == "WebSocket message longer than 10 bytes"
    [close] = events(client, got.send)
    assert close.code == 1009


@pytest.mark.parametrize("frame, code", [
    (b"\x82\x03abc", 1002),                          # unmasked
    (b"\x8b\x80abcd", 1002),                         # opcode 0xB is reserved
    (b"\x89\xfe\x00\x7eabcd" + b"\x00" * 126, 1002),  # a ping over 125 bytes
    (b"\x80\x80abcd", 1002),                         # a continuation with no message
])
def test_malformed_frames_close_with_the_code_wsproto_gives(frame, code):
    ep, client = opened()
    got = ep.receive(frame)
    assert got.close.startswith("WebSocket protocol error: ")
    [close] = events(client, got.send)
    assert isinstance(close, CloseConnection) and close.code == code


# -- what the server writes ------------------------------------------------------------------

@pytest.mark.parametrize("n, head_len", [(0, 2), (1, 2), (125, 2), (126, 4), (65535, 4),
                                         (65536, 10), (1 << 20, 10)])
def test_frame_head_read_back_by_wsproto(n, head_len):
    ep, client = opened()
    payload = bytes(i % 251 for i in range(n))
    head = ep.frame_head(n)
    assert head == frame_head(n) and len(head) == head_len
    got = events(client, head + payload)
    assert all(isinstance(e, BytesMessage) for e in got)
    assert b"".join(e.data for e in got) == payload
    assert got[-1].frame_finished and got[-1].message_finished


def test_frame_head_of_a_4_gib_frame():
    ep, client = opened()
    n = 2 ** 32
    head = frame_head(n)
    assert head == b"\x82\x7f" + n.to_bytes(8, "big")
    [piece] = events(client, head + b"abc")      # wsproto hands out the start of the payload
    assert isinstance(piece, BytesMessage) and piece.data == b"abc"
    assert not piece.frame_finished and not piece.message_finished


def test_frame_heads_between_payloads_make_separate_messages():
    _, client = opened()
    got = events(client, frame_head(3) + b"abc" + frame_head(200) + b"d" * 200)
    assert [len(e.data) for e in got] == [3, 200] and all(e.message_finished for e in got)


def test_close_frame_starts_the_servers_close():
    assert WebSocketEndpoint().close_frame() == b""       # no WebSocket yet
    ep, client = opened()
    frame = ep.close_frame(1001, "broker stopping")
    [close] = events(client, frame)
    assert (close.code, close.reason) == (1001, "broker stopping")
    assert ep.close_frame() == b""                        # only once
    # the peer's answer ends it; pings meanwhile get no pong (the close was sent)
    got = ep.receive(client.send(close.response()))
    assert got.close == "WebSocket close answered by the client (code 1001)" and got.send == b""


def test_close_frame_default_is_normal_closure():
    ep, client = opened()
    [close] = events(client, ep.close_frame())
    assert close.code == 1000


@pytest.mark.parametrize("why, code, reason", [
    (0, 1000, ""), (errors.SESSION_TAKEN_OVER, 1000, "Session taken over"),
    (errors.SERVER_SHUTTING_DOWN, 1001, "Server shutting down"),
    (errors.KEEP_ALIVE_TIMEOUT, 1001, "Keep Alive timeout"),
    (errors.MALFORMED_PACKET, 1002, "Malformed Packet"),
    (errors.PROTOCOL_ERROR, 1002, "Protocol Error"),
    (errors.TOPIC_NAME_INVALID, 1002, "Topic Name invalid"),
    (errors.NOT_AUTHORIZED, 1008, "Not authorized"),
    (errors.QOS_NOT_SUPPORTED, 1008, "QoS not supported"),
    (errors.PACKET_TOO_LARGE, 1009, "Packet too large"),
])
def test_the_brokers_close_says_why_in_a_close_code(why, code, reason):
    """The core's reason (an MQTT 5 reason code) as a close code and reason (RFC 6455 7.4.1)."""
    ep, client = opened()
    [close] = events(client, ep.closing(why))
    assert (close.code, close.reason) == (code, reason)


def test_refusals_are_complete_http_replies_for_a_client():
    """wsproto's client side reads a refusal as a rejection with the body."""
    client, request = client_request(target="/nope")
    got = events(client, WebSocketEndpoint().receive(request).send)
    assert isinstance(got[0], RejectConnection) and got[0].status_code == 404
    body = b"".join(e.data for e in got if isinstance(e, RejectData))
    assert body.startswith(b"no WebSocket endpoint at '/nope'")
    assert not any(isinstance(e, TextMessage) for e in got)


def test_reads_as_bytearray_or_memoryview():
    """The transport may hand over its read buffer as it is."""
    ep = WebSocketEndpoint()
    client, request = client_request()
    assert ep.receive(bytearray(request[:20])).send == b""
    got = ep.receive(memoryview(request[20:]))
    assert got.open and isinstance(events(client, got.reply)[0], AcceptConnection)
    got = ep.receive(memoryview(bytearray(binary(client, CONNECT))))
    assert got.mqtt == [CONNECT] and type(got.mqtt[0]) is bytes


def test_refusal_reasons_are_cut_to_300_characters():
    _, request = client_request(target="/" + "x" * 5000)
    got = WebSocketEndpoint().receive(request)
    status, body = refusal(got)
    assert status == "HTTP/1.1 404 Not Found"
    assert len(body.strip()) == 300 and body.strip().endswith("...")
    assert got.close == "HTTP 404: " + body.strip()


def test_one_receive_takes_at_most_max_frames():
    """Frames of a byte each cost wsproto about 12 us: a 256 KB read of them (37,000) took
    the loop for half a second while other clients waited. ``receive`` now stops after
    MAX_FRAMES (``more``), and receive(b"") reads on, in order."""
    from edgebroker.server.websocket import MAX_FRAMES
    ep, client = opened()
    n = 3 * MAX_FRAMES + 5
    data = b"".join(binary(client, b"%c" % (65 + i % 26), finished=i == n - 1) for i in range(n))
    got = ep.receive(data)
    assert (len(got.mqtt), got.noise, got.more) == (MAX_FRAMES, 0, True)
    pieces = list(got.mqtt)
    for _ in range(5):
        if not got.more:
            break
        got = ep.receive(b"")
        assert len(got.mqtt) <= MAX_FRAMES
        pieces += got.mqtt
    assert not got.more and b"".join(pieces) == bytes(65 + i % 26 for i in range(n))



def test_an_open_endpoint_lets_go_of_the_handshake_state():
    """wsproto's handshake state (its h11 connection, about 2.8 KB) is never used after the
    upgrade: an idle open endpoint held 4.9 KB with it (a whole TCP connection costs the
    broker 1.5 KB), under 2 KB without it."""
    import gc
    import tracemalloc
    n = 200
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        endpoints = [opened()[0] for _ in range(n)]     # (the clients are freed)
        gc.collect()
        per_endpoint = (tracemalloc.get_traced_memory()[0] - before) / len(endpoints)
    finally:
        tracemalloc.stop()
    assert per_endpoint < 3000, per_endpoint
