"""One session's filters compiled (core.filter_set) against ``topic_matches`` on random filters
and topics, and what uses them: the 5.0 options and Subscription Identifiers of a session
(core.router5) and the QoS a session reading the log takes a record with (core.cursor),
checked against going through every filter as they did before."""

from __future__ import annotations

import random

from edgebroker.core.cursor import CACHE_LIMIT, Cursor
from edgebroker.core.filter_set import SMALL, FilterSet, matching_filters
from edgebroker.core.router5 import options5_for, subscription_ids
from edgebroker.core.session import Session
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.properties import varint
from edgebroker.mqtt.topics import topic_matches

LEVELS = ["a", "b", "c", ""]


def random_filter(rnd: random.Random) -> str:
    levels = [rnd.choice(LEVELS + ["+", "+"]) for _ in range(rnd.randint(1, 4))]
    if rnd.random() < 0.1:
        levels[0] = "$s"
    if rnd.random() < 0.3:
        levels.append("#")
    if rnd.random() < 0.05:
        levels = ["#"]
    return "/".join(levels)


def random_topic(rnd: random.Random) -> str:
    levels = [rnd.choice(LEVELS + ["d"]) for _ in range(rnd.randint(1, 5))]
    if rnd.random() < 0.15:
        levels[0] = "$s"
    return "/".join(levels)


def test_matches_what_topic_matches_says_through_adds_and_removes():
    rnd = random.Random(5)
    for _ in range(40):
        filters = {random_filter(rnd) for _ in range(rnd.randint(1, 120))}
        compiled = FilterSet(filters)
        for step in range(60):
            if step % 10 == 9:       # the set changes as SUBSCRIBE / UNSUBSCRIBE change it
                gone = rnd.choice(sorted(filters))
                filters.discard(gone)
                compiled.remove(gone)
                compiled.remove(gone)                  # twice: nothing more happens
                new = random_filter(rnd)
                filters.add(new)
                compiled.add(new)
                compiled.add(new)
                assert compiled.size == len(filters)
            topic = random_topic(rnd)
            found = compiled.match(topic)
            assert len(found) == len(set(found)), (topic, found)
            assert set(found) == {f for f in filters if topic_matches(f, topic)}, topic


def test_edge_cases_of_the_rules():
    compiled = FilterSet(["#", "+", "a/#", "+/#", "$SYS/#", "a/+/c", "a//c", "/"])
    cases = {
        "a": {"#", "+", "a/#", "+/#"},             # "a/#" and "+/#" match their parent
        "$SYS/x": {"$SYS/#"},                      # MQTT-4.7.2-1
        "a/b/c": {"#", "a/#", "+/#", "a/+/c"},
        "a//c": {"#", "a/#", "+/#", "a/+/c", "a//c"},
        "/": {"#", "+/#", "/"},
    }
    for topic, expected in cases.items():
        assert set(compiled.match(topic)) == expected, topic
        assert expected == {f for f in ["#", "+", "a/#", "+/#", "$SYS/#", "a/+/c", "a//c", "/"]
                            if topic_matches(f, topic)}


def test_an_expensive_walk_is_remembered_and_forgotten_on_a_change():
    """Overlapping filters (every mix of a level and '+' over 8 levels): a topic matching
    them all is answered from memory the second time; a change forgets it."""
    filters = ["/".join(c if bit else "+" for c, bit in zip("abcdefgh", map(int, f"{n:08b}")))
               for n in range(256)]
    compiled = FilterSet(filters)
    first = compiled.match("a/b/c/d/e/f/g/h")
    assert len(first) == 256
    assert compiled.match("a/b/c/d/e/f/g/h") is first
    compiled.remove(filters[0])
    again = compiled.match("a/b/c/d/e/f/g/h")
    assert again is not first and len(again) == 255


def session_with(filters: dict, sub5: dict | None = None, since: dict | None = None) -> Session:
    s = Session("c", clean=False)
    s.own_subscriptions().update(filters)
    s.sub5 = sub5
    if since is not None:
        s.cursor = Cursor(0, 0)
        s.cursor.since = since
    return s


def options_by_every_filter(session, topic, retain_flag, own, offset):
    """``options5_for`` as it went through every filter (the reference)."""
    best, retain = -1, False
    since = session.cursor.since if session.cursor is not None and offset is not None else None
    for f, qos in session.subscriptions.items():
        if not topic_matches(f, topic) or since and since.get(f, 0) > offset:
            continue
        options = (session.sub5 or {}).get(f, (0, 0))[0]
        if own and options & P.SUB_NO_LOCAL:
            continue
        best = max(best, qos)
        if options & P.SUB_RETAIN_AS_PUBLISHED:
            retain = retain_flag
    return best, retain


def ids_by_every_filter(session, topic, own, offset) -> list:
    since = session.cursor.since if session.cursor is not None and offset is not None else None
    return sorted(sid for f, (options, sid) in (session.sub5 or {}).items()
                  if sid and topic_matches(f, topic) and not (own and options & P.SUB_NO_LOCAL)
                  and not (since and since.get(f, 0) > offset))


def ids_of(found: bytes) -> list:
    ids, pos = [], 0
    while pos < len(found):
        assert found[pos] == 0x0b
        pos += 1
        value, shift = 0, 0
        while True:
            byte = found[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        ids.append(value)
    assert b"".join(b"\x0b" + varint(i) for i in ids) == found
    return sorted(ids)


def test_5_0_options_and_identifiers_as_going_through_every_filter():
    rnd = random.Random(7)
    for round_ in range(30):
        filters = {random_filter(rnd): rnd.randint(0, 2)
                   for _ in range(rnd.choice([3, SMALL, 40, 300]))}
        sub5 = {f: (rnd.choice([0, P.SUB_NO_LOCAL, P.SUB_RETAIN_AS_PUBLISHED,
                                P.SUB_NO_LOCAL | P.SUB_RETAIN_AS_PUBLISHED]),
                    rnd.choice([0, rnd.randint(1, 300000)]))
                for f in filters if rnd.random() < 0.7}
        since = ({f: rnd.randint(0, 100) for f in filters if rnd.random() < 0.3}
                 if round_ % 2 else None)
        session = session_with(filters, sub5, since)
        for _ in range(80):
            topic = random_topic(rnd)
            own, retain_flag = rnd.random() < 0.5, rnd.random() < 0.5
            offset = rnd.choice([None, rnd.randint(0, 100)])
            assert options5_for(session, topic, retain_flag, own, offset) == \
                options_by_every_filter(session, topic, retain_flag, own, offset)
            assert ids_of(subscription_ids(session, topic, own, offset)) == \
                ids_by_every_filter(session, topic, own, offset)


def test_granted_as_going_through_every_filter_with_a_small_cache_entry():
    """``Cursor.granted``: the highest QoS of the filters that match and count from the
    record's offset; what it remembers of a topic is a few pairs however many filters match
    (it was one per matching filter: 1,000 filters x 1,024 topics)."""
    rnd = random.Random(11)
    for round_ in range(12):
        filters = {random_filter(rnd): rnd.randint(0, 2)
                   for _ in range(rnd.choice([2, 50, 1000]))}
        since = {f: rnd.randint(0, 100) for f in filters if rnd.random() < 0.5}
        session = session_with(filters, since=since if round_ % 3 else None)
        cursor = session.cursor or Cursor(0, 0)
        for _ in range(300):
            topic = random_topic(rnd)
            offset = rnd.randint(0, 100)
            expected = max((q for f, q in filters.items() if topic_matches(f, topic)
                            and offset >= (cursor.since or {}).get(f, 0)), default=-1)
            assert cursor.granted(session, topic.encode(), offset) == expected, topic
        assert 0 < len(cursor.cache) <= CACHE_LIMIT
        assert all(len(entry) <= 3 for entry in cursor.cache.values())


def test_a_session_changed_behind_the_compiled_set_is_compiled_again():
    """(core.sessions keeps it up to date; a change made elsewhere, as at a restore, shows in
    the number of filters.)"""
    session = session_with({f"x/{i}/+": 1 for i in range(SMALL + 1)})
    assert matching_filters(session, "x/3/y") == ("x/3/+",)
    session.subscriptions["x/#"] = 0
    assert set(matching_filters(session, "x/3/y")) == {"x/3/+", "x/#"}


def test_messages_to_a_session_with_1000_filters_do_not_go_through_each(monkeypatch):
    """The review's case: '#' with No Local and 999 filters '+/.../+/z<i>' of 128 levels, a
    message on one of two topics of 128 levels at a time. Its options, identifiers and, behind,
    the QoS it takes are found without matching each filter (a filter matched is a
    ``topic_matches`` call): it went through all 1,000 for every message."""
    import edgebroker.core.cursor as cursor_module
    import edgebroker.core.filter_set as filter_set_module
    import edgebroker.core.router5 as router5_module
    calls = [0]

    def counted(topic_filter, topic):
        calls[0] += 1
        return topic_matches(topic_filter, topic)
    for module in (cursor_module, filter_set_module, router5_module):
        monkeypatch.setattr(module, "topic_matches", counted, raising=False)
    filters = {"#": 0, **{"+/" * 127 + f"z{i}": 1 for i in range(999)}}
    sub5 = {"#": (P.SUB_NO_LOCAL, 1), "+/" * 127 + "z5": (0, 2)}
    session = session_with(filters, sub5, since={})
    session.cursor.cache.clear()
    topics = ["x/" * 127 + "y0", "x/" * 127 + "z5"]
    for i in range(200):
        topic = topics[i % 2]
        assert options5_for(session, topic, False, True) == (1 if i % 2 else -1, False)
        assert ids_of(subscription_ids(session, topic, False)) == ([1, 2] if i % 2 else [1])
        assert session.cursor.granted(session, ("%d/" % i + topic).encode(), i) == 0
    assert calls[0] <= 4       # (the two filters with identifiers, once per topic, remembered)
    assert session.filter_set.size == 1000
