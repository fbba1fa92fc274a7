"""Enhanced authentication (MQTT 5.0 section 4.12): the AUTH exchange of a CONNECT that names an
Authentication Method, and re-authentication on a live connection (section 4.12.1).

One method is built, SCRAM-SHA-256 (RFC 7677), for the users of the listener's password file:
``security.scram`` runs the exchange and ``ListenerPolicy.scram_outcome`` decides, under the
throttles of password logins. Any other method gets CONNACK 0x8C.

- At CONNECT (once the limits let it in): the CONNECT's Authentication Data is the
  client-first-message; the broker answers AUTH 0x18 with the server-first-message, and the
  connection is in the exchange state (``Client.enter_auth_exchange``): only AUTH and
  DISCONNECT may come before CONNACK (MQTT-3.1.2-30), anything else is a protocol error
  (CONNACK 0x82). The client's AUTH 0x18 with the client-final-message ends it: CONNACK 0x00
  carrying the method and the server-final-message, or CONNACK 0x86 (wrong proof, unknown
  user, no SCRAM keys) or 0x87 (throttled, a message the exchange cannot accept, a CONNECT
  User Name that is not the SCRAM user). ``connect_timeout`` keeps running.
- Connected (``on_auth``): AUTH 0x19 with the CONNECT's method starts the same exchange for
  the user the connection authenticated as, answered by AUTH 0x18; the client's AUTH 0x18
  ends it with AUTH 0x00 (the server-final-message) or DISCONNECT 0x87 (0x86 is not a
  DISCONNECT reason code). Other packets keep flowing meanwhile.
- An AUTH larger than the client's Maximum Packet Size is not sent (MQTT-3.1.2-24; its
  Authentication Data cannot be left out): the exchange ends with CONNACK 0x95 (the
  connection closes without one when that does not fit either) or, after CONNACK,
  DISCONNECT 0x95. An accepting CONNACK that does not fit (it cannot go without the
  server-final-message either) is refused alike (``connect.accept``).
- An AUTH with another method, or out of sequence, is a protocol error (0x82).
"""

from __future__ import annotations

import logging

from edgebroker.errors import (
    BAD_AUTHENTICATION_METHOD, CONTINUE_AUTHENTICATION, NOT_AUTHORIZED, PACKET_TOO_LARGE,
    PROTOCOL_ERROR, REAUTHENTICATE, SUCCESS, ProtocolError, shown,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt import properties as Q
from edgebroker.mqtt.encode5 import encode_auth
# security.scram (with its hashing, nonces and SASLprep) is imported where an exchange needs
# it: a broker whose clients never send an Authentication Method does without it (idle
# memory, docs/deploy.md).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from edgebroker.security import scram
from edgebroker.core.handlers import connect

log = logging.getLogger("edgebroker.client")

_BAD_CREDENTIALS = 4            # the policy's outcomes, as 3.1.1 CONNACK codes
# The Reason String of a refusal for wrong credentials (no keys counts as such too).
_TOLD = connect.BAD_CREDENTIALS_TOLD


def unusable(policy, method: str) -> str | None:
    """Why ``method`` cannot authenticate on a listener with ``policy``, or None."""
    from edgebroker.security import scram   # here: see the note at the imports
    if method != scram.METHOD:
        return f"authentication method {shown(method, 100)} is not supported (only {scram.METHOD})"
    if policy is None:
        return f"{scram.METHOD} needs a password_file on the listener"
    return policy.scram_refusal()


def begin(client, p: P.Connect) -> None:
    """A 5.0 CONNECT with an Authentication Method, past the limits: refuse the method (0x8C)
    or answer the client-first-message."""
    from edgebroker.security import scram   # here: see the note at the imports
    method = p.properties[Q.AUTH_METHOD]
    policy = client.transport.policy
    why = unusable(policy, method)
    if why is not None:
        connect.refuse(client, 0, why, "auth", reason5=BAD_AUTHENTICATION_METHOD)
        return
    conn = client.v5
    conn.auth_method = method
    client.pending = [p]
    exchange, reply, failure = _first(conn, policy, p)
    if failure is None and p.username is not None and p.username != exchange.username:
        failure = scram.Failure(f"the CONNECT's User Name {shown(p.username, 100)} is not the "
                                f"SCRAM user name {shown(exchange.username, 100)}")
    if failure is not None:
        _connect_outcome(client, policy, exchange, failure, None)
        return
    if _send(client, CONTINUE_AUTHENTICATION, reply):
        client.enter_auth_exchange()


def on_auth_exchange(client, p: P.Auth) -> None:
    """AUTH while the CONNECT's exchange runs: the client-final-message."""
    conn = client.v5
    _same_method(conn, p, "MQTT-4.12.0-5")
    if p.reason_code != CONTINUE_AUTHENTICATION:
        raise ProtocolError(f"AUTH {p.reason_code:#04x} during the authentication at CONNECT "
                            f"(the client answers with 0x18)", rule="MQTT-4.12.0-3",
                            reason=PROTOCOL_ERROR)
    exchange = conn.auth
    reply, failure = _final(exchange, p)
    _connect_outcome(client, client.transport.policy, exchange, failure, reply)


def before_connack(client, p) -> None:
    raise ProtocolError(f"{P.NAMES[p.type]} before the authentication exchange ended (only AUTH "
                        f"and DISCONNECT until CONNACK)", rule="MQTT-3.1.2-30",
                        reason=PROTOCOL_ERROR)


def on_disconnect_exchange(client, p: P.Disconnect) -> None:
    """The client gave up during the exchange at CONNECT."""
    log.info("%s disconnected during the authentication exchange (reason %#04x)",
             client.describe(), p.reason_code)
    client.close(will=False)


def on_auth(client, p: P.Auth) -> None:
    """AUTH on a connected 5.0 connection: re-authentication (section 4.12.1)."""
    from edgebroker.security import scram   # here: see the note at the imports
    conn = client.v5
    if conn.auth_method is None:
        raise ProtocolError("AUTH on a connection whose CONNECT had no Authentication Method",
                            rule="MQTT-4.12.0-7", reason=PROTOCOL_ERROR)
    _same_method(conn, p, "MQTT-4.12.1-1")
    code = p.reason_code
    if code == REAUTHENTICATE:
        if conn.auth is not None:
            raise ProtocolError("AUTH 0x19 while a re-authentication is running",
                                rule="MQTT-4.12.0-3", reason=PROTOCOL_ERROR)
        policy = client.transport.policy
        why = unusable(policy, conn.auth_method)
        if why is not None:
            _reauth_failed(client, BAD_AUTHENTICATION_METHOD, why, why)
            return
        exchange, reply, failure = _first(conn, policy, p)
        if failure is None and exchange.username != client.username:
            failure = scram.Failure(
                f"re-authentication as user {shown(exchange.username, scram.NAME_SHOWN)}: "
                f"the connection's user is {shown(client.username, scram.NAME_SHOWN)}")
        if failure is not None:
            _reauth_outcome(client, policy, exchange, failure, None)
            return
        _send(client, CONTINUE_AUTHENTICATION, reply)
    elif code == CONTINUE_AUTHENTICATION:
        exchange = conn.auth
        if exchange is None:
            raise ProtocolError("AUTH 0x18 with no authentication exchange running (a "
                                "re-authentication starts with 0x19)", rule="MQTT-4.12.0-3",
                                reason=PROTOCOL_ERROR)
        reply, failure = _final(exchange, p)
        _reauth_outcome(client, client.transport.policy, exchange, failure, reply)
    else:
        raise ProtocolError("AUTH 0x00 (Success) is sent only by the server",
                            rule="MQTT-3.15.2-1", reason=PROTOCOL_ERROR)


# ----- the outcomes -------------------------------------------------------------------------

def _connect_outcome(client, policy, exchange, failure, reply) -> None:
    from edgebroker.security import scram   # here: see the note at the imports
    conn = client.v5
    conn.auth = None
    code, why, throttled = policy.scram_outcome(client, exchange, failure)
    stats = client.broker.stats
    username = exchange.username
    if code:
        stats.scram_failed += 1
        client.pending = None
        client.username = username
        if code == _BAD_CREDENTIALS:
            stats.logins_failed += 1
        else:
            stats.logins_refused += 1
        connect.refuse(client, code, f"{scram.METHOD}: {why}", "auth",
                       told=_TOLD if code == _BAD_CREDENTIALS else None,
                       log_kind="auth_throttled" if throttled else None)
        return
    stats.scram_succeeded += 1
    conn.auth_reply = reply
    connect.auth_done(client, 0, "", username, policy.view(client, username))
    conn.auth_reply = None


def _reauth_outcome(client, policy, exchange, failure, reply) -> None:
    from edgebroker.security import scram   # here: see the note at the imports
    conn = client.v5
    conn.auth = None
    code, why, throttled = policy.scram_outcome(client, exchange, failure)
    stats = client.broker.stats
    if code:
        if code == _BAD_CREDENTIALS:
            stats.logins_failed += 1
        else:
            stats.logins_refused += 1
        _reauth_failed(client, NOT_AUTHORIZED, why,
                       _TOLD if code == _BAD_CREDENTIALS else why, throttled)
        return
    stats.scram_succeeded += 1
    # The first of a connection at INFO; the next ones (the client decides how often) DEBUG.
    warned = client.warned
    if warned is None:
        warned = client.warned = set()
    if "reauth" in warned:
        log.debug("%s re-authenticated (%s)", client.describe(), scram.METHOD)
    else:
        warned.add("reauth")
        log.info("%s re-authenticated (%s; later ones of this connection are logged at debug "
                 "level)", client.describe(), scram.METHOD)
    _send(client, SUCCESS, reply)


def _reauth_failed(client, reason: int, why: str, told: str, throttled: bool = False) -> None:
    """A failed re-authentication: DISCONNECT ``reason`` and close (MQTT-4.12.1-2)."""
    from edgebroker.security import scram   # here: see the note at the imports
    broker = client.broker
    broker.stats.scram_failed += 1
    broker.peer_log.log(log, logging.INFO, "auth_throttled" if throttled else "auth", client.peer,
                        "%s: re-authentication failed (DISCONNECT %#04x): %s: %s",
                        client.describe(), reason, scram.METHOD, why)
    broker.before_close()   # what it published before in this read is acknowledged first
    client.close(will=True, reason=reason, why=f"re-authentication failed: {told}")


# ----- helpers ------------------------------------------------------------------------------

def _same_method(conn, p: P.Auth, rule: str) -> None:
    method = p.properties.get(Q.AUTH_METHOD) if p.properties else None
    if method != conn.auth_method:
        raise ProtocolError(f"AUTH with Authentication Method {_method(method)}; the CONNECT's "
                            f"was {_method(conn.auth_method)}", rule=rule, reason=PROTOCOL_ERROR)


def _method(method) -> str:
    return "None" if method is None else shown(method, 100)


def _first(conn, policy, p) -> tuple[scram.Exchange, bytes | None, scram.Failure | None]:
    """A new exchange (``conn.auth``) fed the client-first-message of CONNECT or AUTH ``p``."""
    from edgebroker.security import scram   # here: see the note at the imports
    exchange = conn.auth = policy.scram_exchange()
    try:
        return exchange, exchange.first(p.properties.get(Q.AUTH_DATA)), None
    except scram.Failure as exc:
        return exchange, None, exc


def _final(exchange, p: P.Auth) -> tuple[bytes | None, scram.Failure | None]:
    from edgebroker.security import scram   # here: see the note at the imports
    try:
        return exchange.final(p.properties.get(Q.AUTH_DATA)), None
    except scram.Failure as exc:
        return None, exc


def _send(client, reason: int, data: bytes) -> bool:
    """Send AUTH ``reason`` with ``data``; False when it is larger than the client's Maximum
    Packet Size: the exchange then ends (CONNACK or DISCONNECT 0x95, logged and counted as
    a failed exchange) and the connection closes."""
    from edgebroker.security import scram   # here: see the note at the imports
    conn = client.v5
    frame = encode_auth(reason, {Q.AUTH_METHOD: conn.auth_method, Q.AUTH_DATA: data})
    if conn.max_packet_size and len(frame) > conn.max_packet_size:
        why = (f"its AUTH ({len(frame)} bytes) would be larger than the client's Maximum "
               f"Packet Size ({conn.max_packet_size})")
        conn.auth = None
        if client.connected:
            _reauth_failed(client, PACKET_TOO_LARGE, why, why)
        else:
            client.broker.stats.scram_failed += 1
            client.pending = None
            connect.refuse(client, None, f"{scram.METHOD}: {why}", "packet_too_large",
                           reason5=PACKET_TOO_LARGE)
        return False
    client.answer(frame)
    client.broker.stats.packets_sent += 1
    return True
