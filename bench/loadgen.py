"""Load-generator processes: publishers, subscribers, and the sink/feeder used for the ceiling.

Each function is the body of one ``multiprocessing`` process (fork start method).
They talk to the orchestrator through one queue of tuples:
``("ready", role, idx)``, ``("result", role, idx, dict)``, ``("error", role, idx, text)``,
and wait for the shared ``go`` event before the clock starts. Everything is
bounded: every blocking call has a timeout derived from the run's deadline.
Clocks are ``time.monotonic()`` (CLOCK_MONOTONIC, comparable across processes).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
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


def _child_setup() -> None:
    # Ctrl-C goes to the whole process group; the orchestrator cleans up its children.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _open(host: str, port: int, client_id: str, extra: bytes = b"",
          bufsize: int = 1 << 20) -> tuple[socket.socket, wire.FrameCounter]:
    """Connect, send CONNECT (+ extra), wait for CONNACK (and a SUBACK when subscribing)."""
    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(wire.connect(client_id) + extra)
    counter = wire.FrameCounter(ack=True, bufsize=bufsize)
    want = 2 if extra else 1
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while len(counter.control) < want:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        if counter.recv_from(sock) == 0:
            raise ConnectionError("closed by the broker during CONNECT/SUBSCRIBE")
    ptype, body = counter.control[0]
    if ptype != wire.CONNACK or body[1:2] != b"\x00":
        raise ConnectionError(f"CONNACK refused or unexpected packet: {ptype} {body!r}")
    if extra:
        ptype, body = counter.control[1]
        if ptype != wire.SUBACK or body[2:3] == b"\x80":
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
              window: int, time_limit: float, q, go) -> None:
    _child_setup()
    try:
        payload = b"x" * payload_size
        if qos == 0:
            frame = wire.publish(topic, payload)
            flen = len(frame)
            per_batch = max(1, (64 * 1024) // flen)
            batch = frame * per_batch
            frames = None
        else:
            frames, flen = wire.publish_run(topic, payload, 1, min(count, 65535))
        sock, _ = _open(host, port, f"bpub-{idx}-{os.getpid()}")
        q.put(("ready", "pub", idx))
        if not go.wait(GO_TIMEOUT):
            sock.close()
            return
        t0 = time.monotonic()
        c0 = time.process_time()
        deadline = t0 + time_limit
        timed_out = False
        sent = acked = 0
        try:
            if qos == 0:
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
        _finish(sock, (deadline if not timed_out else t_sent) + CLOSE_GRACE)
        q.put(("result", "pub", idx, {"sent": sent, "acked": acked, "t_start": t0,
                                      "t_sent": t_sent, "t_end": time.monotonic(),
                                      "timed_out": timed_out,
                                      "cpu": time.process_time() - c0}))
    except Exception:
        q.put(("error", "pub", idx, traceback.format_exc(limit=3)))


def _publish_qos1(sock, frames: bytes, flen: int, count: int, window: int,
                  deadline: float) -> tuple[int, int, bool]:
    """Keep ``window`` QoS 1 PUBLISHes unacknowledged; count PUBACKs (4-byte frames)."""
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
        n = len(data) >> 2
        if data[0:4 * n:4].count(0x40) != n:
            raise ConnectionError("expected only PUBACKs from the broker")
        acked += n
        rem = data[4 * n:]
    return sent, acked, False


# ----- subscriber ---------------------------------------------------------------------------------

def subscriber(idx: int, host: str, port: int, nconns: int, topic_filter: str, qos: int,
               expected: int, time_limit: float, idle_grace: float, q, go, pubs_done) -> None:
    """``nconns`` subscriptions in one process; stops at ``expected`` PUBLISHes in total,
    at the time limit, or ``idle_grace`` s after the publishers are done and nothing arrives."""
    _child_setup()
    conns = []
    try:
        bufsize = (1 << 20) if nconns == 1 else (256 << 10)
        for j in range(nconns):
            sock, counter = _open(host, port, f"bsub-{idx}-{j}-{os.getpid()}",
                                  wire.subscribe(1, topic_filter, qos), bufsize)
            conns.append((sock, counter))
        q.put(("ready", "sub", idx))
        if not go.wait(GO_TIMEOUT):
            return
        t_go = time.monotonic()
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
        idle_since = None
        open_conns = nconns
        ended = "count"
        while total < expected:
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
        q.put(("result", "sub", idx, {"count": total, "first": first, "last": last,
                                      "t_go": t_go, "ended": ended,
                                      "cpu": time.process_time() - c0,
                                      "per_conn": [c.publishes for _, c in conns]}))
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
            conn.sendall(wire.CONNACK_ACCEPTED)
            sel.register(conn, selectors.EVENT_READ, wire.FrameCounter(ack=True))
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
           q, go) -> None:
    """Stand in for a broker in front of one subscriber: CONNACK + SUBACK, then ``count``
    pre-encoded PUBLISH frames as fast as the socket takes them (the subscriber's ceiling)."""
    _child_setup()
    try:
        listen.settimeout(CONNECT_TIMEOUT)
        conn, _ = listen.accept()
        conn.sendall(wire.CONNACK_ACCEPTED + wire.suback(1, 0))
        frame = wire.publish(topic, b"x" * payload_size)
        per_batch = max(1, (64 * 1024) // len(frame))
        batch = frame * per_batch
        if not go.wait(GO_TIMEOUT):
            conn.close()
            return
        deadline = time.monotonic() + time_limit
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
