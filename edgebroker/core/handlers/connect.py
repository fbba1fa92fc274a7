"""CONNECT and the connection's life: admission, the password check's answer, PINGREQ, DISCONNECT.

A valid CONNECT is checked against the limits (client id, keepalive, the
broker's admission: memory, max_connections, the listener's cap, max_sessions), then decided
by the listener's policy when there is one: while the password check runs the
client is "authenticating" (``Client.enter_authenticating``), the socket is not
read, and the bytes that came behind the CONNECT are kept undecoded (the client is
``halted``), then decoded and handled in order once CONNACK 0 is sent (``auth_done``).
Accepting binds the client to its session and swaps in the connected handler table
(``Client.enter_connected``).
"""

from __future__ import annotations

import logging
import os

from edgebroker import logs
from edgebroker.errors import (
    PACKET_TOO_LARGE, PAYLOAD_FORMAT_INVALID, PROTOCOL_ERROR, QOS_NOT_SUPPORTED, QUOTA_EXCEEDED,
    RETAIN_NOT_SUPPORTED, SERVER_BUSY, SERVER_UNAVAILABLE, SUCCESS,
    ProtocolError, shown, topic_shown,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt import properties as Q
from edgebroker.mqtt.encode import PINGRESP_BYTES, encode
from edgebroker.mqtt.properties import payload_utf8_error
from edgebroker.core import mqtt5, throttling
from edgebroker.core.limits import PublishRate, check_topic
from edgebroker.core.wills import kept_will

log = logging.getLogger("edgebroker.client")
# The lines of every connect and disconnect (edgebroker/logs.py says why they go apart).
connections_log = logs.Frequent(log)

_CONNACK_ACCEPTED = (encode(P.Connack(False, 0)), encode(P.Connack(True, 0)))
# The Reason String of every refusal for bad credentials (CONNACK 4 / 0x86): the log says
# which it was (unknown user, wrong password, wrong proof); the client is not told, so it
# cannot learn which user names exist.
BAD_CREDENTIALS_TOLD = "bad user name or password"


def on_connect(client, p: P.Connect) -> None:
    broker = client.broker
    limits = broker.limits
    client_id = p.client_id
    client.protocol_level = p.protocol_level
    client.bridge = p.bridge
    v5 = p.protocol_level == P.PROTOCOL_5
    if v5:
        client.v5 = mqtt5.Conn5(p.properties, limits)
    will = p.will
    if will is not None and (will.retain and not limits.retain_available
                             or will.qos > limits.max_qos):
        why = ("a retained will and retain_available is false" if will.qos <= limits.max_qos
               else f"will QoS {will.qos} is above max_qos ({limits.max_qos})")
        client.client_id = client_id            # named in the log line
        if v5:
            return refuse(client, 0, why, "will", reason5=RETAIN_NOT_SUPPORTED
                          if will.qos <= limits.max_qos else QOS_NOT_SUPPORTED)
        # 3.1.1 has no CONNACK code for it: closed, as Mosquitto does.
        return client.violation(ProtocolError(f"CONNECT refused: {why}", rule="max_qos"
                                              if will.qos > limits.max_qos
                                              else "retain_available"))
    if v5 and will is not None and will.properties and will.properties.get(Q.PAYLOAD_FORMAT):
        problem = payload_utf8_error(will.payload, "will payload")
        if problem is not None:   # (3.1.3.2.3: checked as a PUBLISH's is)
            client.client_id = client_id
            return refuse(client, 0, problem + " (Payload Format Indicator 1)", "payload_format",
                          reason5=PAYLOAD_FORMAT_INVALID)
    if len(client_id.encode("utf-8")) > limits.max_client_id_length:
        client.client_id = client_id[:64]
        return refuse(client, 2, f"client id longer than max_client_id_length "
                                 f"({limits.max_client_id_length})", "max_client_id_length")
    if not client_id:
        if p.protocol_level == P.PROTOCOL_31:
            return refuse(client, 2, "empty client id (MQTT 3.1 requires 1-23 characters)")
        if not p.clean_session and not v5:
            return refuse(client, 2, "empty client id with clean session 0 (MQTT-3.1.3-8)")
        if not broker.config.allow_zero_length_clientid:
            return refuse(client, 2, "empty client id and allow_zero_length_clientid is false")
        client_id = _assigned_id(broker.config.auto_id_prefix, limits.max_client_id_length)
    client.client_id = client_id
    client.client_id_bytes = client_id.encode("utf-8")
    limit = None if will is None else check_topic(will.topic, limits)
    if limit is not None:
        # As a PUBLISH to that topic would be: 5.0 Quota exceeded; 3.1.1 has no code for it.
        return refuse(client, None, f"will topic over {limit} ({getattr(limits, limit)}): "
                      f"{shown(will.topic, 200, 'characters')}", limit, reason5=QUOTA_EXCEEDED)
    if _over_max_keepalive(p.keepalive, limits.max_keepalive) and not v5:
        # (5.0: the CONNACK's Server Keep Alive says the broker's maximum instead.)
        return refuse(client, 2, f"keepalive {p.keepalive} s is above max_keepalive "
                                 f"({limits.max_keepalive} s)" if p.keepalive else
                                 f"keepalive 0 (none) and max_keepalive is "
                                 f"{limits.max_keepalive} s", "max_keepalive")
    if not _admitted(client, p):
        return
    client.keepalive = p.keepalive
    if p.will is not None:      # kept encoded, as a PUBLISH's properties are (core.wills)
        client.will, p.will = kept_will(p.will), None
    if v5 and p.properties is not None and Q.AUTH_METHOD in p.properties:
        client.begin_auth(p)        # enhanced authentication: core/handlers/auth.py
        return
    policy = getattr(client.transport, "policy", None)
    if policy is not None:
        client.pending = [p]
        client.enter_authenticating()
        policy.authenticate(client, p)        # calls auth_done, now or later
        if client.pending is not None and not client.closed:
            # Until the password check is back: the socket is not read, and what came behind
            # the CONNECT stays undecoded in the decoder (bytes, not packet objects, which
            # would take ~12 times as much memory).
            client.transport.pause_reading("auth")
            client.halted = True
        return
    accept(client, p)


def _over_max_keepalive(keepalive: int, limit: int) -> bool:
    """Above ``max_keepalive``; also 0 (no keepalive at all) once it is set below 65535, as
    Mosquitto takes it: such a client could stay connected, dead, for ever."""
    return keepalive > limit or keepalive == 0 and limit < 65535


def _assigned_id(prefix: str, limit: int) -> str:
    """The prefix and 128 random bits in 32 hex digits, as uuid4's (whose module costs memory
    to import); fewer digits (at least 16) and then a shorter prefix when the id would be
    longer than ``max_client_id_length``, which the client must meet coming back with it."""
    digits = min(32, max(16, limit - len(prefix.encode("utf-8"))))
    prefix = prefix.encode("utf-8")[:limit - digits].decode("utf-8", "ignore")
    return prefix + os.urandom(16).hex()[:digits]


def _admitted(client, p) -> bool:
    """The broker's connection and session limits let the CONNECT in; else it is refused
    with CONNACK 3 (5.0: the limit's reason code), counted and logged, and False."""
    broker = client.broker
    conn = client.v5
    # Kept past the connection: 3.1.1 clean session 0, 5.0 a Session Expiry Interval.
    persistent = (mqtt5.session_expiry(conn, broker.limits.persistent_client_expiration) > 0
                  if conn is not None else not p.clean_session)
    full = broker.admission(client, client.client_id, not persistent)
    if full is None:
        return True
    limit, why = full
    if conn is not None:
        frame, answer = mqtt5.refusal_within(
            conn, mqtt5.ADMISSION_REASONS.get(limit, SERVER_UNAVAILABLE), why)
    else:
        frame, answer = encode(P.Connack(False, 3)), "CONNACK 3, server unavailable"
    broker.peer_log.log(log, logging.WARNING, limit, client.peer, "%s refused (%s): %s",
                        client.describe(), answer, why)
    if frame is not None:
        client.answer(frame)
    broker.stats.connections_refused += 1
    broker.refused[limit] += 1
    broker.hit(limit)
    client.close(will=False)
    return False


def auth_done(client, code: int, why: str, username, acl, throttled: bool = False) -> None:
    """The policy's decision on the pending CONNECT (0 or a CONNACK refusal code;
    ``throttled``: refused unchecked, the user name or address throttled after failed logins,
    which is logged apart from wrong passwords so that they do not hide it)."""
    pending = client.pending
    if pending is None or client.closed:
        return                      # timed out or closed while the check ran
    client.pending = None
    p, held = pending[0], pending[1:]
    client.username = username
    stats = client.broker.stats
    if code:
        if code == 4:
            stats.logins_failed += 1
        else:
            stats.logins_refused += 1
        # (3: too many password checks waiting; 4, 5: the check, or the policy, refused.)
        if code == 3:
            refuse(client, code, why, "auth_busy", reason5=SERVER_BUSY)
            return
        refuse(client, code, why, "auth" if code in (4, 5) else "client_id",
               told=BAD_CREDENTIALS_TOLD if code == 4 else None,
               log_kind="auth_throttled" if throttled else None)
        return
    will = client.will
    if acl is not None and will is not None and not acl.can_write(will.topic):
        stats.logins_refused += 1
        refuse(client, 5, f"the ACL does not let it publish its will on "
                          f"{topic_shown(will.topic)}", "auth")
        return
    client.acl = acl
    # Asked again: password checks run side by side, and each CONNECT was admitted alone.
    if not _admitted(client, p):
        return
    accept(client, p)
    if client.closed:
        return
    if held:
        client.held = held
        replay_held(client)
        if client.closed:
            return
    if client.halted and not client.throttled_until:
        # Halted for the check (not called from on_connect, in the same read): the packets
        # that came behind the CONNECT are decoded and handled now, in order.
        client.halted = False
        client.data_received(b"")
        if client.closed:
            return
    client.transport.resume_reading("auth")


def hold(client, p) -> None:
    """A packet that arrived while CONNECT waits for its password check."""
    client.pending.append(p)


def replay_held(client) -> None:
    """Handle the packets held while the password check ran (``client.held``), in order. A
    throttle (the control rate) stops it as it stops reading: the rest wait in ``client.held``
    for the throttle's end (Client._unthrottle)."""
    held, client.held = client.held, None
    try:
        for i, packet in enumerate(held):
            client._handlers[packet.type](client, packet)
            if client.halted:
                if not client.closed:
                    client.held = held[i + 1:] or None
                return
    except ProtocolError as exc:
        client.violation(exc)


def accept(client, p: P.Connect) -> None:
    broker = client.broker
    client_id = client.client_id
    conn = client.v5
    if conn is not None:
        # The CONNACK is built before the session is taken over or created: when it does not
        # fit the client's Maximum Packet Size, the CONNECT is refused with nothing to undo.
        expiry = mqtt5.session_expiry(conn, broker.limits.persistent_client_expiration)
        keepalive = (broker.limits.max_keepalive
                     if _over_max_keepalive(p.keepalive, broker.limits.max_keepalive) else None)
        props = mqtt5.connack_properties(broker, client, client_id if not p.client_id else None,
                                         keepalive, expiry)
        frame = mqtt5.accepting_frame(conn, False, props)
        if conn.max_packet_size and len(frame) > conn.max_packet_size:
            _refuse_too_large(client, len(frame))
            return
    # Accepted: packets up to max_packet_size from now on, also those that came behind the
    # CONNECT. Until now (a password check, an enhanced authentication exchange, whose AUTH
    # packets are small) the largest valid CONNECT (core.limits.connect_size_limit): a caller
    # not yet authenticated holds no more than that.
    client.decoder.max_packet_size = broker.limits.max_packet_size
    client.rate = PublishRate.for_limits(broker.limits, broker.clock())
    if conn is None:
        session, present = broker.attach(client, client_id, p.clean_session)
        session.expiry_interval = None  # (a 5.0 client's before): persistent_client_expiration
    else:
        session, present = broker.attach(client, client_id, expiry == 0, p.clean_session)
        session.expiry_interval = expiry
    broker.rate_debts.take(client, broker.clock())  # the rates are per client id
    if session.awaiting_release:    # held from before: see acks.forget_inherited
        client.inherited = set(session.awaiting_release)
    client.session = session
    session.acl = client.acl
    session.receive_max = mqtt5.receive_window(conn, broker.limits)
    client.connected = True
    client.connect_deadline = 0.0  # no longer needed: its float goes (24 bytes a connection)
    client.enter_connected()
    if conn is None:
        # MQTT 3.1 has no session present flag: that byte is reserved there.
        client.answer(_CONNACK_ACCEPTED[present and p.protocol_level != P.PROTOCOL_31])
        detail = f"clean session {p.clean_session:d}" + (", bridge" if p.bridge else "")
    else:
        if keepalive is not None:
            client.keepalive = keepalive
        # (Session Present is a flag: the same size.)
        client.answer(mqtt5.accepting_frame(conn, True, props) if present else frame)
        detail = f"clean start {p.clean_session:d}, session expiry {expiry}"
    broker.stats.packets_sent += 1
    connections_log.info("%s connected (protocol %d, %s, keepalive %d%s)",
                         client.describe(), p.protocol_level, detail, client.keepalive,
                         ", session resumed" if present else "")
    broker.schedule(client)
    if present:
        broker.resume(session)
    over = throttling.over_rate(client, broker.clock())
    if over is not None and not client.closed:  # its client id still owes: not read until paid
        client.throttle(*over)


def _refuse_too_large(client, size: int) -> None:
    """A 5.0 CONNECT whose accepting CONNACK is larger than the client's Maximum Packet Size
    even without what it may go without (``mqtt5.accepting_frame``; never the Assigned Client
    Identifier or the Authentication Data, which the client needs): refused with CONNACK
    0x95, or closed when that does not fit either (MQTT-3.1.2-24)."""
    refuse(client, None, f"its CONNACK 0x00 ({size} bytes) would be larger than the client's "
                         f"Maximum Packet Size ({client.v5.max_packet_size})", "packet_too_large",
           reason5=PACKET_TOO_LARGE)


def refuse(client, code: int | None, why: str, reason: str = "client_id", *,
           reason5: int = 0, told: str | None = None, log_kind: str | None = None) -> None:
    """Refuse a CONNECT: 3.1.1 CONNACK ``code`` (None: closed without one); a 5.0 client gets
    ``reason5`` or the reason code that says the same as ``code``, with ``why`` (or ``told``,
    when the client is to learn less than the log) as the Reason String. Counted under
    ``reason``; logged under ``log_kind`` (the kind of ``PeerLog``) or ``reason``."""
    broker = client.broker
    if client.v5 is not None:
        code = reason5 = reason5 or mqtt5.CONNACK_REASONS[code]
        frame, answer = mqtt5.refusal_within(client.v5, code, told or why)
    elif code is None:
        frame = None
        answer = "closed: MQTT 3.1.1 has no CONNACK code for it"
    else:
        frame = encode(P.Connack(False, code))
        answer = f"CONNACK {code}"
    broker.peer_log.log(log, logging.INFO, log_kind or reason, client.peer,
                        "%s: refused (%s): %s",
                        client.describe(), answer, why)
    broker.stats.connections_refused += 1
    broker.refused[reason] += 1
    if reason in broker.limit_hits:
        broker.hit(reason)
    if frame is not None:
        client.answer(frame)
    # (no CONNACK: the reason still goes to the transport, e.g. a WebSocket close code)
    client.close(will=False, reason=0 if frame is not None else reason5)


def on_pingreq(client, p) -> None:
    client.answer(PINGRESP_BYTES)
    client.broker.stats.packets_sent += 1


def on_disconnect(client, p) -> None:
    connections_log.info("%s disconnected", client.describe())
    client.broker.before_close()    # what it published before is acknowledged first
    client.close(will=False)


def on_disconnect5(client, p: P.Disconnect) -> None:
    """A 5.0 DISCONNECT: only reason 0x00 (Normal disconnection) deletes the will, any other
    code keeps it (MQTT-3.1.2-8, 3.14.4); a Session Expiry Interval changes the session's (not
    from 0 to more: MQTT-3.14.2-2)."""
    props = p.properties
    if props is not None and Q.SESSION_EXPIRY in props:
        expiry = props[Q.SESSION_EXPIRY]
        session = client.session
        if session.expiry_interval == 0 and expiry:
            raise ProtocolError("DISCONNECT sets a Session Expiry Interval after CONNECT set "
                                "0", rule="MQTT-3.14.2-2", reason=PROTOCOL_ERROR)
        client.broker.set_session_expiry(session, mqtt5.session_expiry_cap(
            expiry, client.broker.limits.persistent_client_expiration))
    connections_log.info("%s disconnected (reason %#04x)", client.describe(), p.reason_code)
    client.broker.before_close()
    client.close(will=p.reason_code != SUCCESS)
