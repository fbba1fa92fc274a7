"""A publishing process for the restart tests (run as a script by tests/client/test_loop.py).

    publisher_proc.py state HOST PORT STATE_FILE FIRST LAST QOS STOP_AFTER
        Publishes messages FIRST..LAST-1 ("m<i>", topic "restart/t") from a generator, with the
        state file STATE_FILE (loaded when it exists). With STOP_AFTER > 0, shuts down after
        that many acknowledgements and prints "next <i>" (the first message not yet taken from
        the generator); else runs until all are acknowledged and prints "done".
    publisher_proc.py spool HOST PORT SPOOL_PATH COUNT QOS RATE
        Appends COUNT messages to the spool when COUNT > 0, then sends from the spool (at most
        RATE a second when RATE > 0) until nothing is left unanswered, printing "acked <n>"
        as it goes and "done" at the end.
"""

from __future__ import annotations

import sys

from edgebroker.client.events import Acked
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import make_publish
from edgebroker.client.spool import Spool


def state_mode(host, port, state_file, first, last, qos, stop_after) -> None:
    taken = [first]

    def source():
        for i in range(first, last):
            taken[0] = i + 1
            yield make_publish("restart/t", b"m%d" % i, qos)

    loop = EventLoop(host, port, client_id="restart-pub", clean_start=False,
                     state_file=state_file, reconnect="always", backoff_base=0.05,
                     backoff_cap=0.5, max_inflight=10, max_queued=50, requests=source())
    # Stop after STOP_AFTER acknowledgements, or once everything (what the state file held
    # and the rest of the batch) is acknowledged.
    target = stop_after or loop.conn.inflight + loop.conn.queued + (last - first)
    acked = 0
    for event in loop:
        if type(event) is Acked:
            acked += 1
            if acked >= target:
                break
    loop.shutdown()
    print(f"next {taken[0]}" if stop_after else "done", flush=True)


def spool_mode(host, port, path, count, qos, rate) -> None:
    spool = Spool(path)
    for i in range(count):
        spool.append("restart/t", b"m%d" % i, qos)
    loop = EventLoop(host, port, client_id="spool-pub", reconnect="always", backoff_base=0.05,
                     backoff_cap=0.5, max_inflight=10, max_queued=50, requests=spool)
    if rate:
        loop.throttle(rate)
    acked = 0
    while spool.unacked:
        event = loop.poll(30)
        assert event is not None, "no event within 30 s"
        if type(event) is Acked:
            acked += 1
            print(f"acked {acked}", flush=True)
    print("done", flush=True)
    loop.close()


if __name__ == "__main__":
    mode, host, port, path, *rest = sys.argv[1:]
    if mode == "state":
        state_mode(host, int(port), path, *map(int, rest))
    else:
        spool_mode(host, int(port), path, *map(int, rest))
