"""Topic trees: who is subscribed to what, and which retained messages match.

``SubscriptionTrie`` maps topic filters to subscribers and answers "who wants
this topic name?" by walking one path per wildcard branch, so a lookup costs
O(topic depth × wildcard branches), not O(subscriptions). Results are cached
per topic name (names of up to ``CACHED_TOPIC_LENGTH`` characters) until the next
subscription change.

``RetainedTree`` is the mirror image: it stores one message per topic name
and answers "which stored topics match this filter?", or these filters
(``match_filters``: one walk for them all, each stored value once).

Both follow MQTT-4.7.2-1: a filter starting with a wildcard does not match a
topic name starting with ``$``.
"""

from __future__ import annotations

from collections.abc import Iterator

TYPE_CHECKING = False   # typing is imported by type checkers only (the broker's memory)
if TYPE_CHECKING:
    from typing import Any

# Cached lookups are dropped wholesale beyond this many topics, which bounds
# memory when devices publish to very many distinct topics.
CACHE_LIMIT = 65536
# Longer topic names are not cached: a cache of 65,536 names of up to 64 KiB each could hold
# 4 GiB. So the cache holds at most CACHE_LIMIT x 256 characters of names (up to 64 MiB of
# UTF-8 text). Walking the trie for a name not cached costs its levels for each wildcard branch
# that matches: with overlapping '+' filters, every matching filter's nodes, so up to the
# matching filters x their levels (bounded per session by max_subscriptions_per_client x
# max_topic_levels: 1,000 filters of 128 levels that all match, ~128,000 nodes, tens of ms
# per PUBLISH), as in Mosquitto.
CACHED_TOPIC_LENGTH = 256
# RetainedTree.changed holds at most this many topics, or as many as the tree holds messages
# when that is more. Past it the set is dropped and ``all_changed`` set: the owner then takes
# every stored message instead, so setting and clearing retained messages on ever new topics
# does not grow the set between two snapshots.
CHANGED_LIMIT = 4096


class _Node:
    __slots__ = ("children", "subscribers")

    def __init__(self):
        self.children: dict[str, _Node] = {}
        self.subscribers: dict[Any, int] = {}


class SubscriptionTrie:
    def __init__(self):
        self._root = _Node()
        self._cache: dict[str, list[tuple[Any, int]]] = {}
        self.count = 0  # (filter, subscriber) pairs

    def add(self, topic_filter: str, subscriber: Any, qos: int) -> bool:
        """Subscribe; returns True if this replaced an existing subscription."""
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        replaced = subscriber in node.subscribers
        node.subscribers[subscriber] = qos
        if not replaced:
            self.count += 1
        self._cache.clear()
        return replaced

    def remove(self, topic_filter: str, subscriber: Any) -> bool:
        """Unsubscribe; returns True if the subscription existed."""
        path = [self._root]
        levels = topic_filter.split("/")
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return False
            path.append(child)
        if path[-1].subscribers.pop(subscriber, None) is None:
            return False
        self.count -= 1
        self._cache.clear()
        # Prune nodes left with neither subscribers nor children.
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.subscribers or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return True

    def match(self, topic: str) -> list[tuple[Any, int]]:
        """Subscribers of ``topic`` with the highest QoS among their matching filters."""
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        found: dict[Any, int] = {}
        levels = topic.split("/")
        depth = len(levels)
        dollar = topic.startswith("$")
        # Iterative walk (topics may have thousands of levels): each entry is a
        # node whose path matched levels[:i].
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            if i == depth:
                _merge(found, node.subscribers)
                # "a/#" also matches "a" itself.
                hash_node = children.get("#")
                if hash_node is not None:
                    _merge(found, hash_node.subscribers)
                continue
            if not children:
                continue
            exact = children.get(levels[i])
            if exact is not None:
                stack.append((exact, i + 1))
            if dollar and i == 0:
                continue  # MQTT-4.7.2-1: no leading wildcard matches a $ topic
            hash_node = children.get("#")
            if hash_node is not None:
                _merge(found, hash_node.subscribers)
            plus = children.get("+")
            if plus is not None:
                stack.append((plus, i + 1))
        result = list(found.items())
        if len(topic) <= CACHED_TOPIC_LENGTH:
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[topic] = result
        return result


def _merge(found: dict, subscribers: dict):
    for sub, qos in subscribers.items():
        if found.get(sub, -1) < qos:
            found[sub] = qos


class _RNode:
    __slots__ = ("children", "value")

    def __init__(self):
        self.children: dict[str, _RNode] = {}
        self.value: Any = None


class _FNode:
    """A node of the filters ``RetainedTree.match_filters`` takes: its children by level, and
    the highest QoS of a filter ending here (-1: none)."""
    __slots__ = ("children", "qos")

    def __init__(self):
        self.children: dict[str, _FNode] = {}
        self.qos = -1


def _ends(nodes) -> int:
    """The highest QoS that filter nodes ``nodes`` give a value at their level: a filter
    ending there, or one going on with "#" ("a/#" matches "a")."""
    best = -1
    for node in nodes:
        if node.qos > best:
            best = node.qos
        hash_node = node.children.get("#")
        if hash_node is not None and hash_node.qos > best:
            best = hash_node.qos
    return best


class RetainedTree:
    def __init__(self):
        self._root = _RNode()
        self.count = 0
        # Topics set or deleted since the owner last took this set (the broker's snapshot
        # takes only what changed); at most one entry per topic. When more than
        # CHANGED_LIMIT and than ``count`` changed, the set is emptied and no longer kept,
        # and ``all_changed`` is True (take everything) until the owner resets both.
        self.changed: set[str] = set()
        self.all_changed = False
        # Nodes the last match / match_filters walk visited (once it ran to its end): the
        # work it took, whatever it found (the broker charges it to the subscriber).
        self.visited = 0

    def set(self, topic: str, value: Any) -> None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _RNode()
            node = child
        if node.value is None:
            self.count += 1
        node.value = value
        if not self.all_changed:
            self._change(topic)

    def _change(self, topic: str) -> None:
        changed = self.changed
        changed.add(topic)
        if len(changed) > CHANGED_LIMIT and len(changed) > self.count:
            self.changed = set()
            self.all_changed = True

    def get(self, topic: str) -> Any:
        node = self._root
        for level in topic.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.value

    def delete(self, topic: str) -> bool:
        levels = topic.split("/")
        path = [self._root]
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return False
            path.append(child)
        if path[-1].value is None:
            return False
        path[-1].value = None
        self.count -= 1
        if not self.all_changed:
            self._change(topic)
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.value is not None or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return True

    def values(self) -> Iterator[Any]:
        """Every stored value, "$" topics too (in no particular order)."""
        below = [self._root]
        while below:
            node = below.pop()
            if node.value is not None:
                yield node.value
            below.extend(node.children.values())

    def match(self, topic_filter: str) -> Iterator[Any]:
        """Stored values whose topic matches ``topic_filter``."""
        levels = topic_filter.split("/")
        depth = len(levels)
        visited = 0
        # Iterative walk (topics may have thousands of levels).
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            visited += 1
            if i == depth:
                if node.value is not None:
                    yield node.value
                continue
            level = levels[i]
            if level == "#":
                # The parent level itself ("a/#" matches "a"), then everything below.
                if i > 0 and node.value is not None:
                    yield node.value
                below = [child for name, child in node.children.items()
                         if not (i == 0 and name.startswith("$"))]
                while below:
                    child = below.pop()
                    visited += 1
                    if child.value is not None:
                        yield child.value
                    below.extend(child.children.values())
            elif level == "+":
                for name, child in node.children.items():
                    if not (i == 0 and name.startswith("$")):
                        stack.append((child, i + 1))
            else:
                child = node.children.get(level)
                if child is not None:
                    stack.append((child, i + 1))
        self.visited = visited

    def match_filters(self, filters: dict[str, int]) -> Iterator[tuple[Any, int]]:
        """(stored value, QoS) for each value whose topic matches any of ``filters`` (filter
        -> QoS), once, with the highest QoS of the filters it matches. One walk of the tree
        for all of them: the filters are put in a tree of their own and walked alongside; at
        each node only the children some filter can match are visited (all of them under a
        wildcard), and what a set of filter nodes can meet is worked out once per set.
        ``visited`` then holds how many nodes the walk took."""
        root = _FNode()
        for topic_filter, qos in filters.items():
            node = root
            for level in topic_filter.split("/"):
                child = node.children.get(level)
                if child is None:
                    child = node.children[level] = _FNode()
                node = child
            if node.qos < qos:
                node.qos = qos
        # Each entry: a node of this tree, the filter nodes its path matched, and the QoS of
        # the "#" filters matched above it (-1: none), which every value below it gets.
        stack: list = [(self._root, (root,), -1)]
        # What a set of filter nodes lets the next level meet, made once per set (many nodes
        # of this tree meet the same set): their literal children by level, their "+"
        # children, and the QoS of their "#" children.
        plans: dict[tuple, tuple] = {}
        visited = 0
        while stack:
            rnode, fnodes, below = stack.pop()
            top = rnode is self._root
            key = tuple(map(id, fnodes))
            plan = plans.get(key)
            if plan is None:
                literal: dict[str, list] = {}
                plus = []
                hashed = -1
                for fnode in fnodes:
                    for name, child in fnode.children.items():
                        if name == "+":
                            plus.append(child)
                        elif name == "#":
                            if child.qos > hashed:
                                hashed = child.qos
                        else:
                            found = literal.get(name)
                            if found is None:
                                literal[name] = [child]
                            else:
                                found.append(child)
                plan = plans[key] = (literal, plus, hashed, _ends(plus))
            literal, plus, hashed, plus_ends = plan
            children = rnode.children
            if plus or hashed >= 0 or below >= 0:
                meet = children.items()         # any level may match
            elif len(literal) < len(children):  # only the filters' own levels can
                meet = [(name, children[name]) for name in literal if name in children]
            else:
                meet = [(name, child) for name, child in children.items() if name in literal]
            for name, rchild in meet:
                visited += 1
                # MQTT-4.7.2-1: no leading wildcard matches a "$" topic.
                wild = not (top and name.startswith("$"))
                exact = literal.get(name, ())
                if wild:
                    child_below = hashed if hashed > below else below
                    nodes = plus + exact if exact else plus
                    ends = max(plus_ends, _ends(exact)) if exact else plus_ends
                else:
                    child_below, nodes, ends = below, exact, _ends(exact)
                qos = ends if ends > child_below else child_below
                if qos >= 0 and rchild.value is not None:
                    yield rchild.value, qos
                if not rchild.children:
                    continue
                if nodes:
                    stack.append((rchild, nodes, child_below))
                elif child_below >= 0:
                    # Only a "#" above: everything below matches with its QoS.
                    under = list(rchild.children.values())
                    while under:
                        node = under.pop()
                        visited += 1
                        if node.value is not None:
                            yield node.value, child_below
                        under.extend(node.children.values())
        self.visited = visited
