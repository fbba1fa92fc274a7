"""The synchronous event loop of the client library: one Connection (connection.py) over one
transport at a time (transport.py), driven by a selector in the caller's thread. It starts
no thread.

``EventLoop`` takes requests from any iterable the user gives (``requests=`` or
``set_source``): a list, a generator, an iterator over a queue, a Spool (spool.py). It reads
the next one only while the connection can take it (fewer than ``max_queued`` waiting and
the loop's output buffer under ``OUTPUT_HIGH``): that is the producer's back-pressure, so a
generator is never read ahead by more than in-flight + queued requests. An item ``None``
means "nothing for now" (the loop asks again ``IDLE_POLL`` seconds later, or at once after
``commands.wake()``, or, for a source with a descriptor to watch, when it is readable). A
request is a ``requests.make_publish/make_subscribe/...`` result or a tuple
``(topic, payload[, qos[, retain]])``. A source with an ``acked(request)`` method is told of
each request answered (the spool removes it); one the connection can never send (5.0
properties over 3.1.1) is answered as refused (reason code 0x80).

The loop is an iterator of events (events.py): messages, acknowledgements with their
request, connection changes. ``run(requests, timeout)`` sends a bounded batch and returns
when every request is answered or the time is up. ``loop.idle``: the source is used up and
every request answered; with ``end_when_idle`` the iteration ends then (``run``:
loop_run.py). Commands:
commands.py (carried out by loop_commands.py). Connecting: loop_dial.py. Reconnection and
back-off: backoff.py. The state file: statefile.py.
"""

from __future__ import annotations

import logging
import os
import random
import selectors
import time
from collections import deque

from edgebroker.client import backoff as B
from edgebroker.client import commands as K
from edgebroker.client.address import Address, Dialer
from edgebroker.client.connection import Connection
from edgebroker.client.events import Acked, ConnectFailed, Disconnected, Subscribed, Unsubscribed
from edgebroker.client.requests import ClientError, Request, as_request
from edgebroker.client.sending import refusal
from edgebroker.client.loop_commands import LoopCommands
from edgebroker.client.loop_dial import DIAL, LoopDialing, why
from edgebroker.client.loop_run import LoopRun
from edgebroker.client.statefile import read_state
from edgebroker.client.transport import lost_reason

log = logging.getLogger("edgebroker.client")

OUTPUT_HIGH = 1 << 20      # bytes waiting for the socket above which no request is taken
PULL_BATCH = 1000          # requests taken per pass at most (then the bytes go out)
IDLE_POLL = 0.05           # seconds before asking a source that said "nothing for now" again
READ_SIZE = 1 << 16
_ANSWERS = (Acked, Subscribed, Unsubscribed)
_NEVER = float("inf")       # _idle_until while the source waits for its descriptor
_SOURCE = "source"          # the selector key's data of the source's descriptor


class EventLoop(LoopCommands, LoopDialing, LoopRun):
    """See the module doc. ``options`` go to the Connection (keepalive, clean_start, username,
    password, will, properties, max_inflight, max_queued, max_qos2_inflight). ``resubscribe``:
    after a reconnection on which the server has no session, SUBSCRIBE again what it had
    granted (Connection's option; set on a ``connection`` given too).

    The transport: address.py's ``Dialer`` for ``host``/``port`` (or ``unix_path``) with
    ``transport_options`` as its options (``tls=True``, ``cafile``, ``certfile``, ``keyfile``,
    ``verify``, ``server_name``), or ``transport_factory`` (a Dialer for any URL, whose
    ``steps`` the loop runs in its selector within ``connect_timeout``; any other callable
    ``factory(timeout) -> transport`` is called and may wait)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 1883, *, client_id: str = "",
                 protocol: int = 4, unix_path: str | None = None, requests=None,
                 reconnect: str = B.AFTER_FIRST_SUCCESS, backoff_base: float = 0.5,
                 backoff_cap: float = 30.0, connect_timeout: float = 10.0, state_file=None,
                 connection: Connection | None = None, transport_options: dict | None = None,
                 transport_factory=None, end_when_idle: bool = False,
                 resubscribe: bool = True, clock=time.monotonic, rng=random.random,
                 **options):
        self.host, self.port, self.unix_path = host, port, unix_path
        self.state_file = os.fspath(state_file) if state_file is not None else None
        self.connect_timeout = connect_timeout
        self.backoff = B.Backoff(reconnect, backoff_base, backoff_cap, rng)
        self._clock = clock
        if transport_factory is None:
            address = (Address("unix", unix_path=unix_path) if unix_path
                       else Address("mqtt", host, port))
            transport_factory = Dialer(address, timeout=connect_timeout,
                                       **(transport_options or {}))
        self._factory = transport_factory
        self._dialing = None              # the Dialer's steps while a connection is made
        self._dial_fd: int | None = None  # the descriptor they wait on (registered)
        self._dial_until = 0.0
        if connection is None:
            connection = self._load(client_id, protocol, options)
        connection.resubscribe = resubscribe    # set on a connection given too
        self.conn = connection
        self.commands = K.Commands()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.commands, selectors.EVENT_READ)
        self._transport = None
        self._mask = 0
        self._out = bytearray()
        self._sent = self._pings = 0      # bytes the socket took; conn.pings_sent seen
        self._ping_end = _NEVER           # _sent once the last PINGREQ had left
        self._events: deque = deque()
        self._source = None
        self._source_done = True
        self._acked = None                # the source's acked(request), if it has one
        self._source_fd = None            # set_source(watch=): asked again when readable
        self._fd_watched: int | None = None     # the descriptor registered for it
        self._idle_until = 0.0
        self._more = False                # the source has more that could be taken now
        self._watch: dict | None = None   # run(): the batch's requests not answered yet
        self._retry_at = 0.0
        self._paused = False
        self._throttle: K.Throttle | None = None
        self._rate: float | None = None
        self._stopped = False             # disconnect(): no connection until reconnect()
        self._finished = False            # shutdown() or the policy: the iteration is over
        self.end_when_idle = end_when_idle
        self.final_state: dict | None = None
        if requests is not None:
            self.set_source(requests)

    def _load(self, client_id: str, protocol: int, options: dict) -> Connection:
        conn_timeout = options.pop("connack_timeout", 30.0)
        doc = read_state(self.state_file) if self.state_file else None
        if doc is None:
            return Connection(client_id, protocol, connect_timeout=conn_timeout, **options)
        if client_id and doc.get("client_id") != client_id:
            raise ClientError(f"state file {self.state_file} is client {doc.get('client_id')!r}"
                              f"'s, not {client_id!r}")
        conn = Connection.load(doc, connect_timeout=conn_timeout, **options)
        # Used once: a later process must not load it again after this one went on (its
        # server QoS 2 identifiers, long completed, would drop new messages as duplicates).
        # It stays beside, for a look, until the next one is loaded.
        os.replace(self.state_file, self.state_file + ".loaded")
        return conn

    # -- the user's side ----------------------------------------------------------------------
    def set_source(self, requests, watch=None) -> None:
        """Take requests from ``requests`` (any iterable) from now on. ``watch``: a file
        descriptor (or an object with ``fileno()``; by default the source's own, if it has
        one) after whose ``None`` the source is asked again when it is readable, not
        ``IDLE_POLL`` seconds later."""
        self._source = iter(requests)
        self._source_done = False
        self._idle_until = 0.0
        self._more = False
        self._acked = getattr(requests, "acked", None)
        if watch is None and callable(getattr(requests, "fileno", None)):
            watch = requests
        self._source_fd = (None if watch is None else
                           watch if isinstance(watch, int) else watch.fileno())

    @property
    def idle(self) -> bool:
        """The source is used up (or there is none) and every request is answered: none
        queued, none in flight (QoS 0: its bytes handed to the transport), and no bytes wait
        in the loop for the socket."""
        conn = self.conn
        return self._source_done and not conn.queued and not conn.inflight and not self._out

    def __iter__(self):
        return self

    def __next__(self):
        event = self.poll()
        if event is None:
            raise StopIteration
        return event

    def poll(self, timeout: float | None = None):
        """The next event; None when ``timeout`` seconds passed without one, or when the loop
        is over (shut down, disconnected by command, or the policy gave up), or, with
        ``end_when_idle``, once the loop is ``idle`` and its events are handed out."""
        events = self._events
        deadline = None if timeout is None else self._clock() + timeout
        while not events:
            if self._finished or self._stopped and not self._transport:
                return None
            if self.end_when_idle and self.idle:
                return None
            self._pass(self._clock(), deadline)
            if not events and (deadline is not None and self._clock() >= deadline
                               or self._batch_done()):
                return None
        return events.popleft()

    # -- one pass -------------------------------------------------------------------------------
    def _pass(self, now: float, deadline: float | None) -> None:
        self._apply_asked()
        if self._finished:
            return
        conn = self.conn
        if self._transport is None:
            self._take_requests(now)       # while the link is down: into the queue
            if self._dialing is None:
                if self._stopped or self._paused or now < self._retry_at:
                    self._wait(now, deadline)
                    return
                self._open(now)
                if self._dialing is None:
                    return                 # connected at once, or failed
            self._wait(now, deadline)      # the dial's socket is watched there
            if self._dialing is not None and self._clock() >= self._dial_until:
                self._dial_step(TimeoutError("no answer in time"))
            return
        if not self._paused:
            self._take_requests(now)
            self._flush(now)
        self._wait(now, deadline)
        now = self._clock()
        if not self._paused and self._transport is not None:
            if conn.state in ("connected", "connecting"):
                self._answered(conn.tick(now))
            self._flush(now)
        self._check_state(now)

    def _attach(self, transport) -> None:
        now = self._clock()
        self._transport = transport
        self._out.clear()
        self._mask = 0
        self._sent, self._ping_end, self._pings = 0, _NEVER, self.conn.pings_sent
        self.conn.connect(now)
        self._flush(now)

    def _take_requests(self, now: float) -> None:
        source = self._source
        if source is None or self._source_done or now < self._idle_until:
            return
        conn = self.conn
        out = self._out
        watch = self._watch
        throttle = self._throttle
        submit = conn.submit
        self._more = False
        room = OUTPUT_HIGH - len(out)   # less the payloads taken since (in conn's buffer)
        for n in range(1, PULL_BATCH + 1):
            if room <= 0:
                self._flush(now)        # what was taken goes to the socket, or waits in out
                room = OUTPUT_HIGH - len(out)
                if room <= 0:
                    return
            if not conn.can_publish:
                return
            if throttle is not None and not throttle.take(now):
                return
            try:
                item = next(source)
            except StopIteration:
                self._source_done = True
                return
            if item is None:
                if throttle is not None:
                    throttle.tokens += 1.0
                # asked again when the watched descriptor is readable, or a bit later
                self._idle_until = _NEVER if self._source_fd is not None else now + IDLE_POLL
                return
            req = item if type(item) is Request else as_request(item)
            try:
                submit(req)
            except ClientError as exc:
                # Never sendable on this connection (5.0 properties over 3.1.1, properties not
                # valid): answered as refused, so a spool lets it go rather than give it again
                # at every start.
                log.warning("%s; answered as refused (0x80)", exc)
                if watch is not None:
                    watch[id(req)] = req      # run()'s: its answer is the batch's
                self._answered([refusal(req)])
                continue
            if watch is not None:
                watch[id(req)] = req
            room -= len(req.payload)
            if not n & 255:
                self._flush(now)       # a batch's bytes leave in pieces of 256 requests
                room = OUTPUT_HIGH - len(out)
        self._more = True              # PULL_BATCH taken: come back without waiting

    def _flush(self, now: float) -> None:
        conn = self.conn
        data = conn.data_to_send(now)
        events = conn.acked_qos0()
        if events:
            self._answered(events)
        transport = self._transport
        if transport is None:
            return
        out = self._out
        if conn.pings_sent != self._pings:     # a PINGREQ in ``data``: gone once this is
            self._pings = conn.pings_sent
            self._ping_end = self._sent + len(out) + len(data)
        waited = bool(out)
        if out:
            out += data             # behind what is waiting already
            data = out
        elif not data:
            return
        try:
            n = transport.send(data)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            self._lost(f"send: {why(exc)}")
            return
        if n and waited and self._sent < self._ping_end:
            # Bytes that waited in this buffer, the PINGREQ among them, leave: a slow link, not
            # a dead one, so the PINGREQ is not late. Bytes the socket takes at once do not
            # count: its kernel buffers take them for a while from a peer gone silent too.
            conn.moved_at = now
        self._sent += n
        if data is out:
            del out[:n]
        elif n < len(data):
            out += memoryview(data)[n:]

    def _answered(self, events: list) -> None:
        """Events to hand out; the source that gave a request answered is told (acked), also
        while run() has a batch of its own (whose requests are not the source's)."""
        self._events.extend(events)
        acked = self._acked
        if acked is not None:
            batch = self._watch
            for event in events:
                if type(event) in _ANSWERS and (batch is None or id(event.request) not in batch):
                    acked(event.request)

    def _wait(self, now: float, deadline: float | None) -> None:
        transport = self._transport
        timeout = None if deadline is None else max(0.0, deadline - now)
        self._watch_source(not self._paused and not self._source_done
                           and self._idle_until is _NEVER, now)

        def sooner(at):
            nonlocal timeout
            if at is not None:
                left = max(0.0, at - now)
                timeout = left if timeout is None else min(timeout, left)

        if self._dialing is not None:
            sooner(self._dial_until)
        elif transport is None:
            if not self._stopped and not self._paused:
                sooner(self._retry_at)
        elif not self._paused:
            sooner(self.conn.next_deadline())
            if self._source is not None and not self._source_done:
                sooner(self._idle_until if now < self._idle_until < _NEVER else None)
                if self._throttle is not None:
                    sooner(self._throttle.ready_at())
            if transport.pending() or self._more:
                timeout = 0.0
        if self._events or self._batch_done() or self.end_when_idle and self.idle:
            timeout = 0.0           # events to hand out, or run() or the work is over: look
        self._watch_transport(0 if self._paused or transport is None else
                              selectors.EVENT_READ | (selectors.EVENT_WRITE if self._out else 0))
        for key, mask in self._selector.select(timeout):
            if key.fileobj is self.commands:
                self.commands.woken()
                self._idle_until = 0.0      # wake(): ask the source again at once
                continue
            if key.data is _SOURCE:
                self._idle_until = 0.0
                continue
            if key.data is DIAL:
                if self._dialing is not None:
                    self._dial_step()
                continue
            if mask & selectors.EVENT_WRITE:
                self._flush(self._clock())
            if mask & selectors.EVENT_READ and self._transport is not None:
                self._read()
        if (not self._paused and self._transport is not None and self._transport.pending()):
            self._read()

    def _watch_transport(self, mask: int) -> None:
        if mask == self._mask:
            return
        transport = self._transport
        if self._mask and mask:
            self._selector.modify(transport, mask)
        elif mask:
            self._selector.register(transport, mask)
        else:
            self._selector.unregister(transport)
        self._mask = mask

    def _watch_source(self, want: bool, now: float) -> None:
        """Watch the source's descriptor while the source waits for it."""
        fd = self._source_fd if want else None
        watched = self._fd_watched
        if fd == watched:
            return
        if watched is not None:
            self._selector.unregister(watched)
            self._fd_watched = None
        if fd is not None:
            try:
                self._selector.register(fd, selectors.EVENT_READ, _SOURCE)
            except (OSError, ValueError):
                # a regular file (epoll refuses it) is always readable: ask again in a while
                self._source_fd = None
                self._idle_until = now + IDLE_POLL
                return
            self._fd_watched = fd

    def _read(self) -> None:
        transport = self._transport
        try:
            data = transport.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(f"receive: {why(exc)}")
            return
        if not data:
            self._lost("connection closed by the server")
            return
        events = self.conn.receive_data(data, self._clock())
        if events:
            self._answered(events)
        while self._transport is not None and transport.pending():
            events = self.conn.receive_data(transport.recv(READ_SIZE), self._clock())
            if events:
                self._answered(events)

    def _check_state(self, now: float) -> None:
        state = self.conn.state
        if self._transport is None or state in ("connected", "connecting"):
            if state == "connected" and self.backoff.up_since is None:
                self.backoff.succeeded(now)     # (the count starts again once it lasted)
            return
        # The connection ended (refused, server DISCONNECT, protocol error, ping timeout):
        # what it still has to say (a 5.0 DISCONNECT) goes out first, briefly.
        self._out += self.conn.data_to_send(now)
        self._drain(now + 0.1)
        self._drop_transport()
        if state == "disconnected":
            self._after_loss(now)

    def _lost(self, reason: str) -> None:
        conn = self.conn
        was = conn.state
        transport = self._transport
        conn.connection_lost()
        self._drop_transport()
        if was == "connecting":
            self._events.append(ConnectFailed(None, lost_reason(transport, was, reason)))
        elif was == "connected":
            self._events.append(Disconnected(None, reason))
        if conn.state == "disconnected":
            self._after_loss(self._clock())

    def _after_loss(self, now: float) -> None:
        if self._stopped:
            return
        if self.backoff.again():
            self._retry_at = now + self.backoff.delay()
        else:
            self._finished = True

    def _drop_transport(self) -> None:
        self._stop_dialing()
        transport = self._transport
        if transport is None:
            return
        self.backoff.lost(self._clock())
        if self._mask:
            self._selector.unregister(transport)
            self._mask = 0
        transport.close()
        self._transport = None
        self._out.clear()

