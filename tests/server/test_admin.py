"""The admin socket and `edgebroker inspect stats|clients` against a running broker
(docs/metrics.md)."""

import contextlib
import json
import os
import re
import socket
import stat

import psutil

import mqttraw as m
from conftest import run_cli


def ask_raw(path, *lines: bytes, timeout=5.0) -> list[dict]:
    """Send raw request lines on one connection; one parsed reply per line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(b"".join(lines))
        buf = b""
        while buf.count(b"\n") < len(lines):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return [json.loads(line) for line in buf.splitlines()]


def test_admin_socket_is_private_and_answers_json_lines(broker, uid):
    b = broker()
    mode = os.stat(b.admin_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    b.client(uid)
    replies = ask_raw(b.admin_path, b'{"cmd": "stats"}\n', b"clients\n", b"help\n",
                      b"{not json\n", b'{"cmd": "nope"}\n', b'{"cmd": "clients", "sort": "x"}\n',
                      b'{"cmd": "clients", "limit": -1}\n', b"[1]\n")
    assert [r["ok"] for r in replies] == [True, True, True, False, False, False, False, False]
    assert replies[0]["stats"]["clients_connected"] == 1
    assert replies[1]["total"] == 1 and replies[1]["clients"][0]["id"] == uid
    assert set(replies[2]["commands"]) >= {"stats", "clients", "help"}
    assert "not valid JSON" in replies[3]["error"] and "unknown command" in replies[4]["error"]


def test_a_request_nested_too_deep_is_not_valid_json(broker):
    b = broker()
    mark = b.mark()
    (reply,) = ask_raw(b.admin_path, b'{"cmd": ' + b"[" * 30_000 + b"\n")
    assert reply["ok"] is False and "not valid JSON" in reply["error"]
    assert not [ln for ln in b.logs[mark:] if "internal error" in ln or "Traceback" in ln]


def test_admin_request_line_is_bounded(broker):
    b = broker()
    replies = ask_raw(b.admin_path, b"x" * 70_000)
    assert replies and "longer than" in replies[0]["error"]
    assert b.stats()["clients_connected"] == 0  # still serving


def test_a_burst_of_requests_is_answered_as_the_caller_reads_them(broker):
    """10,000 requests in one write, their caller not reading: the broker answers a few per
    pass and goes on only as the replies are taken, so another caller is served meanwhile and
    the replies do not pile up in the broker's memory (each `stats` reply is about 2 KB)."""
    b = broker()
    proc = psutil.Process(b.proc.pid)
    before = proc.memory_info().rss
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(b.admin_path))
        s.sendall(b"stats\n" * 10_000)
        assert b.stats()["clients_connected"] == 0    # another caller, served meanwhile
        grown = proc.memory_info().rss - before
        buf = b""
        while buf.count(b"\n") < 10_000:
            chunk = s.recv(1 << 20)
            assert chunk, f"closed after {len(buf.splitlines())} replies"
            buf += chunk
    replies = [json.loads(line) for line in buf.splitlines()]
    assert len(replies) == 10_000 and all(r["ok"] and "stats" in r for r in replies)
    assert grown < 8 << 20, f"RSS grew {grown >> 20} MB while the replies waited"


def test_inspect_stats(broker, uid):
    b = broker()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"x")
    assert pub.ping() == []
    data = b.config["data_dir"]
    r = run_cli("inspect", "stats", "--data-dir", data)
    assert r.returncode == 0, r.stderr
    assert "clients     1 connected" in r.stdout and "publish     1 received" in r.stdout
    assert "0 dropped, 0 lost (record gone), 0 refused (log not writing)" in r.stdout
    assert ("security    logins 0 failed, 0 refused; ACL denied 0 publishes, 0 subscriptions, "
            "0 deliveries; TLS handshakes 0 failed") in r.stdout
    assert "loop        pass p50" in r.stdout and "limits hit  none" in r.stdout
    assert re.search(r"busy polls \d+ hit / \d+ missed, (not CPU-contended|CPU-CONTENDED now "
                     r"\(no busy polls, no early sends\)), \d+ episodes \(\d+\.\d s\)", r.stdout)
    assert "log         durability batch, next offset 1, written 1," in r.stdout
    r = run_cli("inspect", "stats", "-c", str(b.config_path), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["counters"]["publish_received"] == 1 and "max_topics" in s["limit_hits"]
    assert s["log"]["next_offset"] == s["log"]["written_offset"] == 1


def test_inspect_clients_sorted_limited_and_watched(broker, uid):
    b = broker()
    busy, calm = b.client(f"{uid}-busy"), b.client(f"{uid}-calm")
    busy.send(b"".join(m.publish(f"{uid}/b", b"x") for _ in range(50)))
    calm.publish(f"{uid}/c", b"x")
    assert busy.ping() == [] and calm.ping() == []
    data = b.config["data_dir"]
    r = run_cli("inspect", "clients", "--data-dir", data, "--sort", "msgs_in", "--limit", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "2 clients connected; sorted by msgs_in"
    assert lines[1].split()[:4] == ["CLIENT", "ID", "PEER", "MQTT"]
    assert len(lines) == 3 and lines[2].startswith(f"{uid}-busy")
    assert lines[2].split()[2] == "3.1.1"
    assert lines[2].split()[7:9] == ["50", "0"]  # IN, OUT
    r = run_cli("inspect", "clients", "--data-dir", data, "--sort", "id", "--json")
    rows = json.loads(r.stdout)["clients"]
    assert [row["id"] for row in rows] == [f"{uid}-busy", f"{uid}-calm"]
    assert rows[0]["msgs_in"] == 50 and rows[0]["bytes_in"] > 50
    r = run_cli("inspect", "clients", "--data-dir", data, "--watch", "0.1", "--iterations", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("2 clients connected; sorted by msgs_in_rate") == 3


def test_inspect_without_a_broker_says_so(tmp_path):
    r = run_cli("inspect", "stats", "--data-dir", str(tmp_path))
    assert r.returncode == 1
    assert "cannot reach the broker's admin socket" in r.stderr and str(tmp_path) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_inspect_by_a_user_the_admin_socket_refuses_says_to_run_as_the_brokers_user(broker):
    """The admin socket is the broker's user's alone (0600): another user got "Permission
    denied (is the broker running with this data directory?)", which sends one looking for
    the wrong thing (ops5)."""
    import shutil
    import subprocess
    from conftest import REPO, broker_command
    assert os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv (util-linux)"
    b = broker()
    os.chmod(b.config["data_dir"], 0o755)       # the directory may be read; the socket not
    other = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]    # nobody
    r = subprocess.run([*other, *broker_command(), "inspect", "stats",
                        "--data-dir", b.config["data_dir"]], cwd=REPO, capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "admin.sock: Permission denied (run this as the broker's user (or root))" in r.stderr
    assert "is the broker running" not in r.stderr


def test_stale_socket_is_replaced_and_a_second_broker_refused(broker, tmp_path):
    data = tmp_path / "shared"
    data.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(data / "admin.sock"))  # left behind: bound, nobody listening
    stale.close()
    b = broker(data_dir=str(data))
    assert b.stats()["clients_connected"] == 0
    second = broker(data_dir=str(data), wait=False)
    assert second.proc.wait(10) == 1
    second.stopped = True
    assert second.wait_log("another broker is running with this state directory")
    assert b.stats()["clients_connected"] == 0  # the first one is untouched
    b.stop()
    assert not (data / "admin.sock").exists()


def test_every_sort_key(broker, uid):
    from edgebroker.core.metrics import SORT_KEYS

    b = broker()
    a, z = b.client(f"{uid}-a"), b.client(f"{uid}-z")
    z.send(b"".join(m.publish(f"{uid}/z", b"x" * 100) for _ in range(3)))
    z.subscribe(f"{uid}/z")
    assert z.ping() == [] and a.ping() == []
    for key in SORT_KEYS:
        reply = b.admin("clients", sort=key, limit=1)
        assert reply["total"] == 2 and len(reply["clients"]) == 1, key
    assert b.admin("clients", sort="id", limit=1)["clients"][0]["id"] == f"{uid}-a"
    for key in ("msgs_in", "bytes_in", "subscriptions", "msgs_in_rate"):
        assert b.admin("clients", sort=key, limit=1)["clients"][0]["id"] == f"{uid}-z", key


def test_a_second_broker_keeps_off_the_admin_socket_of_one_that_does_not_answer(broker, tmp_path):
    """A running broker that does not accept for a moment (stopped here) with its admin queue
    full: the probe of a second broker gets no answer, which is not "nobody listens": it
    refuses to start and leaves the socket file alone."""
    import signal

    data = tmp_path / "shared"
    b = broker(data_dir=str(data))
    inode = os.stat(b.admin_path).st_ino
    held = []
    b.send_signal(signal.SIGSTOP)
    try:
        for _ in range(64):      # the listen backlog is 8: fill it
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(str(b.admin_path))
            except BlockingIOError:
                s.close()
                break
            held.append(s)
        else:
            raise AssertionError("the admin socket's queue never filled")
        second = broker(data_dir=str(data), wait=False)
        assert second.proc.wait(15) == 1
        second.stopped = True
        assert second.wait_log("its admin socket") and second.wait_log("does not answer")
        assert os.stat(b.admin_path).st_ino == inode
    finally:
        for s in held:
            s.close()
        b.send_signal(signal.SIGCONT)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(b.admin_path))   # blocking: waits for the broker to take the queue
        s.settimeout(5)
        try:
            s.sendall(b"stats\n")
        except BrokenPipeError:      # answered "busy" and closed before the request went
            pass
        reply = json.loads(s.makefile("rb").readline())
    # The first broker answers on its socket (maybe "busy": the held connections it accepted
    # first may not be closed on its side yet; its reply is read after the close).
    assert (reply["ok"] and reply["stats"]["clients_connected"] == 0
            or "busy" in reply.get("error", "")), reply
    assert b.alive()


def test_inspect_clients_watch_connects_again_when_the_broker_closed_the_connection(
        broker, tmp_path, uid):
    """`--watch` asks on one connection; one the broker closed between two refreshes (the
    broker drops a connection idle for 60 s; here it restarts) is opened again instead of
    ending the command with an error. The command is stopped while the broker restarts, so
    its next refresh comes after."""
    import signal
    import subprocess

    from conftest import REPO, broker_command

    data = tmp_path / "shared"
    b = broker(data_dir=str(data))
    b.client(uid)
    cli = subprocess.Popen([*broker_command(), "inspect", "clients", "--data-dir", str(data),
                            "--watch", "3", "--iterations", "2", "--format", "json"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(cli.stdout.readline())
        cli.send_signal(signal.SIGSTOP)
        b.stop()
        broker(data_dir=str(data))
        cli.send_signal(signal.SIGCONT)
        out, err = cli.communicate(timeout=20)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)
    assert cli.returncode == 0, err
    assert first["total"] == 1 and json.loads(out)["total"] == 0


@contextlib.contextmanager
def watching(data):
    """``inspect clients --watch 0.2 --format json`` on the broker of ``data``: (its stdout
    lines, its stderr lines) once its first reply (no client) is in; on leaving, SIGTERM must
    end it with 0, without a traceback."""
    import signal
    import subprocess

    from conftest import REPO, LineCollector, broker_command

    cli = subprocess.Popen([*broker_command(), "inspect", "clients", "--data-dir", str(data),
                            "--watch", "0.2", "--format", "json"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = LineCollector(cli.stdout), LineCollector(cli.stderr)
    try:
        assert out.wait(lambda line: json.loads(line)["total"] == 0, 10), err.text()
        yield out, err
        assert cli.poll() is None
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(10) == 0, err.text()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)
    assert "Traceback" not in err.text(), err.text()


def test_inspect_clients_watch_goes_on_through_a_broker_restart(broker, tmp_path, uid):
    """A refresh that finds no broker (a restart's down time: no socket file) says so on
    standard error and the next refreshes try again; it exited 1 with "cannot reach the
    broker's admin socket" and stopped watching. SIGTERM still ends it with 0."""
    data = tmp_path / "shared"
    b = broker(data_dir=str(data))
    with watching(data) as (out, err):
        b.stop()
        down = err.wait("the broker is not answering on", 10)
        assert down and str(data / "admin.sock") in down and "trying again in 0.2 s" in down, \
            err.text()
        seen = len(out.lines)
        broker(data_dir=str(data)).client(uid)
        assert out.wait(lambda line: json.loads(line)["total"] == 1, 10, start=seen), \
            (out.text(), err.text())
    assert "cannot reach" not in err.text(), err.text()


def test_inspect_clients_watch_goes_on_through_a_broker_that_does_not_answer(broker, tmp_path):
    """A refresh the broker takes and does not answer within 10 s (a start replaying a long
    log opens the admin socket before its loop answers; here a stopped process) says so and
    the next refreshes try again; it ended the watch with exit 1."""
    import signal

    data = tmp_path / "shared"
    b = broker(data_dir=str(data))
    with watching(data) as (out, err):
        b.proc.send_signal(signal.SIGSTOP)
        try:
            down = err.wait("the broker is not answering on", 20)
        finally:
            b.proc.send_signal(signal.SIGCONT)
        assert down and "(no answer within 10 s)" in down, err.text()
        seen = len(out.lines)
        assert out.wait(lambda line: json.loads(line)["total"] == 0, 10, start=seen), \
            (out.text(), err.text())


def test_inspect_clients_watch_iterations_ending_without_a_broker_exits_1(broker, tmp_path):
    """--iterations counts the refreshes that found no broker: the command ends, with 1 when
    the last one found none."""
    import signal
    import subprocess

    from conftest import REPO, LineCollector, broker_command

    data = tmp_path / "shared"
    b = broker(data_dir=str(data))
    cli = subprocess.Popen([*broker_command(), "inspect", "clients", "--data-dir", str(data),
                            "--watch", "1", "--iterations", "3", "--format", "json"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = LineCollector(cli.stdout)
    try:
        assert out.wait(lambda line: json.loads(line)["total"] == 0, 10)
        cli.send_signal(signal.SIGSTOP)      # the next refreshes come after the stop
        b.stop()
        cli.send_signal(signal.SIGCONT)
        assert cli.wait(15) == 1
        assert cli.stderr.read().count("the broker is not answering on") == 2
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)
