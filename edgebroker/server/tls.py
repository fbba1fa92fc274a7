"""The TLS byte stream inside the selector loop (stdlib ``ssl``, never blocking).

``TLSTransport`` overrides the plain stream's reading and writing (server/transport.py);
either framing (raw MQTT or WebSocket, server/framing.py) goes on top of it.

A TLS connection goes through three states:

1. PEEK: the raw TCP socket is watched until its first byte arrives. A TLS
   ClientHello starts with 0x16; anything else (typically 0x10, a plain MQTT
   CONNECT, or an HTTP request: a ws:// client on a wss:// listener) is refused
   with a log line saying what happened, instead of an opaque TLS error
   (``sniff.not_tls``, given the first bytes that have arrived, peeked).
2. HANDSHAKE: the socket is wrapped (``do_handshake_on_connect=False``) and
   ``do_handshake`` is called each time the socket is ready, registering for
   read or write readiness as OpenSSL asks (``SSLWantReadError`` /
   ``SSLWantWriteError``). A handshake not finished within the listener's
   ``handshake_timeout``, or ``connect_timeout`` if that is shorter, is closed by
   ``HandshakeTimers`` (the loop runs them before the clients' connect deadlines,
   so that a stalled handshake is counted and logged once, as a TLS failure); a
   stalled client costs one socket and one heap entry, never a blocked loop.
3. OPEN: reads and writes go through the ``SSLSocket``. Reads loop while
   ``pending()`` says OpenSSL holds decrypted bytes the kernel socket will not
   signal again. ``sendmsg`` does not exist on an ``SSLSocket``: queued buffers
   are joined into one chunk of up to ``CHUNK`` bytes per ``send``; after
   ``SSLWantWriteError`` the same chunk is offered again, as OpenSSL requires.
   A read may need write readiness and a write may need read readiness
   (TLS 1.3 key updates, renegotiation): both are tracked.

The listener's ``TLSServer`` holds its ``SSLContext``. On SIGHUP the listener
gets a new one built from the certificate files as they are then, for new
connections; open connections keep the context they started with.
"""

from __future__ import annotations

import logging
import os
import re
import selectors
import socket
import time

from edgebroker.config import ListenerConfig
from edgebroker.errors import ConfigError
from edgebroker.files import config_file_mode
from edgebroker.server.sniff import SNIFF_BYTES, not_tls, sniff
from edgebroker.server.tls_dates import utc
from edgebroker.server.transport import DEFAULT_MAX_PENDING, NO_OUTPUT, Transport

log = logging.getLogger("edgebroker.server")

CHUNK = 256 * 1024
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE

# GONE: the peer closed or the connection failed; no close_notify is sent to it.
PEEK, HANDSHAKE, OPEN, GONE = "peek", "handshake", "open", "gone"

# The ssl module, imported by make_context (load_ssl): it loads OpenSSL, about 5 MiB of memory
# that a broker without TLS listeners does without (docs/deploy.md, idle RSS). Every TLS
# listener, and so every TLSTransport, gets its context from make_context first.
ssl = None


def load_ssl():
    global ssl
    if ssl is None:
        import ssl as module
        ssl = module
    return ssl

# OpenSSL reasons worth a plain-language hint in the log.
_HINTS = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client sent no certificate "
                                         "(require_certificate = true)",
    "CERTIFICATE_VERIFY_FAILED": "the client certificate is not signed by the listener's cafile",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust the server certificate "
                              "(check the CA file the client uses)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client rejected the server certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the client rejected the server certificate as expired or "
                                       "not valid yet (check the certfile's dates, and the "
                                       "client's clock)",
    "UNSUPPORTED_PROTOCOL": "the client's TLS version is below the listener's tls_version",
    "TLSV1_ALERT_PROTOCOL_VERSION": "the client's TLS version is below the listener's tls_version",
    "NO_SHARED_CIPHER": "no cipher in common with the client (see the listener's ciphers)",
    "WRONG_VERSION_NUMBER": "not a TLS client",
    "HTTP_REQUEST": "an HTTP request, not TLS",
}


def make_context(lc: ListenerConfig, name: str) -> ssl.SSLContext:
    """The server SSLContext of a TLS listener; ConfigError naming the key on a problem."""
    load_ssl()
    from edgebroker.client.tls import EncryptedKey, load_cert_chain
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = {"tlsv1.2": ssl.TLSVersion.TLSv1_2,
                           "tlsv1.3": ssl.TLSVersion.TLSv1_3}[lc.tls_version]
    # A client's end of the TCP stream without a close_notify (it shut down its writing side
    # after CONNECT, or closed its socket) reads as the end of its data, as a close_notify
    # does, and leaves the connection able to send: the answers already queued (a CONNACK)
    # still go out. Otherwise OpenSSL 3 fails the connection at that read.
    ctx.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
    for key in ("certfile", "keyfile", "cafile"):
        if getattr(lc, key):
            _check_regular(getattr(lc, key), f"{name}.{key}")
    try:
        load_cert_chain(ctx, lc.certfile, lc.keyfile)
    except EncryptedKey as exc:
        raise ConfigError(f"{name}.{'keyfile' if lc.keyfile else 'certfile'}: {exc}") from None
    except FileNotFoundError as exc:
        key = "keyfile" if lc.keyfile and exc.filename == lc.keyfile else "certfile"
        raise ConfigError(f"{name}.{key}: {exc.filename or lc.certfile}: file not found") from None
    except OSError as exc:
        if isinstance(exc, ssl.SSLError):
            raise ConfigError(_pair_problem(name, lc, exc)) from None
        raise ConfigError(f"{name}.{_unreadable(lc)}: cannot read: {exc.strerror}") from None
    if lc.cafile:
        try:
            ctx.load_verify_locations(cafile=lc.cafile)
        except FileNotFoundError:
            raise ConfigError(f"{name}.cafile: {lc.cafile}: file not found") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{name}.cafile: {lc.cafile}: not a usable CA certificate file "
                              f"({getattr(exc, 'reason', None) or exc})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if lc.require_certificate else ssl.CERT_OPTIONAL
    if lc.ciphers:
        try:
            ctx.set_ciphers(lc.ciphers)
        except ssl.SSLError:
            raise ConfigError(f"{name}.ciphers: no cipher matches {lc.ciphers!r}") from None
    return ctx


def _pair_problem(name: str, lc: ListenerConfig, exc: ssl.SSLError) -> str:
    """What is wrong with the certificate and key OpenSSL refused, naming the file at fault:
    its error for a file that is no PEM ("PEM lib") names neither."""
    key = lc.keyfile or lc.certfile
    mismatch = (f"{name}.certfile: {lc.certfile}: the private key in {key} does not match its "
                f"certificate ({exc.reason or exc})")
    if exc.reason == "KEY_VALUES_MISMATCH":
        return mismatch
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=lc.certfile)
    except (OSError, ssl.SSLError) as cert_exc:
        return (f"{name}.certfile: {lc.certfile}: no PEM certificate in it "
                f"({getattr(cert_exc, 'reason', None) or cert_exc})")
    try:    # a key of another type than the certificate's (an RSA key, an ECDSA certificate)
        with open(key, "rb") as fh:
            if re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----", fh.read(1 << 20)):
                return mismatch
    except OSError:
        pass
    if lc.keyfile:
        return (f"{name}.keyfile: {lc.keyfile}: no usable PEM private key in it "
                f"({exc.reason or exc})")
    return (f"{name}.certfile: {lc.certfile}: no usable PEM private key in it (no keyfile is "
            f"set: the key goes in the certfile then) ({exc.reason or exc})")


def _unreadable(lc: ListenerConfig) -> str:
    """``keyfile: PATH`` or ``certfile: PATH``, the one this process cannot open: OpenSSL's
    error (a key 0600 root's, the broker another user) carries no file name."""
    if lc.keyfile:
        try:
            with open(lc.keyfile, "rb"):
                pass
        except OSError:
            return f"keyfile: {lc.keyfile}"
    return f"certfile: {lc.certfile}"


def _check_regular(path: str, key: str) -> None:
    """Refuse anything but a regular file (as for password_file and acl_file): OpenSSL's open
    of a FIFO would block start, or the loop thread on SIGHUP, and a device could be endless."""
    config_file_mode(path, key)


class TLSServer:
    """One TLS listener's context and settings. On reload the listener gets a new
    TLSServer when its settings or files changed (else it keeps this one: server.app);
    open connections keep the one (and the context) they started with."""

    def __init__(self, lc: ListenerConfig, key: str):
        self.config = lc
        self.name = lc.address          # the bound address once the listener has one
        self.context = make_context(lc, key)
        self.handshake_timeout = lc.handshake_timeout


def _common_name(cert: dict | None) -> str | None:
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


# OpenSSL's results of a certificate check (X509_V_ERR_*) that have their own hint. Only a
# chain that does not lead to a CA of the cafile is the cafile's business; a certificate signed
# by it may still be out of its dates (renewal, or this machine's clock: a gateway without a
# real-time clock before its NTP sync refuses every device as "not yet valid").
_CERT_NOT_YET_VALID, _CERT_EXPIRED = 9, 10
_UNKNOWN_ISSUER = frozenset((2, 18, 19, 20, 21))  # no issuer in cafile, self-signed, its chain


def verify_hint(code: int | None, message: str | None) -> str:
    """The log's words for a client certificate that failed OpenSSL's check."""
    detail = f" ({message})" if message else ""
    if code in (_CERT_NOT_YET_VALID, _CERT_EXPIRED):
        what = "is not valid yet" if code == _CERT_NOT_YET_VALID else "has expired"
        return (f"the client certificate {what}{detail}: check its dates (openssl x509 -noout "
                f"-dates) and this machine's clock (now {utc(time.time())})")
    if code is None or code in _UNKNOWN_ISSUER:
        return f"{_HINTS['CERTIFICATE_VERIFY_FAILED']}{detail}"
    return f"the client certificate was refused{detail}"


class TLSTransport(Transport):
    __slots__ = ("server", "state", "identity", "read_wants_write", "write_wants_read",
                 "chunk_pending", "handshake_entry", "handshake_limit")

    def __init__(self, loop, sock: socket.socket, peer: str, server: TLSServer, listener=None,
                 max_pending: int = DEFAULT_MAX_PENDING):
        super().__init__(loop, sock, peer, listener, max_pending)
        self.server = server
        self.state = PEEK
        self.identity = None            # common name of a verified client certificate
        self.read_wants_write = False
        self.write_wants_read = False
        self.chunk_pending = False      # out[0] must be offered again as it is
        self.handshake_entry = None     # its entry in loop.handshakes until the handshake ends
        # The client's connect deadline, set just after this from the same clock, is never
        # before the handshake's: the shorter of the two timeouts ends a stalled handshake.
        connect_timeout = loop.broker.limits.connect_timeout
        if connect_timeout < server.handshake_timeout:
            self.handshake_limit = (connect_timeout, "connect_timeout")
        else:
            self.handshake_limit = (server.handshake_timeout, "handshake_timeout")
        loop.handshakes.add(self, loop.clock() + self.handshake_limit[0])

    # ----- events -----------------------------------------------------------------------

    def on_event(self, mask: int) -> None:
        if self.closed:
            return
        state = self.state
        if state is OPEN:
            if self.write_wants_read and mask & _READ:
                self.write_wants_read = False
                self.flush()
            if self.read_wants_write and mask & _WRITE and not self.closed:
                self.read_wants_write = False
                self.read()
            if mask & _READ and self.reading and not self.closing and not self.closed:
                self.read()
            if mask & _WRITE and self.out and not self.closed:
                self.flush()
        elif self.loop.handshake_budget <= 0:
            return      # the pass's handshake steps are taken: the next pass (server/loop.py)
        else:
            self.loop.handshake_budget -= 1
            if state is PEEK:
                self._peek()
            else:
                self._handshake()

    __call__ = on_event   # the selector key's callback (see Transport)

    def _peek(self) -> None:
        try:
            first = self.sock.recv(SNIFF_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc.strerror or str(exc))
            return
        if not first:       # (a TCP port check: not counted, as on a plain listener)
            log.debug("%s closed its connection to listener %s before the TLS handshake",
                      self.peer, self.server.name)
            self.lost("closed before the TLS handshake")
            return
        problem = not_tls(first, self.server.config.protocol == "websockets")
        if problem is not None:
            self._fail(problem)
            return
        loop = self.loop
        loop.selector.unregister(self.sock)
        self.events = 0
        try:
            self.sock = self.server.context.wrap_socket(
                self.sock, server_side=True, do_handshake_on_connect=False,
                suppress_ragged_eofs=False)  # a bare close raises: read() tells it apart
        except (OSError, ValueError) as exc:
            self._fail(f"cannot start TLS: {exc}")
            return
        self.state = HANDSHAKE
        self._handshake()

    def _handshake(self) -> None:
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._want(_READ)
            return
        except ssl.SSLWantWriteError:
            self._want(_READ | _WRITE)
            return
        except ssl.SSLError as exc:
            reason = getattr(exc, "reason", None) or ""
            if reason == "CERTIFICATE_VERIFY_FAILED":
                hint = verify_hint(getattr(exc, "verify_code", None),
                                   getattr(exc, "verify_message", None))
            else:
                hint = _HINTS.get(reason, reason or str(exc))
            self._fail(hint)
            return
        except OSError as exc:
            self._fail(exc.strerror or str(exc), quiet=True)
            return
        self.state = OPEN
        self.loop.handshakes.done(self)
        sock = self.sock
        try:
            self.identity = _common_name(sock.getpeercert())
        except ValueError:
            self.identity = None
        log.debug("TLS with %s on %s: %s, %s%s", self.peer, self.server.name, sock.version(),
                  (sock.cipher() or ("?",))[0],
                  f", client certificate {self.identity!r}" if self.identity else "")
        self._want((_READ if self.reading else 0) | (_WRITE if self.out else 0))
        # Application data may have arrived with the handshake's last flight and sit
        # decrypted inside OpenSSL, where the selector cannot see it.
        self.read()

    def _fail(self, why: str, quiet: bool = False) -> None:
        self.loop.broker.stats.tls_handshakes_failed += 1
        if quiet:
            log.debug("TLS handshake with %s on listener %s failed: %s", self.peer,
                      self.server.name, why)
        else:
            self.loop.broker.peer_log.log(
                log, logging.WARNING, "tls_handshake", self.peer,
                "TLS handshake with %s on listener %s failed: %s; closing", self.peer,
                self.server.name, why)
        self.lost(f"TLS handshake failed: {why}")

    def handshake_timed_out(self) -> None:
        if self.closing or self.closed:
            return          # already ended (and counted) for another reason
        broker = self.loop.broker
        broker.stats.tls_handshakes_failed += 1
        seconds, limit = self.handshake_limit
        broker.peer_log.log(log, logging.WARNING, "tls_handshake_timeout", self.peer,
                            "TLS handshake with %s on listener %s not finished within %g s "
                            "(%s); closing", self.peer, self.server.name, seconds, limit)
        self.lost("TLS handshake timeout")

    # ----- reading and writing ------------------------------------------------------------

    def read(self) -> None:
        if self.state is not OPEN:
            return
        loop = self.loop
        sock = self.sock
        while True:
            try:
                n = sock.recv_into(loop.buffer)
            except ssl.SSLWantReadError:
                return
            except ssl.SSLWantWriteError:
                self.read_wants_write = True
                self._want(self.events | _WRITE)
                return
            except ssl.SSLZeroReturnError:
                self.ended("closed by peer")  # with its close_notify: answered with ours
                return
            except ssl.SSLEOFError:
                # Its end of the TCP stream without a close_notify, with an OpenSSL that
                # cannot ignore it (see make_context): nothing more can be sent.
                self._gone("closed by peer")
                return
            except ssl.SSLError as exc:     # (records that are not TLS, a bad MAC: not a close)
                why, broker = f"TLS error: {exc.reason or exc}", loop.broker
                broker.stats.protocol_errors += 1
                broker.peer_log.log(log, logging.WARNING, "tls_error", self.peer, "%s on listener "
                                    "%s: broken TLS stream (%s); closing", self.client.describe(),
                                    self.server.name, why)
                return self._gone(why)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._gone(exc.strerror or str(exc))
                return
            if n == 0:  # the client's close_notify: answered with ours
                self.ended("closed by peer")
                return
            loop.broker.stats.bytes_received += n
            self.bytes_in += n
            if self.sniff is not None and not sniff(self, loop.view[:n]):
                return
            self.client.data_received(loop.view[:n])
            if self.closed or self.closing or not sock.pending():
                return

    def write_file(self, head: bytes, fd: int, position: int, length: int, offset: int) -> None:
        """TLS cannot use sendfile: read the payload from the log now, queue it as bytes."""
        self.write(head + os.pread(fd, length, position))

    def flush(self, early: bool = False) -> None:
        """Send what the socket takes, in chunks of up to ``CHUNK`` bytes (a chunk the TLS
        layer did not take whole is offered again, unchanged). ``early`` (``send_now``, in
        the middle of a pass): errors and a drained queue are left for the pass's flush."""
        if self.state is not OPEN:
            return
        self.loop.broker.before_send()   # QoS 2 exchange records first (core.exchanges)
        out = self.out
        sock = self.sock
        sent_total = 0
        error = None
        while out:
            if not self.chunk_pending and len(out) > 1 and len(out[0]) < CHUNK:
                size = k = 0
                n = len(out)
                while k < n and size < CHUNK:
                    size += len(out[k])
                    k += 1
                out[:k] = [b"".join(out[:k])]
            data = out[0]
            try:
                sent = sock.send(data)
            except ssl.SSLWantWriteError:
                self.chunk_pending = True
                break
            except ssl.SSLWantReadError:
                self.chunk_pending = True
                self.write_wants_read = True
                break
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                error = exc.strerror or getattr(exc, "reason", None) or str(exc)
                break
            self.chunk_pending = False
            sent_total += sent
            if sent < len(data):
                out[0] = memoryview(data)[sent:]
                break
            del out[0]
        if not out:
            self.out = NO_OUTPUT
        self.out_bytes -= sent_total
        self.bytes_out += sent_total
        self.loop.broker.stats.bytes_sent += sent_total
        if error is not None and not early:
            self._gone(error)
            return
        # Early, a failed send leaves its bytes queued and the socket watched for writing:
        # send_now tries no more, and the pass's flush reports the error.
        want = (_READ if self.reading or self.write_wants_read else 0)
        if out or self.read_wants_write:
            want |= _WRITE
        self._want(want)
        if early:
            return
        if out or self.paused:
            self.hold_input()
        if not out and self.want_drain and not self.closed:
            self.drained()

    def end_output(self) -> bool:
        """No half-close on TLS (its end is a close_notify, sent when the socket closes)."""
        return False

    def _gone(self, reason: str) -> None:
        """The peer closed the connection or it failed: nothing more is sent to it."""
        self.state = GONE
        self.lost(reason)

    def shutdown(self) -> None:
        """Close; an open connection gets a TLS close_notify first, whether the broker ends it
        (the client then sees a clean end, not a truncated stream) or answers the client's
        own close_notify. The broker does not wait for the client's in return (RFC 8446,
        6.1)."""
        if not self.closed and self.state is OPEN:
            self.state = GONE
            try:
                self.sock.unwrap()  # non-blocking: sends close_notify, then wants to read
            except (ssl.SSLError, OSError, ValueError):
                pass
        self.loop.handshakes.done(self)
        super().shutdown()

    def update_events(self) -> None:
        if self.state is OPEN:
            want = _READ if self.reading or self.write_wants_read else 0
            if self.out or self.read_wants_write:
                want |= _WRITE
            self._want(want)
