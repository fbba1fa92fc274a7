#!/usr/bin/env python3
"""edgebroker vs Mosquitto, side by side on one machine, in one run (see bench/README.md).

    python3 bench/run.py [--scenarios fanin_qos0,edge_10000,...] [--rounds 3]
                         [--brokers edgebroker,mosquitto] [--scale 1.0] [--list]
                         [--protocol 4|5|4,5] [--properties none,message,subid,all]

Loopback only; every run is bounded in message count and time; every child
process (brokers, publishers, subscribers, clients) is stopped at the end, also on
error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import brokers  # noqa: E402
import ceiling  # noqa: E402
import report  # noqa: E402
import runners  # noqa: E402
import scenarios  # noqa: E402
import wire  # noqa: E402
from procs import RunError, reap, stop_brokers  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

RESULTS_MD = os.path.join(HERE, "RESULTS.md")
NOFILE = 65536     # open files wanted for this process and everything it starts (inherited)


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


# ----- machine description ---------------------------------------------------------------------

def machine(mosquitto_bin) -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("model name", "hardware", "cpu model"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", brokers.REPO, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
        # The suite's own output (RESULTS.md, plots) does not make the measured code dirty.
        dirty = subprocess.run(["git", "-C", brokers.REPO, "status", "--porcelain",
                                "--untracked-files=no", "--", ".", ":!bench/RESULTS.md",
                                ":!bench/plots"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.TimeoutExpired):
        commit = "unknown"
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "mosquitto": brokers.mosquitto_version(mosquitto_bin),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "edgebroker_commit": commit,
    }


# ----- main ------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset of: " + ", ".join(SCENARIOS))
    p.add_argument("--rounds", type=int, default=3, help="A B rounds per scenario (default 3)")
    p.add_argument("--brokers", default="edgebroker,mosquitto",
                   help="comma-separated subset of: edgebroker, mosquitto")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every message count and the edge workload's 30 s by this "
                        "(default 1.0; connection counts stay)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds a run's publishers may send for (default: the scenario's, "
                        f"{scenarios.DEFAULT_TIME_LIMIT:g} s unless it says otherwise)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the generator ceiling")
    p.add_argument("--results", default=os.path.join(HERE, "results"),
                   help="directory of the <date>.jsonl files")
    p.add_argument("--results-md", choices=("auto", "always", "never"), default="auto",
                   help="update the generated section of bench/RESULTS.md: auto = only after "
                        "a full run (every scenario, both brokers, scale 1, 3+ rounds)")
    p.add_argument("--acl", metavar="FILE",
                   help="run both brokers with this ACL file (Mosquitto's format; the load "
                        "generator's clients are anonymous)")
    p.add_argument("--inflight", type=int, metavar="N",
                   help="max_inflight_messages for both brokers in every scenario (default: "
                        "20 for both, Mosquitto's default and edgebroker's)")
    p.add_argument("--protocol", default="4",
                   help="MQTT version of the load generator's clients: 4 (3.1.1, the default), "
                        "5 (5.0), or 4,5: each scenario and round runs with both, side by side "
                        "(also written 3.1.1 and 5.0)")
    p.add_argument("--properties", default="none",
                   help="what 5.0 clients send (comma-separated, one set of runs each): none "
                        "(empty property sections, the default), message (every PUBLISH with a "
                        "Content Type and one User Property), subid (a Subscription Identifier "
                        "on every SUBSCRIBE, which the broker adds to what it sends), all "
                        "(message and subid)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = p.parse_args(argv)
    levels = []
    for item in (x.strip() for x in args.protocol.split(",") if x.strip()):
        level = {"4": 4, "3.1.1": 4, "5": 5, "5.0": 5}.get(item)
        if level is None:
            p.error(f"--protocol {item}: 4 (3.1.1) or 5 (5.0)")
        if level not in levels:
            levels.append(level)
    flavours = [x.strip() for x in args.properties.split(",") if x.strip()]
    bad = [f for f in flavours if f not in wire.FLAVOURS]
    if bad or not flavours or not levels:
        p.error(f"--properties: one or more of {', '.join(wire.FLAVOURS)}")
    if 5 not in levels and flavours != ["none"]:
        p.error("--properties applies to 5.0 clients: add --protocol 5 (or 4,5)")
    args.variants = [(level, f) for level in levels for f in (flavours if level == 5 else ["none"])]
    if args.acl:
        if not os.path.isfile(args.acl):
            p.error(f"--acl {args.acl}: no such file")
        brokers.ACL_FILE = os.path.abspath(args.acl)
    args.scenario_list = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenario_list if s not in SCENARIOS]
    if unknown or not args.scenario_list:
        p.error(f"unknown scenario(s): {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    args.broker_list = [b.strip() for b in args.brokers.split(",") if b.strip()]
    bad = [b for b in args.broker_list if b not in brokers.BROKERS]
    if bad or not args.broker_list:
        p.error(f"unknown broker(s): {', '.join(bad)}")
    if not 1 <= args.rounds <= 50:
        p.error("--rounds must be 1..50")
    if not 0 < args.scale <= 10:
        p.error("--scale must be in (0, 10]")
    if args.time_limit is not None and not 1 <= args.time_limit <= 300:
        p.error("--time-limit must be 1..300 s")
    if args.inflight is not None:
        if not 1 <= args.inflight <= 65535:
            p.error("--inflight must be 1..65535")
        brokers.INFLIGHT = args.inflight
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for name, spec in SCENARIOS.items():
            print(f"{name:<17} {spec['about']}")
        return 0
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.monotonic()
    try:
        return _main(args, started)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping brokers and load generators", file=sys.stderr)
        return 130
    finally:
        reap(timeout=1.0)
        stop_brokers()
        print(f"(total {time.monotonic() - started:.0f} s)", file=sys.stderr)


def _main(args, started: float) -> int:
    if "mosquitto" in args.broker_list:
        brokers.Mosquitto.binary = brokers.ensure_mosquitto()
        if not brokers.Mosquitto.binary:
            print("warning: mosquitto unavailable; running edgebroker only", file=sys.stderr)
            args.broker_list = [b for b in args.broker_list if b != "mosquitto"]
            if not args.broker_list:
                return 1
    nofile = brokers.raise_nofile(NOFILE)
    info = machine(brokers.Mosquitto.binary or brokers.mosquitto_path())
    state_dir, state_fs = brokers.state_root()
    info.update(nofile=nofile, state_dir=f"{state_dir} ({state_fs})")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    print(f"limits: Mosquitto {brokers.LIMITS}, edgebroker {brokers.EDGEBROKER_LIMITS or 'its defaults'} "
          f"(and each scenario's own)"
          + (f"; max_inflight_messages {brokers.INFLIGHT} for both" if brokers.INFLIGHT else "")
          + "; loopback only; scale "
          f"{args.scale:g}; rounds {args.rounds}"
          + (f"; time limit {args.time_limit:g} s per run" if args.time_limit else "")
          + (f"; ACL file {brokers.ACL_FILE}" if brokers.ACL_FILE else "")
          + "; MQTT " + ", ".join(scenarios.variant_label(*v) for v in args.variants),
          flush=True)

    day = datetime.date.today().isoformat()
    os.makedirs(args.results, exist_ok=True)
    out_path = os.path.join(args.results, f"{day}.jsonl")
    run_id = datetime.datetime.now().isoformat(timespec="seconds")

    gens = {}
    for variant in ([] if args.no_ceiling else args.variants):
        label = scenarios.variant_label(*variant)
        try:
            gen = gens[variant] = ceiling.ceiling(args, args.scenario_list, variant)
            print("generator ceiling (stand-ins instead of a broker"
                  + (f"; MQTT {label}" if args.variants != [scenarios.V311_PLAIN] else "")
                  + "): " + "; ".join(f"{k} {report.fmt(v)}" for k, v in gen.items()),
                  flush=True)
        except (RunError, OSError, RuntimeError) as exc:
            print(f"generator ceiling ({label}) failed: {exc}", file=sys.stderr)
    gen = gens.get(args.variants[0])

    records = []
    with open(out_path, "a") as out:
        for name in args.scenario_list:
            print(f"\n{name}: {SCENARIOS[name]['about']}", flush=True)
            for rnd in range(1, args.rounds + 1):
                for variant in args.variants:
                    label = ("" if args.variants == [scenarios.V311_PLAIN]
                             else f" {scenarios.variant_label(*variant):<7}")
                    for bname in args.broker_list:
                        if bname not in SCENARIOS[name].get("brokers", (bname,)):
                            continue       # not for this broker (bridge_drain: the remote)
                        try:
                            rec = runners.run(name, brokers.BROKERS[bname], rnd, args, variant)
                        except (RunError, OSError, RuntimeError) as exc:
                            rec = {"scenario": name, "kind": SCENARIOS[name]["kind"],
                                   "broker": bname, "round": rnd, "protocol": variant[0],
                                   "properties": variant[1], "error": str(exc)[:2000]}
                        print(f"  round {rnd} {bname:<10}{label} {report.describe(rec)}",
                              flush=True)
                        rec.update(run=run_id, date=day, machine=info,
                                   generator_ceiling=gens.get(variant), scale=args.scale,
                                   rounds=args.rounds)
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                        records.append(rec)

    elapsed = time.monotonic() - started
    rows = report.summarize(records, args.scenario_list, args.broker_list, args.variants)
    print("\nsummary (median/min/max over rounds; edge/mosq = edgebroker median / mosquitto "
          "median; target and met: the issues' targets, checked on edgebroker's figures)")
    print(report.text_table(rows))
    if len(args.variants) > 1:
        print("\nMQTT versions side by side (ratios of the medians above; loss: the worst "
              "round's %)")
        print(report.text_table(report.version_rows(rows, args.variants),
                                report.VERSION_COLUMNS))
    print(f"\nelapsed {elapsed:.0f} s ({elapsed / 60:.1f} min); results appended to "
          f"{os.path.relpath(out_path)}")
    full = (set(args.scenario_list) == set(SCENARIOS) and len(args.broker_list) == 2
            and args.scale == 1.0 and args.rounds >= 3 and not args.time_limit
            and args.variants == [scenarios.V311_PLAIN])
    if args.results_md == "always" or (args.results_md == "auto" and full):
        report.update_results_md(RESULTS_MD, results_section(args, info, gen, rows, run_id,
                                                             elapsed))
        print(f"updated {os.path.relpath(RESULTS_MD)}")
    elif args.results_md == "auto":
        print("bench/RESULTS.md not updated (only after a full run; --results-md always forces it)")
    return 1 if any("error" in r or r.get("value") is None for r in records) else 0


def results_section(args, info: dict, gen, rows: list, run_id: str, elapsed: float) -> str:
    cmd = "python3 bench/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return "\n".join([
        "## Latest suite run (edgebroker next to Mosquitto)",
        "",
        f"Run {run_id}, `{cmd.strip()}`, {elapsed / 60:.1f} min, scale {args.scale:g}, "
        f"{args.rounds} rounds (A B alternating).",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".",
        "",
        ("Generator ceiling (stand-ins instead of a broker): "
         + "; ".join(f"{k} {report.fmt(v)}" for k, v in gen.items()) + ".") if gen else
        "Generator ceiling: not measured.",
        "",
        report.markdown_table(rows),
        "",
        "Median, min, max over the rounds; `edge/mosq` is the ratio of the medians; `target` "
        "and `met` check edgebroker against the targets of issues 6 and 4 (bench/README.md "
        "says what each figure means). The machine is shared: compare ratios, not absolute "
        "numbers across runs.",
    ])


if __name__ == "__main__":
    sys.exit(main())
