"""Delivery to MQTT 5.0 subscribers: what their PUBLISH carries beyond 3.1.1's.

A 5.0 subscriber's PUBLISH carries the message's properties as its publisher sent them (minus
the hop's own: Topic Alias, Subscription Identifier), the Message Expiry Interval counted
down to what is left, and the Subscription Identifiers of the subscriptions that match (the
session's filters with one, matched when the message is written, so that a subscription
changed meanwhile gives its current identifier). With ``outbound_topic_aliases``, the topics
a connection receives get an alias each, and later messages to them carry the alias and an
empty topic name; once the connection's aliases (its Topic Alias Maximum, at most
``max_outbound_topic_aliases``) are all in use, a new topic takes the least recently used one,
sent with the topic name, so that a connection holds that many topic names at most. A message
past its expiry is not sent (counted in ``message_expired``), nor one larger than the client's
Maximum Packet Size (``packet_too_large``): both count as delivered for the window, as the
specification says. A message sent before and not acknowledged (DUP) is sent again even past
its expiry.

When neither expiry nor an outbound alias applies, a subscriber's PUBLISH differs from the
other subscribers' only in the packet identifier and its Subscription Identifiers: the parts
around the packet identifier are made once for the message being routed (``Router5._shared5``)
and reused for every subscriber with the same identifiers (most have none, or the same small
number), as the 3.1.1 path encodes a QoS 0 frame once per message.

At routing (``options5``), a session's 5.0 subscription options decide whether it gets the
message at all (No Local: not its own messages, unless another of its matching subscriptions
lacks the option) and the retain flag of a live message (Retain As Published).
"""

from __future__ import annotations

import logging
import struct
from collections import OrderedDict

from edgebroker.core.cursor import kept_options, kept_qos
from edgebroker.core.filter_set import SMALL, matching_among, matching_filters
from edgebroker.core.mqtt5 import stored_properties
from edgebroker.core.session import Message, StoredRetained
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode_publish_head
from edgebroker.mqtt.encode5 import encode_publish_head5
from edgebroker.mqtt.properties import varint

log = logging.getLogger("edgebroker.broker")

_JOIN_LIMIT = 4096
_pack_u16 = struct.Struct("!H").pack
_NO_OPTIONS = (0, 0)
_NO_SUB5: dict = {}      # (a session whose filters have no options now: Cursor.kept5)


def options5(session, message: Message) -> tuple[int, bool]:
    """(the highest QoS among the session's matching subscriptions that take the message,
    -1 when none does; the retain flag to send a live message with)."""
    return options5_for(session, message.topic, message.retain,
                        message.client_id == session.client_id)


def _since(session, offset: int | None) -> dict | None:
    """While ``session`` is behind: the offsets its filters subscribed since then match from
    (``Cursor.since``), for the record at ``offset``; None when every filter counts."""
    cursor = session.cursor
    return cursor.since if cursor is not None and offset is not None else None


def options5_for(session, topic: str, retain_flag: bool, own: bool,
                 offset: int | None = None) -> tuple[int, bool]:
    """``options5`` for a message to ``topic`` with ``retain_flag``, published by the session
    itself when ``own`` (a record read back from the log, too, at ``offset``: a filter
    subscribed while the session is behind takes only records from then on, and one
    subscribed again keeps its QoS and options from before for older records)."""
    best = -1
    retain = False
    sub5 = session.sub5 or _NO_SUB5
    subscriptions = session.subscriptions
    since = _since(session, offset)
    cursor = session.cursor
    lowered = kept5 = None
    if cursor is not None and offset is not None:
        # A filter lowered, or its options changed, while behind: what it was for the
        # records before that SUBSCRIBE (Cursor.lowered, Cursor.kept5).
        lowered = cursor.lowered
        kept5 = cursor.kept5
    for topic_filter in matching_filters(session, topic):
        if since and since.get(topic_filter, 0) > offset:
            continue
        qos = subscriptions[topic_filter]
        if lowered and topic_filter in lowered:
            qos = kept_qos(qos, lowered[topic_filter], offset)
        options = sub5.get(topic_filter, _NO_OPTIONS)[0]
        if kept5 and topic_filter in kept5:
            options = kept_options(options, kept5[topic_filter], offset)
        if own and options & P.SUB_NO_LOCAL:
            continue
        if qos > best:
            best = qos
        if options & P.SUB_RETAIN_AS_PUBLISHED:
            retain = retain_flag
    return best, retain


def ids_offset(ref) -> int | None:
    """The ``offset`` ``subscription_ids`` takes for ``ref``: None for a retained message (a
    copy sent for a SUBSCRIBE, which carries that subscription's identifier, or a live one
    queued before the session fell behind), whose filters count as they are now, as for a
    session in step (MQTT-3.3.4-3); a record's offset otherwise."""
    if type(ref) is StoredRetained or type(ref) is Message and ref.retain:
        return None
    return ref.offset


def subscription_ids(session, topic: str, own: bool, offset: int | None = None) -> bytes:
    """The Subscription Identifier properties of the session's filters matching ``topic``
    that take the message: not a No Local one for the session's own message (``own``), nor
    one subscribed after the record at ``offset`` while the session is behind."""
    sub5 = session.sub5
    if not sub5:
        return b""
    since = _since(session, offset)
    found = []
    # (Few filters with options: those are gone through, in their order.)
    for f in matching_among(sub5, topic) if len(sub5) <= SMALL else matching_filters(
            session, topic):
        options, sid = sub5.get(f, _NO_OPTIONS)
        if sid and not (own and options & P.SUB_NO_LOCAL) and not (since and since.get(f, 0)
                                                                   > offset):
            found.append(b"\x0b" + varint(sid))
    return b"".join(found)


class Router5:
    """The 5.0 part of ``Broker``'s routing (a mixin over the broker's state)."""

    # The PUBLISH parts of the message routed last, for subscribers with nothing of their own
    # in it but their Subscription Identifiers (``_write_publish5``): (message, first byte,
    # the Subscription Identifier properties, frame before the packet identifier, the frame
    # from after it up to the payload, and for QoS 0 the frame as ``transport.offer`` takes
    # it: frame and None, or head and payload for a large payload). The last message only;
    # subscribers whose identifiers are the same (often 1, or none) share it.
    _last5: tuple = (None, -1, b"", b"", b"", None, None)

    def _shared5(self, message: Message, qos: int, retain: bool, dup: bool,
                 ids: bytes) -> tuple:
        """Make ``_last5`` for ``message`` sent with these flags and identifiers."""
        props = message.properties + ids
        payload = message.payload
        section = varint(len(props)) + props
        # A 5.0 PUBLISH is a 3.1.1 one whose payload starts with the property section.
        pre = encode_publish_head(message.topic_bytes, len(section) + len(payload), qos,
                                  retain, dup, 1 if qos else None)
        data = rest = None
        if qos:
            pre = pre[:-2]
        elif len(payload) <= _JOIN_LIMIT:
            data = b"".join((pre, section, payload))
        else:
            data, rest = pre + section, payload
        first = 0x30 | qos << 1 | retain | dup << 3
        self._last5 = last = (message, first, ids, pre, section, data, rest)
        return last

    def _write_publish5(self, client, ref, qos: int, retain: bool, dup: bool, pid,
                        ids: bytes | None = None) -> bool:
        """Queue one PUBLISH for a 5.0 client; False when it is not sent (its record gone,
        expired, too large for the client). ``ids``: its Subscription Identifier properties
        when given (a shared subscription's, core.shared), else those of the session's
        matching filters."""
        conn = client.v5
        # Nothing of the PUBLISH is this subscriber's own but the packet id and Subscription
        # Identifiers (no expiry to count down, no outbound alias): the parts made once per
        # message (and identifiers).
        if (type(ref) is not Message or ref.expires
                or conn.out_alias_maximum and self.limits.outbound_topic_aliases):
            return self._write_own5(client, ref, qos, retain, dup, pid, ids)
        session = client.session
        if ids is None:
            ids = b"" if session.sub5 is None else subscription_ids(
                session, ref.topic, ref.client_id == session.client_id, ids_offset(ref))
        last = self._last5
        payload = ref.payload
        if (last[0] is not ref or last[1] != 0x30 | qos << 1 | retain | dup << 3
                or last[2] != ids):
            if qos:
                # The first subscriber of a message (often its only one, as for a record read
                # back from the log): its own frame; the parts are made for a second one.
                props = ref.properties + ids
                section = varint(len(props)) + props
                head = encode_publish_head(ref.topic_bytes, len(section) + len(payload), qos,
                                           retain, dup, pid) + section
                if conn.max_packet_size and self._too_large5(client, len(head) + len(payload)):
                    return False
                self._last5 = (ref, 0x30 | qos << 1 | retain | dup << 3, ids, None, b"", None,
                               None)
                return self._write_head5(client, head, payload)
            last = self._shared5(ref, qos, retain, dup, ids)
        elif last[3] is None:
            last = self._shared5(ref, qos, retain, dup, ids)
        _, _, _, pre, post, data, rest = last
        if conn.max_packet_size and self._too_large5(
                client, len(pre) + len(post) + len(payload) + (2 if qos else 0)):
            return False
        transport = client.transport
        transport.count_publish()
        if data is not None:
            transport.write(data)
            if rest is not None:
                transport.write(rest)
        elif len(payload) > _JOIN_LIMIT:
            transport.write(b"".join((pre, _pack_u16(pid), post)))
            transport.write(payload)
        else:
            transport.write(b"".join((pre, _pack_u16(pid), post, payload)))
        self.stats.publish_sent += 1
        return True

    def _write_head5(self, client, head: bytes, payload) -> bool:
        """Queue a PUBLISH made of ``head`` and ``payload``."""
        transport = client.transport
        transport.count_publish()
        if len(payload) <= _JOIN_LIMIT:
            transport.write(head + payload)
        else:
            transport.write(head)
            transport.write(payload)
        self.stats.publish_sent += 1
        return True

    def _write_own5(self, client, ref, qos: int, retain: bool, dup: bool, pid,
                    ids: bytes | None = None) -> bool:
        """``_write_publish5`` for a PUBLISH with parts of the subscriber's own, or a record
        read back from the log (a retained message the retained store still holds is sent
        from there, core.retained)."""
        conn = client.v5
        if type(ref) is StoredRetained:
            ref = self.retained_copy(ref) or ref
        if type(ref) is Message:
            topic_bytes, topic, payload = ref.topic_bytes, ref.topic, ref.payload
            props, expires = ref.properties, ref.expires
            size = len(payload)
            where = None
        else:
            where = self._locate(client, ref.offset)
            if where is None:
                return False
            topic_bytes = where.topic
            topic = topic_bytes.decode("utf-8", "replace")
            props, expires = (stored_properties(where.properties, where.timestamp_ms,
                                                ref.offset, self.journal, self.clock())
                              if where.properties else (b"", 0.0))
            size = where.payload_length
        if expires:
            left = expires - self.clock()
            if left <= 0:
                if not dup:
                    self.drop_expired(client.session, topic)
                    return False
                # Sent before and not acknowledged: its delivery has started, so it goes
                # again (MQTT-3.3.2-5 deletes only copies not yet sent; the client may hold
                # a QoS 2 packet id for it), with the shortest interval there is.
                left = 1
            props += b"\x02" + int(-(-left // 1)).to_bytes(4, "big")
        if ids is None:
            session = client.session
            ids = b"" if session.sub5 is None else subscription_ids(
                session, topic, ref.client_id == session.client_id if where is None
                else where.client_id == client.client_id_bytes, ids_offset(ref))
        props += ids
        alias = new_alias = 0
        name = topic_bytes
        if conn.out_alias_maximum and self.limits.outbound_topic_aliases:
            aliases = conn.out_aliases
            if aliases is None:
                aliases = conn.out_aliases = OrderedDict()
            alias = aliases.get(topic_bytes, 0)
            if alias:
                name = b""           # the alias stands for the topic
                aliases.move_to_end(topic_bytes)
            elif where is None:
                # (Not for a payload sent from the segment: the transport drops that PUBLISH
                # if retention deletes its record first, and the alias would go with it.)
                # Aliases 1, 2, ... up to out_alias_maximum; then the least recently used
                # one is set to this topic: the PUBLISH carries the topic name with it, and
                # the client replaces its mapping (3.3.4).
                alias = new_alias = (len(aliases) + 1 if len(aliases) < conn.out_alias_maximum
                                     else next(iter(aliases.values())))
            if alias:
                props += b"\x23" + alias.to_bytes(2, "big")
        section = varint(len(props)) + props
        head = encode_publish_head5(name, size, qos, retain, dup, pid, section)
        if conn.max_packet_size and self._too_large5(client, len(head) + size):
            return False
        if new_alias:  # set only by a PUBLISH that goes out
            aliases = conn.out_aliases
            if len(aliases) == conn.out_alias_maximum:
                aliases.popitem(last=False)
            aliases[topic_bytes] = new_alias
        if where is None:
            return self._write_head5(client, head, payload)
        transport = client.transport
        transport.count_publish()
        transport.write_file(head, where.fd, where.payload_position, size, ref.offset)
        self.stats.publish_sent += 1
        return True

    def _too_large5(self, client, size: int) -> bool:
        """A PUBLISH of ``size`` bytes is above the client's Maximum Packet Size (which it
        announced): counted and logged once, not sent."""
        conn = client.v5
        if size <= conn.max_packet_size:
            return False
        self.drop("packet_too_large", client.session)
        client.warn_once("packet_too_large", "a PUBLISH of %d bytes is larger than its "
                         "Maximum Packet Size (%d); not sent", size, conn.max_packet_size)
        return True

    def _offer5(self, client, message: Message, retain: bool) -> bool | None:
        """A QoS 0 message to a 5.0 client, refused (False) when max_pending_write_bytes are
        waiting; None when it is not sent (expired, too large). Also one with the retain flag
        to a 3.1/3.1.1 bridge (Retain As Published: core.handlers.subscribe)."""
        transport = client.transport
        if transport.out_bytes >= transport.max_pending:
            return False
        conn = client.v5
        if conn is None:
            payload = message.payload
            transport.offer(encode_publish_head(message.topic_bytes, len(payload), 0, retain,
                                                False, None), payload)
            self.stats.publish_sent += 1
            return True
        # As in _write_publish5, written out: this runs for every subscriber of every message.
        if message.expires or conn.out_alias_maximum and self.limits.outbound_topic_aliases:
            return True if self._write_own5(client, message, 0, retain, False, None) else None
        session = client.session
        ids = b"" if session.sub5 is None else subscription_ids(
            session, message.topic, message.client_id == session.client_id)
        # The fan-out path: the frame made once for the message; the transport counts it
        # (below max_pending, as checked above, offer queues it whatever it holds).
        last = self._last5
        if last[0] is not message or last[1] != (0x31 if retain else 0x30) or last[2] != ids:
            last = self._shared5(message, 0, retain, False, ids)
        data, rest = last[5], last[6]
        if conn.max_packet_size and self._too_large5(
                client, len(data) + (len(rest) if rest is not None else 0)):
            return None
        transport.offer(data, rest)
        self.stats.publish_sent += 1
        return True
