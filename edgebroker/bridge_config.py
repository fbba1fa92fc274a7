"""A ``[[bridge]]`` table of the configuration: a link to a remote MQTT broker (edgebroker.bridge,
docs/bridge.md), its topic rules (``topic`` = a list of tables, like Mosquitto's ``topic``
lines), and the rules between its keys. ``edgebroker.config`` builds bridges from the file
with these."""

from __future__ import annotations

import socket

from edgebroker.config_fields import at_least, between, file_path, one_of, setting
from edgebroker.errors import shown
from edgebroker.records import record

DIRECTIONS = ("out", "in", "both")
# An MQTT string (a topic, the client id, the user name; the password's binary data) is at
# most this many bytes (a 2-byte length).
MAX_FIELD_BYTES = 65535


def check_bridge_name(value):
    """A bridge's name is part of its checkpoint file's name and of its metrics' labels."""
    if (not value or len(value) > 64
            or any(not (ch.isascii() and (ch.isalnum() or ch in "_-")) for ch in value)):
        return "must be 1 to 64 of the letters A-Z and a-z, digits, '_' and '-'"
    return None


def check_remote_address(value):
    host, sep, port = value.rpartition(":")
    if (not sep or not host.strip("[]") or not (port.isascii() and port.isdigit())
            or not 0 < int(port) < 65536):
        return "expected HOST:PORT (a port between 1 and 65535; [V6]:PORT for IPv6)"
    return None


def split_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def _check_mqtt_string(value, text: bool = True):
    """What MQTT forbids in a string field (section 1.5.3): over 65,535 bytes of UTF-8, and
    (``text``: not the password's binary data) U+0000."""
    if text and "\x00" in value:
        return "must not contain U+0000 (MQTT forbids it in its strings)"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_FIELD_BYTES:
        return f"is {size} bytes of UTF-8, over MQTT's {MAX_FIELD_BYTES}"
    return None




def _check_filter(value):
    if not value:
        return "must not be empty"
    problem = _check_mqtt_string(value)
    if problem:
        return problem
    levels = value.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be a whole level and the last one"
        if "+" in level and level != "+":
            return "'+' must be a whole level"
    return None


def _check_prefix(value):
    if "#" in value or "+" in value:
        return "must not contain the wildcards '#' or '+'"
    return _check_mqtt_string(value)


def _check_keepalive(value):
    if value == 0:
        return ("must be 1 to 65535 seconds: 0 (no keepalive) is refused for a bridge, whose "
                "link would then stay half-open for ever after a silent network failure")
    return between(1, 65535)(value)


@record(frozen=True)
class TopicRule:
    pattern: str = setting("", _check_filter, doc="topic filter, without the prefixes "
                                                   "(\"sensors/#\")")
    direction: str = setting("out", one_of(*DIRECTIONS),
                             doc="out: local to remote; in: remote to local; both")
    qos: int = setting(1, between(0, 2), doc="QoS of the forwarded PUBLISH (out) and of the "
                                             "remote subscription (in)")
    local_prefix: str = setting("", _check_prefix, doc="put before the pattern on this broker")
    remote_prefix: str = setting("", _check_prefix, doc="put before the pattern on the remote")

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.pattern

    @property
    def outbound(self) -> bool:
        return self.direction != "in"

    @property
    def inbound(self) -> bool:
        return self.direction != "out"


@record(frozen=True)
class BridgeConfig:
    name: str = setting("", check_bridge_name,
                        doc="the bridge's name: in its checkpoint file (bridge-NAME.json), logs "
                            "and metrics; unique")
    address: str = setting("", check_remote_address,
                           doc="the remote broker, HOST:PORT (a name is resolved off the core "
                               "thread)")
    client_id: str = setting("", doc="client id on the remote (empty: HOSTNAME.NAME, as "
                                     "Mosquitto); also the publisher id of what the bridge "
                                     "publishes here. Two bridges with one client id take over "
                                     "each other's session on the remote")
    protocol_version: int = setting(
        4, one_of(4, 5), doc="4: MQTT 3.1.1, 5: MQTT 5.0 (No Local on the remote subscriptions)")
    try_private: bool = setting(
        True, doc="MQTT 3.1.1: send Mosquitto's bridge marker (CONNECT protocol level 0x84), so "
                  "that a Mosquitto or edgebroker remote sends the bridge nothing it published "
                  "there and keeps the retain flag as published; a remote that refuses it "
                  "(CONNACK 0x01) is connected to again without it. Refused with "
                  "protocol_version 5 (No Local does it there)")
    username: str = setting("", doc="user name on the remote (empty: none)")
    password: str = setting("", doc="password on the remote (with username)")
    keepalive: int = setting(60, _check_keepalive,
                             doc="seconds (1 to 65535): PINGREQ when idle, reconnect without "
                                 "PINGRESP; 0 is refused")
    clean_start: bool = setting(
        False, doc="a new session on the remote at each connect (false: the remote keeps the "
                   "bridge's subscriptions and QoS 1/2 messages while the link is down; on "
                   "MQTT 5.0 for session_expiry seconds)")
    session_expiry: int = setting(
        0xFFFFFFFF, between(0, 0xFFFFFFFF),
        doc="MQTT 5.0 with clean_start false: the Session Expiry Interval sent in CONNECT, "
            "seconds the remote keeps the session after the link drops (4294967295: never "
            "expires, as Mosquitto's bridge keeps its session; 0: ends with the link)")
    cafile: str = setting(
        "", file_path, doc="PEM CA certificate(s) the remote's certificate must chain to; "
                           "makes the link TLS")
    certfile: str = setting(
        "", file_path, doc="PEM client certificate for the remote (with cafile)")
    keyfile: str = setting(
        "", file_path, doc="PEM key of certfile (empty: the key is in certfile)")
    tls_verify: bool = setting(True, doc="check the remote's certificate and host name "
                                         "(false: encrypted but not authenticated)")
    window: int = setting(100, between(1, 65535),
                          doc="QoS 1/2 messages sent and not yet acknowledged by the remote")
    bandwidth: int = setting(0, at_least(0), doc="bytes per second the bridge may send on "
                                                 "average; 0: unlimited")
    checkpoint_interval: float = setting(
        1.0, between(0.01, 3600), doc="seconds between writes of the bridge's cursor; after a "
                                      "crash what was acknowledged since is sent again")
    connect_timeout: float = setting(
        30.0, between(0.1, 3600), doc="seconds from the start of a connect to the remote's "
                                      "CONNACK (TCP connect, TLS handshake, MQTT CONNECT); "
                                      "then the attempt fails and is retried with back-off")
    reconnect_min: float = setting(1.0, between(0.01, 3600),
                                   doc="seconds: the first reconnect back-off")
    reconnect_max: float = setting(60.0, between(0.01, 86400),
                                   doc="seconds: the longest reconnect back-off (full jitter)")
    topic: tuple[TopicRule, ...] = setting((), doc="topic rules: a list of tables {pattern, "
                                                   "direction, qos, local_prefix, remote_prefix}")

    @property
    def remote_client_id(self) -> str:
        return self.client_id or f"{socket.gethostname()}.{self.name}"


_TLS_ONLY = ("certfile", "keyfile", "tls_verify")


def all_bridge_problems(bridges, raw: list, refused: list[str]) -> list[str]:
    """The rules between the keys of each [[bridge]] table and between the tables (a name
    used twice), for the tables with errors of their own too (``refused``: the problems of
    their keys), so that a file's problems are all said at once. A rule that reads a refused
    key (at its default in ``bridges``) is not checked, nor a table that is not a table."""
    problems: list[str] = []
    names = set()
    for i, (bridge, given) in enumerate(zip(bridges, raw)):
        name = f"bridge[{i}]"
        if not isinstance(given, dict):
            continue
        keys = frozenset(p[len(name) + 1:].partition(": ")[0] for p in refused
                         if p.startswith(f"{name}."))
        problems += bridge_problems(bridge, given, name, keys)
        if "name" not in keys and "name" in given:   # (a missing one is said as required)
            if bridge.name in names:
                problems.append(f"{name}.name: {bridge.name!r} is used by another bridge")
            names.add(bridge.name)
    return problems


def bridge_problems(bridge: BridgeConfig, given: dict, name: str,
                    refused: frozenset = frozenset()) -> list[str]:
    """What breaks the rules between the keys of one [[bridge]] table; the rules that read a
    key in ``refused`` (``keepalive``, ``topic[0].qos``: its value was refused) are skipped."""
    def ok(*keys):
        return refused.isdisjoint(keys)

    problems = []
    for key in ("name", "address"):
        if key not in given:
            problems.append(f"{name}.{key}: required")
    if "topic" not in given:
        problems.append(f"{name}.topic: required (at least one topic rule)")
    elif not bridge.topic and ok("topic"):
        problems.append(f"{name}.topic: bridge {bridge.name!r} has no topic rule (at least one "
                        f"is required)")
    problems += [f"{name}.topic[{j}].pattern: required" for j, rule in enumerate(bridge.topic)
                 if not rule.pattern and ok(f"topic[{j}]", f"topic[{j}].pattern")]
    for j, rule in enumerate(bridge.topic):
        for key, prefix, joined in (("local_prefix", rule.local_prefix, rule.local_filter),
                                    ("remote_prefix", rule.remote_prefix, rule.remote_filter)):
            problem = _check_filter(joined) if prefix and rule.pattern else None
            if problem and ok(f"topic[{j}]", f"topic[{j}].pattern", f"topic[{j}].{key}"):
                how = ("which " if problem.startswith("is ") else "where ") + problem
                if how.startswith("where "):
                    how += " (end the prefix with '/')"
                problems.append(f"{name}.topic[{j}].{key}: {shown(prefix, 60)} before the pattern "
                                f"{shown(rule.pattern, 60)} makes the filter {shown(joined, 60)}, "
                                f"{how}")
    if not bridge.cafile and ok("cafile"):
        problems += [f"{name}.{key}: needs cafile (TLS settings apply only to a TLS link)"
                     for key in _TLS_ONLY if key in given]
    if bridge.keyfile and not bridge.certfile and ok("certfile"):
        problems.append(f"{name}.keyfile: needs certfile")
    for key, text in (("client_id", True), ("username", True), ("password", False)):
        # (checked here: a field's own check would show its value, and this is the password)
        problem = _check_mqtt_string(getattr(bridge, key), text)
        if problem:
            problems.append(f"{name}.{key}: bridge {bridge.name!r}: {problem}")
    if "try_private" in given and bridge.protocol_version == 5 and ok("protocol_version"):
        problems.append(f"{name}.try_private: only for protocol_version 4 (MQTT 3.1.1): on "
                        f"MQTT 5.0 the remote subscriptions have No Local and Retain As "
                        f"Published")
    if bridge.password and not bridge.username and ok("username"):
        problems.append(f"{name}.password: needs username")
    if bridge.reconnect_max < bridge.reconnect_min and ok("reconnect_min", "reconnect_max"):
        problems.append(f"{name}.reconnect_max: must be at least reconnect_min "
                        f"({bridge.reconnect_min:g}), got {bridge.reconnect_max:g}")
    return problems


def bridge_warnings(bridges) -> list[str]:
    """What is allowed but does not do what it seems: an ``out`` rule whose local filter can
    match only ``$SYS`` topics (this broker's own ``$SYS`` messages are not written to the
    commit log, which the bridge reads), on MQTT 5.0 two ``in`` rules whose remote filters
    overlap (the remote sends a message both match once per subscription, and each copy is
    published here), and two bridges that can pass a message round between them
    (``looping_bridges``): docs/bridge.md."""
    warnings = [f"bridge[{i}].topic[{j}]: bridge {bridge.name!r}: the out rule's filter "
                f"{shown(rule.local_filter, 60)} matches only $SYS topics, which this broker "
                f"does not write to its log: the rule forwards nothing (docs/bridge.md)"
                for i, bridge in enumerate(bridges) for j, rule in enumerate(bridge.topic)
                if rule.outbound and rule.local_filter.startswith("$SYS")]
    for i, bridge in enumerate(bridges):
        if bridge.protocol_version == 5:
            warnings += overlapping_in_rules(bridge, i)
    return warnings + looping_bridges(bridges)


def _remote_key(address: str):
    """(host in lower case, port) of a valid address, else None."""
    if check_remote_address(address) is not None:
        return None
    host, port = split_address(address)
    return host.lower(), port


def looping_bridges(bridges) -> list[str]:
    """A warning per two bridges that can pass a message round between them for ever (each
    takes in what the other sends out, over rules that cover the same topics both ways):

    - two bridges to the same remote (one address): No Local and the bridge marker work per
      session, so what one publishes there comes in through the other;
    - two MQTT 3.1.1 bridges with ``try_private = false``: each remote sends its bridge back
      what that bridge published there, and the other bridge forwards it."""
    def feeds(a, b, remote):
        """Some message b takes in that a sends out: on the remote (``remote``), else here."""
        return any(filters_overlap(i.remote_filter if remote else i.local_filter,
                                   o.remote_filter if remote else o.local_filter)
                   for i in b.topic if i.inbound for o in a.topic if o.outbound)

    def echoes(a):
        """The remote sends ``a`` back some of what it publishes there (no marker)."""
        return feeds(a, a, True)

    warnings = []
    for i, a in enumerate(bridges):
        for k in range(i + 1, len(bridges)):
            b = bridges[k]
            head = f"bridge[{i}] and bridge[{k}]: bridges {a.name!r} and {b.name!r}"
            remote = _remote_key(a.address)
            if remote is not None and remote == _remote_key(b.address):
                if feeds(a, b, True) or feeds(b, a, True):
                    warnings.append(f"{head} both connect to {a.address}: what one publishes "
                                    f"there comes in through the other (No Local and the bridge "
                                    f"marker work per session), and where their rules cover "
                                    f"the same topics both ways a message goes round for ever, "
                                    f"whatever the protocol_version; use one bridge per remote "
                                    f"(docs/bridge.md, Loops)")
            elif (not (a.protocol_version == 5 or a.try_private)
                  and not (b.protocol_version == 5 or b.try_private)
                  and feeds(a, b, False) and feeds(b, a, False) and echoes(a) and echoes(b)):
                warnings.append(f"{head} are MQTT 3.1.1 bridges with try_private = false whose "
                                f"rules cover the same topics both ways: each remote sends its "
                                f"bridge back what that bridge published there, the other "
                                f"bridge forwards it, and a message goes round for ever; keep "
                                f"try_private = true (a Mosquitto or edgebroker remote) or use "
                                f"protocol_version = 5 (docs/bridge.md, Loops)")
    return warnings


def overlapping_in_rules(bridge: BridgeConfig, i: int) -> list[str]:
    """A warning per two ``in`` rules whose (different) remote filters some topic matches
    both (the same filter twice is one subscription at the remote: one copy)."""
    into = [(j, rule.remote_filter) for j, rule in enumerate(bridge.topic) if rule.inbound]
    return [f"bridge[{i}].topic[{j}] and topic[{k}]: bridge {bridge.name!r} (MQTT 5.0): the in "
            f"rules' remote filters {shown(first, 60)} and {shown(second, 60)} overlap: the "
            f"remote sends a message both match once per rule, and each copy is published "
            f"here (duplicates, under the first rule's topic); rules that do not overlap "
            f"avoid it (docs/bridge.md)"
            for n, (j, first) in enumerate(into) for k, second in into[n + 1:]
            if first != second and filters_overlap(first, second)]


def filters_overlap(first: str, second: str) -> bool:
    """True if some topic name matches both valid (non-shared) filters (as
    mqtt.topics.topic_matches, below it in the layers, matches one): level by level, a
    ``+`` takes any one level and a ``#`` the rest (none too: ``a/#`` matches ``a``); a
    leading wildcard takes no level that starts with ``$`` (MQTT-4.7.2-1)."""
    a, b = first.split("/"), second.split("/")
    if (a[0][:1] == "$" and b[0] in ("+", "#")) or (b[0][:1] == "$" and a[0] in ("+", "#")):
        return False
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b):     # one ended: the other's "#" takes the parent level
            return (a if i < len(a) else b)[i] == "#"
        x, y = a[i], b[i]
        if x == "#" or y == "#":
            return True
        if x != y and x != "+" and y != "+":
            return False
    return True
