"""How a protocol violation ends a connection (``Client.violation``).

What the client published earlier in the read is acknowledged first (``Broker.before_close``).
Before its CONNECT is accepted, a 3.1.1 client is refused with the CONNACK code the
violation has one for (an unsupported protocol level, a client id it may not use); a 5.0
client gets a CONNACK (before CONNECT was accepted) or a DISCONNECT with the reason code and
why. Then the connection closes, publishing the will of a connected client. Each violation is
counted and logged (per peer: ``core.limits.PeerLog``).
"""

from __future__ import annotations

import logging

from edgebroker.errors import (
    CLIENT_ID_NOT_VALID, CONNACK_CODES_311, RECEIVE_MAXIMUM_EXCEEDED, UNSPECIFIED_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION, ProtocolError,
)
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode
from edgebroker.core import mqtt5
from edgebroker.core.dispatch import AUTHENTICATING

log = logging.getLogger("edgebroker.client")    # the client's own log lines (core.client)

# The reason codes a refusing 5.0 CONNACK may carry for a protocol violation (0x90: a will
# topic that is empty or has a wildcard).
CONNACK_REASONS5 = frozenset((0x81, 0x82, 0x84, 0x85, 0x90, 0x95))


def violation(client, exc: ProtocolError) -> None:
    """``client`` broke the protocol (``exc`` says how): answer, log, close."""
    # The decoder keeps the error it raised; its traceback holds the frames that handled
    # this client, a cycle that would keep the closed client until a garbage collection.
    exc.with_traceback(None)
    broker = client.broker
    if client.connected:    # what it published earlier in this read is acknowledged first
        broker.before_close()
    checking = client._handlers is AUTHENTICATING     # its CONNECT waits: a close
    if (client.v5 is not None or exc.connect5 and not client.connected) and not checking:
        return _violation5(client, exc)
    code = None if client.connected or checking else CONNACK_CODES_311.get(exc.reason)
    if code is not None:
        reason = ("protocol_version" if exc.reason == UNSUPPORTED_PROTOCOL_VERSION
                  else "client_id")
        broker.peer_log.log(log, logging.INFO, reason, client.peer,
                            "%s: refused (CONNACK %d): %s", client.describe(), code, exc)
        broker.stats.connections_refused += 1
        broker.refused[reason] += 1
        client.answer(encode(P.Connack(False, code)))
    else:
        _log_violation(client, exc, "closing connection")
    client.close(will=True)


def _log_violation(client, exc: ProtocolError, then: str) -> None:
    """Logged per peer under the kind of the violation: a packet over max_packet_size, a 5.0
    QoS 2 PUBLISH over receive_maximum (the 3.1.1 case's kind: another client's violation
    from the same address does not hide its line), or any other."""
    broker = client.broker
    broker.stats.protocol_errors += 1
    kind = ("max_packet_size" if exc.rule == "max_packet_size"
            else "receive_maximum" if exc.reason == RECEIVE_MAXIMUM_EXCEEDED
            else "protocol_error")
    if kind == "max_packet_size":
        broker.hit(kind)
    broker.peer_log.log(log, logging.WARNING, kind, client.peer,
                        "%s: protocol violation: %s; %s", client.describe(), exc, then)


class _Limit:
    """The client's Maximum Packet Size, for the CONNACK refusing a CONNECT that broke the
    protocol (no ``Client.v5`` yet: the CONNECT's properties come with the error)."""
    __slots__ = ("max_packet_size",)

    def __init__(self, max_packet_size: int):
        self.max_packet_size = max_packet_size


def _violation5(client, exc: ProtocolError) -> None:
    """A 5.0 client broke the protocol: a CONNACK (before CONNECT was accepted) or a
    DISCONNECT with the reason code, and why, then the connection closes."""
    broker = client.broker
    reason = exc.reason
    if not client.connected:
        if reason not in CONNACK_REASONS5:
            reason = UNSPECIFIED_ERROR
        conn = client.v5 if client.v5 is not None else _Limit(exc.max_packet5)
        frame, answer = mqtt5.refusal_within(conn, reason, str(exc))
        if reason in (UNSUPPORTED_PROTOCOL_VERSION, CLIENT_ID_NOT_VALID):
            broker.stats.connections_refused += 1
            kind = ("protocol_version" if reason == UNSUPPORTED_PROTOCOL_VERSION
                    else "client_id")
            broker.refused[kind] += 1
            broker.peer_log.log(log, logging.INFO, kind, client.peer, "%s: refused (%s): %s",
                                client.describe(), answer, exc)
        else:   # a CONNECT that breaks the protocol, as in 3.1.1 (no CONNACK code there)
            _log_violation(client, exc, f"{answer} and closing" if frame is not None
                           else answer)
        if frame is not None:
            client.answer(frame)
    else:
        _log_violation(client, exc, f"DISCONNECT {reason:#04x} and closing")
        client.answer(mqtt5.disconnect_frame(client.v5, reason, str(exc)))
    client.close(will=True)
