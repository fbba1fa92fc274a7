"""Descriptors: how many sockets connections may hold, and what happens at the limit.

The open files limit (RLIMIT_NOFILE) is shared by the connections, the commit log
(``CommitLog.descriptors_held``), the broker's own (``OWN_DESCRIPTORS``) and a small reserve
(``server.listeners.DescriptorReserve``) kept for refusing callers: when the sockets hold all
the room they may, a caller is accepted with a reserved descriptor and gets CONNACK 3 rather
than waiting in the listen backlog (docs/limits.md). ``DescriptorRoom`` is that part of
``server.app.App`` (a mixin over its state: the log, the broker, the listeners, the reserve).
"""

from __future__ import annotations

import fcntl
import logging
import os
import resource
import socket

from edgebroker.server.listeners import ACCEPT_PAUSE, RESERVED_DESCRIPTORS, Listener

log = logging.getLogger("edgebroker.server")

# Descriptors reserved beyond limits.max_connections: listeners, log segments and indexes,
# the admin and metrics sockets, connections still before CONNECT.
SPARE_DESCRIPTORS = 1024
# Descriptors no connection may take, beside the commit log's (CommitLog.descriptors_held):
# the listeners, the admin and metrics sockets and their clients, the snapshot's temporary
# file, the next segment's files and its index map, the log's directory and lock, the
# process's own (/proc reads, the wake-up pair).
OWN_DESCRIPTORS = 64


def open_files_limit() -> int:
    """The RLIMIT_NOFILE soft limit (a very large number when there is none)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 62 if soft == resource.RLIM_INFINITY else soft


def reserve_descriptors(count: int) -> None:
    """Make this process's descriptor table hold ``count`` descriptors now (at most the
    RLIMIT_NOFILE soft limit), instead of growing it under load.

    The kernel doubles the table when a new descriptor does not fit it, and in a process with
    threads (the flusher, the snapshot writer) each doubling waits for an RCU grace period
    (``expand_fdtable`` calls ``synchronize_rcu``): 5-25 ms on a 2-core VM, with the loop stuck
    in accept(), at 256, 512, 1024, ... descriptors. Taking one descriptor at ``count - 1``
    and giving it back grows the table once; it never shrinks. Nothing open is touched
    (F_DUPFD takes the lowest free number from there)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        count = min(count, soft)
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return
    try:
        if count - 1 > fd:
            os.close(fcntl.fcntl(fd, fcntl.F_DUPFD, count - 1))
    except OSError:
        pass        # then the table grows when needed, as it would have
    finally:
        os.close(fd)


class DescriptorRoom:
    """The open files limit's part of ``App``."""

    def socket_room(self) -> int:
        """How many sockets connections may hold: the open files limit, less what the commit
        log holds, the broker's own (OWN_DESCRIPTORS) and the reserve for refusing callers.
        Past it a roll of the log, the flusher, the snapshot or the admin socket would find no
        descriptor free."""
        return (self.open_files - OWN_DESCRIPTORS - RESERVED_DESCRIPTORS
                - self.log.descriptors_held())

    def refuse_one(self, listener: Listener, room: int, error: str | None) -> bool:
        """No descriptor is free for a caller (``error``: accept's, else connections hold
        ``room``): accept one with a descriptor of the reserve, to be refused with CONNACK 3
        once its CONNECT arrives (core.sessions). False when none was accepted: nobody is
        waiting, or every reserved descriptor is refusing someone (then ``listener`` pauses
        until one is free again, or ACCEPT_PAUSE). Logged once per episode."""
        if not self.reserve.take():
            self.broker.hit("open_files")   # a caller waits in the listen backlog
            listener.pause(self.clock() + ACCEPT_PAUSE)
            return False
        try:
            fd, addr = listener.sock._accept()
        except OSError as exc:
            self.reserve.give_back()
            if not isinstance(exc, (BlockingIOError, InterruptedError)):
                self.accept_failed(listener, exc.strerror or str(exc))
            return False
        why = (f"accept failed ({error})" if error else
               f"{self.broker.sockets_open} sockets open, all that the open files limit "
               f"({self.open_files}) leaves")
        if not self.descriptors_short:
            self.descriptors_short = True
            log.warning("%s beside the commit log's %d descriptors (%d segments), the broker's "
                        "own %d and %d in reserve: refusing new connections (CONNACK 3) until "
                        "some close; raise the limit (systemd LimitNOFILE=, ulimit -n) for more",
                        why, self.log.descriptors_held(), self.log.segment_count,
                        OWN_DESCRIPTORS, RESERVED_DESCRIPTORS)
        conn = socket.socket(listener.family, socket.SOCK_STREAM, 0, fileno=fd)
        transport = self.add_connection(
            conn, listener.peer_name(conn, addr), listener,
            refusal=("open_files", f"{why}; raise the open files limit"))
        self.loop.reserved.add(transport)
        return True

    def accept_failed(self, listener: Listener, error: str) -> None:
        """accept() failed for want of kernel memory (or of a reserved descriptor): stop
        accepting on ``listener`` for ACCEPT_PAUSE; logged at most once a minute."""
        now = self.clock()
        self.broker.events.log(logging.ERROR, "accept", now, "accept on %s: %s; pausing "
                               "accepts for %.1f s", listener.address, error, ACCEPT_PAUSE)
        listener.pause(now + ACCEPT_PAUSE)

    def _reserve_freed(self) -> None:
        """A connection accepted with a reserved descriptor closed: its placeholder is open
        again; listeners paused for want of one accept (and refuse) the next callers now."""
        self.reserve.give_back()
        if self.descriptors_short:
            for listener in self.listeners:
                if listener.paused_until and (self.accept_gate is None
                                              or self.accept_gate.tokens >= 1.0):
                    listener.resume()

    def warn_open_files(self) -> None:
        """At start and reload: say when the open files limit leaves room for fewer sockets
        than max_connections once the log holds as many segments as its retention allows."""
        self.open_files = open_files_limit()
        segments, log_need = self.log.descriptors_at_retention()
        room = self.open_files - OWN_DESCRIPTORS - log_need
        wanted = self.config.limits.max_connections
        if room < wanted:
            log.warning("the open files limit (%d) leaves room for %d sockets once the commit "
                        "log holds %d segments (%d descriptors), fewer than max_connections "
                        "(%d): raise it (systemd LimitNOFILE=, ulimit -n) to %d or more",
                        self.open_files, max(room, 0), segments, log_need, wanted,
                        wanted + OWN_DESCRIPTORS + log_need + SPARE_DESCRIPTORS // 4)
