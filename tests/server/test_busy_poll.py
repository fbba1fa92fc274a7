"""The loop's busy poll (server.loop.BusyPoll): it looks for readiness without sleeping for
at most its time and the next timer, and backs off after polls that found nothing."""

from edgebroker.server.loop import BUSY_POLL_MAX_MISSES, BusyPoll


class FakeTime:
    """A clock that moves 10 us per reading, and a dispatch that finds a socket ready on the
    calls listed in ``ready_on`` (counted from 1)."""

    def __init__(self, ready_on=()):
        self.now = 100.0
        self.calls = 0
        self.timeouts = []
        self.ready_on = set(ready_on)

    def clock(self) -> float:
        self.now += 10e-6
        return self.now

    def dispatch(self, timeout, on_error) -> int:
        self.calls += 1
        self.timeouts.append(timeout)
        return 1 if self.calls in self.ready_on else 0


def test_it_returns_as_soon_as_something_is_ready_never_sleeping():
    t = FakeTime(ready_on={3})
    bp = BusyPoll(200)
    assert bp.poll(t.dispatch, None, t.clock, float("inf")) == 1
    assert t.calls == 3 and set(t.timeouts) == {0.0}
    assert (bp.hits, bp.missed, bp.skip) == (1, 0, 0)


def test_it_gives_up_after_its_time_or_at_the_next_timer():
    t = FakeTime()
    bp = BusyPoll(200)
    start = t.now
    assert bp.poll(t.dispatch, None, t.clock, float("inf")) == 0
    assert 200e-6 <= t.now - start <= 240e-6
    assert 15 <= t.calls <= 21
    t2 = FakeTime()
    assert BusyPoll(200).poll(t2.dispatch, None, t2.clock, t2.now + 50e-6) == 0
    assert t2.calls <= 6, "a timer due sooner ends the poll"


def test_misses_make_polls_rarer_and_a_hit_makes_them_every_pass_again():
    t = FakeTime()
    bp = BusyPoll(100)
    polled = []
    for _ in range(200):
        before = t.calls
        bp.poll(t.dispatch, None, t.clock, float("inf"))
        polled.append(t.calls > before)
    # Polls at passes 0, 2, 6, 14, 30, 62, then every 64th: skipped 1, 3, 7, 15, 31, 63.
    at = [i for i, p in enumerate(polled) if p]
    assert at[:7] == [0, 2, 6, 14, 30, 62, 126]
    assert bp.misses == BUSY_POLL_MAX_MISSES and bp.missed == len(at)
    # One that finds something ready: the next pass polls again.
    while bp.skip:
        bp.poll(t.dispatch, None, t.clock, float("inf"))
    t.ready_on = {t.calls + 1}
    assert bp.poll(t.dispatch, None, t.clock, float("inf")) == 1
    before = t.calls
    bp.poll(t.dispatch, None, t.clock, float("inf"))
    assert t.calls > before and bp.misses == 1


def test_zero_turns_it_off():
    t = FakeTime(ready_on={1})
    assert BusyPoll(0).poll(t.dispatch, None, t.clock, float("inf")) == 0
    assert t.calls == 0
