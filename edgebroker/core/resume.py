"""A persistent session's client is back (``Resume.resume``): what was sent and not
acknowledged goes again, DUP, with its packet ids (MQTT-4.4.0-1), then the queue and the log.

No more PUBLISHes than the window (Receive Maximum, or ``max_inflight_messages``) are
unacknowledged at once (MQTT-3.3.4-9). A client back with a smaller Receive Maximum than it had
gets the rest of the old window as acknowledgements make room, in order and before anything
newer, as Mosquitto does: ``resends`` holds their packet ids, and ``Router.pump`` sends them
first (``resend_more``). PUBRELs all go again at once; their messages count in the window.
"""

from __future__ import annotations

from collections import deque

from edgebroker.core.session import AWAIT_ACK, Session
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
            session.inflight_bytes -= session.inflight.pop(pid).message.size
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
                session.inflight_bytes -= inflight.pop(pid).message.size
        if not later:
            del self.resends[session]
