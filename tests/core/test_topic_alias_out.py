"""Outbound topic aliases (``outbound_topic_aliases``) are bounded by the broker: a connection
gets at most ``max_outbound_topic_aliases`` of them, however large the Topic Alias Maximum it
announced, and once all are in use a new topic takes the least recently used alias, sent with
the topic name. The subscriber here resolves what it receives as the specification's client
does (section 3.3.4, PUBLISH Actions: ``AliasTable``), and each payload names its topic."""

from __future__ import annotations

import signal

import pytest

import mqttraw5 as R
from conftest import _open_clients, toml_dumps

pytestmark = pytest.mark.timeout(60)


class AliasTable:
    """A client's inbound topic aliases as section 3.3.4 has it: an alias with a topic name
    sets (or replaces) its mapping, an alias with an empty topic name uses it; an empty name
    with an alias not mapped, or an alias of 0 or above the Topic Alias Maximum, is an
    error."""

    def __init__(self, maximum: int):
        self.maximum = maximum
        self.topics: dict[int, str] = {}
        self.reassigned = 0          # mappings replaced by a new topic name

    def resolve(self, p) -> str:
        alias = p.properties.get(R.TOPIC_ALIAS)
        if alias is None:
            assert p.topic, "an empty topic name without a Topic Alias"
            return p.topic
        assert 1 <= alias <= self.maximum, f"Topic Alias {alias} outside 1..{self.maximum}"
        if not p.topic:
            assert alias in self.topics, f"alias {alias} used with an empty topic, never set"
            return self.topics[alias]
        if self.topics.get(alias, p.topic) != p.topic:
            self.reassigned += 1
        self.topics[alias] = p.topic
        return p.topic


def subscriber(b, client_id: str, topic_filter: str, maximum: int = 65535) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(client_id, props={R.TOPIC_ALIAS_MAXIMUM: maximum}).reason == 0
    c.subscribe(topic_filter, qos=0)
    return c


def publisher(b, client_id: str) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(client_id).reason == 0
    return c


def receive(c, table: AliasTable, n: int) -> list[tuple[str, int | None, str]]:
    """The next ``n`` PUBLISHes: (topic name as sent, Topic Alias, topic resolved), each
    resolved topic checked against the payload, which names it."""
    got = []
    for _ in range(n):
        p = c.wait_for(lambda p: p.type == R.PUBLISH, 5)
        topic = table.resolve(p)
        assert topic == p.payload.decode(), (p, topic)
        got.append((p.topic, p.properties.get(R.TOPIC_ALIAS), topic))
    return got


def test_a_full_alias_table_reuses_the_least_recently_used_alias(broker, uid):
    """max_outbound_topic_aliases 3 to a client that accepts 65535: aliases 1..3, then a new
    topic takes the alias used longest ago, with its topic name; a topic used again moves to
    the back."""
    b = broker(limits={"outbound_topic_aliases": True, "max_outbound_topic_aliases": 3})
    sub = subscriber(b, f"{uid}-s", f"{uid}/#")
    table = AliasTable(65535)
    pub = publisher(b, f"{uid}-p")
    order = "a b c a d b a c".split()
    for t in order:
        pub.publish(f"{uid}/{t}", f"{uid}/{t}".encode(), qos=1)
    got = [(name.rpartition("/")[2], alias) for name, alias, _ in receive(sub, table,
                                                                          len(order))]
    assert got == [
        ("a", 1), ("b", 2), ("c", 3),
        ("", 1),          # a again: the least recently used is now b
        ("d", 2),         # b's alias, with d's name
        ("b", 3),         # c's alias
        ("", 1),          # a, used since, keeps its alias
        ("c", 2),         # d's alias (d used before b and a)
    ]
    assert table.reassigned == 3


def test_aliases_stay_within_the_cap_for_many_topics(broker, uid):
    """A client announcing Topic Alias Maximum 65535 receives 400 messages on 60 topics (in
    an order that mixes new topics, recent ones and old ones) with the cap at 8: every alias is
    1..8, every PUBLISH resolves to its topic with the specification's rules, and aliases are
    reassigned (each with the topic name: an empty one would resolve to the old topic)."""
    b = broker(limits={"outbound_topic_aliases": True, "max_outbound_topic_aliases": 8})
    sub = subscriber(b, f"{uid}-s", f"{uid}/#")
    table = AliasTable(65535)
    pub = publisher(b, f"{uid}-p")
    state = 12345
    topics = []
    for i in range(400):
        state = (state * 1103515245 + 12345) % 2**31      # a fixed pseudo-random sequence
        n = state % 60 if i % 3 else state % 6            # a few hot topics, many cold ones
        topics.append(f"{uid}/t/{n}")
    for t in topics:
        pub.publish(t, t.encode(), qos=0)
    assert pub.ping() == []                               # all routed
    got = receive(sub, table, len(topics))
    assert [topic for _, _, topic in got] == topics
    aliases = {alias for _, alias, _ in got}
    assert aliases == set(range(1, 9))                    # never above the cap, no alias-less
    assert table.reassigned > 50
    assert sum(1 for name, _, _ in got if not name) > 100  # and the aliases are used


def test_the_default_cap_and_a_reload_that_lowers_it(broker, uid):
    """By default a connection gets at most 64 aliases; a reload that lowers the cap applies to
    connections made after it (one connected before keeps its 64)."""
    b = broker(limits={"outbound_topic_aliases": True})
    before = subscriber(b, f"{uid}-b", f"{uid}/#")
    before_table = AliasTable(65535)
    pub = publisher(b, f"{uid}-p")
    topics = [f"{uid}/n/{i}" for i in range(70)]
    for t in topics:
        pub.publish(t, t.encode(), qos=1)
    got = receive(before, before_table, 70)
    assert max(alias for _, alias, _ in got) == 64
    assert [alias for _, alias, _ in got[64:]] == [1, 2, 3, 4, 5, 6]   # reused, in order

    mark = b.mark()
    b.config_path.write_text(toml_dumps(dict(b.config, limits={
        "outbound_topic_aliases": True, "max_outbound_topic_aliases": 2})))
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=5, start=mark)
    after = subscriber(b, f"{uid}-a", f"{uid}/#")
    after_table = AliasTable(65535)
    more = [f"{uid}/m/{i}" for i in range(5)]
    for t in more:
        pub.publish(t, t.encode(), qos=1)
    assert [alias for _, alias, _ in receive(after, after_table, 5)] == [1, 2, 1, 2, 1]
    assert [alias for _, alias, _ in receive(before, before_table, 5)] == [7, 8, 9, 10, 11]


def test_the_client_topic_alias_maximum_bounds_it_below_the_cap(broker, uid):
    """The effective maximum is the smaller of the cap and the client's Topic Alias Maximum."""
    b = broker(limits={"outbound_topic_aliases": True, "max_outbound_topic_aliases": 10})
    sub = subscriber(b, f"{uid}-s", f"{uid}/#", maximum=2)
    table = AliasTable(2)
    pub = publisher(b, f"{uid}-p")
    topics = [f"{uid}/{t}" for t in "a b c a c b".split()]
    for t in topics:
        pub.publish(t, t.encode(), qos=1)
    got = receive(sub, table, len(topics))
    assert [(name.rpartition("/")[2], alias) for name, alias, _ in got] == [
        ("a", 1), ("b", 2), ("c", 1), ("a", 2), ("", 1), ("b", 2)]
