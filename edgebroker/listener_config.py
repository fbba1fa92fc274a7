"""A ``[[listener]]`` table of the configuration: its settings, the rules between its keys, and
``--listen HOST:PORT``. ``edgebroker.config`` builds listeners from the file with these.
"""

from __future__ import annotations

import os
import socket

from edgebroker.config_fields import (
    at_least, between, file_path, octal_mode, one_of, setting, url_path,
)
from edgebroker.errors import ConfigError
from edgebroker.records import record

# The admin socket's name in the state directory (server/admin.py).
ADMIN_SOCKET = "admin.sock"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1883
IPV6_LOOPBACK = bytes(15) + b"\1"   # ::1
TLS_VERSIONS = ("tlsv1.2", "tlsv1.3")
PROTOCOLS = ("mqtt", "websockets")


# How a unix_socket in a directory the broker cannot write is made to work (under the unit,
# ProtectSystem=strict makes all but its own directories read-only): config check and serve.
UNIX_SOCKET_HINT = ("let the socket unit make it (ListenStream= with that path), or make the "
                    "directory writable for the broker (under systemd: ReadWritePaths=; "
                    "docs/deploy.md)")


@record(frozen=True)
class ListenerConfig:
    host: str = setting(DEFAULT_HOST, doc="address to bind; \"::\" or \"0.0.0.0\" for all")
    port: int = setting(DEFAULT_PORT, between(0, 65535), doc="TCP port; 0 picks a free port")
    max_connections: int = setting(
        0, at_least(0),
        doc="connected clients on this listener; over it CONNACK 3; 0: only limits.max_connections")
    # What the connections speak: MQTT, or MQTT over WebSockets (wss with a certfile).
    protocol: str = setting(
        "mqtt", one_of(*PROTOCOLS),
        doc="\"mqtt\", or \"websockets\": MQTT over WebSockets (wss when certfile is set)")
    websocket_path: str = setting(
        "/mqtt", url_path, doc="with protocol websockets: the URL path of the HTTP upgrade")
    # Unix-domain socket listener (instead of host/port).
    unix_socket: str = setting(
        "", file_path, doc="path of a Unix-domain socket to listen on instead of TCP")
    unix_socket_mode: str = setting(
        "0660", octal_mode, doc="permissions of the Unix socket file (octal)")
    # TLS: a listener with a certfile speaks MQTT over TLS.
    certfile: str = setting(
        "", file_path, doc="PEM server certificate (chain); makes this a TLS listener")
    keyfile: str = setting(
        "", file_path, doc="PEM private key of certfile (empty: the key is in certfile)")
    cafile: str = setting(
        "", file_path, doc="PEM CA certificate(s) that client certificates must chain to")
    require_certificate: bool = setting(
        False, doc="clients must present a certificate signed by cafile")
    use_identity_as_username: bool = setting(
        False, doc="the client certificate's common name is the user name (no password)")
    tls_version: str = setting(
        "tlsv1.2", one_of(*TLS_VERSIONS), doc="lowest TLS version accepted")
    ciphers: str = setting("", doc="OpenSSL cipher list for TLS 1.2 (empty: Python's default)")
    handshake_timeout: float = setting(
        10.0, at_least(0.001), doc="seconds a TLS handshake may take before the socket is closed")
    # Authentication overrides (None: the top-level setting applies).
    allow_anonymous: bool | None = setting(
        None, doc="overrides the top-level allow_anonymous for this listener")
    password_file: str | None = setting(
        None, file_path,
        doc="overrides the top-level password_file; \"\" for none on this listener")
    acl_file: str | None = setting(
        None, file_path, doc="overrides the top-level acl_file; \"\" for none on this listener")

    @property
    def address(self) -> str:
        if self.unix_socket:
            return f"unix:{self.unix_socket}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        return bool(self.certfile)

    def is_local(self) -> bool:
        """True for a Unix socket or a loopback address (not reachable from the network)."""
        if self.unix_socket:
            return True
        if self.host == "localhost":
            return True
        # A literal 127.0.0.0/8 or ::1 address (read with socket's parser: the ipaddress
        # module would cost the broker memory all its life).
        try:
            return socket.inet_pton(socket.AF_INET, self.host)[0] == 127
        except (OSError, ValueError):
            pass
        try:
            return socket.inet_pton(socket.AF_INET6, self.host) == IPV6_LOOPBACK
        except (OSError, ValueError):
            return False


_TLS_ONLY = ("keyfile", "cafile", "require_certificate", "use_identity_as_username",
             "tls_version", "ciphers", "handshake_timeout")


def listener_problems(lst: ListenerConfig, given: dict, name: str) -> list[str]:
    """What breaks the rules between the keys of one [[listener]] table."""
    problems = []
    if "websocket_path" in given and lst.protocol != "websockets":
        problems.append(f"{name}.websocket_path: only with protocol = \"websockets\"")
    if lst.unix_socket:
        problems += [f"{name}.{key}: not used with unix_socket (a Unix socket listener has no "
                     f"address, port or TLS)"
                     for key in ("host", "port", "certfile") + _TLS_ONLY if key in given]
        return problems
    if "unix_socket_mode" in given:
        problems.append(f"{name}.unix_socket_mode: only with unix_socket")
    if not lst.certfile:
        problems += [f"{name}.{key}: needs certfile (TLS settings apply only to a TLS listener)"
                     for key in _TLS_ONLY if key in given]
        return problems
    if lst.require_certificate and not lst.cafile:
        problems.append(f"{name}.require_certificate: needs cafile (the CA that signs the "
                        f"client certificates)")
    if lst.use_identity_as_username and not lst.require_certificate:
        problems.append(f"{name}.use_identity_as_username: needs require_certificate = true")
    return problems


def parse_address(text: str) -> ListenerConfig:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (all interfaces) for ``--listen``."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    port_no = int(port)
    if port_no > 65535:
        raise ConfigError(f"--listen {text!r}: port must be between 0 and 65535")
    return ListenerConfig(host=host, port=port_no)


# ----------------------------------------------------------------------------- overlaps
# Two sockets cannot bind one port when their addresses overlap: the same address, or a
# wildcard (0.0.0.0, ::) and any address of its family. "::" takes IPv4 too on Linux (with
# net.ipv6.bindv6only = 0), unless it is bound IPV6_V6ONLY: the broker does so when an IPv4
# address shares its port (as Mosquitto binds every IPv6 socket), so "0.0.0.0" and "::" on
# one port serve IPv4 and IPv6 side by side. Port 0 picks a free port: it overlaps nothing.

def _family_and_address(host: str) -> tuple[int, bytes | str]:
    """The family the listener binds with (as server/listeners.py) and its address: packed
    for a literal, else the name as written (a host name is resolved at bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return family, socket.inet_pton(family, host or "0.0.0.0")
    except (OSError, ValueError):
        return family, host.lower()


def bind_entries(listeners, metrics_listen: str) -> list[tuple[str, ListenerConfig]]:
    """(name in messages, address) of every TCP socket the configuration binds."""
    entries = [(f"listener[{i}]", lc) for i, lc in enumerate(listeners) if not lc.unix_socket]
    if metrics_listen:
        try:
            entries.append(("metrics.listen", parse_address(metrics_listen)))
        except ConfigError:
            pass        # reported as metrics.listen's own problem
    return entries


def ipv4_ports(listeners, metrics_listen: str) -> set[int]:
    """Ports an IPv4 address is bound on: an IPv6 socket on one of them is bound V6ONLY."""
    return {lc.port for _, lc in bind_entries(listeners, metrics_listen)
            if lc.port and ":" not in lc.host}


_MAPPED_PREFIX = bytes(10) + b"\xff\xff"


def _overlap(a: ListenerConfig, b: ListenerConfig) -> str:
    """Why ``a`` and ``b`` cannot both be bound, or ""."""
    if not a.port or a.port != b.port:
        return ""
    family, address = _family_and_address(a.host)
    other_family, other = _family_and_address(b.host)
    if family != other_family:
        # "::" is bound IPV6_V6ONLY next to an IPv4 address (above), and no IPv4-mapped
        # address (::ffff:a.b.c.d) can be bound that way: the bind fails with EINVAL.
        mapped = [h for h, f, packed in ((a.host, family, address), (b.host, other_family, other))
                  if f == socket.AF_INET6 and isinstance(packed, bytes)
                  and packed[:12] == _MAPPED_PREFIX]
        if mapped:
            v4 = socket.inet_ntop(socket.AF_INET, _family_and_address(mapped[0])[1][12:])
            return (f"{mapped[0]} is an IPv4-mapped address, which cannot be bound beside an "
                    f"IPv4 address on one port (write it as {v4})")
        return ""
    if address == other:
        return "the same address and port"
    wildcard = bytes(4 if family == socket.AF_INET else 16)
    for host, packed in ((a.host, address), (b.host, other)):
        if packed == wildcard:
            return (f"{host or '0.0.0.0'} takes every IPv{4 if len(wildcard) == 4 else 6} "
                    f"address on port {a.port}")
    return ""


def _the_file(path: str) -> str:
    """The file ``path`` names, its links followed (as written if it holds a NUL, a problem
    reported on its own)."""
    return path if "\0" in path else os.path.realpath(path)


def address_problems(listeners, metrics_listen: str, admin_socket: str = "") -> list[str]:
    """Listeners (and the metrics endpoint) whose sockets could not all be bound: the same
    Unix socket path twice, or at ``admin_socket`` (the broker's own), or TCP addresses that
    overlap on one port; each named with the entry it overlaps."""
    problems = []
    paths: dict[str, int] = {}      # the file a Unix socket path names: the first listener's
    admin = _the_file(admin_socket) if admin_socket else None
    for i, lc in enumerate(listeners):
        if not lc.unix_socket:
            continue
        # ("/d/x.sock", "/d//x.sock", "x.sock" run in /d and a link to /d name one file)
        first = paths.setdefault(_the_file(lc.unix_socket), i)
        if first != i:
            same = listeners[first].unix_socket
            problems.append(f"listener[{i}]: {lc.address} is listed twice" if same ==
                            lc.unix_socket else f"listener[{i}]: {lc.address} names the same "
                            f"file as listener[{first}] (unix:{same})")
        elif _the_file(lc.unix_socket) == admin:
            problems.append(f"listener[{i}]: unix_socket {lc.unix_socket} is the path of the "
                            f"broker's admin socket (data_dir/{ADMIN_SOCKET}); choose another")
    entries = bind_entries(listeners, metrics_listen)
    for j, (name, lc) in enumerate(entries):
        for other_name, other in entries[:j]:
            why = _overlap(lc, other)
            if why == "the same address and port" and "metrics.listen" not in (name, other_name):
                problems.append(f"{name}: {lc.address} is listed twice (as {other_name})")
                break
            if why:
                problems.append(f"{name}: {lc.address} overlaps {other_name} ({other.address}): "
                                f"{why}, so they cannot both listen")
                break
    return problems
