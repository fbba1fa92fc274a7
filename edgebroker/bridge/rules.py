"""A bridge's topic rules (``[[bridge]] topic``, Mosquitto's ``topic`` lines): which local
topics go out and under which remote name, which remote filters are subscribed to and under
which local name messages from them are published.

Going out, a local topic ``local_prefix + T`` that the rule's local filter
(``local_prefix + pattern``) matches is sent as ``remote_prefix + T``; coming in, a remote
topic ``remote_prefix + T`` that its remote filter matches is published here as
``local_prefix + T``. The filters match as a subscription does (MQTT 4.7): only a topic whose
*first* character is ``$`` is kept from a leading wildcard, so with ``local_prefix = "a/"``
and the pattern ``#``, ``a/$x`` and ``a/`` go out (as ``b/$x`` and ``b/`` with
``remote_prefix = "b/"``), and ``a`` (the parent level ``#`` matches) goes out as ``b``.
The first rule that matches decides (as in Mosquitto, where rules are tried in order).

A mapped topic may be no valid topic name (over 65,535 bytes of UTF-8 once the prefix is
added; empty: the parent level with an empty other prefix): ``outgoing`` says why, and the
bridge skips that message and counts it (``unsendable``).
"""

from __future__ import annotations

from edgebroker.errors import ProtocolError
from edgebroker.mqtt.topics import topic_matches, validate_topic_name

# Topic decisions kept (dropped wholesale beyond it): a bridge sees the same topics over and over.
CACHE_LIMIT = 4096


class Rules:
    def __init__(self, rules):
        self.out = [r for r in rules if r.outbound]
        self.into = [r for r in rules if r.inbound]
        self._out_cache: dict[bytes, tuple | None] = {}

    def scan_filter(self) -> bytes | None:
        """The filter the log's scanner can apply for the outbound side (one rule), else None
        (every record is looked at by ``outgoing``)."""
        if len(self.out) == 1:
            return self.out[0].local_filter.encode("utf-8")
        return None

    def outgoing(self, topic: bytes) -> tuple[str, int, str | None] | None:
        """(remote topic, QoS, problem) for a local record's topic, or None: no out rule
        matches it. ``problem``: why the remote topic is no valid topic name (the message
        cannot be sent), else None."""
        cache = self._out_cache
        found = cache.get(topic, False)
        if found is not False:
            return found
        name = topic.decode("utf-8", "replace")
        found = None
        for rule in self.out:
            remote = mapped(name, rule.local_filter, rule.local_prefix, rule.remote_prefix)
            if remote is not None:
                found = (remote, rule.qos, topic_problem(remote))
                break
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        cache[topic] = found
        return found

    def subscriptions(self) -> list[tuple[str, int]]:
        """(remote filter, QoS) of the inbound rules, in order, each filter once."""
        seen = {}
        for rule in self.into:
            seen.setdefault(rule.remote_filter, rule.qos)
        return list(seen.items())

    def incoming(self, topic: str) -> str | None:
        """The local topic a message on remote ``topic`` is published under, or None (no
        inbound rule matches it: a remote that sends what was not asked for)."""
        for rule in self.into:
            local = mapped(topic, rule.remote_filter, rule.remote_prefix, rule.local_prefix)
            if local is not None:
                return local
        return None


def mapped(topic: str, topic_filter: str, prefix: str, other: str) -> str | None:
    """``topic`` under the other side's prefix when ``topic_filter`` (``prefix + pattern``)
    matches it, else None. The one match without ``prefix`` in front is the parent level a
    trailing ``#`` matches (``a`` for ``a/#``): the other prefix's parent level ("" when
    the other prefix is empty or has no '/' at its end: no valid topic)."""
    if not topic_matches(topic_filter, topic):
        return None
    if topic.startswith(prefix):
        return other + topic[len(prefix):]
    return other[:-1] if other.endswith("/") else ""


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` is no valid topic name (MQTT 4.7.3), else None."""
    try:
        validate_topic_name(topic)
    except ProtocolError as exc:
        return str(exc)
    return None
