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

from edgebroker.errors import (
    MALFORMED_PACKET, TOPIC_FILTER_INVALID, TOPIC_NAME_INVALID, ProtocolError, topic_shown,
)

MAX_TOPIC_BYTES = 65535
SHARE_PREFIX = "$share/"


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


def validate_topic_name(name: str, what: str = "topic name") -> None:
    """Raise ProtocolError unless ``name`` is a valid topic name (no wildcards); ``what`` it
    is, for the message (a will topic)."""
    _check_common(name, what, TOPIC_NAME_INVALID)
    if "+" in name or "#" in name:
        raise ProtocolError(f"{what} {topic_shown(name)} contains a wildcard character",
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
                f"topic filter {topic_shown(topic_filter)}: '#' must be the whole last level",
                rule="MQTT-4.7.1-2")
    for level in topic_filter.split("/"):
        if "+" in level and level != "+":
            raise ProtocolError(
                f"topic filter {topic_shown(topic_filter)}: '+' must fill a whole level",
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


def is_shared(topic_filter: str) -> bool:
    """True if the filter asks for a shared subscription (MQTT 5.0 section 4.8.2): it starts
    with ``$share/``; ``parse_shared`` says whether the rest is valid."""
    return topic_filter.startswith(SHARE_PREFIX)


def parse_shared(topic_filter: str) -> tuple[str, str]:
    """(ShareName, the filter inside) of a valid ``$share/<ShareName>/<filter>``, already
    valid as a topic filter as a whole. Raises ProtocolError (reason 0x8F, Topic Filter
    invalid) when the ShareName is empty or contains "+" or "#", or no filter follows it
    (MQTT-4.8.2-1, MQTT-4.8.2-2)."""
    rest = topic_filter[len(SHARE_PREFIX):]
    share, slash, inner = rest.partition("/")
    if not share:
        raise ProtocolError(f"shared subscription {topic_shown(topic_filter)} has an empty "
                            f"ShareName",
                            rule="MQTT-4.8.2-1", reason=TOPIC_FILTER_INVALID)
    if "+" in share or "#" in share:
        raise ProtocolError(f"shared subscription {topic_shown(topic_filter)}: the ShareName "
                            f"contains '+' or '#'",
                            rule="MQTT-4.8.2-2", reason=TOPIC_FILTER_INVALID)
    if not slash or not inner:
        raise ProtocolError(f"shared subscription {topic_shown(topic_filter)}: no topic "
                            f"filter after the ShareName",
                            rule="MQTT-4.8.2-2", reason=TOPIC_FILTER_INVALID)
    return share, inner


def sys_topic_level(name: str) -> str:
    """A client id (or user name) as one topic level, as the per-client $SYS topics write it:
    '%', '/', '+' and '#' percent-encoded ("%00" for an empty one)."""
    if not name:
        return "%00"
    return name.replace("%", "%25").replace("/", "%2F").replace("+", "%2B").replace("#", "%23")
