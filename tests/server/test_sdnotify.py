"""sd_notify: the test plays systemd's part with a datagram socket named by NOTIFY_SOCKET.

READY=1 once listening, STATUS= lines with connections and PUBLISH rates, WATCHDOG=1 from the
core loop at half of WATCHDOG_USEC (and none while the loop is stopped), RELOADING=1 (with
MONOTONIC_USEC) and READY=1 around a SIGHUP reload, STOPPING=1 on SIGTERM
(systemd/edgebroker.service, docs/deploy.md)."""

import re
import signal
import time

import mqttraw as m
from fakesystemd import systemd  # noqa: F401  (the fixture)

WATCHDOG_USEC = 400_000          # pings every 0.2 s
STATUS_RE = re.compile(r"STATUS=(\d+) connections, (\d+\.\d) msg/s in, (\d+\.\d) msg/s out")


def test_ready_status_watchdog_reload_stopping(systemd, broker, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    b = broker()
    # READY=1 comes once the listener accepts: the first datagram, and the port answers.
    first = systemd.next(10.0)
    assert first is not None and "READY=1" in first, systemd.messages
    c = b.client("sd-pub")

    # STATUS lines from the core loop, with the connection and the rate of what it publishes.
    watchdog = systemd.wait_for(lambda ln: ln == "WATCHDOG=1")
    assert any(STATUS_RE.fullmatch(ln) for ln in watchdog), watchdog
    for i in range(20):
        c.send(m.publish("sd/t", b"x", qos=1, packet_id=i + 1))
    for _ in range(20):
        c.expect(m.PUBACK)
    systemd.wait_for(lambda ln: (s := STATUS_RE.fullmatch(ln)) is not None
                     and s[1] == "1" and float(s[2]) > 0)

    # The pings keep their pace: at half of WatchdogSec (0.2 s), none missed.
    begin = len(systemd.messages)
    start = time.monotonic()
    while time.monotonic() - start < 1.0:
        systemd.next(1.0)
    pings = sum("WATCHDOG=1" in msg for msg in systemd.messages[begin:])
    assert 3 <= pings <= 7, systemd.messages[begin:]

    # SIGHUP: RELOADING=1 with MONOTONIC_USEC (CLOCK_MONOTONIC in µs, the same clock as
    # the test's, in the same datagram), then READY=1 again.
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    b.send_signal(signal.SIGHUP)
    reloading = systemd.wait_for(lambda ln: ln == "RELOADING=1")
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    stamps = [ln.partition("=")[2] for ln in reloading if ln.startswith("MONOTONIC_USEC=")]
    assert len(stamps) == 1 and before <= int(stamps[0]) <= after, (before, reloading, after)
    systemd.wait_for(lambda ln: ln == "READY=1")

    # SIGTERM: STOPPING=1, exit 0.
    c.close()
    b.send_signal(signal.SIGTERM)
    systemd.wait_for(lambda ln: ln == "STOPPING=1")
    assert b.stop() == 0


def test_a_stopped_loop_sends_no_watchdog(systemd, broker, monkeypatch):
    """A hung loop (here: the process stopped) stops the pings, so systemd would restart it;
    they come back once it runs again."""
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    b = broker()
    systemd.wait_for(lambda ln: ln == "WATCHDOG=1")
    b.send_signal(signal.SIGSTOP)
    try:
        # What was sent before the stop took effect may still arrive: drain it, then silence.
        while systemd.next(0.3) is not None:
            pass
        assert systemd.next(1.0) is None, "a WATCHDOG=1 from a stopped broker"
    finally:
        b.send_signal(signal.SIGCONT)
    systemd.wait_for(lambda ln: ln == "WATCHDOG=1", timeout=5.0)


def test_no_watchdog_without_watchdog_usec(systemd, broker):
    """Without WatchdogSec: STATUS lines only (every 5 s), no WATCHDOG=1."""
    b = broker()
    assert "READY=1" in systemd.wait_for(lambda ln: ln == "READY=1")
    status = systemd.wait_for(lambda ln: ln.startswith("STATUS=") and "connections" in ln,
                              timeout=10.0)
    assert STATUS_RE.fullmatch(status[0]) and len(status) == 1, status
    assert b.stop() == 0
    assert not any("WATCHDOG=1" in msg for msg in systemd.messages)


def test_watchdog_pid_of_another_process_is_not_ours(systemd, broker, monkeypatch):
    """WATCHDOG_PID names the process the watchdog is for; another one's (not the parent of a
    frozen binary) means no pings from this one."""
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.setenv("WATCHDOG_PID", "1")
    b = broker()
    systemd.wait_for(lambda ln: ln.startswith("STATUS=") and "connections" in ln, timeout=10.0)
    assert b.stop() == 0
    assert not any("WATCHDOG=1" in msg for msg in systemd.messages)
