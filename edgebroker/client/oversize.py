"""A PUBLISH from the server over the client's ``max_packet_size``: read past, never held.

The decoder (mqtt/stream.py) refuses such a frame at its fixed header, before its body is
buffered, and stops. A client that closed the connection there would never get past it: the
server keeps the message (QoS 1/2) and sends it first again after each CONNACK, so nothing
behind it would ever arrive. So, once connected, ``Connection.receive_data`` hands the
frame's bytes to a ``Skipping`` in the decoder's place: it reads the topic (its first
``TOPIC_KEPT`` bytes), the packet identifier and QoS, lets the rest of the body go by as it
arrives (nothing of it is held), then gives out one packet, ``Skipped``, and a fresh decoder
takes the bytes that follow. ``incoming.on_skipped`` answers it as a message that can never be taken:
an ``Oversized`` event; acknowledged (PUBACK, PUBREC) as a message is, at once or by
``ack()`` with ``auto_ack=False``; a QoS 2 one given out once however often it comes.

Not skipped (the connection is closed, as for any protocol error): any other packet type,
one before the CONNACK, and over 5.0 a PUBLISH when the client accepts topic aliases (its
properties, which may set one, are not read).
"""

from __future__ import annotations

from edgebroker.errors import PACKET_TOO_LARGE, ProtocolError
from edgebroker.client.states import CONNECTED
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.decode import long_remaining_length, malformed
from edgebroker.mqtt.stream import Decoder

TOPIC_KEPT = 256        # bytes of a skipped PUBLISH's topic kept (for its event and logs)
SKIPPED = "skipped"     # the type of the packet a Skipping gives out (incoming.HANDLERS)


class Skipped:
    """What was read of an oversized PUBLISH."""
    __slots__ = ("type", "topic", "size", "qos", "retain", "dup", "packet_id")

    def __init__(self, topic, size, b0, packet_id):
        self.type = SKIPPED
        self.topic = topic
        self.size = size
        self.qos = b0 >> 1 & 3
        self.retain = b0 & 1 == 1
        self.dup = b0 & 8 == 8
        self.packet_id = packet_id


def start_skipping(conn, exc: ProtocolError):
    """After the decoder raised ``exc``: when it is an oversized PUBLISH that can be read past,
    put a ``Skipping`` in the decoder's place and return the bytes to feed it (the frame's
    body as it arrived so far, and what followed); else None."""
    frame = exc.frame
    if (frame is None or exc.reason != PACKET_TOO_LARGE or frame[0] >> 4 != P.PUBLISH
            or conn.state is not CONNECTED or conn._v5 and conn._alias_max):
        return None
    found = long_remaining_length(frame, 0, len(frame)) if frame[1] & 0x80 else (frame[1], 2)
    length, body = found
    conn._decoder = Skipping(conn, frame[0], body + length, length)
    return memoryview(frame)[body:]


class Skipping:
    """In the decoder's place while an oversized PUBLISH's body goes by (the module doc)."""
    __slots__ = ("conn", "b0", "size", "left", "at", "head", "topic_len", "pid")

    def __init__(self, conn, b0: int, size: int, body: int):
        self.conn = conn
        self.b0 = b0
        self.size = size        # the whole frame's
        self.left = body        # body bytes still to come
        self.at = 0             # body bytes gone by
        self.head = bytearray()  # the topic length and the topic's first TOPIC_KEPT bytes
        self.topic_len = None
        self.pid = bytearray()  # the packet identifier's bytes (QoS 1/2)

    def pubacks(self, data):
        return None

    def feed(self, data):
        """Take ``data``: nothing until the frame has gone by; then its ``Skipped`` and the
        packets of what followed it (a fresh decoder's)."""
        n = min(len(data), self.left)
        view = memoryview(data)
        i = 0
        while i < n:    # each turn takes the bytes up to the next part read (five a frame)
            at = self.at
            tl = self.topic_len
            if tl is None:
                end, into = 2, self.head
            else:
                kept = 2 + min(tl, TOPIC_KEPT)
                pid_at = 2 + tl
                if at < kept:
                    end, into = kept, self.head
                elif self.b0 & 6 and at < pid_at:
                    end, into = pid_at, None
                elif self.b0 & 6 and at < pid_at + 2:
                    end, into = pid_at + 2, self.pid
                else:
                    end, into = at + n - i, None
            take = min(end - at, n - i)
            if into is not None:
                into += view[i:i + take]
            i += take
            self.at = at + take
            if tl is None and self.at == 2:
                self.topic_len = self.head[0] << 8 | self.head[1]
        self.left -= n
        if self.left:
            return ()
        packet = self._packet()
        conn = self.conn
        conn._decoder = decoder = Decoder(conn._max_packet, P.PROTOCOL_5 if conn._v5 else 0,
                                          client=True)
        return _chain(packet, decoder.feed(view[n:]))

    def _packet(self) -> Skipped:
        tl = self.topic_len
        qos = self.b0 >> 1 & 3
        if tl is None or qos and len(self.pid) < 2:
            raise malformed(f"PUBLISH of {self.size} bytes ends inside its "
                            f"{'topic name length' if tl is None else 'packet identifier'}")
        pid = self.pid[0] << 8 | self.pid[1] if qos else None
        if pid == 0:
            raise malformed("PUBLISH with QoS > 0 and packet identifier 0", rule="MQTT-2.3.1-1")
        topic = bytes(self.head[2:]).decode("utf-8", "replace")
        if tl > TOPIC_KEPT:
            topic += "..."
        return Skipped(topic, self.size, self.b0, pid)


def _chain(first, rest):
    yield first
    yield from rest
