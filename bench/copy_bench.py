#!/usr/bin/env python3
"""The large-message copy: is receiving a payload straight into the log's mapped pages cheaper?
(A standalone micro-benchmark; no broker, not part of `make test`.)

    .venv/bin/python bench/copy_bench.py                          # A B C A_fresh, 5 rounds
    .venv/bin/python bench/copy_bench.py --batch 16 --recycle     # the broker's batching; see below
    .venv/bin/python bench/copy_bench.py --variants A,B,B_nopf,A_sf,B_sf --rounds 3
    .venv/bin/python bench/copy_bench.py --dir /work --messages 10000 --json

``--batch K`` handles K frames per recvmsg_into / pwritev / sendmsg: the broker reads up to 16
alike large frames per read (``Decoder.repeat_buffers``) and writes the log once per loop pass
(in the large_64k shape about 15 records per write: the admin socket's ``log.writes``).

Three processes over loopback TCP: a sender writes ``messages`` 64 KiB MQTT-like QoS 0 PUBLISH
frames (fixed header + topic + payload) as fast as it can; the receiver (the process measured)
handles each frame as the broker's large-message path would; a discarding reader stands in for
the subscriber. For each frame the receiver does:

* ``A``      recvmsg_into a header buffer and a reused payload ``bytearray``; the record header
             (CRC32C over the payload, the C helper's ``record_header``) + client id + topic,
             then the payload, written with one ``os.pwritev`` at increasing positions of the
             segment file; the frame sent to the subscriber with ``sendmsg`` from the bytearray.
             Three copies: socket -> user, user -> page cache, user -> socket.
* ``A_fresh`` A with a new ``bytearray`` per frame, as the broker's decoder does
             (``Decoder.repeat_buffers``: ``bytearray(size)`` is zero-filled). The receiver
             keeps freed heap as the broker does (``keep_freed_memory``, server/app.py).
* ``B``      recvmsg_into a header buffer and a memoryview of a shared writable mmap of the
             segment file, at the record's payload position (the segment-ahead thread made the
             file, set its size, mapped it and pre-faulted its pages with MADV_POPULATE_WRITE);
             the record header (CRC over the mapped payload) + client id + topic stored through
             the mapping; no pwrite; the frame sent with ``sendmsg`` from the mapping.
             Two copies: socket -> page cache, page cache -> socket.
* ``B_nopf`` B without the pre-fault (the receiving thread takes the page faults).
* ``C``      A without the pwritev: recv + CRC + send, the lower bound (what the log write
             costs is A - C).
* ``A_sf``, ``B_sf``  A and B, but the payload is sent with ``os.sendfile`` from the segment
             file (the header with ``send(MSG_MORE)``), as ``write_file`` does for a backlog.

The file is split into segments of ``--segment-mib`` (the broker's default 16 MiB, 32-byte
segment header), made ``--ahead`` ahead by a segment-ahead thread in the receiving process (A:
created and ``fallocate(FALLOC_FL_KEEP_SIZE)``d as commitlog/spare.py does; B: also
``ftruncate``d to its full size, mapped and pre-faulted). A full segment is handed back to that
thread (B: unmapped, truncated to what it holds). Files are removed after each run (their dirty
pages are dropped, never written back: this measures CPU, not the disk).

Figures per run, over the timed messages (a warm-up segment first is not timed):
``cpu_us``   the receiving process's CPU time (all its threads: getrusage RUSAGE_SELF) per message;
``main_us``  the receiving thread's own (RUSAGE_THREAD), ``ahead_us`` the difference (the
             segment-ahead thread);
``MB/s``     payload bytes / wall time (two cores are shared by three busy processes: this is
             not the broker's throughput);
``minflt``   minor page faults per message.
On a virtual machine whose guest gives freed memory back to the host (free page reporting: dmesg
says "Free page reporting enabled"), the first write to a page the host took back costs a host
fault, counted as the guest's CPU time: every run's page cache is new memory, and that cost lands
on whichever thread first writes the page (A: the receiving thread's pwritev; B: the
segment-ahead thread's pre-fault). ``--recycle`` removes each full segment at once so that the
next segments reuse its memory (what a machine whose memory is not given back sees).

Variants alternate within each round (order reversed every other round); the summary gives the
median and the min-max over the rounds, and the median of the per-round differences to A.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import multiprocessing as mp
import os
import platform
import queue
import resource
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    from edgebroker import _native  # the C helper's CRC32C and record header (read only)
except Exception as exc:  # pragma: no cover - the benchmark runs without it, without CRCs
    _native = None
    _NATIVE_PROBLEM = str(exc)
else:
    _NATIVE_PROBLEM = ""

VARIANTS = ("A", "A_fresh", "B", "B_nopf", "C", "A_sf", "B_sf")
DEFAULT_VARIANTS = "A,B,C,A_fresh"
TOPIC = b"site/42/sensor/camera/frame"     # 27 bytes
CLIENT_ID = b"device-0042"
SEGMENT_HEADER = 32
RECORD_HEADER = 34
PREFIX = RECORD_HEADER + len(CLIENT_ID) + len(TOPIC)  # record bytes before the payload
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+
FALLOC_FL_KEEP_SIZE = 1
PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def populate_write(m: mmap.mmap, nbytes: int) -> bool:
    """Pre-fault ``m`` for writing (MADV_POPULATE_WRITE) through ctypes, which releases the
    GIL (``mmap.madvise`` holds it for the whole call: the receiving thread would stall)."""
    buf = (ctypes.c_char * nbytes).from_buffer(m)
    try:
        return _libc.madvise(ctypes.addressof(buf), nbytes, MADV_POPULATE_WRITE) == 0
    finally:
        del buf


def fallocate_keep_size(fd: int, nbytes: int) -> None:
    if _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, nbytes) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def frame_head(payload_size: int) -> bytes:
    """A QoS 0 PUBLISH's bytes before its payload."""
    return b"\x30" + varint(2 + len(TOPIC) + payload_size) + struct.pack(">H", len(TOPIC)) + TOPIC


# ----- the sender and the subscriber stand-in ---------------------------------------------

def run_sender(port: int, total: int, payload_size: int) -> None:
    payload = os.urandom(payload_size)
    frame = frame_head(payload_size) + payload
    per = 16
    chunk = frame * per
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    left = total
    while left >= per:
        s.sendall(chunk)
        left -= per
    if left:
        s.sendall(frame * left)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # the receiver closes when it is done
    s.close()


def run_discarder(conn) -> None:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    conn.send(ls.getsockname()[1])
    s, _ = ls.accept()
    buf = bytearray(1 << 20)
    n = 0
    while True:
        got = s.recv_into(buf)
        if not got:
            break
        n += got
    conn.send(n)


# ----- the receiver's segments -------------------------------------------------------------

class Segment:
    __slots__ = ("path", "fd", "map", "view", "used")

    def __init__(self, path: str, fd: int):
        self.path = path
        self.fd = fd
        self.map = None
        self.view = None
        self.used = 0


class Ahead(threading.Thread):
    """The segment-ahead thread: makes the next segments' files (``depth`` ahead), and retires
    full ones."""

    def __init__(self, directory: str, seg_bytes: int, mapped: bool, prefault: bool,
                 depth: int = 2, recycle: bool = False):
        super().__init__(daemon=True, name="segment-ahead")
        self.directory = directory
        self.seg_bytes = seg_bytes
        self.mapped = mapped
        self.prefault = prefault
        self.ready: queue.Queue = queue.Queue(maxsize=depth)
        self.retire: queue.Queue = queue.Queue()
        self.stop = False
        self.paths: list[str] = []
        self.n = 0
        self.error: BaseException | None = None
        self.populate_fallback = False
        self.recycle = recycle  # remove a full segment at once (not the first: it is verified)

    def make(self) -> Segment:
        path = os.path.join(self.directory, f"{self.n:020d}.seg")
        self.n += 1
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.paths.append(path)
        fallocate_keep_size(fd, self.seg_bytes)
        seg = Segment(path, fd)
        if self.mapped:
            # A mapping may not reach past the end of the file (SIGBUS): give the file its
            # full size first (the blocks are allocated: no ENOSPC, hence no SIGBUS, later).
            os.ftruncate(fd, self.seg_bytes)
            m = mmap.mmap(fd, self.seg_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if self.prefault:
                if not populate_write(m, self.seg_bytes):
                    self.populate_fallback = True
                    for p in range(0, self.seg_bytes, PAGE):  # write faults, page by page
                        m[p] = 0
            seg.map = m
        return seg

    def close(self, seg: Segment) -> None:
        if seg.map is not None:
            seg.map.close()
            os.ftruncate(seg.fd, seg.used)  # what the segment holds (the broker's seal)
        os.close(seg.fd)
        if self.recycle and seg.path != self.paths[0]:
            os.unlink(seg.path)  # its page cache is freed, and reused by the next segments

    def run(self) -> None:
        try:
            while not self.stop:
                try:
                    seg = self.retire.get_nowait()
                except queue.Empty:
                    pass
                else:
                    self.close(seg)
                    continue
                if not self.ready.full():
                    self.ready.put(self.make())
                    continue
                try:
                    seg = self.retire.get(timeout=0.05)
                except queue.Empty:
                    continue
                self.close(seg)
        except BaseException as exc:  # reported by the receiver
            self.error = exc
            raise

    def finish(self) -> None:
        self.stop = True
        self.join()
        while True:
            try:
                self.close(self.retire.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                self.close(self.ready.get_nowait())
            except queue.Empty:
                break


def rusage_pair():
    return resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)


def run_receiver(variant: str, total: int, warmup: int, payload_size: int, batch: int,
                 directory: str, seg_bytes: int, discard_port: int, crc: bool, verify: bool,
                 depth: int, recycle: bool, conn) -> None:
    if _native is not None:
        # As the broker does at start (server/app.py): freed payload buffers stay in the heap.
        _native.keep_freed_memory(8 << 20, 4 << 20)
    mapped = variant.startswith("B")
    use_file = variant != "C"
    sendfile = variant.endswith("_sf")
    fresh = variant == "A_fresh"
    rec_len = PREFIX + payload_size
    if rec_len + SEGMENT_HEADER > seg_bytes:
        raise SystemExit("a record does not fit a segment")
    head = frame_head(payload_size)
    hlen = len(head)
    ahead = None
    if use_file:
        ahead = Ahead(directory, seg_bytes, mapped, variant != "B_nopf", depth, recycle)
        ahead.start()
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    conn.send(ls.getsockname()[1])
    out = socket.create_connection(("127.0.0.1", discard_port))
    out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s, _ = ls.accept()
    recv_into = s.recvmsg_into
    sendmsg = out.sendmsg
    out_fd = out.fileno()
    header = _native.header_writer() if (crc and _native is not None) else None
    waitall = socket.MSG_WAITALL
    pwritev = os.pwritev

    heads = [bytearray(hlen) for _ in range(batch)]
    payloads = [bytearray(payload_size) for _ in range(batch)]
    seg: Segment | None = None
    offset = 0
    waits = 0
    wait_s = 0.0
    first_segment_path = None

    def next_segment():
        nonlocal seg, waits, wait_s, first_segment_path
        if seg is not None:
            if seg.view is not None:
                seg.view.release()
                seg.view = None
            ahead.retire.put(seg)
        try:
            seg = ahead.ready.get_nowait()
        except queue.Empty:
            waits += 1
            t = time.perf_counter()
            while True:
                try:
                    seg = ahead.ready.get(timeout=1.0)
                    break
                except queue.Empty:
                    if ahead.error is not None or not ahead.is_alive():
                        raise RuntimeError(f"segment-ahead thread failed: {ahead.error!r}")
            wait_s += time.perf_counter() - t
        if first_segment_path is None:
            first_segment_path = seg.path
        hdr = b"EDGEBLOG" + bytes(SEGMENT_HEADER - 8)  # (a stand-in segment header)
        if seg.map is not None:
            seg.view = memoryview(seg.map)
            seg.view[:SEGMENT_HEADER] = hdr
        else:
            os.pwrite(seg.fd, hdr, 0)
        seg.used = SEGMENT_HEADER

    def handle(k: int) -> None:
        """Receive, log and forward the next ``k`` frames."""
        nonlocal offset
        # Where each record goes (rolling as needed), and the buffers the frames land in.
        places = []
        if use_file:
            for i in range(k):
                if seg is None or seg.used + rec_len > seg_bytes:
                    if places:  # the records placed so far in the old segment: handle them first
                        break
                    next_segment()
                places.append((seg, seg.used))
                seg.used += rec_len
            k = len(places)
        iov = []
        targets = []
        for i in range(k):
            iov.append(heads[i])
            if mapped:
                sg, pos = places[i]
                t = sg.view[pos + PREFIX:pos + rec_len]
            elif fresh:
                t = bytearray(payload_size)
            else:
                t = payloads[i]
            iov.append(t)
            targets.append(t)
        want = k * (hlen + payload_size)
        n = recv_into(iov, 0, waitall)[0]
        if n != want:
            raise RuntimeError(f"short read: {n} of {want} bytes")
        for i in range(k):
            if heads[i] != head:
                raise RuntimeError("unexpected frame")
        if use_file:
            wparts = []
            wpos = places[0][1]
            sg = places[0][0]
            for i in range(k):
                t = targets[i]
                rh = header(offset, 1_700_000_000_000, 0, CLIENT_ID, TOPIC, t) if header else \
                    bytes(RECORD_HEADER)
                offset += 1
                if mapped:
                    pos = places[i][1]
                    v = sg.view
                    v[pos:pos + RECORD_HEADER] = rh
                    v[pos + RECORD_HEADER:pos + PREFIX] = CLIENT_ID + TOPIC
                else:
                    wparts.append(bytes(rh) + CLIENT_ID + TOPIC)
                    wparts.append(t)
            if not mapped:
                nbytes = k * rec_len
                if pwritev(sg.fd, wparts, wpos) != nbytes:
                    raise RuntimeError("short pwritev")
        elif header:
            for i in range(k):
                header(offset, 1_700_000_000_000, 0, CLIENT_ID, TOPIC, targets[i])
                offset += 1
        if sendfile:
            for i in range(k):
                sg, pos = places[i]
                out.send(heads[i], socket.MSG_MORE)
                off = pos + PREFIX
                left = payload_size
                while left:
                    m = os.sendfile(out_fd, sg.fd, off, left)
                    if m <= 0:
                        raise RuntimeError("sendfile sent nothing")
                    off += m
                    left -= m
        else:
            parts = []
            for i in range(k):
                parts.append(heads[i])
                parts.append(targets[i])
            sent = sendmsg(parts)
            if sent != want:  # a blocking socket sends everything unless interrupted
                rest = b"".join(bytes(p) for p in parts)[sent:]
                out.sendall(rest)
        if mapped:
            for t in targets:
                t.release()
        return k

    done = 0
    while done < warmup:
        done += handle(min(batch, warmup - done))
    r0, t0 = rusage_pair()
    w0 = time.perf_counter()
    waits0 = waits
    timed = 0
    while timed < total:
        timed += handle(min(batch, total - timed))
    w1 = time.perf_counter()
    r1, t1 = rusage_pair()
    waits_timed = waits - waits0
    # not timed from here on
    if seg is not None:
        if seg.view is not None:
            seg.view.release()
            seg.view = None
        ahead.retire.put(seg)
        seg = None
    if ahead is not None:
        ahead.finish()
    out.shutdown(socket.SHUT_WR)
    s.close()
    out.close()
    checked = None
    if verify and use_file and _native is not None and crc:
        checked = verify_segment(first_segment_path, payload_size)
    if ahead is not None:
        for p in ahead.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:  # (--recycle removed it)
                pass

    def cpu(r):
        return r.ru_utime + r.ru_stime

    proc = cpu(r1) - cpu(r0)
    main = cpu(t1) - cpu(t0)
    conn.send({
        "variant": variant,
        "messages": total,
        "cpu_us": proc / total * 1e6,
        "user_us": (r1.ru_utime - r0.ru_utime) / total * 1e6,
        "sys_us": (r1.ru_stime - r0.ru_stime) / total * 1e6,
        "main_us": main / total * 1e6,
        "main_sys_us": (t1.ru_stime - t0.ru_stime) / total * 1e6,
        "ahead_us": (proc - main) / total * 1e6,
        "mb_s": total * payload_size / (w1 - w0) / 1e6,
        "wall_s": w1 - w0,
        "minflt": (r1.ru_minflt - r0.ru_minflt) / total,
        "main_minflt": (t1.ru_minflt - t0.ru_minflt) / total,
        "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw,
        "segment_waits": waits_timed,
        "wait_s": wait_s,
        "populate_fallback": bool(ahead and ahead.populate_fallback),
        "verified_records": checked,
    })


def verify_segment(path: str, payload_size: int) -> int:
    """Check every record of one written segment (lengths and CRC32C): the variants must
    write the same valid records."""
    with open(path, "rb") as f:
        data = f.read()
    pos = SEGMENT_HEADER
    n = 0
    while pos + RECORD_HEADER <= len(data):
        crc, length = struct.unpack_from("<II", data, pos)
        if length != PREFIX + payload_size or pos + length > len(data):
            break
        if _native.crc32c(memoryview(data)[pos + 4:pos + length]) != crc:
            raise RuntimeError(f"{path}: bad CRC at {pos}")
        n += 1
        pos += length
    if pos != len(data) or n == 0:
        raise RuntimeError(f"{path}: {n} records, then {len(data) - pos} bytes not a record")
    return n


# ----- orchestration -----------------------------------------------------------------------

def one_run(ctx, variant: str, args, directory: str) -> dict:
    dparent, dchild = ctx.Pipe()
    discarder = ctx.Process(target=run_discarder, args=(dchild,), daemon=True)
    discarder.start()
    dport = dparent.recv()
    rparent, rchild = ctx.Pipe()
    receiver = ctx.Process(target=run_receiver, daemon=True, args=(
        variant, args.messages, args.warmup, args.payload, args.batch, directory,
        args.segment_mib << 20, dport, not args.no_crc, not args.no_verify, args.ahead,
        args.recycle, rchild))
    receiver.start()
    rport = rparent.recv()
    sender = ctx.Process(target=run_sender, daemon=True,
                         args=(rport, args.messages + args.warmup, args.payload))
    sender.start()
    if not rparent.poll(120):
        raise RuntimeError(f"{variant}: the receiver did not finish")
    result = rparent.recv()
    sender.join(30)
    receiver.join(30)
    received = dparent.recv() if dparent.poll(30) else None
    discarder.join(30)
    want = (args.messages + args.warmup) * (len(frame_head(args.payload)) + args.payload)
    if received != want:
        raise RuntimeError(f"{variant}: the subscriber got {received} of {want} bytes")
    return result


def summarize(results: list[dict], variants: list[str]) -> dict:
    by = {v: [r for r in results if r["variant"] == v] for v in variants}
    out = {}
    keys = ("cpu_us", "main_us", "ahead_us", "user_us", "sys_us", "mb_s", "minflt")
    for v, rs in by.items():
        out[v] = {k: (statistics.median(r[k] for r in rs), min(r[k] for r in rs),
                      max(r[k] for r in rs)) for k in keys}
        out[v]["segment_waits"] = sum(r["segment_waits"] for r in rs)
    if "A" in by:
        for v, rs in by.items():
            if v == "A":
                continue
            pairs = list(zip(by["A"], rs))
            for k in ("cpu_us", "main_us"):
                d = [a[k] - b[k] for a, b in pairs]
                out[v][f"A_minus_{k}"] = (statistics.median(d), min(d), max(d))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help=f"comma-separated, of {', '.join(VARIANTS)} (default {DEFAULT_VARIANTS})")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--messages", type=int, default=20_000, help="timed messages per run")
    ap.add_argument("--warmup", type=int, default=512, help="untimed messages first")
    ap.add_argument("--payload", type=int, default=64 * 1024)
    ap.add_argument("--batch", type=int, default=1,
                    help="frames per recvmsg_into / pwritev / sendmsg (the broker reads up to 16)")
    ap.add_argument("--segment-mib", type=int, default=16)
    ap.add_argument("--ahead", type=int, default=2, help="segments made (B: mapped and "
                    "pre-faulted) ahead")
    ap.add_argument("--recycle", action="store_true",
                    help="remove each full segment at once, so that its memory is reused (see the "
                    "note on virtual machines above)")
    ap.add_argument("--dir", default="/tmp", help="where the segment files go (a temp dir in it)")
    ap.add_argument("--no-crc", action="store_true", help="skip the record CRC32C")
    ap.add_argument("--no-verify", action="store_true", help="skip checking a written segment")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}")
    if _native is None and not args.no_crc:
        print(f"note: edgebroker._native not importable ({_NATIVE_PROBLEM}): no CRCs",
              file=sys.stderr)
        args.no_crc = True
    ctx = mp.get_context("fork")
    directory = tempfile.mkdtemp(prefix="copy-bench-", dir=args.dir)
    results = []
    started = time.time()
    try:
        for rnd in range(args.rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                r = one_run(ctx, v, args, directory)
                r["round"] = rnd
                results.append(r)
                if not args.json:
                    print(f"round {rnd} {v:8s} cpu {r['cpu_us']:6.1f} us/msg (main "
                          f"{r['main_us']:6.1f}, ahead {r['ahead_us']:5.1f}; user "
                          f"{r['user_us']:5.1f} sys {r['sys_us']:6.1f})  {r['mb_s']:7.1f} MB/s  "
                          f"minflt {r['minflt']:5.2f}/msg  waits {r['segment_waits']}",
                          flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    summary = summarize(results, variants)
    st = os.statvfs(args.dir)
    meta = {
        "argv": sys.argv, "seconds": round(time.time() - started, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "dir": args.dir,
        "fs_free_gb": round(st.f_bavail * st.f_frsize / 1e9, 1),
        "native": None if _native is None else _native.BACKEND,
        "crc": not args.no_crc, "batch": args.batch, "segment_mib": args.segment_mib,
        "ahead": args.ahead, "recycle": args.recycle,
        "payload": args.payload, "messages": args.messages, "rounds": args.rounds,
    }
    if args.json:
        print(json.dumps({"meta": meta, "runs": results, "summary": summary}, indent=1))
        return
    print(f"\n{meta}")
    print("\nmedian [min-max] over the rounds, per message")
    print(f"{'variant':8s} {'cpu us':>22s} {'main us':>22s} {'ahead us':>18s} {'sys us':>8s} "
          f"{'MB/s':>20s} {'minflt':>7s} {'A-x cpu':>20s} {'A-x main':>20s}")

    def f(t, w=6, d=1):
        return f"{t[0]:{w}.{d}f} [{t[1]:.{d}f}-{t[2]:.{d}f}]"

    for v in variants:
        s = summary[v]
        dc = f(s["A_minus_cpu_us"]) if "A_minus_cpu_us" in s else "-"
        dm = f(s["A_minus_main_us"]) if "A_minus_main_us" in s else "-"
        print(f"{v:8s} {f(s['cpu_us']):>22s} {f(s['main_us']):>22s} {f(s['ahead_us'], 4):>18s} "
              f"{s['sys_us'][0]:8.1f} {f(s['mb_s'], 6, 0):>20s} {s['minflt'][0]:7.2f} "
              f"{dc:>20s} {dm:>20s}")


if __name__ == "__main__":
    main()
