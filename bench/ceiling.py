"""The ceilings of bench/run.py, measured before the scenarios (see bench/README.md,
"Generator ceiling" and "Log-disk ceiling"): the load generator against stand-ins for a broker
that do (almost) nothing, and what the brokers' state disk takes of the large-payload
scenario's log with no broker at all.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time

import brokers
import loadgen
from procs import CTX, Inbox, RunError, reap, spawn
from scenarios import (CONNECT_TIME_LIMIT, CONNECT_WINDOW, DEFAULT_TIME_LIMIT, EDGE_PAYLOAD,
                       GEN_PROCS, HOST, IDLE_GRACE, INFLIGHT_DEFAULT, READY_TIMEOUT, SCENARIOS,
                       V311_PLAIN, load_of, scaled, split)

# The log-disk ceiling copies edgebroker's default [log] settings and the shape of its writes.
LOG_SEGMENT = 16 << 20     # log.segment_bytes
LOG_RETENTION = 1 << 30    # log.retention_bytes
LOG_FLUSH_S = 0.1          # log.flush_interval_ms
LOG_RECORD_EXTRA = 53      # header (34), client id ("bpub-0-<pid>", about 12), topic "bench/0"
LOG_PASS = 4               # records per write: what one loop pass takes in at 64 KiB
SUB_QOS1_CEILING_MAX = 400_000   # messages for the QoS 1 subscriber's ceiling (at most)


# ----- generator ceiling ------------------------------------------------------------------------

def _subscriber_ceiling(n: int, limit: float, qos: int, feeder_extra: tuple,
                        sub_extra: tuple) -> tuple[dict, float]:
    """One subscriber process against a stand-in feeding it ``n`` messages: (its result,
    seconds from its first message to its last)."""
    with _listener() as listen:
        procs = []
        try:
            inbox = Inbox()
            go = CTX.Event()
            done = CTX.Event()
            done.set()
            procs.append(spawn(loadgen.feeder, listen, "bench/0", 64, n, limit, inbox.q, go,
                               *feeder_extra))
            procs.append(spawn(loadgen.subscriber, 0, HOST, listen.getsockname()[1], 1,
                               "bench/+", qos, n, limit, IDLE_GRACE, inbox.q, go, done,
                               *sub_extra))
            inbox.wait({"sub": 1}, READY_TIMEOUT)
            go.set()
            sub = inbox.wait({"sub": 1}, limit + 15.0, kind="result")["sub"][0]
        finally:
            reap(procs)
    return sub, (sub["last"] - sub["first"]) if sub["first"] is not None else 0


def ceiling(args, names: list[str], variant: tuple = V311_PLAIN) -> dict:
    """The generator against stand-ins for the broker that do (almost) nothing, for the parts
    of the generator the chosen scenarios use, its clients speaking ``variant``."""
    loadgen.use_protocol(*variant)
    specs = [SCENARIOS[n] for n in names]
    loads = [load_of(s) for s in specs if s["kind"] in ("pair", "versus", "backlog")]
    out = {}
    limit = args.time_limit or DEFAULT_TIME_LIMIT
    wanted = []
    if any(ld["qos"] == 0 and ld["pubs"] > 1 for ld in loads):
        wanted.append(("publishers_qos0", 4, 0, 0, "discard",
                       scaled(SCENARIOS["fanin_qos0"], args.scale)))
    if any(ld["qos"] == 1 and ld["window"] > 1 for ld in loads):
        wanted.append(("publishers_qos1_w100", 4, 1, 100, "ack",
                       scaled(SCENARIOS["fanin_qos1_batch"], args.scale)))
    if any(ld["qos"] == 1 and ld["window"] == 1 for ld in loads):
        wanted.append(("publisher_qos1_w1", 1, 1, 1, "ack",
                       scaled(SCENARIOS["throttled"]["load"], args.scale)))
    for label, npubs, qos, window, mode, n in wanted:
        with _listener() as listen:
            procs = []
            try:
                inbox = Inbox()
                go = CTX.Event()
                procs.append(spawn(loadgen.sink, listen, npubs, mode, limit, inbox.q))
                for i in range(npubs):
                    procs.append(spawn(loadgen.publisher, i, HOST, listen.getsockname()[1],
                                       f"bench/{i}", 64, qos, n, window, limit, inbox.q, go))
                inbox.wait({"pub": npubs}, READY_TIMEOUT)
                go.set()
                res = inbox.wait({"pub": npubs, "sink": 1}, limit + 15.0, kind="result")
            finally:
                reap(procs)
        pubs = res["pub"]
        sent = sum(p["sent"] for p in pubs)
        span = max(p["t_end"] for p in pubs) - min(p["t_start"] for p in pubs)
        out[label + " msg/s"] = round(sent / span, 1) if span > 0 else None

    if any(ld["qos"] == 0 for ld in loads):
        n = 4 * scaled(SCENARIOS["fanin_qos0"], args.scale)
        sub, span = _subscriber_ceiling(n, limit, 0, (), ())
        out["subscriber_qos0 msg/s"] = round(sub["count"] / span, 1) if span > 0 else None

    if any(ld.get("keyed") or ld["kind"] == "backlog" for ld in loads):
        # The keyed QoS 1 subscriber behind a window of INFLIGHT_DEFAULT: a broker that sends
        # the next messages as PUBACKs free the window cannot deliver faster than this.
        n = min(4 * scaled(SCENARIOS["burst_qos1"], args.scale), SUB_QOS1_CEILING_MAX)
        sub, span = _subscriber_ceiling(n, limit, 1, (INFLIGHT_DEFAULT,), (False, True))
        out[f"subscriber_qos1_w{INFLIGHT_DEFAULT} msg/s"] = (round(sub["unique"] / span, 1)
                                                             if span > 0 else None)

    idle = [s["conns"] for s in specs if s["kind"] == "idle"]
    if idle:
        out.update(_idle_ceiling(max(idle)))
    edge = [s["devices"] for s in specs if s["kind"] == "edge"]
    if edge:
        out.update(_edge_ceiling(max(edge), args))
    big = [s for s in specs if s["kind"] == "pair" and s["unit"] == "MB/s"]
    if big:
        out.update(log_disk_ceiling(scaled(big[0], args.scale), big[0]["payload"]))
    return out


def log_disk_ceiling(records: int, payload: int, directory: str | None = None) -> dict:
    """What the brokers' state disk takes of a log of ``records`` records of ``payload``
    bytes, written by plain ``pwritev`` calls (no broker, no per-record Python): the bytes
    edgebroker writes, ``LOG_PASS`` records per call, in ``LOG_SEGMENT`` files, the way
    edgebroker's log and flusher write them with their defaults. A second thread fdatasyncs the
    file being written every ``LOG_FLUSH_S``, and a full one once, then drops it from the page
    cache. Past ``LOG_RETENTION`` the writer deletes the oldest file while it is still open,
    and the second thread closes it, so that freeing its blocks (which can wait for the disk:
    a discard) does not hold the writer, as in edgebroker.

    Returns the payload MB/s the disk sustained (a broker that logs every byte forwards no
    faster) and the writing thread's CPU time per record (what the write alone costs the
    thread that makes it)."""
    root = tempfile.mkdtemp(prefix="bench-logdisk-", dir=directory or brokers.state_root()[0])
    chunk = os.urandom(payload + LOG_RECORD_EXTRA)
    parts = [chunk] * LOG_PASS
    lock = threading.Lock()
    # full: descriptors of files to sync once (kept open until deleted);
    # doomed: descriptors of deleted files, to close (in the pass after they were listed, so
    # never while the same pass syncs them)
    state = {"fd": -1, "full": [], "doomed": [], "stop": False, "error": None}

    def sync() -> None:
        while True:
            with lock:
                stop = state["stop"]
                full, state["full"] = state["full"], []
                doomed, state["doomed"] = state["doomed"], []
                fd = os.dup(state["fd"]) if state["fd"] >= 0 else -1
            try:
                for f in doomed:
                    os.close(f)
                for f in full:
                    os.fdatasync(f)
                    os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)
                if fd >= 0:
                    os.fdatasync(fd)
            except OSError as exc:
                state["error"] = exc
                return
            finally:
                if fd >= 0:
                    os.close(fd)
            if stop:
                return
            time.sleep(LOG_FLUSH_S)

    syncer = threading.Thread(target=sync, name="logdisk-sync")
    files: list[tuple[str, int]] = []    # (path, descriptor), oldest first
    written = position = 0
    total = records * len(chunk)
    try:
        syncer.start()
        cpu0 = time.thread_time()
        t0 = time.monotonic()
        while written < total and state["error"] is None:
            if state["fd"] < 0 or position + len(chunk) * LOG_PASS > LOG_SEGMENT:
                path = os.path.join(root, f"{written:020d}.seg")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
                files.append((path, fd))
                with lock:
                    if state["fd"] >= 0:
                        state["full"].append(state["fd"])
                    state["fd"] = fd
                position = 0
                while len(files) * LOG_SEGMENT > LOG_RETENTION:
                    old_path, old_fd = files.pop(0)
                    os.unlink(old_path)
                    with lock:
                        state["full"] = [f for f in state["full"] if f != old_fd]
                        state["doomed"].append(old_fd)
            n = os.pwritev(state["fd"], parts, position)
            position += n
            written += n
        with lock:
            state["stop"] = True
        syncer.join()
        elapsed = time.monotonic() - t0
        cpu = time.thread_time() - cpu0
    finally:
        with lock:
            state["stop"] = True
        if syncer.is_alive():
            syncer.join()
        with lock:
            for f in state["doomed"]:
                os.close(f)
        for path, fd in files:
            os.close(fd)
            os.unlink(path)
        os.rmdir(root)
    if state["error"] is not None:
        raise RunError(f"log-disk ceiling: {state['error']}")
    done = written / len(chunk)
    size = f"{payload >> 10} KiB" if payload >= 1024 else f"{payload} B"
    return {f"log disk, {size} records MB/s": round(done * payload / elapsed / 1e6, 1),
            "log disk write CPU us/record": round(1e6 * cpu / done, 1)}


class _listener:
    """A listening socket on loopback for a stand-in broker, closed on exit."""

    def __init__(self, backlog: int = 1024):
        self.sock = socket.socket()
        self.backlog = backlog

    def __enter__(self) -> socket.socket:
        self.sock.bind((HOST, brokers.free_port()))
        self.sock.listen(self.backlog)
        return self.sock

    def __exit__(self, *exc) -> None:
        self.sock.close()


def _idle_ceiling(n: int) -> dict:
    """Connect rate of the idle-client processes against a stand-in that only answers."""
    brokers.raise_nofile(n + 1000)
    with _listener() as listen:
        procs = []
        release = CTX.Event()
        try:
            inbox = Inbox()
            go = CTX.Event()
            sweep = CTX.Event()
            procs.append(spawn(loadgen.acceptor, listen, n, CONNECT_TIME_LIMIT, inbox.q))
            shares = split(n, GEN_PROCS)
            for i, k in enumerate(shares):
                procs.append(spawn(loadgen.idle_clients, i, HOST, listen.getsockname()[1], k, 600,
                                   CONNECT_WINDOW, CONNECT_TIME_LIMIT, inbox.q, go, sweep,
                                   release))
            inbox.wait({"idle": len(shares)}, READY_TIMEOUT)
            go.set()
            conn = inbox.wait({"idle": len(shares)}, CONNECT_TIME_LIMIT, kind="connected")["idle"]
            sweep.set()
            inbox.wait({"idle": len(shares)}, CONNECT_TIME_LIMIT, kind="result")
            release.set()
            inbox.wait({"acceptor": 1}, 15.0, kind="result")
        finally:
            release.set()
            reap(procs)
    span = max(c["t_end"] for c in conn) - min(c["t_start"] for c in conn)
    return {f"connect_{n} conn/s": round(n / span, 1) if span > 0 else None}


def _edge_ceiling(n: int, args) -> dict:
    """The device processes against a stand-in that answers PUBACKs: how late their schedule
    runs when the broker costs nothing (3 s of sending)."""
    brokers.raise_nofile(n + 1000)
    seconds = 3
    with _listener() as listen:
        procs = []
        try:
            inbox = Inbox()
            go = CTX.Event()
            start_at = CTX.Value("d", 0.0, lock=False)
            procs.append(spawn(loadgen.acceptor, listen, n, CONNECT_TIME_LIMIT + seconds + 15,
                               inbox.q))
            for i in range(GEN_PROCS):
                procs.append(spawn(loadgen.devices, i, HOST, listen.getsockname()[1], GEN_PROCS,
                                   n, seconds, EDGE_PAYLOAD, CONNECT_WINDOW, inbox.q, go,
                                   start_at, CONNECT_TIME_LIMIT))
            inbox.wait({"dev": GEN_PROCS}, CONNECT_TIME_LIMIT + 5.0)
            start_at.value = time.monotonic() + 0.2
            go.set()
            devs = inbox.wait({"dev": GEN_PROCS}, seconds + loadgen.ACK_GRACE + 10.0,
                              kind="result")["dev"]
        finally:
            reap(procs)
    late = [d["late_ms"] for d in devs if d["late_ms"]]
    return {f"edge_{n} late p99 ms": round(max(x["p99"] for x in late), 3) if late else None,
            f"edge_{n} late max ms": round(max(x["max"] for x in late), 3) if late else None,
            f"edge_{n} busy % per process": max(round(d["busy_pct"], 1) for d in devs)}
