"""Wills: published when a connection ends without DISCONNECT (``core.sessions.detach``), or,
with a 5.0 Will Delay Interval, once the delay has passed or the session ends, whichever comes
first; not if the client comes back to the session before.

A delayed will is a ``DelayedWill`` timer in the broker's deadline heap, by session
(``will_timers``). It is kept in its session's snapshot entry (core.will_state) with the
wall-clock time it is due at, so a restart (a stop, or a crash after the snapshot) arms it
again for the time left, or publishes it at once when that time passed while the broker was
down (``restore_will``, then ``arm_restored_wills`` once the log is replayed). Its client is
gone then: a ``Departed`` stands for it. The ACL is checked when it is published, as the
listener its client came in on has it then, also one that had no ACL file when the client
came in and has one since (a reload: server.reload; a restart: the listener's address is kept
with the will) (docs/protocol.md, "Wills").

The snapshot is up to a second old: a delayed will that ended since (published, or cancelled
by its client coming back) would be restored by a crash's restart and published (again). So
its end is journaled (core.exchanges' ``W`` record: client id and the will's serial, a number
no other will of that broker's state had before) before its PUBLISH reaches the log or anything
after the cancel is sent, and a restart leaves the wills those records name out
(``forget_ended_wills``). The serial tells an ended will from a later one of the same client
id; it is kept in the snapshot's ``WillState``, and a restart numbers new wills on from the
highest restored.
"""

from __future__ import annotations

import logging
from functools import partial

from edgebroker.commitlog.errors import LogFullError
from edgebroker.core.mqtt5 import logged, message_properties
from edgebroker.core.timers import Timer
from edgebroker.core.will_state import WillState
from edgebroker.errors import name_shown, topic_shown
from edgebroker.mqtt.packets import Will
from edgebroker.mqtt.properties import WILL, WILL_DELAY, decode_body

log = logging.getLogger("edgebroker.broker")


class KeptWill:
    """A will as the broker keeps it from its CONNECT on (``Client.will``, ``DelayedWill``):
    its 5.0 properties as a PUBLISH keeps them (core.mqtt5's ``message_properties``: the
    encoded ones it is forwarded with, and its Message Expiry Interval), and its Will Delay
    Interval. Kept decoded, a dict with a tuple per User Property took ~14 times their
    bytes on the wire, for the connection's life and the delay after it."""

    __slots__ = ("topic", "payload", "qos", "retain", "properties", "expiry", "delay")

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool,
                 properties: bytes = b"", expiry: int | None = None, delay: int = 0):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties    # encoded, without their length (b"": none)
        self.expiry = expiry            # Message Expiry Interval (s), None: none
        self.delay = delay              # Will Delay Interval (s)


def kept_will(will: Will, props: dict | None = None) -> KeptWill:
    """``will`` (its CONNECT's; or restored, with ``props`` its decoded properties) as the
    broker keeps it."""
    props = will.properties if props is None else props
    properties, expiry = message_properties(props)
    return KeptWill(will.topic, will.payload, will.qos, will.retain, properties, expiry,
                    props.get(WILL_DELAY, 0) if props is not None else 0)


class DelayedWill(Timer):
    """A will waiting out its Will Delay Interval, with the client it came from and its
    serial (``Wills.will_serial``)."""

    __slots__ = ("publisher", "will", "serial")

    def __init__(self, callback, publisher, will: KeptWill, serial: int):
        super().__init__(callback)
        self.publisher = publisher
        self.will = will
        self.serial = serial


class Departed:
    """The client of a will restored from the snapshot: its connection ended before the
    restart. What publishing the will needs of a client (core.router.publish)."""

    __slots__ = ("client_id", "client_id_bytes", "username", "listener_address",
                 "listener_gone")
    closed = True

    def __init__(self, client_id: str, username: str | None, listener_address: str = ""):
        self.client_id = client_id
        self.client_id_bytes = client_id.encode("utf-8")
        self.username = username
        # The address of the listener its client came in on ("": none, or an older
        # snapshot's will that no ACL applied to): a reload checks the will against that
        # listener's ACL as it is then (server.reload).
        self.listener_address = listener_address
        # The address of the listener whose ACL applied to the will, when it is not served
        # any more (the ACL cannot be checked: the will is dropped), else None.
        self.listener_gone: str | None = None

    def describe(self) -> str:
        name = name_shown(self.client_id)
        user = f" (user {name_shown(self.username)})" if self.username is not None else ""
        return f"client {name}{user}, disconnected before the restart,"


class Wills:
    """Wills' part of ``Broker`` (a mixin over the broker's state)."""

    def _init_wills(self) -> None:
        # The DelayedWills by session: kept here, not on every session (a slot each: memory
        # per connection, bench idle_10000).
        self.will_timers: dict = {}
        # (session, WillState, ended) restored from the snapshot, armed after the replay.
        self._restored_wills: list = []
        # (client id, WillState): wills of clients connected at the stop whose session ended
        # then (``keep_will_at_stop``), for the final snapshot.
        self.stopped_wills: list = []
        # The serial of the last delayed will (or will kept at a stop): each one's is new.
        self.will_serial = 0

    def _next_will_serial(self) -> int:
        self.will_serial += 1
        return self.will_serial

    def _will_ended(self, client_id: str, serial: int) -> None:
        """A delayed will is published (or dropped) or cancelled: journaled (``W``), so that
        a crash before the next snapshot does not restore it."""
        if self.exchanges is not None:
            self.exchanges.will_ended(client_id, serial)

    def delay_will(self, session, client, will: KeptWill, delay: int) -> None:
        """Publish ``will`` in ``delay`` s, or when ``session`` ends first (5.0)."""
        timer = self.will_timers[session] = DelayedWill(partial(self._will_due, session),
                                                        client, will, self._next_will_serial())
        timer.start(self, self.clock() + delay)
        session.saved = None        # the next snapshot keeps it
        self._snapshot_dirty = True
        log.info("will of %s on %s delayed %d s (Will Delay Interval)", client.describe(),
                 topic_shown(will.topic), delay)

    def keep_will_at_stop(self, session, client, will: KeptWill) -> None:
        """A clean stop closed ``client`` (connected, no DISCONNECT): its will is not thrown
        away (MQTT-3.1.2-8) but kept in the final snapshot as a delayed will, due at the stop
        time plus its Will Delay Interval, so the next start publishes it then, unless a 5.0
        client is back in its session before. A will of a session that ends at the stop
        (clean, or Session Expiry Interval 0) is published at once by the next start."""
        if self.sessions.get(session.client_id) is session and not session.clean:
            timer = self.will_timers[session] = DelayedWill(
                partial(self._will_due, session), client, will, self._next_will_serial())
            timer.start(self, self.clock() + will.delay)
            session.saved = None        # the final snapshot keeps it
            self._snapshot_dirty = True
        else:
            wall_ms = self.journal.wall_ms() if self.journal else 0
            self.stopped_wills.append((session.client_id, self._will_state(
                will, client, session.acl, wall_ms, self._next_will_serial())))
        log.info("will of %s on %s kept for the next start (server shutting down; Will Delay "
                 "Interval %d s)", client.describe(), topic_shown(will.topic), will.delay)

    def cancel_will(self, session) -> None:
        """The client is back within the Will Delay Interval: no will."""
        timer = self.will_timers.pop(session, None)
        if timer is not None:
            timer.cancel()
            self._will_ended(session.client_id, timer.serial)
            log.info("will of %s on %s not published: it connected again within the Will "
                     "Delay Interval", timer.publisher.describe(), topic_shown(timer.will.topic))

    def _will_due(self, session) -> None:
        """A delayed will's time has come, or its session ends first."""
        timer = self.will_timers.pop(session, None)
        if timer is None:
            return
        self._will_ended(session.client_id, timer.serial)    # before its PUBLISH is logged
        session.saved = None
        self._snapshot_dirty = True
        publisher = timer.publisher
        if type(publisher) is Departed and session.acl is None and publisher.listener_gone:
            self.stats.acl_publish_denied += 1
            self.drop("acl", None)
            log.warning("will of %s on %s dropped: the listener its client came in on (%s) is "
                        "not served any more, so its ACL cannot be checked",
                        publisher.describe(), topic_shown(timer.will.topic),
                        publisher.listener_gone)
            return
        self.publish_will(publisher, timer.will, session.acl)

    def publish_will(self, client, will: KeptWill, acl) -> None:
        """Publish ``will``, checked against ``acl`` (the client's, or its session's for a
        delayed will), which a reload may have changed since the CONNECT that checked it."""
        if will.topic.startswith("$SYS"):
            self.drop("sys_topic", None)
            log.warning("will of %s on %s dropped: $SYS topics are written only by the broker",
                        client.describe(), topic_shown(will.topic))
            return
        if acl is not None and not acl.can_write(will.topic):
            self.stats.acl_publish_denied += 1
            self.drop("acl", None)
            since = ("read at the restart, or a reload since" if type(client) is Departed
                     else "reloaded since it connected")
            log.warning("will of %s on %s dropped: the ACL (%s) does not let it publish "
                        "there", client.describe(), topic_shown(will.topic), since)
            return
        log.info("publishing will of %s on %s", client.describe(), topic_shown(will.topic))
        if will.retain and will.payload and will.topic not in self.known_topics:
            # Never refused (the CONNECT was accepted with it), but tracked as any retained
            # message: it counts toward max_topics.
            self.topics.track_retained(((will.topic, client.client_id),))
        try:
            self.publish(will.topic, will.payload, will.qos, will.retain, client,
                         will.properties, will.expiry)
        except LogFullError:
            log.error("will of %s on %s lost: the commit log cannot take it",
                      client.describe(), topic_shown(will.topic))

    # ----- across restarts ---------------------------------------------------------------

    def will_state(self, session, now: float, written_ms: int) -> WillState | None:
        """The snapshot's record of ``session``'s delayed will, None without one."""
        timer = self.will_timers.get(session)
        if timer is None or timer.when is None:
            return None
        return self._will_state(timer.will, timer.publisher, session.acl,
                                written_ms + int((timer.when - now) * 1000), timer.serial)

    def _will_state(self, will: KeptWill, publisher, acl, due_ms: int,
                    serial: int) -> WillState:
        # Its listener's address, with an ACL or not: the restart checks it against the ACL
        # that listener has then (a Client's, or a Departed's kept from the last restart).
        listener = (acl.listener if acl is not None else getattr(publisher, "listener_gone",
                                                                 None)
                    or publisher.listener_address)
        checked = acl is not None or getattr(publisher, "listener_gone", None) is not None
        return WillState(will.topic, will.payload, will.qos, will.retain,
                         logged(will.properties, will.expiry), due_ms,
                         publisher.username, listener or None, checked, serial)

    def restore_will(self, session, state: WillState, ended: bool = False) -> None:
        """A restored session's delayed will, armed by ``arm_restored_wills``; ``ended``: the
        will of a session that ended at the stop (``keep_will_at_stop``; ``session`` stands
        for it, in no table), published at once."""
        self._restored_wills.append((session, state, ended))
        self.will_serial = max(self.will_serial, state.serial)

    def forget_ended_wills(self, ended: set) -> None:
        """``ended``: (client id, serial) of the wills the exchange journal says ended after
        the snapshot (``W``; ``ExchangeRestore.apply_exchanges``): not restored."""
        kept = [entry for entry in self._restored_wills
                if (entry[0].client_id, entry[1].serial) not in ended]
        if len(kept) < len(self._restored_wills):
            log.info("%d delayed wills ended (published, or cancelled by their client coming "
                     "back) after the snapshot: not restored",
                     len(self._restored_wills) - len(kept))
        self._restored_wills = kept

    def arm_restored_wills(self, acls: dict | None = None) -> None:
        """After the restore and the log's replay: each restored delayed will is due when its
        time comes, at once when it came while the broker was down. ``acls``: listener
        address -> its ACL (None: no ACL file), for the wills an ACL applied to (the server's
        listeners; None: in-process, no ACL)."""
        restored, self._restored_wills = self._restored_wills, []
        if not restored:
            return
        now, wall_ms = self.clock(), self.journal.wall_ms() if self.journal else 0
        armed = overdue = 0
        # A will an ACL applied to whose listener is not served any more has an unknown ACL:
        # dropped when due, unless no listener has an ACL file (nothing would deny it).
        any_acl = acls is not None and any(acl is not None for acl in acls.values())
        for session, state, ended in restored:
            if not ended and (self.sessions.get(session.client_id) is not session
                              or session.client is not None):
                continue    # ended after the snapshot (its will went then)
            address = state.listener
            publisher = Departed(session.client_id, state.username, address or "")
            if address is not None and acls is not None:
                if address in acls:
                    acl = acls[address]
                    session.acl = (acl.view(session.client_id, state.username, address)
                                   if acl is not None else None)
                elif any_acl and state.acl:
                    publisher.listener_gone = address
            left = 0 if ended else max(0, state.due_ms - wall_ms) / 1000
            armed += 1
            overdue += not left
            # (A snapshot's properties are a will's as its CONNECT had them, as older
            # brokers wrote them, or without the Will Delay Interval: the same for this.)
            will = kept_will(Will(state.topic, state.payload, state.qos, state.retain),
                             decode_body(state.properties, WILL) if state.properties else None)
            timer = self.will_timers[session] = DelayedWill(partial(self._will_due, session),
                                                            publisher, will, state.serial)
            if left:
                timer.start(self, now + left)
            else:
                self._will_due(session)     # now: before the listeners accept
        log.info("restored %d delayed wills of clients offline or connected at the stop: %d "
                 "due now (their delay ended while the broker was down, or their session "
                 "ended at the stop), %d later", armed, overdue, armed - overdue)
