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
- With a listener policy (authentication, ACL), CONNECT is decided by the
  policy. While a password check runs on a worker thread the client is
  "authenticating": the socket is not read, packets already received are held
  and replayed in order once CONNACK 0 is sent, and the CONNECT timeout keeps
  running.
"""

from __future__ import annotations

import logging
import uuid

from edgebroker.commitlog.errors import LogFullError
from edgebroker.errors import CONNACK_CODES_311, PROTOCOL_ERROR, ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.codec import PINGRESP_BYTES, Decoder, encode, encode_ack
from edgebroker.core.session import AWAIT_COMP

log = logging.getLogger("edgebroker.client")

# Bytes of a partly received packet that count as activity for keepalive.
_PROGRESS_BYTES = 1024

_CONNACK_ACCEPTED = (encode(P.Connack(False, 0)), encode(P.Connack(True, 0)))


class Client:
    __slots__ = ("broker", "transport", "peer", "decoder", "client_id", "client_id_bytes",
                 "session", "connected",
                 "closed", "will", "keepalive", "last_seen", "connect_deadline", "timer_at",
                 "protocol_level", "sys_publish_warned", "_handlers",
                 "username", "acl", "pending_connect", "held", "denied_logged", "paused")

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
        self.will = None
        self.keepalive = 0
        self.last_seen = now
        self.connect_deadline = now + broker.limits.connect_timeout
        self.timer_at = None          # deadline of this client's entry in the timer heap
        self.protocol_level = 0
        self.sys_publish_warned = False
        self._handlers = _BEFORE_CONNECT
        self.username = None          # the verified user name (None: anonymous)
        self.acl = None               # this client's AclView, or None without an ACL file
        self.pending_connect = None   # the CONNECT while its password check runs
        self.held = None              # packets received meanwhile
        self.denied_logged = None     # topics whose denied PUBLISH was logged
        self.paused = False           # reading paused while the password check runs

    def __repr__(self):
        return f"Client({self.client_id!r}, {self.peer})"

    def describe(self) -> str:
        name = repr(self.client_id) if self.client_id else "(before CONNECT)"
        if self.username is not None:
            return f"client {name} (user {self.username!r}) from {self.peer}"
        return f"client {name} from {self.peer}"

    # ----- input from the server layer -------------------------------------------------

    def data_received(self, data) -> None:
        if self.closed:
            return
        broker = self.broker
        stats = broker.stats
        handlers = self._handlers
        decoded = 0
        try:
            for packet in self.decoder.feed(data):
                decoded += 1
                handlers[packet.type](self, packet)
                if self.closed:
                    break
                handlers = self._handlers
        except ProtocolError as exc:
            self._violation(exc)
        stats.packets_received += decoded
        # Keepalive counts complete packets (MQTT-3.1.2-24); a large packet
        # still arriving in big pieces counts too, so it is not cut off.
        if decoded or len(data) >= _PROGRESS_BYTES:
            self.last_seen = broker.clock()

    def connection_lost(self, reason: str) -> None:
        """The socket closed or failed under us (not after DISCONNECT)."""
        if not self.closed:
            if self.connected:
                log.info("%s: connection lost (%s)", self.describe(), reason)
            self.close(will=True)

    def deadline(self) -> float | None:
        """When this client must next be checked by the timer heap."""
        if not self.connected:
            return self.connect_deadline
        if self.keepalive:
            return self.last_seen + 1.5 * self.keepalive
        return None

    def expire(self) -> None:
        broker = self.broker
        if not self.connected:
            broker.stats.connect_timeouts += 1
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
        self.closed = True
        # A closed client may sit in the timer heap until its deadline: let go
        # of its buffers now.
        self.decoder = None
        try:
            if self.connected:
                self.broker.detach(self, publish_will=will)
        finally:
            self.will = None
            self.transport.close()

    def _violation(self, exc: ProtocolError) -> None:
        broker = self.broker
        code = None if self.connected else CONNACK_CODES_311.get(exc.reason)
        if code is not None:
            log.info("%s: refused (CONNACK %d): %s", self.describe(), code, exc)
            self.transport.write(encode(P.Connack(False, code)))
        else:
            broker.stats.protocol_errors += 1
            log.warning("%s: protocol violation: %s; closing connection", self.describe(), exc)
        self.close(will=True)

    def _refuse(self, code: int, why: str) -> None:
        log.info("%s: refused (CONNACK %d): %s", self.describe(), code, why)
        self.broker.stats.connections_refused += 1
        self.transport.write(encode(P.Connack(False, code)))
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
                                   f"({limits.max_client_id_length})")
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
                                   f"({limits.max_keepalive} s)")
        self.keepalive = p.keepalive
        self.will = p.will
        policy = getattr(self.transport, "policy", None)
        if policy is not None:
            self.pending_connect = p
            self.held = []
            self._handlers = _AUTHENTICATING
            policy.authenticate(self, p)        # calls auth_done, now or later
            if self.pending_connect is not None and not self.closed:
                self.paused = True
                self.transport.pause_reading()  # until the password check is back
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
            self._refuse(code, why)
            return
        if acl is not None and p.will is not None and not acl.can_write(p.will.topic):
            stats.logins_refused += 1
            self._refuse(5, f"the ACL does not let it publish its will on {p.will.topic!r}")
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
        if self.paused:
            self.paused = False
            self.transport.resume_reading()

    def _hold(self, p) -> None:
        """A packet that arrived while CONNECT waits for its password check."""
        self.held.append(p)

    def _accept(self, p: P.Connect) -> None:
        broker = self.broker
        client_id = self.client_id
        session, present = broker.attach(self, client_id, p.clean_session)
        self.session = session
        session.acl = self.acl
        self.connected = True
        self._handlers = _CONNECTED
        self.transport.write(_CONNACK_ACCEPTED[present])
        broker.stats.packets_sent += 1
        log.info("%s connected (protocol %d, clean session %d, keepalive %d%s)",
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

    def _server_only(self, p) -> None:
        raise ProtocolError(f"{P.NAMES[p.type]} is sent only by a server", rule="MQTT-4.8.0-1",
                            reason=PROTOCOL_ERROR)

    def _on_publish(self, p: P.Publish) -> None:
        broker = self.broker
        qos = p.qos
        # $SYS belongs to the broker: clients' publishes there are acknowledged
        # (3.1.1 has no negative ack) and dropped, as Mosquitto does. So are
        # publishes the ACL does not allow.
        publish = self._drop_sys_publish if p.topic.startswith("$SYS") else broker.publish
        acl = self.acl
        if acl is not None:
            allowed = acl.writes.get(p.topic)     # cached decision; computed once per topic
            if allowed is None:
                allowed = acl.can_write(p.topic)
            if not allowed:
                publish = self._drop_denied_publish
        try:
            if qos == 0:
                publish(p.topic, p.payload, 0, p.retain, self)
                return
            pid = p.packet_id
            if qos == 1:
                offset = publish(p.topic, p.payload, 1, p.retain, self)
                broker.acknowledge(self, offset, encode_ack(P.PUBACK, pid))
            else:
                # Exactly once: route on first receipt, ignore re-sends until PUBREL.
                pending = self.session.awaiting_release
                offset = None
                if pid not in pending:
                    offset = publish(p.topic, p.payload, 2, p.retain, self)
                    pending.add(pid)
                broker.acknowledge(self, offset, encode_ack(P.PUBREC, pid))
        except LogFullError:
            # Not logged, so neither routed nor acknowledged: the client sends
            # it again after reconnecting. Its socket is no longer read meanwhile.
            return
        broker.stats.packets_sent += 1

    def _drop_sys_publish(self, topic: str, payload: bytes, qos: int, retain: bool, client) -> None:
        stats = self.broker.stats
        stats.publish_received += 1
        stats.publish_dropped += 1
        if not self.sys_publish_warned:
            self.sys_publish_warned = True
            log.warning("%s: publish to %r dropped: $SYS topics are written only by the broker "
                        "(logged once per connection)", self.describe(), topic)

    def _drop_denied_publish(self, topic: str, payload: bytes, qos: int, retain: bool,
                             client) -> None:
        stats = self.broker.stats
        stats.publish_received += 1
        stats.publish_dropped += 1
        stats.acl_publish_denied += 1
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
        if entry is not None and entry.qos == 1:
            del session.inflight[p.packet_id]
            if session.queue:
                self.broker.pump(session)

    def _on_pubrec(self, p) -> None:
        inflight = self.session.inflight
        pid = p.packet_id
        entry = inflight.get(pid)
        if entry is None or entry.qos != 2:
            return
        if entry.state != AWAIT_COMP:
            entry.state = AWAIT_COMP
            # PUBRELs go out (and are re-sent) in PUBREC order (MQTT-4.6.0-4).
            del inflight[pid]
            inflight[pid] = entry
        self.transport.write(encode_ack(P.PUBREL, pid))
        self.broker.stats.packets_sent += 1

    def _on_pubrel(self, p) -> None:
        self.session.awaiting_release.discard(p.packet_id)
        self.transport.write(encode_ack(P.PUBCOMP, p.packet_id))
        self.broker.stats.packets_sent += 1

    def _on_pubcomp(self, p) -> None:
        session = self.session
        entry = session.inflight.get(p.packet_id)
        if entry is not None and entry.state == AWAIT_COMP:
            del session.inflight[p.packet_id]
            if session.queue:
                self.broker.pump(session)

    def _on_subscribe(self, p: P.Subscribe) -> None:
        broker = self.broker
        if self.acl is None:
            granted = broker.subscribe(self.session, p.topics)
        else:
            granted = self._subscribe_allowed(p.topics)
        self.transport.write(encode(P.Suback(p.packet_id, granted)))
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
        self.transport.write(encode_ack(P.UNSUBACK, p.packet_id))
        self.broker.stats.packets_sent += 1

    def _on_pingreq(self, p) -> None:
        self.transport.write(PINGRESP_BYTES)
        self.broker.stats.packets_sent += 1

    def _on_disconnect(self, p) -> None:
        log.info("%s disconnected", self.describe())
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
