"""One network connection's MQTT conversation with the broker: its state and its input.

A ``Client`` holds what one connection knows (its session, will, keepalive,
throttle, ...), feeds received bytes to its decoder and hands each packet to a
handler (``core.handlers``) through its current handler table (``core.dispatch``
states the rules). It never touches a socket: it writes bytes to its transport
(``core.transport``: ``write``/``close``) and the server layer moves them.

- Any violation closes the connection and, once connected, publishes the will (``violation``);
  what the client published earlier in that read is acknowledged first.
- A client over its publish rate, or over its control packet rate (PINGREQ, SUBSCRIBE, ...:
  ``charge_control``), is throttled (``core.throttling``): its socket is not read until its
  budget refills (a timer in the broker's heap), so TCP pushes back on it alone; a peer that
  goes away meanwhile is still served at its rate for a grace, then let go.
- Reading may be paused for several reasons at once (the password check, the publish rate, a
  commit log that cannot write); each holder resumes only its own (``Transport.pause_reading``).
"""

from __future__ import annotations

import logging

from edgebroker.errors import KEEP_ALIVE_TIMEOUT, ProtocolError, name_shown
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.stream import Decoder
from edgebroker.core import mqtt5, throttling, violations
from edgebroker.core.dispatch import (
    AUTH_EXCHANGE, AUTHENTICATING, BEFORE_CONNECT, CONNECTED, CONNECTED5, CONNECTED5_RATED,
    CONNECTED_RATED, PUBACKS_TOGETHER,
)
from edgebroker.core.handlers import acks, auth, connect
from edgebroker.core.handlers.connect import connections_log
from edgebroker.core.limits import connect_size_limit

TYPE_CHECKING = False   # typing (core.transport's Protocol) for type checkers only: memory
if TYPE_CHECKING:
    from edgebroker.core.transport import Transport

log = logging.getLogger("edgebroker.client")

_PROGRESS_BYTES = 1024     # bytes of a packet partly received that count for keepalive
# warn_first: the distinct names of a kind (denied topics, refused filters) logged per
# connection; the rest are only counted.
FIRST_LOGGED = 16


class ClosedTransport:
    """The transport of a closed client (``Client.close``): writes go nowhere, figures are 0.

    A closed client lets go of its real transport, so it and the server's connection object
    no longer refer to each other: each is freed at once, not at a full garbage collection."""

    __slots__ = ()
    peer = ""
    listener = None
    policy = None
    max_pending = 0
    out_bytes = msgs_out = bytes_in = bytes_out = 0

    def write(self, data) -> None:
        pass

    def offer(self, data, rest=None) -> bool:
        return True     # taken and dropped, as a closing transport does

    def write_file(self, head: bytes, fd: int, position: int, length: int, offset: int) -> None:
        pass

    def send_now(self) -> None:
        pass

    def wait_for_drain(self) -> None:
        pass

    def count_publish(self, n: int = 1) -> None:
        pass

    def pause_reading(self, reason: str) -> None:
        pass

    def resume_reading(self, reason: str) -> None:
        pass

    def peer_end(self) -> int | None:
        return None

    def close(self) -> None:
        pass


CLOSED = ClosedTransport()


class Client:
    __slots__ = ("broker", "transport", "peer", "decoder", "client_id", "client_id_bytes",
                 "session", "connected", "closed", "will", "keepalive", "last_seen",
                 "connect_deadline", "timer_entry", "protocol_level", "_handlers", "halted",
                 "listener_address", "created", "msgs_in", "rate", "throttled_until",
                 "throttle_start", "peer_ended_at", "throttled_time", "not_read",
                 "pending_dropped", "warned", "rate_sample", "control_due", "username", "acl",
                 "pending", "held", "refusal", "v5", "inherited", "bridge")

    def __init__(self, broker, transport: Transport, now: float):
        self.broker = broker
        self.transport = transport
        self.peer = transport.peer
        # Up to the largest valid CONNECT until one arrives (core.handlers.connect raises it).
        self.decoder = Decoder(max_packet_size=connect_size_limit(broker.limits))
        self.client_id = ""
        self.client_id_bytes = b""
        self.session = None
        self.connected = False
        self.closed = False
        self.halted = False           # closed or throttled: stop handling received packets
        self.will = None
        self.keepalive = 0
        self.last_seen = now
        self.connect_deadline = now + broker.limits.connect_timeout
        self.timer_entry = None       # this client's entry in the timer heap (core.timers)
        self.protocol_level = 0
        self.bridge = False   # CONNECT had the bridge marker (core.handlers.subscribe)
        self._handlers = BEFORE_CONNECT
        listener = transport.listener
        self.listener_address = listener.address if listener is not None else ""
        self.created = now
        self.msgs_in = 0              # PUBLISH packets received
        self.rate = None              # PublishRate when messages_rate or bytes_rate is set
        self.control_due = 0.0        # its control packet budget (core.limits.ControlRate)
        self.throttled_until = 0.0    # non-zero while throttled (socket not read)
        self.throttle_start = 0.0
        self.peer_ended_at = 0.0      # when its peer was seen to end while throttled
        self.throttled_time = 0.0     # seconds throttled, throttles that ended
        self.not_read = False         # paused by the broker (commit log): no keepalive check
        self.pending_dropped = 0      # QoS 0 dropped since the output last drained
        self.warned = None            # what was logged once for this connection (warn_once,
                                      # and ("acl", topic) for a denied PUBLISH)
        self.rate_sample = None       # (time, totals, rates) for core.metrics
        self.username = None          # the verified user name (None: anonymous)
        self.acl = None               # this client's AclView, or None without an ACL file
        self.pending = None           # [CONNECT, packets received meanwhile] while its
                                      # password check or authentication exchange runs
        self.held = None              # those not handled yet when a throttle began
        self.refusal = None           # (limit, why): refuse its CONNECT (Sessions.admission)
        self.v5 = None                # core.mqtt5.Conn5 for an MQTT 5.0 connection
        self.inherited = None         # QoS 2 ids awaiting PUBREL it took over (acks)

    def __repr__(self):
        return f"Client({self.client_id!r}, {self.peer})"

    def __lt__(self, other) -> bool:
        # Orders timer-heap entries with equal deadlines (any stable order will do).
        return id(self) < id(other)

    def describe(self) -> str:
        """The client in a log line: its id and user name (each shown up to 100 characters:
        a client id may be 64 KB long), its address."""
        name = name_shown(self.client_id) if self.client_id else "(before CONNECT)"
        if self.username is not None:
            return f"client {name} (user {name_shown(self.username)}) from {self.peer}"
        return f"client {name} from {self.peer}"

    # ----- input from the server layer -------------------------------------------------

    def data_received(self, data) -> None:
        if self.closed:
            return
        if self.halted:
            # Throttled: keep what arrives (a TLS read may still hand over decrypted
            # bytes) in the decoder until the throttle ends.
            self.decoder.keep(data)
            return
        n = len(data)
        if n >= 8 and data[0] == 0x40 and self._handlers[P.PUBACK] in PUBACKS_TOGETHER:
            pids = self.decoder.pubacks(data)
            if pids is not None:
                self._acks_received(pids, data)
                return
        self._handle(self.decoder.feed(data), n)

    def _acks_received(self, pids, data) -> None:
        """A read of PUBACKs only (``Decoder.pubacks``, from ``data``): handled together, up
        to the one that throttles the client (the rest is kept until it is read again)."""
        broker = self.broker
        handled = len(pids)
        try:
            handled = acks.on_pubacks(self, pids)
        except ProtocolError as exc:
            self.violation(exc)
        if handled < len(pids) and not self.closed:
            self.decoder.keep(data[4 * handled:])
        broker.stats.packets_received += handled
        self.last_seen = broker.clock()

    def payload_received(self, n: int) -> None:
        """``n`` bytes of a large PUBLISH were received straight into ``decoder.room``."""
        if not self.closed:
            self._handle(self.decoder.filled(n), n)

    def repeat_received(self, parts: list, n: int) -> None:
        """``n`` bytes were received into ``parts``, from ``decoder.repeat_buffers()``."""
        if self.closed:
            return
        decoder = self.decoder
        packets = None if self.halted else decoder.repeated(parts, n)
        if packets is None:
            self.data_received(decoder.unexpected(parts, n))
        else:
            self._handle(packets, n)

    def _handle(self, packets, nbytes: int) -> None:
        broker = self.broker
        handlers = self._handlers
        decoded = 0
        try:
            for packet in packets:
                decoded += 1
                handlers[packet.type](self, packet)
                if self.halted:
                    # When throttled the rest stays in the decoder until resumed; the
                    # generator reads the shared receive buffer, so it lets go now.
                    if type(packets) is not tuple:
                        packets.close()
                    break
                handlers = self._handlers
        except ProtocolError as exc:
            self.violation(exc)
        broker.stats.packets_received += decoded
        # Keepalive counts complete packets (MQTT-3.1.2-24); a large packet
        # still arriving in big pieces counts too, so it is not cut off.
        if decoded or nbytes >= _PROGRESS_BYTES:
            self.last_seen = broker.clock()

    def connection_lost(self, reason: str) -> None:
        """The socket closed or failed under us (not after DISCONNECT). The client's end of
        its stream (a TCP FIN, a WebSocket close frame) comes after the packets it sent: what
        it published before is acknowledged first, as on a DISCONNECT (the transport still
        sends what is queued before it closes)."""
        if not self.closed:
            if self.connected:
                connections_log.info("%s: connection lost (%s)", self.describe(), reason)
                self.broker.before_close()
            self.close(will=True)

    def deadline(self) -> float | None:
        """When this client must next be checked by the timer heap."""
        until = self.throttled_until
        if until:   # (and its peer checked meanwhile: _check_peer)
            until = min(until, self.throttle_start + throttling.PEER_CHECK_SECONDS)
        if not self.connected:      # throttled before CONNECT: WebSocket pings (framing.py)
            return until if 0 < until < self.connect_deadline else self.connect_deadline
        if until:
            # Keepalive is not checked while we are the ones not reading.
            return until
        if self.not_read:
            return None         # nor while the commit log cannot write (read_again)
        if self.keepalive:
            return self.last_seen + 1.5 * self.keepalive
        return None

    def expire(self) -> None:
        broker = self.broker
        now = broker.clock()
        # (throttled before CONNECT: its connect deadline still ends it, below)
        if self.throttled_until and (self.connected or now < self.connect_deadline):
            if now < self.throttled_until:
                self._check_peer()
            else:
                self._unthrottle()
            return
        if not self.connected and self.refusal is not None:
            self._refused_unheard()
        elif not self.connected:
            broker.stats.connect_timeouts += 1
            broker.hit("connect_timeout")
            broker.peer_log.log(log, logging.INFO, "connect_timeout", self.peer,
                                "%s: %s within %g s; closing", self.describe(),
                                self.unheard() if self.pending is None
                                else "authentication exchange not finished"
                                if self.v5 is not None and self.v5.auth is not None
                                else "password check not finished",
                                self.connect_deadline - self.created)
            self.close(will=False)
        else:
            broker.stats.keepalive_expired += 1
            log.info("%s: keepalive expired (no packet for 1.5 x %d s); closing",
                     self.describe(), self.keepalive)
            self.close(will=True, reason=KEEP_ALIVE_TIMEOUT, why="keep alive timeout")

    def unheard(self) -> str:
        """What a caller closed by the connect timeout did not send (its log line)."""
        return "no CONNECT"

    def _refused_unheard(self) -> None:
        """A caller accepted only to be refused (``refusal``: core.sessions, e.g. for the
        open files limit) sent no CONNECT in time: counted and logged as that refusal (not
        as a connect_timeout, a limit it did not reach), then closed."""
        broker = self.broker
        limit, why = self.refusal
        broker.peer_log.log(log, logging.INFO, limit, self.peer, "%s: refused (closed: no "
                            "CONNECT within %g s): %s", self.describe(),
                            self.connect_deadline - self.created, why)
        broker.stats.connections_refused += 1
        broker.refused[limit] += 1
        if limit in broker.limit_hits:
            broker.hit(limit)
        self.close(will=False)

    # ----- closing ----------------------------------------------------------------------

    def close(self, *, will: bool, reason: int = 0, why: str = "") -> None:
        """Close the connection (publishing the will if ``will``) and let go of everything
        it held: nothing of a closed client stays in the broker (its timer-heap entry goes,
        its transport is replaced by ``CLOSED``), so it is freed at once. A 5.0 client is
        first sent a DISCONNECT with ``reason`` when one is given (session taken over,
        keepalive timeout, server shutting down)."""
        if self.closed:
            return
        if reason and self.v5 is not None and self.connected:
            self.transport.write(mqtt5.disconnect_frame(self.v5, reason, why))
        self.closed = self.halted = True
        self.decoder = None
        broker = self.broker
        broker.unschedule(self)
        broker.sockets_open -= 1
        try:
            if self.throttled_until:
                self._end_throttle(broker.clock())
            if self.connected:
                broker.detach(self, publish_will=will)
        finally:
            self.will = self.pending = self.held = None
            if broker.journal is not None:
                broker.journal.forget(self)
            transport, self.transport = self.transport, CLOSED
            transport.close()

    # ----- limits -----------------------------------------------------------------------

    def warn_once(self, limit: str, message: str, *args) -> None:
        """Log a limit hit once per connection (later hits are only counted)."""
        warned = self.warned
        if warned is None:
            warned = self.warned = set()
        if limit in warned:
            return
        warned.add(limit)
        log.warning("%s: " + message + " (logged once per connection)", self.describe(), *args)

    def window_full(self, limit: str) -> None:
        """A QoS 1/2 message found this connection's window full (core.router) and waits in
        its queue: counted, logged once per connection (flow control, not a loss)."""
        broker = self.broker
        broker.hit(limit)
        if self.warned is not None and limit in self.warned:
            return
        session, name = self.session, limit
        if limit == "max_inflight_bytes":
            count, what, value = (session.inflight_bytes, "bytes of QoS 1/2 messages",
                                  broker.limits.max_inflight_bytes)
        else:
            count, what = len(session.inflight), "QoS 1/2 messages"
            value = session.receive_max or broker.limits.max_inflight_messages
            if session.receive_max:
                name = "its Receive Maximum, below max_inflight_messages"
        self.warn_once(limit, "%d %s are waiting for its acknowledgement (%s %d); the next "
                       "ones wait in its queue until it acknowledges", count, what, name, value)

    def warn_first(self, kind: str, name: str, more: str, message: str, *args) -> None:
        """Log ``message`` for each of the first FIRST_LOGGED distinct ``name``s of ``kind``
        (a denied topic, a refused filter) on this connection, then once ``more`` (that the
        rest are only counted): a client cannot fill the log with them."""
        warned = self.warned
        if warned is None:
            warned = self.warned = set()
        key = (kind, name)
        if key in warned or kind in warned:
            return
        if sum(type(k) is tuple and k[0] == kind for k in warned) >= FIRST_LOGGED:
            warned.add(kind)
            log.warning("%s: %s; counted, no longer logged for this connection",
                        self.describe(), more)
            return
        warned.add(key)
        log.warning("%s: " + message, self.describe(), *args)

    def charge_control(self, n: int = 1, what: str = "") -> None:
        """``n`` control packets (core.dispatch: PINGREQ, SUBSCRIBE, ...; WebSocket frames
        with no MQTT byte, server/framing.py) were handled: charged to the client's
        control_rate, and the client throttled when it is over (``what``: see throttle)."""
        control = self.broker.control
        if control is None or self.closed:
            return
        self.control_due, wait = control.charge(self.control_due, self.broker.clock(), n)
        if wait:
            self.throttle("control_rate", wait, what)  # these went through; reading stops now

    def control_allowed(self) -> int:
        """The control packets the client may send now, the one that takes its last token
        included (0: no control_rate)."""
        control = self.broker.control
        if control is None:
            return 0
        return control.allowed(self.control_due, self.broker.clock())

    def _count_throttled(self, now: float) -> None:
        self.throttled_time += now - self.throttle_start
        self.broker.throttled_seconds += now - self.throttle_start
        self.throttle_start = now

    def _end_throttle(self, now: float) -> None:
        self._count_throttled(now)
        self.broker.throttled.discard(self)
        self.throttled_until = 0.0
        self.halted = self.closed or self._handlers is AUTHENTICATING   # (connect.auth_done)

    def _unthrottle(self) -> None:
        """The publish budget has refilled: read again, starting with what is buffered. The
        keepalive's 1.5 x starts again now: what the client sent meanwhile waits unread."""
        if self._peer_gone():
            return
        broker = self.broker
        now = broker.clock()
        self._end_throttle(now)
        self.last_seen = max(self.last_seen, now)
        self.transport.resume_reading("rate")  # still paused if another reason holds it
        if self.held is not None:           # held during the password check, not handled yet
            connect.replay_held(self)
        if not self.halted:
            self.data_received(b"")
        if not self.closed:
            broker.schedule(self)

    def stop_reading(self, reason: str) -> None:
        """Not read for ``reason`` (the commit log cannot write) until ``read_again``; its
        keepalive is not checked meanwhile, as under its publish rate."""
        self.not_read = True
        self.transport.pause_reading(reason)

    def read_again(self, reason: str) -> None:
        """Read again; the keepalive's 1.5 x starts now (what the client sent meanwhile,
        its PINGREQs too, is still to be read)."""
        self.not_read = False
        self.transport.resume_reading(reason)
        self.last_seen = max(self.last_seen, self.broker.clock())
        self.broker.schedule(self)

    def writable(self) -> None:
        """The transport has written everything it held (after it was full): send more."""
        if self.pending_dropped:
            self.warn_once("drained", "output drained; %d QoS 0 messages were dropped while "
                           "max_pending_write_bytes were waiting (later episodes are only counted)",
                           self.pending_dropped)
            self.pending_dropped = 0
        session = self.session
        if (session is not None and session.client is self
                and (session.queue or session.cursor is not None or session.shared)):
            self.broker.pump(session)

    # A protocol violation ends the connection (core.violations: the answer, the log line).
    violation = violations.violation
    # Over a rate: not read for a while (core.throttling); let go if its peer goes meanwhile.
    throttle = throttling.throttle
    _check_peer = throttling.check_peer
    _peer_gone = throttling.peer_gone

    def answer(self, frame: bytes) -> None:
        """Queue the answer to a request the client waits for (CONNACK, SUBACK, UNSUBACK,
        PINGRESP, PUBREL, PUBCOMP): the loop then sends this pass's output at once
        (Broker.prompt)."""
        self.broker.prompt = True
        self.transport.write(frame)

    # ----- state changes (the handler tables: core.dispatch) ----------------------------

    def enter_authenticating(self) -> None:
        """CONNECT waits for its password check: later packets are held."""
        self._handlers = AUTHENTICATING

    def enter_auth_exchange(self) -> None:
        """CONNECT named an Authentication Method: only AUTH (and DISCONNECT) until CONNACK."""
        self._handlers = AUTH_EXCHANGE

    def enter_connected(self) -> None:
        """CONNECT accepted (``rate`` set first: with one, PUBLISH is charged)."""
        if self.v5 is None:
            self._handlers = CONNECTED if self.rate is None else CONNECTED_RATED
        else:
            self._handlers = CONNECTED5 if self.rate is None else CONNECTED5_RATED

    # The policy's decision on the pending CONNECT (security/ calls ``client.auth_done``).
    auth_done = connect.auth_done
    # A 5.0 CONNECT with an Authentication Method (connect.on_connect calls it).
    begin_auth = auth.begin
