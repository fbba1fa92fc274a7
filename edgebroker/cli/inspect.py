"""`edgebroker inspect`: look at the commit log in a data directory, offline or while the
broker runs (read-only: nothing is locked or changed).

    inspect segments                     one line per segment file
    inspect topics [--filter F]          per topic: messages, payload bytes, last seen
    inspect tail [--topic F] [--from OFFSET | --since TIME] [-n N] [--follow]
    inspect verify                       check every record's CRC and the session snapshot;
                                         exit 1 on damage

All take ``--data-dir DIR`` (default: as ``serve``: the config file's ``data_dir``, else
$STATE_DIRECTORY, else ./edgebroker-data; the log is ``DIR/log``) and ``--format text|json``.
Times are shown in UTC. ``inspect sessions`` (cli/inspect_sessions.py) reads the session
snapshot.

The same ``inspect`` parser also holds the live commands ``stats`` and ``clients``
(cli/inspect_live.py), which ask the running broker through its admin socket.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections import deque
from datetime import datetime, timezone

from edgebroker.cli import inspect_live, inspect_sessions
from edgebroker.cli.inspect_common import human_bytes, log_dir, open_log, out, table
from edgebroker.cli.options import UsageError, add_format, count
from edgebroker.cli.record_view import fmt_time, record_json, record_text

FOLLOW_POLL_SECONDS = 0.5
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def add_parser(commands) -> None:
    p = commands.add_parser("inspect", help="look at the commit log (offline or while running) "
                                            "and inside the running broker (stats, clients, "
                                            "bridges)")
    sub = p.add_subparsers(dest="inspect_command", metavar="WHAT", required=True)
    # Live commands: they ask the running broker through its admin socket.
    inspect_live.add_subcommands(sub)

    def common(sp):
        sp.add_argument("--data-dir", metavar="DIR", help="state directory (default: as serve)")
        sp.add_argument("-c", "--config", metavar="FILE", help="take data_dir from this config file")
        add_format(sp)

    sp = sub.add_parser("segments", help="segment files: offsets, records, bytes, times, uploaded")
    common(sp)
    sp.set_defaults(run=run_segments)

    sp = sub.add_parser("topics", help="topics: messages, payload bytes, last seen")
    common(sp)
    sp.add_argument("--filter", metavar="FILTER", help="only topics matching this MQTT filter")
    sp.set_defaults(run=run_topics)

    sp = sub.add_parser("tail", help="print records (the last ones, or from an offset or time)")
    common(sp)
    sp.add_argument("--topic", metavar="FILTER", help="only records whose topic matches this filter")
    start = sp.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_offset", type=int, metavar="OFFSET",
                       help="start at this offset (0 or more; the last N records: -n N)")
    start.add_argument("--since", metavar="TIME",
                       help="start at the first record at or after TIME: ISO 8601 (UTC unless it "
                            "has a zone), milliseconds since the epoch, or an age like 10m, 2h, 1d")
    sp.add_argument("-n", "--lines", type=int, default=10, metavar="N",
                    help="without --from/--since: the last N records (default 10)")
    sp.add_argument("-f", "--follow", action="store_true", help="keep printing new records")
    sp.add_argument("--max-payload", type=count, default=200, metavar="CHARS",
                    help="text format: cut payloads longer than this (0: never)")
    sp.set_defaults(run=run_tail)

    sp = sub.add_parser("verify", help="check every record's checksum and the session "
                                       "snapshot; exit 1 on damage")
    common(sp)
    sp.set_defaults(run=run_verify)

    inspect_sessions.add_subcommand(sub, common)


# ---------------------------------------------------------------------------------- helpers

def parse_time(text: str, now_ms: int) -> int:
    """Milliseconds since the epoch from ISO 8601, epoch milliseconds, or an age (``10m``)."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return int(text)
    m = _RELATIVE.match(text)
    if m:
        return now_ms - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r}: expected ISO 8601 (2024-05-01T12:00:00Z), "
                              f"milliseconds since the epoch, or an age like 10m, 2h, 1d") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def check_filter(text: str, option: str) -> bytes:
    from edgebroker.errors import ProtocolError
    from edgebroker.mqtt.topics import validate_topic_filter
    try:
        validate_topic_filter(text)
    except ProtocolError as exc:
        raise UsageError(f"{option} {text!r}: {exc}") from None
    return text.encode("utf-8")


# ---------------------------------------------------------------------------------- segments

def run_segments(args) -> int:
    log = open_log(args)
    try:
        infos = log.segments()
    finally:
        log.close()
    for s in infos:
        s.index_bytes = _index_size(s)
    if args.format == "json":
        out(json.dumps([{
            "base_offset": s.base_offset, "last_offset": s.next_offset - 1 if s.records else None,
            "records": s.records, "bytes": s.size_bytes, "index_bytes": s.index_bytes,
            "first_timestamp_ms": s.first_timestamp_ms, "last_timestamp_ms": s.last_timestamp_ms,
            "uploaded": s.uploaded, "active": s.active, "path": s.path,
        } for s in infos], indent=2))
        return 0
    rows = [["BASE", "LAST", "RECORDS", "BYTES", "FIRST TIME", "LAST TIME", "UPLOADED", "STATE"]]
    for s in infos:
        rows.append([str(s.base_offset), str(s.next_offset - 1) if s.records else "-",
                     str(s.records), str(s.size_bytes), fmt_time(s.first_timestamp_ms),
                     fmt_time(s.last_timestamp_ms), "yes" if s.uploaded else "no",
                     "active" if s.active else "sealed"])
    out(table(rows, right={0, 1, 2, 3}))
    total = sum(s.size_bytes + s.index_bytes for s in infos)
    out(f"{len(infos)} segments, {sum(s.records for s in infos)} records, "
         f"{human_bytes(total)} on disk with indexes")
    return 0


def _index_size(info) -> int:
    """The size of the segment's index file on disk: the log counts the active segment's only
    once it has written to it (0 before), while its file is grown 64 KiB ahead."""
    from edgebroker.commitlog.format import INDEX_SUFFIX, SEGMENT_SUFFIX
    try:
        return os.stat(info.path.removesuffix(SEGMENT_SUFFIX) + INDEX_SUFFIX).st_size
    except OSError:
        return info.index_bytes


# ------------------------------------------------------------------------------------ topics

def run_topics(args) -> int:
    flt = check_filter(args.filter, "--filter") if args.filter else None
    log = open_log(args)
    stats: dict[bytes, list[int]] = {}
    try:
        records = log.scan(flt) if flt is not None else log.read_range(log.first_offset)
        for r in records:
            s = stats.get(r.topic)
            if s is None:
                stats[r.topic] = [1, len(r.payload), r.timestamp_ms]
            else:
                s[0] += 1
                s[1] += len(r.payload)
                if r.timestamp_ms > s[2]:
                    s[2] = r.timestamp_ms
    finally:
        log.close()
    items = sorted(stats.items())
    if args.format == "json":
        out(json.dumps([{"topic": t.decode("utf-8", "replace"), "messages": n, "bytes": b,
                          "last_timestamp_ms": ts} for t, (n, b, ts) in items], indent=2))
        return 0
    rows = [["TOPIC", "MESSAGES", "BYTES", "LAST SEEN"]]
    rows += [[t.decode("utf-8", "replace"), str(n), str(b), fmt_time(ts)] for t, (n, b, ts) in items]
    out(table(rows, right={1, 2}))
    out(f"{len(items)} topics, {sum(n for n, _, _ in stats.values())} messages")
    return 0


# -------------------------------------------------------------------------------------- tail

def run_tail(args) -> int:
    flt = check_filter(args.topic, "--topic") if args.topic else None
    if args.lines < 0:
        raise UsageError(f"--lines {args.lines}: must be 0 or more")
    if args.from_offset is not None and args.from_offset < 0:   # (it read from offset 0)
        raise UsageError(f"--from {args.from_offset}: must be 0 or more "
                         f"(the last N records: -n N)")
    since = parse_time(args.since, int(time.time() * 1000)) if args.since else None
    log = open_log(args)
    show = (lambda r: record_json(r)) if args.format == "json" else \
        (lambda r: record_text(r, args.max_payload))
    try:
        if args.from_offset is not None:
            records = log.scan(flt, start=args.from_offset) if flt else log.read_range(args.from_offset)
        elif since is not None:
            records = (r for r in log.read_since(since) if flt is None or _matches(flt, r.topic))
        elif flt is not None:
            records = deque(log.scan(flt), maxlen=args.lines)
        else:
            records = log.read_range(max(log.first_offset, log.next_offset - args.lines))
        # --follow goes on from the head, or from --from when that is further
        next_offset = max(log.next_offset, args.from_offset or 0)
        try:
            for r in records:
                out(show(r))
                next_offset = max(next_offset, r.offset + 1)
            sys.stdout.flush()
            while args.follow:
                time.sleep(FOLLOW_POLL_SECONDS)
                log.refresh()
                start = max(next_offset, log.first_offset)
                for r in (log.scan(flt, start=start) if flt else log.read_range(start)):
                    out(show(r))
                    next_offset = r.offset + 1
                next_offset = max(next_offset, log.next_offset)
                sys.stdout.flush()
        except KeyboardInterrupt:   # Ctrl-C or SIGTERM: the way to end --follow
            if args.follow:
                return 0
            raise                   # a dump cut short: 130 (cli/main.py)
    finally:
        log.close()
    return 0


def _matches(flt: bytes, topic: bytes) -> bool:
    from edgebroker import _native
    return _native.topic_matches(flt, topic)


# ------------------------------------------------------------------------------------ verify

class Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.enabled = stream.isatty()
        self.started = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        frac = done / total if total else 1.0
        rate = done / max(now - self.started, 1e-6) / 1e6
        bar = "#" * int(frac * 30)
        self.stream.write(f"\rverifying [{bar:<30}] {frac * 100:5.1f}%  {rate:7.1f} MB/s")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 70 + "\r")
            self.stream.flush()


def run_verify(args) -> int:
    log = open_log(args)
    # The report below says everything; the log's own warnings would repeat it.
    logging.getLogger("edgebroker.commitlog").setLevel(logging.ERROR)
    progress = Progress()
    try:
        report = log.verify(progress)
        log_end = log.next_offset
    finally:
        progress.finish()
        log.close()
    from edgebroker.cli import log_lock, snapshot_check
    state_dir = os.path.dirname(log_dir(args))
    ahead = snapshot_check.snapshot_ahead(state_dir, log_lock.held(log_dir(args)), log_end)
    damage = snapshot_check.snapshot_damage(state_dir)
    ok = report.ok and (damage is None or damage["unreadable"])
    if args.format == "json":
        def dmg(d):
            return {"path": d.path, "position": d.position, "bytes": d.length, "offset": d.offset,
                    "kind": d.kind}
        out(json.dumps({
            "ok": ok, "segments": report.segments, "records": report.records,
            "bytes": report.bytes, "seconds": round(report.seconds, 3),
            "damage": [dmg(d) for d in report.damage], "notes": [dmg(d) for d in report.notes],
            "index_problems": [{"path": p, "problem": m} for p, m in report.index_problems],
            "header_problems": [{"path": p, "problem": m} for p, m in report.header_problems],
            "header_notes": [{"path": p, "problem": m} for p, m in report.header_notes],
            "unreadable": [{"path": p, "from_offset": a, "to_offset": b}
                           for p, a, b in report.unreadable],
            "missing": [{"from_offset": a, "to_offset": b - 1, "after": p, "before": n}
                        for a, b, p, n in report.missing],
            "overlaps": [{"path": p, "from_offset": a, "to_offset": b, "next": n}
                         for p, a, b, n in report.overlaps],
            "past_end": [{"file": p, "value": v, "says": says, "from_offset": end,
                          "to_offset": v - 1, "log_ends_in": where}
                         for p, v, end, where, says in report.past_end],
            "snapshot_past_end": None if ahead is None else {
                "file": ahead[0], "log_next_offset": ahead[1], "from_offset": log_end,
                "to_offset": ahead[1] - 1},
            "snapshot_damage": damage,
        }, indent=2))
        return 0 if ok else 1
    for d in report.damage:
        out(f"DAMAGE {d.describe()}")
    for d in report.notes:
        out(f"note   {d.describe()}: being written, or left by a crash (the broker truncates "
             f"it at its next start)")
    for path, problem in report.index_problems:
        out(f"index  {path}: {problem}")
    for path, problem in report.header_problems:
        out(f"DAMAGE {path}: {problem}")
    for path, problem in report.header_notes:
        out(f"note   {path}: {problem} (the broker writes the header again at its next start)")
    for path, a, b in report.unreadable:
        out(f"DAMAGE {path}: no readable record (offsets {a} to {b}; the broker removes it at "
             f"its next start)")
    for a, b, before, after in report.missing:
        out(f"MISSING offsets {a} to {b - 1}: no segment holds them (between {before} and "
             f"{after})")
    for path, a, b, after in report.overlaps:
        out(f"OVERLAP {path} holds offsets {a} to {b}, which {after} holds too (segments in "
             f"name order must hold increasing offsets; the broker reads them from the later "
             f"one)")
    for path, value, end, where, says in report.past_end:
        then = ("gives new records these offsets" if says == "fsynced" else
                f"gives new records offsets from {value}: sessions count these as log_gap")
        out(f"LOST   offsets {end} to {value - 1}: {path} ({value}) says they were {says}, but "
             f"the log ends at {end} (in {where}; the last segment truncated or deleted since, "
             f"or the file is wrong); the broker's next start {then}")
    if ahead is not None:
        out(f"note   offsets {log_end} to {ahead[1] - 1}: the session snapshot {ahead[0]} was "
             f"taken at log offset {ahead[1]}, but the log ends at {log_end} (records not on "
             f"disk at a power cut or crash, or lost from the end since); the broker's next "
             f"start counts them lost to the sessions that had not read them")
    if damage is not None:
        out(snapshot_check.describe(damage))
    rate = report.bytes / max(report.seconds, 1e-9) / 1e6
    problems = [f"{len(report.damage)} region(s) cannot be read"] if report.damage else []
    if report.missing:
        problems.append(f"{len(report.missing)} offset range(s) missing between segments")
    if report.header_problems:
        problems.append(f"{len(report.header_problems)} segment header(s) damaged")
    if report.unreadable:
        problems.append(f"{len(report.unreadable)} segment(s) with no readable record")
    if report.overlaps:
        problems.append(f"{len({p for p, *_ in report.overlaps})} segment(s) overlapping the "
                        f"next")
    if report.past_end:
        problems.append(f"offsets {min(e[2] for e in report.past_end)} to "
                        f"{max(e[1] for e in report.past_end) - 1} lost from the end of the log")
    if not ok and damage is not None:
        problems.append("the session snapshot damaged")
    verdict = "OK" if ok else f"DAMAGED: {'; '.join(problems)}"
    out(f"{report.segments} segments, {report.records} records, {human_bytes(report.bytes)} "
         f"checked in {report.seconds:.2f} s ({rate:.0f} MB/s): {verdict}")
    return 0 if ok else 1
