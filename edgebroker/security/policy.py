"""The authentication and authorisation in force on one listener.

The server layer builds one ``ListenerPolicy`` per listener (from the config,
the password file and the ACL file) and hands it to each connection's
transport; the core's ``Client`` calls ``authenticate`` at CONNECT. Outcomes,
as MQTT 3.1.1 defines the CONNACK return codes:

- 0: accepted; the client gets an ``AclView`` (or None without an ACL file).
- 4 (bad user name or password): a user name with a wrong or missing
  password, or a user name the password file does not list.
- 5 (not authorized): no user name where anonymous clients are not allowed,
  a user name throttled after failed logins from the client's address (or an
  address throttled after failed logins for many user names), unless the
  password is one that succeeded before (``authenticator``), a certificate
  without a common name where it is the user name, or a will topic the ACL
  does not let the client write.
- 3 (server unavailable; 5.0: 0x89, server busy): too many password checks already
  waiting, in all or from the client's address.

Only a verified user name counts: with no password file (and no certificate
identity) on the listener, a user name in CONNECT is logged but the client is
treated as anonymous, so it cannot claim another user's ACL rules.

SCRAM-SHA-256 (MQTT 5.0 enhanced authentication; the exchange is
``security.scram``, its packets ``core/handlers/auth.py``) checks the same
password file's users, under the same throttles and cache, and gives the same
outcomes: 0 with the user's ACL view, 4 for a wrong proof, an unknown user or
one without SCRAM keys, 5 for a throttled user or address or a message the
exchange cannot accept.
"""

from __future__ import annotations

import logging
from functools import partial

from edgebroker.config import AuthSettings, ListenerConfig
from edgebroker.errors import ConfigError, name_shown
from edgebroker.security import authenticator as A
TYPE_CHECKING = False
if TYPE_CHECKING:   # security.scram: imported by the exchanges (core/handlers/auth.py)
    from edgebroker.security import scram
    # Imported by ``build`` when a listener names such a file: without one a broker does not
    # load them (docs/deploy.md, idle RSS).
    from edgebroker.security.acl import Acl
    from edgebroker.security.passwords import PasswordFile

log = logging.getLogger("edgebroker.security")

ACCEPTED = 0
BAD_CREDENTIALS = 4
NOT_AUTHORIZED = 5
UNAVAILABLE = 3


def file_key(lc: ListenerConfig, kind: str, index: int | None) -> str:
    """The key a problem with listener ``lc``'s ``kind`` file (password_file, acl_file) is
    reported under: the listener's own (``listener[1].acl_file``) when it sets one, else the
    top level's it inherits."""
    if index is not None and getattr(lc, kind) is not None:
        return f"listener[{index}].{kind}"
    return kind


def file_stamp(*paths: str) -> tuple | None:
    """What tells whether files changed since they were read (a reload keeps what it parsed
    of an unchanged one): per path its device, inode, size, mtime and ctime (in ns; ctime
    moves at every write, chmod and chown, also when an editor or ``touch -d`` puts mtime
    back). None when one cannot be looked at: read it, and its loader says why."""
    import os
    stamp = []
    for path in paths:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        stamp.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamp)


def kept_or_read(files: dict, kept: dict | None, key, paths, read):
    """What ``read()`` makes of ``paths``, recorded as ``files[key]`` = (``file_stamp``, it):
    the entry of ``kept`` (an earlier read's ``files``) under ``key`` when the stamp is still
    the same (a reload does not read an unchanged file again), else read now. A ConfigError
    of ``read`` is raised, its entry (stamp, None)."""
    stamp = file_stamp(*paths)
    before = kept.get(key) if kept else None
    if stamp is not None and before is not None and before[1] is not None and before[0] == stamp:
        files[key] = before
        return before[1]
    files[key] = (stamp, None)
    value = read()
    files[key] = (stamp, value)
    return value


_V6_LOOPBACK = bytes(15) + b"\x01"
_V4_MAPPED = bytes(10) + b"\xff\xff"


def peer_host(peer: str) -> str:
    """The failed-login throttles' key of a client at ``HOST:PORT`` / ``[V6]:PORT``: one
    host, as far as the address tells: "loopback" for all of 127.0.0.0/8, ::1 and
    ::ffff:127.x.y.z (one machine: any local process can pick its source among them); an
    IPv4 address (also IPv4-mapped) as it is; another IPv6 address as its /64 prefix
    ("2001:db8:1:2::/64": one host commonly holds a whole /64), a link-local one (fe80::/10)
    with its scope ("fe80::/64%eth0": the link, where a host takes any number of addresses).
    A Unix socket's client (``unix:PATH (pid N, uid U)``, server/listeners.py) by its user:
    "unix uid U"; "unix" when the uid is not known."""
    if peer.startswith("unix"):
        _, sep, creds = peer.rpartition(" (pid ")
        uid = creds.rpartition(", uid ")[2].rstrip(")") if sep else ""
        return f"unix uid {uid}" if uid.isdigit() else "unix"
    host, sep, _ = peer.rpartition(":")
    host = host.strip("[]") if sep else peer
    if ":" not in host:
        return "loopback" if host.startswith("127.") else host
    import socket   # (loaded by the server already)
    address, _, scope = host.partition("%")
    try:
        packed = socket.inet_pton(socket.AF_INET6, address)
    except (OSError, ValueError):
        return host
    if packed == _V6_LOOPBACK:
        return "loopback"
    if packed[:12] == _V4_MAPPED:
        v4 = socket.inet_ntop(socket.AF_INET, packed[12:])
        return "loopback" if v4.startswith("127.") else v4
    prefix = socket.inet_ntop(socket.AF_INET6, packed[:8] + bytes(8)) + "/64"
    if scope and packed[0] == 0xFE and packed[1] & 0xC0 == 0x80:   # link-local: fe80::/10
        return f"{prefix}%{scope}"
    return prefix


class ListenerPolicy:
    def __init__(self, name: str, settings: AuthSettings, passwords: PasswordFile | None,
                 acl: Acl | None, authenticator: A.Authenticator):
        self.name = name
        self.settings = settings
        self.allow_anonymous = settings.allow_anonymous
        self.identity_as_username = settings.identity_as_username
        self.passwords = passwords
        self.acl = acl
        self.authenticator = authenticator

    @classmethod
    def build(cls, lc: ListenerConfig, settings: AuthSettings, authenticator: A.Authenticator,
              cache: dict | None = None, index: int | None = None,
              kept: dict | None = None) -> "ListenerPolicy":
        """Read the files ``settings`` names; ConfigError with the problems of both, each
        under the key that names the file (``file_key``; ``index``: the listener's). ``cache``
        ((kind, path) -> (``file_stamp``, parsed file or None)) shares one parsed file between
        listeners that name the same path (a file that could not be used is reported once);
        ``kept``, such a dict of an earlier read (the last reload's), gives a file whose stamp
        is still the same without reading it again (its entry in ``cache`` is then the kept one)."""
        cache = {} if cache is None else cache
        loaded = {}
        problems = []
        for kind in ("password_file", "acl_file"):
            path = getattr(settings, kind)
            if not path:
                continue
            if (kind, path) not in cache:
                if kind == "password_file":
                    from edgebroker.security.passwords import PasswordFile as loader
                else:
                    from edgebroker.security.acl import Acl as loader
                try:
                    kept_or_read(cache, kept, (kind, path), (path,), partial(
                        loader.load, path, file_key(lc, kind, index)))
                except ConfigError as exc:
                    problems += exc.problems
            loaded[kind] = cache[(kind, path)][1]
        if problems or None in loaded.values():
            raise ConfigError(*problems)
        return cls(lc.address, settings, loaded.get("password_file"), loaded.get("acl_file"),
                   authenticator)

    def authenticate(self, client, connect) -> None:
        """Decide on a CONNECT; calls ``client.auth_done(code, why, username, acl_view)`` on the
        loop thread: at once, or later when a password check comes back."""
        if self.identity_as_username:
            identity = getattr(client.transport, "identity", None)
            if not identity:
                client.auth_done(NOT_AUTHORIZED, "its certificate has no common name to use as "
                                                 "the user name", None, None)
                return
            self._accept(client, identity)
            return
        username = connect.username
        if username is None or self.passwords is None:
            if not self.allow_anonymous:
                client.auth_done(NOT_AUTHORIZED, f"anonymous clients are not allowed on "
                                                 f"listener {self.name}", None, None)
                return
            if username is not None:
                log.info("%s: user name %s not verified (no password_file on listener %s); "
                         "treated as anonymous", client.describe(), name_shown(username),
                         self.name)
            self._accept(client, None)
            return
        host = peer_host(client.peer)
        auth = self.authenticator
        entry = self.passwords.lookup(username)
        if connect.password is None:
            if auth.throttled(host, username) is not None:
                self._blocked(client, username, host)
                return
            auth.record_failure(host, username)
            client.auth_done(BAD_CREDENTIALS, "no password given", username, None)
            return

        passwords = self.passwords

        def done(result: str) -> None:
            if result == A.OK:
                current = getattr(client.transport, "policy", None) or self
                if current.passwords is not passwords:
                    self._checked_before_reload(client, connect, current, entry, host)
                    return
                self._accept(client, username)
            elif result == A.BLOCKED:
                self._blocked(client, username, host)
            elif result == A.BUSY:
                client.auth_done(UNAVAILABLE, auth.busy(host) or "too many password checks "
                                 "waiting", username, None)
            else:
                client.auth_done(BAD_CREDENTIALS, result, username, None)

        auth.verify(host, username, entry, connect.password, done,
                    None if entry is not None else self.passwords.dummy())

    def _checked_before_reload(self, client, connect, current: "ListenerPolicy", entry,
                               host: str) -> None:
        """A right password checked against a password file that a reload replaced while the
        check ran: what the file in force now says. The user still there with the same hash:
        accepted; gone: refused as an unknown user (CONNACK 4 / 0x86, a failed login, as
        at once after the reload); another hash: checked again, against it. A listener whose
        login rules changed otherwise (no password file now, the certificate's name):
        decided by them again."""
        username = connect.username
        if client.pending is None or client.closed:
            return                      # timed out or closed while the check ran
        if current.passwords is None or current.identity_as_username:
            current.authenticate(client, connect)
            return
        now = current.passwords.lookup(username)
        if now is None:
            self.authenticator.record_failure(host, username)
            client.auth_done(BAD_CREDENTIALS, f"{A.UNKNOWN} (removed from the password file by "
                                              f"a reload while its password was checked)",
                             username, None)
        elif now[0] == entry[0]:
            current._accept(client, username)
        else:
            log.info("%s: user %s: the password file was reloaded with another password for "
                     "it while its password was checked; checked again",
                     client.describe(), name_shown(username))
            current.authenticate(client, connect)

    # ----- SCRAM-SHA-256 ------------------------------------------------------------------

    def scram_refusal(self) -> str | None:
        """Why SCRAM-SHA-256 cannot be used on this listener, or None."""
        if self.identity_as_username:
            return (f"listener {self.name} takes the user name from the client certificate; "
                    f"SCRAM-SHA-256 is not offered there")
        if self.passwords is None:
            return f"SCRAM-SHA-256 needs a password_file on listener {self.name}"
        return None

    def scram_exchange(self) -> scram.Exchange:
        """A new exchange against this listener's password file (``scram_refusal`` is None)."""
        from edgebroker.security import scram
        passwords = self.passwords
        return scram.Exchange(passwords.scram_keys, self.authenticator.scram_secret,
                              decoy_iterations=passwords.scram_iterations())

    def scram_outcome(self, client, exchange: scram.Exchange,
                      failure: scram.Failure | None) -> tuple[int, str, bool]:
        """The decision on an exchange that ended (``failure`` None: the proof was right):
        (ACCEPTED, "", False), (BAD_CREDENTIALS, why, False) or (NOT_AUTHORIZED, why,
        throttled), throttled True when the user name or address is throttled after failed
        logins (logged apart: ``auth_done``). A wrong proof counts as a failed login for the
        throttles; a client key that succeeded before is accepted whatever they say, as a
        known password is."""
        if failure is not None and not failure.credentials:
            return NOT_AUTHORIZED, str(failure), False
        username = exchange.username
        host = peer_host(client.peer)
        auth = self.authenticator
        from edgebroker.security import scram
        if failure is None:
            # This is the listener's policy now: a reload during the exchange may have removed
            # the user or changed its keys (a new salt: the proof cannot be checked again).
            found = self.passwords.scram.get(username) if self.passwords is not None else None
            if found is None or found[1] != exchange.keys:
                why = "unknown user" if found is None else "its SCRAM keys changed"
                failure = scram.Failure(f"{why} (the password file was reloaded during the "
                                        f"exchange)", credentials=True)
        stored = scram.format_keys(exchange.keys)
        if failure is None and auth.known(username, stored, exchange.client_key):
            auth.succeeded(host, username)
            return ACCEPTED, "", False
        blocked = auth.throttled(host, username)
        if blocked is not None:
            return NOT_AUTHORIZED, f"{blocked}; not checked", True
        if failure is not None:
            auth.record_failure(host, username)
            return BAD_CREDENTIALS, str(failure), False
        auth.remember(username, stored, exchange.client_key)
        auth.succeeded(host, username)
        return ACCEPTED, "", False

    def view(self, client, username: str | None):
        """The client's AclView (None without an ACL file)."""
        if self.acl is None:
            return None
        return self.acl.view(client.client_id, username, client.listener_address)

    def _blocked(self, client, username, host: str) -> None:
        why = self.authenticator.throttled(host, username) or "failed logins"
        client.auth_done(NOT_AUTHORIZED, f"{why}; not checked", username, None, throttled=True)

    def _accept(self, client, username: str | None) -> None:
        # The listener's policy now: a reload while the password check ran may have replaced
        # this one, and its ACL with it.
        policy = getattr(client.transport, "policy", None) or self
        client.auth_done(ACCEPTED, "", username, policy.view(client, username))
