"""How a connection's peer is named in logs, metrics and ``inspect clients``, and whether it
has ended its stream (``peer_end``)."""

from __future__ import annotations

import fcntl
import select
import struct


def format_peer(addr) -> str:
    """``host:port`` (``[host]:port`` for IPv6) of a socket address; a Unix socket's path,
    or ``unix`` for an unnamed one."""
    if isinstance(addr, tuple):
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(addr) or "unix"


_ENDED = getattr(select, "POLLRDHUP", 0)   # Linux: the peer's FIN, whatever is still unread
_SIOCINQ = 0x541B                           # Linux (FIONREAD): bytes received, not yet read


def peer_end(sock) -> int | None:
    """None while the peer of ``sock`` goes on; once it has ended its stream (FIN) or reset
    it, the bytes it sent that are still unread in the socket. Seen without reading: a
    zero-timeout poll for POLLRDHUP (errors and hang-ups are always reported). None where
    POLLRDHUP does not exist (not Linux): such a peer is seen when read."""
    if not _ENDED or sock.fileno() < 0:
        return None
    poller = select.poll()
    poller.register(sock, _ENDED)
    try:
        if not poller.poll(0):
            return None
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCINQ, b"\0\0\0\0"))[0]
    except OSError:     # a reset socket has nothing left to read
        return 0
