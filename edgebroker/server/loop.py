"""The selector loop: one thread owns every socket; it only runs passes.

One pass: wait (until the next timer at most; a short busy poll first while a
session catching up waits for acknowledgements, ``BusyPoll``) → accept a bounded
number of connections per listener → read each readable socket once into a
shared buffer and hand the bytes to the core → run due timers → flush every
connection written to in this pass with one ``sendmsg`` each (a catching-up
session's first pieces may have gone earlier, ``Transport.send_now``) → act on
signal flags; every 0.2 s, look at the loop thread's wait for a CPU, which
stops the busy poll and the early pieces while it is long
(server/contention.py). Signal handlers only set flags; ``signal.set_wakeup_fd`` and a
socketpair wake the loop (other threads write one byte to the same pair).
The duration of each pass (events, timers and flushing; not the wait: from when the
poller's wait ended, ``woke``) goes into ``broker.pass_times``.

What the loop runs is put together by the composition root (server/app.py):
the broker and the commit log it hands to transports (``broker``, ``log``),
what a wake-up delivers (``on_wake``) and what SIGHUP does (``on_reload``).
"""

from __future__ import annotations

import logging
import mmap
import selectors
import signal
import socket
import time

from edgebroker.server import sdnotify
from edgebroker.server.contention import CpuContention
from edgebroker.server.framing import Framing
from edgebroker.server.poller import make_poller
from edgebroker.server.handshakes import HandshakeTimers
from edgebroker.server.transport import Transport

log = logging.getLogger("edgebroker.server")

READ_BUFFER = 256 * 1024
# One pass's budget for reading large packets (Transport._read_large), shared by the
# connections that send them in the order the selector reports them: each one's share is
# what those before it left, at least READ_BUFFER (so the first may take all of it).
# Larger passes cost less per message (a 64 KiB payload's share of a pass's log write, send
# and bookkeeping); this bounds how long one pass keeps the others waiting (about 2 ms for
# 1 MiB of 64 KiB messages on a 2-core VM).
LARGE_PASS_BYTES = 1024 * 1024
# TLS handshake steps one pass takes (server/tls.py): the step that answers a ClientHello signs
# with the server's key (about 0.7 ms for RSA-2048 on the 2-core test VM), so a reconnect storm
# of 1,000 ready handshakes held the loop 0.7 s; the rest are taken in the next passes (the
# selector reports their sockets again).
HANDSHAKES_PER_PASS = 32
# Longest wait in select: bounds how late a signal flag or wake-up is seen
# if a wake-up byte was lost.
MAX_WAIT = 1.0
HOLD_PASSES = 4  # passes of ready input whose log write and output are done together
HOLD_BYTES = 64 * 1024  # ... while less than this is waiting to be written to the log
# (and for up to coalesce_ms while no client waits for the output: see Loop.run)


def hold_window(coalesce_ms: float) -> float:
    """Seconds after a pass's start during which its output may be held for coalescing. The
    poller counts whole milliseconds, rounding up: the hold ends once less than half of
    ``coalesce_ms`` (at most half a millisecond) is left, rather than overshoot by more
    than it waits. So a message waits up to about coalesce_ms + 0.5 ms."""
    seconds = coalesce_ms / 1000
    return seconds - min(seconds / 2, 0.0005)


# Passes a busy poll skips after a miss (see BusyPoll): 2**misses - 1, the misses in a row
# counted up to this (so at most 63 passes).
BUSY_POLL_MAX_MISSES = 6


class BusyPoll:
    """Polling a little before sleeping, while a session catching up from the log waits for
    acknowledgements (``Broker.awaiting_acks``).

    Such a session is sent at most its window (20 messages by default) per round trip, and
    a loop that sleeps in ``epoll_wait`` between rounds must be woken for each one, which
    costs a process switch and, between cores, an interrupt: on a 2-core VM that wake-up is
    about as long as the rest of the round. Polling without sleeping for up to ``seconds``
    takes the acknowledgements as they arrive.

    A poll ends as soon as any socket is ready (it is handled in the pass, as after a
    sleep). It is a hit when the awaited connection received something, else a miss; a
    miss makes the next polls rarer (skipped for 1, 3, 7 ... up to 63 passes), a hit makes
    them every pass again. So a subscriber far away (whose acknowledgements take longer
    than ``seconds``) costs a poll now and then, not one per round trip, and a broker busy
    with other clients (whose input would wake it anyway) does not spin between their
    packets. No polls while the loop waits for a CPU (``contention``, server/contention.py):
    they would spin on a CPU the subscriber needs."""

    __slots__ = ("seconds", "contention", "misses", "skip", "hits", "missed")

    def __init__(self, busy_poll_us: float, contention: CpuContention | None = None):
        self.seconds = busy_poll_us / 1e6
        self.contention = contention if contention is not None else CpuContention(path="")
        self.misses = 0      # misses in a row (at most BUSY_POLL_MAX_MISSES)
        self.skip = 0        # passes to let go by before the next poll
        self.hits = 0        # polls in which the awaited connection sent something
        self.missed = 0      # ... and those in which it did not

    def poll(self, dispatch, on_error, clock, due: float, awaited) -> int:
        """Dispatch what becomes ready within ``seconds`` (and before ``due``, the next
        timer) without sleeping: how many sockets were ready, 0 when none (or skipped).
        ``awaited``: the transport whose input (``bytes_in``) makes it a hit."""
        if not self.seconds or self.contention.contended:
            return 0
        if self.skip:
            self.skip -= 1
            return 0
        until = clock() + self.seconds
        if due < until:
            until = due
        before = awaited.bytes_in
        while True:
            ready = dispatch(0.0, on_error)
            if ready or clock() >= until:
                break
        if awaited.bytes_in != before:
            self.hits += 1
            self.misses = 0
            return ready
        self.missed += 1
        if self.misses < BUSY_POLL_MAX_MISSES:
            self.misses += 1
        self.skip = (1 << self.misses) - 1
        return ready


class Loop:
    """The passes: the selector, the wake-up pair and signal flags, the timers' deadline, the
    connections written to in this pass (``dirty``) and their flush."""

    def __init__(self, coalesce_ms: float, clock, busy_poll_us: float = 0.0):
        self.clock = clock
        self.hold_window = hold_window(coalesce_ms)  # seconds (see run)
        # While the loop waits for a CPU: no busy poll, no early sends (server/contention.py)
        self.contention = CpuContention()
        self.busy_poll = BusyPoll(busy_poll_us, self.contention)
        self.selector = make_poller(clock)
        # Anonymous memory, not a bytearray (which zeroes all of it): a page becomes resident
        # only once a read reaches it, so an idle broker or one of small packets does not
        # hold the whole READ_BUFFER (docs/deploy.md, idle RSS).
        self.buffer = mmap.mmap(-1, READ_BUFFER)
        self.large_budget = LARGE_PASS_BYTES  # left of this pass's large reads (see run)
        self.handshake_budget = HANDSHAKES_PER_PASS   # left of this pass's TLS handshake steps
        self.view = memoryview(self.buffer)
        self.dirty: list[Transport] = []
        self.transports: set[Transport] = set()
        self.broker = None    # core.broker.Broker, once the app opened storage
        self.log = None       # commitlog.CommitLog (log_generation, locate)
        self.uploader = None  # uploader.Uploader with [upload] url (the admin socket's controls)
        self.on_wake = None   # called after each wake-up (the app's deliveries)
        self.on_reload = None  # called on SIGHUP
        # Connections accepted with a reserved descriptor (server/listeners.py), and what to
        # call when one closes.
        self.reserved: set[Transport] = set()
        self.on_reserve_freed = None
        self._stop = False
        self.stopping = False   # the app's shutdown closes the connections (Framing.close)
        self._reload = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self.drain_wakeups)
        self.handshakes = HandshakeTimers()

    def log_generation(self) -> int:
        """Changes whenever retention deletes segments (closing their descriptors)."""
        return self.log.counters.segments_deleted

    def locate(self, offset: int):
        return self.log.locate(offset)

    def install_signal_handlers(self) -> int:
        """The loop's handlers of SIGTERM, SIGINT and SIGHUP. Returns the stop signal
        received during start-up (noted by `serve`, cli/serve.py), 0 if none: the loop
        then stops before its first pass."""
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        early = 0
        for signum in (signal.SIGTERM, signal.SIGINT):
            before = signal.signal(signum, self._on_stop_signal)
            early = early or getattr(before, "signum", 0)
        self._stop = self._stop or bool(early)
        before = signal.signal(signal.SIGHUP, self._on_hup_signal)
        # A SIGHUP during start-up, noted by `serve` (cli/serve.py), is a reload to do now.
        self._reload = self._reload or bool(getattr(before, "pending", False))
        return early

    def _on_stop_signal(self, signum, frame) -> None:
        self._stop = True

    def stop(self) -> None:
        """End ``run`` after this pass, as SIGTERM does."""
        self._stop = True

    def _on_hup_signal(self, signum, frame) -> None:
        self._reload = True

    def wake(self) -> None:
        """Wake the loop from another thread."""
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # a wake-up is already pending

    def drain_wakeups(self, mask: int) -> None:
        """The wake-up pair is readable: empty it, then deliver (``on_wake``)."""
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self.on_wake()

    # ----- connections ------------------------------------------------------------------

    def forget(self, transport: Transport) -> None:
        """``transport`` closes its socket next: out of the poller first, by its descriptor
        (once closed, a socket is found only by searching every registration, which made a
        mass disconnect cost the square of the connections: 8,000 at once held the loop
        0.5 s)."""
        self.transports.discard(transport)
        if transport.events:
            transport.events = 0
            try:
                self.selector.unregister(transport.sock)
            except (KeyError, ValueError):
                pass

    def released(self, transport: Transport) -> None:
        """``transport``'s socket is closed."""
        if self.reserved and transport in self.reserved:
            self.reserved.discard(transport)
            self.on_reserve_freed()   # its descriptor is free again

    def flush_dirty(self) -> None:
        dirty = self.dirty
        while dirty:
            batch = dirty[:]
            dirty.clear()
            for transport in batch:
                transport.dirty = False
                if transport.closed:
                    continue
                try:
                    if transport.out or transport.want_drain:
                        # (An early send in the pass may have emptied the queue of a
                        # transport whose drain the core waits for.)
                        transport.flush()
                    if transport.closing:
                        transport.shutdown()
                except Exception:
                    self._internal_error(transport.on_event)

    # ----- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        """Run passes until a stop signal."""
        broker = self.broker
        selector = self.selector
        dispatch = selector.dispatch
        clock = self.clock
        # STATUS= and WATCHDOG=1 for systemd: from this loop, so a hung loop stops them.
        notifier = sdnotify.Notifier.from_env(clock())
        next_notify = clock() + notifier.interval if notifier is not None else float("inf")
        stats = broker.stats
        record_pass = broker.pass_times.add
        handshakes = self.handshakes
        journal = broker.journal
        commit_log = journal.log if journal is not None else None
        exchanges = broker.exchanges
        on_error = self._internal_error
        contention = self.contention
        held = 0           # passes whose log write and output wait for more input (see below)
        hold_end = 0.0     # ... at the latest until then (see hold_window)
        due = 0.0
        lone = False       # the last look for more input, with a client waiting, found none
        while not self._stop:
            self.large_budget = LARGE_PASS_BYTES
            self.handshake_budget = HANDSHAKES_PER_PASS
            if held:
                # Output is held back to look for more input: without waiting when a client
                # waits for it, else until hold_end or the next timer.
                if broker.prompt:
                    ready = dispatch(0.0, on_error)
                    lone = not ready
                else:
                    wait = min(hold_end, due) - clock()
                    ready = dispatch(wait if wait > 0.0 else 0.0, on_error)
            else:
                due = self._deadline()
                ready = 0
                awaited = broker.awaiting_acks
                if awaited is not None:
                    # A session catching up waits for acknowledgements: look for them a
                    # little before sleeping (BusyPoll).
                    broker.awaiting_acks = None
                    ready = self.busy_poll.poll(dispatch, on_error, clock, due, awaited)
                if not ready:
                    ready = dispatch(min(MAX_WAIT, max(0.0, min(due, next_notify) - clock())),
                                     on_error)
            now = clock()
            start = selector.woke       # the pass: the sockets' events from there on
            if now >= due:
                # Timers added during the pass and due at once make the next wait 0.
                # Handshakes first: one still stalled at its client's connect deadline (due
                # at the same time or later) is closed and counted once, as a TLS failure.
                if handshakes.heap:
                    handshakes.expire(now)
                broker.tick(now)
                due = self._deadline()
            pending = commit_log.pending_bytes if commit_log is not None else 0
            if (self.dirty or pending) and pending < HOLD_BYTES:
                # One log write and one send per connection for what the next passes bring:
                # - while more input is ready, for up to HOLD_PASSES passes;
                # - while no client waits for what is queued (Broker.prompt), for up to
                #   coalesce_ms: devices that publish now and then are answered in batches.
                # Only for small passes (many devices' messages): big ones gain little and
                # would hold more memory.
                if not held:
                    hold_end = now + self.hold_window
                # A client that waits alone (one connection ready, and the last look found
                # nothing more) is answered at once: the look would cost it a poll.
                if (ready and held < HOLD_PASSES and not (ready == 1 and lone and broker.prompt)
                        or not broker.prompt and now < hold_end):
                    held += 1
                    record_pass(clock() - start)
                    continue
            held = 0
            if pending or broker.unrouted or exchanges is not None and exchanges.lines:
                broker.end_pass()
            if self.dirty:
                self.flush_dirty()
            # Cleared after the flush: a connection it drained may have let queued messages
            # out (Broker.pump), which the flush sent too.
            broker.prompt = False
            if now >= next_notify:
                notifier.tick(now, len(self.transports), stats.publish_received, stats.publish_sent)
                next_notify = now + notifier.interval
            if now >= contention.next_check:
                contention.check(now)
            if self._reload:
                self._reload = False
                self.on_reload()
            record_pass(clock() - start)
        if notifier is not None:
            notifier.close()
        contention.close()

    def _deadline(self) -> float:
        """When the next timer (the broker's or a TLS handshake's) is due."""
        due = self.broker.next_deadline()
        handshakes = self.handshakes
        if handshakes.heap:
            tls_due = handshakes.next_deadline()
            if tls_due is not None and tls_due < due:
                due = tls_due
        return due

    def _internal_error(self, handler) -> None:
        """A bug met while serving one socket: log it, drop that connection, keep serving."""
        owner = handler if isinstance(handler, Transport) else getattr(handler, "__self__", None)
        if not isinstance(owner, Transport):
            log.exception("internal error in the event loop")
            return
        client = owner.client
        if isinstance(client, Framing):
            client = client.client      # the core's Client behind the framing
        log.exception("internal error while serving %s; closing its connection",
                      client.describe() if client else owner.peer)
        try:
            if client is not None:
                client.close(will=True)
        except Exception:
            log.exception("internal error while closing %s", owner.peer)
        owner.shutdown()

    def drain(self, seconds: float, closing=None) -> None:
        """Keep sending queued output for at most ``seconds`` (at shutdown). ``closing()``:
        the callbacks of other sockets of the selector still closing (the bridges' links);
        the drain waits for them too, and hands them reads as well as writes."""
        deadline = self.clock() + seconds
        while self.clock() < deadline:
            others = closing() if closing is not None else ()
            if not others and not any(t.out for t in self.transports):
                break
            handled = False
            for callback, mask in self.selector.select(0.05):
                if callback in others:
                    callback(mask)
                    handled = True
                elif mask & selectors.EVENT_WRITE:
                    callback(selectors.EVENT_WRITE)
                    handled = True
            if not handled:     # only input no one reads now (a client's, a wake-up): wait
                time.sleep(0.02)

    def close(self) -> None:
        self.selector.close()
        self._wake_r.close()
        self._wake_w.close()
