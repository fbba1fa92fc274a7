"""The client's TLS byte stream: MQTT over TLS (mqtts://), or the stream under wss://.

``open_tls(host, port, timeout=..., context=...)`` connects, does the TLS handshake with the
timeout (certificate checks included) on the non-blocking socket and returns a
``TLSTransport``, which has the interface of the plain TCP transport (client/transport.py).
The handshake itself is ``tls_handshake``, a client/handshake.py generator, which the
asyncio adapter runs on its loop. The transport:

- ``fileno()``: the socket, for the event loop's selector.
- ``send(data) -> int``: the number of bytes taken (a prefix of ``data``); BlockingIOError when
  none can be taken now (wait for write readiness, then offer the same bytes again).
- ``recv(n) -> bytes``: decrypted bytes, b"" at the end of the stream (the server's
  close_notify, or the TCP end without one); BlockingIOError when none are there now.
- ``pending() -> bool``: OpenSSL holds decrypted bytes that the socket will not signal again
  (the loop must call ``recv`` again before it waits).
- ``close()``: sends a close_notify when the socket takes it at once, then closes.

OpenSSL's rule for a write that could not finish: it must be offered again with the same bytes
at its start. ``send`` writes at most ``CHUNK`` bytes per call and, after a write that would
block, offers the same number of bytes again; a caller that keeps its unsent bytes (as the
event loop does) meets the rule without knowing it.

``tls_context(cafile=..., certfile=..., keyfile=..., verify=...)`` builds the client context:
the system's CAs, or the CA file given; a client certificate and key; ``verify=False`` (the CLI's
``--insecure``) checks neither the chain nor the name. ``server_name`` overrides the name sent
(SNI) and checked, which is the host by default.

The ``ssl`` module is imported when a TLS connection is made (OpenSSL costs about 5 MiB of
memory that a plain client does without).
"""

from __future__ import annotations

import os
import socket
import stat

from edgebroker.client.handshake import READ, WRITE, drive
from edgebroker.client.transport import connect_socket

# Bytes offered to SSL_write per send: records of 16 KiB, a few per system call.
CHUNK = 256 * 1024


def _ssl():
    import ssl
    return ssl


class TLSError(ConnectionError):
    """A TLS connection that could not be made: what failed and the hint for it."""


class EncryptedKey(ValueError):
    """A private key that needs a pass phrase (``load_cert_chain``): edgebroker takes none."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"{path}: the private key is encrypted (edgebroker takes no pass "
                         f"phrase): decrypt it with openssl pkey -in {path} -out PLAIN.key")


class _PassPhraseAsked(Exception):
    pass


def _no_pass_phrase():
    raise _PassPhraseAsked


def load_cert_chain(context, certfile: str, keyfile: str | None = None) -> None:
    """``context.load_cert_chain`` that never asks for a pass phrase: without a password
    callback, OpenSSL asks on the terminal for an encrypted key (a broker waits there at its
    start and at each SIGHUP; without a terminal the error is "Invalid argument"). An
    encrypted key raises EncryptedKey naming the file that holds it; other errors as
    load_cert_chain's (OSError, ssl.SSLError). The broker's listeners and bridges use it too."""
    try:
        context.load_cert_chain(certfile, keyfile or None, password=_no_pass_phrase)
    except _PassPhraseAsked:
        raise EncryptedKey(keyfile or certfile) from None


def not_regular(path: str) -> bool:
    """True when ``path`` exists and is not a regular file (a FIFO, a device, a directory):
    OpenSSL's open of a FIFO waits for a writer (a broker's loop thread on SIGHUP, `config
    check`, a client), a device may never end. A missing or unreadable path: False, the open
    itself then says why. The bridges and the uploader check their files with it too."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


_HINTS = {
    "CERTIFICATE_VERIFY_FAILED": "the server certificate is not signed by a trusted CA "
                                 "(give the CA file that signed it: --cafile)",
    "TLSV1_ALERT_UNKNOWN_CA": "the server does not trust our client certificate's CA",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the server rejected our client certificate (the server's "
                                   "log says why)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the server rejected our client certificate as expired or "
                                       "not valid yet (check its dates, and the server's clock)",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires a client certificate "
                                         "(--cert and --key)",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "the server refused the handshake (a client certificate "
                                     "required? a TLS version or cipher in common?)",
    "WRONG_VERSION_NUMBER": "the server does not speak TLS on this port (mqtt:// ?)",
}


def tls_context(cafile: str | None = None, certfile: str | None = None,
                keyfile: str | None = None, verify: bool = True):
    """The client SSLContext; TLSError naming the file on a file that cannot be used."""
    ssl = _ssl()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
    for what, path in (("CA file", cafile if verify else None), ("certificate file", certfile),
                       ("key file", keyfile)):
        if path and not_regular(path):
            raise TLSError(f"{what} {path}: not a regular file")
    if verify:
        try:
            if cafile:
                ctx.load_verify_locations(cafile=cafile)
            else:
                ctx.load_default_certs()
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(f"CA file {cafile}: {_why(exc)}") from None
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if certfile or keyfile:
        if not certfile:
            raise TLSError(f"key file {keyfile} given without a certificate file")
        try:
            load_cert_chain(ctx, certfile, keyfile)
        except EncryptedKey as exc:
            raise TLSError(f"client certificate {certfile}: key {exc}") from None
        except (OSError, ssl.SSLError) as exc:
            key = keyfile or "in the same file"
            raise TLSError(f"client certificate {certfile} (key {key}): {_why(exc)}") from None
    return ctx


# OpenSSL's results of the server certificate's check (X509_V_ERR_*) with a hint of their own:
# the CA file's hint (_HINTS) is only for a chain that leads to no trusted CA (2, 18-21).
_VERIFY_HINTS = {
    9: "the server certificate is not valid yet: check its dates and this machine's clock",
    10: "the server certificate has expired: check its dates (not renewed on the server?) "
        "and this machine's clock",
    62: "connect by a host name the certificate holds (its subjectAltName)",
    64: "connect by a host name or address the certificate holds (its subjectAltName)",
}
_UNKNOWN_ISSUER = frozenset((2, 18, 19, 20, 21))


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    text = getattr(exc, "verify_message", None) or getattr(exc, "strerror", None) or str(exc)
    hint = _HINTS.get(reason)
    if reason == "CERTIFICATE_VERIFY_FAILED":
        code = getattr(exc, "verify_code", None)
        if code is not None and code not in _UNKNOWN_ISSUER:
            hint = _VERIFY_HINTS.get(code)
    if hint is not None:
        return f"{text} ({reason}: {hint})" if text != str(reason) else hint
    return f"{text} ({reason})" if reason and reason not in text else text


def open_tls(host: str, port: int, *, timeout: float, context=None,
             server_name: str | None = None, unix_path: str | None = None) -> "TLSTransport":
    """Connect and handshake within ``timeout`` seconds; the non-blocking transport."""
    sock, _ = connect_socket(host, port, timeout, unix_path)
    return drive(tls_handshake(sock, host, port, context, server_name), sock.fileno(), timeout)


def tls_handshake(sock, host: str, port: int, context=None, server_name: str | None = None):
    """The handshake on the connected socket ``sock`` as a client/handshake.py generator
    (yields READ/WRITE, returns the TLSTransport); TLSError with the reason and its hint.
    The socket is closed when the handshake fails."""
    ssl = _ssl()
    context = context or tls_context()
    sock.setblocking(False)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    name = server_name or (host if context.check_hostname else None)
    where = f"TLS handshake with {host}:{port}"
    try:
        tls = context.wrap_socket(sock, server_hostname=name or host or None,
                                  do_handshake_on_connect=False)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                yield READ
            except ssl.SSLWantWriteError:
                yield WRITE
    except TimeoutError:              # thrown in by the driver
        sock.close()
        raise TLSError(f"{where}: no answer in time") from None
    except OSError as exc:
        sock.close()
        if isinstance(exc, ssl.SSLError) and not isinstance(
                exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            raise TLSError(f"{where}: {_why(exc)}") from None
        # closed (or reset) at our ClientHello: what a plain MQTT port does
        raise TLSError(f"{where}: the server closed the connection "
                       f"({exc.strerror or exc}); is it a TLS port? (mqtt:// ?)") from None
    except BaseException:
        sock.close()
        raise
    return TLSTransport(tls)


class TLSTransport:
    """A TLS connection after its handshake, non-blocking (module docstring)."""

    __slots__ = ("sock", "_retry", "_want", "_ended", "_failed")

    def __init__(self, sock):
        ssl = _ssl()
        self.sock = sock
        self._retry = 0         # the length of a write OpenSSL must be offered again
        self._want = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
        self._ended = (ssl.SSLZeroReturnError, ssl.SSLEOFError)
        self._failed = ssl.SSLError

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, data) -> int:
        n = self._retry or CHUNK
        chunk = data[:n]
        try:
            sent = self.sock.send(chunk)
        except self._want:
            self._retry = len(chunk)
            raise BlockingIOError("TLS write would block") from None
        except self._failed as exc:
            raise TLSError(f"TLS connection failed: {self._alert(exc)}") from None
        self._retry = 0
        return sent

    def _alert(self, exc) -> str:
        """Why a write failed: the server's alert when one came before the end (TLS 1.3
        refuses a client certificate after the handshake), else the write's error."""
        try:
            self.sock.recv(1)
        except self._failed as alert:
            if not isinstance(alert, self._ended):
                exc = alert
        except OSError:
            pass
        return _why(exc)

    def recv(self, n: int) -> bytes:
        try:
            return self.sock.recv(n)
        except self._want:
            raise BlockingIOError("TLS read would block") from None
        except self._ended:
            return b""
        except self._failed as exc:   # an alert: TLS 1.3 refuses a client certificate here
            raise TLSError(f"TLS connection failed: {_why(exc)}") from None

    def pending(self) -> bool:
        return self.sock.pending() > 0

    def close(self) -> None:
        sock = self.sock
        if sock.fileno() < 0:
            return
        try:
            sock.unwrap()       # writes the close_notify; does not wait for the server's
        except (OSError, ValueError):
            pass
        sock.close()
