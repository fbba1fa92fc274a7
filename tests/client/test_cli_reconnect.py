"""`edgebroker sub` and `edgebroker pub -l` across a broker stopped and started again on the same
port and data directory: sub connects again and subscribes again (as mosquitto_sub does), pub
keeps reading its stdin and no QoS 1/2 line is lost."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, LineCollector, Proc, broker_command


def restart(broker, b):
    """Stop ``b`` and start a broker on its port and data directory; the new Broker."""
    b.stop()
    return broker(listener=[{"host": "127.0.0.1", "port": b.port}],
                  data_dir=b.config["data_dir"])


class Piped(Proc):
    """A running `edgebroker` command whose stdin the test writes as it goes."""

    def __init__(self, args):
        self.cmd = [*broker_command(), *args]
        self.p = subprocess.Popen(self.cmd, cwd=REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  errors="replace")
        self.out = LineCollector(self.p.stdout)

    def write(self, lines) -> None:
        self.p.stdin.write("".join(f"{ln}\n" for ln in lines))
        self.p.stdin.flush()

    def count(self, text: str) -> int:
        return sum(text in ln for ln in self.out.lines)

    def wait_count(self, text: str, n: int, timeout: float = 15.0) -> None:
        self.out.wait(lambda _: self.count(text) >= n, timeout)
        assert self.count(text) >= n, f"{n} x {text!r} expected:\n{self.out.text()}"

    def finish(self, timeout: float = 20.0) -> int:
        """End of stdin; the exit code."""
        self.p.stdin.close()
        return self.wait(timeout)


def test_sub_reconnects_and_subscribes_again(broker, uid):
    b = broker()
    sub = Proc(["stdbuf", "-oL", *broker_command(), "sub", "-h", "127.0.0.1", "-p", str(b.port),
                "-t", f"{uid}/#", "-q", "1", "-v", "-C", "2", "-d", "-i", f"{uid}-s"])
    sub.wait_line(lambda ln: "received SUBACK" in ln)
    b.client(f"{uid}-p1").publish(f"{uid}/a", b"before", qos=1)
    sub.wait_line(lambda ln: ln == f"{uid}/a before")
    b2 = restart(broker, b)
    # a clean session: the broker forgot the subscription, so sub makes it again
    sub.out.wait(lambda _: sum("received SUBACK" in ln for ln in sub.lines) >= 2, 20)
    assert sum("received CONNACK" in ln for ln in sub.lines) == 2, sub.out.text()
    assert any("lost the connection" in ln for ln in sub.lines), sub.out.text()
    b2.client(f"{uid}-p2").publish(f"{uid}/b", b"after", qos=1)
    assert sub.wait(20) == 0
    printed = [ln for ln in sub.lines if not ln.startswith("Client ")]
    assert printed == [f"{uid}/a before", f"{uid}/b after"]


@pytest.mark.parametrize("qos", [1, 2])
def test_pub_lines_survive_a_broker_restart(broker, uid, qos):
    """300 lines: 100 before the stop, 100 while the broker is down, 100 after it is back.
    The subscriber's persistent session gets every one (duplicates allowed at QoS 1)."""
    b = broker()
    port = b.port
    s = b.client(f"{uid}-sub", clean=False)
    s.subscribe(f"{uid}/t", qos=qos)
    s.close()
    pub = Piped(["pub", "-h", "127.0.0.1", "-p", str(port), "-t", f"{uid}/t", "-l",
                 "-q", str(qos), "-d", "-i", f"{uid}-pub"])
    ack = "received PUBACK" if qos == 1 else "received PUBCOMP"
    pub.write(range(100))
    pub.wait_count(ack, 100)
    b.stop()
    pub.write(range(100, 200))       # taken while the link is down
    b2 = broker(listener=[{"host": "127.0.0.1", "port": port}],
                data_dir=b.config["data_dir"])
    pub.write(range(200, 300))
    assert pub.finish() == 0, pub.out.text()
    assert pub.count(ack) == 300 and pub.count("received CONNACK") == 2, pub.out.text()
    sub = b2.client(f"{uid}-sub", clean=False)
    got = set()
    for _ in range(600):              # bounded: each payload at most twice
        if len(got) == 300:
            break
        got.add(int(sub.recv_publish(timeout=10).payload))
    assert got == set(range(300))
