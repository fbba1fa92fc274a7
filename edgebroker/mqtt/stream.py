"""A connection's incoming bytes -> MQTT packets (3.1, 3.1.1 and 5.0), with no I/O.

``Decoder.feed(data)`` takes any split of the incoming byte stream and returns
a generator of the complete packets found so far, in order.

Decoder rules (the broker relies on these):

* Unconsumed bytes stay inside the decoder; each ``feed`` appends to them.
* A frame is checked against ``max_packet_size`` (whole frame: fixed header
  plus remaining length) as soon as its remaining-length field is complete,
  before its body is buffered. The first byte (type and flags) is checked as
  soon as it arrives. The consumer may change ``max_packet_size`` while it handles a
  CONNECT (a server reads less before one): the frames after it are checked against
  the new value.
* A violation raises ``ProtocolError`` when the generator reaches the bad frame;
  the frames before it have already been yielded. The decoder is then dead:
  every later ``feed`` raises the same error. A frame over ``max_packet_size`` gives the
  error its bytes from the frame's first one (``frame``: the fixed header is whole), so
  that a client may read past it with a decoder of its own (client/oversize.py).
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
* The version: a server's decoder reads 3.1.1 rules until it hands out a CONNECT of
  level 5, and 5.0 rules from the next frame on (``protocol``); a client's decoder is made
  with the version it asked for, and ``client=True``: a 5.0 PUBACK or PUBREC with a reason code
  of 0x80 or more that the specification does not list for it is taken as a refusal, not a
  protocol error (mqtt/decode5.py's ``DECODERS5_CLIENT``). A 5.0 PUBLISH carries its
  properties (a dict that the packets of a repeated large frame share, and PUBLISHes whose
  property section is the same bytes as the last one decoded, on any connection: consumers
  do not change a packet's properties).

Every rule violation names the specification's conformance id in ``rule``
(section numbers such as ``MQTT-2.2.3`` where the spec has no numbered rule).
"""

from __future__ import annotations

import sys
from array import array

from edgebroker.errors import PACKET_TOO_LARGE, ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.decode import (
    ACKS, DECODERS, FIRST_BYTE_ERRORS, long_remaining_length, malformed, publish_topic_error,
)
from edgebroker.mqtt.decode5 import DECODERS5, DECODERS5_CLIENT, FIRST_BYTE_ERRORS5
from edgebroker.mqtt.fields import protocol_error, read_varint
from edgebroker.mqtt.packets import MAX_PACKET_SIZE, PROTOCOL_5, PUBLISH, Publish
from edgebroker.mqtt.properties import TOPIC_ALIAS, decode_properties
from edgebroker.mqtt.repeat import NOTHING, LargeFrame, RepeatedFrames

# A PUBLISH of at least this many bytes whose end has not arrived yet is received into a
# payload buffer of its own (``Decoder.room``), which becomes the packet's payload. The
# buffer grows with what arrives (see Decoder._receive_large).
LARGE_FRAME = 16 * 1024
# After such a frame, read this little (``Decoder.read_hint``) so that the next large frame's
# payload, too, goes straight into its own buffer rather than through the shared one.
LARGE_READ = 4096
# The 4-byte acknowledgements of 5.0 (an UNSUBACK there has properties and reason codes).
ACKS5 = {b0: cls for b0, cls in ACKS.items() if b0 != 0xB0}
_LITTLE = sys.byteorder == "little"


class Decoder(RepeatedFrames):
    """Incremental frame splitter and packet decoder for one connection (see module doc)."""

    __slots__ = ("max_packet_size", "_buf", "_need", "_gen", "_src", "_large", "_ready",
                 "room", "read_hint", "_shape", "_repeat", "protocol", "_decoders5")

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE, protocol: int = 0,
                 client: bool = False):
        self.max_packet_size = max_packet_size
        self.protocol = protocol  # 5 once 5.0 rules apply (see the module doc); else 0
        self._decoders5 = DECODERS5_CLIENT if client else DECODERS5
        self._buf = b""          # bytes not yet decoded (a bytearray while a frame is partial)
        self._need = 0           # don't try to decode before _buf holds this many bytes
        self._gen = None         # the generator of the last feed, maybe not exhausted
        self._src = None         # its input while it has not started
        self._large: LargeFrame | None = None   # a large PUBLISH whose payload is arriving
        # A completed large PUBLISH not handed out yet; or, once a violation was found, its
        # ProtocolError, which every later feed raises again.
        self._ready: Publish | ProtocolError | None = None
        self.room: memoryview | None = None  # where the rest of that payload goes (recv_into)
        self.read_hint = 0       # bytes the next read should take (0: as many as it can)
        # The last large PUBLISH that arrived whole: its header (the frame's bytes before the
        # payload, without a packet identifier), payload size and, when the one before was
        # alike, what the next is expected to be: (header, topic, first byte, payload size,
        # header bytes after the packet identifier, properties), or None (repeat_buffers).
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
        ready = self._ready
        if ready is not None and isinstance(ready, ProtocolError):
            raise ready
        if (len(data) == 4 and self._gen is None and not self._buf and self._large is None
                and self._ready is None):
            # The commonest read of a QoS 1 subscriber: one PUBACK.
            ack = (ACKS5 if self.protocol else ACKS).get(data[0])
            if ack is not None and data[1] == 2 and (data[2] or data[3]):
                self.read_hint = 0
                return (ack(data[2] << 8 | data[3]),)
        if self._gen is not None:
            self._retire()
        if self._large is not None:
            n = len(self.room)
            if len(data) < n:
                self._fill(data, len(data))
                return NOTHING
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
                return NOTHING
            data = buf
            self._buf = b""
        elif first is None and not data:
            return NOTHING
        self._src = data
        self._gen = gen = self._frames(first, data)
        return gen

    def pubacks(self, data):
        """The packet identifiers of ``data`` when it is two or more whole PUBACKs and nothing
        else (a QoS 1 subscriber acknowledging what one read brought), with nothing buffered:
        an ``array('H')``, in order. None otherwise (``feed`` decodes it, and finds any
        violation)."""
        n = len(data)
        if (n < 8 or n & 3 or self._gen is not None or self._buf or self._large is not None
                or self._ready is not None):
            return None
        raw = bytes(data)
        k = n >> 2
        if raw[0::4] != b"\x40" * k or raw[1::4] != b"\x02" * k:
            return None
        pids = array("H", raw)[1::2]
        if _LITTLE:
            pids.byteswap()
        if 0 in pids:
            return None         # a violation (MQTT-2.3.1-1): feed reports it
        self.read_hint = 0
        return pids

    def filled(self, n: int):
        """``n`` bytes were received into ``room``: what is now complete (the packet in a
        tuple, or nothing)."""
        if self._gen is not None:
            self._retire()
        packet = self._fill(None, n)
        if packet is None:
            return NOTHING
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
        tail = large.tail
        at = len(header) - 2 - tail  # where its packet identifier is
        key = header[:at] + header[at + 2:] if b0 & 6 else header
        last = self._shape
        # Two alike in a row: the next is read as another (repeat_buffers).
        expect = ((header, packet.topic, b0, large.total, tail, packet.properties)
                  if last is not None and last[0] == key and last[1] == large.total else None)
        self._shape = (key, large.total, expect)
        return packet

    def _frames(self, first, src):
        # Decode from an immutable snapshot: slicing bytes gives bytes with one copy.
        # At rest the buffer is the shared b"", so an idle connection holds no buffer.
        self._src = None
        buf = bytes(src)
        n = len(buf)
        pos = 0
        need = 0
        max_size = self.max_packet_size
        v5 = self.protocol == PROTOCOL_5
        first_byte_errors = FIRST_BYTE_ERRORS5 if v5 else FIRST_BYTE_ERRORS
        decoders = self._decoders5 if v5 else DECODERS
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
                    found = long_remaining_length(buf, pos, n)
                    if found is None:
                        break
                    rl, p = found
                end = p + rl
                if end - pos > max_size:
                    exc = ProtocolError(
                        f"{P.NAMES[b0 >> 4]} of {end - pos} bytes exceeds the maximum packet "
                        f"size {max_size}", rule="max_packet_size", reason=PACKET_TOO_LARGE)
                    exc.frame = buf[pos:]
                    raise exc
                if end > n and (end - pos < LARGE_FRAME or b0 >> 4 != 3):
                    need = end - pos
                    break
                if b0 >> 4 == 3:  # PUBLISH, the hot path
                    te = p + 2
                    if te > end:
                        raise malformed("PUBLISH ends inside the topic name length")
                    if te > n:  # a large frame's topic length has not arrived
                        need = te - pos
                        break
                    ts = te
                    te += buf[p] << 8 | buf[p + 1]
                    if te > end:
                        raise malformed("PUBLISH topic name runs past the end of the packet")
                    if b0 & 6 and te + 2 > end:
                        raise malformed("PUBLISH ends inside the packet identifier")
                    if te + (2 if b0 & 6 else 0) > n:  # nor the rest of its header
                        need = te + (2 if b0 & 6 else 0) - pos
                        break
                    try:
                        topic = buf[ts:te].decode()
                    except UnicodeDecodeError:
                        raise malformed("PUBLISH topic name is not well-formed UTF-8",
                                         rule="MQTT-1.5.3-1") from None
                    if ts == te and not v5 or "+" in topic or "#" in topic or "\x00" in topic:
                        raise publish_topic_error(topic)
                    pid = None
                    if b0 & 6:
                        pid = buf[te] << 8 | buf[te + 1]
                        if pid == 0:
                            raise malformed("PUBLISH with QoS > 0 and packet identifier 0",
                                             rule="MQTT-2.3.1-1")
                        te += 2
                    props = None
                    tail = 0
                    if v5:
                        if end > n:  # a large frame: its properties must have arrived
                            q = _properties_end(buf, te, n, end)
                            if n < q <= end:  # (past the end: decode_properties refuses it)
                                need = q - pos
                                break
                        if te < end and buf[te] == 0:  # no properties: the usual case
                            q = te + 1
                        else:
                            props, q = _publish_properties(buf, te, end)
                        if not topic and (props is None or TOPIC_ALIAS not in props):
                            raise protocol_error("PUBLISH with an empty topic name and no "
                                                 "Topic Alias", "MQTT-3.3.2.3.4")
                        tail = q - te
                        te = q
                    if end > n:  # large and incomplete: its payload goes to a buffer of its own
                        self._receive_large(publish(topic, None, b0 >> 1 & 3, b0 & 1 == 1,
                                                    b0 & 8 == 8, pid, props),
                                            buf, pos, te, n, end, tail)
                        pos = n
                        break
                    if props is not None:
                        packet = publish(topic, buf[te:end], b0 >> 1 & 3, b0 & 1 == 1,
                                         b0 & 8 == 8, pid, props)
                    elif pid is None:
                        packet = publish(topic, buf[te:end], 0, b0 & 1 == 1)
                    else:
                        packet = publish(topic, buf[te:end], b0 >> 1 & 3, b0 & 1 == 1,
                                         b0 & 8 == 8, pid)
                else:
                    packet = decoders[b0 >> 4](b0, buf, p, end)
                    if b0 == 0x10:
                        if packet.protocol_level == PROTOCOL_5 and not v5:
                            # From the next frame on, 5.0 rules.
                            self.protocol = PROTOCOL_5
                            v5 = True
                            first_byte_errors = FIRST_BYTE_ERRORS5
                            decoders = self._decoders5
                        pos = end
                        yield packet
                        # Its handler may have raised the size limit (``max_packet_size``).
                        max_size = self.max_packet_size
                        continue
                pos = end
                yield packet
        except ProtocolError as exc:
            self._ready = exc   # the decoder stops here: every later feed raises it
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
                       end: int, tail: int = 0) -> None:
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
        self._large = LargeFrame(packet, buf[pos:start], got, total, tail)
        self.room = memoryview(payload)[got:]


# The last PUBLISH property section decoded (its bytes, length included) and its properties:
# a device sends the same Content Type and User Properties with every message, and decoding
# them (each string checked) costs more than the rest of the PUBLISH. Sections shorter than
# 128 bytes (a 1-byte length) are remembered.
_last_properties: tuple = (b"", None)


def _publish_properties(buf: bytes, p: int, end: int) -> tuple[dict | None, int]:
    """``decode_properties`` of a PUBLISH's property section at ``p``; the last one's
    properties when the section is the same bytes (decoding is a function of them)."""
    global _last_properties
    if p >= end:
        return decode_properties(buf, p, end, PUBLISH)     # (it says what is wrong)
    length = buf[p]
    q = p + 1 + length
    last = _last_properties
    if length < 0x80 and q <= end and buf[p:q] == last[0]:
        return last[1], q
    props, q = decode_properties(buf, p, end, PUBLISH)
    if length < 0x80:
        _last_properties = (buf[p:q], props)
    return props, q


def _properties_end(buf: bytes, p: int, n: int, end: int) -> int:
    """Where the property section at ``p`` of a frame ending at ``end`` ends, when ``buf``
    holds ``n`` bytes so far: past ``n`` when more must arrive first (at least ``n + 1``);
    ``p`` when what has arrived is already wrong (the decoding says what)."""
    try:
        length, q = read_varint(buf, p, min(n, end), "PUBLISH properties length")
    except ProtocolError:
        return p if n >= end or n - p >= 4 else n + 1
    return q + length


def decode_one(data, protocol: int = 0) -> object:
    """Decode exactly one complete frame (5.0 rules with ``protocol`` 5); anything more or
    less is malformed."""
    decoder = Decoder(protocol=protocol)
    found = list(decoder.feed(data))
    if len(found) != 1 or decoder.buffered:
        if not found:
            raise malformed("incomplete frame")
        raise malformed("bytes after the first frame")
    return found[0]
