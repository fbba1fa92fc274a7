"""A small, independent MQTT 3.1.1 encoder/decoder and a blocking raw-socket client for the tests.

Written from the OASIS MQTT 3.1.1 specification. It deliberately imports nothing from
``edgebroker``, so a codec bug in the broker cannot hide behind the same bug in the tests
(the approach of Mosquitto's ``test/mosq_test.py``).

Builders return the exact bytes of one packet. Every builder takes enough knobs to produce
deliberately malformed packets too (reserved flags, bad lengths, raw QoS bytes, ...); for
anything stranger, ``packet(ptype, flags, body, remaining_length=...)`` and ``frame(...)``
assemble arbitrary fixed headers.
"""

from __future__ import annotations

import collections
import socket
import struct
import time

# Control packet types (section 2.2.1).
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14

NAMES = {
    0: "RESERVED0", CONNECT: "CONNECT", CONNACK: "CONNACK", PUBLISH: "PUBLISH",
    PUBACK: "PUBACK", PUBREC: "PUBREC", PUBREL: "PUBREL", PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE", SUBACK: "SUBACK", UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK", PINGREQ: "PINGREQ", PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT", 15: "RESERVED15",
}

MAX_REMAINING_LENGTH = 268_435_455


# ---------------------------------------------------------------------------------------------
# Encoding primitives
# ---------------------------------------------------------------------------------------------

def varint(n: int) -> bytes:
    """Remaining Length encoding (section 2.2.3): 7 bits per byte, high bit = continuation."""
    if not 0 <= n <= MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length out of range: {n}")
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def to_bytes(s: str | bytes | bytearray) -> bytes:
    return s.encode("utf-8") if isinstance(s, str) else bytes(s)


def mqtt_str(s: str | bytes) -> bytes:
    """A length-prefixed string / binary field (section 1.5.3). Bytes are sent as given."""
    b = to_bytes(s)
    return struct.pack("!H", len(b)) + b


def frame(first_byte: int, length_bytes: bytes, body: bytes = b"") -> bytes:
    """Arbitrary fixed header: first byte, hand-made remaining-length bytes, body."""
    return bytes([first_byte]) + length_bytes + body


def packet(ptype: int, flags: int = 0, body: bytes = b"", remaining_length: int | None = None) -> bytes:
    """One packet; ``remaining_length`` may lie about the body length to build malformed frames."""
    rl = len(body) if remaining_length is None else remaining_length
    return bytes([((ptype & 0x0F) << 4) | (flags & 0x0F)]) + varint(rl) + body


# ---------------------------------------------------------------------------------------------
# Packet builders (client -> server, and server -> client ones for "wrong direction" tests)
# ---------------------------------------------------------------------------------------------

def connect(client_id: str | bytes = "", clean: bool = True, keepalive: int = 60, will=None,
            username: str | bytes | None = None, password: str | bytes | None = None,
            proto_name: bytes = b"MQTT", level: int = 4, flags_override: int | None = None,
            header_flags: int = 0, properties: bytes = b"") -> bytes:
    """CONNECT (section 3.1). ``will`` is (topic, payload[, qos[, retain]]).

    For protocol level 3 pass ``proto_name=b"MQIsdp", level=3``. For 5.0 (mqttraw5.connect5)
    ``properties`` is the encoded property section, and the will's is the will's fifth item.
    """
    flags = 0x02 if clean else 0
    payload = mqtt_str(client_id)
    if will is not None:
        topic, message, *rest = will
        qos = rest[0] if len(rest) > 0 else 0
        retain = rest[1] if len(rest) > 1 else False
        flags |= 0x04 | ((qos & 0x03) << 3) | (0x20 if retain else 0)
        payload += (rest[2] if len(rest) > 2 else b"") + mqtt_str(topic) + mqtt_str(message)
    if username is not None:
        flags |= 0x80
        payload += mqtt_str(username)
    if password is not None:
        flags |= 0x40
        payload += mqtt_str(password)
    if flags_override is not None:
        flags = flags_override
    body = (mqtt_str(proto_name) + bytes([level & 0xFF, flags & 0xFF]) + struct.pack("!H", keepalive)
            + properties + payload)
    return packet(CONNECT, header_flags, body)


def connect_v31(client_id: str | bytes = "", **kw) -> bytes:
    return connect(client_id, proto_name=b"MQIsdp", level=3, **kw)


def connack(session_present: bool = False, rc: int = 0) -> bytes:
    return packet(CONNACK, 0, bytes([1 if session_present else 0, rc]))


def publish(topic: str | bytes, payload: str | bytes = b"", qos: int = 0, retain: bool = False,
            dup: bool = False, packet_id: int | None = None, flags: int | None = None) -> bytes:
    """PUBLISH (section 3.3). ``packet_id`` defaults to 1 for QoS > 0 and is omitted for QoS 0
    unless given (which makes a malformed packet). ``flags`` overrides the four flag bits."""
    if flags is None:
        flags = (0x08 if dup else 0) | ((qos & 0x03) << 1) | (0x01 if retain else 0)
    body = mqtt_str(topic)
    if packet_id is None and qos > 0:
        packet_id = 1
    if packet_id is not None:
        body += struct.pack("!H", packet_id)
    body += to_bytes(payload)
    return packet(PUBLISH, flags, body)


def _pid_only(ptype: int, packet_id: int, flags: int = 0) -> bytes:
    return packet(ptype, flags, struct.pack("!H", packet_id))


def puback(packet_id: int, flags: int = 0) -> bytes:
    return _pid_only(PUBACK, packet_id, flags)


def pubrec(packet_id: int, flags: int = 0) -> bytes:
    return _pid_only(PUBREC, packet_id, flags)


def pubrel(packet_id: int, flags: int = 0x02) -> bytes:
    return _pid_only(PUBREL, packet_id, flags)


def pubcomp(packet_id: int, flags: int = 0) -> bytes:
    return _pid_only(PUBCOMP, packet_id, flags)


def subscribe(packet_id: int, topics, flags: int = 0x02) -> bytes:
    """SUBSCRIBE (section 3.8). ``topics``: iterable of filter strings or (filter, qos_byte);
    the QoS byte is sent as given, so reserved bits / QoS 3 can be tested."""
    body = struct.pack("!H", packet_id)
    for t in topics:
        flt, q = (t, 0) if isinstance(t, (str, bytes)) else t
        body += mqtt_str(flt) + bytes([q & 0xFF])
    return packet(SUBSCRIBE, flags, body)


def suback(packet_id: int, codes=(0,)) -> bytes:
    return packet(SUBACK, 0, struct.pack("!H", packet_id) + bytes(codes))


def unsubscribe(packet_id: int, filters, flags: int = 0x02) -> bytes:
    body = struct.pack("!H", packet_id)
    for flt in filters:
        body += mqtt_str(flt)
    return packet(UNSUBSCRIBE, flags, body)


def unsuback(packet_id: int) -> bytes:
    return _pid_only(UNSUBACK, packet_id)


def pingreq(flags: int = 0) -> bytes:
    return packet(PINGREQ, flags)


def pingresp() -> bytes:
    return packet(PINGRESP, 0)


def disconnect(flags: int = 0) -> bytes:
    return packet(DISCONNECT, flags)


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------

class MalformedPacket(Exception):
    """The server sent something this decoder cannot parse."""


class Packet:
    """One decoded packet. Always has ``type``, ``flags``, ``body``; plus, per type:

    CONNACK: ``session_present``, ``rc``; PUBLISH: ``topic``, ``payload``, ``qos``, ``retain``,
    ``dup``, ``packet_id``; PUBACK/PUBREC/PUBREL/PUBCOMP/UNSUBACK: ``packet_id``;
    SUBACK: ``packet_id``, ``codes``.
    """

    def __init__(self, ptype: int, flags: int, body: bytes):
        self.type = ptype
        self.flags = flags
        self.body = bytes(body)
        self.packet_id = None
        try:
            self._parse()
        except (IndexError, struct.error, UnicodeDecodeError) as e:
            raise MalformedPacket(f"cannot parse {self.name}: {e!r} body={self.body!r}") from e

    @property
    def name(self) -> str:
        return NAMES.get(self.type, str(self.type))

    def _parse(self):
        b = self.body
        if self.type == CONNACK:
            if len(b) != 2:
                raise MalformedPacket(f"CONNACK with {len(b)} bytes")
            self.session_present = bool(b[0] & 0x01)
            self.ack_flags = b[0]
            self.rc = b[1]
        elif self.type == PUBLISH:
            self.dup = bool(self.flags & 0x08)
            self.qos = (self.flags >> 1) & 0x03
            self.retain = bool(self.flags & 0x01)
            (tlen,) = struct.unpack_from("!H", b, 0)
            if 2 + tlen > len(b):
                raise MalformedPacket("PUBLISH topic longer than the packet")
            self.topic = b[2:2 + tlen].decode("utf-8")
            pos = 2 + tlen
            if self.qos > 0:
                (self.packet_id,) = struct.unpack_from("!H", b, pos)
                pos += 2
            self.payload = b[pos:]
        elif self.type in (PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK):
            if len(b) != 2:
                raise MalformedPacket(f"{self.name} with {len(b)} bytes")
            (self.packet_id,) = struct.unpack("!H", b)
        elif self.type == SUBACK:
            (self.packet_id,) = struct.unpack_from("!H", b, 0)
            self.codes = list(b[2:])

    def __repr__(self) -> str:
        if self.type == PUBLISH:
            return (f"<PUBLISH topic={self.topic!r} payload={self.payload[:60]!r} qos={self.qos} "
                    f"retain={int(self.retain)} dup={int(self.dup)} pid={self.packet_id}>")
        if self.type == CONNACK:
            return f"<CONNACK sp={int(self.session_present)} rc={self.rc}>"
        if self.type == SUBACK:
            return f"<SUBACK pid={self.packet_id} codes={self.codes}>"
        if self.packet_id is not None:
            return f"<{self.name} pid={self.packet_id} flags={self.flags:#x}>"
        return f"<{self.name} flags={self.flags:#x} body={self.body!r}>"


def split_frames(buf: bytearray, packet_class=None) -> list[Packet]:
    """Remove and decode every complete frame at the start of ``buf`` (as ``packet_class``
    objects: ``Packet`` by default; mqttraw5 passes its own)."""
    cls = Packet if packet_class is None else packet_class
    out = []
    while True:
        if len(buf) < 2:
            return out
        mult, length, i = 1, 0, 1
        while True:
            if i >= len(buf):
                return out
            if i > 4:
                raise MalformedPacket("remaining length longer than 4 bytes")
            byte = buf[i]
            length += (byte & 0x7F) * mult
            mult *= 128
            i += 1
            if not byte & 0x80:
                break
        if len(buf) < i + length:
            return out
        first = buf[0]
        body = bytes(buf[i:i + length])
        del buf[:i + length]
        out.append(cls(first >> 4, first & 0x0F, body))


# ---------------------------------------------------------------------------------------------
# A blocking client over a plain socket
# ---------------------------------------------------------------------------------------------

class ConnectionClosed(Exception):
    """The server closed the connection while we were waiting for a packet."""


class RawClient:
    """A blocking MQTT client with explicit control over every byte.

    Packets that arrive while a helper waits for something else (e.g. a PUBLISH while
    ``publish()`` waits for its PUBACK) are kept and returned by later ``recv_packet`` calls,
    in arrival order.
    """

    packet_class = Packet  # what received frames are parsed as (mqttraw5.RawClient5: 5.0)

    def __init__(self, host: str, port: int, timeout: float = 5.0, *, unix_path: str | None = None,
                 source: str | None = None, ssl_context=None, server_hostname: str | None = None,
                 rcvbuf: int | None = None):
        """TCP to ``host:port`` (from ``source`` address if given), or the Unix socket
        ``unix_path``; with ``ssl_context`` the TLS handshake is done here (blocking).
        ``rcvbuf`` sets SO_RCVBUF before connecting (a small one makes a stuck reader)."""
        self.host, self.port = host, port
        if unix_path is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if rcvbuf is not None:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            self.sock.connect(unix_path)
        elif rcvbuf is None:
            self.sock = socket.create_connection(
                (host, port), timeout=timeout,
                source_address=(source, 0) if source is not None else None)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            if source is not None:
                self.sock.bind((source, 0))
            self.sock.connect((host, port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                self.sock = ssl_context.wrap_socket(self.sock, server_hostname=server_hostname or host)
            except BaseException:
                self.sock.close()
                raise
        self._buf = bytearray()
        self._pending: collections.deque[Packet] = collections.deque()
        self._eof = False
        self._closed_locally = False
        self._next_pid = 0
        self.before_close: list[Packet] = []
        self.client_id = None

    # -- low level ------------------------------------------------------------------------------
    @property
    def local_port(self) -> int:
        return self.sock.getsockname()[1]

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_slowly(self, data: bytes) -> None:
        """One byte per send() call (TCP_NODELAY is on, so mostly one byte per segment)."""
        for i in range(len(data)):
            self.sock.sendall(data[i:i + 1])

    def _read_more(self, deadline: float) -> bool:
        """Read once from the socket. False on timeout; raises ConnectionClosed on EOF/reset."""
        if self._eof:
            raise ConnectionClosed("connection already closed by the server")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as e:
            self._eof = True
            raise ConnectionClosed(f"connection reset: {e!r}") from e
        except OSError as e:
            if type(e).__name__.startswith("SSL"):      # e.g. SSLEOFError: closed without close_notify
                self._eof = True
                raise ConnectionClosed(f"TLS connection closed: {e!r}") from e
            raise
        if not data:
            self._eof = True
            raise ConnectionClosed("server closed the connection")
        self._buf += data
        self._pending.extend(split_frames(self._buf, self.packet_class))
        return True

    def recv_packet(self, timeout: float = 5.0) -> Packet:
        """The next packet. Raises TimeoutError if none within ``timeout`` s, ConnectionClosed if
        the server closes the connection first."""
        deadline = time.monotonic() + timeout
        while not self._pending:
            if not self._read_more(deadline):
                raise TimeoutError(f"no packet within {timeout} s")
        return self._pending.popleft()

    def expect(self, ptype: int, timeout: float = 5.0) -> Packet:
        """The next packet, which must be of type ``ptype``."""
        p = self.recv_packet(timeout)
        assert p.type == ptype, f"expected {NAMES[ptype]}, got {p!r}"
        return p

    def wait_for(self, pred, timeout: float = 5.0) -> Packet:
        """The first packet matching ``pred``; the others stay queued, in order."""
        deadline = time.monotonic() + timeout
        scanned = 0
        while True:
            for i in range(scanned, len(self._pending)):
                if pred(self._pending[i]):
                    p = self._pending[i]
                    del self._pending[i]
                    return p
            scanned = len(self._pending)
            if not self._read_more(deadline):
                raise TimeoutError(f"no matching packet within {timeout} s; got {list(self._pending)}")

    def expect_closed(self, timeout: float = 5.0) -> bool:
        """True when the server closes the connection within ``timeout`` s, else False.
        Packets received meanwhile are appended to ``before_close``."""
        deadline = time.monotonic() + timeout
        while True:
            while self._pending:
                self.before_close.append(self._pending.popleft())
            try:
                if not self._read_more(deadline):
                    return False
            except ConnectionClosed:
                self.before_close.extend(self._pending)
                self._pending.clear()
                return True

    def read_until_closed(self, timeout: float = 5.0) -> bytes:
        """Raw bytes (not parsed as MQTT) until the server closes; TimeoutError if it does not."""
        deadline = time.monotonic() + timeout
        data = bytearray(self._buf)
        self._buf.clear()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"connection not closed within {timeout} s; got {bytes(data)!r}")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, ConnectionAbortedError):
                chunk = b""
            if not chunk:
                self._eof = True
                return bytes(data)
            data += chunk

    def close(self) -> None:
        self._closed_locally = True
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Close with a TCP RST (SO_LINGER 0): an abrupt network failure."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    # -- MQTT helpers ---------------------------------------------------------------------------
    def next_pid(self) -> int:
        self._next_pid = self._next_pid % 65535 + 1
        return self._next_pid

    def connect(self, client_id: str | bytes = "", timeout: float = 5.0, **kw) -> Packet:
        """Send CONNECT and return the CONNACK (whatever its return code)."""
        self.client_id = client_id
        self.send(connect(client_id, **kw))
        return self.expect(CONNACK, timeout)

    def subscribe(self, *topics, qos: int = 0, timeout: float = 5.0) -> Packet:
        """SUBSCRIBE to filters (strings use ``qos``; tuples give their own); return the SUBACK."""
        pid = self.next_pid()
        items = [(t, qos) if isinstance(t, (str, bytes)) else t for t in topics]
        self.send(subscribe(pid, items))
        p = self.wait_for(lambda p: p.type == SUBACK, timeout)
        assert p.packet_id == pid, f"SUBACK for packet id {p.packet_id}, expected {pid}"
        return p

    def unsubscribe(self, *filters, timeout: float = 5.0) -> Packet:
        pid = self.next_pid()
        self.send(unsubscribe(pid, filters))
        p = self.wait_for(lambda p: p.type == UNSUBACK, timeout)
        assert p.packet_id == pid, f"UNSUBACK for packet id {p.packet_id}, expected {pid}"
        return p

    def publish(self, topic, payload=b"", qos: int = 0, retain: bool = False, timeout: float = 5.0) -> int | None:
        """Publish and complete the QoS 1/2 handshake. Returns the packet id used (None for QoS 0)."""
        if qos == 0:
            self.send(publish(topic, payload, 0, retain))
            return None
        pid = self.next_pid()
        self.send(publish(topic, payload, qos, retain, packet_id=pid))
        if qos == 1:
            self.wait_for(lambda p: p.type == PUBACK and p.packet_id == pid, timeout)
        else:
            self.wait_for(lambda p: p.type == PUBREC and p.packet_id == pid, timeout)
            self.send(pubrel(pid))
            self.wait_for(lambda p: p.type == PUBCOMP and p.packet_id == pid, timeout)
        return pid

    def recv_publish(self, timeout: float = 5.0, ack: bool = True) -> Packet:
        """The next packet, which must be a PUBLISH; with ``ack`` the QoS handshake is completed."""
        p = self.expect(PUBLISH, timeout)
        if ack:
            self.ack(p, timeout)
        return p

    def ack(self, p: Packet, timeout: float = 5.0) -> None:
        if p.qos == 1:
            self.send(puback(p.packet_id))
        elif p.qos == 2:
            self.send(pubrec(p.packet_id))
            self.wait_for(lambda q: q.type == PUBREL and q.packet_id == p.packet_id, timeout)
            self.send(pubcomp(p.packet_id))

    def ping(self, timeout: float = 5.0) -> list[Packet]:
        """PINGREQ; returns the packets that arrived before the PINGRESP (a barrier: everything the
        server queued for us before reading our PINGREQ comes first)."""
        self.send(pingreq())
        got = []
        while True:
            p = self.recv_packet(timeout)
            if p.type == PINGRESP:
                return got
            got.append(p)

    def disconnect(self) -> None:
        """Clean DISCONNECT then close."""
        try:
            self.send(disconnect())
        except OSError:
            pass
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
