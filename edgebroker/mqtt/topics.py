"""Topic names and topic filters (MQTT 3.1.1 section 4.7), as ``str``.

A topic *name* is what a PUBLISH is sent to; it never contains wildcards.
A topic *filter* is what a SUBSCRIBE asks for; it may contain wildcards:
``+`` matches exactly one level (which may be empty) and must fill a whole
level, ``#`` matches the parent level and every level below it and must be
the whole last level. Levels are separated by ``/`` and may be empty
(``a//b``, ``/a``, ``a/``). Topics whose first character is ``$`` are not
matched by a filter whose first level is a wildcard [MQTT-4.7.2-1].

Both kinds are non-empty [MQTT-4.7.3-1], contain no U+0000 [MQTT-4.7.3-2]
and encode to at most 65535 bytes of UTF-8 [MQTT-4.7.3-3].
"""

from __future__ import annotations

from edgebroker.errors import MALFORMED_PACKET, TOPIC_NAME_INVALID, ProtocolError

MAX_TOPIC_BYTES = 65535


def _check_common(text: str, what: str, reason: int) -> None:
    if not text:
        raise ProtocolError(f"{what} is empty", rule="MQTT-4.7.3-1", reason=reason)
    if "\x00" in text:
        raise ProtocolError(f"{what} contains U+0000", rule="MQTT-4.7.3-2", reason=reason)
    # A code point is at most 4 bytes of UTF-8, so short strings skip the encode.
    if len(text) > MAX_TOPIC_BYTES // 4 or not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise ProtocolError(f"{what} is not valid UTF-8 (lone surrogate)",
                                rule="MQTT-1.5.3-1", reason=reason) from None
        if size > MAX_TOPIC_BYTES:
            raise ProtocolError(f"{what} is {size} bytes of UTF-8, over {MAX_TOPIC_BYTES}",
                                rule="MQTT-4.7.3-3", reason=reason)


def validate_topic_name(name: str) -> None:
    """Raise ProtocolError unless ``name`` is a valid topic name (no wildcards)."""
    _check_common(name, "topic name", TOPIC_NAME_INVALID)
    if "+" in name or "#" in name:
        raise ProtocolError(f"topic name {name!r} contains a wildcard character",
                            rule="MQTT-4.7.1-1", reason=TOPIC_NAME_INVALID)


def validate_topic_filter(topic_filter: str) -> None:
    """Raise ProtocolError unless ``topic_filter`` is a valid topic filter."""
    _check_common(topic_filter, "topic filter", MALFORMED_PACKET)
    has_hash = "#" in topic_filter
    if not has_hash and "+" not in topic_filter:
        return
    if has_hash:
        idx = topic_filter.index("#")
        if idx != len(topic_filter) - 1 or (idx > 0 and topic_filter[idx - 1] != "/"):
            raise ProtocolError(
                f"topic filter {topic_filter!r}: '#' must be the whole last level",
                rule="MQTT-4.7.1-2")
    for level in topic_filter.split("/"):
        if "+" in level and level != "+":
            raise ProtocolError(
                f"topic filter {topic_filter!r}: '+' must fill a whole level",
                rule="MQTT-4.7.1-3")


def is_wildcard_filter(topic_filter: str) -> bool:
    """True if the (valid) filter contains a wildcard."""
    return "+" in topic_filter or "#" in topic_filter


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True if the valid ``topic_filter`` matches the valid topic name ``topic``."""
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == topic
    if topic[:1] == "$" and topic_filter[0] in "+#":
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    n_topic = len(t_levels)
    for i, level in enumerate(f_levels):
        if level == "#":
            return True  # matches the parent ("a/#" matches "a") and all children
        if i >= n_topic:
            return False
        if level != "+" and level != t_levels[i]:
            return False
    return len(f_levels) == n_topic
