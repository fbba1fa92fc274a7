"""Password checks off the core thread, with a cache and throttles on failed logins.

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
  cache and is checked again. Only successes are cached. A password found in
  the cache is accepted whatever the throttles below say: it is known right.
  A SCRAM login (``policy``) is remembered alike, under its stored keys and
  the client key its proof revealed (``known``, ``remember``).
- Throttle per (address, user name): the first ``max_failures`` failed logins
  in a row (each less than ``window`` after the one before; checks still
  running count too; a successful login, ``succeeded``, starts the row again)
  are checked as they come; after that the pair gets one
  check at a time, the next no sooner than 1 s after its last failure,
  doubling with each further failure up to ``window``; attempts meanwhile are
  refused without a check. The pair is forgotten once a ``window`` has passed
  since its next check was due. So guessing one user's password from one
  address costs the attacker minutes per guess, and it neither stops other
  user names from that address nor a password that succeeded before.
- Throttle per address: ``ADDRESS_FACTOR`` x ``max_failures`` failed logins
  from one address within ``window`` (any user names: guessing names as well
  as passwords; failures only, not checks still running) and further checks
  from it are refused until the window started by its first failure has
  passed (cached passwords still pass), so a burst of bad logins cannot keep
  the workers busy for everyone else.
- At most ``MAX_PENDING`` checks wait at once, and at most ``PENDING_PER_HOST``
  from one address (an attacker's share of the queue); beyond that new logins
  are refused as "server busy" (``busy``), not as failed logins.
- A check that cannot run (the hash library fails: out of memory, say) refuses
  that login as a failed one; it is counted (``password_check_errors``) and
  logged once, with the library's error, until a check runs again.
- SCRAM decoys: the salts of unknown users and users without SCRAM keys are
  made with ``scram_secret``, 32 random bytes kept in the state directory
  (``SCRAM_SECRET_FILE``, mode 0600, made at the first SCRAM login), so such a
  name's salt stays the same across restarts, as a real user's does.
- Memory: at most ``PAIRS_LIMIT`` pairs and ``HOSTS_LIMIT`` addresses are
  remembered; past that the ones whose throttle is over go first, then the
  oldest, down to half the limit. A pair is kept under its user name only up
  to ``NAME_KEPT`` characters; a longer name (up to 64 KB) is kept as its
  first characters and a SHA-256 digest of the whole (``name_key``), so an
  entry costs about the same whatever the name. Log lines and reasons show a
  long name cut short.
"""

from __future__ import annotations

import collections
import logging
import os

from edgebroker.errors import shown


log = logging.getLogger("edgebroker.security")

WORKERS = 2
MAX_PENDING = 1024
PENDING_PER_HOST = MAX_PENDING // 4     # checks waiting from one address (peer_host)
CACHE_LIMIT = 10_000
HOSTS_LIMIT = 10_000
PAIRS_LIMIT = 10_000
SCRAM_SECRET_FILE = "scram-secret"   # in the state directory (scram_secret)
SECRET_BYTES = 32
ADDRESS_FACTOR = 10   # failed logins per address within the window, in max_failures
NAME_KEPT = 64        # user names up to this many characters are kept as they are (name_key)
NAME_SHOWN = 100      # characters of a user name in a log line or reason

OK = "ok"
WRONG = "wrong password"
UNKNOWN = "unknown user"
BLOCKED = "blocked"
BUSY = "busy"
CHECK_FAILED = "the password check could not run"


class _Counts:
    """Counted password checks when no broker counters are attached (``stats``)."""

    password_checks = 0
    password_check_errors = 0


class Authenticator:
    def __init__(self, wake, clock, max_failures: int = 10, window: float = 60.0,
                 workers: int = WORKERS, state_dir: str | None = None):
        self.wake = wake
        self.clock = clock
        self.max_failures = max_failures
        self.window = window
        self.workers = workers
        # anything with ``password_checks`` and ``password_check_errors``: the broker's Stats
        self.stats = _Counts()
        self._failing = 0   # checks that could not run since the last one that did
        self._pool = None   # a ThreadPoolExecutor, from the first check on
        # The workers' results (a queue.SimpleQueue) and queue.Empty, with the pool: a broker
        # without password files loads neither concurrent.futures nor queue.
        self._results = None
        self._empty: type[Exception] = Exception
        self._key = os.urandom(32)
        self.state_dir = state_dir          # where scram_secret is kept (None: not kept)
        self._scram_secret: bytes | None = None
        self._cache: set[bytes] = set()
        # (address, name_key(user name)) -> [failed logins in a row, time of the last one]
        self._pairs: dict[tuple[str, str], list] = {}
        # address -> [failed logins since ``start``, start]
        self._hosts: dict[str, list] = {}
        self._pending_by_pair: collections.Counter = collections.Counter()
        self._pending_by_host: collections.Counter = collections.Counter()
        self.pending = 0

    @property
    def scram_secret(self) -> bytes:
        """The secret behind the SCRAM salts of unknown users and users without keys
        (``load_secret``: read, or made, at the first SCRAM login)."""
        if self._scram_secret is None:
            self._scram_secret = load_secret(self.state_dir)
        return self._scram_secret

    def configure(self, max_failures: int, window: float) -> None:
        self.max_failures = max_failures
        self.window = window

    # ----- the loop's side ------------------------------------------------------------------

    def throttled(self, host: str, username: str) -> str | None:
        """Why a password check for ``username`` from ``host`` may not start now, or None."""
        now = self.clock()
        failures = self._host_failures(host, now)
        limit = ADDRESS_FACTOR * self.max_failures
        if failures >= limit:
            return (f"too many failed logins from {host} ({limit} within {self.window:g} s, any "
                    f"user names); only passwords that succeeded before are accepted from it "
                    f"for now")
        pair = (host, name_key(username))
        pending = self._pending_by_pair[pair]
        count, last = self._pair(pair, now)
        if count + pending < self.max_failures:
            return None
        user = shown(username, NAME_SHOWN)
        if pending:
            return (f"{count} failed logins in a row for user {user} from {host}; a "
                    f"check for it is running")
        wait = last + self.delay(count) - now
        if wait > 0:
            return (f"{count} failed logins in a row for user {user} from {host}; its "
                    f"next password check in {wait:.1f} s")
        return None

    def busy(self, host: str) -> str | None:
        """Why no more password checks may wait now (for a login from ``host``), or None:
        ``MAX_PENDING`` in all, or ``PENDING_PER_HOST`` from that address, are waiting."""
        if self.pending >= MAX_PENDING:
            return f"too many password checks waiting ({MAX_PENDING}); the checks are busy"
        if self._pending_by_host[host] >= PENDING_PER_HOST:
            return (f"too many password checks waiting from {host} ({PENDING_PER_HOST}); the "
                    f"checks are busy")
        return None

    def delay(self, failures: int) -> float:
        """Seconds after a pair's last failure before its next check, with ``failures`` in a
        row: none below ``max_failures``, then 1 s doubling up to ``window``."""
        if failures < self.max_failures:
            return 0.0
        return min(2.0 ** min(failures - self.max_failures, 62), self.window)

    def verify(self, host: str, username: str, entry, password: bytes, done,
               dummy: tuple | None = None) -> None:
        """Check ``password`` for ``username`` (``entry`` = (hash string, parsed) or None for an
        unknown user, checked against ``dummy``: the password file's ``dummy()``);
        ``done(result)`` runs on the loop thread, now or after a worker's check, with OK,
        WRONG, UNKNOWN, BLOCKED (``throttled`` says why), BUSY (``busy`` says why) or
        CHECK_FAILED."""
        if entry is not None:
            key = self._cache_key(username, entry[0], password)
            if key in self._cache:
                log.debug("user %s: password accepted from the cache",
                          shown(username, NAME_SHOWN))
                self.succeeded(host, username)
                done(OK)
                return
            parsed = entry[1]
        else:
            key = None
            # unknown users cost as much as known ones
            from edgebroker.security import passwords   # a broker without password files
            parsed = dummy if dummy is not None else passwords.dummy_hash()
        if self.throttled(host, username) is not None:
            done(BLOCKED)
            return
        if self.busy(host) is not None:
            done(BUSY)
            return
        self.pending += 1
        self._pending_by_host[host] += 1
        pair = (host, name_key(username))
        self._pending_by_pair[pair] += 1
        self.stats.password_checks += 1
        if self._pool is None:
            # Imported here: a broker without password files never loads concurrent.futures.
            from concurrent.futures import ThreadPoolExecutor
            if self._results is None:
                import queue
                self._results, self._empty = queue.SimpleQueue(), queue.Empty
            self._pool = ThreadPoolExecutor(max_workers=self.workers,
                                            thread_name_prefix="edgebroker-auth")
        from edgebroker.security import passwords   # a broker without password files
        future = self._pool.submit(passwords.verify_password, parsed, password)
        job = (host, username, pair, key, done, self.clock())
        future.add_done_callback(lambda f: self._finished(job, f))

    def deliver(self) -> None:
        """Run the continuations of finished checks (on the loop thread, after a wake-up)."""
        results = self._results
        if results is None:
            return
        while True:
            try:
                (host, username, pair, key, done, started), ok, error = results.get_nowait()
            except self._empty:
                return
            self.pending -= 1
            _release(self._pending_by_host, host)
            _release(self._pending_by_pair, pair)
            log.debug("user %s: password check done in %.0f ms (%d waiting)",
                      shown(username, NAME_SHOWN), (self.clock() - started) * 1000,
                      self.pending)
            if error is not None:
                self._check_failed(username, error)
            elif self._failing:
                log.warning("password checks run again (%d could not run before)",
                            self._failing)
                self._failing = 0
            if ok and key is not None:
                self._remember(key)
                self._pairs.pop(pair, None)     # (succeeded)
                result = OK
            else:
                self.record_failure(host, username)
                result = CHECK_FAILED if error else UNKNOWN if key is None else WRONG
            try:
                done(result)
            except Exception:
                log.exception("internal error after a password check for %s",
                              shown(username, NAME_SHOWN))

    def _check_failed(self, username: str, error: str) -> None:
        """A check the hash library failed: counted; logged once until a check runs again."""
        self.stats.password_check_errors += 1
        if not self._failing:
            log.error("password check for user %s could not run: %s; the login is refused "
                      "(further such failures are counted, not logged, until a check runs)",
                      shown(username, NAME_SHOWN), error)
        self._failing += 1

    def known(self, username: str, stored: str, secret: bytes) -> bool:
        """Whether ``secret`` succeeded for ``username`` with ``stored`` since the start."""
        return self._cache_key(username, stored, secret) in self._cache

    def remember(self, username: str, stored: str, secret: bytes) -> None:
        self._remember(self._cache_key(username, stored, secret))

    def _remember(self, key: bytes) -> None:
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache.add(key)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ----- worker threads -------------------------------------------------------------------

    def _finished(self, job, future) -> None:
        if future.cancelled():
            return
        error = None
        try:
            ok = future.result()
        except Exception as exc:    # the library failed (out of memory, say): see deliver
            ok, error = False, f"{type(exc).__name__}: {exc}"
        self._results.put((job, ok, error))
        try:
            self.wake()
        except OSError:         # the loop has shut down and closed its wake-up socket
            pass

    # ----- bookkeeping ----------------------------------------------------------------------

    def _cache_key(self, username: str, stored: str, password: bytes) -> bytes:
        import hashlib          # only with a password file (see passwords.py)
        import hmac
        msg = b"\0".join((username.encode("utf-8"), stored.encode("ascii", "replace"), password))
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def _pair(self, pair: tuple[str, str], now: float) -> tuple[int, float]:
        """(failed logins in a row, time of the last) of a pair; forgotten a ``window`` after
        its next check was due."""
        state = self._pairs.get(pair)
        if state is None:
            return 0, 0.0
        count, last = state
        if now - last >= self.window + self.delay(count):
            del self._pairs[pair]
            return 0, 0.0
        return count, last

    def _host_failures(self, host: str, now: float) -> int:
        state = self._hosts.get(host)
        if state is None:
            return 0
        if now - state[1] >= self.window:
            del self._hosts[host]
            return 0
        return state[0]

    def succeeded(self, host: str, username: str) -> None:
        """A successful login: the pair's failed logins in a row start again from none (the
        address's count stays)."""
        self._pairs.pop((host, name_key(username)), None)

    def record_failure(self, host: str, username: str) -> None:
        """A failed login: a wrong password, an unknown user, or no password given (which
        needs no hash but counts the same)."""
        now = self.clock()
        pair = (host, name_key(username))
        count, _ = self._pair(pair, now)
        if count == 0 and len(self._pairs) >= PAIRS_LIMIT:
            self._make_room(self._pairs, lambda key: self._pair(key, now), PAIRS_LIMIT)
        self._pairs[pair] = [count + 1, now]
        failures = self._host_failures(host, now)
        if failures == 0:
            if len(self._hosts) >= HOSTS_LIMIT:
                self._make_room(self._hosts, lambda key: self._host_failures(key, now),
                                HOSTS_LIMIT)
            self._hosts[host] = [1, now]
        else:
            self._hosts[host][0] = failures + 1

    @staticmethod
    def _make_room(table: dict, refresh, limit: int) -> None:
        """Drop the entries whose throttle is over (``refresh`` forgets them), then the oldest
        until at most half of ``limit`` are left: the next pass is ``limit / 2`` new entries
        away, so its cost is O(1) per entry."""
        for key in list(table):
            refresh(key)
        extra = len(table) - limit // 2
        if extra > 0:
            for key in list(table)[:extra]:
                del table[key]


def name_key(username: str) -> str:
    """A user name as the throttle keeps it: itself up to ``NAME_KEPT`` characters; a longer
    one as its first 32 characters, NUL and the SHA-256 of its UTF-8 (97 characters: never
    the same as a name kept as it is, which is shorter)."""
    if len(username) <= NAME_KEPT:
        return username
    import hashlib          # only with a password file (see passwords.py)
    digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{username[:32]}\0{digest}"


def load_secret(state_dir: str | None) -> bytes:
    """``SECRET_BYTES`` random bytes kept in ``state_dir/SCRAM_SECRET_FILE``: read, or made
    there once (mode 0600, written atomically). A file of another length is replaced with a
    new one, with a warning. When the file can be neither read nor written, a secret for
    this run only, with a warning: the decoy salts then change at each start, which tells a
    client that sees a restart which names are users. No ``state_dir`` (an Authenticator of
    its own in a test): a secret for this run only."""
    if state_dir is None:
        return os.urandom(SECRET_BYTES)
    from edgebroker.files import read_small_file, replace_file
    path = os.path.join(state_dir, SCRAM_SECRET_FILE)
    try:
        data = read_small_file(path)
        if len(data) == SECRET_BYTES:
            return data
        why = f"{len(data)} bytes, not {SECRET_BYTES}"
    except FileNotFoundError:
        why = None
    except OSError as exc:
        why = str(exc.strerror or exc)
    secret = os.urandom(SECRET_BYTES)
    try:
        replace_file(path, secret, 0o600)
    except OSError as exc:
        log.warning("cannot write the SCRAM decoy secret %s: %s; the salts given to unknown "
                    "user names change at each start until it can be written", path,
                    exc.strerror or exc)
        return secret
    if why is not None:
        log.warning("the SCRAM decoy secret %s was damaged (%s): replaced with a new one; "
                    "the salts given to unknown user names change once", path, why)
    return secret


def _release(counter: collections.Counter, key) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
