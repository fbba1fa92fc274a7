"""Which of one session's topic filters match a topic name, compiled (``FilterSet``).

Routing finds a message's subscribers in the broker's subscription trie; some decisions then
need the session's own matching filters: the 5.0 options of each (No Local, Retain As
Published, core.router5), their Subscription Identifiers, and, for a session reading the log,
the QoS each grants and the offset it was subscribed at (core.cursor). Going through all of a
session's filters for each message costs filters x levels (1,000 filters of 128 levels:
milliseconds per message); ``FilterSet`` is a small trie of one session's filters that answers
in about the topic's levels plus the matching filters' own nodes, as the subscription trie does.

``matching_filters`` builds a session's set when first asked (``Session.filter_set``);
SUBSCRIBE and UNSUBSCRIBE keep it up to date (core.sessions). A session with few filters
(``SMALL``) goes through them instead: cheaper than a trie, and no memory for it.

A walk that visits many nodes (overlapping wildcard filters, up to filters x levels) has its
answer remembered for the topic (``SLOW_WALK``), within ``CACHE_ENTRIES`` filters in all per
session (dropped wholesale beyond): a publisher repeating such a topic costs one lookup.
"""

from __future__ import annotations

from edgebroker.mqtt.topics import topic_matches
from edgebroker.mqtt.trie import CACHED_TOPIC_LENGTH

# Sessions with at most this many filters are matched filter by filter.
SMALL = 8
# A walk visiting more nodes than this is remembered for its topic...
SLOW_WALK = 256
# ... within this many matching filters remembered per session (topics count one each).
CACHE_ENTRIES = 4096
# The small sessions' (filter, topic) decisions remembered, for all sessions: at most this many.
_MATCHES_LIMIT = 1024
_matches: dict = {}


def _matching(topic_filter: str, topic: str) -> bool:
    """``topic_matches``, remembered for topics of up to CACHED_TOPIC_LENGTH characters."""
    key = (topic_filter, topic)
    found = _matches.get(key)
    if found is None:
        found = topic_matches(topic_filter, topic)
        if len(topic) <= CACHED_TOPIC_LENGTH:
            if len(_matches) >= _MATCHES_LIMIT:
                _matches.clear()
            _matches[key] = found
    return found


class _Node:
    __slots__ = ("children", "filter")

    def __init__(self):
        self.children: dict[str, _Node] = {}
        self.filter: str | None = None      # the filter ending here, if any


class FilterSet:
    """A compiled set of (valid) topic filters: ``match`` gives those matching a topic name,
    each once, in no particular order."""

    __slots__ = ("_root", "size", "_cache", "_cached")

    def __init__(self, filters=()):
        self._root = _Node()
        self.size = 0
        self._cache: dict[str, tuple] = {}
        self._cached = 0
        for topic_filter in filters:
            self.add(topic_filter)

    def add(self, topic_filter: str) -> None:
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if node.filter is None:
            node.filter = topic_filter
            self.size += 1
            self._forget()

    def remove(self, topic_filter: str) -> None:
        levels = topic_filter.split("/")
        path = [self._root]
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return
            path.append(child)
        if path[-1].filter is None:
            return
        path[-1].filter = None
        self.size -= 1
        self._forget()
        for depth in range(len(levels), 0, -1):     # prune what leads nowhere now
            node = path[depth]
            if node.filter is not None or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def _forget(self) -> None:
        if self._cached:
            self._cache = {}
            self._cached = 0

    def match(self, topic: str) -> tuple:
        """The filters matching the topic name ``topic`` (MQTT-4.7.2-1: a filter starting
        with a wildcard does not match a name starting with ``$``)."""
        cache = self._cache
        if cache:
            found = cache.get(topic)
            if found is not None:
                return found
        out = []
        levels = topic.split("/")
        depth = len(levels)
        dollar = topic[:1] == "$"
        stack = [(self._root, 0)]
        visited = 0
        while stack:
            node, i = stack.pop()
            visited += 1
            children = node.children
            if i == depth:
                if node.filter is not None:
                    out.append(node.filter)
                hash_node = children.get("#")     # "a/#" matches "a" too
                if hash_node is not None:
                    out.append(hash_node.filter)
                continue
            if not children:
                continue
            exact = children.get(levels[i])
            if exact is not None:
                stack.append((exact, i + 1))
            if dollar and i == 0:
                continue
            hash_node = children.get("#")
            if hash_node is not None:
                out.append(hash_node.filter)
            plus = children.get("+")
            if plus is not None:
                stack.append((plus, i + 1))
        found = tuple(out)
        if visited > SLOW_WALK and len(topic) <= CACHED_TOPIC_LENGTH:
            cost = len(found) + 1
            if self._cached + cost > CACHE_ENTRIES:
                self._cache = cache = {}
                self._cached = 0
            if cost <= CACHE_ENTRIES:
                cache[topic] = found
                self._cached += cost
        return found


def matching_among(filters, topic: str) -> list:
    """Those of ``filters`` (a few) that match ``topic``, in their order."""
    return [f for f in filters if _matching(f, topic)]


def matching_filters(session, topic: str):
    """The filters of ``session`` (its ``subscriptions``) that match ``topic``."""
    subscriptions = session.subscriptions
    if len(subscriptions) <= SMALL:
        return [f for f in subscriptions if _matching(f, topic)]
    compiled = session.filter_set
    if compiled is None or compiled.size != len(subscriptions):
        # (The size differs only if a change bypassed core.sessions: made again.)
        compiled = session.filter_set = FilterSet(subscriptions)
    return compiled.match(topic)


def filter_added(session, topic_filter: str) -> None:
    """``topic_filter`` was added to ``session``'s subscriptions (after the change)."""
    compiled = session.filter_set
    if compiled is not None:
        compiled.add(topic_filter)


def filter_removed(session, topic_filter: str) -> None:
    compiled = session.filter_set
    if compiled is not None:
        compiled.remove(topic_filter)
