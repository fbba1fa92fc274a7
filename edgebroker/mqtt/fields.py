"""The field readers every MQTT decoder shares (3.1.1 and 5.0): two-byte integers, length
prefixed binary data and UTF-8 strings, packet identifiers, variable byte integers, and the
errors they raise. Each takes the frame's bytes, a position and the end of the packet, and
returns the value and the position after it; a field running past the end is malformed.
"""

from __future__ import annotations

import re

from edgebroker.errors import MALFORMED_PACKET, PROTOCOL_ERROR, ProtocolError


def malformed(message: str, rule: str = "MQTT-2.2.3") -> ProtocolError:
    return ProtocolError(message, rule=rule, reason=MALFORMED_PACKET)


def read_u16(buf: bytes, p: int, end: int, what: str, before: str = "", after: str = "") -> int:
    # The field's name is put together only for the error message.
    if p + 2 > end:
        raise malformed(f"{before}{what}{after} runs past the end of the packet")
    return buf[p] << 8 | buf[p + 1]


def read_binary(buf: bytes, p: int, end: int, what: str) -> tuple[bytes, int]:
    n = read_u16(buf, p, end, what, before="length of ")
    q = p + 2 + n
    if q > end:
        raise malformed(f"{what} ({n} bytes) runs past the end of the packet")
    return buf[p + 2:q], q


# Code points a string should not hold (section 1.5.3; a receiver may close the connection,
# and Mosquitto does): the control characters U+0001..U+001F and U+007F..U+009F, and the
# non-characters (U+FDD0..U+FDEF, and the last two of every plane). U+0000 is ruled out apart.
DISCOURAGED = re.compile("[\\x01-\\x1f\\x7f-\\x9f\\ufdd0-\\ufdef" + "".join(
    f"\\U{plane << 16 | 0xFFFE:08x}\\U{plane << 16 | 0xFFFF:08x}" for plane in range(17)) + "]")


def check_code_points(text: str, what: str) -> None:
    """Raise ProtocolError when ``text`` holds a control character or a non-character."""
    found = DISCOURAGED.search(text)
    if found is not None:
        code = ord(found.group())
        kind = "a control character" if code <= 0x9F else "a non-character"
        raise malformed(f"{what} contains U+{code:04X}, {kind}", rule="MQTT-1.5.3")


def read_str(buf: bytes, p: int, end: int, what: str) -> tuple[str, int]:
    raw, q = read_binary(buf, p, end, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed(f"{what} is not well-formed UTF-8", rule="MQTT-1.5.3-1") from None
    if "\x00" in text:
        raise malformed(f"{what} contains U+0000", rule="MQTT-1.5.3-2")
    check_code_points(text, what)
    return text, q


def read_packet_id(buf: bytes, p: int, end: int, name: str) -> int:
    pid = read_u16(buf, p, end, name, after=" packet identifier")
    if pid == 0:
        raise malformed(f"{name} with packet identifier 0", rule="MQTT-2.3.1-1")
    return pid


def no_trailing(p: int, end: int, name: str) -> None:
    if p != end:
        raise malformed(f"{name} has {end - p} bytes after its last field")


def protocol_error(message: str, rule: str) -> ProtocolError:
    return ProtocolError(message, rule=rule, reason=PROTOCOL_ERROR)


def read_u32(buf: bytes, p: int, end: int, what: str) -> int:
    if p + 4 > end:
        raise malformed(f"{what} runs past the end of the packet")
    return int.from_bytes(buf[p:p + 4], "big")


def read_varint(buf: bytes, p: int, end: int, what: str) -> tuple[int, int]:
    """A variable byte integer (section 1.5.5): at most four bytes, 7 bits each, and no more
    of them than the value needs (a last byte of 0 after the first is refused, as Mosquitto
    does; the remaining length, read elsewhere, keeps the leniency of 3.1.1)."""
    value = 0
    for shift in (0, 7, 14, 21):
        if p >= end:
            raise malformed(f"{what} runs past the end of the packet")
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0 and shift:
                raise malformed(f"{what} is encoded in more bytes than its value needs",
                                rule="MQTT-1.5.5-1")
            return value, p
    raise malformed(f"{what} has a continuation bit in its 4th byte", rule="MQTT-1.5.5-1")
