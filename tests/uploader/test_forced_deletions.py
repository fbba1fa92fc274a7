"""Segments that ``retention_bytes`` deletes before they were uploaded: counted in the upload
figures (stats, $SYS, metrics), as docs/config.md says, and the warning of each says what is
true: their records were not uploaded *yet* (a batch being uploaded reads its segment through
a descriptor of its own, and may still land some of them)."""

from __future__ import annotations

import re
import time

from .test_uploader import publish, upload_config, wait_until

WARNING = re.compile(r"deleted segment .* before it was uploaded: .*; (\d+) of its records "
                     r"were not uploaded yet \(a batch being uploaded may still carry some of "
                     r"them; the batches' gaps tell what was lost\)")


def test_forced_deletions_are_counted_in_stats_sys_and_metrics(broker, tmp_path):
    # The landing folder is missing (not mounted yet): nothing is uploaded, retention forces.
    b = broker(upload=upload_config(tmp_path / "not-mounted", batch_max_age=1),
               log={"segment_bytes": 4096, "retention_bytes": 8192}, sys_interval=1,
               metrics={"listen": "127.0.0.1:0"})
    publish(b, 0, 200)                                   # about 30 KB: segments forced out
    b.wait_log(WARNING, timeout=30)
    fig = wait_until(lambda: (lambda f: f if f["forced_deletions"] == sum(
        bool(WARNING.search(line)) for line in b.logs) else None)(b.stats()["upload"]),
        what="the figures matching the warnings")
    said = [int(m.group(1)) for m in map(WARNING.search, b.logs) if m]
    assert fig["forced_deletions"] == len(said) >= 1
    assert fig["forced_deleted_records"] == sum(said) >= 1
    assert fig["uploaded_offset"] == 0
    from core.test_metrics import METRICS_RE, scrape
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    # the endpoint's snapshot is made every second
    wait_until(lambda: (lambda m: m.get(("edgebroker_upload_forced_deletions_total", None), 0)
                        >= len(said) and
                        m[("edgebroker_upload_forced_deleted_records_total", None)] >= sum(said)
                        )(scrape(f"http://{host}:{port}/metrics")), what="the metrics")
    watcher = b.client("sys-watcher")
    watcher.subscribe("$SYS/broker/upload/#")
    seen = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not {"forced_deletions",
                                                "forced_deleted_records"} <= seen.keys():
        p = watcher.recv_publish(timeout=5)
        seen[p.topic.rsplit("/", 1)[1]] = int(p.payload) if p.payload.isdigit() else p.payload
    assert seen["forced_deletions"] >= len(said) and seen["forced_deleted_records"] >= sum(said)
