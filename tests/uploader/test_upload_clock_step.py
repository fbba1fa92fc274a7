"""Batches cut by age while the wall clock steps back (NTP correcting a clock that ran ahead):
the broker runs with its wall clock shifted by the milliseconds in a file the test writes
(tests/wallclock.py); the monotonic clock is left alone."""

from __future__ import annotations

import mqttraw
from wallclock import shifted

from .test_uploader import upload_config, uploaded, wait_until


def publish_one(b, i: int) -> None:
    c = b.client(f"pub{i}")
    c.send(mqttraw.publish("t", b"m%d" % i, qos=1, packet_id=1))
    c.expect(mqttraw.PUBACK, timeout=10)
    c.close()


def test_a_wall_clock_stepped_back_does_not_hold_the_batch_cut_by_age(broker, tmp_path):
    """batch_max_age 1 s and a clock an hour ahead; a record, then the clock steps back an
    hour: the segment's age by the wall clock was negative, so it stayed open (and nothing
    was uploaded) for an hour. Now its age is also counted on the monotonic clock: the
    record is uploaded within seconds, and so is one written after the step."""
    shift = tmp_path / "shift_ms"
    shift.write_text("3600000")
    landing = tmp_path / "landing"
    landing.mkdir()
    b = broker(upload=upload_config(landing, batch_max_age=1), wrap=shifted(shift))
    publish_one(b, 0)
    wait_until(lambda: uploaded(b) == 1, timeout=20, what="the first record uploaded")
    publish_one(b, 1)            # stamped an hour ahead
    shift.write_text("0")        # NTP steps the clock back
    wait_until(lambda: uploaded(b) == 2, timeout=20, what="the record before the step")
    publish_one(b, 2)
    wait_until(lambda: uploaded(b) == 3, timeout=20, what="the record after the step")
    assert b.stats()["upload"]["batches"] == 3
