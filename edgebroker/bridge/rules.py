"""A bridge's topic rules (``[[bridge]] topic``, Mosquitto's ``topic`` lines): which local
topics go out and under which remote name, which remote filters are subscribed to and under
which local name messages from them are published.

A rule's ``pattern`` is matched without the prefixes: going out, a local topic
``local_prefix + T`` whose ``T`` matches the pattern is sent as ``remote_prefix + T``; coming
in, a remote topic ``remote_prefix + T`` is published here as ``local_prefix + T``. The first
rule that matches decides (as in Mosquitto, where rules are tried in order).
"""

from __future__ import annotations

from edgebroker.mqtt.topics import topic_matches

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

    def outgoing(self, topic: bytes) -> tuple[str, int] | None:
        """(remote topic, QoS) for a local record's topic, or None: not forwarded."""
        cache = self._out_cache
        found = cache.get(topic, False)
        if found is not False:
            return found
        name = topic.decode("utf-8", "replace")
        found = None
        for rule in self.out:
            if name.startswith(rule.local_prefix):
                rest = name[len(rule.local_prefix):]
                if rest and topic_matches(rule.pattern, rest):
                    found = (rule.remote_prefix + rest, rule.qos)
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
            if topic.startswith(rule.remote_prefix):
                rest = topic[len(rule.remote_prefix):]
                if rest and topic_matches(rule.pattern, rest):
                    return rule.local_prefix + rest
        return None
