"""The composition root: the broker's storage, state, listeners, security, admin socket and
metrics endpoint put together around the selector loop (server/loop.py), and reload and
shutdown; ``App.start`` runs it all.

New connections pass a broker-wide token bucket (``max_connection_rate``,
``connection_burst``): when it is empty every listener is unregistered from
the selector until a timer in the broker's heap says enough tokens are back;
meanwhile the kernel's listen backlog holds the callers.

Each listener carries its security: a ``ListenerPolicy`` (who may connect,
the ACL) handed to every connection's transport, and for TLS listeners a
``TLSServer`` (server/tls.py). Password checks finish on worker threads and
come back through the wake-up (``Authenticator.deliver``).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import time

from collections import deque

import edgebroker
from edgebroker import __version__, _native
from edgebroker.commitlog import CommitLog, Flusher, LogOptions
from edgebroker.config import Config
from edgebroker.core import snapshot as snap
from edgebroker.core.broker import Broker
from edgebroker.core.exchanges import ExchangeJournal, load as load_exchanges
from edgebroker.rates import TokenBucket
from edgebroker.core.timers import Timer
from edgebroker.errors import ConfigError
from edgebroker.listener_config import ipv4_ports
from edgebroker.security.authenticator import Authenticator
from edgebroker.security.policy import ListenerPolicy
from edgebroker.server import activation, sdnotify
from edgebroker.server.framing import FramedClient, Framing
from edgebroker.server.descriptors import (
    SPARE_DESCRIPTORS, DescriptorRoom, open_files_limit, reserve_descriptors,
)
from edgebroker.server.listeners import DescriptorReserve, Listener, UnixListener
from edgebroker.server.loop import Loop
from edgebroker.server.transport import Transport

log = logging.getLogger("edgebroker.server")

# At shutdown, keep flushing queued output for at most this long.
DRAIN_SECONDS = 2.0
# At a stop while the commit log cannot write (a full disk): how long what waits in memory
# may wait for room (docs/persistence.md, "A full disk or a failing disk").
STOP_WRITE_SECONDS = 5.0
# After the connection rate limit paused accepting, resume once this many seconds' worth
# of tokens are back (fewer, shorter pauses would only cost more wake-ups).
ACCEPT_RESUME_SECONDS = 0.02
# How often the one-file binary's broker looks whether its parent, the bootloader, is there.
PARENT_CHECK_SECONDS = 1.0
# Freed heap memory malloc keeps for reuse instead of giving it back to the kernel, and the
# allocation size below which it comes from the heap (keep_freed_memory; docs/limits.md).
HEAP_KEEP_BYTES = 8 << 20
HEAP_FROM_BYTES = 4 << 20
# Collections of the middle generation between two full ones (Python's default: 10;
# tune_garbage_collector).
GC_FULL_EVERY = 100


def keep_freed_memory() -> None:
    """Let malloc keep what the broker frees for its next allocations (HEAP_KEEP_BYTES).

    Large payloads are received into buffers of their own, freed once sent and logged, and
    allocated again for the next ones, a loop pass's worth at a time. With glibc's default
    (give back a free heap top over 128 KiB) those buffers were new pages each time: 64 KiB
    messages cost 14 page faults each and a third more CPU, depending only on where the heap's
    other objects happened to lie. Allocations below HEAP_FROM_BYTES come from the heap."""
    err = _native.keep_freed_memory(HEAP_KEEP_BYTES, HEAP_FROM_BYTES)
    if err:
        log.debug("malloc settings not applied (%s): freed memory goes back to the kernel",
                  os.strerror(err))


def tune_garbage_collector() -> None:
    """Once the state is restored: what start-up made (modules, restored sessions and retained
    messages) is left out of every later garbage collection (``gc.freeze``), and a full
    collection comes at most every GC_FULL_EVERY middle ones, not 10. Each full collection
    walks every container object: with 500 sessions catching up at once they came about once
    a second, 80 to 150 ms each, freeing nothing, and the loop stood still meanwhile
    (docs/limits.md). Memory over ``memory_limit`` still collects at once (core.memory)."""
    import gc
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, GC_FULL_EVERY)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class App(DescriptorRoom):
    """The composition root: the loop, the commit log and its threads, the broker, the
    listeners and their security, the admin socket and the metrics endpoint."""

    def __init__(self, config: Config, reload_config=None, clock=time.monotonic,
                 bridge_tls: list | None = None):
        """``bridge_tls``: the bridges' TLS contexts, read by serve's checks before any state
        (bridge.bridges.tls_contexts)."""
        self.config = config
        self.started = config     # what a reload compares the keys needing a restart with
        self.clock = clock
        self.reload_config = reload_config
        reserve_descriptors(config.limits.max_connections + SPARE_DESCRIPTORS)
        self.open_files = open_files_limit()
        self.descriptors_short = False  # refusing callers for want of descriptors (logged)
        self.reserve = DescriptorReserve()
        self.loop = loop = Loop(config.coalesce_ms, clock, config.busy_poll_us)
        loop.on_wake = self._on_wake
        loop.on_reload = self.reload
        loop.on_reserve_freed = self._reserve_freed
        self.selector = loop.selector
        self.state_dir = config.state_dir()
        self._durable: deque[int] = deque()   # offsets reported by the flusher thread
        self.listeners: list[Listener] = []
        self.accept_gate = self._make_accept_gate(config)
        self._wake_timer = Timer(self._on_wake_timer)  # makes select return for paused listeners
        self.uploader = None  # uploader.Uploader, with [upload] url
        self.bridges = None   # bridge.bridges.Bridges, with [[bridge]] tables
        self.bridge_tls: list = bridge_tls or []
        self.admin = None     # server.admin.AdminServer
        self.metrics = None   # server.metrics_http.MetricsServer
        self.authenticator = Authenticator(loop.wake, clock, config.max_login_failures,
                                           config.login_failure_window,
                                           state_dir=self.state_dir)
        # (kind, path) or ("tls", ListenerConfig) -> (file_stamp, what was read): the last read
        # of the security files (``_security``); the keys of those that read found unchanged
        self.kept_files: dict = {}
        self.files_unchanged: set = set()

    def start(self) -> int:
        """Open everything, serve until SIGTERM or SIGINT, shut down. The exit status: 0, or
        1 when the final session snapshot could not be written (``shutdown``)."""
        loop = self.loop
        keep_freed_memory()
        self.open_listeners()
        if self.config.bridge and not self.bridge_tls:   # (before any state is opened)
            from edgebroker.bridge.bridges import tls_contexts
            self.bridge_tls = tls_contexts(self.config.bridge)
        # The admin socket first: a broker already running on this state directory
        # is refused with one clear line before the commit log (and its lock) is touched.
        self.open_admin(self.state_dir)
        try:
            self.open_storage()
            self.open_metrics()
        except BaseException:
            self.close_admin()
            raise
        log.info("state directory %s; configuration %s", self.state_dir,
                 self.config.source or "embedded defaults")
        early_stop = loop.install_signal_handlers()
        if early_stop:
            log.info("%s during start-up: stopping", signal.Signals(early_stop).name)
        self.flusher.start()
        self.snapshots.start()
        if self.uploader is not None:
            self.uploader.start()
        if self.bridges is not None:
            self.bridges.start()
        # The heap start-up freed (imports, the restore) goes back to the kernel once; from
        # here on malloc keeps what is freed (keep_freed_memory). About 0.5 MiB of the idle
        # broker's memory (docs/deploy.md); ENOSYS without glibc, nothing to do then.
        _native.release_freed_memory()
        tune_garbage_collector()
        if not early_stop:
            sdnotify.notify("READY=1\nSTATUS=serving MQTT")
            log.info("edgebroker %s ready", __version__)
        if edgebroker.stop_with_parent:
            self._parent_timer = Timer(self._check_parent)
            self._parent_timer.start(self.broker, self.clock() + PARENT_CHECK_SECONDS)
        loop.run()
        return self.shutdown()

    # ----- set-up -----------------------------------------------------------------------

    def open_storage(self) -> None:
        """The commit log, its flusher, the snapshot writer; then the state they hold.

        Called after ``open_listeners``, so a configuration mistake (a missing
        certificate, say) stops the start before any state is touched."""
        config = self.config
        _native.log_backend()
        uploading = bool(config.upload.url)
        self.log = CommitLog.open(os.path.join(self.state_dir, "log"),
                                  LogOptions.from_config(config.log, uploading), clock_ms=wall_ms)
        # Age retention deletes nothing until the core's first maintenance has worked out
        # what the cursors restored below and the bridges' checkpoints need (a roll in the
        # first second would delete their segments); retention_bytes still applies.
        self.log.hold_offset = 0
        self.broker = Broker(config, self.clock, commit_log=self.log, wall_ms=wall_ms)
        self.authenticator.stats = self.broker.stats   # it counts the password checks there
        self.flusher = Flusher(self.log, config.log.durability, config.log.flush_interval_ms,
                               on_durable=self._on_durable)
        self.broker.journal.flusher = self.flusher
        exchanges = ExchangeJournal(self.state_dir, self.broker.stats)
        self.broker.exchanges = self.broker.journal.exchanges = exchanges
        self.flusher.also_sync = exchanges.sync
        self.snapshots = snap.SnapshotWriter(self.state_dir)
        self.broker.submit_snapshot = self.snapshots.submit
        self.broker.snapshot_writer = self.snapshots
        self.loop.broker = self.broker
        self.broker.busy_poll = self.loop.busy_poll
        self.broker.cpu_contention = self.loop.contention
        self.loop.log = self.log
        self._restore()
        self.warn_open_files()
        if uploading:
            # Imported only with an uploader: it brings zstandard's C extension.
            from edgebroker.uploader.uploader import Uploader
            self.uploader = Uploader(self.log, self.state_dir, config.upload, clock_ms=wall_ms)
            self.broker.upload_figures = self.uploader.figures
            self.loop.uploader = self.uploader
        if config.bridge:
            from edgebroker.bridge.bridges import Bridges
            self.bridges = Bridges(config.bridge, self.bridge_tls or [None] * len(config.bridge),
                                   self.broker, self.loop, self.state_dir)

    def _restore(self) -> None:
        """Sessions and retained messages from the snapshot, then the log written after it."""
        started = time.monotonic()
        try:
            state = snap.read(self.state_dir)
        except snap.SnapshotError as exc:    # (the module imported only then: idle RSS)
            from edgebroker.core.snapshot_damage import after_error
            state = after_error(self.state_dir, exc)
        if state is None:
            log.info("no session snapshot in %s: starting with no sessions", self.state_dir)
        else:
            self.broker.restore(state)
            start = max(state.log_next_offset, self.log.first_offset)
            replayed = self.broker.replay(self.log.read_range(start))
            if state.exchanges is not None:
                self.broker.apply_exchanges(load_exchanges(self.state_dir, state.exchanges))
            # Delayed wills: checked against the ACL of the listener they came in on.
            self.broker.arm_restored_wills({x.address: x.policy.acl for x in self.listeners
                                            if x.policy is not None})
            log.info("restored %d persistent sessions and %d retained messages; replayed %d log "
                     "records from offset %d in %.3f s", len(state.sessions),
                     self.broker.retained.count, replayed, start, time.monotonic() - started)
        # A snapshot exists from now on, so a crash before the first change
        # still replays the log from here.
        self.broker.hold_unsaved_from_start()
        self.snapshots.submit(self.broker.capture())

    def _on_durable(self, offset: int) -> None:
        """Flusher thread: everything below ``offset`` is on disk."""
        self._durable.append(offset)
        self.loop.wake()

    def open_listeners(self) -> None:
        config = self.config
        # Read every certificate, password and ACL file before binding anything.
        security = self._security(config, [(i, lc) for i, lc in enumerate(config.listeners)])
        # Socket activation: the listening sockets systemd holds, when it passed them.
        passed = activation.listen_fds()
        socks = (activation.match(config.listeners, passed) if passed is not None
                 else [None] * len(config.listeners))
        v4 = ipv4_ports(config.listeners, config.metrics.listen)  # "::" there: V6ONLY
        for lc, (tls, policy), sock in zip(config.listeners, security, socks):
            listener = (UnixListener(self, lc, sock) if lc.unix_socket
                        else Listener(self, lc, sock, v6only=lc.port in v4))
            listener.set_security(tls, policy)
            self.listeners.append(listener)
            self.selector.register(listener.sock, selectors.EVENT_READ, listener.on_event)
            log.info("listening on %s", listener.describe())
        files = {id(p.passwords): p.passwords for _, p in security if p.passwords}
        for passwords in files.values():
            if passwords.weak:
                log.warning("password file %s: weak PBKDF2 hashes (under 10000 iterations) for "
                            "%s; set them again with edgebroker passwd", passwords.path,
                            ", ".join(repr(u) for u in passwords.weak))

    def _security(self, config: Config, listeners) -> list:
        """(TLSServer or None, ListenerPolicy) per (index, ListenerConfig); ConfigError, naming
        the configuration file (``config.source``) that names the file it could not use."""
        files: dict = {}
        kept = self.kept_files
        out = []
        problems = []       # every listener's, at once
        for i, lc in listeners:
            tls = policy = None
            try:
                if lc.tls:
                    tls = self._tls_server(lc, i, kept, files)
            except ConfigError as exc:
                problems += exc.problems
            try:
                policy = ListenerPolicy.build(lc, config.auth(lc), self.authenticator, files, i,
                                              kept)
            except ConfigError as exc:
                problems += exc.problems
            out.append((tls, policy))
        if problems:    # (nothing applied: the files in force stay those kept)
            raise ConfigError(*problems).in_file(config.source)
        # What the next reload need not read again while the files stay as they are.
        self.kept_files = files
        self.files_unchanged = {key for key, entry in files.items() if kept.get(key) is entry}
        return out

    @staticmethod
    def _tls_server(lc, i: int, kept: dict, files: dict):
        """The listener's TLSServer: the one read before (``kept``) while none of its files
        (certfile, keyfile, cafile) changed (``file_stamp``), else a new one."""
        from edgebroker.security.policy import kept_or_read
        # server/tls.py: a broker without TLS listeners does not load it
        from edgebroker.server.tls import TLSServer
        return kept_or_read(files, kept, ("tls", lc),
                            [f for f in (lc.certfile, lc.keyfile, lc.cafile) if f],
                            lambda: TLSServer(lc, f"listener[{i}]"))

    def open_admin(self, state_dir: str) -> None:
        from edgebroker.server.admin import AdminServer
        self.admin = AdminServer.open(self.loop, state_dir)

    def close_admin(self) -> None:
        """Remove the admin socket (the start failed after it was opened)."""
        if self.admin is not None:
            self.admin.close()
            self.admin = None

    def open_metrics(self) -> None:
        if self.config.metrics.listen:
            from edgebroker.server.metrics_http import MetricsServer
            self.metrics = MetricsServer.start(self.loop, self.config.metrics.listen,
                                               ipv4_ports(self.config.listeners, ""))

    def _make_accept_gate(self, config: Config) -> TokenBucket | None:
        limits = config.limits
        if not limits.max_connection_rate:
            return None
        return TokenBucket(limits.max_connection_rate, limits.connection_burst, self.clock())

    def accept_gate_closed(self) -> None:
        """The connection rate limit is reached: stop accepting until tokens are back."""
        gate = self.accept_gate
        broker = self.broker
        now = self.clock()
        until = now + gate.wait_for_share(ACCEPT_RESUME_SECONDS)
        broker.hit("max_connection_rate")
        broker.events.log(logging.WARNING, "max_connection_rate", now,
                          "new connections arrive faster than max_connection_rate (%g/s, burst %d):"
                          " accepting paused for %.3f s, the listen backlog holds the callers",
                          gate.rate, gate.burst, until - now)
        for listener in self.listeners:
            listener.pause(until)

    def wake_at(self, when: float) -> None:
        """Make sure the loop wakes up by ``when`` (for paused listeners)."""
        timer = self._wake_timer
        if timer.when is None or when < timer.when:
            timer.start(self.broker, when)

    def _on_wake_timer(self) -> None:
        # Resume the listeners whose pause is over; wake again for the others.
        now = self.clock()
        later = []
        for listener in self.listeners:
            if listener.paused_until:
                if listener.paused_until <= now:
                    listener.resume()
                else:
                    later.append(listener.paused_until)
        if later:
            self.wake_at(min(later))

    def _check_parent(self) -> None:
        """The one-file binary's broker runs in the bootloader's child. A SIGKILL of the
        bootloader (a supervisor or `kill -9` stopping the main pid) would leave it serving as an
        orphan, holding the port and the state directory: it stops as on SIGTERM instead."""
        parent = edgebroker.stop_with_parent
        if os.getppid() == parent:
            self._parent_timer.start(self.broker, self.clock() + PARENT_CHECK_SECONDS)
            return
        log.warning("the parent process (pid %d, the one-file binary's bootloader) is gone: "
                    "stopping", parent)
        self.loop.stop()

    def _on_wake(self) -> None:
        """After a wake-up: finished password checks, offsets the flusher made durable."""
        self.authenticator.deliver()
        if self.bridges is not None:
            self.bridges.deliver()
        durable = self._durable
        if durable:
            newest = 0
            while durable:
                newest = max(newest, durable.popleft())
            if self.broker.journal.durable(newest):
                self.broker.prompt = True  # acknowledgements publishers wait for

    # ----- connections ------------------------------------------------------------------

    def add_connection(self, sock: socket.socket, peer: str, listener: Listener | None = None,
                       refusal: tuple[str, str] | None = None):
        """Serve an accepted socket; ``refusal``: (limit, why) to refuse its CONNECT with
        CONNACK 3. Returns its stream (server/transport.py)."""
        sock.setblocking(False)       # TCP_NODELAY comes from the listening socket
        max_pending = self.config.limits.max_pending_write_bytes
        if listener is not None and listener.tls is not None:
            from edgebroker.server.tls import TLSTransport
            transport = TLSTransport(self.loop, sock, peer, listener.tls, listener, max_pending)
        else:
            transport = Transport(self.loop, sock, peer, listener, max_pending)
        self.loop.transports.add(transport)
        self.selector.register(sock, selectors.EVENT_READ, transport)
        framing = listener.framing if listener is not None else None
        if framing is None:     # raw MQTT: the stream is the core's transport
            transport.client = self.broker.connection_made(transport, refusal)
        else:                   # a framing between the stream and the core (server/framing.py)
            transport.sniff = None
            transport.client = framed = Framing(transport, framing())
            framed.client = self.broker.connection_made(framed, refusal, FramedClient)
        return transport

    def reload(self) -> dict:
        """SIGHUP or the admin socket's ``reload``: the configuration read again and applied
        (server/reload.py, imported at the first one); the admin socket's reply."""
        from edgebroker.server.reload import reload
        return reload(self)

    # ----- shutdown -----------------------------------------------------------------------

    def shutdown(self) -> int:
        """Stop accepting, send what is queued (bounded in time), close everything. 1 when
        the final session snapshot is not on disk (logged, with what the next start misses:
        the stop failed, systemd shows it), else 0."""
        sdnotify.notify("STOPPING=1")
        log.info("stopping: draining %d connections", len(self.loop.transports))
        for listener in self.listeners:
            listener.close()
        self.listeners.clear()
        if self.admin is not None:
            self.admin.close()
        if self.metrics is not None:
            self.metrics.stop()
        # Everything received is written and synced, so the acknowledgements
        # still waiting can go out before the connections close.
        journal = self.broker.journal
        if journal.failing:
            log.warning("stopping while the commit log cannot write: %d bytes of records wait; "
                        "trying for up to %g s", self.log.pending_bytes, STOP_WRITE_SECONDS)
            self.log.write_before_stop(STOP_WRITE_SECONDS)
            journal.retry()
        self.broker.end_pass()
        bridges = self.bridges
        if bridges is not None:
            bridges.halt()      # their links stay open for the acknowledgements below
        if self.uploader is not None:
            self.uploader.stop()
        self.flusher.stop()
        loop = self.loop
        loop.drain_wakeups(0)
        self.broker.journal.durable(self.log.durable_offset)
        if bridges is not None:
            bridges.disconnect()
        loop.flush_dirty()
        loop.drain(DRAIN_SECONDS, bridges.closing if bridges is not None else None)
        if bridges is not None:
            bridges.stop()      # the links closed, the final checkpoints written
        self.authenticator.close()
        loop.stopping = True    # the connections closed now: the broker stops (Framing.close)
        self.broker.close_all()
        loop.flush_dirty()
        for transport in list(loop.transports):
            transport.shutdown()
        # The listeners are closed: the descriptors held for accept are free for the final
        # snapshot and the log's last fsync (at the open files limit they need them).
        self.reserve.close()
        saved = self.snapshots.stop(final=self.broker.capture())
        self.broker.exchanges.close()
        self.log.close()
        loop.close()
        self.broker.flush_logs(self.clock())    # what the rate-limited logs only counted
        if not saved:
            log.error("stopped without the final session snapshot (exit status 1)")
            return 1
        log.info("stopped")
        return 0
