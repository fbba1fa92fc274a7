"""The operator's command line, tried as a new user would (issue 24): one `--format` for every
command that prints a report, usage errors that show the command's own usage, quiet ends on a
closed pipe (`| head`), SIGTERM ending `--watch`, and `config check` reporting every problem.
Each runs the real command in a subprocess."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time

import pytest

import mqttraw as m
from commitlog.logutil import append_n, open_log
from conftest import REPO, broker_command, run_cli, sigint_ignored, wait_for_snapshot

CLOSED_PIPE = 141


def ignore_sigint():
    """preexec_fn: the child starts with SIGINT ignored, as a background job of a script (or
    under some CI runners) does; Python then leaves it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ------------------------------------------------------------------------------ --format

def test_every_report_command_takes_format_json(broker, tmp_path, uid):
    """`inspect stats --format json` failed (the live commands took --json only) while the
    README promised --format json for all."""
    b = broker(upload={"url": f"file://{tmp_path}/landing"})
    c = b.client(uid, clean=False)
    c.subscribe(f"{uid}/t", qos=1)
    c.publish(f"{uid}/t", b"hello", qos=1)
    assert c.recv_publish().payload == b"hello"
    data = b.config["data_dir"]
    wait_for_snapshot(data, uid)
    where = ["--data-dir", data]

    def report(*args):
        r = run_cli(*args, "--format", "json")
        assert r.returncode == 0, (args, r.stderr)
        return r.stdout

    stats = json.loads(report("inspect", "stats", *where))
    assert stats["counters"]["publish_received"] == 1
    clients = json.loads(report("inspect", "clients", *where))
    assert [row["id"] for row in clients["clients"]] == [uid]
    assert json.loads(report("inspect", "segments", *where))[0]["records"] == 1
    assert json.loads(report("inspect", "topics", *where)) == [
        {"topic": f"{uid}/t", "messages": 1, "bytes": 5,
         "last_timestamp_ms": json.loads(report("inspect", "tail", *where))["timestamp_ms"]}]
    assert json.loads(report("inspect", "verify", *where))["ok"] is True
    sessions = json.loads(report("inspect", "sessions", *where))["sessions"]
    assert [s["client_id"] for s in sessions] == [uid]
    assert json.loads(report("upload", "status", *where))["running"] is True
    paused = json.loads(report("upload", "pause", *where))
    assert paused["changed"] is True and paused["upload"]["paused"] is True
    assert json.loads(report("upload", "resume", *where))["upload"]["paused"] is False
    check = json.loads(report("config", "check", "-c", str(b.config_path)))
    assert check["ok"] is True and check["problems"] == [] and check["state_dir"] == data
    # --json stays, unlisted, as another name for --format json
    r = run_cli("inspect", "stats", *where, "--json")
    assert json.loads(r.stdout)["counters"]["publish_received"] == 1


def test_every_command_that_prints_a_report_lists_format():
    from edgebroker.cli.main import build_parser

    def leaves(parser, path):
        subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            yield path, parser
        for action in subs:
            for name, sub in action.choices.items():
                yield from leaves(sub, path + [name])

    found = {" ".join(path): p for path, p in leaves(build_parser(), [])}
    assert sorted(found) == [
        "config check", "config reload", "inspect bridges", "inspect clients", "inspect segments",
        "inspect sessions",
        "inspect stats", "inspect tail", "inspect topics", "inspect verify", "passwd", "pub",
        "serve", "sub", "upload pause", "upload resume", "upload run", "upload status"]
    for name, parser in found.items():
        options = {o: a for a in parser._actions for o in a.option_strings}
        if name in ("serve", "passwd", "config reload", "pub", "sub"):   # the log, one line of
            # what changed, the messages (pub and sub speak mosquitto_pub/sub's options)
            assert "--format" not in options
            continue
        assert options["--format"].choices == ("text", "json"), name
        assert "--format" in parser.format_help() and "--json" not in parser.format_help()


def test_a_usage_error_shows_the_commands_usage():
    r = run_cli("inspect", "stats", "--bogus")
    assert r.returncode == 2
    assert r.stderr.startswith("usage: edgebroker inspect stats ")
    assert "[--format {text,json}]" in r.stderr
    assert r.stderr.rstrip().endswith(
        "edgebroker inspect stats: error: unrecognized arguments: --bogus")
    r = run_cli("upload", "--bogus", "status")
    assert r.returncode == 2 and r.stderr.startswith("usage: edgebroker upload ")


# --------------------------------------------------------------------------- closed pipes

def test_clients_watch_into_head_ends_quietly(broker, uid):
    """`inspect clients --watch | head` ended in a BrokenPipeError traceback."""
    b = broker()
    b.client(uid)
    command = " ".join([*broker_command(), "inspect", "clients", "--data-dir",
                        b.config["data_dir"], "--watch", "0.05"])
    err, status = b.workdir / "inspect.err", b.workdir / "status"
    r = subprocess.run(["bash", "-c", f'{command} 2>{err} | head -n 3; '
                                      f'echo "${{PIPESTATUS[0]}}" >{status}'],
                       cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.stdout.splitlines()[1:] == ["1 clients connected; sorted by msgs_in_rate",
                                         r.stdout.splitlines()[2]]
    assert r.stdout.splitlines()[2].startswith("CLIENT ID")
    assert err.read_text() == ""
    assert status.read_text().strip() == str(CLOSED_PIPE)


def test_clients_watch_stops_on_sigterm_where_sigint_is_ignored(broker, uid):
    b = broker()
    b.client(uid)
    proc = subprocess.Popen([*broker_command(), "inspect", "clients", "--data-dir",
                             b.config["data_dir"], "--watch", "0.05"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=ignore_sigint)
    try:
        read_until(proc.stdout.fileno(), b"CLIENT ID")
        assert sigint_ignored(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def closed_pipe():
    """The write end of a pipe whose reader has already gone."""
    r, w = os.pipe()
    os.close(r)
    return w


def test_every_command_is_quiet_on_a_closed_pipe(broker, tmp_path, uid):
    """The reader of stdout (or of stderr) is gone before the command writes: exit 141, no
    traceback, no 'Exception ignored' at exit; the work itself is done."""
    b = broker()
    b.client(uid).publish(f"{uid}/t", b"x", qos=1)
    data = b.config["data_dir"]
    pw = tmp_path / "passwd"
    commands = [
        ["inspect", "stats", "--data-dir", data], ["inspect", "clients", "--data-dir", data],
        ["inspect", "bridges", "--data-dir", data],
        ["inspect", "segments", "--data-dir", data], ["inspect", "topics", "--data-dir", data],
        ["inspect", "tail", "--data-dir", data], ["inspect", "verify", "--data-dir", data],
        ["upload", "status", "--data-dir", data], ["config", "check", "-c", str(b.config_path)],
        ["passwd", "-b", str(pw), "alice", "secret"], ["--version"],
    ]
    for args in commands:
        w = closed_pipe()
        try:
            p = subprocess.run([*broker_command(), *args], cwd=REPO, stdout=w,
                               stderr=subprocess.PIPE, text=True, timeout=30)
        finally:
            os.close(w)
        assert (p.returncode, p.stderr) == (CLOSED_PIPE, ""), args
    assert pw.read_text().startswith("alice:$scrypt$")
    # stderr gone: a command's error message cannot be written either
    bad = tmp_path / "bad.toml"
    bad.write_text("log_levl = 1\n")
    w = closed_pipe()
    try:
        p = subprocess.run([*broker_command(), "config", "check", "-c", str(bad)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=w, text=True, timeout=30)
    finally:
        os.close(w)
    assert (p.returncode, p.stdout) == (CLOSED_PIPE, "")


def read_until(fd: int, text: bytes, timeout: float = 15.0) -> bytes:
    """What the pipe ``fd`` gives until ``text`` has come (fails after ``timeout``)."""
    got = b""
    deadline = time.monotonic() + timeout
    while text not in got:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{text!r} not seen: {got!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        chunk = os.read(fd, 65536) if ready else b""
        assert chunk or not ready, f"end of output before {text!r}: {got!r}"
        got += chunk
    return got


def test_serve_keeps_serving_when_the_reader_of_its_log_goes(tmp_path, uid):
    """`edgebroker serve 2>&1 | head`: once head has gone, the broker still serves, and
    SIGTERM stops it cleanly."""
    r, w = os.pipe()
    proc = subprocess.Popen([*broker_command(), "serve", "--listen", "127.0.0.1:0",
                             "--data-dir", str(tmp_path / "data")], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=w, stderr=w)
    os.close(w)
    try:
        log = read_until(r, b" ready\n").decode()
    finally:
        os.close(r)                    # the reader goes
    try:
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", log).group(1))
        sub = m.RawClient("127.0.0.1", port)
        assert sub.connect(f"{uid}-s").rc == 0        # each connect is a log line: EPIPE
        sub.subscribe(f"{uid}/t", qos=1)
        pub = m.RawClient("127.0.0.1", port)
        assert pub.connect(f"{uid}-p").rc == 0
        pub.publish(f"{uid}/t", b"still serving", qos=1)
        assert sub.recv_publish().payload == b"still serving"
        sub.close()
        pub.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


# ---------------------------------------------------------------------------- config check

def config_problems(stderr: str) -> list[str]:
    prefix = "edgebroker: config error: "
    lines = stderr.splitlines()
    assert all(line.startswith(prefix) for line in lines), stderr
    return [line[len(prefix):] for line in lines]


def test_config_check_reports_every_problem_at_once(tmp_path):
    """`config check` stopped at the first problem: fix one, run again, find the next."""
    acl = tmp_path / "acl"
    acl.write_text("topic read a\nuser\n")
    path = tmp_path / "edgebroker.toml"
    path.write_text(f"""\
data_dir = "{tmp_path / 'data'}"
log_levl = "debug"
acl_file = "{acl}"

[limits]
max_inflight_messages = "many"
max_conections = 5
sys_interval = 1

[log]
durability = "fast"

[[listener]]
host = "127.0.0.1"
port = 8883
certfile = "{tmp_path / 'missing.crt'}"

[[listener]]
host = "0.0.0.0"
port = 1883
keyfile = "x.key"
""")
    f = str(path)
    want = [
        f"{f}: log_levl: unknown setting; did you mean log_level?",
        f"{f}: limits.max_inflight_messages: expected an integer, got 'many'",
        f"{f}: limits.max_conections: unknown setting; did you mean limits.max_connections?",
        f"{f}: limits.sys_interval: unknown setting; did you mean sys_interval? (a top-level "
        f"setting: put it above the first [table])",
        f"{f}: log.durability: must be one of 'none', 'batch', 'sync', got 'fast'",
        f"{f}: listener[1].keyfile: needs certfile (TLS settings apply only to a TLS listener)",
        f"{f}: listener 0.0.0.0:1883 is reachable from the network and has no authentication: "
        f"set password_file (clients log in) or allow_anonymous = true (anyone may connect), at "
        f"the top level or in its [[listener]] table",
        f"{f}: listener[0].certfile: {tmp_path / 'missing.crt'}: file not found",
        f"{f}: acl_file: {acl} line 2: 'user' needs a user name",
    ]
    r = run_cli("config", "check", "-c", f)
    assert r.returncode == 2 and r.stdout == ""
    assert config_problems(r.stderr) == want
    r = run_cli("config", "check", "-c", f, "--format", "json")
    assert r.returncode == 2
    report = json.loads(r.stdout)
    assert report["ok"] is False and report["problems"] == want
    # serve names them all too, the files' problems with the keys'
    r = run_cli("serve", "-c", f)
    assert r.returncode == 2 and config_problems(r.stderr) == want


def test_config_check_without_a_file_checks_what_serve_runs(tmp_path):
    """`config check` needed -c; without it, it checks the built-in defaults that `serve`
    without -c runs (one listener on 127.0.0.1:1883, the state directory as serve finds it)."""
    r = subprocess.run([*broker_command(), "config", "check"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(REPO),
                                                       STATE_DIRECTORY=str(tmp_path / "state")))
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (f"built-in defaults: OK (listeners: 127.0.0.1:1883; state directory: "
                        f"{tmp_path / 'state'})\n")


# ----------------------------------------------------------------------------- start-up log

def test_start_up_log_says_empty_for_an_empty_log(broker, tmp_path, uid):
    """It said `offsets 0..-1`."""
    data = str(tmp_path / "data")
    b = broker(data_dir=data)
    line = b.wait_log("commit log ")
    assert ": 1 segments, empty (next offset 0), opened in " in line, line
    b.client(uid).publish(f"{uid}/t", b"x", qos=1)
    assert b.stop() == 0
    b = broker(data_dir=data)
    line = b.wait_log("commit log ")
    assert ": 1 segments, offsets 0..0, opened in " in line, line
