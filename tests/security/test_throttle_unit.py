"""The failed-login throttles of ``security.authenticator`` with a clock of our own: growing
delays per (address, user name), the per-address count, forgetting, bounded memory."""

from edgebroker.security import authenticator as A


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(max_failures=3, window=60.0):
    clock = Clock()
    return A.Authenticator(lambda: None, clock, max_failures, window), clock


def test_delays_grow_per_pair_up_to_the_window_then_the_pair_is_forgotten():
    auth, clock = make()
    for _ in range(3):
        assert auth.throttled("h", "x") is None
        auth.record_failure("h", "x")
    assert "next password check in 1.0 s" in auth.throttled("h", "x")
    assert auth.throttled("h", "y") is None        # another user name
    assert auth.throttled("g", "x") is None        # another address
    waits = []
    for _ in range(9):
        why = auth.throttled("h", "x")
        wait = float(why.split("check in ")[1].split(" s")[0])
        waits.append(wait)
        clock.now += wait
        assert auth.throttled("h", "x") is None
        auth.record_failure("h", "x")
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    # Forgotten a window after its next check was due (not before).
    clock.now += 60 + 59
    assert auth.throttled("h", "x") is None and ("h", "x") in auth._pairs
    clock.now += 1
    assert auth.throttled("h", "x") is None and ("h", "x") not in auth._pairs


def test_an_address_with_failures_for_many_user_names_is_throttled_for_its_window():
    auth, clock = make()
    for i in range(30):
        assert auth.throttled("h", f"u{i}") is None
        auth.record_failure("h", f"u{i}")
    assert "too many failed logins from h (30 within 60 s" in auth.throttled("h", "new")
    assert auth.throttled("other", "new") is None
    clock.now += 60
    assert auth.throttled("h", "new") is None


def test_the_tables_stay_bounded():
    auth, clock = make(max_failures=1000)
    for i in range(A.PAIRS_LIMIT + 500):
        auth.record_failure(f"h{i % 7}", f"u{i}")
    assert len(auth._pairs) <= A.PAIRS_LIMIT
    # Entries whose throttle is over go first: after a window nothing old is kept.
    clock.now += 61
    for i in range(A.HOSTS_LIMIT + 10):
        auth.record_failure(f"addr{i}", "x")
    assert len(auth._hosts) <= A.HOSTS_LIMIT
    assert all(host.startswith("addr") for host in auth._hosts)


def test_a_long_user_name_is_kept_as_a_bounded_key_and_shown_cut_short():
    """A 64 KB user name costs a pair about what a short one costs: its first characters and
    a digest; two long names alike but for their last character stay two pairs."""
    auth, clock = make()
    long_x, long_y = "n" * 65_000 + "x", "n" * 65_000 + "y"
    for _ in range(3):
        assert auth.throttled("h", long_x) is None
        auth.record_failure("h", long_x)
    why = auth.throttled("h", long_x)
    assert why.startswith(f"3 failed logins in a row for user {'n' * 100!r}... from h; its "
                          f"next password check in 1.0 s"), why[:300]
    assert auth.throttled("h", long_y) is None          # another user name
    auth.record_failure("h", long_y)
    assert len(auth._pairs) == 2
    assert all(len(name) <= 100 for _, name in auth._pairs), \
        [len(name) for _, name in auth._pairs]
    # Short names are kept as they are (the tests above look them up so).
    auth.record_failure("h", "x" * A.NAME_KEPT)
    assert ("h", "x" * A.NAME_KEPT) in auth._pairs
