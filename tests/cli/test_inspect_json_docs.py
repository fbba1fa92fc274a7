"""What `inspect stats|clients --format json` print, and the names of the admin socket's
`stats.counters` beside the Prometheus metrics, as docs/metrics.md says them (ops5: the doc
said the broker's whole reply was printed, so `jq .stats.counters` got null; and that the
counters had the metrics' names, which two do not)."""

from __future__ import annotations

import json
import re
import urllib.request

from conftest import REPO, run_cli

DOC = (REPO / "docs" / "metrics.md").read_text()
METRICS_RE = re.compile(r"metrics on http://([0-9.]+):(\d+)/metrics")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_json_is_the_object_inside_the_reply_as_documented(broker):
    b = broker()
    data = b.config["data_dir"]
    r = run_cli("inspect", "stats", "--data-dir", data, "--format", "json")
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert set(printed) == set(b.stats()) and "counters" in printed and "ok" not in printed
    r = run_cli("inspect", "clients", "--data-dir", data, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)) == {"total", "clients"}
    doc = _flat(DOC)
    assert "`--format json` prints the broker's JSON reply" not in doc
    assert ("`inspect stats` the `stats` object (`{\"version\": ..., \"counters\": {...}, "
            "...}`" in doc and "`.stats.counters`" in doc), "docs/metrics.md"
    assert "`inspect clients` `{\"total\": N, \"clients\": [row, ...]}`" in doc


def test_each_counter_is_the_metric_of_its_name_or_as_documented(broker):
    b = broker(metrics={"listen": "127.0.0.1:0"})
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        metrics = set(re.findall(r"^# TYPE (\w+) counter$", resp.read().decode(), re.M))
    documented = dict(re.findall(r"`(\w+)` is `(edgebroker_\w+_total)`", _flat(DOC)))
    counters = b.stats()["counters"]
    renamed = {c: documented[c] for c in counters if f"edgebroker_{c}_total" not in metrics
               and c in documented}
    assert renamed == {"connects_accepted": "edgebroker_connections_accepted_total",
                       "takeovers": "edgebroker_session_takeovers_total"}, renamed
    assert set(renamed.values()) <= metrics
    unnamed = [c for c in counters if f"edgebroker_{c}_total" not in metrics
               and c not in renamed]
    assert not unnamed, f"stats.counters with no metric of that name: {unnamed}"
