"""A tiny MQTT 3.1.1 encoder and a minimal frame counter for the load generator.

Independent of ``edgebroker`` on purpose: the benchmark must not share a codec bug
with the broker it measures. Builders return the exact bytes of one packet; the
generator pre-encodes everything it sends before the clock starts.

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


def _str(b: bytes) -> bytes:
    return struct.pack("!H", len(b)) + b


def connect(client_id: str, keepalive: int = 60, clean: bool = True) -> bytes:
    body = (_str(b"MQTT") + bytes((4, 0x02 if clean else 0)) + struct.pack("!H", keepalive)
            + _str(client_id.encode()))
    return b"\x10" + varint(len(body)) + body


def subscribe(packet_id: int, topic_filter: str, qos: int) -> bytes:
    body = struct.pack("!H", packet_id) + _str(topic_filter.encode()) + bytes((qos,))
    return b"\x82" + varint(len(body)) + body


def suback(packet_id: int, code: int) -> bytes:
    return b"\x90\x03" + struct.pack("!HB", packet_id, code)


def puback(packet_id: int) -> bytes:
    return b"\x40\x02" + struct.pack("!H", packet_id)


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int | None = None,
            retain: bool = False) -> bytes:
    t = _str(topic.encode())
    pid = struct.pack("!H", packet_id) if qos else b""
    body_len = len(t) + len(pid) + len(payload)
    return bytes((0x30 | (qos << 1) | int(retain),)) + varint(body_len) + t + pid + payload


def publish_run(topic: str, payload: bytes, qos: int, n: int) -> tuple[bytes, int]:
    """``n`` consecutive PUBLISH frames (QoS 1: packet ids 1..n), all the same length.

    Returns (frames, frame_length); frame i starts at i * frame_length.
    """
    if qos == 0:
        frame = publish(topic, payload)
        return frame * n, len(frame)
    if not 1 <= n <= 65535:
        raise ValueError("QoS 1 runs hold 1..65535 packet ids")
    first = publish(topic, payload, qos, 1)
    flen = len(first)
    head = first[: flen - len(payload) - 2]
    frames = b"".join(head + struct.pack("!H", pid) + payload for pid in range(1, n + 1))
    assert len(frames) == flen * n
    return frames, flen


KEY = struct.Struct("!II")   # a keyed payload starts with (source, sequence number)


def publish_run_keyed(topic: str, payload_size: int, n: int, source: int) -> tuple[bytes, int]:
    """``n`` QoS 1 PUBLISH frames whose payloads (``payload_size`` bytes, at least 8) start
    with ``KEY`` (``source``, sequence number 0..n-1): a subscriber that reads the first 8 payload
    bytes as one big-endian 64-bit number (source << 32 | sequence) tells every message apart
    and counts duplicates. Packet ids run 1..65535 and wrap (a window below 65535 never holds
    one twice). Returns (frames, frame_length); frame i starts at i * frame_length."""
    if payload_size < KEY.size:
        raise ValueError(f"a keyed payload holds at least {KEY.size} bytes")
    pad = bytes(payload_size - KEY.size)
    first = publish(topic, bytes(payload_size), 1, 1)
    flen = len(first)
    head = first[: flen - payload_size - 2]
    pack = KEY.pack
    frames = b"".join(head + (i % 65535 + 1).to_bytes(2, "big") + pack(source, i) + pad
                      for i in range(n))
    assert len(frames) == flen * n
    return frames, flen


class FrameCounter:
    """Counts PUBLISH frames in one connection's byte stream.

    ``ack=True``: also queues a PUBACK (in ``acks``) for every QoS 1 PUBLISH.
    ``stamp_bytes=k``: appends the first ``k`` payload bytes of every PUBLISH to ``stamps``
    (the edge workload's send timestamp and message key; the consumer clears it).
    Other packets (CONNACK, SUBACK, ...) are kept in ``control`` as
    (type, body) — at most ``MAX_CONTROL`` of them.
    """

    MAX_CONTROL = 16
    SLOW_FRAMES = 64   # frames parsed one by one after the fast path failed

    def __init__(self, ack: bool = False, bufsize: int = 1 << 20, stamp_bytes: int = 0):
        self.buf = bytearray(bufsize)
        self.view = memoryview(self.buf)
        self.have = 0
        self.ack = ack
        self.acks = bytearray()
        self.stamp_bytes = stamp_bytes
        self.stamps = bytearray()
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
                if not self._slow and avail >= 3 * flen:
                    n = avail // flen
                    stop = pos + n * flen
                    ok = True
                    for k in range(hl + 2):     # fixed header + topic length
                        if buf[pos + k:stop:flen].count(buf[pos + k]) != n:
                            ok = False
                            break
                    if ok:
                        count += n
                        off = i + 2 + ((buf[i] << 8) | buf[i + 1])
                        if qos1 and self.ack:
                            acks = bytearray(4 * n)
                            acks[0::4] = b"\x40" * n
                            acks[1::4] = b"\x02" * n
                            acks[2::4] = buf[off:stop:flen]
                            acks[3::4] = buf[off + 1:stop:flen]
                            self.acks += acks
                        k = self.stamp_bytes
                        if k:
                            off += 2 if qos1 else 0
                            stamps = bytearray(k * n)
                            for j in range(k):
                                stamps[j::k] = buf[off + j:stop:flen]
                            self.stamps += stamps
                        pos = stop
                        continue
                    self._slow = self.SLOW_FRAMES
                elif self._slow:
                    self._slow -= 1
                count += 1
                off = i + 2 + ((buf[i] << 8) | buf[i + 1])
                if qos1 and self.ack:
                    self.acks += b"\x40\x02" + buf[off:off + 2]
                if self.stamp_bytes:
                    off += 2 if qos1 else 0
                    self.stamps += buf[off:off + self.stamp_bytes]
            elif len(self.control) < self.MAX_CONTROL:
                self.control.append((b0 >> 4, bytes(buf[i:pos + flen])))
            pos += flen
        rem = end - pos
        if pos and rem:
            buf[0:rem] = buf[pos:end]
        self.have = rem
        self.publishes += count


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
    print("wire self-check ok")


if __name__ == "__main__":
    _self_check()
