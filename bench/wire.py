"""A tiny MQTT 3.1.1 and 5.0 encoder and a minimal frame counter for the load generator.

Independent of ``edgebroker`` on purpose: the benchmark must not share a codec bug
with the broker it measures. Builders return the exact bytes of one packet; the
generator pre-encodes everything it sends before the clock starts.

MQTT 5.0 (``level=5``; OASIS MQTT Version 5.0, sections 2.2.2 and 3): CONNECT of protocol level
5 with a property section (empty, or a Session Expiry Interval for a session that outlives the
connection), SUBSCRIBE with a property section (empty, or a Subscription Identifier) and an
options byte per filter, PUBLISH with a property section (``props``: the encoded section, from
``properties``; ``None`` means 3.1.1, which has none). A 5.0 PUBACK with reason code 0 and no
properties may take the 3.1.1 form (the packet identifier alone, section 3.4.2.1), so the
acknowledgements the generator sends are the same bytes for both versions.

``FrameCounter`` parses only what counting needs: the fixed header and the
remaining length of each frame. When a run of frames has the same length and
the same header (the normal case in a benchmark stream), it checks the headers
of the whole run with strided slices and counts them in C instead of frame by
frame, and for QoS 1 it builds the PUBACKs of the whole run from the packet-id
bytes the same way. Anything irregular falls back to the frame-by-frame loop.
"""

from __future__ import annotations

import struct

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
SUBSCRIBE = 8
SUBACK = 9
PINGREQ = 12
PINGRESP = 13
DISCONNECT_BYTES = b"\xe0\x00"
CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
PINGREQ_BYTES = b"\xc0\x00"
PINGRESP_BYTES = b"\xd0\x00"
CONNACK5_ACCEPTED = b"\x20\x03\x00\x00\x00"   # flags, reason code 0, no properties

V311 = 4        # protocol levels of the CONNECT
V5 = 5

# MQTT 5.0 property identifiers (section 2.2.2.2) the generator sends or reads.
MESSAGE_EXPIRY = 0x02
CONTENT_TYPE = 0x03
SUBSCRIPTION_ID = 0x0B
SESSION_EXPIRY = 0x11
USER_PROPERTY = 0x26
NO_PROPERTIES = b"\x00"


def varint(n: int) -> bytes:
    """Remaining-length encoding: 7 bits per byte, high bit = more bytes follow."""
    if not 0 <= n <= 268_435_455:
        raise ValueError(f"remaining length out of range: {n}")
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(buf, pos: int, end: int) -> tuple[int, int] | None:
    """(value, position after it) of the variable byte integer at ``pos``; None when ``end``
    comes first. At most 4 bytes (sections 1.5.5 and 2.1.4)."""
    value = shift = 0
    while pos < end:
        d = buf[pos]
        pos += 1
        value |= (d & 0x7F) << shift
        if d < 0x80:
            return value, pos
        shift += 7
        if shift > 21:
            raise ValueError("malformed variable byte integer")
    return None


def _str(b: bytes) -> bytes:
    return struct.pack("!H", len(b)) + b


# ----- MQTT 5.0 properties: each one is its identifier, then its value (section 2.2.2.2) ------

def properties(*props: bytes) -> bytes:
    """A property section: its length (variable byte integer), then the properties."""
    body = b"".join(props)
    return varint(len(body)) + body


def prop_u32(ident: int, value: int) -> bytes:
    return bytes((ident,)) + struct.pack("!I", value)


def prop_varint(ident: int, value: int) -> bytes:
    return bytes((ident,)) + varint(value)


def prop_str(ident: int, value: str) -> bytes:
    return bytes((ident,)) + _str(value.encode())


def prop_pair(ident: int, key: str, value: str) -> bytes:
    """A UTF-8 string pair (User Property)."""
    return bytes((ident,)) + _str(key.encode()) + _str(value.encode())


# What run.py --properties makes the 5.0 clients send: (the property section of every PUBLISH,
# the Subscription Identifier of every SUBSCRIBE, 0 = none). "message": a Content Type and one
# User Property, forwarded to every subscriber as they are; "subid": a Subscription Identifier
# on each subscription, which the broker adds to every PUBLISH it sends for it (a part that
# differs per subscriber); "all": both.
_MESSAGE_PROPS = properties(prop_str(CONTENT_TYPE, "application/octet-stream"),
                            prop_pair(USER_PROPERTY, "source", "bench"))
FLAVOURS = {"none": (NO_PROPERTIES, 0), "message": (_MESSAGE_PROPS, 0),
            "subid": (NO_PROPERTIES, 1), "all": (_MESSAGE_PROPS, 1)}


# ----- packets ------------------------------------------------------------------------------------

def connect(client_id: str, keepalive: int = 60, clean: bool = True, level: int = V311,
            session_expiry: int = 0) -> bytes:
    """CONNECT. 5.0: ``clean`` is Clean Start, and ``session_expiry`` (seconds) the Session
    Expiry Interval (0: the session ends with the connection, like 3.1.1's clean session)."""
    head = _str(b"MQTT") + bytes((level, 0x02 if clean else 0)) + struct.pack("!H", keepalive)
    if level == V5:
        head += (properties(prop_u32(SESSION_EXPIRY, session_expiry)) if session_expiry
                 else NO_PROPERTIES)
    body = head + _str(client_id.encode())
    return b"\x10" + varint(len(body)) + body


def connack(level: int = V311) -> bytes:
    """A CONNACK accepting the connection (session not present; 5.0: no properties)."""
    return CONNACK5_ACCEPTED if level == V5 else CONNACK_ACCEPTED


def connack_code(body: bytes) -> tuple[int, bool]:
    """(return/reason code, session present) of a CONNACK's body; both versions keep them in
    the first two bytes (5.0's properties follow)."""
    if len(body) < 2:
        raise ConnectionError(f"CONNACK of {len(body)} bytes")
    return body[1], bool(body[0] & 1)


def split_frame(data) -> tuple[int, bytes, int] | None:
    """(first byte, body, length) of the frame ``data`` starts with; None while incomplete."""
    got = read_varint(data, 1, len(data))
    if got is None or got[1] + got[0] > len(data):
        return None
    end = got[1] + got[0]
    return data[0], bytes(data[got[1]:end]), end


def subscribe(packet_id: int, topic_filter: str, qos: int, level: int = V311,
              sub_id: int = 0) -> bytes:
    """SUBSCRIBE to one filter. 5.0: a property section (a Subscription Identifier when
    ``sub_id``), and the options byte (QoS only: No Local, Retain As Published and Retain
    Handling 0)."""
    props = b""
    if level == V5:
        props = properties(prop_varint(SUBSCRIPTION_ID, sub_id)) if sub_id else NO_PROPERTIES
    body = struct.pack("!H", packet_id) + props + _str(topic_filter.encode()) + bytes((qos,))
    return b"\x82" + varint(len(body)) + body


def suback(packet_id: int, code: int, level: int = V311) -> bytes:
    if level == V5:
        return b"\x90\x04" + struct.pack("!HBB", packet_id, 0, code)
    return b"\x90\x03" + struct.pack("!HB", packet_id, code)


def suback_codes(body: bytes, level: int = V311) -> bytes:
    """The return/reason codes of a SUBACK's body (0x80 and above: refused)."""
    if level == V5:
        got = read_varint(body, 2, len(body))
        if got is None:
            raise ValueError("SUBACK ends inside its property length")
        return bytes(body[got[1] + got[0]:])
    return bytes(body[2:])


def puback(packet_id: int) -> bytes:
    return b"\x40\x02" + struct.pack("!H", packet_id)


def publish_parts(topic: str, payload_len: int, qos: int = 0, retain: bool = False,
                  props: bytes | None = None) -> tuple[bytes, bytes]:
    """A PUBLISH frame without its packet identifier and payload: (everything before the
    packet identifier, everything between it and the payload: 5.0's property section).
    frame = first + packet id (QoS > 0) + second + payload."""
    t = _str(topic.encode())
    section = props if props is not None else b""
    body_len = len(t) + (2 if qos else 0) + len(section) + payload_len
    return bytes((0x30 | (qos << 1) | int(retain),)) + varint(body_len) + t, section


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int | None = None,
            retain: bool = False, props: bytes | None = None) -> bytes:
    """One PUBLISH; ``props``: 5.0's encoded property section (``properties``), None for
    3.1.1."""
    head, section = publish_parts(topic, len(payload), qos, retain, props)
    pid = struct.pack("!H", packet_id) if qos else b""
    return head + pid + section + payload


def publish_run(topic: str, payload: bytes, qos: int, n: int,
                props: bytes | None = None) -> tuple[bytes, int]:
    """``n`` consecutive PUBLISH frames (QoS 1: packet ids 1..n), all the same length.

    Returns (frames, frame_length); frame i starts at i * frame_length.
    """
    if qos == 0:
        frame = publish(topic, payload, props=props)
        return frame * n, len(frame)
    if not 1 <= n <= 65535:
        raise ValueError("QoS 1 runs hold 1..65535 packet ids")
    head, tail = publish_parts(topic, len(payload), qos, props=props)
    tail += payload
    flen = len(head) + 2 + len(tail)
    frames = b"".join(head + struct.pack("!H", pid) + tail for pid in range(1, n + 1))
    assert len(frames) == flen * n
    return frames, flen


KEY = struct.Struct("!II")   # a keyed payload starts with (source, sequence number)


def publish_run_keyed(topic: str, payload_size: int, n: int, source: int,
                      props: bytes | None = None) -> tuple[bytes, int]:
    """``n`` QoS 1 PUBLISH frames whose payloads (``payload_size`` bytes, at least 8) start
    with ``KEY`` (``source``, sequence number 0..n-1): a subscriber that reads the first 8 payload
    bytes as one big-endian 64-bit number (source << 32 | sequence) tells every message apart
    and counts duplicates. Packet ids run 1..65535 and wrap (a window below 65535 never holds
    one twice). Returns (frames, frame_length); frame i starts at i * frame_length."""
    if payload_size < KEY.size:
        raise ValueError(f"a keyed payload holds at least {KEY.size} bytes")
    pad = bytes(payload_size - KEY.size)
    head, section = publish_parts(topic, payload_size, 1, props=props)
    flen = len(head) + 2 + len(section) + payload_size
    pack = KEY.pack
    frames = b"".join(head + (i % 65535 + 1).to_bytes(2, "big") + section + pack(source, i) + pad
                      for i in range(n))
    assert len(frames) == flen * n
    return frames, flen


class FrameCounter:
    """Counts PUBLISH frames in one connection's byte stream.

    ``ack=True``: also queues a PUBACK (in ``acks``) for every QoS 1 PUBLISH.
    ``stamp_bytes=k``: appends the first ``k`` payload bytes of every PUBLISH to ``stamps``
    (the edge workload's send timestamp and message key; the consumer clears it).
    ``level=5``: the stream is MQTT 5.0's: a PUBLISH has a property section between its packet
    identifier and its payload (whatever it holds: forwarded properties, Subscription
    Identifiers, the Message Expiry Interval left), skipped by its length to find the payload.
    A run of frames goes through the strided fast path when their property sections have the
    same length too.
    Other packets (CONNACK, SUBACK, ...) are kept in ``control`` as
    (type, body) — at most ``MAX_CONTROL`` of them.
    """

    MAX_CONTROL = 16
    SLOW_FRAMES = 64   # frames parsed one by one after the fast path failed

    def __init__(self, ack: bool = False, bufsize: int = 1 << 20, stamp_bytes: int = 0,
                 level: int = V311):
        self.buf = bytearray(bufsize)
        self.view = memoryview(self.buf)
        self.have = 0
        self.ack = ack
        self.acks = bytearray()
        self.stamp_bytes = stamp_bytes
        self.stamps = bytearray()
        self.v5 = level == V5
        self.publishes = 0
        self.control: list[tuple[int, bytes]] = []
        self._slow = 0

    def recv_from(self, sock, flags: int = 0) -> int:
        """One ``recv_into``; returns the byte count (0 = end of stream)."""
        if self.have >= len(self.buf):
            raise ValueError("frame larger than the counter's buffer")
        n = sock.recv_into(self.view[self.have:], 0, flags)
        if n:
            self.feed_end(self.have + n)
        return n

    def feed(self, data) -> None:
        """Append bytes (used by tests and by the self-check)."""
        n = len(data)
        self.buf[self.have:self.have + n] = data
        self.feed_end(self.have + n)

    def feed_end(self, end: int) -> None:
        buf = self.buf
        v5 = self.v5
        pos = 0
        count = 0
        while True:
            avail = end - pos
            if avail < 2:
                break
            b0 = buf[pos]
            i = pos + 1
            rl = 0
            shift = 0
            while True:
                if i >= end:
                    rl = -1
                    break
                d = buf[i]
                i += 1
                rl |= (d & 0x7F) << shift
                if d < 0x80:
                    break
                shift += 7
                if shift > 21:
                    raise ValueError("malformed remaining length")
            if rl < 0:
                break
            hl = i - pos
            flen = hl + rl
            if flen > avail:
                break
            if b0 >> 4 == PUBLISH:
                qos1 = (b0 & 0x06) == 0x02
                off = i + 2 + ((buf[i] << 8) | buf[i + 1])   # the packet id, or the payload
                data = off + 2 if qos1 else off              # 3.1.1: the payload
                plen_at = data
                if v5:
                    got = read_varint(buf, data, pos + flen)
                    if got is None:
                        raise ValueError("PUBLISH ends inside its property length")
                    data = got[1] + got[0]
                    if data > pos + flen:
                        raise ValueError("PUBLISH properties run past the end of the frame")
                if not self._slow and avail >= 3 * flen:
                    n = avail // flen
                    stop = pos + n * flen
                    # Alike: the fixed header, the topic length and (5.0) the property length.
                    checks = list(range(pos, i + 2))
                    if v5:
                        checks += range(plen_at, got[1])
                    ok = True
                    for k in checks:
                        if buf[k:stop:flen].count(buf[k]) != n:
                            ok = False
                            break
                    if ok:
                        count += n
                        if qos1 and self.ack:
                            acks = bytearray(4 * n)
                            acks[0::4] = b"\x40" * n
                            acks[1::4] = b"\x02" * n
                            acks[2::4] = buf[off:stop:flen]
                            acks[3::4] = buf[off + 1:stop:flen]
                            self.acks += acks
                        k = self.stamp_bytes
                        if k:
                            stamps = bytearray(k * n)
                            for j in range(k):
                                stamps[j::k] = buf[data + j:stop:flen]
                            self.stamps += stamps
                        pos = stop
                        continue
                    self._slow = self.SLOW_FRAMES
                elif self._slow:
                    self._slow -= 1
                count += 1
                if qos1 and self.ack:
                    self.acks += b"\x40\x02" + buf[off:off + 2]
                if self.stamp_bytes:
                    self.stamps += buf[data:data + self.stamp_bytes]
            elif len(self.control) < self.MAX_CONTROL:
                self.control.append((b0 >> 4, bytes(buf[i:pos + flen])))
            pos += flen
        rem = end - pos
        if pos and rem:
            buf[0:rem] = buf[pos:end]
        self.have = rem
        self.publishes += count


def acks_in(data: bytes) -> tuple[int, bytes]:
    """(PUBACKs in ``data``, the bytes of an incomplete last frame) for a publisher that gets
    nothing but PUBACKs. The 4-byte form of both versions is counted with strided slices; a
    5.0 PUBACK with a reason code (and properties) frame by frame. A reason code of 0x80 or
    above (the broker refused the message), or any other packet, raises ``ConnectionError``."""
    n = len(data) >> 2
    if data[0:4 * n:4].count(0x40) == n and data[1:4 * n:4].count(0x02) == n:
        return n, data[4 * n:]
    count = pos = 0
    end = len(data)
    while pos + 2 <= end:
        got = read_varint(data, pos + 1, end)
        if got is None:
            break
        rl, body = got
        if body + rl > end:
            break
        if data[pos] != 0x40 or rl < 2:
            raise ConnectionError(f"expected only PUBACKs from the broker, got "
                                  f"{bytes(data[pos:pos + 16])!r}")
        if rl > 2 and data[body + 2] >= 0x80:
            raise ConnectionError(f"PUBACK with reason code {data[body + 2]:#04x} (refused)")
        count += 1
        pos = body + rl
    return count, data[pos:]


def _self_check() -> None:
    """Cheap consistency check of the counter (run with ``python3 bench/wire.py``)."""
    import random
    rnd = random.Random(1)
    frames, flen = publish_run("bench/1", b"x" * 64, 1, 5000)
    stream = (CONNACK_ACCEPTED + suback(1, 1) + frames + publish("a/b", b"y" * 300)
              + frames[: 1000 * flen] + publish("bench/0", b"z" * 70000))
    for _ in range(20):
        c = FrameCounter(ack=True)
        pos = 0
        while pos < len(stream):
            step = rnd.choice((1, 3, 100, 4096, 65536, 300000))
            c.feed(stream[pos:pos + step])
            pos += step
        assert c.publishes == 6002, c.publishes
        assert [t for t, _ in c.control] == [CONNACK, SUBACK]
        pids = [int.from_bytes(c.acks[k + 2:k + 4], "big") for k in range(0, len(c.acks), 4)]
        assert pids == list(range(1, 5001)) + list(range(1, 1001)), len(pids)
        assert c.acks[0::4].count(0x40) == len(pids)
    # Payload prefixes, through the strided fast path and the frame-by-frame one.
    stamped = b"".join(publish(f"d/{i % 7:05d}/t", i.to_bytes(8, "big") + b"p" * 20, 1, i + 1)
                       for i in range(3000))
    for _ in range(5):
        c = FrameCounter(ack=True, stamp_bytes=8)
        pos = 0
        while pos < len(stamped):
            step = rnd.choice((1, 7, 500, 4096, 65536))
            c.feed(stamped[pos:pos + step])
            pos += step
        assert [int.from_bytes(c.stamps[k:k + 8], "big") for k in range(0, len(c.stamps), 8)] \
            == list(range(3000))
    # Keyed runs: the keys come back through the counter's payload prefixes, packet ids wrap.
    keyed, flen = publish_run_keyed("bench/2", 64, 70000, 2)
    c = FrameCounter(ack=True, stamp_bytes=KEY.size)
    for pos in range(0, len(keyed), 300000):
        c.feed(keyed[pos:pos + 300000])
    assert c.publishes == 70000
    assert [KEY.unpack_from(c.stamps, k) for k in (0, 8 * 65535, 8 * 69999)] \
        == [(2, 0), (2, 65535), (2, 69999)]
    assert [int.from_bytes(c.acks[k + 2:k + 4], "big") for k in (0, 4 * 65534, 4 * 65535)] \
        == [1, 65535, 1]
    # MQTT 5.0: property sections of several lengths (the forwarded properties; Subscription
    # Identifiers of one and two bytes; an expiry), skipped to find the payload prefixes.
    sections = [NO_PROPERTIES, FLAVOURS["message"][0],
                properties(prop_varint(SUBSCRIPTION_ID, 1)),
                properties(prop_u32(MESSAGE_EXPIRY, 60), prop_varint(SUBSCRIPTION_ID, 300))]
    stream5 = CONNACK5_ACCEPTED + suback(1, 1, V5)
    want = []
    for j, section in enumerate(sections):
        run, _ = publish_run_keyed("bench/1", 64, 2000, j, section)
        stream5 += run + publish("bench/22", KEY.pack(9, j) + b"q" * 30, 0, props=section)
        want += [(j, i) for i in range(2000)] + [(9, j)]
    for _ in range(10):
        c = FrameCounter(ack=True, stamp_bytes=KEY.size, level=V5)
        pos = 0
        while pos < len(stream5):
            step = rnd.choice((1, 5, 333, 4096, 65536))
            c.feed(stream5[pos:pos + step])
            pos += step
        assert c.publishes == len(want), c.publishes
        assert [KEY.unpack_from(c.stamps, k) for k in range(0, len(c.stamps), 8)] == want
        assert len(c.acks) == 4 * 2000 * len(sections)
        assert [t for t, _ in c.control] == [CONNACK, SUBACK]
        assert suback_codes(c.control[1][1], V5) == b"\x01"
    # PUBACKs as publishers get them: the short form, and 5.0's with a reason code.
    assert acks_in(puback(1) * 3 + b"\x40") == (3, b"\x40")
    assert acks_in(puback(1) + b"\x40\x03\x00\x02\x10" + puback(3) + b"\x40\x03") \
        == (3, b"\x40\x03")
    for bad in (b"\x40\x03\x00\x02\x87", b"\x20\x02\x00\x00"):
        try:
            acks_in(bad)
        except ConnectionError:
            pass
        else:
            raise AssertionError(f"acks_in took {bad!r}")
    print("wire self-check ok")


if __name__ == "__main__":
    _self_check()
