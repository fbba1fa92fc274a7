"""Smoke test of the one-file binary dist/edgebroker (packaging/, docs/deploy.md).

The binary runs the same CLI as ``python -m edgebroker``, so the ``broker`` fixture starts it
through EDGEBROKER_TEST_BROKER; the ``binary`` fixture (conftest.py) builds it when needed.
"""

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import mqttraw as m
from conftest import LineCollector
from frozen.conftest import assert_stopped_as_orphan, kill_quietly
from edgebroker.uploader.batch import read_batch_file
from fakesystemd import SocketUnit, systemd  # noqa: F401  (the fixture)
from secfiles import write_passwords


def wait_for(pred, what: str, timeout: float = 20.0):
    """``pred()`` once true, looked at every 50 ms for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not (value := pred()):
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        pause.wait(0.05)
    return value


def run_binary(binary, *args, env=None):
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env=env)


def test_version_says_c_backend(binary, tmp_path):
    # Its own TMPDIR: the binary unpacks there (and removes what it unpacked on exit).
    r = run_binary(binary, "--version", env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    import edgebroker

    assert r.stdout.startswith(f"edgebroker {edgebroker.__version__} (native backend: c, "), r.stdout
    assert r.stdout.rstrip().endswith("; frozen binary)"), r.stdout
    assert list(tmp_path.iterdir()) == []


def test_serve_qos_0_1_2_inspect_and_sigterm(binary, broker, mosq, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEBROKER_TEST_BROKER", str(binary))
    unpack = tmp_path / "unpack"
    unpack.mkdir()
    monkeypatch.setenv("TMPDIR", str(unpack))
    landing = tmp_path / "landing"
    landing.mkdir()
    # The uploader too (zstandard in the binary): a batch once the log is 1 s quiet.
    b = broker(upload={"url": f"file://{landing}", "gateway_id": "gw-smoke", "batch_max_age": 1})
    assert b.cmd[0] == str(binary)
    assert any("native helper: C" in ln for ln in b.logs), b.log_text()
    assert len(list(unpack.iterdir())) == 1, "the binary did not unpack into $TMPDIR"

    sub = mosq("sub", b.port, "-d", "-t", "smoke/#", "-q", "2", "-v", "-C", "3", "-W", "20")
    sub.wait_line(lambda ln: "received SUBACK" in ln)
    for qos in (0, 1, 2):
        pub = mosq("pub", b.port, "-t", f"smoke/q{qos}", "-m", f"payload {qos}", "-q", str(qos))
        assert pub.wait() == 0, pub.out.text()
    assert sub.wait() == 0, sub.out.text()
    received = [ln for ln in sub.lines if ln.startswith("smoke/")]
    assert received == ["smoke/q0 payload 0", "smoke/q1 payload 1", "smoke/q2 payload 2"]

    data_dir = b.config["data_dir"]
    r = run_binary(binary, "inspect", "segments", "--data-dir", data_dir, "--format", "json")
    assert r.returncode == 0, r.stderr
    segments = json.loads(r.stdout)
    assert sum(s["records"] for s in segments) == 3, segments
    r = run_binary(binary, "inspect", "tail", "--data-dir", data_dir)
    assert r.returncode == 0, r.stderr
    for qos in (0, 1, 2):
        assert f"smoke/q{qos}" in r.stdout and f"payload {qos}" in r.stdout, r.stdout

    # The batch the binary wrote, read back with this checkout's reader.
    batches = wait_for(lambda: sorted(landing.rglob("*.ebb.zst")), "an uploaded batch")
    records = [r for path in batches for r in read_batch_file(str(path))[1]]
    assert [(r.topic, r.payload) for r in records] == \
        [(f"smoke/q{qos}".encode(), f"payload {qos}".encode()) for qos in (0, 1, 2)], records

    assert b.stop(signal.SIGTERM) == 0, b.log_text()
    assert b.logs[-1].endswith("stopped"), b.log_text()
    assert list(unpack.iterdir()) == [], "the binary left its unpacked files behind"


def test_under_systemd_notify_watchdog_of_the_bootloader(binary, systemd, tmp_path):
    """As systemd runs it: the unit's main process is the bootloader, so WATCHDOG_PID names it
    (the shell's pid, kept by exec) while the broker runs in its child; the child's READY=1,
    WATCHDOG=1 (for its parent's pid) and STATUS reach the socket (NotifyAccess=all in the
    unit), and the bootloader passes SIGHUP (reload) and SIGTERM on."""
    env = dict(os.environ, WATCHDOG_USEC="400000", TMPDIR=str(tmp_path))
    log = open(tmp_path / "stderr.txt", "wb")
    proc = subprocess.Popen(
        ["sh", "-c", 'WATCHDOG_PID=$$ exec "$0" "$@"', str(binary), "serve",
         "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        systemd.wait_for(lambda ln: ln == "READY=1")
        assert any(s.startswith("STATUS=") for s in
                   systemd.wait_for(lambda ln: ln == "WATCHDOG=1"))
        proc.send_signal(signal.SIGHUP)
        reloading = systemd.wait_for(lambda ln: ln == "RELOADING=1")
        assert any(ln.startswith("MONOTONIC_USEC=") for ln in reloading), reloading
        systemd.wait_for(lambda ln: ln == "READY=1")
        proc.send_signal(signal.SIGTERM)
        systemd.wait_for(lambda ln: ln == "STOPPING=1")
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        log.close()
    text = (tmp_path / "stderr.txt").read_text()
    assert "configuration reloaded" in text and text.rstrip().endswith("stopped"), text


def test_a_sigkill_of_the_bootloader_stops_the_broker(binary, tmp_path):
    """The bootloader killed (a supervisor or `kill -9` stopping the main pid): the broker, its
    child, stops within a second or so as on SIGTERM (packaging/entry.py, server/app.py)
    instead of serving on as an orphan, and removes what the bootloader unpacked."""
    unpack = tmp_path / "unpack"
    unpack.mkdir()
    proc = subprocess.Popen([str(binary), "serve", "--listen", "127.0.0.1:0", "--data-dir",
                             str(tmp_path / "data")], env=dict(os.environ, TMPDIR=str(unpack)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    out = LineCollector(proc.stderr)
    broker = None
    try:
        assert out.wait(lambda ln: ln.endswith(" ready"), 30), out.text()
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
            [broker] = [int(x) for x in fh.read().split()]
        proc.kill()
        proc.wait(10)
        assert out.wait(lambda ln: ln.endswith("stopped"), 10), \
            f"the orphan did not stop:\n{out.text()}"
        out.join(10)
        assert out.eof, out.text()                      # its end of the pipe: closed
        assert_stopped_as_orphan(out.lines, out.text(), proc.pid)
        assert list(unpack.iterdir()) == [], "the orphan left the unpacked files behind"
    finally:
        kill_quietly(broker)
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_socket_activation_through_the_bootloader(binary, broker, monkeypatch, tmp_path):
    """As systemd starts it with edgebroker.socket: LISTEN_PID names the bootloader (the
    wrapper's pid, kept by exec) and the broker, its child, takes the sockets; callers that
    connect while it is stopped are served by the next start."""
    monkeypatch.setenv("EDGEBROKER_TEST_BROKER", str(binary))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    unit = SocketUnit()
    try:
        port = unit.listen_tcp("mqtt")
        config = dict(listener=[{"host": "127.0.0.1", "port": port}],
                      data_dir=str(tmp_path / "state"))
        first = broker(wrap=unit.wrap, pass_fds=unit.fds, **config)
        assert first.wait_log(f"listening on 127.0.0.1:{port} (socket from systemd", 0)
        assert first.client("before").ping() == []
        assert first.stop() == 0
        waiting = m.RawClient("127.0.0.1", port)     # queued by the kernel, not refused
        waiting.send(m.connect("while-stopped"))
        broker(wrap=unit.wrap, pass_fds=unit.fds, **config)
        assert waiting.expect(m.CONNACK, timeout=10).rc == 0
        waiting.close()
    finally:
        unit.close()


def test_binary_replaced_under_the_running_broker(binary, broker, monkeypatch, tmp_path):
    """An upgrade renames a new file over the binary (dpkg, `install`) while the broker runs
    on; until its restart, the modules it imports late (the password check's at the first
    login, the TOML parser's at each reload) still come from the file it was started from."""
    installed = tmp_path / "bin" / "edgebroker"
    installed.parent.mkdir()
    shutil.copy(binary, installed)
    monkeypatch.setenv("EDGEBROKER_TEST_BROKER", str(installed))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    pw = write_passwords(tmp_path / "passwd", {"alice": "secret"})
    b = broker(password_file=str(pw))
    # The new version: other bytes at every offset of the old one (here the same binary behind
    # a page of zeros), renamed over the path as an upgrade does.
    new = tmp_path / "bin" / "edgebroker.new"
    with open(binary, "rb") as src, open(new, "wb") as dst:
        dst.write(bytes(4096))
        shutil.copyfileobj(src, dst)
    os.replace(new, installed)

    first = b.client("first-login", username="alice", password="secret")   # rc 0 or it fails
    first.close()
    start = b.mark()
    b.send_signal(signal.SIGHUP)
    ends = ("configuration reloaded", "reload failed", "Traceback")
    assert b.wait_log(lambda ln: any(e in ln for e in ends), timeout=15, start=start), \
        b.log_text()
    assert any("configuration reloaded" in ln for ln in b.logs[start:]), b.log_text()
    again = b.client("after-reload", username="alice", password="secret")
    again.close()
    assert b.stop() == 0, b.log_text()
    assert "Traceback" not in b.log_text(), b.log_text()
