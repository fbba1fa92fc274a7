"""Large PUBLISH frames that repeat: a device sending its readings sends frames alike (same
topic, flags, properties and size), and after two such frames ``Decoder`` offers a read
buffers shaped like the next one (``repeat_buffers``), so that its payload arrives straight
in a buffer of its own, with no copy through the shared receive buffer (``repeated``).

``LargeFrame`` is a large PUBLISH whose payload is arriving; ``RepeatedFrames`` is the part of
``mqtt.stream.Decoder`` that offers and takes such reads.
"""

from __future__ import annotations

from edgebroker.mqtt.packets import Publish

REPEAT_FRAMES = 16  # at most this many frames alike in one read (repeat_buffers)
NOTHING = iter(())  # what a read that completed no packet hands out


class LargeFrame:
    """A large PUBLISH being received: the packet, its payload buffer (so far) and size."""

    __slots__ = ("packet", "header", "got", "total", "tail")

    def __init__(self, packet: Publish, header: bytes, got: int, total: int, tail: int = 0):
        self.packet = packet   # packet.payload: a bytearray, filled up to ``got``
        self.header = header   # the bytes of the frame before the payload
        self.got = got
        self.total = total
        self.tail = tail       # header bytes after the packet identifier (5.0: properties)


class RepeatedFrames:
    """``Decoder``'s reads of repeated large frames (a mixin over the decoder's state)."""

    __slots__ = ()

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
        self._repeat_filled(0 if got is None or got is NOTHING else 1, 1)
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
                if got is not NOTHING:
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
        want, topic, b0, size, tail, props = shape[2]
        h = len(want)
        pid = None
        if n >= h:
            if b0 & 6:
                # Only the packet identifier may differ; feed checks a zero one.
                at = h - 2 - tail
                pid = head[at] << 8 | head[at + 1]
                same = pid != 0 and head[:at] == want[:at] and head[at + 2:] == want[at + 2:]
            else:
                same = head == want
            # (A maximum lowered by a reload below the frame's size: feed refuses it.)
            if same and h + size <= self.max_packet_size:
                packet = Publish(topic, payload, b0 >> 1 & 3, b0 & 1 == 1, b0 & 8 == 8, pid,
                                 props)
                got = n - h
                if got == size:
                    return (packet,)
                self._large = LargeFrame(packet, want, got, size, tail)
                self.room = memoryview(payload)[got:]
                return NOTHING
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
