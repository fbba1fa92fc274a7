"""The event loop's commands (client/loop.py's ``EventLoop`` takes these methods): pause and
resume the network, throttle the outgoing rate, disconnect, reconnect, shutdown (which
returns the state and writes the state file), close. Called on the loop's thread, or
through ``loop.commands`` (commands.py) from anywhere; either way they are carried out
between two passes of the loop."""

from __future__ import annotations

import selectors

from edgebroker.client import commands as K
from edgebroker.client.statefile import write_state

SHUTDOWN_FLUSH = 2.0       # seconds shutdown() spends sending what is buffered and DISCONNECT
# After DISCONNECT, what the server still sends is read (and dropped) until it closes, for at
# most LINGER seconds and LINGER_READS reads: a socket closed with bytes unread sends a reset
# (RST) instead of a FIN, and the server may then drop what it had not read yet, such as the
# acknowledgements sent just before the DISCONNECT (it would send those messages again).
LINGER = 1.0
LINGER_READS = 1000


class LoopCommands:
    """The commands' part of ``EventLoop`` (a mixin over its state)."""

    def pause(self) -> None:
        self._apply(K.PAUSE)

    def resume(self) -> None:
        self._apply(K.RESUME)

    def throttle(self, rate: float | None) -> None:
        self.commands.throttle(rate)     # checks the rate
        self._apply_asked()

    def disconnect(self) -> None:
        self._apply(K.DISCONNECT)

    def reconnect(self) -> None:
        self._apply(K.RECONNECT)

    def shutdown(self, state_file=None) -> dict:
        """Disconnect (DISCONNECT sent when connected), end the iteration and return the
        state (``Connection.save()``); written to ``state_file`` or the loop's own, if any."""
        self._apply(K.SHUTDOWN, state_file)
        return self.final_state

    def save_state(self, state_file=None) -> dict:
        """Write the state now (a checkpoint) and return it. On the loop's thread only
        (between events): from another thread, ``loop.commands.save_state()``."""
        doc = self.conn.save()
        path = state_file or self.state_file
        if path:
            write_state(path, doc)
        return doc

    def close(self) -> None:
        """Close the transport and the loop's own sockets (no DISCONNECT: see shutdown).
        The loop is over; closing again does nothing."""
        if self._finished and self._selector is None:
            return
        self._drop_transport()
        self._finished = True
        self._selector.close()
        self._selector = None
        self.commands.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _apply(self, *command) -> None:
        self._do(command, self._clock())

    def _apply_asked(self) -> None:
        now = self._clock()
        for command in self.commands.take():
            self._do(command, now)

    def _do(self, command: tuple, now: float) -> None:
        what = command[0]
        if what == K.PAUSE:
            self._paused = True
        elif what == K.RESUME:
            self._paused = False
        elif what == K.THROTTLE:
            self._rate = command[1]
            self._throttle = None if command[1] is None else K.Throttle(command[1], now)
        elif what == K.DISCONNECT:
            self._stopped = True
            self._close_politely(now)
        elif what == K.RECONNECT:
            self._stopped = False
            self._retry_at = now
        elif what == K.SAVE:
            self.save_state(command[1])
        elif what == K.SHUTDOWN:
            self._close_politely(now)
            self.final_state = self.save_state(command[1] if len(command) > 1 else None)
            self.close()

    def _close_politely(self, now: float) -> None:
        """DISCONNECT after what is buffered, for at most SHUTDOWN_FLUSH seconds; then close."""
        conn = self.conn
        if self._transport is not None and conn.state in ("connected", "connecting"):
            # Before the CONNACK no acknowledgement of ours is on the link for a reset to
            # lose: no linger (a server that never answers would hold it for LINGER).
            answered = conn.state == "connected"
            conn.disconnect()
            self._out += conn.data_to_send(now)
            self._answered(conn.acked_qos0())
            if self._drain(now + SHUTDOWN_FLUSH) and answered:
                self._linger(min(self._clock() + LINGER, now + SHUTDOWN_FLUSH))
        elif conn.state != "closed":
            conn.disconnect()
        self._drop_transport()

    def _drain(self, deadline: float) -> bool:
        """Write what is buffered by ``deadline``; True when all of it went."""
        out = self._out
        transport = self._transport
        while out:
            try:
                n = transport.send(out)
            except BlockingIOError:
                left = deadline - self._clock()
                if left <= 0:
                    return False
                with selectors.DefaultSelector() as sel:
                    sel.register(transport, selectors.EVENT_WRITE)
                    sel.select(left)
                continue
            except OSError:
                return False
            del out[:n]
        return True

    def _linger(self, deadline: float) -> None:
        """Read and drop what the server sends until it closes (after our DISCONNECT), or
        ``deadline``, so that closing sends a FIN, not a reset (LINGER)."""
        transport = self._transport
        with selectors.DefaultSelector() as sel:
            sel.register(transport, selectors.EVENT_READ)
            for _ in range(LINGER_READS):
                try:
                    if not transport.recv(65536):
                        return              # the server closed
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    return
                left = deadline - self._clock()
                if left <= 0 or not sel.select(left):
                    return
