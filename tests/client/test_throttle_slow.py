"""loop.throttle(rate) below one request a second: one request every 1/rate seconds, the first
at once (a bucket capped at ``rate`` tokens under 1 never gave one). The clock is the test's."""

import pytest

from edgebroker.client.commands import Throttle


@pytest.mark.parametrize("rate, times", [(0.5, [0, 2, 4, 6, 8, 10]), (0.25, [0, 4, 8])])
def test_rate_below_one_takes_every_one_over_rate_seconds(rate, times):
    t = Throttle(rate, now=0.0)
    taken = [s for s in range(11) if t.take(float(s))]
    assert taken == times


def test_rate_below_one_bursts_one_at_most():
    t = Throttle(0.5, now=0.0)
    assert t.take(0.0) and not t.take(0.0)
    assert t.ready_at() == pytest.approx(2.0)
    # a long idle time saves up one request, never more
    assert t.take(100.0) and not t.take(100.0)
    assert t.ready_at() == pytest.approx(102.0)


def test_rate_one_and_above_unchanged():
    t = Throttle(1.0, now=0.0)
    assert [s for s in range(4) if t.take(float(s))] == [0, 1, 2, 3]
    t = Throttle(4.0, now=0.0)
    assert t.take(0.0) and not t.take(0.0)
    assert sum(t.take(10.0) for _ in range(10)) == 4      # a second's burst at most
