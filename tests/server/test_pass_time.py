"""The loop's busy time (docs/metrics.md, edgebroker_loop_pass_seconds) counts the packets a
pass handles, not only its timers and its sending."""

import os

import mqttraw as m


def _loop_cpu(pid: int) -> float:
    """CPU seconds of the broker's main thread (the loop's)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_pass_time_counts_the_packets_handled(broker, uid):
    """The busy time began after the sockets' events were handled: a SUBSCRIBE whose work
    took the loop for seconds (a retained walk, reviewed) showed as a few ms. Here the work
    is making and removing 1000 subscriptions at a time, whose answers are one packet."""
    b = broker(limits={"control_rate": 0})
    c = b.client(f"{uid}-sub")
    filters = [(f"{uid}/{i}/+/x", 0) for i in range(1000)]
    busy, cpu = b.stats()["loop"]["busy_seconds"], _loop_cpu(b.proc.pid)
    for i in range(25):
        c.send(m.subscribe(2 * i + 1, filters) + m.unsubscribe(2 * i + 2, [f for f, _ in filters]))
        assert c.expect(m.SUBACK, 15).packet_id == 2 * i + 1
        assert c.expect(m.UNSUBACK, 15).packet_id == 2 * i + 2
    busy = b.stats()["loop"]["busy_seconds"] - busy
    cpu = _loop_cpu(b.proc.pid) - cpu
    assert cpu >= 0.1 and busy >= 0.6 * cpu, (busy, cpu)
