"""The uploader's bandwidth cap (``[upload] upload_bandwidth``), and ``Stopped``, which a wait
of it raises when the broker stops."""

from __future__ import annotations

import time

from edgebroker.rates import TokenBucket

SEND_PIECE = 256 * 1024   # the most bytes a sink sends between two calls of the throttle


class Stopped(Exception):
    """The broker is stopping: leave the batch as it is (the intent file keeps its range)."""


class Throttle:
    """``rate`` bytes per second on average (0: no limit), bursts up to one second's worth:
    a larger request runs the bucket into debt, repaid (the uploader thread waits) before
    the next one goes. The sinks call it (``throttle(n)``) before they send ``n`` bytes, and
    send at most ``piece`` bytes between two calls (a quarter of a second's worth, at most
    SEND_PIECE): a wait in the middle of a request body then lasts at most about a quarter of a
    second, where a store gives up on a connection silent for some seconds (AWS S3 answers
    400 RequestTimeout after about 20 s)."""

    def __init__(self, rate: int, wait, clock=time.monotonic):
        self.clock = clock
        self.bucket = TokenBucket(rate, rate, clock()) if rate else None
        self.wait = wait   # wait(seconds) -> True when stopping
        self.piece = max(1, min(SEND_PIECE, rate // 4)) if rate else 0   # 0: the sink's own

    def __call__(self, n: int) -> None:
        self.take(n)

    def take(self, n: int) -> None:
        bucket = self.bucket
        if bucket is None:
            return
        now = self.clock()
        if bucket.refill(now) < 0 and self.wait(bucket.wait(0.0)):
            raise Stopped
        bucket.spend(n, now)


__all__ = ["Throttle", "Stopped", "SEND_PIECE"]
