"""First-byte sniffing: what a connection's first bytes say about the client.

On a plain MQTT port (and after TLS, on the decrypted stream) the first bytes
are looked at before the core's decoder: a TLS handshake, an HTTP request or
anything else that cannot start a CONNECT gets a clear log line (and HTTP a
one-line 400 reply), then the connection closes. Counted in ``Broker.refused``.
The transport applies it (``Transport.sniff`` holds the bytes seen so far
until they show MQTT, then None), so the core only ever sees MQTT.

On a TLS port the first byte must start a TLS handshake (``not_tls``): a
plain MQTT CONNECT there, or an HTTP request (a ws:// client on a wss://
listener), is refused with a line saying so, instead of an opaque TLS error.
"""

from __future__ import annotations

import logging

from edgebroker.mqtt import packets as P

log = logging.getLogger("edgebroker.server")

# A TLS record of type handshake starts with this byte.
TLS_HANDSHAKE = 0x16

# Methods of HTTP requests, to recognise a web client on the MQTT port.
_HTTP_METHODS = (b"GET ", b"POST ", b"HEAD ", b"PUT ", b"DELETE ", b"OPTIONS ", b"PATCH ",
                 b"CONNECT ", b"TRACE ", b"PRI ")
SNIFF_BYTES = 8  # enough for the longest method above
_HTTP_BODY = b"This is an MQTT port (edgebroker), not HTTP: connect with an MQTT client.\n"
HTTP_REPLY = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: "
              + str(len(_HTTP_BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + _HTTP_BODY)


def classify_first_bytes(head: bytes) -> str | None:
    """What a connection's first bytes are: "mqtt", "tls", "http", "not_mqtt"; None: need more."""
    first = head[0]
    if first == TLS_HANDSHAKE:
        return "tls"  # a TLS record of type handshake (also CONNECT with flags 0110: invalid)
    if first >> 4 == P.CONNECT:
        return "mqtt"  # the decoder checks the rest
    for method in _HTTP_METHODS:
        if head.startswith(method):
            return "http"
        if method.startswith(head):
            return None if len(head) < SNIFF_BYTES else "not_mqtt"
    return "not_mqtt"


def sniff(transport, data) -> bool:
    """Check the first bytes; True when they may start MQTT (the decoder takes over)."""
    head = transport.sniff + bytes(data[:SNIFF_BYTES])
    kind = classify_first_bytes(head)
    if kind == "mqtt":
        transport.sniff = None
        return True
    if kind is None:
        transport.sniff = head
        return False
    transport.sniff = None
    broker = transport.loop.broker
    broker.refused[kind] += 1
    broker.stats.connections_refused += 1
    where = transport.listener_name or "?"
    peer = transport.peer
    if kind == "tls":
        broker.peer_log.log(log, logging.WARNING, "tls", peer,
                            "TLS handshake received on plain MQTT listener %s from %s — use the "
                            "TLS listener or disable TLS in the client", where, peer)
    elif kind == "http":
        transport.write(HTTP_REPLY)
        broker.peer_log.log(log, logging.WARNING, "http", peer,
                            "HTTP request (%r) received on MQTT listener %s from %s; replied "
                            "400 and closed", head.split(b" ")[0].decode("ascii", "replace"),
                            where, peer)
    else:
        shown = bytes(head + bytes(data[SNIFF_BYTES:16]))[:16]
        broker.peer_log.log(log, logging.WARNING, "not_mqtt", peer,
                            "connection on MQTT listener %s from %s does not start with CONNECT "
                            "(first bytes: %s) [MQTT-3.1.0-1]; closed", where, peer,
                            shown.hex(" "))
    transport.close()
    transport.client.connection_lost(f"refused: {kind}")
    return False


def not_tls(head: bytes, websocket: bool = False) -> str | None:
    """Why a connection on a TLS port whose first bytes are ``head`` (at least one) is
    refused; None: TLS. ``websocket``: the listener is a wss:// one."""
    first = head[0]
    if first == TLS_HANDSHAKE:
        return None
    method = http_method(head)
    if method is not None:
        what = f"an HTTP request ({method})" if method else "an HTTP request"
        if websocket:
            return (f"{what} without TLS: a ws:// client on this wss:// listener? the client "
                    f"must connect with wss://")
        return f"{what} instead of a TLS handshake; this listener takes MQTT over TLS (mqtts://)"
    what = "plain MQTT (a CONNECT)" if first == 0x10 else f"a first byte {first:#04x}"
    if websocket:
        return (f"{what} instead of a TLS handshake; this listener takes MQTT over WebSocket "
                f"over TLS: the client must connect with wss://")
    return (f"{what} instead of a TLS handshake; the client must connect with TLS "
            f"(or use a plain MQTT listener)")


def http_method(head: bytes) -> str | None:
    """The HTTP method ``head`` starts with; "" when ``head`` is only the start of one (the
    rest not arrived yet); None: not HTTP."""
    for method in _HTTP_METHODS:
        if head.startswith(method):
            return method.decode().strip()
    if len(head) < SNIFF_BYTES and any(method.startswith(head) for method in _HTTP_METHODS):
        return ""
    return None
