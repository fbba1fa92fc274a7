"""One client's publish rate: edgebroker.client next to paho-mqtt, same broker, same run.

    python bench/client_bench.py                      # 50,000 messages of 64 B, QoS 0 and 1
    python bench/client_bench.py -n 200000 --brokers edgebroker,mosquitto

For each broker (a fresh process at its default configuration, bench/brokers.py), QoS (0, and
1 with a window of 100 in flight) and client, the client publishes N messages of 64 bytes as
fast as it can and waits until they are all written (QoS 0) or acknowledged (QoS 1). A
subscriber in another process (a raw socket counting PUBLISH frames, bench/wire.py) checks
that every message arrived: loss is printed. The figure is messages per second of the
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


def subscriber(port: int, qos: int, n: int, ready, result) -> None:
    """Count PUBLISH frames on TOPIC until n came or 5 s pass without one."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(wire.connect("bench-sub") + wire.subscribe(1, TOPIC, qos))
    buf = bytearray()
    got = 0
    acked = False
    sock.settimeout(5)
    ready.set()
    try:
        while got < n:
            data = sock.recv(1 << 20)
            if not data:
                break
            buf += data
            pos = 0
            acks = []
            while True:
                frame = wire.split_frame(memoryview(buf)[pos:])
                if frame is None:
                    break
                first, body, size = frame
                if first >> 4 == 3:
                    got += 1
                    if (first >> 1) & 3:
                        tlen = int.from_bytes(body[:2], "big")
                        acks.append(wire.puback(int.from_bytes(body[2 + tlen:4 + tlen], "big")))
                elif first >> 4 == 9:
                    acked = True
                pos += size
            del buf[:pos]
            if acks:
                sock.sendall(b"".join(acks))
    except socket.timeout:
        pass
    result.put((got, acked))


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
                        ready.wait(10)
                        time.sleep(0.2)      # the SUBSCRIBE reaches the broker first
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
