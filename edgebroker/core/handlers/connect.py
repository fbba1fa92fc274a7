"""CONNECT and the connection's life: admission, the password check's answer, PINGREQ, DISCONNECT.

A valid CONNECT is checked against the limits (client id, keepalive, the
broker's admission: memory, max_connections, the listener's cap, max_sessions), then decided
by the listener's policy when there is one: while the password check runs the
client is "authenticating" (``Client.enter_authenticating``), the socket is not
read, and packets already received are held (``hold``) and replayed in order
once CONNACK 0 is sent (``auth_done``). Accepting binds the client to its
session and swaps in the connected handler table (``Client.enter_connected``).
"""

from __future__ import annotations

import logging
import os

from edgebroker import logs
from edgebroker.errors import ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import PINGRESP_BYTES, encode
from edgebroker.core.limits import PublishRate

log = logging.getLogger("edgebroker.client")
# The lines of every connect and disconnect (edgebroker/logs.py says why they go apart).
connections_log = logs.Frequent(log)

_CONNACK_ACCEPTED = (encode(P.Connack(False, 0)), encode(P.Connack(True, 0)))


def on_connect(client, p: P.Connect) -> None:
    broker = client.broker
    limits = broker.limits
    client_id = p.client_id
    client.protocol_level = p.protocol_level
    if len(client_id.encode("utf-8")) > limits.max_client_id_length:
        client.client_id = client_id[:64]
        return refuse(client, 2, f"client id longer than max_client_id_length "
                                 f"({limits.max_client_id_length})", "max_client_id_length")
    if not client_id:
        if p.protocol_level == P.PROTOCOL_31:
            return refuse(client, 2, "empty client id (MQTT 3.1 requires 1-23 characters)")
        if not p.clean_session:
            return refuse(client, 2, "empty client id with clean session 0 (MQTT-3.1.3-8)")
        if not broker.config.allow_zero_length_clientid:
            return refuse(client, 2, "empty client id and allow_zero_length_clientid is false")
        # 128 random bits in 32 hex digits, as uuid4's (whose module costs memory to import)
        client_id = broker.config.auto_id_prefix + os.urandom(16).hex()
    client.client_id = client_id
    client.client_id_bytes = client_id.encode("utf-8")
    if p.keepalive > limits.max_keepalive:
        return refuse(client, 2, f"keepalive {p.keepalive} s is above max_keepalive "
                                 f"({limits.max_keepalive} s)", "max_keepalive")
    full = broker.admission(client, client_id, p.clean_session)
    if full is not None:
        limit, why = full
        broker.peer_log.log(log, logging.WARNING, limit, client.peer,
                            "%s refused (CONNACK 3, server unavailable): %s", client.describe(),
                            why)
        client.answer(encode(P.Connack(False, 3)))
        broker.stats.connections_refused += 1
        broker.refused[limit] += 1
        broker.hit(limit)
        client.close(will=False)
        return
    client.keepalive = p.keepalive
    client.will = p.will
    policy = getattr(client.transport, "policy", None)
    if policy is not None:
        client.pending_connect = p
        client.held = []
        client.enter_authenticating()
        policy.authenticate(client, p)        # calls auth_done, now or later
        if client.pending_connect is not None and not client.closed:
            client.transport.pause_reading("auth")  # until the password check is back
        return
    accept(client, p)


def auth_done(client, code: int, why: str, username, acl) -> None:
    """The policy's decision on the pending CONNECT (0 or a CONNACK refusal code)."""
    p = client.pending_connect
    if p is None or client.closed:
        return                      # timed out or closed while the check ran
    client.pending_connect = None
    held, client.held = client.held, None
    client.username = username
    stats = client.broker.stats
    if code:
        if code == 4:
            stats.logins_failed += 1
        else:
            stats.logins_refused += 1
        refuse(client, code, why, "auth" if code in (4, 5) else "client_id")
        return
    if acl is not None and p.will is not None and not acl.can_write(p.will.topic):
        stats.logins_refused += 1
        refuse(client, 5, f"the ACL does not let it publish its will on {p.will.topic!r}", "auth")
        return
    client.acl = acl
    accept(client, p)
    if client.closed:
        return
    if held:
        try:
            for packet in held:
                client._handlers[packet.type](client, packet)
                if client.closed:
                    return
        except ProtocolError as exc:
            client.violation(exc)
            return
    client.transport.resume_reading("auth")


def hold(client, p) -> None:
    """A packet that arrived while CONNECT waits for its password check."""
    client.held.append(p)


def accept(client, p: P.Connect) -> None:
    broker = client.broker
    client_id = client.client_id
    client.rate = PublishRate.for_limits(broker.limits, broker.clock())
    session, present = broker.attach(client, client_id, p.clean_session)
    client.session = session
    session.acl = client.acl
    client.connected = True
    client.connect_deadline = 0.0  # no longer needed: its float goes (24 bytes a connection)
    client.enter_connected()
    # MQTT 3.1 has no session present flag: that byte is reserved there.
    client.answer(_CONNACK_ACCEPTED[present and p.protocol_level != P.PROTOCOL_31])
    broker.stats.packets_sent += 1
    connections_log.info("%s connected (protocol %d, clean session %d, keepalive %d%s)",
                         client.describe(), p.protocol_level, p.clean_session, p.keepalive,
                         ", session resumed" if present else "")
    broker.schedule(client)
    if present:
        broker.resume(session)


def refuse(client, code: int, why: str, reason: str = "client_id") -> None:
    broker = client.broker
    broker.peer_log.log(log, logging.INFO, reason, client.peer, "%s: refused (CONNACK %d): %s",
                        client.describe(), code, why)
    broker.stats.connections_refused += 1
    broker.refused[reason] += 1
    if reason in broker.limit_hits:
        broker.hit(reason)
    client.answer(encode(P.Connack(False, code)))
    client.close(will=False)


def on_pingreq(client, p) -> None:
    client.answer(PINGRESP_BYTES)
    client.broker.stats.packets_sent += 1


def on_disconnect(client, p) -> None:
    connections_log.info("%s disconnected", client.describe())
    client.close(will=False)
