"""Messages a bridge's remote refuses (``Bridge`` takes these methods; docs/bridge.md,
"Refused messages"): a 5.0 reason code of 0x80 or more in a PUBACK or PUBREC (also one
MQTT 5.0 does not list for it, such as Mosquitto 2.0's 0x95), or a refusal of the client
library before sending (what the remote's CONNACK said it does not take). Quota exceeded and
server busy: sent again after a back-off, the cursor waits; QoS or retain not supported,
before sending: sent again within what the remote takes; the rest: skipped, counted
(``bridge_refused``), logged once per reason code."""

from __future__ import annotations

import bisect
import logging
import random

from edgebroker.bridge.outbound import shown
from edgebroker.client.backoff import ceiling
from edgebroker.client.resume import release
from edgebroker.errors import (
    PACKET_TOO_LARGE, QOS_NOT_SUPPORTED, QUOTA_EXCEEDED, REASON_NAMES, RETAIN_NOT_SUPPORTED,
    SERVER_BUSY,
)

log = logging.getLogger("edgebroker.bridge")

# The codes after which a message is sent again later, not skipped.
REFUSED_FOR_NOW = (QUOTA_EXCEEDED, SERVER_BUSY)
# The codes the client library gives a message it does not send (the remote's CONNACK).
BEFORE_SENDING = (QOS_NOT_SUPPORTED, RETAIN_NOT_SUPPORTED, PACKET_TOO_LARGE)


class Refusals:
    """The refusal path of ``Bridge`` (a mixin over its state)."""

    def _refused(self, request, code: int, unlisted: bool = False) -> None:
        """A message the remote refused (a 5.0 reason code >= 0x80 in PUBACK, PUBREC;
        ``unlisted``: one 5.0 does not allow there) or the client library refused before
        sending (what the remote's CONNACK said it does not take). "Later" codes: sent again
        after a back-off, the cursor waits; QoS or retain not supported, before sending: sent
        again within what the remote takes; the rest: skipped, counted."""
        offset, topic = request.token, request.topic
        name = REASON_NAMES.get(code, "refused")
        before = code in BEFORE_SENDING and not unlisted
        if before:
            self._release_held(request)
        if code in REFUSED_FOR_NOW:
            self._busy.append(request)
            self._busy_times += 1
            self._once(("busy", code), "bridge %s: the remote answered %#04x (%s) to the message "
                       "at offset %d for %s: it is sent again after a back-off, and nothing new "
                       "meanwhile; the cursor waits (logged once per code)",
                       self.name, code, name, offset, shown(topic))
            if not self._busy_retry.pending:
                low = self.config.reconnect_min
                cap = ceiling(self._busy_times - 1, low, self.config.reconnect_max)
                self._busy_retry.start(self.broker, self.clock() + random.uniform(low, cap))
            return
        if before and code != PACKET_TOO_LARGE:    # QoS or retain not supported
            # Asked before the CONNACK that says so (pump sends within it): again, within it.
            # It stays outstanding (the cursor waits for it); when the client library's
            # queue is full (requests queued before that CONNACK), it waits in ``_lowered``.
            qos = min(request.qos - (code == QOS_NOT_SUPPORTED), self.max_qos)
            retain = request.retain and code != RETAIN_NOT_SUPPORTED and self.retain_available
            bisect.insort(self._lowered, (offset, topic, request.payload, qos, retain,
                                          request.properties))
            self._send_lowered()
            return
        if self.outbound.refuse(offset):
            self.broker.drop("bridge_refused", None, 1)
            if before:
                how = "before sending, over the remote's Maximum Packet Size"
            elif unlisted:
                how = "by the remote, with a code MQTT 5.0 does not allow there [MQTT-2.4]"
            else:
                how = "by the remote"
            self._once(("refused", code, unlisted), "bridge %s: the message at offset %d for "
                       "%s was refused %s (reason code %#04x, %s): skipped, counted as refused "
                       "(bridge_refused); logged once per reason code", self.name, offset,
                       shown(topic), how, code, name)

    def _release_held(self, request) -> None:
        """A QoS 2 message refused before it was sent *again* (it keeps its packet id: an
        earlier link sent it under that id, and the remote kept the session): the remote
        may hold it past a PUBREC that was lost, so it gets the PUBREL MQTT-4.4.0-1 owes it
        (answered 0x92 if it held nothing); else that id would keep a place of its Receive
        Maximum for good. Counted with the other PUBRELs of release.py."""
        pid = request.packet_id
        conn = self.conn
        if request.qos == 2 and pid is not None and conn.state == "connected":
            self.releasing += release(conn, (pid,))

    def _send_lowered(self) -> bool:
        """Hand the client library the messages to send again within the remote's Maximum
        QoS or Retain Available, in log order, as its queue allows; True when none waits.
        Those left wait for room: the acknowledgements that free it call ``pump``, which
        calls this first and sends nothing new before they went."""
        lowered = self._lowered
        conn = self.conn
        n = 0
        while n < len(lowered) and conn.can_publish:
            offset, topic, payload, qos, retain, props = lowered[n]
            conn.publish(topic, payload, qos, retain, props, token=offset)
            n += 1
        del lowered[:n]
        return not lowered

    def _send_busy_again(self) -> None:
        """The back-off after a "later" refusal is over: the refused messages go again, in
        log order (counted as resent), then what follows (``pump``). Not while the link is
        down: ``_connected`` calls this again."""
        if self.state != "up" or self.link is None:
            return
        busy = sorted(self._busy, key=lambda request: request.token)
        self._busy = []
        conn = self.conn
        for i, request in enumerate(busy):
            if not conn.can_publish:
                self._busy = busy[i:]
                self._busy_retry.start(self.broker, self.clock() + self.config.reconnect_min)
                break
            conn.publish(request.topic, request.payload, request.qos, request.retain,
                         request.properties, token=request.token)
            self.outbound.resent += 1
        self.pump()

    def _once(self, key, message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)
