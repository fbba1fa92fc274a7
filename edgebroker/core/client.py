"""One network connection's MQTT conversation with the broker.

A ``Client`` turns decoded packets into broker actions and answers. It never
touches a socket: it writes bytes to its transport (``write``/``close``) and
the server layer moves them. State rules, in prose:

- Before CONNECT only CONNECT is legal (MQTT-3.1.0-1); a second CONNECT is a
  violation (MQTT-3.1.0-2). The handler table is swapped at CONNECT, so the
  check costs nothing per packet.
- Packets only a server sends (CONNACK, SUBACK, UNSUBACK, PINGRESP) are
  violations when they arrive here (MQTT-4.8.0-1).
- Any violation closes the connection and, once connected, publishes the
  will. DISCONNECT discards the will and closes.
- Limits on PUBLISH (docs/limits.md): a topic not yet tracked must be
  admitted by the topic table (QoS 0 over a limit: dropped; QoS 1/2: the
  connection closes, as 3.1.1 has no negative acknowledgement). A client over
  its publish rate is throttled: its socket is not read until its bucket
  refills (a timer in the broker's heap), so TCP pushes back on it alone.
- With a listener policy (authentication, ACL), CONNECT is decided by the
  policy. While a password check runs on a worker thread the client is
  "authenticating": the socket is not read, packets already received are held
  and replayed in order once CONNACK 0 is sent, and the CONNECT timeout keeps
  running.
- Reading may be paused for several reasons at once (the password check,
  the publish rate, a commit log that cannot write); each holder resumes only
  its own (``Transport.pause_reading(reason)``).
"""

from __future__ import annotations

import logging
import uuid

from edgebroker import logs
from edgebroker.commitlog.errors import LogFullError
from edgebroker.errors import (
    CONNACK_CODES_311, PROTOCOL_ERROR, UNSUPPORTED_PROTOCOL_VERSION, ProtocolError,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.codec import (
    PINGRESP_BYTES, Decoder, check_code_points, encode, encode_ack, encode_puback,
)
from edgebroker.core.limits import PublishRate
from edgebroker.core.session import AWAIT_COMP

log = logging.getLogger("edgebroker.client")
# The lines of every connect and disconnect (edgebroker/logs.py says why they go apart).
connections_log = logs.Frequent(log)

# Bytes of a partly received packet that count as activity for keepalive.
_PROGRESS_BYTES = 1024

_CONNACK_ACCEPTED = (encode(P.Connack(False, 0)), encode(P.Connack(True, 0)))

class Client:
    __slots__ = ("broker", "transport", "peer", "decoder", "client_id", "client_id_bytes",
                 "session", "connected",
                 "closed", "will", "keepalive", "last_seen", "connect_deadline", "timer_at",
                 "protocol_level", "_handlers", "halted", "listener_address", "created", "msgs_in",
                 "rate", "throttled_until", "throttle_start", "throttled_time",
                 "pending_dropped", "warned", "rate_sample",
                 "username", "acl", "pending_connect", "held", "denied_logged")

    def __init__(self, broker, transport, now: float):
        self.broker = broker
        self.transport = transport
        self.peer = transport.peer
        self.decoder = Decoder(max_packet_size=broker.limits.max_packet_size)
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
        self.timer_at = None          # deadline of this client's entry in the timer heap
        self.protocol_level = 0
        self._handlers = _BEFORE_CONNECT
        listener = transport.listener
        self.listener_address = listener.address if listener is not None else ""
        self.created = now
        self.msgs_in = 0              # PUBLISH packets received
        self.rate = None              # PublishRate when messages_rate or bytes_rate is set
        self.throttled_until = 0.0    # non-zero while throttled (socket not read)
        self.throttle_start = 0.0
        self.throttled_time = 0.0     # seconds throttled, throttles that ended
        self.pending_dropped = 0      # QoS 0 dropped since the output last drained
        self.warned = None            # what was already logged once for this connection
        self.rate_sample = None       # (time, totals, rates) for core.metrics
        self.username = None          # the verified user name (None: anonymous)
        self.acl = None               # this client's AclView, or None without an ACL file
        self.pending_connect = None   # the CONNECT while its password check runs
        self.held = None              # packets received meanwhile
        self.denied_logged = None     # topics whose denied PUBLISH was logged

    def __repr__(self):
        return f"Client({self.client_id!r}, {self.peer})"

    def __lt__(self, other) -> bool:
        # Orders timer-heap entries with equal deadlines (any stable order will do).
        return id(self) < id(other)

    def describe(self) -> str:
        name = repr(self.client_id) if self.client_id else "(before CONNECT)"
        if self.username is not None:
            return f"client {name} (user {self.username!r}) from {self.peer}"
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
        self._handle(self.decoder.feed(data), len(data))

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
            self._violation(exc)
        broker.stats.packets_received += decoded
        # Keepalive counts complete packets (MQTT-3.1.2-24); a large packet
        # still arriving in big pieces counts too, so it is not cut off.
        if decoded or nbytes >= _PROGRESS_BYTES:
            self.last_seen = broker.clock()

    def connection_lost(self, reason: str) -> None:
        """The socket closed or failed under us (not after DISCONNECT)."""
        if not self.closed:
            if self.connected:
                connections_log.info("%s: connection lost (%s)", self.describe(), reason)
            self.close(will=True)

    def deadline(self) -> float | None:
        """When this client must next be checked by the timer heap."""
        if not self.connected:
            return self.connect_deadline
        if self.throttled_until:
            # Keepalive is not checked while we are the ones not reading.
            return self.throttled_until
        if self.keepalive:
            return self.last_seen + 1.5 * self.keepalive
        return None

    def expire(self) -> None:
        broker = self.broker
        if self.throttled_until:
            self._unthrottle()
            return
        if not self.connected:
            broker.stats.connect_timeouts += 1
            broker.hit("connect_timeout")
            log.info("%s: %s within %g s; closing", self.describe(),
                     "password check not finished" if self.pending_connect else "no CONNECT",
                     broker.limits.connect_timeout)
            self.close(will=False)
        else:
            broker.stats.keepalive_expired += 1
            log.info("%s: keepalive expired (no packet for 1.5 x %d s); closing",
                     self.describe(), self.keepalive)
            self.close(will=True)

    # ----- closing ----------------------------------------------------------------------

    def close(self, *, will: bool) -> None:
        if self.closed:
            return
        self.closed = self.halted = True
        # A closed client may sit in the timer heap until its deadline: let go
        # of its buffers now.
        self.decoder = None
        broker = self.broker
        broker.sockets_open -= 1
        try:
            if self.throttled_until:
                self._end_throttle(broker.clock())
            if self.connected:
                broker.detach(self, publish_will=will)
        finally:
            self.will = None
            self.transport.close()

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

    def _throttle(self, limit: str, wait: float) -> None:
        broker = self.broker
        now = broker.clock()
        broker.hit(limit)
        self.throttled_until = now + wait
        self.halted = True
        self.throttle_start = now
        broker.throttled.add(self)
        self.transport.pause_reading("rate")
        self.warn_once(limit, "over its publish rate (%s %g/s); not reading from it for %.3f s "
                       "(and again whenever it is over)", limit, getattr(broker.limits, limit),
                       wait)
        broker.schedule(self)

    def _end_throttle(self, now: float) -> None:
        self.throttled_time += now - self.throttle_start
        self.broker.throttled_seconds += now - self.throttle_start
        self.broker.throttled.discard(self)
        self.throttled_until = 0.0
        self.halted = self.closed

    def _unthrottle(self) -> None:
        """The publish budget has refilled: read again, starting with what is buffered."""
        broker = self.broker
        self._end_throttle(broker.clock())
        self.transport.resume_reading("rate")  # still paused if another reason holds it
        self.data_received(b"")
        if not self.closed:
            broker.schedule(self)

    def writable(self) -> None:
        """The transport has written everything it held (after it was full): send more."""
        if self.pending_dropped:
            self.warn_once("drained", "output drained; %d QoS 0 messages were dropped while "
                           "max_pending_write_bytes were waiting (later episodes are only counted)",
                           self.pending_dropped)
            self.pending_dropped = 0
        session = self.session
        if session is not None and session.client is self and session.queue:
            self.broker.pump(session)

    def _refuse_publish(self, p: P.Publish, limit: str) -> None:
        """A PUBLISH to a topic the topic table does not admit."""
        broker = self.broker
        broker.hit(limit)
        broker.drop(limit, self.session)
        broker.stats.publish_received += 1
        value = broker.memory.limit if limit == "memory_limit" else getattr(broker.limits, limit)
        if p.qos == 0:
            self.warn_once(limit, "publish to new topic %r refused: %s (%d); QoS 0 messages to "
                           "new topics are dropped", p.topic, limit, value)
            return
        log.warning("%s: publish to new topic %r refused: %s (%d); closing the connection "
                    "(QoS %d: MQTT 3.1.1 has no negative acknowledgement)", self.describe(),
                    p.topic, limit, value, p.qos)
        self.close(will=True)

    def _violation(self, exc: ProtocolError) -> None:
        broker = self.broker
        code = None if self.connected else CONNACK_CODES_311.get(exc.reason)
        if code is not None:
            log.info("%s: refused (CONNACK %d): %s", self.describe(), code, exc)
            broker.stats.connections_refused += 1
            broker.refused["protocol_version" if exc.reason == UNSUPPORTED_PROTOCOL_VERSION
                           else "client_id"] += 1
            self._answer(encode(P.Connack(False, code)))
        else:
            broker.stats.protocol_errors += 1
            if exc.rule == "max_packet_size":
                broker.hit("max_packet_size")
            log.warning("%s: protocol violation: %s; closing connection", self.describe(), exc)
        self.close(will=True)

    def _refuse(self, code: int, why: str, reason: str = "client_id") -> None:
        log.info("%s: refused (CONNACK %d): %s", self.describe(), code, why)
        broker = self.broker
        broker.stats.connections_refused += 1
        broker.refused[reason] += 1
        if reason in broker.limit_hits:
            broker.hit(reason)
        self._answer(encode(P.Connack(False, code)))
        self.close(will=False)

    # ----- packet handlers --------------------------------------------------------------

    def _on_connect(self, p: P.Connect) -> None:
        broker = self.broker
        limits = broker.limits
        client_id = p.client_id
        self.protocol_level = p.protocol_level
        if len(client_id.encode("utf-8")) > limits.max_client_id_length:
            self.client_id = client_id[:64]
            return self._refuse(2, f"client id longer than max_client_id_length "
                                   f"({limits.max_client_id_length})", "max_client_id_length")
        if not client_id:
            if p.protocol_level == P.PROTOCOL_31:
                return self._refuse(2, "empty client id (MQTT 3.1 requires 1-23 characters)")
            if not p.clean_session:
                return self._refuse(2, "empty client id with clean session 0 (MQTT-3.1.3-8)")
            if not broker.config.allow_zero_length_clientid:
                return self._refuse(2, "empty client id and allow_zero_length_clientid is false")
            client_id = broker.config.auto_id_prefix + uuid.uuid4().hex
        self.client_id = client_id
        self.client_id_bytes = client_id.encode("utf-8")
        if p.keepalive > limits.max_keepalive:
            return self._refuse(2, f"keepalive {p.keepalive} s is above max_keepalive "
                                   f"({limits.max_keepalive} s)", "max_keepalive")
        full = broker.admission(self, client_id)
        if full is not None:
            limit, why = full
            broker.events.log(logging.WARNING, limit, self.last_seen,
                              "%s refused (CONNACK 3, server unavailable): %s", self.describe(), why)
            self._answer(encode(P.Connack(False, 3)))
            broker.stats.connections_refused += 1
            broker.refused[limit] += 1
            broker.hit(limit)
            self.close(will=False)
            return
        self.keepalive = p.keepalive
        self.will = p.will
        policy = getattr(self.transport, "policy", None)
        if policy is not None:
            self.pending_connect = p
            self.held = []
            self._handlers = _AUTHENTICATING
            policy.authenticate(self, p)        # calls auth_done, now or later
            if self.pending_connect is not None and not self.closed:
                self.transport.pause_reading("auth")  # until the password check is back
            return
        self._accept(p)

    def auth_done(self, code: int, why: str, username, acl) -> None:
        """The policy's decision on the pending CONNECT (0 or a CONNACK refusal code)."""
        p = self.pending_connect
        if p is None or self.closed:
            return                      # timed out or closed while the check ran
        self.pending_connect = None
        held, self.held = self.held, None
        self.username = username
        stats = self.broker.stats
        if code:
            if code == 4:
                stats.logins_failed += 1
            else:
                stats.logins_refused += 1
            self._refuse(code, why, "auth" if code in (4, 5) else "client_id")
            return
        if acl is not None and p.will is not None and not acl.can_write(p.will.topic):
            stats.logins_refused += 1
            self._refuse(5, f"the ACL does not let it publish its will on {p.will.topic!r}", "auth")
            return
        self.acl = acl
        self._accept(p)
        if self.closed:
            return
        if held:
            try:
                for packet in held:
                    self._handlers[packet.type](self, packet)
                    if self.closed:
                        return
            except ProtocolError as exc:
                self._violation(exc)
                return
        self.transport.resume_reading("auth")

    def _hold(self, p) -> None:
        """A packet that arrived while CONNECT waits for its password check."""
        self.held.append(p)

    def _accept(self, p: P.Connect) -> None:
        broker = self.broker
        client_id = self.client_id
        self.rate = PublishRate.for_limits(broker.limits, broker.clock())
        session, present = broker.attach(self, client_id, p.clean_session)
        self.session = session
        session.acl = self.acl
        self.connected = True
        self.connect_deadline = 0.0  # no longer needed: its float goes (24 bytes a connection)
        self._handlers = _CONNECTED if self.rate is None else _CONNECTED_RATED
        # MQTT 3.1 has no session present flag: that byte is reserved there.
        self._answer(_CONNACK_ACCEPTED[present and p.protocol_level != P.PROTOCOL_31])
        broker.stats.packets_sent += 1
        connections_log.info("%s connected (protocol %d, clean session %d, keepalive %d%s)",
                             self.describe(), p.protocol_level, p.clean_session, p.keepalive,
                             ", session resumed" if present else "")
        broker.schedule(self)
        if present:
            broker.resume(session)

    def _on_second_connect(self, p) -> None:
        raise ProtocolError("second CONNECT on one connection", rule="MQTT-3.1.0-2",
                            reason=PROTOCOL_ERROR)

    def _before_connect(self, p) -> None:
        raise ProtocolError(f"{P.NAMES[p.type]} before CONNECT", rule="MQTT-3.1.0-1",
                            reason=PROTOCOL_ERROR)

    def _answer(self, frame: bytes) -> None:
        """Queue the answer to a request the client waits for (CONNACK, SUBACK, UNSUBACK,
        PINGRESP, PUBREL, PUBCOMP): the loop then sends this pass's output at once
        (Broker.prompt)."""
        self.broker.prompt = True
        self.transport.write(frame)

    def _server_only(self, p) -> None:
        raise ProtocolError(f"{P.NAMES[p.type]} is sent only by a server", rule="MQTT-4.8.0-1",
                            reason=PROTOCOL_ERROR)

    def _on_publish(self, p: P.Publish) -> None:
        broker = self.broker
        qos = p.qos
        self.msgs_in += 1
        if broker.clock() - self.last_seen < broker.prompt_gap:
            # A fast publisher (it sent something moments ago) may be waiting for this
            # PUBACK: no coalescing delay for it (Broker.prompt).
            broker.prompt = True
        topic = p.topic
        if topic in broker.known_topics and self.acl is None:
            publish = broker.publish  # the common case: only admitted topics are known
        else:
            publish = self._publisher(p)
            if publish is None:
                return
        try:
            if qos == 0:
                publish(topic, p.payload, 0, p.retain, self)
                return
            pid = p.packet_id
            if qos == 1:
                offset = publish(topic, p.payload, 1, p.retain, self)
                broker.acknowledge(self, offset, encode_puback(pid))
            else:
                # Exactly once: route on first receipt, ignore re-sends (DUP set) until PUBREL.
                offset = None
                awaiting = self.session.awaiting_release
                if pid not in awaiting or not p.dup:
                    if pid in awaiting:
                        self._reused_id(pid)
                    offset = publish(topic, p.payload, 2, p.retain, self)
                    self.session.own_awaiting_release().add(pid)
                broker.acknowledge(self, offset, encode_ack(P.PUBREC, pid))
        except LogFullError:
            # Not logged, so neither routed nor acknowledged: the client sends
            # it again after reconnecting. Its socket is no longer read meanwhile.
            return
        broker.stats.packets_sent += 1

    def _reused_id(self, pid: int) -> None:
        """A QoS 2 PUBLISH without DUP for a packet id still awaiting PUBREL: a re-send sets
        DUP (MQTT-3.3.1-1), so this is a new message and the client has finished the old
        exchange. That happens after a crash, when the snapshot still held the id: routed,
        as a new message must be (MQTT-4.3.3-2)."""
        self.warn_once("qos2_id_reused",
                       "QoS 2 PUBLISH with packet id %d (DUP 0) while that id awaits PUBREL: taken "
                       "as a new message (the id was held from before a crash, or the client does "
                       "not set DUP on re-sends)", pid)

    def _publisher(self, p: P.Publish):
        """What takes a PUBLISH to a topic not yet known, or from a client under an ACL:
        ``broker.publish``, or a method that drops it; None when a topic limit refused it
        (the refusal is handled)."""
        broker = self.broker
        topic = p.topic
        known = topic in broker.known_topics
        if not known:
            # Checked once per topic: a known topic passed this check when admitted.
            check_code_points(topic, "PUBLISH topic name")
        # $SYS belongs to the broker: clients' publishes there are acknowledged
        # (3.1.1 has no negative ack) and dropped, as Mosquitto does. So are
        # publishes the ACL does not allow. Neither becomes a known topic.
        if topic.startswith("$SYS"):
            return self._drop_sys_publish
        acl = self.acl
        if acl is not None:
            allowed = acl.writes.get(topic)     # cached decision; computed once per topic
            if allowed is None:
                allowed = acl.can_write(topic)
            if not allowed:
                return self._drop_denied_publish
        if not known:
            refused = broker.topics.admit(topic, self.client_id, broker.limits, broker.memory.over)
            if refused is not None:
                self._refuse_publish(p, refused)
                return None
        return broker.publish

    def _on_publish_rated(self, p: P.Publish) -> None:
        """PUBLISH when messages_rate or bytes_rate is set: handled, then charged."""
        self._on_publish(p)
        if self.closed:
            return
        over = self.rate.charge(len(p.payload) + len(p.topic.encode()), self.last_seen)
        if over is not None:
            self._throttle(*over)  # this message went through; reading stops after it

    def _drop_sys_publish(self, topic: str, payload: bytes, qos: int, retain: bool, client) -> None:
        broker = self.broker
        broker.stats.publish_received += 1
        broker.drop("sys_topic", self.session)
        self.warn_once("sys_topic", "publish to %r dropped: $SYS topics are written only by the "
                       "broker", topic)

    def _drop_denied_publish(self, topic: str, payload: bytes, qos: int, retain: bool,
                             client) -> None:
        broker = self.broker
        stats = broker.stats
        stats.publish_received += 1
        stats.acl_publish_denied += 1
        broker.drop("acl", self.session)
        logged = self.denied_logged
        if logged is None:
            logged = self.denied_logged = set()
        if topic in logged or len(logged) > _DENIALS_LOGGED:
            return
        logged.add(topic)
        if len(logged) > _DENIALS_LOGGED:
            log.warning("%s: more publishes denied by the ACL; counted, no longer logged for "
                        "this connection", self.describe())
        else:
            log.warning("%s: publish to %r denied by the ACL; dropped", self.describe(), topic)

    def _on_puback(self, p) -> None:
        session = self.session
        entry = session.inflight.get(p.packet_id)
        if entry is not None:
            if entry.qos != 1:
                raise self._wrong_ack(p, entry)
            del session.inflight[p.packet_id]
            session.inflight_bytes -= entry.message.size
            if session.queue:
                self.broker.pump(session)

    @staticmethod
    def _wrong_ack(p, entry) -> ProtocolError:
        """An acknowledgement that does not fit the message sent with its packet id (a PUBACK
        for QoS 2, a PUBREC for QoS 1, a PUBCOMP before PUBREC): closed, as Mosquitto does."""
        return ProtocolError(f"{P.NAMES[p.type]} for packet id {p.packet_id}, which is a QoS "
                            f"{entry.qos} message{' awaiting PUBREC' if entry.qos == 2 else ''}",
                            rule="MQTT-4.3", reason=PROTOCOL_ERROR)

    def _on_pubrec(self, p) -> None:
        inflight = self.session.inflight
        pid = p.packet_id
        entry = inflight.get(pid)
        if entry is None:
            # Not in flight (acknowledged already, or lost in a crash): PUBREL lets the
            # client finish its side (MQTT-4.3.3-1), as Mosquitto does.
            self._answer(encode_ack(P.PUBREL, pid))
            self.broker.stats.packets_sent += 1
            return
        if entry.qos != 2:
            raise self._wrong_ack(p, entry)
        if entry.state != AWAIT_COMP:
            entry.state = AWAIT_COMP
            # PUBRELs go out (and are re-sent) in PUBREC order (MQTT-4.6.0-4).
            del inflight[pid]
            inflight[pid] = entry
        self._answer(encode_ack(P.PUBREL, pid))
        self.broker.stats.packets_sent += 1

    def _on_pubrel(self, p) -> None:
        self.session.awaiting_release.discard(p.packet_id)
        self._answer(encode_ack(P.PUBCOMP, p.packet_id))
        self.broker.stats.packets_sent += 1

    def _on_pubcomp(self, p) -> None:
        session = self.session
        entry = session.inflight.get(p.packet_id)
        if entry is not None:
            if entry.qos != 2 or entry.state != AWAIT_COMP:
                raise self._wrong_ack(p, entry)
            del session.inflight[p.packet_id]
            session.inflight_bytes -= entry.message.size
            if session.queue:
                self.broker.pump(session)

    def _on_subscribe(self, p: P.Subscribe) -> None:
        broker = self.broker
        if self.acl is None:
            granted = broker.subscribe(self.session, p.topics)
        else:
            granted = self._subscribe_allowed(p.topics)
        self._answer(encode(P.Suback(p.packet_id, granted)))
        broker.stats.packets_sent += 1
        broker.send_retained(self.session, p.topics, granted)

    def _subscribe_allowed(self, topics) -> list[int]:
        """SUBSCRIBE under an ACL: each denied filter gets 0x80, the others are made."""
        broker = self.broker
        acl = self.acl
        granted = []
        for topic_filter, qos in topics:
            if acl.can_subscribe(topic_filter):
                granted.extend(broker.subscribe(self.session, [(topic_filter, qos)]))
            else:
                broker.stats.acl_subscribe_denied += 1
                log.warning("%s: subscription to %r denied by the ACL (SUBACK 0x80)",
                            self.describe(), topic_filter)
                granted.append(P.SUBACK_FAILURE)
        return granted

    def _on_unsubscribe(self, p: P.Unsubscribe) -> None:
        self.broker.unsubscribe(self.session, p.topics)
        self._answer(encode_ack(P.UNSUBACK, p.packet_id))
        self.broker.stats.packets_sent += 1

    def _on_pingreq(self, p) -> None:
        self._answer(PINGRESP_BYTES)
        self.broker.stats.packets_sent += 1

    def _on_disconnect(self, p) -> None:
        connections_log.info("%s disconnected", self.describe())
        self.close(will=False)


# At most this many denied topics are logged per connection (all are counted).
_DENIALS_LOGGED = 16

_BEFORE_CONNECT = {t: Client._before_connect for t in P.NAMES}
_BEFORE_CONNECT[P.CONNECT] = Client._on_connect

# CONNECT received, password check running: later packets wait (a second CONNECT
# is still a violation, as are server-only packets).
_AUTHENTICATING = {t: Client._hold for t in P.NAMES}
_AUTHENTICATING[P.CONNECT] = Client._on_second_connect

_CONNECTED = {
    P.CONNECT: Client._on_second_connect,
    P.PUBLISH: Client._on_publish,
    P.PUBACK: Client._on_puback,
    P.PUBREC: Client._on_pubrec,
    P.PUBREL: Client._on_pubrel,
    P.PUBCOMP: Client._on_pubcomp,
    P.SUBSCRIBE: Client._on_subscribe,
    P.UNSUBSCRIBE: Client._on_unsubscribe,
    P.PINGREQ: Client._on_pingreq,
    P.DISCONNECT: Client._on_disconnect,
}
for _t in P.SERVER_TO_CLIENT_ONLY:
    _CONNECTED[_t] = Client._server_only
    _BEFORE_CONNECT[_t] = Client._before_connect
    _AUTHENTICATING[_t] = Client._server_only

# The same, with the publish rate charged (limits.messages_rate / bytes_rate set).
_CONNECTED_RATED = dict(_CONNECTED)
_CONNECTED_RATED[P.PUBLISH] = Client._on_publish_rated
