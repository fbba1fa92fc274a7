"""MQTT 3.1.1 / 3.1 wire format: packets <-> bytes, with no I/O.

``encode(packet)`` turns any of the 14 packet objects into one frame.
``encode_publish_head``, ``encode_ack`` and ``PINGRESP_BYTES`` are the
allocation-light pieces the broker's hot path uses.

``Decoder.feed(data)`` takes any split of the incoming byte stream and returns
a generator of the complete packets found so far, in order.

Decoder rules (the broker relies on these):

* Unconsumed bytes stay inside the decoder; each ``feed`` appends to them.
* A frame is checked against ``max_packet_size`` (whole frame: fixed header
  plus remaining length) as soon as its remaining-length field is complete,
  before its body is buffered. The first byte (type and flags) is checked as
  soon as it arrives.
* A violation raises ``ProtocolError`` when the generator reaches the bad frame;
  the frames before it have already been yielded. The decoder is then dead:
  every later ``feed`` raises the same error.
* The consumer may stop iterating at any point. Frames it did not take stay
  buffered and come out of the next ``feed``, which closes the abandoned
  generator first; so at most one generator per decoder is live. The generator
  decodes from the fed bytes themselves: a consumer that feeds a view of a
  shared buffer exhausts or closes it before the buffer is reused, and holds
  bytes it will not decode yet with ``keep``.
* A PUBLISH of ``LARGE_FRAME`` bytes or more that has not fully arrived gets a
  payload buffer of its own; ``room`` is the part still to come, which a reader
  may receive into directly (then ``filled(n)``). The buffer, a ``bytearray``,
  becomes the packet's payload: nothing modifies it afterwards. ``read_hint``
  suggests a short read after such a packet, so that the next one's payload
  also goes straight to its own buffer.

Every rule violation names the specification's conformance id in ``rule``
(section numbers such as ``MQTT-2.2.3`` where the spec has no numbered rule).
"""

from __future__ import annotations

import functools
import re
import struct

from edgebroker.errors import (
    MALFORMED_PACKET, PACKET_TOO_LARGE, PROTOCOL_ERROR, TOPIC_NAME_INVALID,
    UNSUPPORTED_PROTOCOL_VERSION, ProtocolError,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.packets import (
    Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec, Pubrel,
    Suback, Subscribe, Unsuback, Unsubscribe, Will,
)
from edgebroker.mqtt.topics import validate_topic_filter, validate_topic_name

MAX_REMAINING_LENGTH = 268435455  # four bytes of variable-length integer
MAX_PACKET_SIZE = MAX_REMAINING_LENGTH + 5

_U16 = struct.Struct("!H")
_ACK = struct.Struct("!BBH")
_HEAD_SMALL = struct.Struct("!BBH")  # first byte, 1-byte remaining length, topic length
_pack_u16 = _U16.pack
_pack_ack = _ACK.pack
_pack_head_small = _HEAD_SMALL.pack

_SUBACK_CODES = frozenset({0, 1, 2, P.SUBACK_FAILURE})

# Fixed-header flag nibble each type must carry (PUBLISH flags vary; checked apart).
_REQUIRED_FLAGS = {
    P.CONNECT: 0, P.CONNACK: 0, P.PUBACK: 0, P.PUBREC: 0, P.PUBREL: 2, P.PUBCOMP: 0,
    P.SUBSCRIBE: 2, P.SUBACK: 0, P.UNSUBSCRIBE: 2, P.UNSUBACK: 0, P.PINGREQ: 0,
    P.PINGRESP: 0, P.DISCONNECT: 0,
}


# --------------------------------------------------------------------------- encoding

def _remaining_length(n: int) -> bytes:
    # Written out per length (7 bits a byte, the high bit says another follows): a 64 KiB
    # payload's header is encoded once per message.
    if n < 128:
        return _RL1[n]
    if n < 16_384:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 2_097_152:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {n} exceeds {MAX_REMAINING_LENGTH}")
    return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 & 0x7F | 0x80, n >> 21))


_RL1 = [bytes((i,)) for i in range(128)]


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _remaining_length(len(body)) + body


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _binary(raw)


def _binary(raw: bytes) -> bytes:
    if len(raw) > 0xFFFF:
        raise ValueError(f"field of {len(raw)} bytes does not fit a 2-byte length")
    return _pack_u16(len(raw)) + raw


def encode_publish_head(topic_bytes: bytes, payload_len: int, qos: int, retain: bool,
                        dup: bool, packet_id: int | None) -> bytes:
    """Everything of a PUBLISH frame before the payload: frame = head + payload.

    ``topic_bytes`` is the UTF-8 topic name; ``packet_id`` is used only when qos > 0.
    """
    first = 0x30 | qos << 1 | retain | dup << 3
    tlen = len(topic_bytes)
    if qos:
        rl = tlen + 4 + payload_len
        if rl < 128:
            return _pack_head_small(first, rl, tlen) + topic_bytes + _pack_u16(packet_id)
        return b"".join((bytes((first,)), _remaining_length(rl), _pack_u16(tlen), topic_bytes,
                         _pack_u16(packet_id)))
    rl = tlen + 2 + payload_len
    if rl < 128:
        return _pack_head_small(first, rl, tlen) + topic_bytes
    return b"".join((bytes((first,)), _remaining_length(rl), _pack_u16(tlen), topic_bytes))


_ACK_FIRST = {
    P.PUBACK: 0x40, P.PUBREC: 0x50, P.PUBREL: 0x62, P.PUBCOMP: 0x70, P.UNSUBACK: 0xB0,
}


def encode_ack(packet_type: int, packet_id: int) -> bytes:
    """A PUBACK/PUBREC/PUBREL/PUBCOMP/UNSUBACK frame for ``packet_id``."""
    return _pack_ack(_ACK_FIRST[packet_type], 2, packet_id)


# encode_ack(PUBACK, packet_id) without a Python frame: one per QoS 1 PUBLISH received.
encode_puback = functools.partial(_pack_ack, _ACK_FIRST[P.PUBACK], 2)


def encode_connack(session_present: bool, return_code: int) -> bytes:
    return bytes((0x20, 2, 1 if session_present else 0, return_code))


PINGRESP_BYTES = b"\xd0\x00"
PINGREQ_BYTES = b"\xc0\x00"
DISCONNECT_BYTES = b"\xe0\x00"


def _enc_connect(p: Connect) -> bytes:
    flags = 0x02 if p.clean_session else 0
    parts = [_str(p.protocol_name), bytes((p.protocol_level,)), b"", _pack_u16(p.keepalive),
             _str(p.client_id)]
    will = p.will
    if will is not None:
        flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
        parts.append(_str(will.topic))
        parts.append(_binary(will.payload))
    if p.username is not None:
        flags |= 0x80
        parts.append(_str(p.username))
    if p.password is not None:
        flags |= 0x40
        parts.append(_binary(p.password))
    parts[2] = bytes((flags,))
    return _frame(0x10, b"".join(parts))


def _enc_connack(p: Connack) -> bytes:
    return encode_connack(p.session_present, p.return_code)


def _enc_publish(p: Publish) -> bytes:
    topic = p.topic.encode("utf-8")
    return encode_publish_head(topic, len(p.payload), p.qos, bool(p.retain), bool(p.dup),
                               p.packet_id) + p.payload


def _enc_id_only(p) -> bytes:
    return encode_ack(p.type, p.packet_id)


def _enc_subscribe(p: Subscribe) -> bytes:
    body = [_pack_u16(p.packet_id)]
    for topic_filter, qos in p.topics:
        body.append(_str(topic_filter))
        body.append(bytes((qos,)))
    return _frame(0x82, b"".join(body))


def _enc_suback(p: Suback) -> bytes:
    return _frame(0x90, _pack_u16(p.packet_id) + bytes(p.return_codes))


def _enc_unsubscribe(p: Unsubscribe) -> bytes:
    return _frame(0xA2, _pack_u16(p.packet_id) + b"".join(_str(t) for t in p.topics))


_ENCODERS = {
    P.CONNECT: _enc_connect, P.CONNACK: _enc_connack, P.PUBLISH: _enc_publish,
    P.PUBACK: _enc_id_only, P.PUBREC: _enc_id_only, P.PUBREL: _enc_id_only,
    P.PUBCOMP: _enc_id_only, P.SUBSCRIBE: _enc_subscribe, P.SUBACK: _enc_suback,
    P.UNSUBSCRIBE: _enc_unsubscribe, P.UNSUBACK: _enc_id_only,
    P.PINGREQ: lambda p: PINGREQ_BYTES, P.PINGRESP: lambda p: PINGRESP_BYTES,
    P.DISCONNECT: lambda p: DISCONNECT_BYTES,
}


def encode(packet) -> bytes:
    """One complete frame for ``packet`` (any of the 14 packet classes)."""
    return _ENCODERS[packet.type](packet)


# --------------------------------------------------------------------------- decoding

def _malformed(message: str, rule: str = "MQTT-2.2.3") -> ProtocolError:
    return ProtocolError(message, rule=rule, reason=MALFORMED_PACKET)


def _first_byte_error(b0: int) -> ProtocolError | None:
    """The error for a bad first byte (type + flags), or None if it is acceptable."""
    ptype, flags = b0 >> 4, b0 & 0x0F
    if ptype == 0 or ptype == 15:
        return _malformed(f"reserved packet type {ptype}", rule="MQTT-2.2.1")
    if ptype == P.PUBLISH:
        qos = flags >> 1 & 3
        if qos == 3:
            return _malformed("PUBLISH with QoS 3", rule="MQTT-3.3.1-4")
        if qos == 0 and flags & 0x08:
            return _malformed("PUBLISH with DUP set and QoS 0", rule="MQTT-3.3.1-2")
        return None
    required = _REQUIRED_FLAGS[ptype]
    if flags != required:
        return _malformed(f"{P.NAMES[ptype]} with fixed-header flags {flags:04b} "
                          f"(must be {required:04b})", rule="MQTT-2.2.2-1")
    return None


# Indexed by the first byte of a frame: None when acceptable, else the error to raise.
_FIRST_BYTE_ERRORS = [_first_byte_error(b) for b in range(256)]


def _read_u16(buf: bytes, p: int, end: int, what: str, before: str = "", after: str = "") -> int:
    # The field's name is put together only for the error message.
    if p + 2 > end:
        raise _malformed(f"{before}{what}{after} runs past the end of the packet")
    return buf[p] << 8 | buf[p + 1]


def _read_binary(buf: bytes, p: int, end: int, what: str) -> tuple[bytes, int]:
    n = _read_u16(buf, p, end, what, before="length of ")
    q = p + 2 + n
    if q > end:
        raise _malformed(f"{what} ({n} bytes) runs past the end of the packet")
    return buf[p + 2:q], q


# Code points a string should not hold (section 1.5.3; a receiver may close the connection,
# and Mosquitto does): the control characters U+0001..U+001F and U+007F..U+009F, and the
# non-characters (U+FDD0..U+FDEF, and the last two of every plane). U+0000 is ruled out apart.
_DISCOURAGED = re.compile("[\\x01-\\x1f\\x7f-\\x9f\\ufdd0-\\ufdef" + "".join(
    f"\\U{plane << 16 | 0xFFFE:08x}\\U{plane << 16 | 0xFFFF:08x}" for plane in range(17)) + "]")


def check_code_points(text: str, what: str) -> None:
    """Raise ProtocolError when ``text`` holds a control character or a non-character."""
    found = _DISCOURAGED.search(text)
    if found is not None:
        code = ord(found.group())
        kind = "a control character" if code <= 0x9F else "a non-character"
        raise _malformed(f"{what} contains U+{code:04X}, {kind}", rule="MQTT-1.5.3")


def _read_str(buf: bytes, p: int, end: int, what: str) -> tuple[str, int]:
    raw, q = _read_binary(buf, p, end, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"{what} is not well-formed UTF-8", rule="MQTT-1.5.3-1") from None
    if "\x00" in text:
        raise _malformed(f"{what} contains U+0000", rule="MQTT-1.5.3-2")
    check_code_points(text, what)
    return text, q


def _read_packet_id(buf: bytes, p: int, end: int, name: str) -> int:
    pid = _read_u16(buf, p, end, name, after=" packet identifier")
    if pid == 0:
        raise _malformed(f"{name} with packet identifier 0", rule="MQTT-2.3.1-1")
    return pid


def _no_trailing(p: int, end: int, name: str) -> None:
    if p != end:
        raise _malformed(f"{name} has {end - p} bytes after its last field")


def _dec_connect(b0: int, buf: bytes, p: int, end: int) -> Connect:
    name, p = _read_binary(buf, p, end, "CONNECT protocol name")
    if name != b"MQTT" and name != b"MQIsdp":
        raise ProtocolError(f"CONNECT with unknown protocol name {name!r}",
                            rule="MQTT-3.1.2-1", reason=PROTOCOL_ERROR)
    if p >= end:
        raise _malformed("CONNECT ends before the protocol level")
    level = buf[p]
    expected = P.PROTOCOL_311 if name == b"MQTT" else P.PROTOCOL_31
    if level != expected:
        raise ProtocolError(f"CONNECT with protocol {name.decode()!r} level {level} "
                            f"(supported: level {expected})",
                            rule="MQTT-3.1.2-2", reason=UNSUPPORTED_PROTOCOL_VERSION)
    if p + 1 >= end:
        raise _malformed("CONNECT ends before the connect flags")
    flags = buf[p + 1]
    if flags & 0x01:
        raise _malformed("CONNECT with reserved connect flag bit 0 set", rule="MQTT-3.1.2-3")
    will_flag = flags & 0x04
    will_qos = flags >> 3 & 3
    will_retain = flags & 0x20
    if not will_flag:
        if will_qos:
            raise _malformed(f"CONNECT with will QoS {will_qos} but no will flag",
                             rule="MQTT-3.1.2-13")
        if will_retain:
            raise _malformed("CONNECT with will retain but no will flag", rule="MQTT-3.1.2-15")
    elif will_qos == 3:
        raise _malformed("CONNECT with will QoS 3", rule="MQTT-3.1.2-14")
    has_user = flags & 0x80
    has_password = flags & 0x40
    if has_password and not has_user:
        raise _malformed("CONNECT with password flag but no username flag",
                         rule="MQTT-3.1.2-22")
    keepalive = _read_u16(buf, p + 2, end, "CONNECT keep alive")
    p += 4
    client_id, p = _read_str(buf, p, end, "CONNECT client identifier")
    will = None
    if will_flag:
        will_topic, p = _read_str(buf, p, end, "CONNECT will topic")
        validate_topic_name(will_topic)
        will_payload, p = _read_binary(buf, p, end, "CONNECT will message")
        will = Will(will_topic, will_payload, will_qos, bool(will_retain))
    username = password = None
    if has_user:
        username, p = _read_str(buf, p, end, "CONNECT user name")
    if has_password:
        password, p = _read_binary(buf, p, end, "CONNECT password")
    _no_trailing(p, end, "CONNECT")
    return Connect(client_id, bool(flags & 0x02), keepalive, will, username, password,
                   level, name.decode("ascii"))


def _dec_connack(b0: int, buf: bytes, p: int, end: int) -> Connack:
    if end - p != 2:
        raise _malformed(f"CONNACK with remaining length {end - p} (must be 2)")
    ack_flags = buf[p]
    if ack_flags & 0xFE:
        raise _malformed(f"CONNACK with reserved acknowledge flag bits set ({ack_flags:#04x})",
                         rule="MQTT-3.2.2.1")
    return Connack(bool(ack_flags), buf[p + 1])


def _publish_topic_error(topic: str) -> ProtocolError:
    if not topic:
        return ProtocolError("PUBLISH with an empty topic name", rule="MQTT-4.7.3-1",
                             reason=TOPIC_NAME_INVALID)
    if "\x00" in topic:
        return _malformed("PUBLISH topic name contains U+0000", rule="MQTT-1.5.3-2")
    return ProtocolError(f"PUBLISH topic name {topic!r} contains a wildcard character",
                         rule="MQTT-3.3.2-2", reason=TOPIC_NAME_INVALID)


def _make_id_only_decoder(cls):
    name = P.NAMES[cls.type]

    def decode(b0: int, buf: bytes, p: int, end: int):
        if end - p != 2:
            raise _malformed(f"{name} with remaining length {end - p} (must be 2)")
        pid = buf[p] << 8 | buf[p + 1]
        if pid == 0:
            raise _malformed(f"{name} with packet identifier 0", rule="MQTT-2.3.1-1")
        return cls(pid)
    return decode


def _dec_subscribe(b0: int, buf: bytes, p: int, end: int) -> Subscribe:
    pid = _read_packet_id(buf, p, end, "SUBSCRIBE")
    p += 2
    if p == end:
        raise _malformed("SUBSCRIBE with no topic filters", rule="MQTT-3.8.3-3")
    topics = []
    while p < end:
        topic_filter, p = _read_str(buf, p, end, "SUBSCRIBE topic filter")
        validate_topic_filter(topic_filter)
        if p >= end:
            raise _malformed(f"SUBSCRIBE topic filter {topic_filter!r} has no requested QoS")
        qos = buf[p]
        p += 1
        if qos > 2:
            detail = "reserved bits set" if qos > 3 else "QoS 3"
            raise _malformed(f"SUBSCRIBE requested-QoS byte {qos:#04x} for {topic_filter!r}: "
                             f"{detail}", rule="MQTT-3-8.3-4")
        topics.append((topic_filter, qos))
    return Subscribe(pid, topics)


def _dec_suback(b0: int, buf: bytes, p: int, end: int) -> Suback:
    pid = _read_packet_id(buf, p, end, "SUBACK")
    codes = list(buf[p + 2:end])
    if not codes:
        raise _malformed("SUBACK with no return codes", rule="MQTT-3.9.3")
    for code in codes:
        if code not in _SUBACK_CODES:
            raise _malformed(f"SUBACK with reserved return code {code:#04x}",
                             rule="MQTT-3.9.3-2")
    return Suback(pid, codes)


def _dec_unsubscribe(b0: int, buf: bytes, p: int, end: int) -> Unsubscribe:
    pid = _read_packet_id(buf, p, end, "UNSUBSCRIBE")
    p += 2
    if p == end:
        raise _malformed("UNSUBSCRIBE with no topic filters", rule="MQTT-3.10.3-2")
    topics = []
    while p < end:
        topic_filter, p = _read_str(buf, p, end, "UNSUBSCRIBE topic filter")
        validate_topic_filter(topic_filter)
        topics.append(topic_filter)
    return Unsubscribe(pid, topics)


def _make_empty_decoder(cls):
    name = P.NAMES[cls.type]
    instance = cls()  # immutable and field-less: share one

    def decode(b0: int, buf: bytes, p: int, end: int):
        if end != p:
            raise _malformed(f"{name} with remaining length {end - p} (must be 0)")
        return instance
    return decode


# The 4-byte acknowledgements by their (valid) first byte, for Decoder.feed's shortcut.
_ACKS = {0x40: Puback, 0x50: Pubrec, 0x62: Pubrel, 0x70: Pubcomp, 0xB0: Unsuback}

# Indexed by packet type; PUBLISH (3) is decoded inline in Decoder._frames.
_DECODERS = [None] * 16
_DECODERS[P.CONNECT] = _dec_connect
_DECODERS[P.CONNACK] = _dec_connack
_DECODERS[P.SUBSCRIBE] = _dec_subscribe
_DECODERS[P.SUBACK] = _dec_suback
_DECODERS[P.UNSUBSCRIBE] = _dec_unsubscribe
for _cls in (Puback, Pubrec, Pubrel, Pubcomp, Unsuback):
    _DECODERS[_cls.type] = _make_id_only_decoder(_cls)
for _cls in (Pingreq, Pingresp, Disconnect):
    _DECODERS[_cls.type] = _make_empty_decoder(_cls)
del _cls


def _long_remaining_length(buf: bytes, pos: int, n: int) -> tuple[int, int] | None:
    """Remaining length starting at ``buf[pos+1]`` whose first byte has the continuation bit.

    Returns (remaining length, offset of the variable header), or None if incomplete.
    """
    value = 0
    shift = 0
    p = pos + 1
    while True:
        if p >= n:
            return None
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        if shift == 21:
            raise _malformed("remaining length has a continuation bit in its 4th byte",
                             rule="MQTT-2.2.3")
        shift += 7


# A PUBLISH of at least this many bytes whose end has not arrived yet is received into a
# payload buffer of its own (``Decoder.room``), which becomes the packet's payload. The
# buffer grows with what arrives (see Decoder._receive_large).
LARGE_FRAME = 16 * 1024
# After such a frame, read this little (``Decoder.read_hint``) so that the next large frame's
# payload, too, goes straight into its own buffer rather than through the shared one.
LARGE_READ = 4096
REPEAT_FRAMES = 16  # at most this many frames alike in one read (repeat_buffers)


class _Large:
    """A large PUBLISH being received: the packet, its payload buffer (so far) and size."""

    __slots__ = ("packet", "header", "got", "total")

    def __init__(self, packet: Publish, header: bytes, got: int, total: int):
        self.packet = packet   # packet.payload: a bytearray, filled up to ``got``
        self.header = header   # the bytes of the frame before the payload
        self.got = got
        self.total = total


class Decoder:
    """Incremental frame splitter and packet decoder for one connection (see module doc)."""

    __slots__ = ("max_packet_size", "_buf", "_need", "_error", "_gen", "_src", "_large",
                 "_ready", "room", "read_hint", "_shape", "_repeat")

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE):
        self.max_packet_size = max_packet_size
        self._buf = b""          # bytes not yet decoded (a bytearray while a frame is partial)
        self._need = 0           # don't try to decode before _buf holds this many bytes
        self._error: ProtocolError | None = None
        self._gen = None         # the generator of the last feed, maybe not exhausted
        self._src = None         # its input while it has not started
        self._large: _Large | None = None   # a large PUBLISH whose payload is arriving
        self._ready: Publish | None = None  # a completed large PUBLISH not handed out yet
        self.room: memoryview | None = None  # where the rest of that payload goes (recv_into)
        self.read_hint = 0       # bytes the next read should take (0: as many as it can)
        # The last large PUBLISH that arrived whole: its header (the frame's bytes before the
        # payload, without a packet identifier), payload size and, when the one before was
        # alike, what the next is expected to be: (header, topic, first byte, payload size),
        # or None (see repeat_buffers).
        self._shape: tuple | None = None
        self._repeat = 1         # frames repeat_buffers offers room for (see _repeat_filled)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out as packets (approximate while iterating)."""
        large = self._large
        return len(self._buf) + (len(large.header) + large.got if large is not None else 0)

    def feed(self, data):
        """Add ``data`` (bytes-like) and return a generator of the complete packets (a tuple
        when ``data`` is one acknowledgement and nothing else is buffered).

        The generator decodes from ``data`` itself: exhaust it, or close it after taking a
        packet, before ``data``'s buffer changes (closing keeps the untaken bytes). One that
        has not started holds ``data`` as it is until the next call."""
        if self._error is not None:
            raise self._error
        if (len(data) == 4 and self._gen is None and not self._buf and self._large is None
                and self._ready is None):
            # The commonest read of a QoS 1 subscriber: one PUBACK.
            ack = _ACKS.get(data[0])
            if ack is not None and data[1] == 2 and (data[2] or data[3]):
                self.read_hint = 0
                return (ack(data[2] << 8 | data[3]),)
        if self._gen is not None:
            self._retire()
        if self._large is not None:
            n = len(self.room)
            if len(data) < n:
                self._fill(data, len(data))
                return _NOTHING
            packet = self._fill(data, n)
            data = memoryview(data)[n:]
            if packet is None:  # the buffer grew: the rest of data goes on filling it
                return self.feed(data)
            self._ready = packet
        first = self._ready
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need and first is None:
                return _NOTHING
            data = buf
            self._buf = b""
        elif first is None and not data:
            return _NOTHING
        self._src = data
        self._gen = gen = self._frames(first, data)
        return gen

    def filled(self, n: int):
        """``n`` bytes were received into ``room``: what is now complete (the packet in a
        tuple, or nothing)."""
        if self._gen is not None:
            self._retire()
        packet = self._fill(None, n)
        if packet is None:
            return _NOTHING
        self._need = 0
        return (packet,)  # nothing follows it in the buffer: no generator needed

    def keep(self, data) -> None:
        """Hold ``data`` without decoding it (a halted consumer); the next ``feed`` decodes."""
        if self._gen is not None:
            self._retire()
        if self._large is not None:
            n = min(len(data), len(self.room))
            packet = self._fill(data, n)
            data = memoryview(data)[n:]
            if packet is None:
                if len(data):
                    self.keep(data)
                return
            self._ready = packet
        if len(data):
            if not self._buf:
                self._buf = bytearray()
            self._buf += data
            self._need = 0

    def _retire(self) -> None:
        """Close the last generator; what it did not hand out stays buffered."""
        gen = self._gen
        self._gen = None
        gen.close()  # a started generator keeps its untaken bytes in its finally
        src = self._src
        if src is not None:  # it never started: all of its input is still to decode
            self._src = None
            self.keep(src)

    def _fill(self, data, n: int) -> Publish | None:
        """Count ``n`` more payload bytes (copied from ``data`` unless already received into
        ``room``); the packet once its payload is complete."""
        room = self.room
        if data is not None:
            room[:n] = memoryview(data)[:n]
        large = self._large
        large.got += n
        if n < len(room):
            self.room = room[n:]
            return None
        room.release()
        self.room = None
        payload = large.packet.payload
        if large.got < large.total:  # grow the buffer (nothing else refers to it yet)
            payload += bytes(min(large.total, 2 * large.got) - large.got)
            self.room = memoryview(payload)[large.got:]
            return None
        self._large = None
        self.read_hint = LARGE_READ
        packet = large.packet
        header = large.header
        b0 = header[0]
        key = header[:-2] if b0 & 6 else header
        last = self._shape
        # Two alike in a row: the next is read as another (repeat_buffers).
        expect = ((header, packet.topic, b0, large.total)
                  if last is not None and last[0] == key and last[1] == large.total else None)
        self._shape = (key, large.total, expect)
        return packet

    def repeat_buffers(self, room: int = 0) -> list | None:
        """Between large PUBLISHes (``read_hint``): a header buffer and a payload buffer for
        one read (``recvmsg_into``) that expects the next frame to be like the last large one
        (same topic, flags and size: a device sending its readings), so that its payload
        arrives straight in a buffer of its own. None when there is no such frame yet.

        ``room``: bytes the read may take; pairs for as many such frames as reach it (the last
        may go past), but no more than ``_repeat_filled`` allows (at least one pair)."""
        shape = self._shape
        if (shape is None or shape[2] is None or self._buf or self._large is not None
                or self._ready is not None or self._gen is not None):
            return None
        want = shape[2]
        h = len(want[0])
        size = want[3]
        frames = min(self._repeat, -(-room // (h + size))) if room > 0 else 1
        parts = []
        for _ in range(frames):
            parts.append(bytearray(h))
            parts.append(bytearray(size))
        return parts

    def repeated(self, parts: list, n: int):
        """``n`` bytes were received into ``parts`` (from ``repeat_buffers``).

        One pair: the PUBLISH in a tuple when they start with the expected header and hold
        the whole payload; nothing when the rest of its payload is still to come (into
        ``room``); None when they are not that frame (``unexpected`` gives them back as plain
        bytes for ``feed``).

        More pairs: a generator of the packets, frame by frame; from the first bytes that are
        not the expected frame on, it decodes them as ``feed`` does. Closed early (a throttled
        client), it keeps what it did not hand out for the next ``feed``."""
        if len(parts) > 2:
            return self._repeated_many(parts, n)
        got = self._repeated_one(parts[0], parts[1], n)
        self._repeat_filled(0 if got is None or got is _NOTHING else 1, 1)
        return got

    def _repeated_many(self, parts: list, n: int):
        asked = len(parts) >> 1
        frames = i = 0
        try:
            while n > 0:
                head = parts[i]
                payload = parts[i + 1]
                m = min(n, len(head) + len(payload))
                got = self._repeated_one(head, payload, m)
                if got is None:
                    break
                n -= m
                i += 2
                if got is not _NOTHING:
                    frames += 1
                    yield got[0]
        except GeneratorExit:
            if n > 0:
                self.keep(self.unexpected(parts[i:], n))
            raise
        finally:
            self._repeat_filled(frames, asked)
        if n > 0:
            yield from self.feed(self.unexpected(parts[i:], n))

    def _repeat_filled(self, frames: int, asked: int) -> None:
        """A read into ``asked`` pairs filled ``frames`` of them: offer up to twice as many
        next time when all were (at most ``REPEAT_FRAMES``), else one more than were, so
        that few buffers go unused."""
        if frames < asked:
            self._repeat = frames + 1
        elif asked >= self._repeat:
            self._repeat = min(2 * asked, REPEAT_FRAMES)

    def _repeated_one(self, head, payload, n: int):
        shape = self._shape
        want, topic, b0, size = shape[2]
        h = len(want)
        pid = None
        if n >= h:
            if b0 & 6:
                # Only the packet identifier may differ; feed checks a zero one.
                pid = head[h - 2] << 8 | head[h - 1]
                same = pid != 0 and head[:h - 2] == want[:h - 2]
            else:
                same = head == want
            # (A maximum lowered by a reload below the frame's size: feed refuses it.)
            if same and h + size <= self.max_packet_size:
                packet = Publish(topic, payload, b0 >> 1 & 3, b0 & 1 == 1, b0 & 8 == 8, pid)
                got = n - h
                if got == size:
                    return (packet,)
                self._large = _Large(packet, want, got, size)
                self.room = memoryview(payload)[got:]
                return _NOTHING
        self._shape = (shape[0], shape[1], None)  # not until two alike again
        return None

    @staticmethod
    def unexpected(parts: list, n: int) -> bytes:
        """The ``n`` bytes received into ``parts`` that ``repeated`` did not take."""
        out = bytearray()
        for part in parts:
            if n <= 0:
                break
            out += part if n >= len(part) else memoryview(part)[:n]
            n -= len(part)
        return bytes(out)

    def _frames(self, first, src):
        # Decode from an immutable snapshot: slicing bytes gives bytes with one copy.
        # At rest the buffer is the shared b"", so an idle connection holds no buffer.
        self._src = None
        buf = bytes(src)
        n = len(buf)
        pos = 0
        need = 0
        max_size = self.max_packet_size
        first_byte_errors = _FIRST_BYTE_ERRORS
        decoders = _DECODERS
        publish = Publish
        try:
            if first is not None:
                self._ready = None
                yield first
            while pos < n:
                b0 = buf[pos]
                err = first_byte_errors[b0]
                if err is not None:
                    raise err
                if pos + 1 >= n:
                    break
                rl = buf[pos + 1]
                if rl < 0x80:
                    p = pos + 2
                else:
                    found = _long_remaining_length(buf, pos, n)
                    if found is None:
                        break
                    rl, p = found
                end = p + rl
                if end - pos > max_size:
                    raise ProtocolError(
                        f"{P.NAMES[b0 >> 4]} of {end - pos} bytes exceeds the maximum packet "
                        f"size {max_size}", rule="max_packet_size", reason=PACKET_TOO_LARGE)
                if end > n and (end - pos < LARGE_FRAME or b0 >> 4 != 3):
                    need = end - pos
                    break
                if b0 >> 4 == 3:  # PUBLISH, the hot path
                    te = p + 2
                    if te > end:
                        raise _malformed("PUBLISH ends inside the topic name length")
                    if te > n:  # a large frame's topic length has not arrived
                        need = te - pos
                        break
                    ts = te
                    te += buf[p] << 8 | buf[p + 1]
                    if te > end:
                        raise _malformed("PUBLISH topic name runs past the end of the packet")
                    if b0 & 6 and te + 2 > end:
                        raise _malformed("PUBLISH ends inside the packet identifier")
                    if te + (2 if b0 & 6 else 0) > n:  # nor the rest of its header
                        need = te + (2 if b0 & 6 else 0) - pos
                        break
                    try:
                        topic = buf[ts:te].decode()
                    except UnicodeDecodeError:
                        raise _malformed("PUBLISH topic name is not well-formed UTF-8",
                                         rule="MQTT-1.5.3-1") from None
                    if ts == te or "+" in topic or "#" in topic or "\x00" in topic:
                        raise _publish_topic_error(topic)
                    pid = None
                    if b0 & 6:
                        pid = buf[te] << 8 | buf[te + 1]
                        if pid == 0:
                            raise _malformed("PUBLISH with QoS > 0 and packet identifier 0",
                                             rule="MQTT-2.3.1-1")
                        te += 2
                    if end > n:  # large and incomplete: its payload goes to a buffer of its own
                        self._receive_large(publish(topic, None, b0 >> 1 & 3, b0 & 1 == 1,
                                                    b0 & 8 == 8, pid), buf, pos, te, n, end)
                        pos = n
                        break
                    if pid is None:
                        packet = publish(topic, buf[te:end], 0, b0 & 1 == 1)
                    else:
                        packet = publish(topic, buf[te:end], b0 >> 1 & 3, b0 & 1 == 1,
                                         b0 & 8 == 8, pid)
                else:
                    packet = decoders[b0 >> 4](b0, buf, p, end)
                pos = end
                yield packet
        except ProtocolError as exc:
            self._error = exc
            pos = n
            raise
        finally:
            if pos < n:
                self._buf = bytearray(memoryview(buf)[pos:])
            if n and self._large is None:
                self.read_hint = 0
            self._need = need
            self._gen = None  # a finished generator holds its frame (~400 bytes per connection)

    def _receive_large(self, packet: Publish, buf: bytes, pos: int, start: int, n: int,
                       end: int) -> None:
        """The frame at ``pos`` ends at ``end``, past the ``n`` bytes of ``buf`` (bytes); its
        payload starts at ``start``."""
        got = n - start
        total = end - start
        # Twice what has arrived, or as much as this connection's last large packet (which
        # arrived whole): a client that announces a large packet and sends little gets
        # little memory.
        last = self._shape[1] if self._shape is not None else 0
        payload = bytearray(min(total, max(2 * got, LARGE_READ, last)))
        payload[:got] = memoryview(buf)[start:n]
        packet.payload = payload
        self._large = _Large(packet, buf[pos:start], got, total)
        self.room = memoryview(payload)[got:]


_NOTHING = iter(())


def decode_one(data) -> object:
    """Decode exactly one complete frame; anything more or less is malformed."""
    decoder = Decoder()
    found = list(decoder.feed(data))
    if len(found) != 1 or decoder.buffered:
        if not found:
            raise _malformed("incomplete frame")
        raise _malformed("bytes after the first frame")
    return found[0]
