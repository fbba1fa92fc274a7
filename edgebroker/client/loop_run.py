"""``run(requests, timeout)`` of the event loop (client/loop.py's ``EventLoop`` takes these
methods): a bounded batch of requests sent while the loop's own source is put aside; it
returns when each is answered (QoS 0: handed to the transport), or the time is up, or the
loop is over (docs/client.md, "run: a bounded batch")."""

from __future__ import annotations

from edgebroker.client.events import Acked, RunResult, Subscribed, Unsubscribed

_ANSWERS = (Acked, Subscribed, Unsubscribed)


class LoopRun:
    """The batch part of ``EventLoop`` (a mixin over its state)."""

    def _batch_done(self) -> bool:
        return self._watch is not None and self._source_done and not self._watch

    def run(self, requests, timeout: float | None = None) -> RunResult:
        """Send ``requests`` (a bounded iterable) and return once each is answered (QoS 0:
        handed to the transport), or ``timeout`` seconds have passed, or the loop is over."""
        result = RunResult()
        before = (self._source, self._source_done, self._source_fd, self._acked)
        self.set_source(requests)
        self._acked = before[3]        # the batch's answers are run()'s: the source's stay its
        batch = self._source
        self._watch = watch = {}
        deadline = None if timeout is None else self._clock() + timeout
        try:
            while not (self._source_done and not watch):
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    break
                event = self.poll(left)
                if event is None:
                    if self._finished or self._stopped:
                        break
                    continue
                if type(event) in _ANSWERS and watch.pop(id(event.request), None) is not None:
                    result.done.append(event)
                else:
                    result.events.append(event)
        finally:
            self._watch = None
            done = self._source_done
            self._source, self._source_done, self._source_fd, self._acked = before
            self._more = False
        result.pending = list(watch.values())
        if not done:
            result.rest, result.taken_all = batch, False
        return result
