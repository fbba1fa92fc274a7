"""Handing the remote a bridge's backlog (``Bridge`` takes these methods): what the window,
the link's buffer and the bandwidth cap allow, read from the log by ``Outbound``. Only QoS
1/2 messages take a place in the window; QoS 0 ones are limited by the link's buffer alone.
A pump that stops with work left says when to go on: an acknowledgement, the link's buffer
drained (``on_drained``), the bandwidth back, or the next pass (a long stretch of the log
that no rule matches is read over several)."""

from __future__ import annotations

from edgebroker.bridge.outbound import remaining
from edgebroker.client.requests import ClientError, QueueFull

# Records one pump reads at most before it lets the loop go on.
READS_PER_PUMP = 4
# The link's unsent output above which nothing new is handed to it.
MAX_LINK_OUT = 1024 * 1024


class Pumping:
    """The pump of ``Bridge`` (a mixin over its state)."""

    def pump(self) -> None:
        """Hand the remote what the window, the link and the bandwidth cap allow. Only QoS
        1/2 messages take a place in the window; QoS 0 ones are limited by the link's
        buffer alone: when it is full the link says when it drained (``on_drained``)."""
        if self.state != "up" or self.link is None:
            return
        conn = self.conn
        outbound = self.outbound
        # Messages to send again within the remote's limits (refusals.py) go first; while
        # some wait for the client library's queue, nothing new.
        waiting = bool(self._lowered) and not self._send_lowered()
        # (this link's SUBSCRIBEs and UNSUBSCRIBE, queued or in flight, take no place in
        # the window)
        room = (self.config.window - conn.inflight - conn.queued + len(self.subscribing))
        # Bytes that may still be handed to the link in this pass.
        limit = MAX_LINK_OUT - self.link.out_bytes
        reads = 0
        bucket = self.bucket
        # A "later" refusal (nothing new until it was sent again), or over the bandwidth.
        blocked = (bool(self._busy) or waiting
                   or bucket is not None and bucket.refill(self.clock()) < 1.0)
        if blocked:
            if not self._busy and not waiting:
                self._wait_for_bandwidth()
            limit = 0
        publish = conn.publish
        pending = outbound.pending
        max_qos = self.max_qos
        v5 = self.inbound.v5
        now_ms = int(self.clock() * 1000)      # (Message Expiry: Outbound.read)
        while limit > 0:
            if not pending:
                if reads >= READS_PER_PUMP:
                    if not self._again.pending:
                        self._again.start(self.broker, self.clock())
                    break
                reads += 1
                if not outbound.read():
                    break
                continue
            head = pending[0]
            if head[6] and head[6] <= now_ms:
                outbound.expire()   # its Message Expiry passed: not forwarded
                continue
            qos = min(head[3], max_qos)
            if qos and room <= 0 or not conn.can_publish:
                break       # the window is full: an acknowledgement calls pump again
            if qos == 2 and conn.qos2_full:
                break       # ... as for the QoS 2 messages a 3.1.1 remote holds (the client
                # library's max_qos2_inflight: client/connection.py, QOS2_INFLIGHT_311)
            record = outbound.take()
            offset, topic, payload, _, retain, props, expires = record
            if retain and not self.retain_available:
                retain = False
            if not v5:
                props = None
            elif expires:
                props = remaining(props, expires, now_ms)
            try:    # (the topic was checked as it was read: Outbound.read)
                publish(topic, payload, qos, retain, props, token=offset)
            except QueueFull:
                outbound.untake(record)
                break
            except ClientError as exc:      # never held outstanding: the cursor goes on
                outbound.untake(record, str(exc))
                continue
            if qos:
                room -= 1
            size = len(payload) + len(topic)
            limit -= size
            if bucket is not None and not bucket.spend(size, self.clock()):
                self._wait_for_bandwidth()
                break
        self._send()
        link = self.link
        if not blocked and limit <= 0 and link is not None and (
                pending or not outbound.at_head()):
            # Stopped by the link's buffer with work left: go on when it drained (half
            # empty), or at once when the socket took it all already.
            if link.out_bytes >= MAX_LINK_OUT // 2:
                link.drained_below = MAX_LINK_OUT // 2
            elif not self._again.pending:
                self._again.start(self.broker, self.clock())

    def on_drained(self) -> None:
        """The link's unsent output fell below ``drained_below``: hand it more."""
        if not self._again.pending:
            self._again.start(self.broker, self.clock())

    def _wait_for_bandwidth(self) -> None:
        """Over ``bandwidth``: go on once 20 ms' worth of it is back (at least one byte)."""
        if not self._again.pending:
            self._again.start(self.broker, self.clock() + self.bucket.wait_for_share(0.02))
