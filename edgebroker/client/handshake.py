"""Connection set-up written once for both event loops: the TLS handshake (client/tls.py) and the
WebSocket upgrade (client/websocket.py) are generators over a non-blocking socket that yield
``READ`` or ``WRITE`` when they must wait, and return the transport when done. ``drive`` runs
one by blocking on the socket (the synchronous Dialer, client/address.py); ``drive_async``
runs one on an asyncio loop (``add_reader``/``add_writer``: no thread), as the asyncio
adapter's connect does. A wait past the deadline is thrown into the generator as a
TimeoutError, so the step closes its socket and words its own error.

``connect_steps`` is the TCP (or Unix) connect as such a generator (``connect_ex`` on a
non-blocking socket, then a wait for it to be writable), for the synchronous event loop,
which drives it and the handshakes after it in its own selector (address.py's
``Dialer.steps``): its steps yield ``(READ or WRITE, fd)``, as the socket may change from one
address of a name to the next; ``on_fd`` turns a handshake generator into such steps.

Both raise address.py's AddressError (not an OSError) for a host name that cannot be looked
up at all (getaddrinfo's UnicodeError: an empty label, one too long), which no attempt mends.

``connect_async`` is the TCP (or Unix) connect on an asyncio loop (``sock_connect``): no thread
for a numeric address or a Unix path; a host name is resolved by the loop's ``getaddrinfo``
(a thread of the loop's default executor, as ``asyncio.open_connection`` resolves names).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import time

from edgebroker.errors import AddressError

READ = "read"
WRITE = "write"


def drive(steps, fd: int, timeout: float):
    """Run the generator ``steps`` to its end within ``timeout`` seconds, blocking on ``fd``;
    its return value."""
    deadline = time.monotonic() + timeout
    poller = select.poll()
    try:
        want = next(steps)
        while True:
            poller.register(fd, select.POLLOUT if want == WRITE else select.POLLIN)
            left = deadline - time.monotonic()
            if left > 0 and poller.poll(left * 1000):
                want = steps.send(None)
            else:
                want = steps.throw(TimeoutError("no answer in time"))
    except StopIteration as done:
        return done.value


async def drive_async(steps, fd: int, timeout: float):
    """``drive`` on the running asyncio loop, without blocking it."""
    import asyncio
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        want = next(steps)
        while True:
            ready = loop.create_future()
            watch, unwatch = ((loop.add_writer, loop.remove_writer) if want == WRITE
                              else (loop.add_reader, loop.remove_reader))
            watch(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                want = steps.throw(TimeoutError("no answer in time"))
                continue
            finally:
                unwatch(fd)
            want = steps.send(None)
    except StopIteration as done:
        return done.value
    except asyncio.CancelledError:
        steps.close()           # given up half-way: the step closes its socket
        raise


def connect_steps(host: str, port: int, unix_path: str | None = None):
    """Connect a non-blocking stream socket without waiting in a call: yields ``(WRITE,
    fd)`` while a connect is in progress (the driver steps it again when ``fd`` is writable,
    or throws TimeoutError in at its deadline); returns (socket, name). OSError naming the
    address (as transport.py's ``connect_socket``) when no address takes the connection.
    A host name is resolved by getaddrinfo, which waits (a numeric address does not)."""
    where = _where(host, port, unix_path)
    try:
        targets = _targets(unix_path or socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    except OSError as exc:
        raise _failed(where, exc) from None
    except UnicodeError as exc:
        raise not_a_host_name(where, exc) from None
    error: OSError = OSError(f"connect to {where}: no address")
    for family, address in targets:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code == errno.EINPROGRESS:
                yield WRITE, sock.fileno()
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except TimeoutError:              # thrown in by the driver
            sock.close()
            raise TimeoutError(f"connect to {where}: timed out") from None
        except BaseException:
            sock.close()
            raise
        if code == 0:
            return sock, where
        sock.close()
        error = OSError(code, f"connect to {where}: {os.strerror(code)}")
    raise error


def _where(host: str, port: int, unix_path: str | None) -> str:
    return f"unix:{unix_path}" if unix_path else f"{host}:{port}"


def _targets(unix_path_or_infos) -> list:
    """(family, address) pairs to try: a Unix path's, or getaddrinfo's."""
    if isinstance(unix_path_or_infos, str):
        return [(socket.AF_UNIX, unix_path_or_infos)]
    return [(family, address) for family, _, _, _, address in unix_path_or_infos]


def _failed(where: str, exc: OSError) -> OSError:
    return OSError(exc.errno, f"connect to {where}: {exc.strerror or exc}")


def not_a_host_name(where: str, exc: UnicodeError) -> AddressError:
    """getaddrinfo's UnicodeError for a name IDNA cannot encode (an empty label, one over 63
    characters): no attempt can succeed, so not an OSError (which the loops try again)."""
    return AddressError(f"connect to {where}: not a host name that can be looked up "
                        f"({exc})")


def on_fd(steps, fd: int):
    """The READ/WRITE generator ``steps`` over the descriptor ``fd``, as ``(want, fd)``
    steps (a TimeoutError thrown in goes to ``steps``); its return value."""
    try:
        want = next(steps)
        while True:
            try:
                yield want, fd
            except TimeoutError as exc:
                want = steps.throw(exc)
            else:
                want = steps.send(None)
    except StopIteration as done:
        return done.value
    finally:
        steps.close()           # given up half-way: the step closes its socket


async def connect_async(host: str, port: int, timeout: float,
                        unix_path: str | None = None) -> tuple[socket.socket, str]:
    """A non-blocking stream socket connected within ``timeout`` seconds, and its name; OSError
    naming the address (as client/transport.py's ``connect_socket``) when it cannot be."""
    import asyncio
    loop = asyncio.get_running_loop()
    where = _where(host, port, unix_path)
    try:
        targets = _targets(unix_path or await asyncio.wait_for(_resolve(loop, host, port),
                                                               timeout))
    except asyncio.TimeoutError:
        raise TimeoutError(f"connect to {where}: name not resolved in {timeout:g} s") \
            from None
    except OSError as exc:
        raise _failed(where, exc) from None
    except UnicodeError as exc:
        raise not_a_host_name(where, exc) from None
    error: OSError = OSError(f"connect to {where}: no address")
    for family, address in targets:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
            return sock, where
        except asyncio.TimeoutError:
            sock.close()
            error = TimeoutError(f"connect to {where}: no answer within {timeout:g} s")
        except OSError as exc:
            sock.close()
            error = _failed(where, exc)
    raise error


async def _resolve(loop, host: str, port: int) -> list:
    """getaddrinfo: at once for a numeric address; through the loop's resolver (a thread of
    its default executor) for a name."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
