"""Password checks off the core thread, with a cache and a per-address failure limit.

A password hash is deliberately slow (tens of milliseconds, more on a
Raspberry Pi), so the core thread never computes one. ``verify`` hands the
work to a small ``ThreadPoolExecutor``; when a worker finishes, it puts the
result on a queue and wakes the selector loop (``wake``), and the loop calls
``deliver`` on its own thread, which runs the caller's continuation. All the
bookkeeping below (cache, failure counts) is touched only on the loop thread;
the workers only compute hashes (``hashlib`` releases the GIL while it does).

- Cache: a successful check is remembered under an HMAC (random per-process
  key) of user name, stored hash and password, so a reconnect costs no hash,
  and a changed password file (new hash) or a different password misses the
  cache and is checked again. Only successes are cached.
- Failure limit: an address with ``max_failures`` failed logins within
  ``window`` seconds (checks still running count too) is refused without a
  check until the window has passed, so a burst of bad logins cannot keep the
  workers busy for everyone else.
- At most ``MAX_PENDING`` checks wait at once; beyond that new logins are
  refused as "server unavailable".
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import queue
from concurrent.futures import ThreadPoolExecutor

from edgebroker.security import passwords

log = logging.getLogger("edgebroker.security")

WORKERS = 2
MAX_PENDING = 1024
CACHE_LIMIT = 10_000
HOSTS_LIMIT = 10_000

OK = "ok"
WRONG = "wrong password"
UNKNOWN = "unknown user"
BLOCKED = "blocked"
BUSY = "busy"


class Authenticator:
    def __init__(self, wake, clock, max_failures: int = 10, window: float = 60.0,
                 workers: int = WORKERS):
        self.wake = wake
        self.clock = clock
        self.max_failures = max_failures
        self.window = window
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._key = os.urandom(32)
        self._cache: set[bytes] = set()
        self._failures: dict[str, collections.deque] = {}
        self._pending_by_host: collections.Counter = collections.Counter()
        self.pending = 0

    def configure(self, max_failures: int, window: float) -> None:
        self.max_failures = max_failures
        self.window = window

    # ----- the loop's side ------------------------------------------------------------------

    def blocked(self, host: str) -> bool:
        """True if ``host`` has used up its failed logins for now."""
        return self._recent_failures(host) + self._pending_by_host[host] >= self.max_failures

    def verify(self, host: str, username: str, entry, password: bytes, done) -> None:
        """Check ``password`` for ``username`` (``entry`` = (hash string, parsed) or None for an
        unknown user); ``done(result)`` runs on the loop thread, now or after a worker's check,
        with OK, WRONG, UNKNOWN, BLOCKED or BUSY."""
        if self.blocked(host):
            done(BLOCKED)
            return
        if entry is not None:
            key = self._cache_key(username, entry[0], password)
            if key in self._cache:
                log.debug("user %r: password accepted from the cache", username)
                done(OK)
                return
            parsed = entry[1]
        else:
            key = None
            parsed = passwords.dummy_hash()   # unknown users cost as much as known ones
        if self.pending >= MAX_PENDING:
            done(BUSY)
            return
        self.pending += 1
        self._pending_by_host[host] += 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers,
                                            thread_name_prefix="edgebroker-auth")
        future = self._pool.submit(passwords.verify_password, parsed, password)
        job = (host, username, key, done, self.clock())
        future.add_done_callback(lambda f: self._finished(job, f))

    def deliver(self) -> None:
        """Run the continuations of finished checks (on the loop thread, after a wake-up)."""
        results = self._results
        while True:
            try:
                (host, username, key, done, started), ok = results.get_nowait()
            except queue.Empty:
                return
            self.pending -= 1
            self._pending_by_host[host] -= 1
            if self._pending_by_host[host] <= 0:
                del self._pending_by_host[host]
            log.debug("user %r: password check done in %.0f ms (%d waiting)", username,
                      (self.clock() - started) * 1000, self.pending)
            if ok and key is not None:
                if len(self._cache) >= CACHE_LIMIT:
                    self._cache.clear()
                self._cache.add(key)
                result = OK
            else:
                self._failed(host)
                result = UNKNOWN if key is None else WRONG
            try:
                done(result)
            except Exception:
                log.exception("internal error after a password check for %r", username)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ----- worker threads -------------------------------------------------------------------

    def _finished(self, job, future) -> None:
        if future.cancelled():
            return
        try:
            ok = future.result()
        except Exception:       # a hash the parser accepted but the library refused
            log.exception("password check failed for user %r", job[1])
            ok = False
        self._results.put((job, ok))
        try:
            self.wake()
        except OSError:         # the loop has shut down and closed its wake-up socket
            pass

    # ----- bookkeeping ----------------------------------------------------------------------

    def _cache_key(self, username: str, stored: str, password: bytes) -> bytes:
        msg = b"\0".join((username.encode("utf-8"), stored.encode("ascii", "replace"), password))
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def _recent_failures(self, host: str) -> int:
        times = self._failures.get(host)
        if not times:
            return 0
        horizon = self.clock() - self.window
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[host]
            return 0
        return len(times)

    def _failed(self, host: str) -> None:
        times = self._failures.get(host)
        if times is None:
            if len(self._failures) >= HOSTS_LIMIT:
                for other in list(self._failures):
                    self._recent_failures(other)
                if len(self._failures) >= HOSTS_LIMIT:
                    self._failures.clear()
            times = self._failures[host] = collections.deque(maxlen=max(self.max_failures, 1))
        times.append(self.clock())

    def record_failure(self, host: str) -> None:
        """A failed login that needed no hash (e.g. no password given) counts too."""
        self._failed(host)
