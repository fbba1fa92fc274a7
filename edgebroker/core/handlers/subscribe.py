"""SUBSCRIBE and UNSUBSCRIBE: the ACL's say on each filter, the answer, then retained messages.

The broker makes the subscriptions (limits: ``Broker.subscribe``; a new one while the
broker's memory is above memory_limit gets 0x80, in 5.0 0x97); under an ACL
each filter the ACL does not allow gets 0x80 in the SUBACK. Retained messages for
the granted filters follow the SUBACK (``Broker.send_retained``).

A ``$share/<ShareName>/<filter>`` filter is a shared subscription (core.shared), from 3.1.1
and 5.0 clients alike: the ACL is asked about the filter inside it; a bad ShareName gets 0x8F
(3.1.1: 0x80), and so does every one when ``shared_subscriptions`` is off (0x9E); no retained
messages follow. What waits in its group may be sent once the SUBACK is out.

A 3.1/3.1.1 client that connected with the bridge marker (``Client.bridge``: Mosquitto's
``try_private``) gets No Local and Retain As Published on its subscriptions, as Mosquitto
gives a bridge: it is never sent back what it published, and retained messages keep their
flag (5.0's machinery: ``Session.sub5``, core.router5).
"""

from __future__ import annotations

import logging

from edgebroker.errors import (
    NO_SUBSCRIPTION_EXISTED, NOT_AUTHORIZED, PACKET_TOO_LARGE, PROTOCOL_ERROR,
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, SUCCESS, TOPIC_FILTER_INVALID, ProtocolError, shown,
    topic_shown,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt import properties as Q
from edgebroker.mqtt.encode import encode, encode_ack
from edgebroker.mqtt.encode5 import encode5
from edgebroker.mqtt.topics import is_shared, parse_shared

log = logging.getLogger("edgebroker.client")

# A bridge's subscription options (3.1/3.1.1 with the bridge marker).
BRIDGE_OPTIONS = P.SUB_NO_LOCAL | P.SUB_RETAIN_AS_PUBLISHED

# Refused filters are shown up to this many characters in the log (a filter may be 64 KB).
_FILTER_SHOWN = 200


def on_subscribe(client, p: P.Subscribe) -> None:
    broker = client.broker
    broker.settle()
    topics = p.topics
    shared = any(is_shared(f) for f, _ in topics)
    options = BRIDGE_OPTIONS if client.bridge else 0
    if client.acl is None and not shared:
        granted = broker.subscribe(client.session, topics, options=options)
    else:
        granted = _subscribe_each(client, topics, options)
    if options:
        for (topic_filter, _), code in zip(topics, granted):
            if code < 0x80 and not is_shared(topic_filter):
                _set_options(client.session, topic_filter, options, 0)
    client.answer(encode(P.Suback(p.packet_id, granted)))
    broker.stats.packets_sent += 1
    if shared:
        # No retained messages for shared subscriptions; their groups' backlogs may go out.
        broker.send_retained(client.session, topics, [
            P.SUBACK_FAILURE if is_shared(f) else g for (f, _), g in zip(topics, granted)])
        broker.pump_shared(client.session)
    else:
        broker.send_retained(client.session, topics, granted)


def _subscribe_each(client, topics, options: int) -> list[int]:
    """SUBSCRIBE under an ACL or with shared subscriptions: each denied or refused filter
    gets 0x80, the others are made."""
    broker = client.broker
    acl = client.acl
    granted = []
    for topic_filter, qos in topics:
        if is_shared(topic_filter):
            code = _subscribe_shared(client, topic_filter, qos, 0, 0)
            granted.append(code if code < 0x80 else P.SUBACK_FAILURE)
        elif acl is None or acl.can_subscribe(topic_filter):
            granted.extend(broker.subscribe(client.session, [(topic_filter, qos)],
                                            options=options))
        else:
            broker.stats.acl_subscribe_denied += 1
            _log_refused(client, topic_filter, "subscription to %s denied by the ACL "
                         "(SUBACK 0x80)")
            granted.append(P.SUBACK_FAILURE)
    return granted


def on_subscribe5(client, p: P.Subscribe) -> None:
    """A 5.0 SUBSCRIBE: options beyond the QoS (No Local, Retain As Published, Retain
    Handling) and a Subscription Identifier kept per filter (``Session.sub5``); each refused
    filter gets the reason code that says why."""
    broker = client.broker
    broker.settle()
    session = client.session
    acl = client.acl
    sub_id = p.properties.get(Q.SUBSCRIPTION_ID, 0) if p.properties is not None else 0
    codes = []
    shared = False
    retained = []            # (filter, granted QoS) whose retained messages follow
    for topic_filter, options in p.topics:
        if is_shared(topic_filter):
            if options & P.SUB_NO_LOCAL:
                raise ProtocolError(f"SUBSCRIBE to shared subscription "
                                    f"{topic_shown(topic_filter)} with No Local",
                                    rule="MQTT-3.8.3-4", reason=PROTOCOL_ERROR)
            codes.append(_subscribe_shared(client, topic_filter, options & 3,
                                           options & P.SUB_RETAIN_AS_PUBLISHED, sub_id))
            shared = True
            continue
        if acl is not None and not acl.can_subscribe(topic_filter):
            broker.stats.acl_subscribe_denied += 1
            _log_refused(client, topic_filter, "subscription to %s denied by the ACL "
                         "(SUBACK 0x87)")
            codes.append(NOT_AUTHORIZED)
            continue
        existed = topic_filter in session.subscriptions
        granted = broker.subscribe(session, [(topic_filter, options & 3)], v5=True,
                                   options=options & ~3)[0]
        codes.append(granted)
        if granted >= 0x80:     # refused: 0x80, or 0x97 for memory_limit
            continue
        _set_options(session, topic_filter, options & ~3, sub_id)
        handling = (options & P.SUB_RETAIN_HANDLING) >> 4
        if handling == 0 or handling == 1 and not existed:
            retained.append((topic_filter, granted))
    if not _answer5(client, encode5(P.Suback(p.packet_id, codes)), "SUBACK"):
        return
    if retained:
        broker.send_retained(session, retained, [g for _, g in retained])
    if shared:
        broker.pump_shared(session)


def _subscribe_shared(client, topic_filter: str, qos: int, options: int, sub_id: int) -> int:
    """A shared subscription: the granted QoS, or the 5.0 reason code that says why not."""
    broker = client.broker
    if not broker.config.shared_subscriptions:
        _log_refused(client, topic_filter, "shared subscription %s refused: "
                     "shared_subscriptions is off")
        return SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
    try:
        _, inner = parse_shared(topic_filter)
    except ProtocolError as exc:
        why = str(exc).split(repr(topic_filter), 1)[-1].lstrip(": ")[:_FILTER_SHOWN]
        _log_refused(client, topic_filter, "shared subscription %s refused in the SUBACK ("
                     + why.replace("%", "%%") + ")")
        return TOPIC_FILTER_INVALID
    acl = client.acl
    if acl is not None and not acl.can_subscribe(inner):
        broker.stats.acl_subscribe_denied += 1
        _log_refused(client, topic_filter, "shared subscription %s denied by the ACL")
        return NOT_AUTHORIZED
    return broker.subscribe_shared(client.session, topic_filter, qos, options, sub_id)


def _log_refused(client, topic_filter: str, message: str) -> None:
    """A refused filter, logged (``message`` with %s for the filter, shown shortened) for the
    first distinct ones of the connection (Client.warn_first)."""
    client.warn_first("subscribe", topic_filter, "more subscriptions refused",
                      message, shown(topic_filter, _FILTER_SHOWN, "characters"))


def _set_options(session, topic_filter: str, options: int, sub_id: int) -> None:
    """Keep a filter's 5.0 options and identifier (``Broker.subscribe`` dropped the old
    ones): ``sub5`` holds only filters with any, and is None when none has (so 3.1.1-like
    sessions route the plain way)."""
    if options or sub_id:
        sub5 = session.sub5
        if sub5 is None:
            sub5 = session.sub5 = {}
        sub5[topic_filter] = (options, sub_id)


def on_unsubscribe5(client, p: P.Unsubscribe) -> None:
    """A 5.0 UNSUBSCRIBE: 0x11 for a filter the session had no subscription to (also for
    a filter listed again: the filters are taken in turn, and the first removed it)."""
    session = client.session
    broker = client.broker
    broker.settle()
    codes = []
    seen = set()
    for f in p.topics:
        found = (broker.unsubscribe_shared(session, f) if is_shared(f)
                 else f in session.subscriptions and f not in seen)
        seen.add(f)
        codes.append(SUCCESS if found else NO_SUBSCRIPTION_EXISTED)
    broker.unsubscribe(session, p.topics)       # their options and identifiers too
    _answer5(client, encode5(P.Unsuback(p.packet_id, codes)), "UNSUBACK")


def _answer5(client, frame: bytes, what: str) -> bool:
    """Send a 5.0 SUBACK or UNSUBACK; False when it is larger than the client's Maximum
    Packet Size (one of a few bytes and a SUBSCRIBE of many filters): the broker must not send
    it (MQTT-3.1.2-24) and the client would wait for it, so the connection is closed with
    DISCONNECT 0x95 instead (its subscriptions stay made), counted as refused
    ``packet_too_large`` and logged as refusals are."""
    broker = client.broker
    limit = client.v5.max_packet_size
    if limit and len(frame) > limit:
        broker.refused["packet_too_large"] += 1
        why = (f"its {what} ({len(frame)} bytes) would be larger than its Maximum Packet Size "
               f"({limit})")
        broker.peer_log.log(log, logging.WARNING, "packet_too_large", client.peer,
                            "%s: %s; closing the connection (DISCONNECT 0x95)",
                            client.describe(), why)
        broker.before_close()
        client.close(will=True, reason=PACKET_TOO_LARGE, why=why)
        return False
    client.answer(frame)
    broker.stats.packets_sent += 1
    return True


def on_unsubscribe(client, p: P.Unsubscribe) -> None:
    client.broker.settle()
    for topic_filter in p.topics:
        if is_shared(topic_filter):
            client.broker.unsubscribe_shared(client.session, topic_filter)
    client.broker.unsubscribe(client.session, p.topics)
    client.answer(encode_ack(P.UNSUBACK, p.packet_id))
    client.broker.stats.packets_sent += 1
