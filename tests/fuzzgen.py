"""Seeded fuzz inputs for a live broker (tests/server/test_fuzz.py, ``make fuzz``).

An input is one packet: a valid one built by the independent encoder (mqttraw) with random
fields, or one of those mutated (bit flips, truncation, a changed or overlong remaining
length, bytes inserted or overwritten, a reserved packet type or flag, packets spliced, a
field no valid packet has, or random bytes). ``Fuzzer.stream`` gives what one connection sends, pipelined: usually a CONNECT
(itself mutated now and then, or missing) and then packets, most of them valid so that the
broker gets past each one to the next, with mutations mixed in. ``websocket`` wraps such a
stream in a WebSocket upgrade and masked binary frames of random sizes (the upgrade or a
frame header mutated now and then). The same seed gives the same inputs.
"""

from __future__ import annotations

import base64
import random
import struct

import mqttraw as m

# Names from a small vocabulary (plus now and then random letters), so that topics and
# client ids repeat: takeovers, retained replacements, persistent sessions that come back.
LEVELS = ["a", "b", "sensor", "cmd", "temp", "dev1", "", "x" * 70, "\u00e9t\u00e9", "\u4e2d"]
CLIENT_IDS = [f"fz{i}" for i in range(40)] + ["\u00e9", "x" * 23]
# Fields no valid packet has (a mutation puts one in).
BAD_TOPICS = ["a\x00b", "#/a", "a/#/b", "a+", "+a", "", "\x01", "a\x7f", b"\xed\xa0\x80",
              b"\xff\xfe", b"a\xc0\xaf"]


class Fuzzer:
    def __init__(self, seed):
        self.rng = random.Random(seed)

    # -- valid packets ----------------------------------------------------------------------
    def topic(self, wildcards: bool) -> str:
        """A valid topic name, or (``wildcards``) a valid filter."""
        rng = self.rng
        n = rng.randrange(1, 5)
        levels = []
        for i in range(n):
            r = rng.random()
            if wildcards and r < 0.2:
                levels.append("+")
            elif wildcards and r < 0.3 and i == n - 1:
                levels.append("#")
            elif r < 0.95:
                levels.append(rng.choice(LEVELS))
            else:
                levels.append("".join(chr(rng.randrange(0x20, 0x7E)).replace("+", "p")
                                      .replace("#", "h") for _ in range(rng.randrange(1, 9))))
        if rng.random() < 0.03:
            levels[0] = "$SYS"
        topic = "/".join(levels)
        return topic or "t"

    def connect(self) -> bytes:
        rng = self.rng
        will = None
        if rng.random() < 0.2:
            will = (self.topic(False), rng.randbytes(rng.randrange(20)), rng.randrange(3),
                    rng.random() < 0.3)
        kw = {}
        if rng.random() < 0.1:
            kw = {"proto_name": b"MQIsdp", "level": 3}
        clean = rng.random() < 0.7
        username = rng.choice([None, None, "u", "\u00e9"])
        return m.connect(rng.choice(CLIENT_IDS) if not clean or rng.random() < 0.9 else "",
                         clean=clean, keepalive=rng.choice([0, 1, 5, 60, 65535]), will=will,
                         username=username,
                         password=None if username is None else rng.choice([None, b"p"]), **kw)

    def packet(self) -> bytes:
        """A valid packet after CONNECT (DISCONNECT rarely: it ends the connection)."""
        rng = self.rng
        pid = rng.randrange(1, 65536) if rng.random() < 0.9 else rng.choice([1, 2, 3])
        kind = rng.random()
        if kind < 0.5:
            qos = rng.randrange(3)
            # Retained messages small and few: each subscription to "#" gets them all.
            retain = rng.random() < 0.03
            size = rng.choice([0, 1, 10, 100] if retain else
                              [0, 1, 10, 100, 1000, rng.randrange(20_000)])
            return m.publish(self.topic(False), rng.randbytes(size), qos=qos, retain=retain,
                             dup=qos > 0 and rng.random() < 0.05, packet_id=pid if qos else None)
        if kind < 0.62:
            return m.subscribe(pid, [(self.topic(True), rng.randrange(3))
                                     for _ in range(rng.randrange(1, 4))])
        if kind < 0.7:
            return m.unsubscribe(pid, [self.topic(True) for _ in range(rng.randrange(1, 3))])
        if kind < 0.85:
            return rng.choice([m.puback, m.pubrec, m.pubrel, m.pubcomp])(pid)
        if kind < 0.995:
            return m.pingreq()
        return m.disconnect()

    def invalid(self) -> bytes:
        """A well-framed packet with a field no valid one has."""
        rng = self.rng
        bad = rng.choice(BAD_TOPICS)
        kind = rng.randrange(5)
        if kind == 0:
            return m.publish(bad, b"x", qos=rng.randrange(3), packet_id=rng.randrange(65536))
        if kind == 1:
            return m.subscribe(rng.randrange(65536), [(bad, rng.randrange(4))])
        if kind == 2:
            return m.unsubscribe(rng.randrange(65536), [bad])
        if kind == 3:
            return self.connect()                   # a second CONNECT
        return m.connect("c", will=(bad, b"w"), password=b"p")

    # -- mutations --------------------------------------------------------------------------
    def mutate(self, data: bytes) -> bytes:
        rng = self.rng
        b = bytearray(data)
        how = rng.randrange(10)
        if how == 0 and b:                                   # bit flips
            for _ in range(rng.randrange(1, 4)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif how == 1 and len(b) > 1:                        # truncated
            del b[rng.randrange(1, len(b)):]
        elif how == 2 and b:                                 # remaining length changed
            body = bytes(b[1:])
            rl, n = _read_varint(body)
            if n:
                new = rng.choice([0, 1, rl - 1, rl + 1, rl * 2, 127, 128, 16383, 16384,
                                  m.MAX_REMAINING_LENGTH, rng.randrange(1 << 16)])
                b = bytearray(b[:1] + m.varint(max(0, min(new, m.MAX_REMAINING_LENGTH)))
                              + body[n:])
        elif how == 3 and b:                                 # overlong or endless varint
            b = bytearray(b[:1] + bytes([0xFF] * rng.randrange(1, 6)) + b[2:])
        elif how == 4:                                       # bytes inserted
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randrange(1, 8))
        elif how == 5 and b:                                 # bytes overwritten
            i = rng.randrange(len(b))
            b[i:i + 4] = rng.randbytes(4)
        elif how == 6 and b:                                 # type or flags changed
            b[0] = rng.randrange(256)
        elif how == 7:                                       # two packets spliced
            other = self.packet()
            b = b[:rng.randrange(len(b) + 1)] + other[rng.randrange(len(other) + 1):]
        elif how == 8:                                       # a field no valid packet has
            b = bytearray(self.invalid())
        else:                                                # random bytes
            b = bytearray(rng.randbytes(rng.randrange(1, 64)))
        return bytes(b)

    # -- a connection's input ---------------------------------------------------------------
    def stream(self, mutation_rate: float = 0.1) -> list[bytes]:
        """The inputs one connection sends, in order: a CONNECT (now and then mutated or left
        out), then packets, each mutated with ``mutation_rate``, ending a few packets after
        the first mutated one (which often makes the broker close the connection) or after
        at most 300."""
        rng = self.rng
        out = []
        first = rng.random()
        if first < 0.85:
            out.append(self.connect())
        elif first < 0.95:
            out.append(self.mutate(self.connect()))
        end = 300
        for i in range(300):
            if i >= end:
                break
            p = self.packet()
            if rng.random() < mutation_rate:
                p = self.mutate(p)
                end = min(end, i + 1 + rng.randrange(4))
            out.append(p)
        return out

    def websocket(self, data: bytes, path: str = "/mqtt") -> bytes:
        """``data`` as a client sends it over WebSockets: the upgrade, then masked binary
        frames of random sizes; the upgrade or a frame header now and then mutated."""
        rng = self.rng
        key = base64.b64encode(rng.randbytes(16)).decode()
        head = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n").encode()
        if rng.random() < 0.05:
            head = self.mutate(head)
        out = [head]
        i = 0
        while i < len(data):
            n = rng.choice([1, 7, 100, 1000, 70_000])
            frame = _ws_frame(data[i:i + n], rng)
            if rng.random() < 0.02:
                frame = self.mutate(frame[:14]) + frame[14:]
            out.append(frame)
            i += n
        return b"".join(out)


def _read_varint(body: bytes) -> tuple[int, int]:
    """(value, bytes used) of the remaining length at the start of ``body``; n 0 if none."""
    value = shift = 0
    for n, byte in enumerate(body[:4], 1):
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, n
    return 0, 0


def _ws_frame(payload: bytes, rng: random.Random) -> bytes:
    """One masked binary frame (RFC 6455 5.2), FIN set."""
    n = len(payload)
    if n < 126:
        head = bytes([0x82, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x82, 0x80 | 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x82, 0x80 | 127]) + struct.pack("!Q", n)
    mask = rng.randbytes(4)
    key = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    return head + mask + masked
