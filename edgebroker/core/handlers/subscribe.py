"""SUBSCRIBE and UNSUBSCRIBE: the ACL's say on each filter, the answer, then retained messages.

The broker makes the subscriptions (limits: ``Broker.subscribe``); under an ACL
each filter the ACL does not allow gets 0x80 in the SUBACK. Retained messages for
the granted filters follow the SUBACK (``Broker.send_retained``).
"""

from __future__ import annotations

import logging

from edgebroker.errors import (
    NO_SUBSCRIPTION_EXISTED, NOT_AUTHORIZED, PROTOCOL_ERROR, SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
    SUCCESS, ProtocolError,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt import properties as Q
from edgebroker.mqtt.encode import encode, encode_ack
from edgebroker.mqtt.encode5 import encode5

log = logging.getLogger("edgebroker.client")


def on_subscribe(client, p: P.Subscribe) -> None:
    broker = client.broker
    if client.acl is None:
        granted = broker.subscribe(client.session, p.topics)
    else:
        granted = _subscribe_allowed(client, p.topics)
    client.answer(encode(P.Suback(p.packet_id, granted)))
    broker.stats.packets_sent += 1
    broker.send_retained(client.session, p.topics, granted)


def _subscribe_allowed(client, topics) -> list[int]:
    """SUBSCRIBE under an ACL: each denied filter gets 0x80, the others are made."""
    broker = client.broker
    acl = client.acl
    granted = []
    for topic_filter, qos in topics:
        if acl.can_subscribe(topic_filter):
            granted.extend(broker.subscribe(client.session, [(topic_filter, qos)]))
        else:
            broker.stats.acl_subscribe_denied += 1
            log.warning("%s: subscription to %r denied by the ACL (SUBACK 0x80)",
                        client.describe(), topic_filter)
            granted.append(P.SUBACK_FAILURE)
    return granted


def on_subscribe5(client, p: P.Subscribe) -> None:
    """A 5.0 SUBSCRIBE: options beyond the QoS (No Local, Retain As Published, Retain
    Handling) and a Subscription Identifier kept per filter (``Session.sub5``); each refused
    filter gets the reason code that says why."""
    broker = client.broker
    session = client.session
    acl = client.acl
    sub_id = p.properties.get(Q.SUBSCRIPTION_ID, 0) if p.properties is not None else 0
    codes = []
    retained = []            # (filter, granted QoS) whose retained messages follow
    for topic_filter, options in p.topics:
        if topic_filter.startswith("$share/"):
            if options & P.SUB_NO_LOCAL:
                raise ProtocolError(f"SUBSCRIBE to shared subscription {topic_filter!r} with "
                                    f"No Local", rule="MQTT-3.8.3-4", reason=PROTOCOL_ERROR)
            codes.append(SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
            continue
        if acl is not None and not acl.can_subscribe(topic_filter):
            broker.stats.acl_subscribe_denied += 1
            log.warning("%s: subscription to %r denied by the ACL (SUBACK 0x87)",
                        client.describe(), topic_filter)
            codes.append(NOT_AUTHORIZED)
            continue
        existed = topic_filter in session.subscriptions
        granted = broker.subscribe(session, [(topic_filter, options & 3)])[0]
        codes.append(granted)
        if granted == P.SUBACK_FAILURE:
            continue
        _set_options(session, topic_filter, options & ~3, sub_id)
        handling = (options & P.SUB_RETAIN_HANDLING) >> 4
        if handling == 0 or handling == 1 and not existed:
            retained.append((topic_filter, granted))
    client.answer(encode5(P.Suback(p.packet_id, codes)))
    broker.stats.packets_sent += 1
    if retained:
        broker.send_retained(session, retained, [g for _, g in retained])


def _set_options(session, topic_filter: str, options: int, sub_id: int) -> None:
    """Keep (or forget) a filter's 5.0 options and identifier: ``sub5`` holds only filters
    with any, and is None when none has (so 3.1.1-like sessions route the plain way)."""
    sub5 = session.sub5
    if options or sub_id:
        if sub5 is None:
            sub5 = session.sub5 = {}
        sub5[topic_filter] = (options, sub_id)
    elif sub5 is not None and sub5.pop(topic_filter, None) is not None and not sub5:
        session.sub5 = None


def on_unsubscribe5(client, p: P.Unsubscribe) -> None:
    """A 5.0 UNSUBSCRIBE: 0x11 for a filter the session had no subscription to."""
    session = client.session
    codes = [SUCCESS if f in session.subscriptions else NO_SUBSCRIPTION_EXISTED
             for f in p.topics]
    client.broker.unsubscribe(session, p.topics)
    for topic_filter in p.topics:
        _set_options(session, topic_filter, 0, 0)
    client.answer(encode5(P.Unsuback(p.packet_id, codes)))
    client.broker.stats.packets_sent += 1


def on_unsubscribe(client, p: P.Unsubscribe) -> None:
    client.broker.unsubscribe(client.session, p.topics)
    client.answer(encode_ack(P.UNSUBACK, p.packet_id))
    client.broker.stats.packets_sent += 1
