"""The limits' building blocks with plain numbers: no sockets, times passed in."""

import logging
import mmap
import os
import re
from types import SimpleNamespace

import pytest

from edgebroker import config
from edgebroker.core import limits as L, throttling
from edgebroker.core.limits import PublishRate
from edgebroker.core.metrics import PassTimes
from edgebroker.core.session import EMPTY_IDS, EMPTY_QUEUE, Session
from edgebroker.core.timers import Timer
from edgebroker.core.stats import Stats, sys_topic_level
from edgebroker.mqtt.topics import validate_topic_name
from edgebroker.server.metrics_http import render


def lim(**kw):
    return config.from_dict({"limits": kw}).limits


# ----- token bucket -------------------------------------------------------------------------

def test_bucket_starts_full_then_refills_at_the_rate():
    b = L.TokenBucket(rate=10, burst=5, now=0.0)
    assert all(b.spend(1, 0.0) for _ in range(4))
    assert not b.spend(1, 0.0)             # the 5th empties it: no whole token left
    assert b.wait() == pytest.approx(0.1)  # one token at 10/s
    assert b.refill(0.05) == pytest.approx(0.5)
    assert b.refill(100.0) == 5            # never above the burst


def test_bucket_goes_into_debt_and_the_long_run_rate_is_exact():
    b = L.TokenBucket(rate=1000, burst=1000, now=0.0)
    assert not b.spend(3000, 0.0)           # a packet larger than the burst passes...
    assert b.wait() == pytest.approx(2.001)  # ...and is paid for: 2001 tokens missing
    now, passed = 0.0, 0
    while now < 10.0:                        # a client sending 500-byte packets whenever allowed
        now += b.wait()
        b.spend(500, now)
        passed += 500
    # 1000 at start + 10 s x 1000/s refilled - 3000 for the big packet, + at most one packet
    assert 8000 <= passed <= 8500


def test_burst_zero_means_one_second_of_the_rate():
    assert L.burst_of(7.5, 0) == 8
    assert L.burst_of(0.2, 0) == 1
    assert L.burst_of(100, 3) == 3


def test_publish_rate_reports_the_limit_that_needs_the_longer_wait():
    r = L.PublishRate(lim(messages_rate=10, messages_burst=2, bytes_rate=100, bytes_burst=100), 0.0)
    assert r.charge(10, 0.0) is None
    name, wait = r.charge(10, 0.0)          # second message empties the messages bucket
    assert name == "messages_rate" and wait == pytest.approx(0.1)
    r2 = L.PublishRate(lim(messages_rate=10, messages_burst=100, bytes_rate=100), 0.0)
    name, wait = r2.charge(600, 0.0)        # 500 in debt, resumes with 2 bytes (20 ms) back
    assert name == "bytes_rate" and wait == pytest.approx(5.02)


def test_a_throttled_client_resumes_with_20_ms_of_its_rate_back():
    r = L.PublishRate(lim(messages_rate=20_000, messages_burst=1), 0.0)
    name, wait = r.charge(10, 0.0)
    assert wait == pytest.approx(1 / 20_000)  # burst 1: never more than the burst
    r = L.PublishRate(lim(messages_rate=20_000, messages_burst=20_000), 0.0)
    now = 0.0
    for _ in range(20_000 - 1):
        assert r.charge(10, now) is None
    name, wait = r.charge(10, now)
    assert wait == pytest.approx(400 / 20_000)  # 400 messages' worth, not 1
    assert L.PublishRate.for_limits(lim(), 0.0) is None


def test_control_rate_acts_as_a_token_bucket_of_its_burst():
    """ControlRate keeps one number per client, and throttles exactly where a TokenBucket of
    the same rate and burst would run dry; it resumes with 20 ms of its rate back."""
    control = L.ControlRate.for_limits(lim(control_rate=100, control_burst=10))
    bucket = L.TokenBucket(100, 10, 0.0)
    due, now = 0.0, 0.0
    for step in [0.0] * 12 + [0.001, 0.003, 0.05, 0.0, 0.5] + [0.0] * 15 + [0.02] * 5:
        now += step
        due, wait = control.charge(due, now)
        left = bucket.spend(1, now)
        assert (wait == 0.0) == left, (now, due)
        if wait:
            assert wait == pytest.approx(bucket.wait(2.0))   # 20 ms of 100/s: 2 packets back
    due, wait = control.charge(0.0, 0.0)
    assert wait == 0.0 and due == pytest.approx(0.01)
    assert L.ControlRate.for_limits(lim(control_rate=0)) is None
    default = L.ControlRate.for_limits(lim())               # on by default: 100/s, 1000 at once
    due = 0.0
    for _ in range(999):
        due, wait = default.charge(due, 0.0)
        assert wait == 0.0
    assert default.charge(due, 0.0)[1] == pytest.approx(0.02)


def test_control_rate_charges_several_at_once_and_says_how_many_are_allowed():
    """``charge(n)`` is n single charges; ``allowed`` counts the packets up to the one that
    takes the last token (the first that throttles), at least 1 (server/framing.py)."""
    control = L.ControlRate.for_limits(lim(control_rate=100, control_burst=10))
    for due, now in [(0.0, 5.0), (5.04, 5.0), (5.09, 5.0), (5.1, 5.0), (7.0, 5.0)]:
        k = control.allowed(due, now)
        one = due
        waits = []
        for _ in range(k):
            one, wait = control.charge(one, now)
            waits.append(wait)
        assert waits[-1] > 0 and not any(waits[:-1]), (due, k, waits)
        many, wait = control.charge(due, now, k)
        assert many == pytest.approx(one) and wait == pytest.approx(waits[-1])
    assert [control.allowed(d, 5.0) for d in (0.0, 5.04, 5.09, 5.1)] == [10, 6, 1, 1]


# ----- topic table --------------------------------------------------------------------------

def _none_retained(topic):
    return False


def test_topic_table_limits_in_order():
    t = L.TopicTable()
    limits = lim(max_topics=3, max_topics_per_client=2, max_topic_levels=3, max_topic_length=10)

    def admit(topic, client_id, memory_over=False):
        return t.admit(topic, client_id, limits, memory_over, _none_retained, False)

    assert admit("a/b/c/d", "x") == "max_topic_levels"
    assert admit("a" * 11, "x") == "max_topic_length"
    assert admit("a", "x", memory_over=True) == "memory_limit"
    assert admit("a", "x") is None
    assert admit("b", "x") is None
    assert admit("c", "x") == "max_topics_per_client"
    assert admit("c", "y") is None
    assert len(t) == 3 and t.created_by("x") == 2 and t.created_by("y") == 1 and t.evicted == 0


def test_a_full_topic_table_evicts_topics_not_published_to_lately_and_not_retained():
    t = L.TopicTable()
    limits = lim(max_topics=4, max_topics_per_client=10)
    retained = {"r"}.__contains__

    def admit(topic, client_id="x", retain=False):
        return t.admit(topic, client_id, limits, False, retained, retain)

    for topic in ("r", "a", "b"):
        assert admit(topic) is None
    assert t.rotate(retained) == 0                   # r, a, b: published to last period
    assert admit("a") is None                         # a again: current
    assert admit("c", "y") is None                    # the table is full now (r, a, b, c)
    assert admit("d", "y") is None                    # evicts b, idle since the rotation
    assert t.evicted == 1 and set(t.previous) == {"r"} and set(t.current) == {"a", "c", "d"}
    assert len(t) == 4 and t.created_by("x") == 2 and t.created_by("y") == 2
    # r is retained: kept, not evicted; previous is then empty, so the period ends early
    # (current becomes previous) and its topics go: d, c, a.
    assert admit("e", "z") is None and admit("f", "z") is None and admit("g", "z") is None
    assert t.evicted == 4 and len(t) == 4 and set(t.kept) == {"r"}
    assert set(t.current) == {"e", "f", "g"} and t.per_client == {"x": 1, "z": 3}


def test_a_topic_a_client_loses_to_eviction_frees_its_own_place():
    """One client fills a full table with new topics: each evicts one of its own, so its count
    stays at the table's size (it grew with every eviction and refused it in the end)."""
    t = L.TopicTable()
    limits = lim(max_topics=5, max_topics_per_client=10)
    never = set().__contains__
    for i in range(15):
        assert t.admit(f"dev/{i}", "dev", limits, False, never, False) is None, i
    assert len(t) == 5 and t.evicted == 10 and t.created_by("dev") == 5


def test_a_topic_table_full_of_retained_topics_refuses_only_retained_publishes():
    t = L.TopicTable()
    limits = lim(max_topics=2, max_topics_per_client=10)
    retained = {"r1", "r2"}.__contains__
    assert t.admit("r1", "x", limits, False, retained, True) is None
    assert t.admit("r2", "x", limits, False, retained, True) is None
    assert t.admit("r3", "x", limits, False, retained, True) == "max_topics"
    # Not retained: routed, but not tracked (nothing of it stays in the broker).
    assert t.admit("n", "x", limits, False, retained, False) is None
    assert len(t) == 2 and "n" not in t.current and t.evicted == 0
    assert t.admit("r1", "x", limits, False, retained, True) is None  # known: back to current
    assert set(t.current) == {"r1"} and set(t.kept) == {"r2"}


def test_topic_length_counts_utf8_bytes():
    limits = lim(max_topic_length=10)
    assert L.check_topic("é" * 5, limits) is None      # 10 bytes
    assert L.check_topic("é" * 6, limits) == "max_topic_length"
    assert L.check_topic("a/b", lim(max_topic_levels=2)) is None
    assert L.check_topic("a/b/", lim(max_topic_levels=2)) == "max_topic_levels"


def test_topic_table_forgets_idle_topics_after_two_rotations_unless_kept():
    t = L.TopicTable()
    limits = lim(max_topics=10)
    for topic in ("busy", "idle", "kept"):
        assert t.admit(topic, "x", limits, False, _none_retained, False) is None
    assert t.rotate(_none_retained) == 0               # nothing is old enough yet
    assert t.admit("busy", "x", limits, False, _none_retained, False) is None  # back to current
    assert t.rotate(lambda topic: topic == "kept") == 1  # "idle" goes, "kept" is retained
    assert set(t.current) == set() and set(t.previous) == {"busy"} and set(t.kept) == {"kept"}
    assert t.created_by("x") == 2
    t.rotate(lambda topic: topic == "kept")
    assert set(t.kept) == {"kept"} and t.created_by("x") == 1
    t.rotate(_none_retained)                           # its retained message was cleared
    assert len(t) == 0 and t.per_client == {}


# ----- timers, log, pass times --------------------------------------------------------------

def test_timers_with_equal_deadlines_order_without_error():
    import heapq

    heap = []
    timers = [Timer(lambda: None) for _ in range(5)]
    for t in timers:
        heapq.heappush(heap, (1.0, t))
    assert sorted(t for _, t in heap) == sorted(timers)


def test_event_log_once_per_period_with_the_count(caplog):
    ev = L.EventLog(logging.getLogger("test.events"), period=60)
    with caplog.at_level(logging.INFO, logger="test.events"):
        ev.log(logging.WARNING, "flood", 0.0, "refused %s", "a")
        for i in range(5):
            ev.log(logging.WARNING, "flood", 1.0 + i, "refused %s", "b")
        ev.log(logging.WARNING, "other", 2.0, "other kind")
        ev.log(logging.WARNING, "flood", 61.0, "refused %s", "c")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("refused a") and "at most once per 60 s" in lines[0]
    assert lines[1].startswith("other kind")
    assert lines[2].startswith("refused c") and "5 more like this in the last 61 s" in lines[2]


def test_pass_times_quantiles_over_the_last_1024():
    p = PassTimes()
    assert p.quantiles(0.5, 0.99) == [0.0, 0.0]
    for i in range(1, 101):
        p.add(i / 1000)
    p50, p99 = p.quantiles(0.5, 0.99)
    assert p50 == pytest.approx(0.051) and p99 == pytest.approx(0.1)
    for _ in range(2000):
        p.add(1.0)  # the ring keeps only the last 1024
    assert p.quantiles(0.5) == [1.0] and p.count == 2100


# ----- sessions' shared empty containers -----------------------------------------------------

def test_idle_sessions_share_read_only_empty_containers():
    a, b = Session("a", True), Session("b", True)
    assert a.queue is b.queue is EMPTY_QUEUE and a.awaiting_release is EMPTY_IDS
    with pytest.raises(TypeError):
        a.queue.append(1)
    with pytest.raises(TypeError):
        a.awaiting_release[1] = None
    a.own_queue().append(1)
    a.own_awaiting_release()[7] = None
    assert list(a.queue) == [1] and 7 in a.awaiting_release
    for shared, own in ((a.subscriptions, a.own_subscriptions), (a.inflight, a.own_inflight)):
        assert shared is b.subscriptions
        with pytest.raises(TypeError):
            shared["x"] = 1
        own()["x"] = 1
    assert a.subscriptions == {"x": 1} and a.inflight == {"x": 1} and b.inflight == {}
    assert len(EMPTY_QUEUE) == 0 and len(EMPTY_IDS) == 0 and b.queue is EMPTY_QUEUE


# ----- wrong client on the port --------------------------------------------------------------

@pytest.mark.parametrize("cid", ["plain", "a/b", "x+y#z", "100%", "é"])
def test_client_id_as_one_sys_topic_level(cid):
    level = sys_topic_level(cid)
    assert "/" not in level and "+" not in level and "#" not in level
    validate_topic_name("$SYS/broker/clients/" + level + "/messages/sent")
    assert level.replace("%2F", "/").replace("%2B", "+").replace("%23", "#") \
        .replace("%25", "%") == cid


# ----- Prometheus text ------------------------------------------------------------------------

def test_render_has_help_and_type_before_every_sample():
    snap = {
        "version": "1.2.3", "uptime_seconds": 1.5, "clients_connected": 2, "sockets_open": 3,
        "sessions": 2, "subscriptions": 1, "retained_messages": 0, "topics": 4,
        "queued_messages": 0, "queued_bytes": 0, "throttled_clients": 0, "throttled_seconds": 0.0,
        "sessions_behind": 1, "lag_records_max": 42, "timer_entries": 5, "timer_entries_dead": 1,
        "shared_subscriptions": 3, "shared_groups": 1, "shared_queued_messages": 0,
        "shared_groups_behind": 0,
        "counters": {k: 1 for k in Stats().as_dict()},   # every counter the broker has
        "limit_hits": L.zero_counts(L.LIMITS), "refused": L.zero_counts(L.REFUSALS),
        "dropped": L.zero_counts(L.DROPS),
        "loop": {"pass_p50_seconds": 0.001, "pass_p99_seconds": 0.01, "passes": 10,
                 "busy_seconds": 0.02, "busy_polls_hit": 7, "busy_polls_missed": 2,
                 "cpu_contended": True, "cpu_contention_episodes": 3,
                 "cpu_contended_seconds": 4.5, "cpu_wait_share": 0.25},
        "process": {"rss_bytes": 100, "cpu_seconds": 0.5, "memory_limit_bytes": 0,
                    "memory_over_limit": False, "memory_kept_bytes": 70, "memory_released": 2,
                    "allocated_blocks": 9},
    }
    text = render(snap)
    declared = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            declared.setdefault(line.split()[2], None)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            declared[name] = kind
        else:
            m = re.fullmatch(r'([a-z_]+)(\{[a-z]+="[^"]*"\})? (\S+)', line)
            assert m, line
            name = m.group(1)
            base = re.sub(r"_(sum|count)$", "", name) if name.endswith(("_sum", "_count")) else name
            assert declared.get(base), f"{name} has no TYPE line before it"
            float(m.group(3))
            assert name.startswith("edgebroker_")
    assert 'edgebroker_limit_hits_total{limit="max_topics"} 0' in text
    assert 'edgebroker_loop_pass_seconds{quantile="0.99"} 0.01' in text
    assert 'edgebroker_loop_busy_polls_total{result="hit"} 7' in text
    assert 'edgebroker_loop_busy_polls_total{result="miss"} 2' in text
    assert "edgebroker_loop_cpu_contended 1" in text.splitlines()
    assert "edgebroker_loop_cpu_contention_episodes_total 3" in text.splitlines()
    assert "edgebroker_loop_cpu_contended_seconds_total 4.5" in text.splitlines()
    assert "edgebroker_loop_cpu_wait_ratio 0.25" in text.splitlines()
    assert "edgebroker_memory_kept_bytes 70" in text.splitlines()
    assert "edgebroker_memory_released_total 2" in text.splitlines()


# ----- this process's figures (memory_limit, $SYS/broker/process/*) --------------------------

def test_process_usage_reads_the_figures_psutil_gives():
    """On Linux from /proc, without psutil: the same RSS and CPU time as psutil's."""
    import psutil
    from edgebroker.core.memory import ProcessUsage
    usage = ProcessUsage()
    assert usage.read == usage._read_proc                 # this machine is Linux: /proc
    proc = psutil.Process()
    sum(i * i for i in range(300_000))                    # some CPU time to see
    before = proc.cpu_times()
    rss, cpu = usage.read()
    after = proc.cpu_times()
    assert before.user + before.system - 0.01 <= cpu <= after.user + after.system + 0.01
    # 8 MiB of new pages touched (an anonymous mapping of its own: memory the allocator kept
    # from earlier tests could already be resident): RSS grows by that.
    ballast = mmap.mmap(-1, 8 << 20)
    for at in range(0, 8 << 20, 4096):
        ballast[at] = 1
    grown, _ = usage.read()
    assert abs(grown - proc.memory_info().rss) < 1 << 20
    assert grown - rss >= 7 << 20
    ballast.close()


def test_memory_available_takes_the_lowest_control_group_limit(tmp_path):
    """memory_limit = "auto" is half of memory_available: the machine's memory, or the lowest
    limit of the process's control group and those above it (v2 memory.max, "max" for none;
    v1 memory.limit_in_bytes, a page-rounded 2^63 for none). Real files in a made-up tree."""
    from edgebroker.core.memory import MemoryGuard, memory_available
    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    root = tmp_path / "cg"
    groups = tmp_path / "cgroup"

    def write(rel, text):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def available():
        return memory_available(str(groups), str(root))

    # v2: the service's own group has no limit, the slice above it has 256 MiB.
    groups.write_text("0::/system.slice/edgebroker.service\n")
    write("memory.max", "max\n")
    write("system.slice/memory.max", f"{256 << 20}\n")
    write("system.slice/edgebroker.service/memory.max", "max\n")
    assert available() == (256 << 20, f"{root}/system.slice/memory.max")
    # The service's own limit is lower still: that one.
    write("system.slice/edgebroker.service/memory.max", f"{64 << 20}\n")
    assert available() == (64 << 20, f"{root}/system.slice/edgebroker.service/memory.max")

    # v1 (a hybrid layout: the v2 line holds no memory controller), no limit set: the machine.
    groups.write_text("4:memory:/docker/abc\n0::/\n")
    write("memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")
    assert available() == (machine, "the machine's memory")
    write("memory/docker/memory.limit_in_bytes", f"{100 << 20}\n")
    assert available()[0] == 100 << 20
    # A limit above the machine's memory, or files that cannot be read: the machine's.
    groups.write_text("0::/big\n")
    write("big/memory.max", f"{machine * 2}\n")
    assert available()[0] == machine
    assert memory_available(str(tmp_path / "none"), str(root))[0] == machine

    guard = MemoryGuard("auto")
    assert guard.limit == memory_available()[0] // 2 and guard.source.startswith("auto: half")
    assert guard.configure(0) is True and guard.limit == 0 and guard.source == ""
    assert guard.configure(0) is False
    assert guard.configure(5 << 20) is True and guard.limit == 5 << 20


def _stepped_guard(limit):
    """A MemoryGuard whose RSS and allocated blocks are set by ``check(rss, blocks)``."""
    from edgebroker.core.memory import MemoryGuard
    guard = MemoryGuard(limit)
    figures = [(0, 0)]
    guard.usage = type("Usage", (), {"read": staticmethod(lambda: (figures[0][0], 0.0))})()
    guard.allocated = lambda: figures[0][1]

    def check(rss, blocks):
        figures[0] = (rss, blocks)
        return guard.check()
    return guard, check


def test_memory_guard_admits_again_over_memory_kept_after_a_peak():
    """Over memory_limit, once RSS stops rising and the allocated blocks have fallen well below
    the peak's, the RSS then is kept and admits again; growing past it by a tenth of the limit,
    or holding as many blocks as at the peak, is over again. An idle broker above a limit set
    below it is never released."""
    guard, check = _stepped_guard(1000)             # (a margin of 100, a ceiling of 2000)
    assert check(500, 100) is None and not guard.over              # idle: 100 blocks
    assert check(1200, 900) is True                                # flood
    assert check(1400, 1000) is None and guard.over                # still rising
    assert check(1300, 700) is None and guard.over                 # not well below the peak
    assert check(1300, 500) is False and guard.kept == 1300        # 100 + (1000 - 100) // 2
    assert guard.released == 1 and guard.peak == 1400
    assert check(1390, 900) is None and not guard.over             # reuses what it kept
    assert check(1401, 900) is True and guard.kept == 0            # grew past 1300 + 100
    assert check(1401, 200) is False and guard.kept == 1401 and guard.released == 2
    assert check(1401, 900) is True                                # holds as much as the peak
    assert check(900, 1000) is False and guard.kept == 0           # below the limit: plain
    guard.configure(100)                                           # a limit below idle use
    assert check(500, 100) is True
    for _ in range(3):
        assert check(500, 100) is None and guard.over and guard.released == 2


def test_memory_held_in_large_objects_is_not_taken_as_released():
    """(diff23) A peak's blocks were kept across peaks: after one of many small objects, memory
    held in retained payloads (few blocks) passed as released at each stop (RSS 34 MiB limit,
    then 277 and 605 MiB). Each peak is measured from its own start now."""
    guard, check = _stepped_guard(1000)
    check(500, 100)
    assert check(1400, 1000) is True and check(1300, 500) is False  # small objects gone: kept
    assert check(1401, 520) is True                                # payloads: grew past it
    assert check(1450, 530) is None and guard.over                 # rising
    for _ in range(3):      # stopped: its blocks are not well below this peak's (530)
        assert check(1450, 530) is None and guard.over and guard.released == 1


def test_each_peak_is_measured_from_what_the_broker_held_before_it():
    """(diff24) The release was measured from the fewest blocks since the start: a broker that
    had gained state since (persistent sessions) never fell half-way back to its empty start
    after a smaller flood, and was locked out for good. Nor is a peak small against the state
    locked out (a cap at three quarters of the peak's blocks was); but a peak the blocks took
    no part in (a limit lowered below the broker's holdings) is not released by their noise."""
    guard, check = _stepped_guard(1000)
    check(500, 100)                                                # idle
    check(700, 1000)                                               # sessions held since
    assert check(1200, 1400) is True and guard.blocks_base == 1000  # a flood
    assert check(1250, 1500) is None                               # rising
    assert check(1250, 1260) is None and guard.over                # not half-way back
    assert check(1250, 1240) is False and guard.kept == 1250       # 1000 + 500 // 2

    guard, check = _stepped_guard(1000)
    check(900, 900_000)
    assert check(1100, 1_000_000) is True and guard.blocks_base == 900_000
    assert check(1100, 951_000) is None and guard.over
    assert check(1100, 950_000) is False and guard.kept == 1100

    guard, check = _stepped_guard(1000)
    check(900, 100_000)
    guard.configure(800)                                           # below what it holds
    assert check(900, 100_100) is True and guard.blocks_base == 100_000
    for blocks in (99_000, 100_200, 98_000, 100_000):              # noise: not a fall
        assert check(900, blocks) is None and guard.over and guard.released == 0
    assert check(900, 96_900) is False and guard.kept == 900       # a fall: 1/32 of 100,200


def test_memory_kept_past_twice_the_limit_is_kept_memory():
    """(diff24) RSS above twice the limit was never taken as kept: a one-second flood that took
    RSS to 4x the limit and left Python holding 2.5x locked the broker out for good. It is
    kept memory like any other now (with room of a tenth of the limit above it); below the
    ceiling, admitting over kept memory still stops at it."""
    guard, check = _stepped_guard(1000)
    check(500, 100)
    assert check(2100, 1000) is True
    assert check(2500, 1100) is None                               # rising
    assert check(2500, 100) is False and guard.kept == 2500 and guard.released == 1
    assert check(2600, 600) is None and not guard.over             # reuses what it kept
    assert check(2601, 600) is True                                # grew past 2500 + 100
    assert check(2601, 100) is False and guard.kept == 2601 and guard.released == 2
    assert check(900, 100) is None and guard.kept == 0             # below the limit: plain
    assert check(1950, 1000) is True and check(1950, 100) is False  # kept below the ceiling
    assert check(2000, 200) is None and not guard.over
    assert check(2001, 200) is True                                # past the ceiling


def test_memory_given_back_to_the_system_is_a_plain_fall_below_the_limit():
    """When RSS stops rising over the limit, and when the blocks have fallen, what malloc keeps
    free goes back to the system (malloc_trim) before RSS is taken as kept: when that takes it
    below the limit it is a plain fall, not memory kept after a peak."""
    guard, check = _stepped_guard(1000)
    trims = []
    guard.release_freed = lambda: trims.append(guard.allocated())
    check(500, 100)
    assert check(1400, 1000) is True and trims == []
    assert check(1400, 1000) is None and trims == [1000]           # stopped: collected, trimmed
    assert check(1400, 900) is None and trims == [1000]            # (every COLLECT_EVERY)
    usage = guard.usage
    guard.usage = type("Usage", (), {"read": staticmethod(
        lambda: (900 if trims[-1] == 100 else 1300, 0.0))})()
    guard.allocated = lambda: 100
    assert check(1300, 100) is False and trims == [1000, 100]      # the clients gone: trimmed
    assert guard.kept == 0 and guard.released == 0 and guard.rss == 900
    guard.usage = usage


def test_a_reload_raising_the_limit_keeps_the_kept_memory():
    """(diff23) A reload that raised memory_limit, still below RSS, while the broker admitted
    over kept memory, forgot the peak: the idle broker's blocks became a new one it could never
    fall below, and every new client was refused for good."""
    guard, check = _stepped_guard(1000)
    check(500, 100)
    assert check(1400, 1000) is True and check(1300, 500) is False
    assert guard.configure(1250) is True
    for _ in range(3):
        assert check(1300, 500) is None and not guard.over and guard.kept == 1300
    assert check(1300, 1000) is True        # holding as much as at the peak: over again


def test_event_log_reports_repeats_no_event_followed(caplog):
    """Repeats with no event after them: flush logs the last of them with their number once
    the period is over (not before), or at once when final (shutdown); the next event of the
    kind is then logged when it comes."""
    ev = L.EventLog(logging.getLogger("test.events"), period=60)
    with caplog.at_level(logging.INFO, logger="test.events"):
        ev.log(logging.INFO, "expired", 0.0, "removed %s", "s0")
        for i in range(1, 5):
            ev.log(logging.INFO, "expired", float(i), "removed %s", f"s{i}")
        ev.log(logging.WARNING, "flood", 2.0, "refused %s", "a")
        ev.log(logging.WARNING, "flood", 3.0, "refused %s", "b")
        ev.flush(59.0)
        assert len(caplog.records) == 2
        ev.flush(60.5)
        assert len(caplog.records) == 3
        late = caplog.records[2]
        assert late.levelno == logging.INFO and late.getMessage() == (
            "removed s4 (the last of 4 like this in the last 60 s that were not logged when "
            "they came)")
        ev.flush(61.5)
        assert len(caplog.records) == 3          # "flood" (from 2.0) not over yet, nothing new
        ev.log(logging.INFO, "expired", 62.0, "removed %s", "s5")
        assert caplog.records[3].getMessage() == "removed s5"
        ev.flush(63.0, final=True)                # shutdown: the flood's repeat, early
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5 and lines[4].startswith("refused b (the last of 1 like this in the "
                                                   "last 61 s")


class _Leaving:
    """What RateDebts.keep reads of a connection that leaves: its id, its publish buckets
    (real ones), no control rate, nothing logged."""

    def __init__(self, client_id, rate):
        self.client_id = client_id
        self.rate = rate
        self.control_due = 0.0
        self.warned = None
        self.broker = SimpleNamespace(control=None)


def test_rate_debts_prune_drops_only_repaid_debts_not_one_behind_a_stale_item():
    """diff37: a client that came back and left again leaves a stale heap item; pruning it
    dropped the next debt in the heap as well, however long it still had to run."""
    limits = SimpleNamespace(messages_rate=1, messages_burst=10, bytes_rate=0, bytes_burst=0)
    debts = throttling.RateDebts()

    def leave(client_id, owed_messages, now):
        rate = PublishRate(limits, now)
        rate.messages.spend(owed_messages, now)
        debts.keep(_Leaving(client_id, rate), now)

    leave("x", 12, 0.0)        # repaid at 12 s (2 under empty, then 10 to fill the burst)
    leave("y", 99, 0.0)        # repaid at 99 s
    leave("x", 12, 1.0)        # x came back and left again: its first item is stale
    debts.prune(12.5)          # the stale item (12 s) is due; x's new debt (13 s) and y's not
    assert set(debts.entries) == {"x", "y"}
    debts.prune(13.5)
    assert set(debts.entries) == {"y"}
    debts.prune(98.0)
    assert set(debts.entries) == {"y"}
    debts.prune(99.5)
    assert not debts.entries
