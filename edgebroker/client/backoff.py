"""When the event loop connects again: the reconnection policy and full-jitter back-off.

Policies: ``never`` (a lost or refused connection ends the loop), ``after_first_success``
(the first connection must succeed; after that every loss is followed by a new attempt: the
default, so a wrong address fails at once), ``always`` (attempts never stop, also before a
first success: a device that starts while its link is down).

Back-off ("full jitter"): the n-th attempt in a row waits a random time between 0 and
``min(cap, base * 2**n)`` seconds. Random delays keep a fleet of devices that lost the same
link from reconnecting in step. The count starts again once a connection made (CONNACK with
success) has lasted ``STABLE_AFTER`` seconds: a server that closes each connection soon
after its CONNACK (a message it refuses, a client id taken over again and again) meets a
growing wait, not a reconnection as fast as the link allows. The bridge keeps to the same
rule (bridge/reconnect.py), with its waits drawn from ``base`` up (``floor``).
"""

from __future__ import annotations

import random

NEVER = "never"
AFTER_FIRST_SUCCESS = "after_first_success"
ALWAYS = "always"
POLICIES = (NEVER, AFTER_FIRST_SUCCESS, ALWAYS)
STABLE_AFTER = 10.0     # seconds a connection must last for the count to start again


def ceiling(attempts: int, base: float, cap: float) -> float:
    """The longest wait after ``attempts`` failures in a row: ``base`` doubled that many
    times, at most ``cap`` (the bridge's reconnection and refusal back-offs too)."""
    return min(cap, base * 2 ** min(attempts, 32))


class Backoff:
    __slots__ = ("policy", "base", "cap", "floor", "attempts", "connected_once", "up_since",
                 "_random")

    def __init__(self, policy: str = AFTER_FIRST_SUCCESS, base: float = 0.5,
                 cap: float = 30.0, rng=random.random, floor: bool = False):
        """``floor``: a wait is drawn between ``base`` and the ceiling, not from 0."""
        if policy not in POLICIES:
            raise ValueError(f"reconnect policy must be one of {', '.join(POLICIES)}, "
                             f"not {policy!r}")
        if not 0 < base <= cap:
            raise ValueError(f"back-off base {base} and cap {cap}: need 0 < base <= cap")
        self.policy = policy
        self.base = base
        self.cap = cap
        self.floor = floor
        self.attempts = 0          # failed attempts (or losses) since the last success
        self.connected_once = False
        self.up_since: float | None = None     # when the connection now up was made
        self._random = rng

    def succeeded(self, now: float | None = None) -> None:
        """A connection was made (CONNACK with success) at ``now``: the count starts again
        when it ends after ``STABLE_AFTER`` seconds (``lost``); without ``now``, at once."""
        self.connected_once = True
        if now is None:
            self.attempts = 0
        else:
            self.up_since = now

    def lost(self, now: float) -> bool:
        """The connection ended (any way) at ``now``; True when it had lasted
        ``STABLE_AFTER`` seconds (the count starts again)."""
        stable = self.up_since is not None and now - self.up_since >= STABLE_AFTER
        if stable:
            self.attempts = 0
        self.up_since = None
        return stable

    def again(self) -> bool:
        """Whether to connect again after a failure or a loss."""
        if self.policy == ALWAYS:
            return True
        return self.policy == AFTER_FIRST_SUCCESS and self.connected_once

    def delay(self) -> float:
        """The wait before the next attempt (counts this failure)."""
        longest = ceiling(self.attempts, self.base, self.cap)
        self.attempts += 1
        least = self.base if self.floor else 0.0
        return least + self._random() * (longest - least)
