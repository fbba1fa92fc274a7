"""Load-generator processes: publishers, subscribers, and the sink/feeder used for the ceiling.

Each function is the body of one ``multiprocessing`` process (fork start method).
They talk to the orchestrator through one queue of tuples:
``("ready", role, idx)``, ``("result", role, idx, dict)``, ``("error", role, idx, text)``,
and wait for the shared ``go`` event before the clock starts. Everything is
bounded: every blocking call has a timeout derived from the run's deadline.
Clocks are ``time.monotonic()`` (CLOCK_MONOTONIC, comparable across processes).
"""

from __future__ import annotations

import array
import errno
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback

import wire

CONNECT_TIMEOUT = 10.0
GO_TIMEOUT = 60.0
CLOSE_GRACE = 5.0     # how long a finished publisher waits for the broker to close after DISCONNECT
# QoS 0 subscriber sockets wake up only once this many bytes are waiting (SO_RCVLOWAT), so a
# broker that writes one small packet at a time does not make the Python subscriber the
# bottleneck. A quiet spell of DRAIN_AFTER seconds reads whatever is left below the mark.
RCVLOWAT = 16 * 1024
DRAIN_AFTER = 0.002
# The edge workload's payload starts with: send time (time.monotonic_ns(): CLOCK_MONOTONIC is
# one clock for all processes of the machine), device number, sequence number; zeros follow.
STAMP = struct.Struct("!qII")

# What the clients speak (run.py --protocol, --properties): set with ``use_protocol`` by the
# orchestrator before it starts a run's generator processes, which inherit it (fork).
LEVEL = wire.V311
PUBLISH_PROPS: bytes | None = None   # 5.0: the property section of every PUBLISH sent
SUB_ID = 0             # 5.0: the Subscription Identifier of every SUBSCRIBE (0: none)
# 5.0: the Session Expiry Interval (s) of a session that outlives its connection (a client
# connecting with clean = False: reconnect_backlog's subscriber); 3.1.1 has clean session 0.
SESSION_EXPIRY = 3600


def use_protocol(level: int, flavour: str = "none") -> None:
    """Make the clients started from now on speak MQTT 3.1.1 (``level`` 4) or 5.0 (5), with
    ``flavour``'s properties (``wire.FLAVOURS``) on 5.0."""
    global LEVEL, PUBLISH_PROPS, SUB_ID
    if level not in (wire.V311, wire.V5):
        raise ValueError(f"protocol level {level}: 4 (3.1.1) or 5 (5.0)")
    LEVEL = level
    PUBLISH_PROPS, SUB_ID = wire.FLAVOURS[flavour] if level == wire.V5 else (None, 0)


def subscribe_frame(topic_filter: str, qos: int) -> bytes:
    """The SUBSCRIBE (packet id 1) a generator client sends, in the protocol in use."""
    return wire.subscribe(1, topic_filter, qos, LEVEL, SUB_ID)


def _child_setup() -> None:
    # Ctrl-C goes to the whole process group; the orchestrator cleans up its children.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _open(host: str, port: int, client_id: str, extra: bytes = b"", bufsize: int = 1 << 20,
          rcvbuf: int = 0, stamp_bytes: int = 0,
          clean: bool = True) -> tuple[socket.socket, wire.FrameCounter]:
    """Connect, send CONNECT (+ extra), wait for CONNACK (and a SUBACK when subscribing).

    ``rcvbuf``: SO_RCVBUF set before connecting (a small one makes a stuck subscriber stuck
    sooner); ``stamp_bytes``: see ``wire.FrameCounter``; ``clean``: the CONNECT's clean
    session flag (the CONNACK's session-present flag is left in ``counter.session_present``).
    """
    sock = socket.socket()
    try:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect((host, port))
    except OSError:
        sock.close()
        raise
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(wire.connect(client_id, clean=clean, level=LEVEL,
                              session_expiry=0 if clean else SESSION_EXPIRY) + extra)
    counter = wire.FrameCounter(ack=True, bufsize=bufsize, stamp_bytes=stamp_bytes, level=LEVEL)
    want = 2 if extra else 1
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while len(counter.control) < want:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        if counter.recv_from(sock) == 0:
            raise ConnectionError("closed by the broker during CONNECT/SUBSCRIBE")
    ptype, body = counter.control[0]
    if ptype != wire.CONNACK or wire.connack_code(body)[0] != 0:
        raise ConnectionError(f"CONNACK refused or unexpected packet: {ptype} {body!r}")
    counter.session_present = wire.connack_code(body)[1]
    if extra:
        ptype, body = counter.control[1]
        if ptype != wire.SUBACK or any(c >= 0x80 for c in wire.suback_codes(body, LEVEL)):
            raise ConnectionError(f"SUBSCRIBE refused: {ptype} {body!r}")
    counter.control.clear()
    return sock, counter


def _finish(sock: socket.socket, deadline: float) -> None:
    """DISCONNECT, half-close, and wait (bounded) until the peer closes too.

    Closing with unread bytes in flight could reset the connection and make the
    broker drop data it has not processed yet; waiting for its close avoids that.
    """
    try:
        sock.sendall(wire.DISCONNECT_BYTES)
        sock.shutdown(socket.SHUT_WR)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            if not sock.recv(65536):
                break
    except OSError:
        pass
    finally:
        sock.close()


# ----- publisher ----------------------------------------------------------------------------------

def publisher(idx: int, host: str, port: int, topic: str, payload_size: int, qos: int, count: int,
              window: int, time_limit: float, q, go, stop=None, role: str = "pub",
              keyed: bool = False) -> None:
    """Send ``count`` PUBLISHes (QoS 1: at most ``window`` unacknowledged) as fast as the broker
    takes them. With a ``stop`` event (QoS 0 only: the flooder next to a normal pair), it also
    ends when that is set, and then just closes its socket: a throttled flooder has megabytes
    in the socket buffers that the broker would read at its throttled rate before DISCONNECT.

    ``keyed`` (QoS 1 only): every payload starts with (``idx``, sequence number)
    (``wire.publish_run_keyed``), so that a keyed subscriber counts distinct messages and
    duplicates; all ``count`` frames are encoded before "ready"."""
    _child_setup()
    try:
        payload = b"x" * payload_size
        props = PUBLISH_PROPS
        if qos == 0:
            frame = wire.publish(topic, payload, props=props)
            flen = len(frame)
            per_batch = max(1, (64 * 1024) // flen)
            batch = frame * per_batch
            frames = None
        elif keyed:
            frames, flen = wire.publish_run_keyed(topic, payload_size, count, idx, props)
        else:
            frames, flen = wire.publish_run(topic, payload, 1, min(count, 65535), props)
        sock, _ = _open(host, port, f"b{role}-{idx}-{os.getpid()}")
        q.put(("ready", role, idx))
        if not go.wait(GO_TIMEOUT):
            sock.close()
            return
        t0 = time.monotonic()
        c0 = time.process_time()
        deadline = t0 + time_limit
        timed_out = stopped = False
        sent = acked = 0
        try:
            if stop is not None:
                sent, timed_out, stopped = _flood(sock, batch, flen, deadline, stop)
            elif qos == 0:
                full, rest = divmod(count, per_batch)
                for _ in range(full):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    sock.settimeout(left)
                    sock.sendall(batch)
                    sent += per_batch
                else:
                    if rest:
                        sock.sendall(frame * rest)
                        sent += rest
            else:
                sent, acked, timed_out = _publish_qos1(sock, frames, flen, count, window, deadline)
        except socket.timeout:
            timed_out = True
        t_sent = time.monotonic()
        if stopped:
            sock.close()
        else:
            _finish(sock, (deadline if not timed_out else t_sent) + CLOSE_GRACE)
        q.put(("result", role, idx, {"sent": sent, "acked": acked, "t_start": t0,
                                     "t_sent": t_sent, "t_end": time.monotonic(),
                                     "timed_out": timed_out, "stopped": stopped,
                                     "cpu": time.process_time() - c0}))
    except Exception:
        q.put(("error", role, idx, traceback.format_exc(limit=3)))


def _flood(sock, batch: bytes, flen: int, deadline: float, stop) -> tuple[int, bool, bool]:
    """Send ``batch`` over and over until ``stop`` is set or the deadline passes.

    ``send`` (not ``sendall``) so that no byte count is lost when a throttled socket blocks;
    returns (whole frames sent, timed out, stopped)."""
    view = memoryview(batch)
    size = len(batch)
    pos = total = 0
    sock.settimeout(0.2)
    while not stop.is_set():
        if time.monotonic() >= deadline:
            return total // flen, True, False
        try:
            n = sock.send(view[pos:])
        except socket.timeout:
            continue
        total += n
        pos = (pos + n) % size
    return total // flen, False, True


def _publish_qos1(sock, frames: bytes, flen: int, count: int, window: int,
                  deadline: float) -> tuple[int, int, bool]:
    """Keep ``window`` QoS 1 PUBLISHes unacknowledged; count PUBACKs (``wire.acks_in``)."""
    view = memoryview(frames)
    nbuf = len(frames) // flen
    sent = acked = 0
    rem = b""
    while acked < count:
        left = deadline - time.monotonic()
        if left <= 0:
            return sent, acked, True
        sock.settimeout(left)
        room = min(window - (sent - acked), count - sent)
        try:
            while room > 0:
                i = sent % nbuf
                k = min(room, nbuf - i)
                sock.sendall(view[i * flen:(i + k) * flen])
                sent += k
                room -= k
            data = sock.recv(65536)
        except socket.timeout:
            # At the time limit: report what was sent and acknowledged so far (the caller's
            # own timeout handler would report nothing sent).
            return sent, acked, True
        if not data:
            raise ConnectionError("broker closed the connection")
        if rem:
            data = rem + data
        n, rem = wire.acks_in(data)
        acked += n
    return sent, acked, False


# ----- subscriber ---------------------------------------------------------------------------------

def subscriber(idx: int, host: str, port: int, nconns: int, topic_filter: str, qos: int,
               expected: int, time_limit: float, idle_grace: float, q, go, pubs_done,
               latency: bool = False, keyed: bool = False, client_id: str | None = None,
               resume: bool = False) -> None:
    """``nconns`` subscriptions in one process; stops at ``expected`` PUBLISHes in total
    (``keyed``: distinct messages), at the time limit, or ``idle_grace`` s after the
    publishers are done and nothing arrives. QoS 1 PUBLISHes are acknowledged in bulk: every
    frame a ``recv`` brought is parsed, and one ``sendall`` carries all their PUBACKs.

    ``latency``: the payloads start with ``STAMP`` (send time, device, sequence number), as the
    edge workload's devices send them: the result then carries end-to-end latency percentiles
    (receive time of the ``recv`` that brought the message minus its send time) and the
    number of distinct messages (duplicates are not counted as delivered).
    ``keyed``: the payloads start with ``wire.KEY`` (``publisher(keyed=True)``): the result
    carries the number of distinct messages (``unique``).
    ``resume`` (one connection, with ``client_id``): do not subscribe; connect only once ``go``
    is set, with clean session 0, to take up the persistent session of ``client_id``
    (``persistent_subscribe``) and its backlog; ``t_go`` in the result is then the time just
    before the connection was opened."""
    _child_setup()
    conns = []
    try:
        bufsize = (1 << 20) if nconns == 1 else (256 << 10)
        stamp_bytes = STAMP.size if latency else wire.KEY.size if keyed else 0

        def open_all() -> None:
            for j in range(nconns):
                if resume:
                    conns.append(_open(host, port, client_id, b"", bufsize,
                                       stamp_bytes=stamp_bytes, clean=False))
                else:
                    conns.append(_open(host, port, client_id or f"bsub-{idx}-{j}-{os.getpid()}",
                                       subscribe_frame(topic_filter, qos), bufsize,
                                       stamp_bytes=stamp_bytes))

        if resume and (nconns != 1 or not client_id):
            raise ValueError("resume takes one connection and its client id")
        if not resume:
            open_all()
        lat: list[int] = []
        keys: set[int] = set()
        q.put(("ready", "sub", idx))
        if not go.wait(GO_TIMEOUT):
            return
        t_go = time.monotonic()
        if resume:
            open_all()
        c0 = time.process_time()
        deadline = t_go + time_limit
        sel = selectors.DefaultSelector()
        lowat = qos == 0 and _set_lowat(conns)
        wait = DRAIN_AFTER if lowat else 0.1
        for sock, counter in conns:
            # QoS 1: acks are sent with sendall, so the socket keeps a timeout. QoS 0 with a
            # low-water mark: non-blocking, since CPython polls before recv on a socket with
            # a timeout, and that poll would wait for the mark.
            if lowat:
                sock.setblocking(False)
            else:
                sock.settimeout(10.0)
            sel.register(sock, selectors.EVENT_READ, counter)
        total = 0
        first = last = None
        for sock, counter in conns:
            # A resumed session's first messages can come in the read that brought CONNACK.
            if counter.publishes:
                total += counter.publishes
                first = last = time.monotonic()
                if keyed:
                    _take_keys(counter, keys)
                if counter.acks:
                    sock.sendall(counter.acks)
                    counter.acks.clear()
        idle_since = None
        open_conns = nconns
        ended = "count"
        while (len(keys) if keyed else total) < expected:
            before_pass = total
            now = time.monotonic()
            if now >= deadline:
                ended = "time limit"
                break
            events = sel.select(min(wait, deadline - now))
            if not events and lowat:
                # Below the low-water mark everywhere: read what is there without waiting.
                events = [(key, 0) for key in sel.get_map().values()]
                drained = True
            else:
                drained = False
            if not events:
                if pubs_done.is_set():
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - max(idle_since, last or 0) >= idle_grace:
                        ended = "idle"
                        break
                continue
            for key, _ in events:
                counter = key.data
                sock = key.fileobj
                before = counter.publishes
                try:
                    n = counter.recv_from(sock, socket.MSG_DONTWAIT if drained else 0)
                except (BlockingIOError, InterruptedError, socket.timeout):
                    continue
                if n == 0:
                    sel.unregister(sock)
                    open_conns -= 1
                    continue
                got = counter.publishes - before
                if got:
                    last = time.monotonic()
                    if first is None:
                        first = last
                    total += got
                    if keyed:
                        _take_keys(counter, keys)
                    elif stamp_bytes:
                        _take_stamps(counter, time.monotonic_ns(), lat, keys)
                if counter.acks:
                    sock.sendall(counter.acks)
                    counter.acks.clear()
            if open_conns == 0:
                ended = "closed by broker"
                break
            if drained and total == before_pass and pubs_done.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - max(idle_since, last or 0) >= idle_grace:
                    ended = "idle"
                    break
        sel.close()
        res = {"count": total, "first": first, "last": last, "t_go": t_go, "ended": ended,
               "cpu": time.process_time() - c0, "per_conn": [c.publishes for _, c in conns],
               "session_present": [c.session_present for _, c in conns]}
        if keyed:
            res["unique"] = len(keys)
        elif stamp_bytes:
            p50, p99, pmax = percentiles(lat, (50, 99, 100))
            res.update(unique=len(keys), latency_ms={"p50": p50 / 1e6, "p99": p99 / 1e6,
                                                     "max": pmax / 1e6} if lat else None)
        q.put(("result", "sub", idx, res))
    except Exception:
        q.put(("error", "sub", idx, traceback.format_exc(limit=3)))
    finally:
        for sock, _ in conns:
            try:
                sock.settimeout(0.5)
                sock.sendall(wire.DISCONNECT_BYTES)
            except OSError:
                pass
            sock.close()


def _take_stamps(counter: wire.FrameCounter, t_rx: int, lat: list, keys: set) -> None:
    """Latencies (ns) and message keys (device << 32 | sequence) from the captured stamps."""
    arr = array.array("q", counter.stamps)
    counter.stamps.clear()
    if sys.byteorder == "little":
        arr.byteswap()
    lat.extend(t_rx - t for t in arr[0::2])
    keys.update(arr[1::2])


def _take_keys(counter: wire.FrameCounter, keys: set) -> None:
    """Message keys (source << 32 | sequence) from the captured payload prefixes."""
    arr = array.array("q", counter.stamps)
    counter.stamps.clear()
    if sys.byteorder == "little":
        arr.byteswap()
    keys.update(arr)


def persistent_subscribe(host: str, port: int, client_id: str, topic_filter: str,
                         qos: int) -> None:
    """CONNECT with clean session 0, SUBSCRIBE, DISCONNECT: a persistent session that
    collects messages while its client is away (``subscriber(resume=True)`` takes it up)."""
    sock, _ = _open(host, port, client_id, subscribe_frame(topic_filter, qos), 4096,
                    clean=False)
    _finish(sock, time.monotonic() + CONNECT_TIMEOUT)


def percentiles(values, ps) -> list:
    """Nearest-rank percentiles of ``values`` (100 = the maximum); None for no values."""
    if not values:
        return [None] * len(ps)
    v = sorted(values)
    return [v[min(len(v) - 1, max(0, -(-p * len(v) // 100) - 1))] for p in ps]


def _set_lowat(conns) -> bool:
    try:
        for sock, _ in conns:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT)
    except (OSError, AttributeError):
        return False
    return True


# ----- ceiling helpers: a sink that stands in for the broker -------------------------------------

def sink(listen: socket.socket, nconns: int, mode: str, time_limit: float, q) -> None:
    """Accept ``nconns`` connections, answer CONNACK, then read until every peer closes.

    mode "discard": read and throw away (the publishers' raw ceiling);
    mode "ack": count PUBLISHes and answer PUBACKs (the QoS 1 publishers' ceiling).
    """
    _child_setup()
    try:
        deadline = time.monotonic() + time_limit + CONNECT_TIMEOUT
        listen.settimeout(CONNECT_TIMEOUT)
        sel = selectors.DefaultSelector()
        scratch = bytearray(1 << 20)
        for _ in range(nconns):
            conn, _ = listen.accept()
            conn.settimeout(10.0)
            conn.sendall(wire.connack(LEVEL))
            sel.register(conn, selectors.EVENT_READ, wire.FrameCounter(ack=True, level=LEVEL))
        received = 0
        publishes = 0
        open_conns = nconns
        while open_conns and time.monotonic() < deadline:
            for key, _ in sel.select(0.1):
                conn = key.fileobj
                counter = key.data
                try:
                    if mode == "discard":
                        n = conn.recv_into(scratch)
                    else:
                        before = counter.publishes
                        n = counter.recv_from(conn)
                        publishes += counter.publishes - before
                        if counter.acks:
                            conn.sendall(counter.acks)
                            counter.acks.clear()
                except (BlockingIOError, InterruptedError, socket.timeout):
                    continue
                except ConnectionError:
                    n = 0
                received += n
                if n == 0:
                    sel.unregister(conn)
                    conn.close()
                    open_conns -= 1
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        q.put(("result", "sink", 0, {"bytes": received, "publishes": publishes}))
    except Exception:
        q.put(("error", "sink", 0, traceback.format_exc(limit=3)))


def feeder(listen: socket.socket, topic: str, payload_size: int, count: int, time_limit: float,
           q, go, window: int = 0) -> None:
    """Stand in for a broker in front of one subscriber: CONNACK + SUBACK, then ``count``
    pre-encoded PUBLISH frames as fast as the socket takes them (the subscriber's ceiling).

    ``window`` > 0: keyed QoS 1 PUBLISHes instead, at most ``window`` of them unacknowledged
    (a broker's max_inflight_messages), the next ones sent as the subscriber's PUBACKs come
    back: the ceiling of a keyed QoS 1 subscriber behind that window."""
    _child_setup()
    try:
        listen.settimeout(CONNECT_TIMEOUT)
        conn, _ = listen.accept()
        conn.sendall(wire.connack(LEVEL) + wire.suback(1, 1 if window else 0, LEVEL))
        if window:
            # Read CONNECT and SUBSCRIBE, so that what comes back later is PUBACKs only.
            conn.settimeout(CONNECT_TIMEOUT)
            hello = wire.FrameCounter(bufsize=4096)
            while len(hello.control) < 2:
                if hello.recv_from(conn) == 0:
                    raise ConnectionError("the subscriber closed before SUBSCRIBE")
            frames, flen = wire.publish_run_keyed(topic, payload_size, count, 0, PUBLISH_PROPS)
        else:
            frame = wire.publish(topic, b"x" * payload_size, props=PUBLISH_PROPS)
            per_batch = max(1, (64 * 1024) // len(frame))
            batch = frame * per_batch
        if not go.wait(GO_TIMEOUT):
            conn.close()
            return
        deadline = time.monotonic() + time_limit
        if window:
            try:
                _publish_qos1(conn, frames, flen, count, window, deadline)
            except (socket.timeout, OSError):
                pass
            conn.close()
            q.put(("result", "feeder", 0, {}))
            return
        full, rest = divmod(count, per_batch)
        try:
            for _ in range(full):
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                conn.sendall(batch)
            conn.sendall(frame * rest)
            # Wait for the subscriber to hang up (it stops at the expected count).
            while time.monotonic() < deadline and conn.recv(65536):
                pass
        except (socket.timeout, OSError):
            pass
        conn.close()
        q.put(("result", "feeder", 0, {}))
    except Exception:
        q.put(("error", "feeder", 0, traceback.format_exc(limit=3)))


# ----- many connections: idle clients and edge devices -------------------------------------------

SLOW_CONNECT = 0.5   # a connection taking longer than this probably waited for a SYN retransmit


def open_many(host: str, port: int, client_ids, keepalive: int, window: int, deadline: float,
              socks: list) -> int:
    """Connect one client per id: non-blocking connect, CONNECT, CONNACK, at most ``window``
    of them under way at once (so a broker's listen backlog never overflows and no SYN waits
    for a retransmit). Appends the sockets to ``socks`` (the caller closes them, also on error).
    Returns how many took longer than SLOW_CONNECT."""
    sel = selectors.DefaultSelector()
    ids = iter(client_ids)
    pending = slow = 0
    more = True
    try:
        while more or pending:
            while more and pending < window:
                cid = next(ids, None)
                if cid is None:
                    more = False
                    break
                sock = socket.socket()
                socks.append(sock)
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                err = sock.connect_ex((host, port))
                if err not in (0, errno.EINPROGRESS):
                    raise ConnectionError(f"connect: {os.strerror(err)}")
                sel.register(sock, selectors.EVENT_WRITE, [cid, b"", time.monotonic()])
                pending += 1
            if not pending:
                break           # the ids ran out just now: nothing to wait for
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{pending} connections still waiting for CONNACK "
                                   f"({len(socks) - pending} connected)")
            for key, events in sel.select(min(left, 1.0)):
                sock, state = key.fileobj, key.data
                if events & selectors.EVENT_WRITE:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise ConnectionError(f"connect: {os.strerror(err)}")
                    sock.send(wire.connect(state[0], keepalive, level=LEVEL))
                    sel.modify(sock, selectors.EVENT_READ, state)
                    continue
                data = sock.recv(16)
                if not data:
                    raise ConnectionError("closed by the broker before CONNACK")
                state[1] += data
                got = wire.split_frame(state[1])
                if got is not None:
                    if (got[0] != 0x20 or wire.connack_code(got[1])[0] != 0
                            or got[2] != len(state[1])):
                        raise ConnectionError(f"CONNACK refused or unexpected: {state[1]!r}")
                    sel.unregister(sock)
                    pending -= 1
                    slow += time.monotonic() - state[2] > SLOW_CONNECT
        return slow
    finally:
        sel.close()


def ping_all(socks: list, deadline: float) -> int:
    """PINGREQ on every socket; returns how many answered PINGRESP before the deadline."""
    sel = selectors.DefaultSelector()
    got = {}
    try:
        for sock in socks:
            try:
                sock.send(wire.PINGREQ_BYTES)
            except OSError:
                continue
            sel.register(sock, selectors.EVENT_READ)
            got[sock.fileno()] = b""
        answered = 0
        while got and time.monotonic() < deadline:
            for key, _ in sel.select(min(1.0, max(0.0, deadline - time.monotonic()))):
                try:
                    data = key.fileobj.recv(16)
                except OSError:
                    data = b""
                have = got.pop(key.fd) + data
                if data and len(have) < 2:
                    got[key.fd] = have
                    continue
                sel.unregister(key.fileobj)
                answered += have == wire.PINGRESP_BYTES
        return answered
    finally:
        sel.close()


def idle_clients(idx: int, host: str, port: int, n: int, keepalive: int, window: int,
                 time_limit: float, q, go, sweep, release) -> None:
    """Open ``n`` idle connections when ``go`` is set (report "connected"), answer a PINGREQ
    sweep when ``sweep`` is set (report "result"), close everything when ``release`` is set."""
    _child_setup()
    socks: list = []
    try:
        ids = (f"idle-{idx}-{j}-{os.getpid()}" for j in range(n))
        q.put(("ready", "idle", idx))
        if not go.wait(GO_TIMEOUT):
            return
        t0 = time.monotonic()
        c0 = time.process_time()
        slow = open_many(host, port, ids, keepalive, window, t0 + time_limit, socks)
        q.put(("connected", "idle", idx, {"n": len(socks), "t_start": t0, "slow": slow,
                                          "t_end": time.monotonic(),
                                          "cpu": time.process_time() - c0}))
        if not sweep.wait(time_limit + GO_TIMEOUT):
            return
        t1 = time.monotonic()
        alive = ping_all(socks, t1 + time_limit)
        q.put(("result", "idle", idx, {"alive": alive, "n": n,
                                       "sweep_s": time.monotonic() - t1}))
        release.wait(GO_TIMEOUT)
    except Exception:
        q.put(("error", "idle", idx, traceback.format_exc(limit=3)))
    finally:
        for sock in socks:
            sock.close()


def device_ids(idx: int, procs: int, n_devices: int) -> range:
    """Devices of generator process ``idx``: every ``procs``-th, so each process's sends are
    spread over the whole second too (device d sends at d / n_devices into every second)."""
    return range(idx, n_devices, procs)


def devices(idx: int, host: str, port: int, procs: int, n_devices: int, seconds: int,
            payload_size: int, window: int, q, go, start_at, time_limit: float) -> None:
    """The edge workload's devices of one process: each its own connection, one QoS 1 PUBLISH
    of ``payload_size`` bytes per second on devices/<id>/telemetry, starting at ``start_at``
    (a shared CLOCK_MONOTONIC value) + id / n_devices; the payload starts with ``STAMP``.

    Reports how late each send was against its schedule (a late generator shows here), the
    PUBACKs received, and the process's CPU use over the sending window."""
    _child_setup()
    socks: list = []
    try:
        mine = device_ids(idx, procs, n_devices)
        cids = [f"dev-{d:05d}" for d in mine]
        pad = bytes(payload_size - STAMP.size)
        # Everything before the packet id (the remaining length counts the whole payload),
        # and what comes between it and the payload (5.0's property section).
        parts = [wire.publish_parts(f"devices/{d:05d}/telemetry", payload_size, 1,
                                    props=PUBLISH_PROPS) for d in mine]
        prefixes = [head for head, _ in parts]
        section = parts[0][1] if parts else b""
        t0 = time.monotonic()
        slow = open_many(host, port, cids, 600, window, t0 + time_limit, socks)
        connect_s = time.monotonic() - t0
        sel = selectors.DefaultSelector()
        for k, sock in enumerate(socks):
            sel.register(sock, selectors.EVENT_READ, k)
        q.put(("ready", "dev", idx, {"connect_s": connect_s, "slow": slow}))
        if not go.wait(GO_TIMEOUT):
            return
        start = start_at.value
        c0 = time.process_time()
        offsets = [d / n_devices for d in mine]
        ndev = len(socks)
        total = ndev * seconds
        late = array.array("q")          # ns behind schedule, one per send
        sent = acked = 0
        rem: dict = {}
        pack = STAMP.pack
        mono_ns = time.monotonic_ns
        while sent < total:
            sec, k = divmod(sent, ndev)
            due = start + sec + offsets[k]
            now = time.monotonic()
            if now >= due:
                t_ns = mono_ns()
                seq = sec
                frame = prefixes[k] + (seq % 65535 + 1).to_bytes(2, "big") + section \
                    + pack(t_ns, mine[k], seq) + pad
                if socks[k].send(frame) != len(frame):
                    raise ConnectionError("a device's socket buffer is full (the broker stopped "
                                          "reading)")
                late.append(t_ns - int(due * 1e9))
                sent += 1
                if sent % 64:
                    continue            # read PUBACKs now and then, not between every send
                wait = 0.0
            else:
                wait = due - now
            acked += _read_acks(sel, wait, rem)
        cpu = time.process_time() - c0
        t_end = time.monotonic()
        ack_deadline = t_end + ACK_GRACE
        while acked < sent and time.monotonic() < ack_deadline:
            acked += _read_acks(sel, 0.05, rem)
        sel.close()
        p50, p99, pmax = percentiles(late, (50, 99, 100))
        q.put(("result", "dev", idx, {
            "sent": sent, "acked": acked, "devices": ndev,
            "late_ms": {"p50": p50 / 1e6, "p99": p99 / 1e6, "max": pmax / 1e6} if late else None,
            "busy_pct": 100.0 * cpu / max(1e-9, t_end - start),
            "t_start": start, "t_end": t_end}))
    except Exception:
        q.put(("error", "dev", idx, traceback.format_exc(limit=3)))
    finally:
        for sock in socks:
            sock.close()


ACK_GRACE = 5.0     # how long devices wait for their last PUBACKs after the sending window


def _read_acks(sel, wait: float, rem: dict) -> int:
    """Read PUBACKs (``wire.acks_in``) from the readable device sockets; returns how many."""
    n = 0
    for key, _ in sel.select(wait):
        try:
            data = key.fileobj.recv(4096)
        except (BlockingIOError, InterruptedError):
            continue
        if not data:
            raise ConnectionError("the broker closed a device connection")
        if key.data in rem:
            data = rem.pop(key.data) + data
        k, rest = wire.acks_in(data)
        n += k
        if rest:
            rem[key.data] = rest
    return n


def stuck_subscriber(idx: int, host: str, port: int, topic_filter: str, qos: int, rcvbuf: int,
                     q, release) -> None:
    """Subscribe with a small receive buffer, then never read again until ``release``."""
    _child_setup()
    sock = None
    try:
        sock, _ = _open(host, port, f"bstuck-{idx}-{os.getpid()}",
                        subscribe_frame(topic_filter, qos), 4096, rcvbuf=rcvbuf)
        q.put(("ready", "stuck", idx))
        release.wait(GO_TIMEOUT)
    except Exception:
        q.put(("error", "stuck", idx, traceback.format_exc(limit=3)))
    finally:
        if sock is not None:
            sock.close()


def acceptor(listen: socket.socket, nconns: int, time_limit: float, q) -> None:
    """Stand in for a broker in front of many clients (the idle and edge generators' ceiling):
    accept without blocking, answer CONNECT with CONNACK, PINGREQ with PINGRESP and each QoS 1
    PUBLISH with a PUBACK; ends when ``nconns`` connections came and went, or at the time limit."""
    _child_setup()
    try:
        deadline = time.monotonic() + time_limit
        listen.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(listen, selectors.EVENT_READ, None)
        closed = publishes = 0
        while closed < nconns and time.monotonic() < deadline:
            for key, _ in sel.select(0.1):
                counter = key.data
                if counter is None:
                    for _ in range(64):
                        try:
                            conn, _ = listen.accept()
                        except (BlockingIOError, InterruptedError):
                            break
                        conn.setblocking(False)
                        sel.register(conn, selectors.EVENT_READ,
                                     wire.FrameCounter(ack=True, bufsize=4096, level=LEVEL))
                    continue
                conn = key.fileobj
                before = counter.publishes
                try:
                    n = counter.recv_from(conn)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    n = 0
                if n == 0:
                    sel.unregister(conn)
                    conn.close()
                    closed += 1
                    continue
                publishes += counter.publishes - before
                out = counter.acks
                for ptype, _ in counter.control:
                    if ptype == wire.CONNECT:
                        out += wire.connack(LEVEL)
                    elif ptype == wire.PINGREQ:
                        out += wire.PINGRESP_BYTES
                counter.control.clear()
                if out:
                    conn.send(out)
                    out.clear()
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        q.put(("result", "acceptor", 0, {"closed": closed, "publishes": publishes}))
    except Exception:
        q.put(("error", "acceptor", 0, traceback.format_exc(limit=3)))


def ping_once(host: str, port: int, client_id: str) -> None:
    """One client: CONNECT, PINGREQ/PINGRESP, DISCONNECT (warms a fresh broker's code paths up
    before its baseline RSS is read)."""
    sock, counter = _open(host, port, client_id, bufsize=4096)
    deadline = time.monotonic() + CONNECT_TIMEOUT
    sock.sendall(wire.PINGREQ_BYTES)
    while not counter.control:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        if counter.recv_from(sock) == 0:
            raise ConnectionError("closed by the broker before PINGRESP")
    _finish(sock, deadline)
