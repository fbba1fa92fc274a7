"""`lag_seconds` of the upload (stats, `edgebroker_upload_lag_seconds`, $SYS) while records
wait: measured from the newest uploaded record, which a restart takes from the log (the record
below the uploaded mark); with none in the log, the backlog's age (docs/metrics.md)."""

from __future__ import annotations

import re
import time
import urllib.request

from .test_uploader import landed, publish, upload_config, uploaded, wait_until

METRICS_RE = re.compile(r"metrics on http://([0-9.]+):(\d+)/metrics")


def metric(b, name: str) -> float:
    line = next(ln for ln in b.logs if METRICS_RE.search(ln))
    host, port = METRICS_RE.search(line).groups()
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return float(next(ln.split()[1] for ln in text.splitlines() if ln.startswith(name + " ")))


def sys_lag(b) -> float:
    """The first $SYS/broker/upload/lag_seconds above 0 (published every sys_interval), else
    the last one seen within 10 s."""
    watcher = b.client("sys-watcher")
    watcher.subscribe("$SYS/broker/upload/lag_seconds")
    deadline = time.monotonic() + 10
    value = 0.0
    while value <= 0 and time.monotonic() < deadline:
        value = float(watcher.recv_publish(timeout=5).payload)
    return value


def test_lag_after_a_restart_with_a_paused_backlog_counts_from_the_last_uploaded_record(
        broker, tmp_path):
    """Shipped in one run; the next run, paused, gets one record in a segment of its own: it
    waits, and the lag is the record time from the uploaded record to it, not 0 (the uploader
    knew no shipped record in that run and measured from the waiting record itself)."""
    landing = tmp_path / "landing"
    landing.mkdir()
    cfg = dict(data_dir=str(tmp_path / "data"), upload=upload_config(landing, batch_max_age=1),
               metrics={"listen": "127.0.0.1:0"}, sys_interval=1,
               log={"segment_bytes": 4096})
    b = broker(**cfg)
    publish(b, 0, 1, size=4000)     # fills its segment: the next record starts one
    wait_until(lambda: uploaded(b) == 1, what="the first record uploaded")
    b.stop()
    b = broker(**cfg)
    assert b.admin("upload_pause")["changed"]
    publish(b, 1, 1)
    fig = wait_until(lambda: (f := b.stats()["upload"])["backlog_bytes"] and f,
                     what="the backlog seen")
    assert fig["state"] == "paused" and fig["uploaded_offset"] == 1
    assert fig["lag_seconds"] > 0, fig
    # The metrics are a snapshot the core thread takes now and then, $SYS too.
    wait_until(lambda: metric(b, "edgebroker_upload_lag_seconds") > 0, what="the metric")
    assert sys_lag(b) > 0
    assert b.admin("upload_resume")["changed"]
    wait_until(lambda: uploaded(b) == 2, what="the second record uploaded")
    stamps = sorted(r.timestamp_ms for _, records in landed(landing).values() for r in records)
    # From the uploaded record to the waiting one, at most the waiting one's age.
    assert fig["lag_seconds"] == min((stamps[1] - stamps[0]) / 1000,
                                     fig["backlog_age_seconds"])
    assert b.stats()["upload"]["lag_seconds"] == 0.0       # nothing waits
    b.stop()


def test_lag_with_nothing_uploaded_yet_is_the_backlogs_age(broker, tmp_path):
    """A log with no uploaded record: the lag is the age of the oldest waiting record."""
    landing = tmp_path / "landing"
    landing.mkdir()
    b = broker(upload=upload_config(landing, batch_max_age=1))
    assert b.admin("upload_pause")["changed"]
    publish(b, 0, 1)
    fig = wait_until(lambda: (f := b.stats()["upload"])["backlog_age_seconds"] > 0.05 and f,
                     what="the backlog a little old")
    assert fig["lag_seconds"] > 0 and abs(fig["lag_seconds"] - fig["backlog_age_seconds"]) < 0.01


def test_the_first_record_after_an_idle_time_is_not_late_by_that_time(broker, tmp_path):
    """A quiet gateway: one record uploaded, 3 s of nothing, then one more, which waits (paused
    here, as for the batch_max_age of a running upload). Its lag is its own age, not the 3 s
    since the uploaded record (an alert on the lag fired at every report of a device that
    reports every 10 minutes)."""
    landing = tmp_path / "landing"
    landing.mkdir()
    b = broker(upload=upload_config(landing, batch_max_age=1), log={"segment_bytes": 4096})
    publish(b, 0, 1, size=4000)     # fills its segment: the next record starts one
    wait_until(lambda: uploaded(b) == 1, what="the first record uploaded")
    assert b.admin("upload_pause")["changed"]
    time.sleep(3)                   # the idle time itself
    publish(b, 1, 1)
    fig = wait_until(lambda: (f := b.stats()["upload"])["backlog_bytes"] and f,
                     what="the backlog seen")
    assert fig["lag_seconds"] == fig["backlog_age_seconds"] < 2.5, fig
