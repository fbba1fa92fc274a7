"""One ``[[bridge]]``: the link to a remote broker, driven by the core loop (no thread).

The parts: ``Link`` (the socket, TLS), the client library's sans-I/O ``Connection`` (MQTT:
packet ids, the window, resending after a reconnect, keepalive), ``Outbound`` (the log
consumer and its cursor), ``Inbound`` (remote messages published here), the checkpoint file,
in pump.py how the backlog is handed to the remote, in subscribing.py the remote
subscriptions of the ``in`` rules, in refusals.py what the remote refuses, in reconnect.py
the back-off between connections, and in stopping.py the stop.
``Bridge`` moves bytes and events between them:

- bytes from the link go to ``Connection.receive_data``; its events are handled (``Acked``
  moves the cursor: the request's token is the record's log offset; ``Message`` is published
  here); what the connection has to send goes to the link at once;
- the outbound side is *pumped* whenever the window may have room: after acknowledgements,
  after the link comes up, when the link's buffer drained (``on_drained``: a QoS 0 backlog
  takes no place in the window), and after each loop pass that wrote records to the log
  (``on_written``: the core's after-write hook, so a bridge at the head is woken by the
  next message, never by polling). A backlog drains at the speed of the window's round trips,
  within ``bandwidth``;
- the connection's keepalive deadline, the reconnect back-off, the checkpoint interval and a
  bandwidth pause are ``Timer``s in the broker's deadline heap.

After the link breaks the connection keeps its in-flight requests and sends them again once
the next CONNACK comes (counted as resent): with DUP when the remote kept the session, as new
messages when it did not (client/resume.py); nothing new meanwhile: the backlog waits in the log.
"""

from __future__ import annotations

import logging

from edgebroker.bridge import checkpoint
from edgebroker.bridge.inbound import Inbound, LinkAsPublisher
from edgebroker.bridge.link import Link
from edgebroker.bridge.outbound import Outbound
from edgebroker.bridge.pump import Pumping
from edgebroker.bridge.reconnect import Reconnecting
from edgebroker.bridge.refusals import Refusals
from edgebroker.bridge.release import Releasing
from edgebroker.bridge.rules import Rules
from edgebroker.bridge.stopping import Stopping
from edgebroker.bridge.subscribing import Subscribing
from edgebroker.bridge_config import split_address
from edgebroker.client.connection import Connection
from edgebroker.client.requests import is_release
from edgebroker.client.events import (Acked, Connected, ConnectFailed, Disconnected, Message,
                                      Oversized, PingTimeout, Subscribed, Unsubscribed)
from edgebroker.rates import TokenBucket
from edgebroker.core.timers import Timer
from edgebroker.errors import PACKET_TOO_LARGE
from edgebroker.mqtt.properties import (MAXIMUM_QOS, RETAIN_AVAILABLE, SERVER_KEEP_ALIVE,
                                         SESSION_EXPIRY)

log = logging.getLogger("edgebroker.bridge")


class Bridge(Refusals, Pumping, Releasing, Reconnecting, Stopping, Subscribing):
    def __init__(self, config, broker, selector, wake, state_dir: str, tls_context=None):
        self.config = config
        self.name = config.name
        self.broker = broker
        self.clock = broker.clock
        self.selector = selector
        self.wake = wake
        self.tls_context = tls_context
        self.host, self.port = split_address(config.address)
        self.rules = Rules(config.topic)
        self.client_id = config.remote_client_id
        self.path = checkpoint.path_of(state_dir, self.name)
        self.writer = None          # checkpoint.CheckpointWriter, set by the app
        self.state = "down"         # down | resolving | connecting | up | stopped
        self.link: Link | None = None
        self._pings, self._ping_end = 0, float("inf")   # the last PINGREQ's end (on_moved)
        self.resolver = None        # link.Resolver, while a host name is resolved
        self.connects = 0           # successful CONNACKs
        self.last_error = ""
        self.bytes_out = 0          # of links closed (the open one's are added in figures)
        self.bucket = None
        self.init_reconnect()
        # MQTT 5.0 keeps no session without a Session Expiry Interval (0 when absent): with
        # clean_start false the bridge asks for session_expiry (default: never expires).
        keep = config.protocol_version == 5 and not config.clean_start and config.session_expiry
        self.conn = Connection(self.client_id, protocol=config.protocol_version,
                               clean_start=config.clean_start, keepalive=config.keepalive,
                               username=config.username or None,
                               password=config.password.encode() if config.password else None,
                               properties={SESSION_EXPIRY: config.session_expiry} if keep
                               else None,
                               max_inflight=config.window,
                               # (and this link's SUBSCRIBE and UNSUBSCRIBE: they may
                               # wait there for a free packet id)
                               max_queued=config.window + 2,
                               connect_timeout=config.connect_timeout,
                               max_packet_size=broker.limits.max_packet_size,
                               auto_ack=False)   # inbound: acknowledged once logged
        self.conn.bridge_marker = config.protocol_version == 4 and config.try_private
        self.publisher = LinkAsPublisher(self.client_id, self)
        self.inbound = Inbound(self.name, broker, self.rules, self.publisher)
        self.inbound.v5 = config.protocol_version == 5
        self.inbound.as_published = self.inbound.v5 or self.conn.bridge_marker
        self.inbound.acked_below = lambda: self.outbound.cursor
        self.outbound: Outbound | None = None
        self._paused_reading: set[str] = set()
        self.checkpoint_ahead = 0   # starts with a checkpoint past the log's end
        self.checkpoint_damaged = 0  # ... with one that could not be read (started at the head)
        self._retry = Timer(self._connect)
        self._tick = Timer(self._on_tick)
        self._save = Timer(self._on_checkpoint)
        self._again = Timer(self.pump)
        # The refusal path (docs/bridge.md, "Refused messages").
        self.max_qos = 2                 # the remote's Maximum QoS (5.0 CONNACK)
        self.retain_available = True     # the remote's Retain Available (5.0 CONNACK)
        self._busy: list = []            # requests refused with 0x89/0x97, to send again
        self._lowered: list = []         # refused over Maximum QoS/Retain, to send within
        self._busy_times = 0             # such refusals since one was accepted (back-off)
        self._busy_retry = Timer(self._send_busy_again)
        self._warned: set = set()        # what was logged once
        self._sent_before = (0, 0)       # publishes in flight at the link's loss, past PUBREC
        self._give_up = Timer(self._connect_expired)   # connect_timeout, from _connect on
        self.init_stopping()

    # ----- start and stop ---------------------------------------------------------------

    def start(self) -> None:
        journal = self.broker.journal
        commit_log = journal.log
        try:
            saved = checkpoint.load(self.path)
        except checkpoint.Damaged:
            self.checkpoint_damaged += 1
            saved = None
        self.init_release(saved[2] if saved is not None else None)
        self.init_subscriptions(saved[3] if saved is not None else None)
        on_disk = saved[0] if saved is not None else None   # the file's cursor (None: none)
        if saved is None:
            head = commit_log.next_offset
            saved = (head, head, None, None)
            log.info("bridge %s: %s: it forwards from the head of the log (offset %d)",
                     self.name, "its checkpoint was damaged" if self.checkpoint_damaged
                     else "no checkpoint", head)
            on_disk = self._write_start(head, on_disk)
        cursor, sent = saved[:2]
        head = commit_log.next_offset
        if cursor > head:
            # The log came back shorter than the checkpoint (a power cut took its tail, or it
            # was replaced): new records get those offsets again and must be forwarded. The
            # file says so at once: else a crash after the log grew past the old cursor
            # would go on from there, past records never forwarded.
            self.checkpoint_ahead += 1
            log.warning("bridge %s: its checkpoint (offset %d) is past the end of the log "
                        "(next offset %d): the log lost its tail (a power cut?); it goes on "
                        "from %d (counted in checkpoint_ahead)", self.name, cursor, head, head)
            cursor = head
            on_disk = self._write_start(head, on_disk)
        sent = max(cursor, min(sent, head))
        if on_disk is not None:     # (else, or when it differs, save_checkpoint writes it)
            self.writer.on_disk[self.path] = on_disk
        self.outbound = Outbound(self.name, commit_log, self.rules,
                                 self.publisher.client_id_bytes, cursor, sent,
                                 drop=self._drop, journal=self.broker.journal,
                                 clock=self.clock)
        if self.config.bandwidth:
            self.bucket = TokenBucket(self.config.bandwidth, self.config.bandwidth, self.clock())
        log.info("bridge %s: to %s as %r, from log offset %d (%d sent before, counted as "
                 "resent when sent again; more may have been sent after that checkpoint)",
                 self.name,
                 self.config.address, self.client_id, cursor, max(0, sent - cursor))
        self._save.start(self.broker, self.clock() + self.config.checkpoint_interval)
        self._connect()

    def _drop(self, reason: str, session, count: int) -> None:
        """A message dropped by the outbound side: the broker's drop reasons count it."""
        self.broker.drop(reason, session, count)

    def _write_start(self, cursor: int, on_disk: int | None) -> int | None:
        """The checkpoint the bridge starts from, written before it goes on; returns the
        cursor the file holds (``on_disk`` when the write failed: the first save_checkpoint
        then sees the difference and writes it again, each checkpoint_interval)."""
        try:
            checkpoint.write(self.path, self.name, cursor, cursor, self.packet_ids,
                             self.remote_subs)
            self.ids_saved = self.packet_ids
            return cursor
        except OSError as exc:
            self.writer.count_failure(self.path, self.name, exc)
            return on_disk

    # ----- connecting -------------------------------------------------------------------

    def _connect(self) -> None:
        if self.state == "stopped":
            return
        address = self.next_address()   # (reconnect.py)
        if address is None:
            return      # the name is being resolved: deliver() comes back here
        if isinstance(address, str):
            return self._failed(address)
        self.state = "connecting"
        # One deadline for this address: TCP connect, TLS handshake, CONNECT/CONNACK.
        self._give_up.start(self.broker, self.clock() + self.config.connect_timeout)
        try:
            self.link = Link(self.selector, self, *address, tls_context=self.tls_context,
                             server_name=self.host)
        except OSError as exc:
            self._failed(f"connect failed: {exc.strerror or exc}")

    def _connect_expired(self) -> None:
        link = self.link
        if self.state != "connecting" or link is None:
            return
        stage = ("the TCP connect" if not link.connected else
                 "the TLS handshake" if not link.up else "the CONNACK")
        link.close(f"no connection within connect_timeout ({self.config.connect_timeout:g} s): "
                   f"{stage} did not finish")

    def deliver(self) -> None:
        """After a wake-up: a host name resolved."""
        if self.resolver is not None and self.resolver.done:
            self._connect()

    # ----- the link's callbacks ---------------------------------------------------------

    def on_up(self) -> None:
        self._addresses = []    # this one answered: the host's others are not tried
        self._pings, self._ping_end = self.conn.pings_sent, float("inf")
        self.conn.connect(self.clock())
        self._send()

    def on_data(self, data: bytes) -> None:
        self._handle(self.conn.receive_data(data, self.clock()))
        self.pump()

    def on_moved(self, start: int) -> None:
        """Bytes that waited in the link's buffer left, from its ``start``-th byte out: the
        keepalive counts it as life while the PINGREQ is among them, not once it has left
        (a peer that reads and never answers, a proxy before a dead remote)."""
        if start < self._ping_end:
            self.conn.moved_at = self.clock()

    def on_closed(self, reason: str) -> None:
        self.bytes_out += self.link.bytes_out if self.link is not None else 0
        self.link_closed()
        self.link = None
        self.inbound.fresh_from = None
        if self.conn.state != "closed":
            self.conn.connection_lost()
        self.withdraw_subscribing()     # not answered: the next link subscribes afresh
        # Sent on this link and not acknowledged: sent again after the next CONNACK (those
        # still queued in the connection were never sent: not resends; nor the PUBRELs of
        # release.py).
        releasing = self.releasing
        self._sent_before = (self.conn.inflight_publishes - releasing,
                             self.conn.inflight_past_pubrec - releasing)
        if not self.config.clean_start and (self.config.protocol_version == 4
                                            or self.config.session_expiry):
            self.inbound.link_lost()    # the remote kept the session: it sends them again
        self._failed(reason)

    # ----- the publisher seam (inbound: a full log pauses reading the link) --------------

    def pause_reading(self, reason: str) -> None:
        self._paused_reading.add(reason)
        if self.link is not None:
            self.link.pause_reading(reason)

    def resume_reading(self, reason: str) -> None:
        self._paused_reading.discard(reason)
        if reason == "log" and self.inbound.held:
            self.inbound.retry()
        if self.link is not None:
            self.link.resume_reading(reason)

    def write(self, message: Message) -> None:
        """The journal's acknowledgement seam (``Journal.acknowledge``): the record of an
        inbound ``message`` is safe under ``durability``, or the message was dropped here;
        acknowledge it to the remote (PUBACK, PUBREC)."""
        if self.conn.ack(message) and self.link is not None:
            self._send()

    # ----- MQTT events ------------------------------------------------------------------

    def _handle(self, events) -> None:
        """Each event in turn; a failure handling one is logged and the next ones are still
        handled (a bug must not freeze the cursor behind the rest of the batch)."""
        for event in events:
            try:
                if self._event(event):
                    return
            except Exception:
                what = type(event).__name__
                if ("error", what) not in self._warned:
                    self._warned.add(("error", what))
                    log.exception("bridge %s: internal error handling %r (the other events "
                                  "go on; logged once per event kind)", self.name, event)

    def _event(self, event) -> bool:
        """Handle one event; True when the link closed (the rest of the batch is void)."""
        kind = type(event)
        if kind is Acked:
            request = event.request
            if is_release(request):
                self.released()
            elif request.kind == "publish":
                if event.reason_code < 0x80:
                    self.outbound.acked(request.token)
                    if request.qos:
                        self._busy_times = 0
                    else:       # handed to the link: in its buffer until sent (stopping.py)
                        self.handed(request.token)
                else:
                    self._refused(request, event.reason_code, event.unlisted)
        elif kind is Message:
            self.inbound.message(event)
        elif kind is Oversized:     # read past by the connection: dropped, acknowledged
            self.inbound.oversized(event)
        elif kind is Connected:
            self._connected(event)
        elif kind is Subscribed:
            self.on_subscribed(event)
        elif kind is Unsubscribed:
            self.on_unsubscribed(event)
        elif kind in (ConnectFailed, Disconnected, PingTimeout):
            if kind is ConnectFailed and event.reason_code == 1 and self.conn.bridge_marker:
                self.marker_refused(event.reason)     # (reconnect.py)
            reason = (f"{kind.__name__}: {event.reason}" if kind is not PingTimeout
                      else "no PINGRESP within the keepalive")
            if (kind is Disconnected and event.reason_code == PACKET_TOO_LARGE
                    and event.reason.startswith("the server broke")):   # not its DISCONNECT
                self.inbound.too_large(event.reason)
            link = self.link     # (a send that fails closes it, and self.link is None then)
            if link is not None:
                link.send(self.conn.data_to_send())   # a protocol error's DISCONNECT
                link.close(reason)
            return True
        return False

    def _connected(self, event: Connected) -> None:
        self._give_up.cancel()
        self.state = "up"
        self._up()
        self.connects += 1
        self.last_error = ""
        # The log still cannot write: the new link is not read either (past its CONNACK).
        for why in self._paused_reading:
            self.link.pause_reading(why)
        self.release_on_connect(event.session_present)    # before anything new
        (sent, released), self._sent_before = self._sent_before, (0, 0)
        resent = sent - released if event.session_present else sent   # sent again now
        self.outbound.resent += resent
        log.info("bridge %s: connected to %s (session present: %s; %d messages sent again)",
                 self.name, self.config.address, event.session_present, resent)
        props = event.properties or {}
        self.max_qos = props.get(MAXIMUM_QOS, 2)
        self.retain_available = bool(props.get(RETAIN_AVAILABLE, 1))
        top = max((rule.qos for rule in self.rules.out), default=0)
        if top > self.max_qos:
            self._once(("max_qos", self.max_qos), "bridge %s: the remote's Maximum QoS is %d: "
                       "out rules with QoS %d are sent at QoS %d (logged once)", self.name,
                       self.max_qos, top, self.max_qos)
        if props.get(SERVER_KEEP_ALIVE) == 0:
            self._once("keepalive", "bridge %s: the remote set Server Keep Alive 0: no "
                       "keepalive on this link, so a silently broken link is not noticed "
                       "(logged once)", self.name)
        if not self.retain_available and self.rules.out:
            self._once("retain", "bridge %s: the remote does not take retained messages "
                       "(Retain Available 0): they are sent without the retain flag (logged "
                       "once)", self.name)
        if self._busy and not self._busy_retry.pending:
            self._busy_retry.start(self.broker, self.clock())
        self.subscribe_on_connect(event.session_present)

    # ----- sending ----------------------------------------------------------------------

    def on_written(self) -> None:
        """The core wrote records to the log (end of a loop pass): go on if at the head. A
        failure here is this bridge's internal error, logged once: it never reaches the
        core's loop pass (``Broker.end_pass``), which would end the broker."""
        try:
            if (self.state == "up"
                    and self.outbound.read_at < self.broker.journal.log.written_offset):
                self.pump()
        except Exception:
            if ("error", "on_written") not in self._warned:
                self._warned.add(("error", "on_written"))
                log.exception("bridge %s: internal error forwarding after a loop pass (the "
                              "broker goes on; logged once)", self.name)

    def _send(self) -> None:
        conn = self.conn
        while True:
            data = conn.data_to_send()
            link = self.link
            if data and link is not None:
                link.send(data)
                if link.closed:
                    self._lost_in_send()
                    break
                self.handed_end = link.bytes_out + link.out_bytes
                if conn.pings_sent != self._pings:      # a PINGREQ in it: where it ends
                    self._pings, self._ping_end = conn.pings_sent, link.bytes_out + len(link.out)
            if self.state != "up":
                break
            # Events made outside receive_data: QoS 0 handed out, publishes the client
            # library refused before sending (acked_qos0 drains them all). Handling them
            # may send again (a QoS downgraded): until nothing more comes.
            events = conn.acked_qos0()
            if not events:
                break
            self._handle(events)
        due = conn.next_deadline()
        if due is not None and self.state != "stopped":
            if not self._tick.pending or self._tick.when > due:
                self._tick.start(self.broker, due)

    def _lost_in_send(self) -> None:
        """The send closed the link (the remote reset it): the QoS 0 messages of that batch,
        handed out, are lost with it (counted with those ``link_closed`` counted), not
        credited to the next link; at a stop the cursor stays before them (sent again at the
        next start). The other events go on as usual."""
        lost, rest = 0, []
        stopping = self.state == "stopped"
        for event in self.conn.acked_qos0():
            request = getattr(event, "request", None)
            if (type(event) is Acked and request.kind == "publish" and not request.qos
                    and event.reason_code < 0x80):
                if not stopping:
                    self.outbound.acked(request.token)
                    lost += 1
            else:
                rest.append(event)
        self.count_lost_qos0(lost)
        if rest:
            self._handle(rest)

    def _on_tick(self) -> None:
        self._handle(self.conn.tick(self.clock()))
        if self.link is not None:
            self._send()

    # ----- the cursor on disk and in the log --------------------------------------------

    def _on_checkpoint(self) -> None:
        self._save.start(self.broker, self.clock() + self.config.checkpoint_interval)
        self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Hand the writer the checkpoint when it differs from the one on disk."""
        outbound = self.outbound
        # Never ahead of what survives a power cut: records are forwarded once written, before
        # their fsync, and a checkpoint past the durable log would skip the records that take
        # those offsets again after one. (durability none fsyncs only sealed segments and
        # promises nothing across a power cut: there the start's check covers it.)
        journal = self.broker.journal
        durable = (journal.log.durable_offset if journal.durability != "none"
                   else journal.log.written_offset)
        cursor = min(outbound.cursor, durable)
        sent = max(cursor, min(outbound.sent_to, durable))
        # (A write that failed left the file behind what was handed to the writer: again.)
        ids, subs = self.packet_ids, self.remote_subs
        if (cursor != outbound.saved or sent > outbound.resend_until or ids != self.ids_saved
                or subs is not self.subs_saved
                or self.writer.on_disk.get(self.path) != outbound.saved):
            self.writer.submit(self.path, self.name, cursor, sent, ids, subs)
            outbound.saved = cursor
            self.ids_saved, self.subs_saved = ids, subs
            outbound.resend_until = max(outbound.resend_until, sent)

    def hold(self) -> int:
        """The core's periodic check: a gap retention made is counted; the offset below which
        the log may delete segments for age without losing what this bridge still needs
        (from the checkpoint on disk, which a crash goes back to, where a write failed)."""
        self.outbound.check_gap()
        hold = self.outbound.hold()
        return min(hold, self.writer.on_disk.get(self.path, hold))

    def figures(self, wall_ms: int) -> dict:
        ob = self.outbound
        lag = self.broker.journal.log.lag(ob.cursor, wall_ms)
        link = self.link
        return {
            "name": self.name, "remote": self.config.address, "client_id": self.client_id,
            "state": self.state, "cursor": ob.cursor, "saved_cursor": ob.saved,
            "checkpoint_cursor": self.writer.on_disk.get(self.path, ob.saved),
            "lag_messages": lag["lag_records"], "lag_bytes": lag["lag_bytes"],
            "lag_seconds": lag["lag_seconds"], "inflight": self.conn.inflight,
            "forwarded": ob.forwarded, "forwarded_bytes": ob.forwarded_bytes,
            "resent": ob.resent, "gaps": ob.gaps, "gap_offsets": ob.gap_offsets,
            "refused": ob.refused, "unsendable": ob.unsendable, "expired": ob.expired,
            "checkpoint_ahead": self.checkpoint_ahead,
            "checkpoint_damaged": self.checkpoint_damaged,
            "checkpoint_failures": self.writer.failed.get(self.path, 0),
            "connects": self.connects, "reconnects": max(0, self.connects - 1),
            "short_links": self.short_links,
            "received": self.inbound.received, "received_dropped": self.inbound.dropped,
            "received_held": len(self.inbound.held), "ids_reused": self.conn.ids_reused,
            "not_sent_back": ob.skipped_own,
            "bytes_out": self.bytes_out + (link.bytes_out if link is not None else 0),
            "last_error": self.last_error,
        }
