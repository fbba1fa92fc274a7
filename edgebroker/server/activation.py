"""Socket activation: the listening sockets systemd passes (sd_listen_fds), without libsystemd.

With a socket unit (systemd/edgebroker.socket) systemd binds and listens itself and starts the
service with the sockets open at descriptors 3, 4, ..., saying so in the environment:
``LISTEN_FDS`` (how many), ``LISTEN_FDNAMES`` (their ``FileDescriptorName=``, separated by
colons) and ``LISTEN_PID`` (the process they are for; in the one-file binary the bootloader,
this process's parent). systemd keeps the sockets open while the broker stops and starts again,
so callers wait in the listen backlog instead of being refused.

The rule (docs/deploy.md, "Socket activation"): each passed socket serves the configured
listener bound to the same address, the same IP address and port (the listener's ``host``
resolved as the broker's own bind would) or the same Unix socket path. When the broker is
socket-activated, every listener must get a socket and every socket must serve a listener;
anything else stops the start with one error naming each listener and socket concerned.
The names only label the sockets in messages.

The variables are removed from the environment (a child must not take the sockets for its own),
and the descriptors made close-on-exec and non-blocking.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping, Sequence

from edgebroker.config import ListenerConfig
from edgebroker.errors import ConfigError
from edgebroker.records import record
from edgebroker.server.sdnotify import for_this_process
from edgebroker.server.peers import format_peer

log = logging.getLogger("edgebroker.server")

FIRST_FD = 3    # SD_LISTEN_FDS_START
RULE = "each socket serves the listener bound to the same address"


@record
class PassedSocket:
    fd: int
    name: str
    sock: socket.socket
    key: tuple      # what it is bound to: ("tcp", ip, port) or ("unix", path)

    @property
    def label(self) -> str:
        return f"socket {self.name!r} (fd {self.fd}, {_show(self.key)})"


def _show(key: tuple) -> str:
    """A bound address as the broker writes listener addresses."""
    if key[0] == "unix":
        return f"unix:{key[1]}"
    return format_peer(key[1:])


def listen_stream(key: tuple) -> str:
    """The ``ListenStream=`` value that binds ``key``."""
    if key[0] == "unix":
        return key[1]
    _, ip, port = key
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def listen_fds(environ: MutableMapping[str, str] = os.environ) -> list[PassedSocket] | None:
    """The listening sockets systemd passed to this process, or None when it is not
    socket-activated (no ``LISTEN_FDS``, none, or they are for another process). Removes the
    variables from ``environ`` in every case. ConfigError naming each descriptor that is not a
    listening stream socket."""
    count = environ.pop("LISTEN_FDS", None)
    names = environ.pop("LISTEN_FDNAMES", None)
    pid = environ.pop("LISTEN_PID", None)
    if count is None:
        return None
    if pid is None or not for_this_process(pid):
        log.warning("LISTEN_FDS is set for process %s, not this one (%d): not using the sockets "
                    "it names; binding the listeners", pid, os.getpid())
        return None
    try:
        n = int(count)
        if n < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"socket activation: LISTEN_FDS={count!r} is not a number of "
                          f"descriptors") from None
    if n == 0:
        return None
    labels = names.split(":") if names else []
    if len(labels) != n:        # as sd_listen_fds_with_names: names only when they all fit
        labels = ["unknown"] * n
    passed, problems = [], []
    for i, name in enumerate(labels):
        fd = FIRST_FD + i
        try:
            passed.append(adopt(fd, name))
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        for p in passed:
            p.sock.close()
        raise ConfigError("socket activation: " + "; ".join(problems))
    return passed


def adopt(fd: int, name: str) -> PassedSocket:
    """Descriptor ``fd`` as a non-blocking, close-on-exec listening socket; ValueError naming
    what it is instead."""
    what = f"fd {fd} ({name!r})"
    try:
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ValueError(f"{what} is not an open socket ({exc.strerror})") from None
    if sock.family not in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX) \
            or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ValueError(f"{what} is not a TCP or Unix stream socket (ListenStream= makes one)")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ValueError(f"{what} is not listening (a socket unit with Accept=yes passes "
                         f"connections: edgebroker.socket needs Accept=no)")
    sock.setblocking(False)
    bound = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        if isinstance(bound, bytes):        # the abstract namespace
            bound = "@" + bound[1:].decode(errors="replace")
        key: tuple = ("unix", os.path.realpath(bound) if bound.startswith("/") else bound)
    else:
        key = ("tcp", bound[0], bound[1])
    return PassedSocket(fd, name, sock, key)


def listener_key(lc: ListenerConfig) -> tuple:
    """What listener ``lc`` binds, as a PassedSocket's key: its host resolved as
    Listener's bind resolves it. OSError when the host does not resolve."""
    if lc.unix_socket:
        return "unix", os.path.realpath(lc.unix_socket)
    family = socket.AF_INET6 if ":" in lc.host else socket.AF_INET
    if not lc.host:
        return "tcp", "::" if family == socket.AF_INET6 else "0.0.0.0", lc.port
    info = socket.getaddrinfo(lc.host, lc.port, family, socket.SOCK_STREAM)
    return "tcp", info[0][4][0], lc.port


def match(listeners: Sequence[ListenerConfig], passed: list[PassedSocket]) -> list[socket.socket]:
    """The passed socket for each listener, in order. ConfigError naming every listener without
    a socket and every socket without a listener."""
    free = {}
    problems = []
    for p in passed:
        if p.key in free:       # two sockets on one address (ReusePort=yes)
            problems.append(f"{p.label} is bound to the address of {free[p.key].label}")
            continue
        free[p.key] = p
    socks = []
    for i, lc in enumerate(listeners):
        try:
            key = listener_key(lc)
        except OSError as exc:
            problems.append(f"listener[{i}] ({lc.address}): cannot resolve its host: {exc}")
            continue
        p = free.pop(key, None)
        if p is None:
            problems.append(f"listener[{i}] ({lc.address}) has no socket from systemd: add "
                            f"ListenStream={listen_stream(key)} to the socket unit, or remove "
                            f"the listener")
        else:
            socks.append(p.sock)
    for p in free.values():
        problems.append(f"{p.label} matches no listener: add a [[listener]] with that address, "
                        f"or remove its ListenStream= from the socket unit")
    if problems:
        for p in passed:
            p.sock.close()
        raise ConfigError(f"socket activation ({RULE}): " + "; ".join(problems))
    return socks
