"""The WebSocket framing: MQTT carried in binary WebSocket messages (RFC 6455, MQTT 3.1.1 §6).

``WebSocketEndpoint`` is the server side of one WebSocket connection, sans I/O, in the manner
of h11: the transport hands it the bytes it read (``receive``) and gets back what they meant
(``WebSocketInput``): the MQTT bytes the client's binary messages carried, bytes to write to
the client at once (the handshake reply, an HTTP error reply, pongs, a close frame), and, when
the connection must end, why. There are no sockets, clocks or threads here, so every rule is
tested with plain bytes. The protocol itself is python-hyper/wsproto's ``WSConnection``.

Outgoing MQTT bytes are not passed through wsproto, which would copy them: the transport puts
``frame_head(n)`` (an unmasked, final, binary frame header for n bytes) in front of n bytes it
already holds, so a log chunk still leaves with ``sendfile``. ``closing(why)`` is the close
frame of a connection the broker ends, its code saying why (``close_code``).

The rules, in the order a connection meets them (docs/protocol.md, "MQTT over WebSockets"):

- CONNECTING: the bytes are the HTTP request head. It must end (an empty line) within
  ``max_request`` bytes, else 431; its first byte must start an HTTP method (raw MQTT or TLS
  sent to this listener gets a 400 naming the byte). Bytes after the head are kept and read as
  WebSocket frames once the upgrade is accepted (a client may send them before the reply).
- The request must be a WebSocket upgrade (an HTTP/1.1 or later GET, ``Connection:
  Upgrade``, ``Upgrade: websocket``, ``Sec-WebSocket-Key``, ``Sec-WebSocket-Version: 13``,
  ``Host``): otherwise 400 (426 for another WebSocket version), with a one-line text body
  saying what is missing. The key must come once and be the base64 of 16 bytes (wsproto
  takes any).
- Its path (the query string aside; of an absolute target ``http://host/mqtt``, the part after
  the host) must be the configured one: otherwise 404.
- The client must offer the subprotocol ``mqtt`` or ``mqttv3.1`` (MQTT-6.0.0-3): ``mqtt`` is
  chosen when offered (MQTT-6.0.0-4), else the first of its list that the endpoint supports. A request offering neither, or none at all,
  gets 400: Mosquitto (libwebsockets) upgrades such a request to a protocol that never speaks
  MQTT, so the client waits for nothing; a clear refusal says what to change.
  No extension (permessage-deflate) is accepted, so outgoing headers can be written directly.
- OPEN: binary frames carry MQTT bytes in any split; each piece is handed on as it arrives
  (messages are never gathered whole). A message longer than ``max_message`` is closed with
  1009. A text frame is a protocol error: close 1003. A ping is answered with a pong, a pong
  ignored. A close from the client is answered with a close, then the connection ends. A
  frame wsproto cannot parse (unmasked, bad opcode, oversized control frame) is closed with
  the code wsproto gives (1002, 1007).
- Frames that carry no MQTT byte (a ping, a pong, an empty binary or continuation frame) cost
  the loop as much as a packet and ask for nothing the MQTT limits see: they are counted
  (``noise``) for the transport to charge to the client's control packet rate, and a
  ``receive`` stops after the one that takes the last of the ``noise_left`` it was given
  (``more``: frames are left, read by the next ``receive``, b"" will do).
- CLOSED: after a refusal or a close, further bytes are ignored; the transport closes the
  connection once ``send`` is written.
"""

from __future__ import annotations

import binascii
import re
import struct

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Ping, Pong,
                            Request, TextMessage)
from wsproto.utilities import RemoteProtocolError

from edgebroker.errors import (ADMINISTRATIVE_ACTION, BAD_AUTHENTICATION_METHOD,
                               BAD_USERNAME_OR_PASSWORD, BANNED, KEEP_ALIVE_TIMEOUT,
                               MESSAGE_RATE_TOO_HIGH, NOT_AUTHORIZED, PACKET_TOO_LARGE,
                               QOS_NOT_SUPPORTED, QUOTA_EXCEEDED, REASON_NAMES,
                               RETAIN_NOT_SUPPORTED, SERVER_SHUTTING_DOWN, SESSION_TAKEN_OVER)

DEFAULT_PATH = "/mqtt"
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
# The request head (request line and headers): browsers send well under 2 KiB.
MAX_REQUEST = 8192
# One WebSocket message: the largest MQTT 3.1.1 packet (remaining length 268,435,455 plus a
# 5-byte fixed header). MQTT's own max_packet_size bounds each packet a message carries.
MAX_MESSAGE = 268_435_460
# Frames one ``receive`` takes (about 10 ms of wsproto's work): the rest are read in the next
# pass of the loop, so a client sending tiny frames flat out shares the loop with the others.
MAX_FRAMES = 1024

# RFC 6455 §7.4.1 status codes the endpoint sends.
NORMAL_CLOSURE = 1000
GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002     # (not errors.PROTOCOL_ERROR, the MQTT reason code)
UNSUPPORTED_DATA = 1003
POLICY_VIOLATION = 1008
MESSAGE_TOO_BIG = 1009

# Why the broker ends a connection (the MQTT 5 reason code the core closed it with) as a close
# code: a 3.1.1 client gets no DISCONNECT, the close code is all it learns (docs/protocol.md).
_CLOSE_CODES = {0: NORMAL_CLOSURE, SESSION_TAKEN_OVER: NORMAL_CLOSURE,
                SERVER_SHUTTING_DOWN: GOING_AWAY, KEEP_ALIVE_TIMEOUT: GOING_AWAY,
                PACKET_TOO_LARGE: MESSAGE_TOO_BIG}
_CLOSE_CODES.update(dict.fromkeys((NOT_AUTHORIZED, BAD_USERNAME_OR_PASSWORD,
                                   BAD_AUTHENTICATION_METHOD, BANNED, QOS_NOT_SUPPORTED,
                                   RETAIN_NOT_SUPPORTED, QUOTA_EXCEEDED, MESSAGE_RATE_TOO_HIGH,
                                   ADMINISTRATIVE_ACTION), POLICY_VIOLATION))

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_VERSION = re.compile(rb"(?im)^sec-websocket-version:([^\r\n]*)")
_HTTP_VERSION = re.compile(rb"[^ \r\n]+ [^ \r\n]+ HTTP/(\d+)\.(\d+)\r?\n")
# A body (RFC 9110 6.4.1): the bytes after the head would be read as frames
# h11 quotes a header line it cannot parse whole, value included: only its name is shown (the
# value may be a credential, ``Authorization : Bearer ...``).
_ILLEGAL_LINE = re.compile(r"illegal header line: (?:bytearray\()?b?['\"]([^:'\"]*).*", re.S)
_BODY = re.compile(rb"(?im)^(transfer-encoding[ \t]*:|content-length[ \t]*:[ \t]*0*[1-9])")
_KEY = re.compile(rb"^sec-websocket-key[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.I | re.M)
# A refusal's reason quotes the client's path or subprotocols: cut, for the reply and the log.
_MAX_REASON = 300
_REASONS = {400: "Bad Request", 404: "Not Found", 426: "Upgrade Required",
            431: "Request Header Fields Too Large"}


def key_problem(head) -> str | None:
    """What is wrong with the request head's ``Sec-WebSocket-Key`` (one header, the base64
    of 16 bytes, RFC 6455 4.2.1 item 5; wsproto takes any), or None."""
    keys = _KEY.findall(head)
    if len(keys) != 1:
        return f"Sec-WebSocket-Key given {len(keys)} times (once required)"
    try:
        key = binascii.a2b_base64(keys[0], strict_mode=True)
    except binascii.Error:
        key = b""
    if len(key) != 16:
        return (f"Sec-WebSocket-Key {keys[0][:40].decode('latin-1')!r} is not the base64 of "
                f"16 bytes")
    return None


class WebSocketInput:
    """What one ``receive`` meant.

    ``mqtt``: the MQTT bytes carried by binary messages, in order, in the pieces they arrived
    in. ``reply``: the handshake's answer, to write first. ``send``: bytes to write to the
    peer as they are, before anything else but ``reply`` (with ``close`` on an open
    connection: its close frame, which goes after the answers to ``mqtt``, as no data may
    follow a close, RFC 6455 5.5.1). ``close``: why the connection must be closed once
    ``send`` is written, or None. ``open``: the handshake is done. ``fault``: the close is the
    peer's fault (a refused request, a frame that breaks the rules), not its own close.
    ``noise``: the frames that carried no MQTT byte; ``more``: ``receive`` stopped at its
    ``noise_left``, frames may be left.
    """

    __slots__ = ("mqtt", "send", "close", "open", "fault", "reply", "noise", "more")

    def __init__(self, mqtt: list, send: bytes, close: str | None, open: bool,
                 fault: bool = False, reply: bytes = b"", noise: int = 0, more: bool = False):
        self.mqtt = mqtt
        self.send = send
        self.close = close
        self.open = open
        self.fault = fault
        self.reply = reply
        self.noise = noise      # frames with no MQTT byte: pings, pongs, empty data frames
        self.more = more        # frames may be left to read (``receive`` stopped early)

    def __repr__(self) -> str:
        return (f"WebSocketInput(mqtt={self.mqtt!r}, send={self.send!r}, close={self.close!r}, "
                f"open={self.open!r}, fault={self.fault!r})")


# Frame headers (RFC 6455 §5.2) of unmasked, final (FIN), binary (opcode 2) frames: the first
# byte 0x82; the second the length when below 126, else 126 and 16 bits, or 127 and 64 bits.
_SMALL_HEADS = tuple(bytes((0x82, n)) for n in range(126))
_HEAD_16 = struct.Struct("!BBH").pack
_HEAD_64 = struct.Struct("!BBQ").pack


def close_code(why: int) -> int:
    """The close code for a close the broker decided, ``why`` the MQTT 5 reason code (0: none):
    1000 normal (also a session taken over), 1001 going away (broker stopping, keepalive
    timeout), 1009 a packet over max_packet_size, 1008 a refusal by policy (not authorized, QoS
    or retain not supported, a quota or rate), 1002 any other protocol violation."""
    return _CLOSE_CODES.get(why, CLOSE_PROTOCOL_ERROR)


_ABSOLUTE = re.compile(r"(?i)^(?:https?|wss?)://[^/?#]*")


def request_path(target: str) -> str:
    """The path of a request target, its query aside: ``/mqtt`` of ``/mqtt?x=1`` and of the
    absolute form ``http://host:port/mqtt`` (a server must accept it: RFC 7230 §5.3.2; a
    proxy-aware client sends it), ``/`` when the absolute form has no path."""
    path = target.partition("?")[0]
    absolute = _ABSOLUTE.match(path)
    return path[absolute.end():] or "/" if absolute else path


def frame_head(n: int) -> bytes:
    """The header of one server-to-client binary frame carrying ``n`` bytes."""
    if n < 126:
        return _SMALL_HEADS[n]
    if n < 65536:
        return _HEAD_16(0x82, 126, n)
    return _HEAD_64(0x82, 127, n)


def http_reply(status: int, body: str, headers: tuple = ()) -> bytes:
    """A complete HTTP/1.1 reply with a one-line text body, after which the server closes."""
    data = (body + "\n").encode()
    lines = [f"HTTP/1.1 {status} {_REASONS[status]}", "Content-Type: text/plain; charset=utf-8",
             f"Content-Length: {len(data)}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


class WebSocketEndpoint:
    """The server side of one WebSocket connection carrying MQTT (module docstring: the rules)."""

    __slots__ = ("path", "subprotocols", "max_message", "max_request", "_ws", "_head", "_open",
                 "_closed", "_message_len", "_more")

    # Called as endpoint.frame_head(n): a plain function, no binding of self.
    frame_head = staticmethod(frame_head)

    def __init__(self, path: str = DEFAULT_PATH, subprotocols: tuple[str, ...] = SUBPROTOCOLS,
                 max_message: int = MAX_MESSAGE, max_request: int = MAX_REQUEST):
        self.path = path
        self.subprotocols = tuple(subprotocols)
        self.max_message = max_message
        self.max_request = max_request
        self._ws = WSConnection(ConnectionType.SERVER)     # its .connection once open
        self._head = bytearray()
        self._open = False
        self._closed = False
        self._message_len = 0      # bytes of the binary message being received so far
        self._more = False         # the last receive stopped early: frames may be left

    @property
    def open(self) -> bool:
        return self._open

    @property
    def more(self) -> bool:
        """The last ``receive`` stopped early: frames may be left to read."""
        return self._more and not self._closed

    def hold(self, data: bytes) -> None:
        """Keep ``data`` (once open) behind what is left, to be read by a later ``receive``."""
        if self._open and not self._closed:
            self._ws.receive_data(data)
            self._more = True

    def receive(self, data: bytes, noise_left: int = 0) -> WebSocketInput:
        """Read ``data`` from the peer; return what it meant (see ``WebSocketInput``). Once
        open, stop after ``noise_left`` frames with no MQTT byte (0: no bound); b"" reads
        on where the last call stopped."""
        if self._closed or not data and not self._more:
            return WebSocketInput([], b"", None, self._open)
        if self._open:
            if data:
                self._ws.receive_data(data)
            return self._frames(b"", noise_left)
        return self._handshake(data, noise_left)

    def close_frame(self, code: int = NORMAL_CLOSURE, reason: str = "") -> bytes:
        """The close frame that begins a close the broker decided (b"" before the handshake or
        once a close was sent)."""
        return self._control(CloseConnection(code=code, reason=reason))

    def closing(self, why: int = 0) -> bytes:
        """The close frame of a connection the broker ends, ``why`` the MQTT 5 reason code the
        core closed it with (0: none; ``close_code``), its name the close reason."""
        return self.close_frame(close_code(why), REASON_NAMES.get(why, "") if why else "")

    def connect_timed_out(self) -> bytes:
        """The close frame for a caller with no CONNECT (or whose password check did not
        finish) within connect_timeout: 1008 (policy violation), the reason saying so."""
        return self.close_frame(POLICY_VIOLATION, "connect_timeout")

    def _control(self, event) -> bytes:
        """A pong or close frame, while the connection is open (b"" before the handshake or
        once a close was sent)."""
        if self._ws.state is not ConnectionState.OPEN:
            return b""
        return self._ws.send(event)

    # -- CONNECTING -------------------------------------------------------------------------------

    def _handshake(self, data: bytes, noise_left: int) -> WebSocketInput:
        head = self._head
        start = max(0, len(head) - 3)   # the empty line may begin in the bytes held before
        head += data
        if head[:1] and not 0x41 <= head[0] <= 0x5A:   # methods are upper-case tokens
            return self._refuse(400, f"not an HTTP request (first byte 0x{head[0]:02x}; "
                                     f"this WebSocket listener needs an HTTP upgrade on "
                                     f"{self.path})")
        end = _HEAD_END.search(head, start, self.max_request)
        if end is None:
            if len(head) > self.max_request:
                return self._refuse(431, f"HTTP request head longer than {self.max_request} "
                                         f"bytes")
            return WebSocketInput([], b"", None, False)
        rest = bytes(head[end.end():])
        self._head = bytearray()
        version = _HTTP_VERSION.match(head, 0, end.end())
        version = (int(version[1]), int(version[2])) if version is not None else (1, 1)
        if version < (1, 1):
            # h11 takes HTTP/1.0; an upgrade needs HTTP/1.1 or later (RFC 6455 4.2.1 item 1)
            return self._refuse(400, "not a WebSocket upgrade request: HTTP/%d.%d (a WebSocket "
                                     "upgrade needs HTTP/1.1 or later)" % version)
        try:
            self._ws.receive_data(bytes(head[:end.end()]))
            request = next((e for e in self._ws.events() if isinstance(e, Request)), None)
        except UnicodeError as exc:    # not ASCII, or a Host that is not a valid host name
            what = ("a header value is not ASCII" if isinstance(exc, UnicodeDecodeError)
                    and exc.encoding == "ascii" else "bad Host")
            return self._refuse(400, f"not a WebSocket upgrade request: {what}: {exc}")
        except RemoteProtocolError as exc:
            # "Bad HTTP message" comes with h11's reason as the exception it was raised in
            why = f"{exc}: {exc.__context__}" if exc.__context__ is not None else str(exc)
            why = _ILLEGAL_LINE.sub(lambda m: f"illegal header line (header {m[1].strip()[:40]!r}"
                                              f"; its value not shown)", why)
            hint = exc.event_hint
            status = getattr(hint, "status_code", 400)
            extra = tuple((k.decode(), v.decode()) for k, v in getattr(hint, "headers", ()))
            version = _VERSION.search(head, 0, end.end())
            if status == 426 and version is not None:
                # wsproto says the header is missing; it is there, with another version
                offered = version.group(1).strip().decode("ascii", "replace")[:40]
                return self._refuse(426, f"WebSocket version {offered!r} not supported "
                                         f"(Sec-WebSocket-Version: 13 only)", extra)
            return self._refuse(status if status in _REASONS else 400,
                                f"not a WebSocket upgrade request: {why}", extra)
        if request is None:
            return self._refuse(400, "not a WebSocket upgrade request: no complete request")
        body = _BODY.search(head, 0, end.end())
        if body is not None:
            what = body[1].partition(b":")[0].strip().decode("ascii", "replace")
            return self._refuse(400, f"not a WebSocket upgrade request: it has a body "
                                     f"({what}); an upgrade GET has none")
        problem = key_problem(head[:end.end()])
        if problem is not None:
            return self._refuse(400, f"not a WebSocket upgrade request: {problem}")
        path = request_path(request.target)
        if path != self.path:
            return self._refuse(404, f"no WebSocket endpoint at {path!r} (it is at "
                                     f"{self.path!r})")
        # "mqtt" when the client offers it (MQTT-6.0.0-4), else the first of its list
        chosen = ("mqtt" if "mqtt" in request.subprotocols and "mqtt" in self.subprotocols
                  else next((p for p in request.subprotocols if p in self.subprotocols), None))
        if chosen is None:
            offered = ", ".join(request.subprotocols) or "none"
            return self._refuse(400, f"WebSocket subprotocol {' or '.join(self.subprotocols)} "
                                     f"required (offered: {offered})")
        reply = self._ws.send(AcceptConnection(subprotocol=chosen))
        # From here on only the WebSocket connection itself: wsproto's handshake state (its
        # h11 connection, about 2.8 KB) is never used again, and a connection may be idle for
        # days (WSConnection would still pass each events() through the handshake's).
        self._ws = self._ws.connection
        self._open = True
        if rest:
            self._ws.receive_data(rest)
        return self._frames(reply, noise_left)

    def _refuse(self, status: int, why: str, headers: tuple = ()) -> WebSocketInput:
        if len(why) > _MAX_REASON:
            why = why[:_MAX_REASON - 3] + "..."
        self._closed = True
        self._head = bytearray()
        return WebSocketInput([], http_reply(status, why, headers), f"HTTP {status}: {why}",
                              False, True)

    # -- OPEN -------------------------------------------------------------------------------------

    def _frames(self, reply: bytes = b"", noise_left: int = 0) -> WebSocketInput:
        """The events of the frames wsproto has parsed, up to the one that takes the last of
        ``noise_left`` (0: all); ``reply``: the handshake's answer."""
        ws = self._ws
        mqtt = []
        out = []
        close = None
        fault = True            # unless the client closed
        noise = 0
        self._more = False
        frames = MAX_FRAMES
        for event in ws.events():
            frames -= 1
            if isinstance(event, BytesMessage):
                n = self._message_len + len(event.data)
                if n > self.max_message:
                    close = f"WebSocket message longer than {self.max_message} bytes"
                    out.append(self._control(CloseConnection(MESSAGE_TOO_BIG, "too big")))
                    break
                self._message_len = 0 if event.message_finished else n
                if event.data:
                    mqtt.append(event.data)
                else:
                    noise += 1
            elif isinstance(event, Ping):
                out.append(self._control(event.response()))
                noise += 1
            elif isinstance(event, Pong):
                noise += 1
            elif isinstance(event, CloseConnection):
                if ws.state is ConnectionState.REMOTE_CLOSING:
                    out.append(ws.send(event.response()))
                    close = f"WebSocket closed by the client (code {event.code})"
                    fault = False
                elif ws.state is ConnectionState.CLOSED:
                    close = f"WebSocket close answered by the client (code {event.code})"
                    fault = False
                else:   # a frame wsproto could not parse: still OPEN, we close with its code
                    out.append(self._control(CloseConnection(event.code, "protocol error")))
                    close = f"WebSocket protocol error: {event.reason} (close {event.code})"
                break
            elif isinstance(event, TextMessage):
                close = "WebSocket text frame (MQTT travels in binary frames only)"
                out.append(self._control(CloseConnection(UNSUPPORTED_DATA, "binary only")))
                break
            if noise and noise == noise_left or not frames:
                # The rest waits in wsproto's buffer, in order: for the throttle's end, or
                # (MAX_FRAMES) for the next pass, so that frames of a byte or two each cannot
                # keep the loop from the other clients.
                self._more = True
                break
        if close is not None:
            self._closed = True
        return WebSocketInput(mqtt, b"".join(out), close, True, close is not None and fault,
                              reply, noise, self._more)
