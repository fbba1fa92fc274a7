"""A bridge's subscriptions at the remote: the filters of its ``in`` rules, made at each
CONNACK; the filters an earlier configuration left in the remote's session, removed; and on
MQTT 5.0 a Subscription Identifier per filter, so that a message two overlapping rules match
is published here once.

**Filters left by an earlier configuration.** With ``clean_start = false`` the remote keeps
the bridge's subscriptions in its session, across links and restarts. A filter no rule names
any more would stay there for good: the remote sends its messages over the link (dropped
here), and while the link is down it queues them for the session, where they can push out
the messages the rules do want (Mosquitto's ``max_queued_messages``). So the checkpoint
remembers the filters the bridge subscribed to (``subscriptions``: filter -> identifier),
handed to the writer when they change, before the SUBSCRIBE goes out; when a CONNACK says
Session Present 1, the remembered filters that no rule names are unsubscribed (logged once)
and forgotten once the UNSUBACK comes. Without a remembered list (a checkpoint of an older
version, none, or a damaged one) the bridge cannot know them: it says so once, and
docs/bridge.md tells the operator to connect once with ``clean_start = true``.

**Overlapping rules on MQTT 5.0.** A 5.0 remote may send a message once per matching
subscription (MQTT-3.3.4-2; Mosquitto does): with ``c/#`` and ``c/x/#`` every message on
``c/x/...`` comes twice. Each remote filter gets its own SUBSCRIBE with its own Subscription
Identifier (unless the CONNACK says Subscription Identifier Available 0), kept across runs
in the checkpoint; each copy carries the identifiers of the subscriptions it matched
(MQTT-3.3.4-3). A copy is published here only when its identifiers include the one of the
first ``in`` rule that matches its topic (the rule that maps it, as on 3.1.1); the other
copies are acknowledged and counted (``received_copies``): the message comes by that rule's
copy. That holds for the filters known to be in the remote's session with their identifier
when the message could have been queued there (``Inbound.first_ids``): all of them when the
remote had no session, else those remembered from an earlier link. A filter new on this link
of a kept session is not decisive until the next link (its copies may come, for messages the
remote queued before this SUBSCRIBE, without its identifier), so across that one change a
message may still come twice: never lost. A copy without identifiers is published.
"""

from __future__ import annotations

import logging

from edgebroker.mqtt import packets as P
from edgebroker.mqtt.properties import SUB_ID_AVAILABLE, SUBSCRIPTION_ID

log = logging.getLogger("edgebroker.bridge")


def assign_ids(filters, saved: dict | None) -> dict[str, int]:
    """A Subscription Identifier per filter: the one remembered for it, else the smallest
    one no remembered filter has (a stale filter's copies never carry a current one)."""
    saved = saved or {}
    used = {ident for ident in saved.values() if ident}
    ids, free = {}, 1
    for topic_filter in filters:
        ident = saved.get(topic_filter, 0)
        if not ident:
            while free in used:
                free += 1
            ident = free
            used.add(ident)
        ids[topic_filter] = ident
    return ids


class Subscribing:
    """``Bridge``'s side of it (a mixin over its state)."""

    def init_subscriptions(self, saved: dict | None) -> None:
        """At start; ``saved``: the checkpoint's ``subscriptions`` (None: not known)."""
        self.remote_subs = saved    # filter -> identifier the remote's session may hold
        self.subs_saved = saved     # as last written or handed to the writer
        self.sub_ids = assign_ids([f for f, _ in self.rules.subscriptions()], saved)
        self.subscribing = []       # this link's SUBSCRIBEs and UNSUBSCRIBE, until answered
        self.unsubscribing = None   # this link's UNSUBSCRIBE, until its UNSUBACK

    def subscribe_on_connect(self, session_present: bool, props: dict) -> None:
        """On Connected: unsubscribe the stale filters, subscribe to the rules' filters."""
        subscriptions = self.rules.subscriptions()
        v5 = self.config.protocol_version == 5
        with_ids = v5 and props.get(SUB_ID_AVAILABLE, 1) != 0
        held = self.remote_subs if session_present else {}
        if held is None:
            self._once("subs_unknown", "bridge %s: the remote kept the bridge's session, and "
                       "the checkpoint does not say which filters an earlier run subscribed to "
                       "(a checkpoint of an older version, none, or a damaged one): a filter no "
                       "in rule names any more stays at the remote; connect once with "
                       "clean_start = true to remove it (docs/bridge.md)", self.name)
            held = {}
        ids = self.sub_ids if with_ids else dict.fromkeys(self.sub_ids, 0)
        current = {f: ids[f] for f, _ in subscriptions}
        stale = [f for f in held if f not in current]
        if not with_ids:
            self.inbound.first_ids = None
        elif session_present:   # decisive: in the session with this identifier before
            self.inbound.first_ids = {f: i for f, i in current.items() if held.get(f) == i}
        else:
            self.inbound.first_ids = current
        self._remember({**held, **current})
        if stale:
            if ("unsubscribe", tuple(stale)) not in self._warned:
                self._warned.add(("unsubscribe", tuple(stale)))
                log.info("bridge %s: unsubscribing from %s at the remote: filters an earlier "
                         "configuration subscribed to, which no in rule names any more "
                         "(logged once)", self.name, ", ".join(map(repr, stale)))
            self.unsubscribing = self.conn.unsubscribe(stale)
            self.subscribing.append(self.unsubscribing)
        if not subscriptions:
            return
        # No Local: the remote does not send back what this bridge published there.
        # Retain Handling 1: its retained messages come only with a new subscription,
        # not again at each reconnect to a session the remote kept.
        extra = (P.SUB_NO_LOCAL | P.SUB_RETAIN_AS_PUBLISHED | 1 << 4) if v5 else 0
        if with_ids:    # one identifier per SUBSCRIBE (MQTT 5.0 3.8.2.1.2)
            for f, qos in subscriptions:
                self.subscribing.append(self.conn.subscribe(
                    [(f, qos | extra)], properties={SUBSCRIPTION_ID: current[f]}))
        else:
            self.subscribing.append(self.conn.subscribe([(f, qos | extra)
                                                         for f, qos in subscriptions]))
        # The remote answers with its retained messages as it has them once it read the
        # SUBSCRIBE: what goes out behind it is not in that answer (Inbound._stale).
        self.inbound.fresh_from = self.outbound.sent_to

    def _remember(self, subs: dict) -> None:
        """What the remote's session may hold now (a new dict: the writer's thread reads the
        one it was handed); the checkpoint is handed to the writer when it changed."""
        if subs != self.remote_subs:
            self.remote_subs = subs
            self.save_checkpoint()

    def on_subscribed(self, event) -> None:
        request = event.request
        if request in self.subscribing:
            self.subscribing.remove(request)
        refused = []
        for (topic_filter, _), code in zip(request.filters, event.granted):
            if code < 0x80:
                self._warned.discard(("refused", topic_filter))    # the episode ends
            else:
                refused.append(topic_filter)
                self._once(("refused", topic_filter), "bridge %s: the remote refused "
                           "the subscription to %r (code %#04x; logged once until it "
                           "grants it)", self.name, topic_filter, code)
        if refused:     # not held with its identifier: not decisive (remembered, as 0)
            first = self.inbound.first_ids
            if first:
                self.inbound.first_ids = {f: i for f, i in first.items() if f not in refused}
            self._remember({**self.remote_subs, **dict.fromkeys(refused, 0)})

    def on_unsubscribed(self, event) -> None:
        request = event.request
        if request in self.subscribing:
            self.subscribing.remove(request)
        if request is not self.unsubscribing:
            return
        self.unsubscribing = None
        gone = set(request.filters)
        self._remember({f: i for f, i in self.remote_subs.items() if f not in gone})

    def withdraw_subscribing(self) -> None:
        """The link was lost: requests not answered are not sent again (the next link
        subscribes, and unsubscribes, afresh)."""
        for request in self.subscribing:
            self.conn.withdraw(request)
        self.subscribing = []
        self.unsubscribing = None
