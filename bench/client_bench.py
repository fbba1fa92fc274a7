"""One client's publish rate: edgebroker.client next to paho-mqtt, same broker, same run.

    python bench/client_bench.py                      # 50,000 messages of 64 B, QoS 0 and 1
    python bench/client_bench.py -n 200000 --brokers edgebroker,mosquitto

For each broker (a fresh process at its default configuration, bench/brokers.py), QoS (0, and
1 with a window of 100 in flight) and client, the client publishes N messages of 64 bytes as
fast as it can and waits until they are all written (QoS 0) or acknowledged (QoS 1). A
subscriber in another process (a raw socket whose counting is all in C: ``bytes.count`` of
the frames' head at QoS 0, a regular expression taking the packet ids to PUBACK at QoS 1)
checks that every message arrived: loss is printed. It is the same for every client and
is not the bottleneck (a frame-by-frame Python parser was, at QoS 0). The figure is messages per second of the
publisher, from its first publish to its last acknowledgement (QoS 0: its bytes written to
the socket; paho's ``wait_for_publish`` says so, edgebroker.client's time includes its
DISCONNECT, which waits for the bytes it buffered), and the CPU time the
publisher's process spent per message (all its threads: paho's network thread included);
with ``--rounds R`` each client runs R times (round by round, so load on the machine falls on
all alike) and the summary gives the medians and the ratio edgebroker.client / paho (target:
at least 3). On a shared machine the rate varies with what else runs; the CPU time much less.

edgebroker.client runs through the asyncio adapter (client/aio.py, ``publish_nowait`` while
the connection can take a request, else waiting for the oldest request's answer) and through the synchronous event loop (client/loop.py, no
threads: ``run()`` of a generator of N ``(topic, payload, qos)`` tuples, over the Dialer of
client/address.py); paho through its network thread (loop_start) with max_inflight 100,
waiting on the last MessageInfo.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import brokers  # noqa: E402
import wire  # noqa: E402

PAYLOAD = b"x" * 64
TOPIC = "bench/client"
WINDOW = 100


def publish_head(qos: int) -> bytes:
    """The bytes every PUBLISH of the run starts with, up to the packet identifier: the
    fixed header (no DUP, no retain), the length, the topic (the payload is all b"x")."""
    topic = TOPIC.encode()
    length = 2 + len(topic) + (2 if qos else 0) + len(PAYLOAD)
    return bytes((0x30 | qos << 1,)) + wire.varint(length) + len(topic).to_bytes(2, "big") + topic


def subscriber(port: int, qos: int, n: int, ready, result) -> None:
    """Count the run's PUBLISH frames until n came or 5 s pass without one; (count, True).

    The counting is all in C, so that the subscriber is not the run's bottleneck on a
    2-core machine (a frame-by-frame Python parser was, at QoS 0): QoS 0 frames are counted
    with ``bytes.count`` of their head; QoS 1 frames are found by a regular expression that
    also takes their packet identifiers, answered with one write of PUBACKs. A frame of
    another shape (a DUP, a wrong length) is not counted: it shows up as lost."""
    import re
    head = publish_head(qos)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(wire.connect("bench-sub") + wire.subscribe(1, TOPIC, qos))
    sock.settimeout(10)
    buf = b""
    while len(buf) < 9:                   # CONNACK (4 bytes) and SUBACK (5 bytes)
        buf += sock.recv(9 - len(buf))
    assert buf[4] == 0x90 and buf[8] == qos, f"no SUBACK granting QoS {qos}: {buf!r}"
    ready.set()
    got = 0
    keep = len(head) - 1 + (2 if qos else 0)  # a head cut by the end of a read
    frame = re.compile(re.escape(head) + b"(..)", re.S)
    buf = b""
    sock.settimeout(5)
    try:
        while got < n:
            data = sock.recv(1 << 20)
            if not data:
                break
            buf = buf + data if buf else data
            if not qos:
                got += buf.count(head)
                buf = buf[-(len(head) - 1):]
                continue
            pids = frame.findall(buf)
            if pids:
                got += len(pids)
                sock.sendall(b"\x40\x02" + b"\x40\x02".join(pids))
                last = buf.rfind(head)           # the last frame found: keep only after it
                buf = buf[last + len(head) + 2:]
            buf = buf[-keep:] if len(buf) > keep else buf
    except socket.timeout:
        pass
    result.put((got, True))


def run_paho(port: int, qos: int, n: int) -> float:
    import paho.mqtt.client as mqtt
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-paho")
    c.max_inflight_messages_set(WINDOW)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port)
    c.loop_start()
    start = time.perf_counter()
    info = None
    for _ in range(n):
        info = c.publish(TOPIC, PAYLOAD, qos=qos)
    info.wait_for_publish(120)
    elapsed = time.perf_counter() - start
    c.disconnect()
    c.loop_stop()
    return elapsed


def run_aio(port: int, qos: int, n: int) -> float:
    from edgebroker.client.aio import AsyncClient

    async def main():
        async with AsyncClient(f"mqtt://127.0.0.1:{port}", "bench-aio", max_inflight=WINDOW,
                               max_queued=1000) as c:
            start = time.perf_counter()
            handles = collections.deque()
            for _ in range(n):
                while not c.connection.can_publish:
                    await handles.popleft()     # the oldest: the window moves on at once
                handles.append(c.publish_nowait(TOPIC, PAYLOAD, qos))
            while handles:
                await handles.popleft()
            await c.disconnect()        # QoS 0: until the bytes buffered are written
            return time.perf_counter() - start
    return asyncio.run(main())


def run_sync(port: int, qos: int, n: int) -> float:
    from edgebroker.client.address import Dialer
    from edgebroker.client.events import Connected
    from edgebroker.client.loop import EventLoop
    with EventLoop(client_id="bench-sync", transport_factory=Dialer(f"mqtt://127.0.0.1:{port}"),
                   reconnect="never", max_inflight=WINDOW, max_queued=1000) as loop:
        for event in loop:
            if type(event) is Connected:
                break
        start = time.perf_counter()
        result = loop.run(((TOPIC, PAYLOAD, qos) for _ in range(n)), timeout=120)
        loop.disconnect()               # QoS 0: until the bytes buffered are written
        elapsed = time.perf_counter() - start
        if not result.complete:
            raise RuntimeError(f"sync loop: {len(result.pending)} publishes not answered")
    return elapsed


CLIENTS = {"paho": run_paho, "edgebroker.client (aio)": run_aio,
           "edgebroker.client (sync loop)": run_sync}


def measure(fn, port: int, qos: int, n: int) -> tuple[float, float]:
    """(seconds, CPU seconds of this process, every thread's) of one client's run."""
    cpu = time.process_time()
    elapsed = fn(port, qos, n)
    return elapsed, time.process_time() - cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=50_000, help="messages per run")
    ap.add_argument("--brokers", default="edgebroker", help="edgebroker,mosquitto")
    ap.add_argument("--qos", default="0,1")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of every client (the summary gives the median)")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    classes = {"edgebroker": brokers.Edgebroker, "mosquitto": brokers.Mosquitto}
    rows = []
    for round_ in range(1, args.rounds + 1):
        for bname in args.brokers.split(","):
            for qos in map(int, args.qos.split(",")):
                for cname, fn in CLIENTS.items():
                    broker = classes[bname]().start()
                    try:
                        ready, result = ctx.Event(), ctx.Queue()
                        sub = ctx.Process(target=subscriber, args=(broker.port, qos, args.n,
                                                                   ready, result))
                        sub.start()
                        if not ready.wait(10):      # subscribed (its SUBACK came)
                            raise RuntimeError("the counting subscriber did not subscribe")
                        elapsed, cpu = measure(fn, broker.port, qos, args.n)
                        got, _ = result.get(timeout=120)
                        sub.join(10)
                    finally:
                        broker.stop()
                    rate = args.n / elapsed
                    us = cpu * 1e6 / args.n
                    rows.append((bname, qos, cname, rate, us, args.n - got))
                    print(f"round {round_}  {bname:10} QoS {qos}  {cname:30} {rate:10,.0f} "
                          f"msg/s  {us:5.1f} us CPU/msg  lost {args.n - got}", flush=True)
    print(f"\nmedian of {args.rounds} round(s); ratio edgebroker.client / paho (target >= 3):")
    for bname in args.brokers.split(","):
        for qos in map(int, args.qos.split(",")):
            rate = {c: statistics.median(r for b, q, cc, r, _, _ in rows
                                         if (b, q, cc) == (bname, qos, c)) for c in CLIENTS}
            cpu = {c: statistics.median(u for b, q, cc, _, u, _ in rows
                                        if (b, q, cc) == (bname, qos, c)) for c in CLIENTS}
            for cname in CLIENTS:
                ratio = "" if cname == "paho" else f"{rate[cname] / rate['paho']:6.2f}x"
                print(f"  {bname:10} QoS {qos}  {cname:30} {rate[cname]:10,.0f} msg/s "
                      f"{ratio:7}  {cpu[cname]:5.1f} us CPU/msg")
    return 1 if any(lost for *_, lost in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
