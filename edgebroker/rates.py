"""A rate with a burst (``TokenBucket``): the publish and connection rates (core.limits,
server/app.py), a bridge's bandwidth (bridge/) and the uploader's (uploader/). No clock of
its own: times are passed in.

Spending may go below zero (a large packet or request is let through and paid for
afterwards), so the long-run rate is exact whatever the sizes; ``wait`` says how long until
enough is stored again.
"""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` stored; starts full."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def refill(self, now: float) -> float:
        elapsed = now - self.stamp
        if elapsed > 0:
            tokens = self.tokens + elapsed * self.rate
            self.tokens = tokens if tokens < self.burst else float(self.burst)
            self.stamp = now
        return self.tokens

    def spend(self, amount: float, now: float) -> bool:
        """Take ``amount`` (possibly going below zero); True while a whole token is left."""
        self.refill(now)
        self.tokens -= amount
        return self.tokens >= 1.0

    def wait(self, need: float = 1.0) -> float:
        """Seconds until ``need`` tokens are stored (0 if they are), from the last refill."""
        missing = need - self.tokens
        return missing / self.rate if missing > 0 else 0.0

    def wait_for_share(self, seconds: float) -> float:
        """Seconds until ``seconds``' worth of the rate is stored (at least one token, at
        most the burst): when to go on after the bucket ran dry, so that a paused reader or
        sender is not woken for every single token."""
        return self.wait(min(float(self.burst), max(1.0, self.rate * seconds)))
