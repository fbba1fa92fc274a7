"""Fast clients for the load tests: a subscriber that reads and acknowledges in bulk, and a
publisher that keeps a window of unacknowledged QoS 1 messages.

Packets are built with the independent encoder (mqttraw); frames are split here with a
small parser of our own, not the broker's codec. Every loop is bounded by a deadline.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import mqttraw as m

_PUBLISH, _PUBREL = 3, 6


def _connect(host: str, port: int, client_id: str, clean: bool, rcvbuf: int | None = None):
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.sendall(m.connect(client_id, clean=clean, keepalive=0))
    head = _recv_exact(sock, 4)
    if head[0] != 0x20 or head[3] != 0:
        raise AssertionError(f"{client_id}: CONNACK {head!r}")
    return sock, bool(head[2] & 1)


def _recv_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class BulkSubscriber:
    """Reads PUBLISH packets in bulk and acknowledges them (QoS 1: PUBACK; QoS 2: PUBREC, then
    PUBCOMP for each PUBREL), one send per read. ``on_message(topic, payload, qos, retain,
    dup)`` is called for each PUBLISH, in order, from ``run``'s thread.

    ``qos2_ids``: the packet ids of QoS 2 messages received and not yet released, kept by the
    caller across connections as a client's session state. Given, a QoS 2 PUBLISH whose id is
    in it is not passed on (the receiver's side of exactly once, the specification's method
    B): the id is added at the first PUBLISH and removed at its PUBREL."""

    def __init__(self, host: str, port: int, client_id: str, *, clean: bool = True,
                 rcvbuf: int | None = None, qos2_ids: set[int] | None = None):
        self.host, self.port, self.client_id = host, port, client_id
        self.sock, self.session_present = _connect(host, port, client_id, clean, rcvbuf)
        self.qos2_ids = qos2_ids
        self.count = 0
        self.closed = False

    def subscribe(self, *topics: tuple[str, int]) -> list[int]:
        self.sock.sendall(m.subscribe(1, list(topics)))
        head = _recv_exact(self.sock, 2)
        body = _recv_exact(self.sock, head[1])
        if head[0] != 0x90:
            raise AssertionError(f"expected SUBACK, got {head!r}")
        return list(body[2:])

    def run(self, on_message, until, deadline: float, ack: bool = True) -> None:
        """Read until ``until()`` is true, the connection closes or ``deadline`` passes."""
        sock = self.sock
        sock.settimeout(0.2)
        held = self.qos2_ids
        buf = bytearray()
        while not until() and time.monotonic() < deadline:
            try:
                chunk = sock.recv(1 << 18)
            except socket.timeout:
                continue
            except OSError:
                self.closed = True
                return
            if not chunk:
                self.closed = True
                return
            buf += chunk
            acks = []
            pos = 0
            n = len(buf)
            while pos + 2 <= n:
                first = buf[pos]
                length = 0
                shift = 0
                i = pos + 1
                while True:
                    if i >= n:
                        length = -1
                        break
                    byte = buf[i]
                    length |= (byte & 0x7F) << shift
                    shift += 7
                    i += 1
                    if not byte & 0x80:
                        break
                if length < 0 or i + length > n:
                    break
                body = bytes(buf[i:i + length])
                pos = i + length
                ptype = first >> 4
                if ptype == _PUBLISH:
                    qos = first >> 1 & 3
                    tlen = body[0] << 8 | body[1]
                    p = 2 + tlen
                    topic = body[2:p]
                    if qos:
                        pid = body[p] << 8 | body[p + 1]
                        p += 2
                        acks.append(m.puback(pid) if qos == 1 else m.pubrec(pid))
                        if qos == 2 and held is not None:
                            if pid in held:
                                continue     # a re-send of one received: not again
                            held.add(pid)
                    self.count += 1
                    on_message(topic, body[p:], qos, bool(first & 1), bool(first & 8))
                elif ptype == _PUBREL:
                    pid = body[0] << 8 | body[1]
                    if held is not None:
                        held.discard(pid)
                    acks.append(m.pubcomp(pid))
            del buf[:pos]
            if acks and ack:
                sock.sendall(b"".join(acks))

    def close(self) -> None:
        try:
            self.sock.sendall(m.disconnect())
        except OSError:
            pass
        self.sock.close()

    def abort(self) -> None:
        self.sock.close()


def window_publisher(host: str, port: int, client_id: str, topic: str, payloads, *,
                     window: int = 100, deadline: float, qos: int = 1) -> int:
    """Publish ``payloads`` at QoS 1 (or 2: PUBREL for each PUBREC) with up to ``window``
    unacknowledged; the number acknowledged, by PUBACK or PUBCOMP (all of them unless the
    deadline passed)."""
    sock, _ = _connect(host, port, client_id, True)
    sock.settimeout(0.5)
    payloads = list(payloads)
    total = len(payloads)
    sent = acked = 0
    pending = b""
    try:
        while acked < total and time.monotonic() < deadline:
            room = window - (sent - acked)
            if room > 0 and sent < total:
                batch = payloads[sent:sent + room]
                sock.sendall(b"".join(m.publish(topic, p, qos=qos, packet_id=(sent + k) % 65535 + 1)
                                      for k, p in enumerate(batch)))
                sent += len(batch)
            got = read_acks(sock, pending)
            if got is None:
                break
            acks, pending = got
            releases = []
            for kind, pid in acks:
                if kind == 0x50 and qos == 2:
                    releases.append(m.pubrel(pid))
                elif kind == (0x40 if qos == 1 else 0x70):
                    acked += 1
                else:
                    raise AssertionError(f"{client_id}: unexpected {kind:#x} {pid} (QoS {qos})")
            if releases:
                sock.sendall(b"".join(releases))
    finally:
        sock.close()
    return acked


def read_acks(sock, pending: bytes) -> tuple[list[tuple[int, int]], bytes] | None:
    """What the next ``recv`` brings of the 4-byte acknowledgements (PUBACK, PUBREC, PUBREL,
    PUBCOMP) a publisher gets: ([(first byte, packet id)...], the bytes of an incomplete
    one, to pass to the next call); no acknowledgement on a timeout; None once the
    connection is closed."""
    try:
        data = sock.recv(65536)
    except socket.timeout:
        return [], pending
    if not data:
        return None
    data = pending + data
    whole = len(data) // 4 * 4
    return [(data[k], data[k + 2] << 8 | data[k + 3]) for k in range(0, whole, 4)], data[whole:]


def tagged(publisher: int, seq: int, size: int) -> bytes:
    """A payload that says who sent it and its sequence number (``untag`` reads it back)."""
    head = struct.pack(">BI", publisher, seq)
    return head + b"." * max(0, size - len(head))


def untag(payload: bytes) -> tuple[int, int]:
    return struct.unpack_from(">BI", payload)


def run_publishers(host: str, port: int, prefix: str, topic: str, publishers: int, each: int,
                   size: int, window: int, deadline: float) -> list[int]:
    """``publishers`` threads of ``window_publisher``; the number acknowledged for each."""
    results = [0] * publishers

    def one(k: int) -> None:
        results[k] = window_publisher(host, port, f"{prefix}-{k}", topic,
                                      (tagged(k, i, size) for i in range(each)),
                                      window=window, deadline=deadline)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 5)
    return results
