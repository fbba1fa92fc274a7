"""Message Expiry on a gateway whose wall clock is stepped forward (NTP after the boot of a
gateway without a real-time clock, while the link is still down): a message logged with an
expiry of an hour, then the clock steps two hours ahead. Seconds have passed, not hours:
the bridge forwards it to a real Mosquitto with about an hour left, and an offline MQTT 5.0
session that comes back gets it (both read it back from the log). Before, the wall-clock
difference from the record's time stamp expired it in both places."""

from __future__ import annotations

import mqttraw5 as R
from wallclock import shifted

from .helpers import bridge_table, figures, wait_figure

HOUR = 3600


def test_a_wall_clock_stepped_forward_expires_no_message_logged_since_the_start(
        broker, mosquitto_broker, tmp_path):
    shift = tmp_path / "shift_ms"
    shift.write_text("0")
    remote = mosquitto_broker()
    remote.stop()       # the link is down
    rules = [{"pattern": "o/#", "direction": "out", "qos": 1, "remote_prefix": "R/"}]
    gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5)],
                wrap=shifted(shift))
    # An MQTT 5.0 session that is offline, subscribed to the message.
    away = R.RawClient5(gw.host, gw.port)
    assert away.connect("away", clean_start=False, props={R.SESSION_EXPIRY: HOUR}).reason == 0
    assert away.subscribe("o/#", qos=1).codes == [1]
    away.disconnect()

    dev = R.RawClient5(gw.host, gw.port)
    assert dev.connect("dev").reason == 0
    dev.publish("o/cmd", b"for an hour", qos=1, retain=True, props={R.MESSAGE_EXPIRY: HOUR})
    dev.close()
    shift.write_text(str(2 * HOUR * 1000))      # NTP steps the clock two hours ahead
    # The gateway's wall clock has moved: the record is two hours old by it.
    wait_figure(gw, lambda f: f["lag_seconds"] >= 2 * HOUR)

    back = R.RawClient5(gw.host, gw.port)
    ack = back.connect("away", clean_start=False, props={R.SESSION_EXPIRY: HOUR})
    assert ack.reason == 0 and ack.session_present
    p = back.recv_publish(5)
    assert (p.topic, p.payload) == ("o/cmd", b"for an hour")
    assert HOUR - 60 <= p.properties[R.MESSAGE_EXPIRY] <= HOUR, p.properties
    back.close()

    remote.start()
    fig = wait_figure(gw, lambda f: f["forwarded"] + f["expired"] >= 1, timeout=20)
    assert (fig["forwarded"], fig["expired"]) == (1, 0), fig
    central = R.RawClient5("127.0.0.1", remote.port)
    assert central.connect("central").reason == 0
    assert central.subscribe("R/o/cmd", qos=1).codes == [1]
    p = central.recv_publish(5)
    assert (p.topic, p.payload, p.retain) == ("R/o/cmd", b"for an hour", True)
    assert HOUR - 60 <= p.properties[R.MESSAGE_EXPIRY] <= HOUR, p.properties
    central.close()
    assert gw.stats()["dropped"]["message_expired"] == 0
    assert figures(gw)["expired"] == 0


def test_the_time_since_a_record_was_logged(tmp_path):
    """Journal.logged_ago, the one rule the bridge and the core's sessions use: the
    wall-clock difference, less each step of the wall clock seen after the record was logged,
    whenever in the run it comes (a bound by the run's length let a step 45 s into the run
    expire a 1 s old message of 30 s: diff25), told by the record's offset: a record logged
    while the clock was ahead and then put back, or logged before a step back that was then
    put right, kept its whole expiry (diff27)."""
    from edgebroker.commitlog import CommitLog, LogOptions
    from edgebroker.core.journal import Journal
    from edgebroker.core.stats import Stats
    start_ms, clock, wall = 1_700_000_000_000, [100.0], [1_700_000_000_000]
    step = 7_200_000
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(), lambda: start_ms)
    try:
        before_start = log.append(start_ms - 60_000, 0, False, b"", b"t", b"x")
        journal = Journal(log, "none", lambda: wall[0], Stats(), lambda: clock[0])

        def at(steady: float, wall_ms: int) -> None:
            clock[0], wall[0] = steady, wall_ms

        def logged(steady: float, wall_ms: int) -> tuple[int, int]:
            at(steady, wall_ms)
            return wall_ms, journal.append(None, b"t", b"x", 0, False)

        def look(steady: float, wall_ms: int) -> None:
            at(steady, wall_ms)
            journal.watch_clock()

        def ago(record: tuple[int, int], steady: float, wall_ms: int) -> int:
            at(steady, wall_ms)
            return journal.logged_ago(*record)

        old = (start_ms - 60_000, before_start)
        # No step: the wall-clock difference, for a record of this run or one before it.
        r1 = logged(101.0, start_ms + 1000)
        assert ago(r1, 105.0, start_ms + 5000) == 4000
        assert ago(old, 105.0, start_ms + 5000) == 65_000
        # 45 s into the run a record is logged; at 45.5 s the clock steps 2 h ahead (seen by
        # the broker's maintenance); at 46 s the record is 1 s old, the one from before the
        # start 106 s, one logged after the step (at 45.8 s) 0.2 s.
        r2 = logged(145.0, start_ms + 45_000)
        look(145.0, start_ms + 45_000)
        look(145.5, start_ms + 45_500 + step)
        r3 = logged(145.8, start_ms + 45_800 + step)
        now = start_ms + 46_000 + step
        assert [ago(r, 146.0, now) for r in (r2, old, r3)] == [1000, 106_000, 200]
        # The clock put right again at 50 s: each record as old as it is (the record logged
        # while the clock was ahead is 4.2 s old, not 2 h younger than its time stamp says).
        look(150.0, start_ms + 50_000)
        assert [ago(r, 150.0, start_ms + 50_000) for r in (r2, old, r3)] == [5000, 110_000, 4200]
        # A clock stepped back an hour at 52 s, put right at 60 s: a record from 51 s is 9 s
        # old (the forward step putting it right no longer makes it an hour younger).
        r4 = logged(151.0, start_ms + 51_000)
        look(152.0, start_ms + 52_000 - 3_600_000)
        r5 = logged(153.0, start_ms + 53_000 - 3_600_000)
        look(160.0, start_ms + 60_000)
        assert [ago(r, 160.0, start_ms + 60_000) for r in (r4, r5)] == [9000, 7000]
        # Records logged between the look before a step and the one that saw it: told apart
        # by their time stamps, forward and back.
        for s0, jump in ((170.0, 3_600_000), (180.0, -3_600_000)):
            w0 = start_ms + int(s0 * 1000) - 100_000
            look(s0, w0)
            before = logged(s0 + 0.2, w0 + 200)
            after = logged(s0 + 0.7, w0 + 700 + jump)
            look(s0 + 1.0, w0 + 1000 + jump)
            assert [ago(r, s0 + 2.0, w0 + 2000 + jump) for r in (before, after)] == [1800, 1300]
        # A clock flapping an hour back and forth 65 times while nothing is logged: more
        # steps than are remembered (64), but with no record between them they are one
        # (diff28: the record from before them came out an hour too old).
        r6 = logged(190.0, start_ms + 90_000)
        look(190.0, start_ms + 90_000)
        for k in range(65):
            look(191.0 + k, start_ms + 91_000 + k * 1000 + (3_600_000 if k % 2 == 0 else 0))
        assert len(journal._steps) <= 20
        assert ago(r6, 256.0, start_ms + 156_000 + 3_600_000) == 66_000
        # A step seen first when the age is asked for counts the same.
        wall[0] = start_ms + 200_000
        clock[0] = 300.0
        later = Journal(log, "none", lambda: wall[0], Stats(), lambda: clock[0])
        at(305.0, start_ms + 205_000 + step)       # 5 s on, 2 h ahead: a record 1 s older
        assert later.logged_ago(start_ms + 199_000, before_start) == 6000
        # A clock stepped back further than a record's age: never negative.
        at(306.0, start_ms)
        assert later.logged_ago(start_ms + 205_000 + step, log.next_offset) == 0
    finally:
        log.close()
