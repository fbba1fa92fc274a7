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
    wall-clock difference, less each forward step of the wall clock seen after the record was
    logged, whenever in the run it comes (a bound by the run's length let a step 45 s into
    the run expire a 1 s old message of 30 s: diff25)."""
    from edgebroker.commitlog import CommitLog, LogOptions
    from edgebroker.core.journal import Journal
    from edgebroker.core.stats import Stats
    start_ms, clock, wall = 1_700_000_000_000, [100.0], [1_700_000_000_000]
    log = CommitLog.open(str(tmp_path / "log"), LogOptions(), lambda: start_ms)
    try:
        journal = Journal(log, "none", lambda: wall[0], Stats(), lambda: clock[0])

        def at(steady: float, wall_ms: int) -> None:
            clock[0], wall[0] = steady, wall_ms

        def ago(ts: int, wall_ms: int, steady: float) -> int:
            at(steady, wall_ms)
            return journal.logged_ago(ts)

        # No step: the wall-clock difference, for a record of this run or one before it.
        assert ago(start_ms + 1000, start_ms + 5000, 105.0) == 4000
        assert ago(start_ms - 60_000, start_ms + 5000, 105.0) == 65_000
        # 45 s into the run a record is logged; at 45.5 s the clock steps 2 h ahead (seen by
        # the broker's maintenance); at 46 s the record is 1 s old, one from before the
        # start 106 s, one logged after the step (at 45.8 s) 0.2 s.
        at(145.0, start_ms + 45_000)
        journal.watch_clock()
        step = 7_200_000
        at(145.5, start_ms + 45_500 + step)
        journal.watch_clock()
        now = start_ms + 46_000 + step
        assert ago(start_ms + 45_000, now, 146.0) == 1000
        assert ago(start_ms - 60_000, now, 146.0) == 106_000
        assert ago(start_ms + 45_800 + step, now, 146.0) == 200
        # The clock put right again at 50 s: the records from before the step are as old as
        # the wall clock says (the step no longer counts: diff26, a 10 s message delivered
        # 13.5 s after it was published, the forward step still subtracted).
        assert ago(start_ms + 45_000, start_ms + 50_000, 150.0) == 5000
        assert ago(start_ms - 60_000, start_ms + 50_000, 150.0) == 110_000
        # A step seen first when the age is asked for counts the same.
        wall[0] = start_ms
        later = Journal(log, "none", lambda: wall[0], Stats(), lambda: clock[0])
        at(155.0, start_ms + 5000 + step)          # 5 s on, 2 h ahead: a record 1 s older
        assert later.logged_ago(start_ms - 1000) == 6000
        # A clock stepped back: never negative.
        assert ago(start_ms + 45_000, start_ms - 3_600_000, 151.0) == 0
    finally:
        log.close()
