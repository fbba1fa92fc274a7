"""Subscription trie and retained tree against a brute-force matcher."""

from hypothesis import given, settings, strategies as st

from edgebroker.mqtt.topics import topic_matches
from edgebroker.mqtt.trie import (
    CACHE_LIMIT, CACHED_TOPIC_LENGTH, CHANGED_LIMIT, RetainedTree, SubscriptionTrie,
)

LEVEL = st.sampled_from(["a", "b", "", "$SYS", "x y", "é"])
TOPIC = st.lists(LEVEL, min_size=1, max_size=4).map("/".join)


@st.composite
def topic_filters(draw):
    levels = draw(st.lists(st.one_of(LEVEL, st.just("+")), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


def test_wildcards_and_dollar_topics():
    trie = SubscriptionTrie()
    for f, who in [("a/+", 1), ("a/#", 2), ("#", 3), ("+/b", 4), ("$SYS/#", 5), ("a", 6)]:
        trie.add(f, who, 0)
    assert sorted(s for s, _ in trie.match("a/b")) == [1, 2, 3, 4]
    assert sorted(s for s, _ in trie.match("a")) == [2, 3, 6]  # "a/#" matches "a"
    assert sorted(s for s, _ in trie.match("$SYS/b")) == [5]   # no leading wildcard for $
    assert sorted(s for s, _ in trie.match("/b")) == [3, 4]


def test_overlapping_filters_give_highest_qos():
    trie = SubscriptionTrie()
    trie.add("a/#", "s", 0)
    trie.add("a/+", "s", 2)
    trie.add("a/b", "s", 1)
    assert trie.match("a/b") == [("s", 2)]


def test_resubscribe_replaces_and_remove_prunes():
    trie = SubscriptionTrie()
    assert trie.add("a/b", "s", 0) is False
    assert trie.add("a/b", "s", 1) is True
    assert trie.count == 1 and trie.match("a/b") == [("s", 1)]
    assert trie.remove("a/b", "s") is True
    assert trie.remove("a/b", "s") is False
    assert trie.match("a/b") == [] and trie.count == 0
    assert trie._root.children == {}


def test_cache_is_invalidated_and_bounded():
    trie = SubscriptionTrie()
    trie.add("t/+", "s", 0)
    assert trie.match("t/1") == [("s", 0)]
    trie.add("t/1", "u", 1)
    assert sorted(trie.match("t/1")) == [("s", 0), ("u", 1)]
    for i in range(CACHE_LIMIT + 10):
        trie.match(f"t/{i}")
    assert len(trie._cache) <= CACHE_LIMIT


def test_long_topic_names_are_matched_but_not_cached():
    """The cache holds names of up to CACHED_TOPIC_LENGTH characters: 65,536 names of 60 KB
    each would be 4 GB. Longer names are matched as well, each time from the trie."""
    trie = SubscriptionTrie()
    trie.add("#", "all", 0)
    trie.add("+/" + "y" * 60_000, "long", 1)
    short = "a/" + "x" * (CACHED_TOPIC_LENGTH - 2)
    assert trie.match(short) == [("all", 0)]
    long_names = [f"{i}/" + "y" * 60_000 for i in range(100)]
    for name in long_names:
        assert sorted(trie.match(name)) == [("all", 0), ("long", 1)]
    assert list(trie._cache) == [short]
    assert trie.match(short + "x") == [("all", 0)]     # one character over: not kept
    assert list(trie._cache) == [short]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(topic_filters(), st.integers(0, 5), st.integers(0, 2)), max_size=12),
       st.lists(TOPIC, min_size=1, max_size=5))
def test_trie_agrees_with_brute_force(subs, topics):
    trie = SubscriptionTrie()
    wanted = {}
    for f, who, qos in subs:
        trie.add(f, who, qos)
        wanted[f, who] = qos
    for topic in topics:
        expected = {}
        for (f, who), qos in wanted.items():
            if topic_matches(f, topic):
                expected[who] = max(qos, expected.get(who, -1))
        assert dict(trie.match(topic)) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(TOPIC, max_size=12),
       st.dictionaries(topic_filters(), st.integers(0, 2), max_size=6))
def test_retained_match_filters_agrees_with_brute_force(stored, filters):
    """One walk for several filters: each stored topic that any filter matches, once, with the
    highest QoS of those filters (topic_matches decides, "$" topics and "a/#" matching "a"
    included)."""
    tree = RetainedTree()
    for topic in stored:
        tree.set(topic, topic)
    expected = {}
    for topic in set(stored):
        for f, qos in filters.items():
            if topic_matches(f, topic):
                expected[topic] = max(qos, expected.get(topic, -1))
    found = list(tree.match_filters(filters))
    assert len(found) == len({t for t, _ in found})      # each value once
    assert dict(found) == expected


def test_retained_match_filters_examples():
    tree = RetainedTree()
    for topic in ["a", "a/b", "a/b/c", "$SYS/x", "b/b", "/a"]:
        tree.set(topic, topic)
    got = dict(tree.match_filters({"a/#": 0, "+/b": 2, "a/b/c": 1}))
    assert got == {"a": 0, "a/b": 2, "a/b/c": 1, "b/b": 2}
    assert dict(tree.match_filters({"#": 1, "$SYS/+": 2})) == {
        "a": 1, "a/b": 1, "a/b/c": 1, "b/b": 1, "/a": 1, "$SYS/x": 2}
    assert dict(tree.match_filters({"+/#": 0})) == {"a": 0, "a/b": 0, "a/b/c": 0, "b/b": 0,
                                                   "/a": 0}
    assert dict(tree.match_filters({"+/a": 1, "x/#": 2})) == {"/a": 1}
    assert list(tree.match_filters({})) == []


def test_retained_walks_count_the_nodes_they_visit_and_skip_what_cannot_match():
    """``visited``: the work of the last walk, whatever it found (the broker charges it). A
    walk for literal filters visits only their own levels, however many topics sit beside
    them; a "+" visits every node at its level."""
    tree = RetainedTree()
    for i in range(1000):
        tree.set(f"r{i}/v", i)
    assert dict(tree.match_filters({"r5/v": 1, "r7/v": 0})) == {5: 1, 7: 0}
    assert tree.visited == 4                                # r5, r5/v, r7, r7/v
    assert list(tree.match_filters({f"+/f{j}": 0 for j in range(500)})) == []
    assert 1000 <= tree.visited <= 1000 + 10                # every r<i>, none of the v below
    assert list(tree.match("+/+/none")) == [] and tree.visited >= 2000
    assert sorted(tree.match("r1/#")) == [1] and tree.visited <= 5


@settings(max_examples=300, deadline=None)
@given(st.lists(TOPIC, max_size=10), st.lists(TOPIC, max_size=4), topic_filters())
def test_retained_tree_agrees_with_brute_force(stored, deleted, topic_filter):
    tree = RetainedTree()
    present = set()
    for topic in stored:
        tree.set(topic, topic)
        present.add(topic)
    for topic in deleted:
        assert tree.delete(topic) == (topic in present)
        present.discard(topic)
    assert tree.count == len(present)
    assert sorted(tree.values()) == sorted(present)     # "$" topics too
    expected = sorted(t for t in present if topic_matches(topic_filter, t))
    assert sorted(tree.match(topic_filter)) == expected
    for topic in present:
        assert tree.get(topic) == topic


def test_very_deep_topics_do_not_recurse():
    deep = "/".join(["d"] * 5000)
    trie = SubscriptionTrie()
    trie.add("#", "all", 0)
    trie.add(deep, "exact", 1)
    trie.add("d/+/" + "/".join(["d"] * 4998), "plus", 2)
    assert dict(trie.match(deep)) == {"all": 0, "exact": 1, "plus": 2}
    tree = RetainedTree()
    tree.set(deep, "v")
    assert list(tree.match("#")) == ["v"]
    assert list(tree.match("d/+/#")) == ["v"]
    assert list(tree.match(deep)) == ["v"]
    assert tree.delete(deep) and tree.count == 0


def test_retained_changes_stay_bounded_by_the_limit_or_the_messages_held():
    """Topics set and cleared are listed in ``changed`` until the owner takes it; past
    CHANGED_LIMIT (and past the messages held) the list is dropped for ``all_changed``, so
    set+clear on ever new topics does not grow it."""
    tree = RetainedTree()
    for i in range(3 * CHANGED_LIMIT):
        tree.set(f"churn/{i}", i)
        tree.delete(f"churn/{i}")
        assert len(tree.changed) <= CHANGED_LIMIT + 1
    assert tree.all_changed and tree.count == 0
    # More messages held than the limit: every one of them may be listed.
    tree = RetainedTree()
    for i in range(2 * CHANGED_LIMIT):
        tree.set(f"held/{i}", i)
    assert not tree.all_changed and len(tree.changed) == 2 * CHANGED_LIMIT
    tree.delete("held/0")
    assert tree.all_changed and tree.changed == set()
