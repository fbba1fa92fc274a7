"""The 5.0 properties a client may put on a request, checked when the request is made
(requests.py's ``make_publish``, ``make_subscribe``, ``make_unsubscribe``) and when a
connection takes it (``Connection.submit``), and those of CONNECT and the will when a
Connection is made: an identifier MQTT does not know, one the
packet does not carry or a client may not send, a value of the wrong type or out of its
range. Each would otherwise fail only when the packet is made (or make the server close the
connection), far from the call that asked for it.
"""

from __future__ import annotations

from edgebroker.mqtt import packets as P
from edgebroker.mqtt.properties import (
    BINARY, BYTE, MAX_VARINT, MAXIMUM_PACKET_SIZE, PAYLOAD_FORMAT, PROPERTIES, RECEIVE_MAXIMUM,
    REQUEST_PROBLEM_INFO, REQUEST_RESPONSE_INFO, RESPONSE_TOPIC, STRING, SUBSCRIPTION_ID,
    TOPIC_ALIAS, U16, U32, VARINT, WILL,
)

_TOP = {BYTE: 0xFF, U16: 0xFFFF, U32: 0xFFFF_FFFF, VARINT: MAX_VARINT}
# Allowed in the packet, but only the server sends it there.
_SERVER_ONLY = {P.PUBLISH: {SUBSCRIPTION_ID: "MQTT-3.3.4-6"}}
_FLAGS = frozenset((PAYLOAD_FORMAT, REQUEST_PROBLEM_INFO, REQUEST_RESPONSE_INFO))  # 0 or 1
_NOT_ZERO = frozenset((TOPIC_ALIAS, SUBSCRIPTION_ID, RECEIVE_MAXIMUM,    # 0: a protocol
                       MAXIMUM_PACKET_SIZE))                             # error


def property_problem(props, where: int) -> str | None:
    """What is wrong with ``props`` (identifier -> value) on a packet of type ``where`` sent
    by a client, or None when nothing is."""
    if props is None:
        return None
    if not isinstance(props, dict):
        return f"properties must be a dict (identifier -> value), not {type(props).__name__}"
    for ident, value in props.items():
        spec = PROPERTIES.get(ident) if type(ident) is int else None
        if spec is None:
            shown = f"{ident:#04x}" if type(ident) is int else repr(ident)
            return f"{shown} is no MQTT 5.0 property identifier"
        name, kind, allowed = spec
        label = f"property {name} ({ident:#04x})"
        rule = _SERVER_ONLY.get(where, {}).get(ident)
        if where not in allowed or rule:
            return (f"{label} is not one a client puts on "
                    f"{'a will' if where == WILL else P.NAMES[where]}"
                    + (f" ({rule})" if rule else ""))
        problem = _value_problem(ident, kind, value)
        if problem:
            return f"{label} {problem}, not {_shown(value)}"
    return None


def _value_problem(ident: int, kind: int, value) -> str | None:
    if kind in _TOP:
        low = 1 if ident in _NOT_ZERO else 0
        top = 1 if ident in _FLAGS else _TOP[kind]
        if not isinstance(value, int) or not low <= value <= top:
            return f"must be an int in {low}..{top}"
        return None
    if kind == STRING:
        problem = _string_problem(value)
        if problem is None and ident == RESPONSE_TOPIC and ("+" in value or "#" in value):
            problem = "must be a topic name without wildcard characters (MQTT-3.3.2-14)"
        return problem
    if kind == BINARY:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            return "must be bytes"
        return None if len(value) <= 0xFFFF else "must be at most 65,535 bytes"
    if not isinstance(value, (list, tuple)):                # PAIR: User Property
        return "must be a list of (name, value) pairs of str"
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            return "must be a list of (name, value) pairs of str"
        for text in pair:
            problem = _string_problem(text)
            if problem:
                return f"has a name or value that {problem}"
    return None


def connect_problem(client_id: str, username: str | None, password: bytes | str | None,
                    will: P.Will | None, protocol: int = P.PROTOCOL_5) -> str | None:
    """What a CONNECT of these fields could not carry (each is a field with a 2-byte length;
    the strings UTF-8 without U+0000; over 3.1/3.1.1 no password without a user name), or
    None."""
    if password is not None and username is None and protocol != P.PROTOCOL_5:
        return ("password given without a user name: MQTT 3.1/3.1.1 do not allow it "
                "(MQTT-3.1.2-22; 5.0 does)")
    for what, text in (("client id", client_id), ("user name", username),
                       ("will topic", None if will is None else will.topic)):
        problem = None if text is None else _string_problem(text)
        if problem:
            return f"the {what} {problem}"
    if isinstance(password, str):
        problem = _string_problem(password)
        if problem:
            return f"the password {problem}"
    elif password is not None and len(password) > 0xFFFF:
        return "the password must be at most 65,535 bytes"
    if will is not None and len(will.payload) > 0xFFFF:
        return "the will payload must be at most 65,535 bytes"
    return None


def _string_problem(value) -> str | None:
    if not isinstance(value, str):
        return "must be a str"
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid UTF-8 (it has a lone surrogate)"
    if len(raw) > 0xFFFF:
        return "must be at most 65,535 bytes of UTF-8"
    if "\0" in value:
        return "must not contain U+0000 (MQTT-1.5.4-2)"
    return None


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


WHERE = {"publish": P.PUBLISH, "subscribe": P.SUBSCRIBE, "unsubscribe": P.UNSUBSCRIBE}
"""A request's kind (requests.py) -> the packet type it is sent as."""
