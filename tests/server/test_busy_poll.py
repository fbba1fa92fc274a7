"""The loop's busy poll (server.loop.BusyPoll): it looks for readiness without sleeping for
at most its time and the next timer, and backs off after polls in which the awaited
connection sent nothing."""

import mqttraw as m
from edgebroker.server.loop import BUSY_POLL_MAX_MISSES, BusyPoll


class Awaited:
    bytes_in = 0


class FakeTime:
    """A clock that moves 10 us per reading, and a dispatch that finds a socket ready on the
    calls listed in ``ready_on`` (counted from 1): the awaited one (its ``bytes_in`` grows)
    when ``awaited_ready``, else another."""

    def __init__(self, ready_on=(), awaited_ready=True):
        self.now = 100.0
        self.calls = 0
        self.timeouts = []
        self.ready_on = set(ready_on)
        self.awaited_ready = awaited_ready
        self.awaited = Awaited()

    def clock(self) -> float:
        self.now += 10e-6
        return self.now

    def dispatch(self, timeout, on_error) -> int:
        self.calls += 1
        self.timeouts.append(timeout)
        if self.calls not in self.ready_on:
            return 0
        if self.awaited_ready:
            self.awaited.bytes_in += 4
        return 1

    def poll(self, bp, due=float("inf")) -> int:
        return bp.poll(self.dispatch, None, self.clock, due, self.awaited)


def test_it_returns_as_soon_as_the_awaited_connection_sends_never_sleeping():
    t = FakeTime(ready_on={3})
    bp = BusyPoll(200)
    assert t.poll(bp) == 1
    assert t.calls == 3 and set(t.timeouts) == {0.0}
    assert (bp.hits, bp.missed, bp.skip) == (1, 0, 0)


def test_it_gives_up_after_its_time_or_at_the_next_timer():
    t = FakeTime()
    bp = BusyPoll(200)
    start = t.now
    assert t.poll(bp) == 0
    assert 200e-6 <= t.now - start <= 240e-6
    assert 15 <= t.calls <= 21
    t2 = FakeTime()
    assert t2.poll(BusyPoll(200), t2.now + 50e-6) == 0
    assert t2.calls <= 6, "a timer due sooner ends the poll"


def test_another_socket_ends_the_poll_and_counts_as_a_miss():
    t = FakeTime(ready_on={2}, awaited_ready=False)
    bp = BusyPoll(200)
    assert t.poll(bp) == 1, "what is ready is served in this pass"
    assert t.calls == 2 and (bp.hits, bp.missed, bp.skip) == (0, 1, 1)


def test_misses_make_polls_rarer_and_a_hit_makes_them_every_pass_again():
    t = FakeTime()
    bp = BusyPoll(100)
    polled = []
    for _ in range(200):
        before = t.calls
        t.poll(bp)
        polled.append(t.calls > before)
    # Polls at passes 0, 2, 6, 14, 30, 62, then every 64th: skipped 1, 3, 7, 15, 31, 63.
    at = [i for i, p in enumerate(polled) if p]
    assert at[:7] == [0, 2, 6, 14, 30, 62, 126]
    assert bp.misses == BUSY_POLL_MAX_MISSES and bp.missed == len(at)
    # One in which the awaited connection sends: the next pass polls again.
    while bp.skip:
        t.poll(bp)
    t.ready_on = {t.calls + 1}
    assert t.poll(bp) == 1 and bp.misses == 0
    before = t.calls
    t.poll(bp)
    assert t.calls > before and bp.misses == 1


def test_zero_turns_it_off():
    t = FakeTime(ready_on={1})
    assert t.poll(BusyPoll(0)) == 0
    assert t.calls == 0


def test_a_catch_up_from_the_log_polls_and_its_polls_are_counted(broker, uid):
    """A persistent QoS 1 subscriber drains a backlog from the log window by window: the
    loop polls for its acknowledgements, and the polls are counted in the stats (hit or miss
    depends on how fast this client answers, so only their sum is asserted; the Prometheus
    lines are checked in tests/core/test_limits_unit.py)."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    n = 200
    pub.send(b"".join(m.publish(f"{uid}/t", b"%04d" % i, 1, packet_id=i + 1) for i in range(n)))
    for _ in range(n):
        pub.expect(m.PUBACK)
    before = b.stats()["loop"]
    assert before["busy_polls_hit"] + before["busy_polls_missed"] == 0
    sub = b.client(f"{uid}-s", clean=False)
    got = [int(sub.recv_publish().payload) for _ in range(n)]
    assert got == list(range(n))
    loop = b.stats()["loop"]
    polls = loop["busy_polls_hit"] + loop["busy_polls_missed"]
    # 200 messages at a window of 20: ten rounds, the first polls (not while the loop waits for
    # a CPU, which a busy machine may make it do: tests/server/test_cpu_contention.py)
    assert polls >= 1 or loop["cpu_contention_episodes"] >= 1, loop
