"""SUBSCRIBE and UNSUBSCRIBE: the ACL's say on each filter, the answer, then retained messages.

The broker makes the subscriptions (limits: ``Broker.subscribe``); under an ACL
each filter the ACL does not allow gets 0x80 in the SUBACK. Retained messages for
the granted filters follow the SUBACK (``Broker.send_retained``).
"""

from __future__ import annotations

import logging

from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode, encode_ack

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


def on_unsubscribe(client, p: P.Unsubscribe) -> None:
    client.broker.unsubscribe(client.session, p.topics)
    client.answer(encode_ack(P.UNSUBACK, p.packet_id))
    client.broker.stats.packets_sent += 1
