"""Making the asyncio adapter's connection (client/aio.py's ``AsyncClient`` takes these
methods): one dialing task at a time makes transports until one is up or the policy gives up
(the back-off of client/backoff.py between attempts): the first connection, and again after
a lost one or a refusal. An OSError is the network's: tried again as the policy says. Any
other error (address.py's AddressError for a host name that cannot be looked up, an error of
a transport maker given as ``address``) no attempt mends: the client gives up at once with
ConnectError naming the address and the error (``connect()`` raises it; a ConnectFailed
event says it to the iterator, open requests fail with ClientClosed, the iteration ends), as
the synchronous loop ends with a ConnectFailed (client/loop_dial.py). A dialing task never
ends on an error unseen."""

from __future__ import annotations

import asyncio

from edgebroker.client.address import AddressError, Dialer
from edgebroker.client.events import ConnectFailed, Disconnected
from edgebroker.client.transport import lost_reason
from edgebroker.errors import EdgebrokerError


class ConnectError(EdgebrokerError):
    """The connection could not be made (refused by the server, or the network)."""

    def __init__(self, message: str, reason_code: int | None = None):
        super().__init__(message)
        self.reason_code = reason_code


class AsyncDialing:
    """The connecting part of ``AsyncClient`` (a mixin over its state)."""

    def _start_dialing(self, coro) -> None:
        """Run ``coro`` as the dialing task, watched by ``_dialing_ended``."""
        self._dialing = task = self._loop.create_task(coro)
        task.add_done_callback(self._dialing_ended)

    def _dialing_ended(self, task: asyncio.Task) -> None:
        """An error the dialing task did not expect ends the client (module doc)."""
        if task.cancelled() or task.exception() is None or self._closed:
            return
        exc = task.exception()
        error = ConnectError(str(exc) if isinstance(exc, AddressError) else
                             f"connect with {self.dial!r}: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        self._post(ConnectFailed(None, str(error)))
        self._give_up(error)

    async def _dial_until_up(self) -> None:
        """Make transports until one is up (or the policy gives up)."""
        loop = self._loop
        while not self._closed:
            try:
                if isinstance(self.dial, Dialer):
                    transport = await self.dial.open_async()
                else:                   # the caller's own (blocking) transport maker
                    transport = await loop.run_in_executor(None, self.dial)
            except OSError as exc:
                if not await self._retry(ConnectError(str(exc))):
                    return
                continue
            if self._closed:
                transport.close()
                return
            self._attach(transport)
            return

    async def _retry(self, error: ConnectError) -> bool:
        """After a failed attempt: wait the back-off and say to go on, or give up (False)."""
        if self.backoff.again():
            await asyncio.sleep(self.backoff.delay())
            return not self._closed
        self._give_up(error)
        return False

    def _lost(self, reason: str, event=None) -> None:
        """The link ended (EOF, error, server DISCONNECT, ping timeout): reconnect or stop."""
        reason = lost_reason(self._transport, self.connection.state, reason)
        self._detach()
        if not self._closed:
            self._post(event or Disconnected(None, reason))
        if not self._closed and (self._dialing is None or self._dialing.done()):
            self._start_dialing(self._reconnect(reason))

    def _refused(self, event: ConnectFailed) -> None:
        """The connection's ConnectFailed: the server's refusal (a CONNACK with its reason
        code), or no CONNACK within ``connack_timeout``; the policy says whether to dial
        again."""
        self._detach()
        error = ConnectError(event.reason if event.reason_code is None else
                             f"connection refused: {event.reason}", event.reason_code)
        self._start_dialing(self._after_refusal(error))

    async def _reconnect(self, reason: str) -> None:
        if await self._retry(ConnectError(f"connection lost: {reason}")):
            await self._dial_until_up()

    async def _after_refusal(self, error: ConnectError) -> None:
        if await self._retry(error):
            await self._dial_until_up()
