#!/usr/bin/env python3
"""Draw one suite run from bench/results/*.jsonl as PNG files (``make bench-plot``).

    python3 bench/plot.py [--run RUN_ID] [--results bench/results] [--out bench/plots]

Without --run: the newest full run (every scenario, scale 1, 3+ rounds), else the newest
run at scale 1 with 3+ rounds (a full run from before newer scenarios), else the newest run.
Writes throughput.png (msg/s and MB/s scenarios, with and without the disturbance for
slow_consumer and throttled, and reconnect_backlog's drain rate), latency.png (the edge
workload's end-to-end latency) and idle.png (RSS per idle connection and connect rate).
Needs matplotlib.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from scenarios import EDGE_TARGET, RSS_PER_CONNECTION_MAX, SCENARIOS  # noqa: E402

COLORS = {"edgebroker": "#1f77b4", "mosquitto": "#ff7f0e"}


def load(results_dir: str) -> list[dict]:
    records = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.jsonl"))):
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    try:
                        records.append(json.loads(line))
                    except ValueError:
                        pass
    return records


def choose_run(records: list[dict], run_id: str | None) -> list[dict]:
    runs: dict[str, list] = {}
    for r in records:
        # The plots show the runs with MQTT 3.1.1 clients (run.py --protocol 5 runs are not drawn).
        if "run" in r and r.get("protocol", 4) == 4 and r.get("properties", "none") == "none":
            runs.setdefault(r["run"], []).append(r)
    if run_id:
        return runs.get(run_id, [])
    if not runs:
        return []
    big = [k for k, rs in runs.items()
           if all(r.get("scale") == 1.0 and (r.get("rounds") or 0) >= 3 for r in rs)]
    full = [k for k in big if {r["scenario"] for r in runs[k]} >= set(SCENARIOS)]
    # A run from before the newest scenarios were added still counts as a full run here.
    return runs[max(full or big or runs)]


def ok_values(recs: list[dict], name: str, broker: str, key) -> list[float]:
    out = []
    for r in recs:
        if r["scenario"] == name and r["broker"] == broker and "error" not in r:
            v = key(r)
            if v is not None:
                out.append(v)
    return out


def _brokers(recs):
    return [b for b in ("edgebroker", "mosquitto") if any(r["broker"] == b for r in recs)]


def _bars(ax, recs, name, series, ylabel, target=None, log=False, title=None,
          target_label="target"):
    """One group of bars per broker: the median per series, the rounds as dots."""
    brokers = _brokers(recs)
    width = 0.8 / max(1, len(series))
    for i, b in enumerate(brokers):
        for j, (label, key, hatch) in enumerate(series):
            vals = ok_values(recs, name, b, key)
            x = i + (j - (len(series) - 1) / 2) * width
            if vals:
                ax.bar(x, statistics.median(vals), width * 0.9, color=COLORS[b], hatch=hatch,
                       edgecolor="black", linewidth=0.5, alpha=0.85,
                       label=label if i == 0 and len(series) > 1 else None)
                ax.plot([x] * len(vals), vals, "k.", markersize=4)
            else:
                ax.text(x, 0, "failed", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(brokers)), brokers)
    ax.set_title(title or name, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    if log:
        ax.set_yscale("log")
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", linewidth=0.8, label=target_label)
    if len(series) > 1 or target is not None:
        ax.legend(fontsize=6)


def _grid(plt, n: int, width: float = 3.2, height: float = 2.8):
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat


def draw(recs: list[dict], out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    present = [n for n in SCENARIOS if any(r["scenario"] == n for r in recs)]
    run = recs[0].get("run", "?") if recs else "?"
    written = []

    def save(fig, fname, title):
        fig.suptitle(f"{title} — run {run} (median bars, dots = rounds)", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    thr = [n for n in present if SCENARIOS[n]["kind"] in ("pair", "versus", "backlog")]
    if thr:
        fig, axes = _grid(plt, len(thr))
        for ax, name in zip(axes, thr):
            unit = SCENARIOS[name]["unit"]
            if SCENARIOS[name]["kind"] == "versus":
                series = [("without", lambda r: r.get("value_without"), ""),
                          (f"with {SCENARIOS[name]['disturb']}", lambda r: r.get("value"), "//")]
            else:
                series = [(unit, lambda r: r.get("value"), "")]
            _bars(ax, recs, name, series, unit)
        save(fig, "throughput.png", "Throughput")

    edge = [n for n in present if SCENARIOS[n]["kind"] == "edge"]
    if edge:
        p99_max = next(c[3] for c in EDGE_TARGET if c[0] == "abs" and c[1] == "value")
        fig, axes = _grid(plt, 2 * len(edge))
        for k, name in enumerate(edge):
            series = [(p, (lambda p: lambda r: (r.get("latency_ms") or {}).get(p))(p), h)
                      for p, h in (("p50", ""), ("p99", "//"), ("max", ".."))]
            _bars(axes[2 * k], recs, name, series, "latency ms", target=p99_max, log=True,
                  target_label="p99 target")
            _bars(axes[2 * k + 1], recs, name,
                  [("cpu %", lambda r: r.get("broker_cpu_pct"), "")], "broker CPU %",
                  title=f"{name}: broker CPU %")
        save(fig, "latency.png", "Edge workload: end-to-end latency and broker CPU")

    idle = [n for n in present if SCENARIOS[n]["kind"] == "idle"]
    if idle:
        fig, axes = _grid(plt, 2 * len(idle))
        for k, name in enumerate(idle):
            _bars(axes[2 * k], recs, name, [("B/conn", lambda r: r.get("value"), "")],
                  "broker RSS per connection, bytes",
                  target=RSS_PER_CONNECTION_MAX if name == "idle_10000" else None,
                  target_label="target (max)")
            _bars(axes[2 * k + 1], recs, name,
                  [("conn/s", lambda r: r.get("connect_rate"), "")], "connections/s",
                  title=f"{name}: connect rate")
        save(fig, "idle.png", "Idle connections")
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--run", help="run id (the \"run\" field of the JSON lines)")
    p.add_argument("--out", default=os.path.join(HERE, "plots"))
    args = p.parse_args(argv)
    recs = choose_run(load(args.results), args.run)
    if not recs:
        print(f"no results in {args.results}" + (f" for run {args.run}" if args.run else ""),
              file=sys.stderr)
        return 1
    try:
        written = draw(recs, args.out)
    except ImportError:
        print("matplotlib is missing: make bench-plot installs it into .venv", file=sys.stderr)
        return 1
    print(f"run {recs[0].get('run')}: " + ", ".join(os.path.relpath(w) for w in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
