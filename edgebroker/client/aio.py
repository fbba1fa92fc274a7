"""The asyncio adapter: the sans-I/O ``Connection`` (client/connection.py) driven by an asyncio
event loop, over the same transports as the synchronous loop (TCP, TLS, WebSocket, Unix).

    async with AsyncClient("mqtt://127.0.0.1:1883", "sensor-7") as client:
        await client.subscribe([("cmd/#", 1)])
        ack = await client.publish("temp", b"21.5", qos=1)    # returns once PUBACK came
        handle = client.publish_nowait("temp", b"21.6", qos=1) # a future per request
        async for event in client:                             # Message, Connected, ...
            ...

How it works: the transport is non-blocking; its socket is watched with ``add_reader`` and,
only while bytes wait to go out, ``add_writer``. Every read is handed to the connection and
the events it gives are dispatched at once: ``Acked``, ``Subscribed`` and ``Unsubscribed``
complete the future of their request (the request's token *is* that future); everything
else (``Message``, ``Connected``, ``ConnectFailed``, ``Disconnected``, ``PingTimeout``) goes
to the client's own queue, which ``async for event in client`` reads. Bytes the connection
has to send are written after each step, and the keepalive runs on one ``call_at`` timer at
``next_deadline()``. The connection is made on the loop itself, without a thread
(``Dialer.open_async``: ``sock_connect``, then the TLS handshake and the WebSocket upgrade as
the synchronous Dialer does them, client/handshake.py); only a host name is resolved by
asyncio's resolver, and a transport maker given as ``address`` (a plain callable, which may
block) runs in the loop's default executor.

Back-pressure, both ways: ``publish`` waits while the connection holds ``max_queued``
requests, or ``OUTPUT_HIGH`` bytes wait in the client for the socket (``publish_nowait``
raises QueueFull instead); a QoS 0 publish is answered once its bytes left that buffer for
the socket: a stalled link stops a QoS 0 producer too. Messages the consumer has not read yet
are held in the client's queue; once ``max_messages`` of them (or ``max_message_bytes`` of
topics and payloads) wait unread, the socket is no longer read, so a slow consumer slows
the server (TCP) instead of growing memory, but only while no answer from the server is
awaited (the CONNACK, the acknowledgement of a request sent, a PINGRESP). While one is, the
socket is read and decoded on, messages held past the bound, so that an answer never waits
behind unread messages: a program that publishes to a topic it subscribes to, and awaits
the acknowledgement before reading its messages, does not deadlock, and the keepalive does
not fail for a PINGRESP left unread. Reading stops again when those answers are in (it
starts again when half the bound is free). So memory past the bound is what the server
sends before the answers awaited (at most what the link and both ends' buffers hold when it
sends them) and at most one read (``READ_SIZE``); a program that keeps publishing and never
reads its messages still grows it by what it gets back, as it must (MQTT cannot hold back
an acknowledgement behind a message, and a QoS 1/2 message read is acknowledged).

Reconnection (``reconnect``): ``"never"``, ``"after_first_success"`` (the default) or
``"always"`` (also while the first connection fails), with full-jitter back-off from ``backoff[0]``
(0.5 s) doubling up to ``backoff[1]`` (30 s): client/backoff.py's, as the synchronous loop's.
In-flight and queued requests carry over: their futures complete on a later connection. When
the client gives up, or on ``close()``, the futures still open fail with ``ClientClosed``,
as does a ``connect()`` still waiting for its first connection.
An error that is not the network's (a host name that cannot be looked up) is not tried
again: the client gives up at once (client/aio_dial.py, which makes the connections).
"""

from __future__ import annotations

import asyncio
import collections

from edgebroker.client import backoff as B
from edgebroker.client.address import Dialer
from edgebroker.client.aio_dial import AsyncDialing, ConnectError
from edgebroker.client.connection import Connection, QueueFull
from edgebroker.client.events import (Acked, ConnectFailed, Connected, Disconnected, Message,
                                      PingTimeout, Subscribed, Unsubscribed)
from edgebroker.errors import EdgebrokerError

READ_SIZE = 256 * 1024
OUTPUT_HIGH = 1 << 20   # bytes waiting for the socket from which publish() waits
_ANSWERS = (Acked, Subscribed, Unsubscribed)


class ClientClosed(EdgebrokerError):
    """The client was closed, or gave up reconnecting, before the request was answered."""


class AsyncClient(AsyncDialing):
    """One MQTT client on an asyncio loop (module docstring)."""

    def __init__(self, address, client_id: str = "", *, timeout: float = 10.0,
                 connack_timeout: float = 30.0, reconnect: str = B.AFTER_FIRST_SUCCESS,
                 backoff: tuple = (0.5, 30.0), max_messages: int = 1000,
                 max_message_bytes: int = 16 << 20, tls: dict | None = None, **connection):
        """``address``: a URL (client/address.py), an ``Address``, or a callable making a
        transport; ``timeout``: the making of a connection (TCP connect, TLS handshake,
        WebSocket upgrade), ``connack_timeout``: then the wait for the CONNACK (the event
        loop's ``connect_timeout`` and ``connack_timeout``); ``tls``: Dialer's TLS options
        (cafile, certfile, keyfile, verify, server_name); ``connection``: Connection's options
        (protocol, clean_start, keepalive, username, password, will, properties, max_inflight,
        max_queued, max_qos2_inflight, resubscribe: True here); ``reconnect`` and ``backoff``
        (base, cap): the policy and back-off of backoff.py, the synchronous loop's;
        ``max_messages``, ``max_message_bytes``: the bound of messages held unread."""
        if max_messages < 1 or max_message_bytes < 1:
            raise ValueError(f"max_messages ({max_messages}) and max_message_bytes "
                             f"({max_message_bytes}) must be at least 1")
        if "connect_timeout" in connection:     # Connection's name: which wait would it be?
            raise TypeError("AsyncClient takes timeout= (making the connection) and "
                            "connack_timeout= (the wait for the CONNACK), not connect_timeout=")
        self.backoff = B.Backoff(reconnect, *backoff)     # ValueError for a wrong policy
        self.dial = address if callable(address) else Dialer(address, timeout=timeout,
                                                             **(tls or {}))
        connection.setdefault("resubscribe", True)     # as the synchronous loop
        self.connection = Connection(client_id, connect_timeout=connack_timeout, **connection)
        self.max_messages = max_messages
        self.max_message_bytes = max_message_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport = None
        self._out = bytearray()
        self._written = 0                # bytes of this transport the socket took
        self._held = collections.deque()  # (_written when their bytes left, QoS 0 answers)
        self._writing = False
        self._reading = False
        self._timer = None
        self._timer_at = None
        self._events: collections.deque = collections.deque()
        self._messages = 0               # Message events in _events
        self._message_bytes = 0          # their topics and payloads
        self._wake = asyncio.Event()     # something for the iterator, or the end
        self._space = asyncio.Event()    # the connection can take a request again
        self._drained = asyncio.Event()  # nothing left to write
        self._first: asyncio.Future | None = None   # the first connect's outcome
        self._closed = False
        self._dialing: asyncio.Task | None = None
        self._open: set = set()          # the futures of requests not answered yet
        self._flush_soon = False         # a _flush is scheduled (call_soon)

    # -- the connection -------------------------------------------------------------------------

    async def connect(self) -> Connected:
        """Connect (and keep reconnecting per the policy); the server's Connected event.
        ConnectError when the first connection fails and the policy gives up."""
        self._loop = asyncio.get_running_loop()
        self._first = self._loop.create_future()
        self._start_dialing(self._dial_until_up())
        try:
            return await self._first
        except asyncio.CancelledError:
            # the caller stopped waiting (a timeout around connect(), its task cancelled):
            # no connection is left dialing or half made behind it
            self._close_now()
            raise

    def _attach(self, transport) -> None:
        self._transport = transport
        self._out = bytearray()
        self._written = 0
        self._drained.set()
        self.connection.connect(self._loop.time())
        self._flush()                   # CONNACK awaited: reading (_read_as_bound)

    def _resume_reading(self) -> None:
        if not self._reading and self._transport is not None:
            self._loop.add_reader(self._transport.fileno(), self._readable)
            self._reading = True

    def _pause_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._transport.fileno())
            self._reading = False

    def _held_back(self, part: int = 1) -> bool:
        """Messages held unread reach the bound (``part`` 2: half of it)."""
        return (self._messages * part >= self.max_messages
                or self._message_bytes * part >= self.max_message_bytes)

    def _awaiting(self) -> bool:
        """An answer from the server is awaited: CONNACK, an acknowledgement, PINGRESP."""
        conn = self.connection
        return conn.state == "connecting" or conn.inflight > 0 or conn.ping_outstanding

    def _read_as_bound(self) -> None:
        """Read the socket unless messages held unread reach the bound and no answer is
        awaited (module doc); once paused, read again when half the bound is free."""
        if self._transport is None:
            return
        if self._reading:
            if self._held_back() and not self._awaiting():
                self._pause_reading()
        elif self._awaiting() or not self._held_back(2):
            self._resume_reading()
            self._loop.call_soon(self._readable_if_attached)

    def _detach(self) -> None:
        """Let go of the transport (closed or broken); the connection keeps its requests."""
        t = self._transport
        if t is None:
            return
        self.backoff.lost(self._loop.time())
        self._pause_reading()
        if self._writing:
            self._loop.remove_writer(t.fileno())
            self._writing = False
        t.close()
        self._transport = None
        self._out = bytearray()
        self._drained.set()
        self._space.set()
        self.connection.connection_lost()
        self._release_held()

    def _give_up(self, error: Exception) -> None:
        if self._first is not None and not self._first.done():
            self._first.set_exception(error)
        self._finish(error)

    def _finish(self, error: Exception) -> None:
        """No more connections: a ``connect()`` still waiting and open requests fail, the
        iterator ends."""
        self._closed = True
        if self._first is not None and not self._first.done():
            self._first.set_exception(ClientClosed(f"closed before a connection was made: "
                                                   f"{error}"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._detach()
        for fut in self._open:
            if not fut.done():
                fut.set_exception(ClientClosed(f"request not answered: {error}"))
        self._open.clear()
        self._space.set()
        self._wake.set()

    # -- reading and writing ----------------------------------------------------------------------

    def _readable(self) -> None:
        t = self._transport
        conn = self.connection
        now = self._loop.time()
        while True:
            try:
                data = t.recv(READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                self._lost(f"read failed: {exc}")
                return
            if not data:
                self._lost("closed by the server")
                return
            self._dispatch(conn.receive_data(data, now))
            if (self._transport is not t or not t.pending()
                    or self._held_back() and not self._awaiting()):
                break
        self._flush()

    def _flush(self) -> None:
        t = self._transport
        if t is None:
            return
        conn = self.connection
        data = conn.data_to_send(self._loop.time())
        if data:
            self._out += data
            self._drained.clear()
        if self._out and not self._writing:
            self._write()
        events = conn.acked_qos0()
        if events:
            if self._out:       # answered once their bytes left for the socket (_write)
                self._held.append((self._written + len(self._out), events))
            else:
                self._dispatch(events)
        if conn.state == "closed" and not self._out:
            self._detach()
        self._read_as_bound()
        self._schedule()

    def _write(self) -> None:
        t = self._transport
        out = self._out
        try:
            while out:
                n = t.send(out)
                del out[:n]
                self._written += n
        except BlockingIOError:
            pass
        except OSError as exc:
            self._lost(f"write failed: {exc}")
            return
        held = self._held
        while held and held[0][0] <= self._written:
            self._dispatch(held.popleft()[1])
        if len(out) < OUTPUT_HIGH:
            self._space.set()
        if out and not self._writing:
            self._loop.add_writer(t.fileno(), self._writable)
            self._writing = True
        elif not out:
            if self._writing:
                self._loop.remove_writer(t.fileno())
                self._writing = False
            self._drained.set()

    def _release_held(self) -> None:
        """The link is gone: the answers held are given (QoS 0 lost, as QoS 0 may be)."""
        held = self._held
        while held:
            self._dispatch(held.popleft()[1])

    def _writable(self) -> None:
        self._write()
        if self._transport is not None and self.connection.state == "closed" and not self._out:
            self._detach()

    def _schedule(self) -> None:
        """The keepalive timer at the connection's next deadline (kept when not later)."""
        deadline = self.connection.next_deadline()
        if deadline is None or self._timer_at is not None and self._timer_at <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = self._timer_at = None
        self._dispatch(self.connection.tick(self._loop.time()))
        self._flush()

    # -- events -----------------------------------------------------------------------------------

    def _dispatch(self, events: list) -> None:
        for event in events:
            if isinstance(event, _ANSWERS):
                fut = event.request.token
                self._space.set()
                if fut in self._open:
                    self._open.discard(fut)
                    if not fut.done():
                        fut.set_result(event)
                    continue
                # An answer to a request of the client's own (a SUBSCRIBE made again after
                # a reconnection without a session, token RESUBSCRIBE): an event like others.
            self._post(event)
            if isinstance(event, Connected):
                self.backoff.succeeded(self._loop.time())
                if not self._first.done():
                    self._first.set_result(event)
                self._space.set()
            elif isinstance(event, ConnectFailed):
                self._refused(event)
            elif isinstance(event, (Disconnected, PingTimeout)):
                why = "no PINGRESP in time" if isinstance(event, PingTimeout) else event.reason
                self._say_last()
                self._detach()
                if not self._closed:
                    self._start_dialing(self._reconnect(why))

    def _say_last(self) -> None:
        """The connection ended on our side (a protocol error of the server): what it still
        has to say (5.0: DISCONNECT with the reason code) is written, as far as the socket
        takes it without waiting, before the transport is let go (as the synchronous loop
        does)."""
        t = self._transport
        data = self.connection.data_to_send(self._loop.time())
        if t is None or not data:
            return
        out = self._out
        out += data
        try:
            while out:
                del out[:t.send(out)]
        except OSError:                 # BlockingIOError too: no waiting for it
            pass

    def _post(self, event) -> None:
        self._events.append(event)
        if type(event) is Message:
            self._messages += 1
            self._message_bytes += len(event.topic) + len(event.payload)
        self._wake.set()

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._events:
            if self._closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        event = self._events.popleft()
        if type(event) is Message:
            self._messages -= 1
            self._message_bytes -= len(event.topic) + len(event.payload)
            if not self._reading:
                self._read_as_bound()
        return event

    def _readable_if_attached(self) -> None:
        if self._transport is not None and self._reading and self._transport.pending():
            self._readable()

    # -- requests ---------------------------------------------------------------------------------

    def publish_nowait(self, topic: str, payload=b"", qos: int = 0, retain: bool = False,
                       properties: dict | None = None) -> asyncio.Future:
        """Queue a PUBLISH; the future of its Acked event. QueueFull when ``max_queued``
        requests wait, or ``OUTPUT_HIGH`` bytes wait for the socket (``publish`` waits
        instead)."""
        self._check_open()
        if len(self._out) >= OUTPUT_HIGH:
            raise QueueFull(f"{len(self._out)} bytes wait for the socket already "
                            f"(OUTPUT_HIGH {OUTPUT_HIGH})")
        fut = self._loop.create_future()
        self.connection.publish(topic, payload, qos, retain, properties, token=fut)
        self._open.add(fut)
        if not self._flush_soon:        # one write for the publishes of this loop pass
            self._flush_soon = True
            self._loop.call_soon(self._deferred_flush)
        return fut

    def _deferred_flush(self) -> None:
        self._flush_soon = False
        self._flush()

    async def publish(self, topic: str, payload=b"", qos: int = 0, retain: bool = False,
                      properties: dict | None = None) -> Acked:
        """PUBLISH (once ``_wait_space``) and wait for its acknowledgement (QoS 0: until its
        bytes are handed to the transport); the Acked event (``reason_code`` >= 0x80: refused)."""
        await self._wait_space()
        return await self.publish_nowait(topic, payload, qos, retain, properties)

    async def subscribe(self, filters, properties: dict | None = None) -> Subscribed:
        """SUBSCRIBE ``[(filter, qos), ...]`` (or one filter string, QoS 0); the SUBACK."""
        if isinstance(filters, str):
            filters = [(filters, 0)]
        await self._wait_space()
        fut = self._loop.create_future()
        self.connection.subscribe(list(filters), properties, token=fut)
        self._open.add(fut)
        self._flush()
        return await fut

    async def unsubscribe(self, filters, properties: dict | None = None) -> Unsubscribed:
        if isinstance(filters, str):
            filters = [filters]
        await self._wait_space()
        fut = self._loop.create_future()
        self.connection.unsubscribe(list(filters), properties, token=fut)
        self._open.add(fut)
        self._flush()
        return await fut

    async def _wait_space(self) -> None:
        """Until fewer than ``max_queued`` requests and ``OUTPUT_HIGH`` bytes wait."""
        self._check_open()
        while not self.connection.can_publish or len(self._out) >= OUTPUT_HIGH:
            self._space.clear()
            await self._space.wait()
            self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")
        if self._loop is None:
            raise ClientClosed("connect() first")

    # -- the end ----------------------------------------------------------------------------------

    async def disconnect(self, reason_code: int = 0, timeout: float = 10.0) -> None:
        """Send DISCONNECT once what is queued before it is written, then close. Requests
        not acknowledged stay in ``connection`` (``connection.save()``)."""
        if self._closed:
            return
        if self._transport is not None and self.connection.state == "connected":
            self.connection.disconnect(reason_code)
            self._flush()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        await self.close()

    async def close(self) -> None:
        """Close the link at once; open futures, and a ``connect()`` still waiting for its
        first connection, fail with ClientClosed."""
        self._close_now()

    def _close_now(self) -> None:
        if self._dialing is not None and not self._dialing.done():
            self._dialing.cancel()
        if not self._closed:
            self._finish(ClientClosed("closed"))

    async def __aenter__(self) -> "AsyncClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.disconnect()


__all__ = ["AsyncClient", "ClientClosed", "ConnectError", "QueueFull"]
