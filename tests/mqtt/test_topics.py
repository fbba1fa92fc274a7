"""Topic names, topic filters and matching (MQTT 3.1.1 section 4.7)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgebroker.errors import (
    MALFORMED_PACKET, TOPIC_FILTER_INVALID, TOPIC_NAME_INVALID, ProtocolError,
)
from edgebroker.mqtt.topics import (
    is_shared, parse_shared, topic_matches, validate_topic_filter, validate_topic_name,
)

# ----------------------------------------------------------------------------- validators


@pytest.mark.parametrize("name", [
    "a", "/", "//", "a//b", "/a", "a/", "$SYS/broker/load", " ", "ü/€/𝄞", "a" * 65535,
    "€" * 21845,  # 65535 bytes of UTF-8
])
def test_valid_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name, rule", [
    ("", "MQTT-4.7.3-1"),
    ("+", "MQTT-4.7.1-1"),
    ("#", "MQTT-4.7.1-1"),
    ("a/+/b", "MQTT-4.7.1-1"),
    ("a/#", "MQTT-4.7.1-1"),
    ("a+b", "MQTT-4.7.1-1"),
    ("a\x00b", "MQTT-4.7.3-2"),
    ("a" * 65536, "MQTT-4.7.3-3"),
    ("é" * 32768, "MQTT-4.7.3-3"),  # 32768 code points, 65536 bytes
    ("a\ud800b", "MQTT-1.5.3-1"),  # lone surrogate cannot be UTF-8
])
def test_invalid_topic_names(name, rule):
    with pytest.raises(ProtocolError) as info:
        validate_topic_name(name)
    assert info.value.rule == rule
    assert info.value.reason == TOPIC_NAME_INVALID


@pytest.mark.parametrize("topic_filter", [
    "#", "+", "a", "a/#", "a/+", "+/+", "/+", "+/", "/#", "a/+/b", "+/#", "$SYS/#", "a//b",
    "sport/tennis/+/ranking", "+/+/+", "a/b/c/d/#", "ü/+/€", "/", "a" * 65535,
])
def test_valid_topic_filters(topic_filter):
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_filter, rule", [
    ("", "MQTT-4.7.3-1"),
    ("a#", "MQTT-4.7.1-2"),
    ("#a", "MQTT-4.7.1-2"),
    ("a/#/b", "MQTT-4.7.1-2"),
    ("#/a", "MQTT-4.7.1-2"),
    ("##", "MQTT-4.7.1-2"),
    ("a/b#", "MQTT-4.7.1-2"),
    ("sport/tennis#", "MQTT-4.7.1-2"),
    ("a+", "MQTT-4.7.1-3"),
    ("+a", "MQTT-4.7.1-3"),
    ("++", "MQTT-4.7.1-3"),
    ("a/+b/c", "MQTT-4.7.1-3"),
    ("sport+", "MQTT-4.7.1-3"),
    ("a/b+/#", "MQTT-4.7.1-3"),
    ("a\x00", "MQTT-4.7.3-2"),
    ("a" * 65536, "MQTT-4.7.3-3"),
])
def test_invalid_topic_filters(topic_filter, rule):
    with pytest.raises(ProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.rule == rule
    assert info.value.reason == MALFORMED_PACKET


# ----------------------------------------------------------------------------- matching

MATCHES = [
    # The examples of section 4.7.1.
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    # Section 4.7.2: $-topics and first-level wildcards.
    ("#", "$SYS", False),
    ("#", "$SYS/broker/load", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("+", "$", False),
    ("+/#", "$SYS", False),
    ("$SYS", "$SYS", True),
    ("a/$x", "a/$x", True),
    ("a/+", "a/$x", True),  # only the first level is special
    ("a/#", "a/$x/y", True),
    # Exact, case-sensitive, empty levels.
    ("ACCOUNTS", "Accounts", False),
    ("a/b", "a/b", True),
    ("a/b", "a/b/", False),
    ("a/b/", "a/b", False),
    ("/", "/", True),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("+/a", "/a", True),
    ("+", "a", True),
    ("+", "a/b", False),
    ("+", "/", False),
    ("+/+", "/", True),
    ("#", "/", True),
    ("#", "a", True),
    ("#", "a/b/c", True),
    ("a/#", "a", True),
    ("a/#", "a/", True),
    ("a/#", "ab", False),
    ("a/#", "b/a", False),
    ("+/#", "a", True),
    ("/#", "/", True),
    ("/#", "a", False),
    ("a/+/+", "a/b", False),
    ("a/+/#", "a/b", True),
    ("a/b/c", "a/b", False),
]


@pytest.mark.parametrize("topic_filter, topic, expected", MATCHES)
def test_topic_matches_table(topic_filter, topic, expected):
    assert topic_matches(topic_filter, topic) is expected


# ----------------------------------------------------------------------------- properties

_level_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="/+#\x00")
_levels = st.text(_level_chars, max_size=6)
topic_names = st.lists(_levels, min_size=1, max_size=6).map("/".join).filter(bool)


@settings(max_examples=300, deadline=None)
@given(topic_names)
def test_topic_matches_itself_and_hash(topic):
    validate_topic_name(topic)
    validate_topic_filter(topic)
    assert topic_matches(topic, topic)
    assert topic_matches("#", topic) is (not topic.startswith("$"))


def _reference_match(topic_filter: str, topic: str) -> bool:
    """An independent matcher: translate the filter to a regular expression."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    parts = []
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if level == "#":
            # "a/#" also matches "a": the separator before '#' is optional.
            parts.append("(/.*)?" if i else ".*")
            break
        parts.append(("/" if i else "") + ("[^/]*" if level == "+" else re.escape(level)))
    return re.fullmatch("".join(parts), topic, flags=re.DOTALL) is not None


_small_levels = st.sampled_from(["a", "b", "", "$x", "$"])
small_topics = st.lists(_small_levels, min_size=1, max_size=4).map("/".join).filter(bool)
small_filters = st.builds(
    lambda levels, hash_: "/".join(levels + (["#"] if hash_ else [])),
    st.lists(st.sampled_from(["a", "b", "", "+", "$x"]), max_size=4),
    st.booleans(),
).filter(bool)


@settings(max_examples=500, deadline=None)
@given(small_filters, small_topics)
def test_topic_matches_agrees_with_regex_reference(topic_filter, topic):
    validate_topic_filter(topic_filter)
    assert topic_matches(topic_filter, topic) is _reference_match(topic_filter, topic)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20))
def test_validators_raise_only_protocol_error(text):
    for validate in (validate_topic_name, validate_topic_filter):
        try:
            validate(text)
        except ProtocolError:
            pass


# ----------------------------------------------------------------------------- shared subscriptions


@pytest.mark.parametrize("text, share, inner", [
    ("$share/g/a", "g", "a"),
    ("$share/g/#", "g", "#"),
    ("$share/g/+/b/#", "g", "+/b/#"),
    ("$share/g//", "g", "/"),
    ("$share/g/$SYS/x", "g", "$SYS/x"),
    ("$share/$share/a/b", "$share", "a/b"),
    ("$share/ü€/a", "ü€", "a"),
])
def test_shared_subscription_names(text, share, inner):
    validate_topic_filter(text)
    assert is_shared(text)
    assert parse_shared(text) == (share, inner)


@pytest.mark.parametrize("text, rule", [
    ("$share//a", "MQTT-4.8.2-1"),
    ("$share/+/a", "MQTT-4.8.2-2"),
    ("$share/#", "MQTT-4.8.2-2"),
    ("$share/g", "MQTT-4.8.2-2"),
    ("$share/g/", "MQTT-4.8.2-2"),
])
def test_bad_shared_subscription_names(text, rule):
    validate_topic_filter(text)       # a well-formed filter: only its share is wrong
    with pytest.raises(ProtocolError) as info:
        parse_shared(text)
    assert (info.value.rule, info.value.reason) == (rule, TOPIC_FILTER_INVALID)


@pytest.mark.parametrize("text", ["$share", "$shared/g/a", "share/g/a", "$SHARE/g/a", "a/$share/g"])
def test_not_shared(text):
    assert not is_shared(text)
