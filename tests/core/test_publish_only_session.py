"""A persistent session with no subscriptions of its own (a device that only publishes) can be
sent nothing from the log: offline, it has no cursor (core.sessions._go_offline), so it shows
no lag (``inspect sessions``, the lag figures) and holds no segment from retention; back and
subscribing, it is sent what follows the SUBSCRIBE, as any session in step."""

import json
import os
import time

import mqttraw as m
from conftest import run_cli, wait_for_snapshot


def test_an_offline_publish_only_session_shows_no_lag_and_holds_nothing(broker, uid):
    b = broker(log={"segment_bytes": 16384, "segment_ms": 1000, "retention_ms": 1000})
    data_dir = b.config["data_dir"]
    log_dir = os.path.join(data_dir, "log")
    dev = b.client(f"{uid}-dev", clean=False)
    dev.publish(f"{uid}/t", b"hello", qos=1)
    dev.disconnect()
    assert b.wait_log(lambda ln: f"'{uid}-dev'" in ln and "disconnected" in ln)
    pub = b.client(f"{uid}-p")
    n = 5000
    pub.send(b"".join(m.publish(f"{uid}/t", b"%04d" % i + b"." * 100, qos=1, packet_id=1 + i)
                      for i in range(n - 1)))
    pub.publish(f"{uid}/t", b"last", qos=1)     # acknowledged: every record is written

    stats = b.stats()
    assert (stats["sessions_behind"], stats["lag_records_max"]) == (0, 0), stats
    wait_for_snapshot(data_dir, f"{uid}-dev")
    out = run_cli("inspect", "sessions", "--data-dir", data_dir, "--format", "json")
    assert out.returncode == 0, out.stderr
    (s,) = [s for s in json.loads(out.stdout)["sessions"] if s["client_id"] == f"{uid}-dev"]
    assert s["cursor"] is None and (s["lag_records"], s["lag_bytes"]) == (0, 0), s

    # Age retention deletes the first segment (its records are past retention_ms): the
    # device does not hold it.
    first = "00000000000000000000.seg"
    deadline = time.monotonic() + 10
    while first in os.listdir(log_dir):
        assert time.monotonic() < deadline, sorted(os.listdir(log_dir))
        time.sleep(0.1)
        pub.publish(f"{uid}/other", b"rolls the tail segment", qos=1)
    assert b.stats()["dropped"].get("log_gap", 0) == 0

    back = b.client(f"{uid}-dev", clean=False)
    back.subscribe(f"{uid}/t", qos=1)
    pub.publish(f"{uid}/t", b"after", qos=1)
    assert back.recv_publish().payload == b"after"
    assert back.ping() == []
