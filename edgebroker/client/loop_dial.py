"""Making the event loop's connection (client/loop.py's ``EventLoop`` takes these methods):
a Dialer's steps (address.py, handshake.py: the TCP connect, then TLS and the WebSocket
upgrade) run in the loop's selector, one wait at a time, within ``connect_timeout``; any
other transport factory is called and may wait. A failure is a ConnectFailed event, then the
policy applies; but an address no attempt can reach (AddressError: a host name that cannot
be looked up) ends the loop at once."""

from __future__ import annotations

import selectors

from edgebroker.client.address import AddressError
from edgebroker.client.events import ConnectFailed
from edgebroker.client.handshake import WRITE

DIAL = "dial"              # the selector key's data of the socket being connected


def why(exc: OSError) -> str:
    """An OSError's text without Python's "[Errno N] " (its message names the address)."""
    return exc.strerror or str(exc)


class LoopDialing:
    """The connecting part of ``EventLoop`` (a mixin over its state)."""

    def _open(self, now: float) -> None:
        """Start a connection: a Dialer's steps run in the selector (no wait here but a host
        name's resolution); another transport_factory is called (and may wait)."""
        steps = getattr(self._factory, "steps", None)
        if steps is not None:
            self._dialing = steps()
            self._dial_until = now + self.connect_timeout
            self._dial_step()
            return
        try:
            transport = self._factory(self.connect_timeout)
        except OSError as exc:
            self._dial_failed(exc)
            return
        except AddressError as exc:
            self._dial_impossible(exc)
            return
        self._attach(transport)

    def _dial_step(self, error: TimeoutError | None = None) -> None:
        """Run the dial to its next wait (its socket is then watched), or to its end."""
        steps = self._dialing
        self._watch_dial(None)
        try:
            if error is not None:
                want, fd = steps.throw(error)
            else:
                want, fd = steps.send(None)
        except StopIteration as done:
            self._dialing = None
            self._attach(done.value)
            return
        except OSError as exc:
            self._dialing = None
            self._dial_failed(exc)
            return
        except AddressError as exc:
            self._dialing = None
            self._dial_impossible(exc)
            return
        self._watch_dial(fd, selectors.EVENT_WRITE if want == WRITE else selectors.EVENT_READ)

    def _watch_dial(self, fd: int | None, mask: int = 0) -> None:
        if self._dial_fd is not None:
            self._selector.unregister(self._dial_fd)
            self._dial_fd = None
        if fd is not None:
            self._selector.register(fd, mask, DIAL)
            self._dial_fd = fd

    def _stop_dialing(self) -> None:
        if self._dialing is not None:
            self._watch_dial(None)
            self._dialing.close()       # the steps close their socket
            self._dialing = None

    def _dial_failed(self, exc: OSError) -> None:
        self._events.append(ConnectFailed(None, why(exc)))
        self._after_loss(self._clock())

    def _dial_impossible(self, exc: AddressError) -> None:
        """An address no attempt can reach (a host name that cannot be looked up): its
        ConnectFailed, and the loop ends whatever the policy (the asyncio adapter's connect
        raises ConnectError alike)."""
        self._events.append(ConnectFailed(None, str(exc)))
        self._finished = True
