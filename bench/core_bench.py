#!/usr/bin/env python3
"""CPU cost of the broker's core path per message, in-process (not part of `make test`).

    .venv/bin/python bench/core_bench.py                   # 10,000 devices, 10 rounds
    .venv/bin/python bench/core_bench.py --devices 1000 --rounds 30 --repo ../other-checkout
    .venv/bin/python bench/core_bench.py --backlog 100000   # a backlog drained instead

The edge workload without sockets or the event loop: ``devices`` connected clients each send
one 100-byte QoS 1 PUBLISH on ``devices/<id>/telemetry`` per round, one QoS 1 subscriber on
``devices/+/telemetry`` acknowledges each message with its own PUBACK, and the log is written
once per 5 messages (about what a loop pass gathers at 10,000 messages/s), with
``durability = "batch"``. Transports are ``core.testing.FakeTransport`` (this checkout's, also
with ``--repo``): they keep what is written and are flushed after each pass. The figure is
process CPU time per message for decoding, limits, logging, routing, the PUBACK to the
publisher and the subscriber's PUBACK: what the Python code of ``core/``, ``mqtt/`` and
``commitlog/`` costs, without the kernel and the loop around it.
Use it to compare two checkouts (``--repo``) on one machine, a few runs each, alternating.

``--backlog N``: instead, a persistent QoS 1 subscriber on ``bench/+`` is offline while N
64-byte QoS 1 messages are published on ``bench/0`` to ``bench/3`` (the ``reconnect_backlog``
load), then comes back; each time the broker has written, the subscriber acknowledges all it
got with one read's worth of PUBACKs. The figure is the CPU time per message of the drain
(the broker's calls only, not the subscriber's parsing).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASS = 5  # messages per loop pass


def fake_transport_class():
    """``core.testing.FakeTransport`` of this checkout, whichever checkout is measured (the
    module imports nothing, so it drives an older core as well)."""
    path = os.path.join(REPO, "edgebroker", "core", "testing.py")
    spec = importlib.util.spec_from_file_location("_core_testing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FakeTransport


def run(devices: int, rounds: int, state_dir: str) -> float:
    from edgebroker import config as configuration, records
    from edgebroker.commitlog.format import LogOptions
    from edgebroker.commitlog.log import CommitLog
    from edgebroker.core.broker import Broker
    from edgebroker.mqtt.encode import encode
    from edgebroker.mqtt.packets import Connect, Puback, Publish, Subscribe

    cfg = configuration.Config()
    cfg = records.replace(cfg, limits=records.replace(
        cfg.limits, max_connections=devices + 10))
    log = CommitLog.open(os.path.join(state_dir, "log"), LogOptions())
    broker = Broker(cfg, time.monotonic, commit_log=log,
                    wall_ms=lambda: time.time_ns() // 1_000_000)
    fake_transport = fake_transport_class()

    def connect(client_id: str):
        transport = fake_transport(client_id)
        client = transport.client = broker.connection_made(transport)
        client.data_received(encode(Connect(client_id=client_id, keepalive=60)))
        transport.flush()
        return client, transport

    sub, sub_transport = connect("subscriber")
    sub.data_received(encode(Subscribe(1, [("devices/+/telemetry", 1)])))
    sub_transport.flush()
    clients = [connect(f"device-{i:05d}") for i in range(devices)]
    # Received bytes are views of a reused buffer in the broker; so are these.
    frames = [memoryview(bytearray(encode(Publish(f"devices/{i:05d}/telemetry", bytes(100), 1,
                                                  packet_id=1))))
              for i in range(devices)]
    acks = [memoryview(bytearray(encode(Puback(pid)))) for pid in range(1, 65536)]
    gc.collect()
    sent = 0
    start = time.process_time()
    for _ in range(rounds):
        for i in range(devices):
            clients[i][0].data_received(frames[i])
            sent += 1
            if sent % PASS == 0:
                broker.end_pass()
                for k in range(i - PASS + 1, i + 1):
                    clients[k][1].flush()
                # The subscriber got the pass's messages (packet ids 1, 2, ...): one PUBACK each.
                for k in range(sent - PASS, sent):
                    sub.data_received(acks[k % 65535])
                sub_transport.flush()
    used = time.process_time() - start
    log.close()
    return used / sent * 1e6


def drain(count: int, state_dir: str) -> float:
    from edgebroker import config as configuration
    from edgebroker.commitlog.format import LogOptions
    from edgebroker.commitlog.log import CommitLog
    from edgebroker.core.broker import Broker
    from edgebroker.mqtt.encode import encode
    from edgebroker.mqtt.packets import Connect, Disconnect, Puback, Publish, Subscribe

    log = CommitLog.open(os.path.join(state_dir, "log"), LogOptions())
    broker = Broker(configuration.Config(), time.monotonic, commit_log=log,
                    wall_ms=lambda: time.time_ns() // 1_000_000)
    fake_transport = fake_transport_class()

    def connect(client_id: str, clean: bool):
        transport = fake_transport(client_id)
        client = transport.client = broker.connection_made(transport)
        client.data_received(encode(Connect(client_id=client_id, keepalive=60,
                                            clean_session=clean)))
        return client, transport

    sub, _ = connect("subscriber", False)
    sub.data_received(encode(Subscribe(1, [("bench/+", 1)])))
    sub.data_received(encode(Disconnect()))
    pub, pub_transport = connect("publisher", True)
    for k in range(0, count, 100):
        pub.data_received(b"".join(encode(Publish(f"bench/{i % 4}", bytes(64), 1,
                                                  packet_id=1 + i % 60_000))
                                   for i in range(k, min(k + 100, count))))
        broker.end_pass()
        pub_transport.flush()
    acks = [encode(Puback(pid)) for pid in range(65536)]
    gc.collect()
    sub, transport = connect("subscriber", False)
    got = 0
    used = 0.0
    while got < count:
        data = b"".join(bytes(x) for x in transport.out)
        transport.flush()
        answer = []
        pos = 0
        while pos < len(data):      # PUBLISH frames: remaining length below 128 here
            end = pos + 2 + data[pos + 1]
            if data[pos] >> 4 == 3:
                at = pos + 4 + (data[pos + 2] << 8 | data[pos + 3])
                answer.append(acks[data[at] << 8 | data[at + 1]])
            pos = end
        if not answer:
            raise RuntimeError(f"the drain stopped after {got} of {count} messages")
        got += len(answer)
        start = time.thread_time()
        broker.end_pass()
        sub.data_received(b"".join(answer))
        used += time.thread_time() - start
    log.close()
    return used / count * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repo", default=REPO, help="the checkout whose edgebroker to measure")
    ap.add_argument("--backlog", type=int, metavar="N",
                    help="drain a persistent session's backlog of N messages instead")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.repo))
    state_dir = tempfile.mkdtemp(prefix="core-bench-", dir="/var/tmp")
    try:
        if args.backlog:
            per_message = drain(args.backlog, state_dir)
        else:
            per_message = run(args.devices, args.rounds, state_dir)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    what = (f"a backlog of {args.backlog:,} drained" if args.backlog else
            f"{args.devices:,} devices x {args.rounds} rounds")
    print(f"{per_message:.2f} us of CPU per message ({what}, {os.path.abspath(args.repo)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
