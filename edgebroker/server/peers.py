"""How a connection's peer is named in logs, metrics and ``inspect clients``."""

from __future__ import annotations


def format_peer(addr) -> str:
    """``host:port`` (``[host]:port`` for IPv6) of a socket address; a Unix socket's path,
    or ``unix`` for an unnamed one."""
    if isinstance(addr, tuple):
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(addr) or "unix"
