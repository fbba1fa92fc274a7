"""A bridge's byte stream to the remote: one non-blocking socket of the core loop (no thread).

``Link`` connects without blocking (``connect_ex``, then write readiness), runs TLS in memory
(``ssl.SSLObject`` over two ``MemoryBIO``s, so the handshake and records never block the
loop), and hands its owner what arrives (``on_data``), that it is up (``on_up``) and that it
closed (``on_closed(reason)``, once). Output is sent at once as far as the socket takes it;
the rest waits for write readiness; when the owner set ``drained_below``, it is told once
(``on_drained``) that the unsent output fell below that many bytes. Bytes that waited in
its buffer and leave are a sign of life (``on_moved``): a slow link, not a dead one, so a
PINGREQ queued behind them is not late (as the client loop does: docs/client.md). A host
name is resolved on a short-lived thread (DNS may block); an address in digits needs none.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import ssl
import struct
import threading

log = logging.getLogger("edgebroker.bridge")

READ_SIZE = 256 * 1024
# How a remote that does not speak TLS on the port ends our ClientHello: a reset (Mosquitto),
# an end of the stream, or an answer that is no TLS record.
NOT_TLS = ("receive failed", "send failed", "the remote closed the connection",
           "TLS handshake failed: WRONG_VERSION_NUMBER")
NOT_TLS_HINT = (" (during the TLS handshake: does the remote speak TLS on this port, or did "
                "it turn the connection away, at its connection limit say?)")
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


def numeric_address(host: str, port: int):
    """(family, sockaddr) when ``host`` is an IP address in digits, else None."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family, (host, port)
    return None


# SO_LINGER on, 0 s: close() resets the connection and drops the send queue.
LINGER_RESET = struct.pack("ii", 1, 0)


class Resolver:
    """Resolve a host name on a thread; ``result`` is set, then ``wake()`` is called."""

    def __init__(self, host: str, port: int, wake):
        self.result = None      # [(family, sockaddr), ...] in getaddrinfo's order, or an error
        self.done = False
        thread = threading.Thread(target=self._run, args=(host, port, wake),
                                  name="bridge-resolve", daemon=True)
        thread.start()

    def _run(self, host, port, wake) -> None:
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addresses = []
            for family, _, _, _, sockaddr in info:
                if (family, sockaddr) not in addresses:
                    addresses.append((family, sockaddr))
            self.result = addresses
        except OSError as exc:
            self.result = f"cannot resolve {host!r}: {exc}"
        self.done = True
        wake()


def client_context(cafile: str, certfile: str, keyfile: str, verify: bool) -> ssl.SSLContext:
    """The TLS context of a bridge's link (OSError or ssl.SSLError for a bad file,
    client.tls.EncryptedKey for a key that needs a pass phrase)."""
    from edgebroker.client.tls import load_cert_chain
    context = ssl.create_default_context(cafile=cafile or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile:
        load_cert_chain(context, certfile, keyfile)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class Link:
    def __init__(self, selector, owner, family, sockaddr, tls_context=None, server_name=None):
        self.selector = selector
        self.owner = owner
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.out = bytearray()
        self.connected = False   # TCP
        self.up = False          # TCP and TLS: MQTT bytes may flow
        self.closed = False
        self.finishing = False   # closing gracefully (finish): input is read and dropped
        self.paused: set[str] = set()
        self.events = WRITE
        self.bytes_in = 0
        self.bytes_out = 0
        self.unacknowledged_at_close = 0     # ``unacknowledged`` as the socket closed
        self.drained_below = 0   # > 0: call owner.on_drained() once out is shorter than this
        self.tls = None
        if tls_context is not None:
            self._in_bio, self._out_bio = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.tls = tls_context.wrap_bio(self._in_bio, self._out_bio,
                                            server_hostname=server_name)
        err = self.sock.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self.sock.close()
            self.closed = True
            raise OSError(err, f"connect to {sockaddr}: {errno.errorcode.get(err, err)}")
        selector.register(self.sock, WRITE, self.on_event)

    # ----- the loop's side --------------------------------------------------------------

    def on_event(self, mask: int) -> None:
        if self.closed:
            return
        if not self.connected and not self._connected():
            return
        if mask & READ and not self.closed:
            self._read()
        if mask & WRITE and not self.closed:
            self._flush()

    def _connected(self) -> bool:
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.close(f"connect failed: {errno.errorcode.get(err, err)} ({err})")
            return False
        self.connected = True
        if self.tls is None:
            self._now_up()
        else:
            self._handshake()
        self._watch()
        return not self.closed

    def _handshake(self) -> None:
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            self._push_tls()
            # A failed verification says why (the wrong CA, the wrong host name, expired).
            why = getattr(exc, "verify_message", None)
            self.close(f"TLS handshake failed: {exc.reason or exc}" + (f": {why}" if why else ""))
            return
        else:
            self._now_up()
        self._push_tls()

    def _now_up(self) -> None:
        self.up = True
        self.owner.on_up()

    def _read(self) -> None:
        try:
            data = self.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close(f"receive failed: {exc.strerror or exc}")
            return
        if not data:
            self.close("the remote closed the connection")
            return
        self.bytes_in += len(data)
        if self.finishing:
            return      # after our DISCONNECT: read only to see the remote close its end
        if self.tls is not None:
            data = self._unwrap(data)
            if not data or self.closed:
                return
        self.owner.on_data(data)

    def _unwrap(self, data: bytes) -> bytes:
        self._in_bio.write(data)
        if not self.up:
            self._handshake()
            if not self.up:
                return b""
        parts = []
        try:
            while True:
                chunk = self.tls.read(READ_SIZE)
                if not chunk:
                    self.close("the remote closed the TLS session")
                    break
                parts.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            self.close(f"TLS error: {exc.reason or exc}")
        self._push_tls()
        return b"".join(parts)

    def _push_tls(self) -> None:
        pending = self._out_bio.read()
        if pending:
            waited = bool(self.out)
            self.out += pending
            self._flush(waited)

    # ----- the owner's side -------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.closed or not data:
            return
        if self.tls is not None:
            try:
                self.tls.write(data)
            except ssl.SSLError as exc:
                self.close(f"TLS error: {exc.reason or exc}")
                return
            data = self._out_bio.read()
        waited = bool(self.out)
        self.out += data
        self._flush(waited)

    @property
    def out_bytes(self) -> int:
        return len(self.out)

    def unacknowledged(self) -> int:
        """Bytes the socket took that the remote has not acknowledged yet (the kernel's send
        queue: TIOCOUTQ on Linux, which may count a FIN sent as one more; 0 where it cannot
        be asked). Lost with the connection if it ends now."""
        import fcntl
        import termios
        try:
            queued = fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
        except (OSError, AttributeError, ValueError):
            return 0
        return max(0, struct.unpack("i", queued)[0])

    def _flush(self, waited: bool = True) -> None:
        """Send what the socket takes. ``waited``: the buffer held bytes before this call
        (on write readiness it does): their leaving tells the owner the link moves; bytes
        the socket takes at once do not (its kernel buffer takes them from a silent peer
        too)."""
        if self.connected:
            out = self.out
            moved = False
            start = self.bytes_out
            while out:
                try:
                    sent = self.sock.send(out)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    self.close(f"send failed: {exc.strerror or exc}")
                    return
                self.bytes_out += sent
                del out[:sent]
                moved = moved or sent > 0
            if moved and waited:
                self.owner.on_moved(start)
            if self.finishing and not out:
                self._end_writing()
                return
            if self.drained_below and len(out) < self.drained_below:
                self.drained_below = 0
                self.owner.on_drained()
        self._watch()

    def _watch(self) -> None:
        if self.closed:
            return
        if not self.connected:
            want = WRITE
        else:
            reading = self.finishing or not (self.paused and self.up)
            want = (READ if reading else 0) | (WRITE if self.out else 0)
        if want == self.events:
            return
        if not want:        # paused with nothing to send: not watched at all
            self.selector.unregister(self.sock)
        elif not self.events:
            self.selector.register(self.sock, want, self.on_event)
        else:
            self.selector.modify(self.sock, want, self.on_event)
        self.events = want

    def pause_reading(self, reason: str) -> None:
        self.paused.add(reason)
        self._watch()

    def resume_reading(self, reason: str) -> None:
        self.paused.discard(reason)
        self._watch()

    def finish(self) -> None:
        """Close gracefully: send what waits, then end our side of the TCP connection, and
        read (dropping it) what still comes until the remote closes its side; the owner is
        told ``on_closed`` then. (Closing a socket with input unread resets the connection,
        and a reset may destroy what was sent last before the peer read it.)"""
        self.finishing = True
        self.drained_below = 0
        if not self.out:
            self._end_writing()
        else:
            self._watch()

    def _end_writing(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.close(f"shutdown failed: {exc.strerror or exc}")
            return
        self._watch()

    def reset(self, reason: str) -> None:
        """Close at once, discarding what the kernel still holds to send (a plain close would
        leave it to go out after the process is gone, past the checkpoint that counts it as
        not sent: the next start would send it again)."""
        if not self.closed:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
            except OSError:
                pass
        self.close(reason)

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.tls is not None and self.connected and not self.up \
                and reason.startswith(NOT_TLS):
            reason += NOT_TLS_HINT
        self.up = False
        self.unacknowledged_at_close = self.unacknowledged()
        if self.events:
            try:
                self.selector.unregister(self.sock)
            except (KeyError, ValueError):
                pass
        self.sock.close()
        self.owner.on_closed(reason)
