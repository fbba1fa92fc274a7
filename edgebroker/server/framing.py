"""The framing layer: how MQTT bytes are carried over a connection's byte stream.

A connection is a byte stream (server/transport.py's ``Transport`` on a plain
socket, or server/tls.py's ``TLSTransport`` with its non-blocking handshake)
and a framing, composed when the connection is accepted (``App.add_connection``):

- raw MQTT: no layer at all. The stream is the core's transport and hands the
  bytes it reads to the core's ``Client``, after first-byte sniffing
  (server/sniff.py). This is the hot path: nothing stands between the socket
  and the core.
- a ``Framing`` over a sans-I/O endpoint (WebSocket: server/websocket.py's
  ``WebSocketEndpoint``): the ``Framing`` is the core's transport, and the
  stream's receiver in place of the ``Client``. Bytes read go through
  ``endpoint.receive(data)``, which gives the MQTT bytes they carried (``mqtt``),
  the bytes to send back (``send``: a handshake reply, an HTTP refusal, a pong, a
  close frame) and why to close (``close``; ``open`` once the handshake is done;
  ``noise``, ``more``, ``hold``: below);
  a connection the broker ends gets ``endpoint.closing(why)`` first (``why``: the MQTT 5
  reason code the core closed it with, ``FramedClient``; SERVER_SHUTTING_DOWN when the
  broker stops; the endpoint says it in its own terms: a WebSocket close code); what
  the core writes goes out behind ``endpoint.frame_head(n)``, the header of one
  frame of ``n`` bytes. A log-backed PUBLISH keeps its zero-copy path: the frame
  header goes in front of the chunk's head and the payload still leaves with
  sendfile (over TLS the stream reads it instead, as it does for raw MQTT).

Either stream takes either framing, so WebSocket over TLS needs no class of its own.

Frames that carry no MQTT byte (WebSocket pings, pongs, empty data frames) are charged to the
client's control packet rate like PINGREQ (``Client.charge_control``): ``receive`` is told how
many the client may send now and stops after the one that takes its last token, the client is
throttled, and the frames behind wait unread in the endpoint until the throttle ends
(``resume_reading``, then ``_read_on`` in a later pass of the loop: after what the client
held, in order). One ``receive`` also stops after MAX_FRAMES frames (server/websocket.py): the
rest are read in the next pass the same way, and what a TLS read hands over meanwhile (it reads
on while OpenSSL holds decrypted bytes) is held behind them.
"""

from __future__ import annotations

import logging

from edgebroker.core.client import Client
from edgebroker.core.timers import Timer
from edgebroker.errors import PROTOCOL_ERROR, SERVER_SHUTTING_DOWN, ProtocolError
from edgebroker.server.transport import PAUSE_REASONS

log = logging.getLogger("edgebroker.server")

# Longest wait for the peer's end after the end of a framed stream was sent (Framing.close).
LINGER = 2.0
# How the client's throttle names frames with no MQTT byte (core.client.Client.throttle).
NOISE = "WebSocket pings, pongs or empty frames"


class _NoLargeReads:
    """The decoder a stream sees through a framing: never a large read straight into a
    payload buffer (the bytes must be unframed first), so the stream reads into its buffer
    and calls ``data_received``."""

    __slots__ = ()
    room = None
    read_hint = 0


_NO_LARGE_READS = _NoLargeReads()


def _forwarded(name: str, settable: bool = False) -> property:
    """The stream's attribute ``name``, as the framing's."""
    def get(self):
        return getattr(self.stream, name)

    def set(self, value):
        setattr(self.stream, name, value)

    return property(get, set if settable else None, doc=f"The stream's ``{name}``.")


class FramedClient(Client):
    """The core's ``Client`` behind a framing: it also notes on its transport (the
    ``Framing``) why it closes, as the MQTT 5 reason code the core has for it (``ending``),
    for the framing's close to say."""

    __slots__ = ()

    def violation(self, exc: ProtocolError) -> None:
        if not self.closed and not self.transport.ending:
            self.transport.ending = exc.reason or PROTOCOL_ERROR
        super().violation(exc)

    def expire(self) -> None:
        """A caller still without CONNECT at its connect deadline is closed (Client.expire):
        an open WebSocket is told why in the close frame, 1008 and the reason, rather than
        1000, "purpose fulfilled" (RFC 6455 7.4.1); also when it is throttled then (pings
        before CONNECT). Not when the call only ends (or checks) a throttle before the
        deadline (Client.expire's own test): the caller stays, and a later close says its own
        reason."""
        framing = self.transport
        if (not self.connected and self.refusal is None and framing.endpoint.open
                and not (self.throttled_until and self.broker.clock() < self.connect_deadline)
                and not framing.last_words):
            framing.last_words = framing.endpoint.connect_timed_out()
        super().expire()

    def unheard(self) -> str:
        if not self.transport.endpoint.open:
            return "no CONNECT (its HTTP upgrade to WebSocket not finished)"
        return "no CONNECT"

    def close(self, *, will: bool, reason: int = 0, why: str = "") -> None:
        if reason and not self.closed and not self.transport.ending:
            self.transport.ending = reason      # session taken over, keepalive timeout, ...
        super().close(will=will, reason=reason, why=why)


class Framing:
    """A framing between a byte stream (``stream``) and the core's ``Client`` (``client``):
    to the core it is the transport, to the stream the receiver of bytes."""

    __slots__ = ("stream", "endpoint", "client", "peer", "listener", "lingering", "last_words",
                 "counted", "reader", "closed_by_peer", "ending")

    decoder = _NO_LARGE_READS

    def __init__(self, stream, endpoint):
        self.stream = stream
        self.endpoint = endpoint
        self.client = None            # the core's Client
        self.peer = stream.peer
        self.listener = stream.listener
        self.lingering = False        # the closing handshake: waiting for the peer's end
        self.last_words = b""         # the endpoint's close frame, for close() to send last
        self.counted = False          # a lingering socket, counted in broker.sockets_open
        self.reader = None            # Timer: read the frames left in the endpoint (_read_on)
        # (why, a fault): the peer's close (or a bad frame) read while the client still had
        # packets that came before it to handle (throttled, or its password check running)
        self.closed_by_peer = None
        self.ending = 0     # why the core closes: an MQTT 5 reason code (FramedClient), or 0

    # ----- the stream's side: bytes in --------------------------------------------------

    def data_received(self, data) -> None:
        if self.lingering:
            return      # the peer's answer to the close, or what it sent before it
        client = self.client
        if self.closed_by_peer is not None:
            self._end_when_handled()    # nothing after the close is read
            return
        endpoint = self.endpoint
        reader = self.reader
        if (client.halted or reader is not None and reader.pending) and endpoint.open:
            # Throttled, or MAX_FRAMES read in this pass: what a TLS read still hands over
            # (the rest of a record OpenSSL has decrypted) waits behind the frames left.
            if data:
                endpoint.hold(bytes(data))
            return
        # The endpoint keeps what it holds
        got = endpoint.receive(bytes(data), client.control_allowed())
        stream = self.stream
        if got.reply:
            stream.write(got.reply)                 # the handshake's answer, first
        if got.close is not None and got.open:
            # Its close frame goes after the answers to the packets that came before the
            # client's close or the bad frame (no data after a close, RFC 6455 5.5.1), also
            # when the handshake came in the same read: close() writes it.
            self.last_words = got.send
        elif got.send:
            stream.write(got.send)
        for piece in got.mqtt:
            client.data_received(piece)
        if got.noise:
            client.charge_control(got.noise, NOISE)
        if got.more and not client.halted:
            self._read_later()      # MAX_FRAMES read, or its tokens came back meanwhile
        if got.close is not None and not stream.closed:
            if not got.open:    # the upgrade was refused: counted, logged (core.limits.PeerLog)
                broker = stream.loop.broker
                broker.refused["websocket"] += 1
                broker.stats.connections_refused += 1
                broker.peer_log.log(log, logging.WARNING, "websocket", stream.peer,
                                    "WebSocket upgrade from %s on listener %s refused: %s",
                                    stream.peer, stream.listener_name or "?", got.close)
            self.closed_by_peer = (got.close, got.fault and got.open)
            self._end_when_handled()

    def _end_when_handled(self) -> None:
        """The peer's close frame (or a bad frame) came: end the connection once the client
        has handled the packets that came before it. A throttled client, or one whose
        password check is running with packets held behind its CONNECT, keeps them unhandled
        for a while (as a TCP client's FIN
        waits unread behind them): the socket is not read meanwhile, and this is tried
        again when the client is read again (``resume_reading``)."""
        client = self.client
        pending = client.pending            # [CONNECT, packets held behind it] or None
        if not client.closed and (client.halted or pending is not None and len(pending) > 1
                                  or client.held is not None):
            self.stream.pause_reading("frames")
            return
        why, fault = self.closed_by_peer
        if fault and not client.closed:
            # A frame that breaks RFC 6455: a protocol violation like a bad MQTT packet (a
            # refused upgrade is a refused connection, counted in data_received).
            client.violation(ProtocolError(why))
        else:
            client.connection_lost(why)     # closes this (close below)
        self.close()                        # if the client was closed already

    def _read_later(self) -> None:
        """Read the frames left in the endpoint in a later pass of the loop, not the socket
        meanwhile."""
        self.stream.pause_reading("frames")
        reader = self.reader
        if reader is None:
            reader = self.reader = Timer(self._read_on)
        if not reader.pending:
            broker = self.stream.loop.broker
            reader.start(broker, broker.clock())

    def _read_on(self) -> None:
        self.stream.resume_reading("frames")
        if not self.client.closed and not self.stream.closed:
            self.data_received(b"")

    def writable(self) -> None:
        self.client.writable()

    def connection_lost(self, reason: str) -> None:
        self._uncount()
        self.client.connection_lost(reason)

    # ----- the core's side: what it may call on a transport ------------------------------

    def write(self, data) -> None:
        stream = self.stream
        stream.write(self.endpoint.frame_head(len(data)))
        stream.write(data)

    def offer(self, data, rest=None) -> bool:
        if rest is None:
            return self.stream.offer(self.endpoint.frame_head(len(data)), data)
        return self.stream.offer(self.endpoint.frame_head(len(data) + len(rest)) + data, rest)

    def write_file(self, head: bytes, fd: int, position: int, length: int, offset: int) -> None:
        self.stream.write_file(self.endpoint.frame_head(len(head) + length) + head, fd, position,
                               length, offset)

    def close(self) -> None:
        """Close after what is queued. Once the endpoint is open, the closing handshake:
        its close frame (unless it sent one), the end of the stream, then the peer's end
        (whatever it sends meanwhile is dropped) or LINGER seconds."""
        stream = self.stream
        if self.lingering or stream.closing or stream.closed:
            return
        endpoint = self.endpoint
        if not endpoint.open:
            stream.close()      # an HTTP refusal, or nothing sent yet
            return
        frame = self.last_words or endpoint.closing(
            SERVER_SHUTTING_DOWN if stream.loop.stopping else self.ending)
        if frame:
            stream.write(frame)
        self.lingering = True
        if stream.end_output():
            # The core counted the socket gone (Client.close); it stays open until the peer's
            # end or LINGER, so count it while it lingers (accepting leaves the descriptors
            # the commit log needs). Read on whatever paused reading, to see the peer's end.
            broker = stream.loop.broker
            broker.sockets_open += 1
            self.counted = True
            for reason in PAUSE_REASONS:
                stream.resume_reading(reason)
            Timer(self._linger_over).start(broker, broker.clock() + LINGER)
        else:
            stream.close()

    def _linger_over(self) -> None:
        self._uncount()
        self.stream.close()

    def _uncount(self) -> None:
        """A lingering socket is closed (the peer's end came, or LINGER passed)."""
        if self.counted:
            self.counted = False
            self.stream.loop.broker.sockets_open -= 1

    def pause_reading(self, reason: str) -> None:
        self.stream.pause_reading(reason)

    def peer_end(self) -> int | None:
        return self.stream.peer_end()

    def resume_reading(self, reason: str) -> None:
        self.stream.resume_reading(reason)
        if self.lingering:
            return
        if (self.closed_by_peer is not None
                or reason in ("rate", "auth") and self.endpoint.more):
            # The frames left when the throttle or the password check began (the client was
            # halted: none was read later), or the peer's close: in a later pass, once the
            # client has handled what it holds.
            self._read_later()

    def wait_for_drain(self) -> None:
        self.stream.wait_for_drain()

    def count_publish(self, n: int = 1) -> None:
        self.stream.count_publish(n)

    def send_now(self) -> None:
        self.stream.send_now()

    # The stream's figures, read by the core, and its output bound (set on reload).
    listener_name = _forwarded("listener_name")
    policy = _forwarded("policy")
    out_bytes = _forwarded("out_bytes")
    bytes_in = _forwarded("bytes_in")
    bytes_out = _forwarded("bytes_out")
    msgs_out = _forwarded("msgs_out")
    max_pending = _forwarded("max_pending", settable=True)

    @property
    def identity(self):
        """The TLS client certificate's common name (None on a plain stream)."""
        return getattr(self.stream, "identity", None)
