"""A bridge's subscriptions at the remote: the filters of its ``in`` rules, made at each
CONNACK, and the filters an earlier configuration left in the remote's session, removed.

**Filters left by an earlier configuration.** With ``clean_start = false`` the remote keeps
the bridge's subscriptions in its session, across links and restarts. A filter no rule names
any more would stay there for good: the remote sends its messages over the link (dropped
here), and while the link is down it queues them for the session, where they can push out
the messages the rules do want (Mosquitto's ``max_queued_messages``). So the checkpoint
remembers the filters the bridge subscribed to (``subscriptions``: filter -> 0; a file of an
earlier version may hold a Subscription Identifier there, read the same), handed to the
writer when they change, before the SUBSCRIBE goes out; when a CONNACK says Session Present
1, the remembered filters that no rule names are unsubscribed (logged once) and forgotten
once the UNSUBACK comes. Without a remembered list (a checkpoint of an older version, none,
or a damaged one) the bridge cannot know them: it says so once, and docs/bridge.md tells the
operator to connect once with ``clean_start = true``.

**Overlapping rules on MQTT 5.0.** A 5.0 remote may send a message once per matching
subscription (MQTT-3.3.4-2; Mosquitto does): with ``c/#`` and ``c/x/#`` every message on
``c/x/...`` comes twice, and each copy is published here (under the first rule's mapping).
No copy is skipped: the remote queues and drops each subscription's copy on its own (no
QoS 0 copy is queued for an offline session; its queue limit drops copies one at a time),
so the copy that arrives may be the only one. ``config check`` and the start warn of such
rules (bridge_config.overlapping_in_rules).
"""

from __future__ import annotations

import logging

from edgebroker.mqtt import packets as P

log = logging.getLogger("edgebroker.bridge")


class Subscribing:
    """``Bridge``'s side of it (a mixin over its state)."""

    def init_subscriptions(self, saved: dict | None) -> None:
        """At start; ``saved``: the checkpoint's ``subscriptions`` (None: not known)."""
        self.remote_subs = saved    # filter -> 0: the filters the remote's session may hold
        self.subs_saved = saved     # as last written or handed to the writer
        self.subscribing = []       # this link's SUBSCRIBEs and UNSUBSCRIBE, until answered
        self.unsubscribing = None   # this link's UNSUBSCRIBE, until its UNSUBACK

    def subscribe_on_connect(self, session_present: bool) -> None:
        """On Connected: unsubscribe the stale filters, subscribe to the rules' filters."""
        subscriptions = self.rules.subscriptions()
        v5 = self.config.protocol_version == 5
        held = self.remote_subs if session_present else {}
        if held is None:
            self._once("subs_unknown", "bridge %s: the remote kept the bridge's session, and "
                       "the checkpoint does not say which filters an earlier run subscribed to "
                       "(a checkpoint of an older version, none, or a damaged one): a filter no "
                       "in rule names any more stays at the remote; connect once with "
                       "clean_start = true to remove it (docs/bridge.md)", self.name)
            held = {}
        current = {f: 0 for f, _ in subscriptions}
        stale = [f for f in held if f not in current]
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
        for (topic_filter, _), code in zip(request.filters, event.granted):
            if code < 0x80:
                self._warned.discard(("refused", topic_filter))    # the episode ends
            else:
                self._once(("refused", topic_filter), "bridge %s: the remote refused "
                           "the subscription to %r (code %#04x; logged once until it "
                           "grants it)", self.name, topic_filter, code)

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
