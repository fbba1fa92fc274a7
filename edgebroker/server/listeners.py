"""The listening sockets: binding TCP (plain or TLS) and Unix-domain listeners, and accepting;
each speaks raw MQTT or MQTT over WebSockets (``framing``, server/framing.py).

A ``Listener`` binds its address, carries its security (a ``ListenerPolicy``, and for TLS
listeners a ``TLSServer``) and hands each accepted connection to the app
(``add_connection``), a bounded number per pass; it can be paused (the connection rate
limit, a shortage of descriptors) and resumed.

When connections hold every descriptor they may (``App.socket_room``), or accept fails for
want of one (EMFILE, ENFILE), a caller is not left waiting: a descriptor of the
``DescriptorReserve`` (placeholders opened at start) is closed to accept it, the core refuses
its CONNECT with CONNACK 3 and closes it, and the placeholder is opened again
(``App.refuse_one``). Only while every reserved descriptor is refusing someone do new callers
wait in the listen backlog.

While the broker's memory is above ``memory_limit`` a caller is accepted and closed at once,
unread (``refuse_over_memory``): a connection not yet connected may hold up to the largest
valid CONNECT (core.limits.connect_size_limit) until connect_timeout.

``UnixListener``: a listener on a Unix-domain socket (local clients only, access by file
permissions). The socket file is created with ``unix_socket_mode`` permissions (default
0660: the broker's user and group). A file left at the path by a broker that
died is replaced; a socket some process still answers on, or any other kind of
file, stops the start with a message. The file is removed at shutdown.
Peers are logged as ``unix:PATH`` with the connecting process's pid and uid.

Under socket activation a listener takes the socket systemd passed (server/activation.py)
instead of binding: a Unix socket file is then systemd's, left in place at shutdown.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import selectors
import socket
import stat
import struct

from edgebroker.config import ListenerConfig
from edgebroker.listener_config import UNIX_SOCKET_HINT
from edgebroker.errors import ConfigError, EdgebrokerError
from edgebroker.security.policy import ListenerPolicy
from edgebroker.server.peers import format_peer

TYPE_CHECKING = False
if TYPE_CHECKING:   # server/tls.py: loaded by the app for TLS listeners only
    from edgebroker.server.tls import TLSServer

log = logging.getLogger("edgebroker.server")

ACCEPTS_PER_PASS = 64
LISTEN_BACKLOG = 1024
# Without a descriptor to accept with (ENOBUFS, ENOMEM; or every reserved one refusing a
# caller), stop accepting for this long instead of spinning.
ACCEPT_PAUSE = 0.5
# Descriptors kept open (on /dev/null) to accept and refuse callers when connections hold
# every other one.
RESERVED_DESCRIPTORS = 4


def framing_for(config: ListenerConfig):
    """What makes each connection's framing endpoint (server/framing.py): a
    ``WebSocketEndpoint`` on the configured path for ``protocol = "websockets"``; None for raw
    MQTT (the stream serves the core itself)."""
    if config.protocol != "websockets":
        return None
    # Imported here: wsproto costs about 1 MiB of memory, for WebSocket listeners only.
    from edgebroker.server.websocket import WebSocketEndpoint
    return functools.partial(WebSocketEndpoint, config.websocket_path)


def refuse_over_memory(broker, conn: socket.socket, peer: str, address: str) -> None:
    """A caller accepted while memory is above memory_limit: closed at once, before a byte of
    it is read; counted as a refused connection (memory_limit), logged at most once a minute
    with the number of repeats (the broker's line on going over says so too)."""
    conn.close()
    broker.stats.connections_refused += 1
    broker.refused["memory_limit"] += 1
    broker.hit("memory_limit")
    memory = broker.memory
    broker.events.log(logging.WARNING, "memory_limit_accept", broker.clock(),
                      "connection from %s on %s closed at once: memory use %d bytes is above "
                      "memory_limit (%d); new connections are closed unread until it falls "
                      "below", peer, address, memory.rss, memory.limit)


class DescriptorReserve:
    """Descriptors held open (on /dev/null) to be closed when a caller must be accepted and
    none is free, one per caller (``take``), and opened again when its connection closes
    (``give_back``)."""

    def __init__(self, size: int = RESERVED_DESCRIPTORS):
        self.size = size
        self.fds: list[int] = []
        self.lent = 0           # taken and not given back: refusing a caller
        self.fill()

    def fill(self) -> None:
        """Open placeholders up to ``size`` (less those lent), as far as descriptors allow."""
        while len(self.fds) + self.lent < self.size:
            try:
                self.fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return

    def take(self) -> bool:
        """Free one descriptor for a caller: False when none is held."""
        if not self.fds:
            self.fill()
            if not self.fds:
                return False
        os.close(self.fds.pop())
        self.lent += 1
        return True

    def give_back(self) -> None:
        """A descriptor taken is free again (its connection closed): hold it once more."""
        self.lent -= 1
        self.fill()

    def close(self) -> None:
        """Close the placeholders and hold none from now on (the stop: the final snapshot
        and the log's last fsync may need the descriptors)."""
        self.size = 0
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def _bind_tcp(config: ListenerConfig, v6only: bool) -> socket.socket:
    """``v6only``: an IPv6 socket takes no IPv4 connections (an IPv4 address shares its port:
    listener_config, "overlaps")."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and v6only:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((config.host, config.port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EACCES:   # (a start again fails the same way: exit 2, not 1)
            hint = (": a port below 1024 needs the capability CAP_NET_BIND_SERVICE "
                    "(docs/deploy.md)" if config.port < 1024 else "")
            raise ConfigError(f"cannot listen on {config.address}: {exc.strerror}{hint}") \
                from None
        raise EdgebrokerError(f"cannot listen on {config.address}: {exc.strerror or exc}") from None
    return sock


class Listener:
    """``sock``: a listening socket passed by systemd (server/activation.py), used as it is;
    without it the listener binds its address (``v6only``: see _bind_tcp)."""

    def __init__(self, app, config: ListenerConfig, sock: socket.socket | None = None,
                 v6only: bool = False):
        self.app = app
        self.config = config
        self.passed = sock is not None
        if sock is None:
            sock = _bind_tcp(config, v6only)
        # Accepted connections inherit it (Linux, the BSDs): no setsockopt per connection.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.sock = sock
        self.family = sock.family
        host, port = sock.getsockname()[:2]
        self.address = format_peer((host, port))
        self.paused_until = 0.0
        self.framing = framing_for(config)

    @property
    def max_connections(self) -> int:
        return self.config.max_connections

    policy: ListenerPolicy | None = None
    tls: TLSServer | None = None

    def peer_name(self, conn: socket.socket, addr) -> str:
        return format_peer(addr)

    def reconfigure(self, config: ListenerConfig) -> None:
        """A reload: the listener's settings from the file read again (its address stays)."""
        self.config = config

    def set_security(self, tls: TLSServer | None, policy: ListenerPolicy) -> None:
        if tls is not None:
            tls.name = self.address
        policy.name = self.address
        self.tls = tls
        self.policy = policy

    def describe(self) -> str:
        """``ADDRESS`` plus what protects it, for the "listening on" line."""
        parts = ["socket from systemd"] if self.passed else []
        if self.framing is not None:
            parts.append(f"WebSockets {self.config.websocket_path}")
        if self.tls is not None:
            lc = self.tls.config
            parts.append("TLS" + (", client certificate required" if lc.require_certificate
                                  else ""))
        policy = self.policy
        if policy is not None:
            settings = policy.settings
            if settings.identity_as_username:
                parts.append("certificate identity as user name")
            elif settings.password_file:
                parts.append(f"password file {settings.password_file}")
            parts.append("anonymous allowed" if settings.allow_anonymous else "no anonymous")
            if settings.acl_file:
                parts.append(f"ACL {settings.acl_file}")
        return f"{self.address} ({'; '.join(parts)})" if parts else self.address

    def on_event(self, mask: int) -> None:
        app = self.app
        gate = app.accept_gate
        broker = app.broker
        room = app.socket_room()
        for i in range(ACCEPTS_PER_PASS):
            if gate is not None and gate.refill(app.clock()) < 1.0:
                app.accept_gate_closed()
                return
            if broker.sockets_open >= room:
                # Connections hold every descriptor they may: refuse a caller with one held
                # in reserve (none may be waiting, the readiness event was for the last).
                if not app.refuse_one(self, room, None):
                    return
                if gate is not None:
                    gate.tokens -= 1.0
                continue
            try:
                # Not sock.accept(): it asks the listening socket for its family and type,
                # each made an enum member, for every connection (2 of its 6 µs).
                fd, addr = self.sock._accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    if not app.refuse_one(self, room, exc.strerror):
                        return
                    if gate is not None:
                        gate.tokens -= 1.0
                    continue
                if exc.errno in (errno.ENOBUFS, errno.ENOMEM):
                    app.accept_failed(self, exc.strerror)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            if gate is not None:
                gate.tokens -= 1.0
            if app.descriptors_short:
                app.descriptors_short = False
                log.warning("accepting connections again (%d sockets open)", broker.sockets_open)
            conn = socket.socket(self.family, socket.SOCK_STREAM, 0, fileno=fd)
            if broker.memory.over:
                refuse_over_memory(broker, conn, self.peer_name(conn, addr), self.address)
                continue
            app.add_connection(conn, self.peer_name(conn, addr), self)

    def pause(self, until: float) -> None:
        if self.paused_until:
            self.paused_until = max(self.paused_until, until)
        else:
            self.paused_until = until
            self.app.selector.unregister(self.sock)
        self.app.wake_at(self.paused_until)

    def resume(self) -> None:
        if not self.paused_until:
            return
        self.paused_until = 0.0
        self.app.selector.register(self.sock, selectors.EVENT_READ, self.on_event)

    def close(self) -> None:
        if not self.paused_until:
            self.app.selector.unregister(self.sock)
        self.sock.close()


_PEERCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


def _unix_error(path: str, exc: OSError) -> EdgebrokerError:
    """A directory the broker may not write (its permissions; read-only under the unit's
    ProtectSystem=strict) fails every start the same way: a ConfigError (exit 2, which the
    unit does not restart), with the ways out."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ConfigError(f"cannot listen on unix:{path}: {exc.strerror}: {UNIX_SOCKET_HINT}")
    return EdgebrokerError(f"cannot listen on unix:{path}: {exc.strerror or exc}")


def _remove_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise EdgebrokerError(f"cannot listen on unix:{path}: a file that is not a socket is "
                              f"in the way")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        pass                        # left by a process that is gone
    except OSError as exc:
        raise EdgebrokerError(f"cannot listen on unix:{path}: {exc.strerror}") from None
    else:
        raise EdgebrokerError(f"cannot listen on unix:{path}: another process is listening there")
    finally:
        probe.close()
    try:
        os.unlink(path)
    except OSError as exc:
        raise _unix_error(path, exc) from None


def _bind_unix(path: str, mode: int) -> socket.socket:
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o777 & ~mode)   # no moment with looser permissions
    try:
        sock.bind(path)
        os.chmod(path, mode)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise _unix_error(path, exc) from None
    finally:
        os.umask(old_umask)
    return sock


def _warn_wider_mode(path: str, configured: str) -> None:
    """A socket file systemd made keeps the unit's ``SocketMode=`` (its default 0666), not
    ``unix_socket_mode``: said when it lets more users connect (write permission) than
    ``unix_socket_mode`` would."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    wider = mode & 0o022 & ~int(configured, 8)
    if wider:
        log.warning("unix:%s: the socket file from systemd has mode %04o: %s may connect "
                    "(unix_socket_mode %s does not apply to a socket from systemd; set "
                    "SocketMode= in the socket unit)", path, mode,
                    "every local user" if wider & 0o002 else "its group", configured)


class UnixListener(Listener):
    """A socket file systemd made (``sock`` given) is its: its permissions are the socket
    unit's ``SocketMode=``, and it stays at shutdown."""

    def __init__(self, app, config: ListenerConfig, sock: socket.socket | None = None):
        self.app = app
        self.config = config
        self.path = config.unix_socket
        self.passed = sock is not None
        if sock is None:
            sock = _bind_unix(self.path, int(config.unix_socket_mode, 8))
            self.stat = os.stat(self.path)
        else:
            self.stat = None
            _warn_wider_mode(self.path, config.unix_socket_mode)
        sock.setblocking(False)
        self.sock = sock
        self.family = socket.AF_UNIX
        self.address = f"unix:{self.path}"
        self.paused_until = 0.0
        self.framing = framing_for(config)

    def reconfigure(self, config: ListenerConfig) -> None:
        """A reload: a changed ``unix_socket_mode`` is applied to the socket file at once (who
        may connect from now on; connections open stay). Not to a file systemd made, nor to
        one that is no longer the broker's (replaced at the path)."""
        old = self.config.unix_socket_mode
        self.config = config
        if self.stat is None or int(config.unix_socket_mode, 8) == int(old, 8):
            return
        mode = int(config.unix_socket_mode, 8)
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_dev) != (self.stat.st_ino, self.stat.st_dev):
                raise OSError(0, "the file at the path is no longer the broker's socket")
            os.chmod(self.path, mode)
        except OSError as exc:
            log.error("reload: cannot give %s the unix_socket_mode %s: %s; its permissions "
                      "stay as they were", self.address, config.unix_socket_mode,
                      exc.strerror or exc)
            return
        log.info("reload: %s now has mode %s", self.address, config.unix_socket_mode)

    def peer_name(self, conn: socket.socket, addr) -> str:
        try:
            pid, uid, _ = _PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except OSError:
            return self.address
        return f"{self.address} (pid {pid}, uid {uid})"

    def close(self) -> None:
        super().close()
        if self.stat is None:
            return
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_dev) == (self.stat.st_ino, self.stat.st_dev):
                os.unlink(self.path)    # only our own socket file
        except OSError:
            pass
