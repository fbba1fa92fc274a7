"""A session's window after a break: its client is back (``Resume.resume``), or a message in
it could not go out because its log record is gone (``record_gone``).

A persistent session's client is back: what was sent and not acknowledged goes again, DUP,
with its packet ids (MQTT-4.4.0-1), then the queue and the log.

No more PUBLISHes than the window (Receive Maximum, or ``max_inflight_messages``) are
unacknowledged at once (MQTT-3.3.4-9). A client back with a smaller Receive Maximum than it had
gets the rest of the old window as acknowledgements make room, in order and before anything
newer, as Mosquitto does: ``resends`` holds their packet ids, and ``Router.pump`` sends them
first (``resend_more``). PUBRELs all go again at once; their messages count in the window.

A message whose record is gone when it is to be sent is counted and logged (``count_lost``).
A message in the window whose record is gone (retention deleted it) is let go of
(``let_go``): a QoS 1 message leaves the window; a QoS 2 message goes on to its release
(PUBREL), so that a client that holds its packet id from an earlier send lets go of it too, and
leaves the window with the PUBCOMP (which a client without that id sends as well, MQTT-4.3.3).
"""

from __future__ import annotations

import logging
from collections import deque

from edgebroker.core.session import AWAIT_ACK, AWAIT_COMP, Session
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode_ack


class Resume:
    """Mixin of ``core.broker.Broker``."""

    def resume(self, session: Session) -> None:
        """A persistent session's client is back: send the window again, then the queue."""
        client = session.client
        window = session.receive_max or self.limits.max_inflight_messages
        sent = sum(1 for entry in session.inflight.values() if entry.state != AWAIT_ACK)
        gone = []
        later = None
        for pid, entry in session.inflight.items():
            if entry.state != AWAIT_ACK:
                client.transport.write(encode_ack(P.PUBREL, pid))
            elif sent >= window:
                if later is None:
                    later = deque()
                later.append(pid)
            elif self._write_again(session, pid, entry):
                sent += 1
            else:
                gone.append(pid)
        for pid in gone:
            self.let_go(session, pid, session.inflight[pid])
        if later is not None:
            self.resends[session] = later
        else:
            self.resends.pop(session, None)
        self.pump(session)

    def _write_again(self, session: Session, pid: int, entry) -> bool:
        """Send an unacknowledged PUBLISH again (DUP); False when its record is gone."""
        ids = None if entry.group is None else self.shared_ids(session, entry.group)
        return self._write_publish(session.client, entry.message, entry.qos, entry.retain,
                                   True, pid, ids)

    def resend_more(self, session: Session, window: int) -> None:
        """The rest of a resumed window (``resends``), as far as acknowledgements made room."""
        later = self.resends[session]
        inflight = session.inflight
        sent = len(inflight) - sum(1 for pid in later if pid in inflight
                                   and inflight[pid].state == AWAIT_ACK)
        while later and sent < window:
            pid = later.popleft()
            entry = inflight.get(pid)
            if entry is None or entry.state != AWAIT_ACK:
                continue                  # acknowledged meanwhile (it had arrived before)
            if self._write_again(session, pid, entry):
                sent += 1
            else:
                self.let_go(session, pid, entry)
        if not later:
            del self.resends[session]

    def let_go(self, session: Session, pid: int, entry) -> None:
        """A message in the window whose record is gone (counted by the caller)."""
        if entry.qos == 2 and session.client is not None:
            entry.state = AWAIT_COMP
            del session.inflight[pid]
            session.inflight[pid] = entry          # PUBRELs in the order they are sent
            if self.exchanges is not None and not session.clean:
                self.exchanges.released(session.client_id, pid)
            session.client.transport.write(encode_ack(P.PUBREL, pid))
            return
        del session.inflight[pid]
        session.inflight_bytes -= entry.message.size

    def count_lost(self, client, offset: int) -> None:
        """A message's record is gone when it is to be sent: counted, logged once
        (``client`` None: its connection closed meanwhile)."""
        self.stats.publish_lost += 1
        self.events.log(logging.WARNING, "publish_lost", self.clock(),
                        "queued message at log offset %d for %s is no longer in the log "
                        "(deleted by retention or damaged); skipped (counted: publish_lost)",
                        offset, client.describe() if client is not None else
                        "a closed connection")

    def record_gone(self, receiver, offset: int) -> None:
        """A transport dropped a PUBLISH it was to send from the log, whose record retention
        deleted meanwhile (server.transport): counted and logged; its place in the window is
        let go of in the next pass (not in the middle of this one's sends)."""
        self.count_lost(receiver, offset)
        if receiver is None:
            return
        self.records_gone.append((receiver, offset))
        if not self._catch_up_timer.pending:
            self._catch_up_timer.start(self, self.clock())

    def let_go_of_gone(self) -> None:
        """The window places of ``records_gone`` (at the start of a pass's timers)."""
        gone, self.records_gone = self.records_gone, []
        for client, offset in gone:
            session = client.session
            if session is None or session.client is not client:
                continue                  # taken over, or closed: resume sees to it
            for pid, entry in session.inflight.items():
                if entry.state == AWAIT_ACK and entry.message.offset == offset:
                    self.let_go(session, pid, entry)
                    self._catch_up_again.add(session)
                    break
