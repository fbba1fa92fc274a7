"""The broker process: CLI, config validation and exit codes, signals, listeners, --version."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

import mqttraw as m
from conftest import REPO, as_nobody, broker_command, run_cli, toml_dumps
from mqttraw import ConnectionClosed


# ---------------------------------------------------------------------------------------------
# --version
# ---------------------------------------------------------------------------------------------

def test_version():
    """The version and the native backend this installation runs (C here: it is built)."""
    r = run_cli("--version")
    assert r.returncode == 0, r.stderr
    out = (r.stdout + r.stderr).strip()
    import edgebroker

    assert re.fullmatch(r"edgebroker \d+\.\d+\.\d+\S* \(native backend: c, CRC32C: \S+; Python [\d.]+\)",
                        out), out
    assert out.startswith(f"edgebroker {edgebroker.__version__} ")


@pytest.mark.parametrize("columns", [60, 200])
def test_help_names_every_command_at_the_terminal_width(monkeypatch, columns):
    """The top-level help lists every command (each parser comes from its command's module),
    wrapped at $COLUMNS as argparse wraps it (the width is found without argparse's shutil)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    for command in ("serve", "config", "inspect", "passwd", "upload"):
        assert re.search(rf"^ +{command} +\S", r.stdout, re.M), r.stdout
    longest = max(len(line) for line in r.stdout.splitlines())
    assert longest <= columns - 2 and (columns < 100 or longest > 60), r.stdout


def test_version_names_the_fallback(monkeypatch):
    """With the pure-Python twin, --version says so and why."""
    monkeypatch.setenv("EDGEBROKER_NATIVE", "python")
    r = run_cli("--version")
    assert r.returncode == 0, r.stderr
    assert "(native backend: python (EDGEBROKER_NATIVE=python); Python " in r.stdout, r.stdout


# ---------------------------------------------------------------------------------------------
# Wrong configuration: exit code 2 and exactly one stderr line naming the key and the problem
# ---------------------------------------------------------------------------------------------

def base_config(tmp_path):
    return {"data_dir": str(tmp_path / "data"), "sys_interval": 0,
            "listener": [{"host": "127.0.0.1", "port": 0}]}


BAD_CONFIGS = [
    # (id, top-level overrides, words the single error line must contain)
    ("unknown-top-key", {"bogus_key": 1}, ["bogus_key"]),
    ("unknown-limits-key", {"limits": {"bogus_limit": 1}}, ["bogus_limit"]),
    ("unknown-listener-key", {"listener": [{"host": "127.0.0.1", "port": 0, "colour": "red"}]}, ["colour"]),
    ("inflight-string", {"limits": {"max_inflight_messages": "20"}}, ["limits.max_inflight_messages"]),
    ("inflight-bool", {"limits": {"max_inflight_messages": True}}, ["limits.max_inflight_messages"]),
    ("inflight-negative", {"limits": {"max_inflight_messages": -1}}, ["limits.max_inflight_messages"]),
    ("inflight-float", {"limits": {"max_inflight_messages": 2.5}}, ["limits.max_inflight_messages"]),
    ("queued-negative", {"limits": {"max_queued_messages": -5}}, ["limits.max_queued_messages"]),
    ("packet-size-zero", {"limits": {"max_packet_size": 0}}, ["limits.max_packet_size"]),
    ("connect-timeout-string", {"limits": {"connect_timeout": "10s"}}, ["limits.connect_timeout"]),
    ("connect-timeout-negative", {"limits": {"connect_timeout": -1}}, ["limits.connect_timeout"]),
    ("keepalive-too-big", {"limits": {"max_keepalive": 70000}}, ["limits.max_keepalive"]),
    ("qos0-not-bool", {"limits": {"queue_qos0_messages": "yes"}}, ["limits.queue_qos0_messages"]),
    ("log-level", {"log_level": "loud"}, ["log_level"]),
    ("log-level-type", {"log_level": 3}, ["log_level"]),
    ("sys-interval-negative", {"sys_interval": -1}, ["sys_interval"]),
    ("zero-id-not-bool", {"allow_zero_length_clientid": "true"}, ["allow_zero_length_clientid"]),
    ("prefix-not-string", {"auto_id_prefix": 5}, ["auto_id_prefix"]),
    ("data-dir-not-string", {"data_dir": 5}, ["data_dir"]),
    ("port-too-big", {"listener": [{"host": "127.0.0.1", "port": 70000}]}, ["port"]),
    ("port-string", {"listener": [{"host": "127.0.0.1", "port": "1883"}]}, ["port"]),
    ("limits-not-table", {"limits": 5}, ["limits"]),
    ("listener-not-array", {"listener": "127.0.0.1:1883"}, ["listener"]),
]


def one_error_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{r.stderr}"
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.mark.parametrize("overrides,words", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_exits_2_with_one_line(tmp_path, overrides, words):
    cfg = {**base_config(tmp_path), **overrides}
    path = tmp_path / "bad.toml"
    path.write_text(toml_dumps(cfg))
    r = run_cli("serve", "-c", str(path))
    assert r.returncode == 2, f"exit code {r.returncode}; stderr:\n{r.stderr}"
    line = one_error_line(r)
    for w in words:
        assert w in line, f"{w!r} not named in: {line}"


def test_toml_syntax_error_exits_2(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('log_level = "info\n[limits\n')
    r = run_cli("serve", "-c", str(path))
    assert r.returncode == 2, r.stderr
    one_error_line(r)


def test_missing_config_file_exits_2(tmp_path):
    path = tmp_path / "does-not-exist.toml"
    r = run_cli("serve", "-c", str(path))
    assert r.returncode == 2, r.stderr
    line = one_error_line(r)
    assert "does-not-exist.toml" in line, line


def test_bad_listen_argument_exits_2(tmp_path):
    r = run_cli("serve", "--listen", "127.0.0.1:notaport", "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr


def test_bad_config_does_not_start_listening(tmp_path):
    cfg = {**base_config(tmp_path), "log_level": "loud"}
    path = tmp_path / "bad.toml"
    path.write_text(toml_dumps(cfg))
    r = run_cli("serve", "-c", str(path))
    assert r.returncode == 2
    assert "listening on" not in r.stderr


# ---------------------------------------------------------------------------------------------
# Starting, listeners, data dir
# ---------------------------------------------------------------------------------------------

def test_config_file_with_all_keys_accepted(broker, uid):
    b = broker(log_level="debug", sys_interval=0, allow_zero_length_clientid=True, auto_id_prefix="gw-",
               limits={"connect_timeout": 5, "max_keepalive": 600, "max_packet_size": 65536,
                       "max_client_id_length": 100, "max_inflight_messages": 10,
                       "max_queued_messages": 50, "queue_qos0_messages": True})
    c = b.client(uid)
    assert c.ping() == []


def test_listen_overrides_config(broker, uid):
    b = broker(args=["--listen", "127.0.0.1:0"], listener=[{"host": "127.0.0.1", "port": 1}])
    assert len(b.listeners) == 1 and b.port not in (0, 1)
    assert b.client(uid).ping() == []


def test_listen_without_config_file(broker, tmp_path, uid):
    b = broker(config_file=False, args=["--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "state")])
    assert b.client(uid).ping() == []


def test_data_dir_option_overrides_config(broker, tmp_path):
    target = tmp_path / "from-cli"
    b = broker(args=["--data-dir", str(target)])
    assert b.client("x").ping() == []
    assert target.is_dir(), "--data-dir directory not created"


def test_two_listeners(broker, uid):
    b = broker(listener=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0}])
    assert len(b.listeners) == 2 and b.listeners[0][1] != b.listeners[1][1]
    sub = b.client(f"{uid}-s", port=b.listeners[1][1])
    sub.subscribe(f"{uid}/t")
    pub = b.client(f"{uid}-p", port=b.listeners[0][1])
    pub.publish(f"{uid}/t", b"across listeners", qos=1)
    assert sub.recv_publish().payload == b"across listeners"


# ---------------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------------

def test_sigterm_exits_0(broker):
    b = broker()
    assert b.stop(signal.SIGTERM) == 0


def test_sigint_exits_0(broker):
    b = broker()
    assert b.stop(signal.SIGINT) == 0


def test_sigterm_with_connected_clients_exits_0_and_closes_them(broker, uid):
    b = broker()
    clients = [b.client(f"{uid}-{i}") for i in range(5)]
    clients[0].subscribe(f"{uid}/t", qos=1)
    assert b.stop(signal.SIGTERM) == 0
    for c in clients:
        assert c.expect_closed(5)


def test_sigterm_delivers_already_accepted_messages(broker, uid):
    """Drain: messages the broker acknowledged before SIGTERM are written to connected subscribers."""
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=0)
    pub = b.client(f"{uid}-p")
    for i in range(50):
        pub.publish(f"{uid}/t", str(i), qos=1)
    assert b.stop(signal.SIGTERM) == 0
    got = []
    while True:
        try:
            got.append(int(sub.recv_publish().payload))
        except (ConnectionClosed, TimeoutError):
            break
    assert got == list(range(50))


def test_sighup_reloads_and_keeps_connections(broker, uid):
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload" in ln.lower(), timeout=5, start=mark), \
        "no 'reload' log line after SIGHUP"
    assert b.alive()
    assert sub.ping() == []
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/t", b"after reload", qos=1)
    assert sub.recv_publish().payload == b"after reload"


def test_sighup_twice(broker, uid):
    b = broker()
    c = b.client(uid)
    for _ in range(2):
        mark = b.mark()
        b.send_signal(signal.SIGHUP)
        assert b.wait_log(lambda ln: "reload" in ln.lower(), timeout=5, start=mark)
        assert c.ping() == []


def test_sighup_applies_changed_limit(broker, uid):
    """A reloadable setting changed in the file takes effect for new connections after SIGHUP."""
    b = broker(limits={"max_client_id_length": 100})
    assert b.client("c" * 50).ping() == []
    cfg = dict(b.config)
    cfg["limits"] = {"max_client_id_length": 30}
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload" in ln.lower(), timeout=5, start=mark)
    c = b.raw()
    c.send(m.connect("d" * 50))
    assert c.expect_closed(5)
    assert [(p.type, p.rc) for p in c.before_close] == [(m.CONNACK, 2)]


def test_sighup_names_the_changes_that_need_a_restart_and_applies_max_connections(
        broker, tmp_path, uid):
    """A changed data_dir, [log] or [metrics] was ignored without a word (the docs say the log
    says so): one warning names them, at each reload (compared with the start). A listener's
    max_connections applies at once to new connections; those connected stay."""
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "max_connections": 1}],
               metrics={"listen": "127.0.0.1:0"}, log={"durability": "batch"})
    first = b.client(f"{uid}-1")
    assert b.client(f"{uid}-2", expect_rc=3)
    cfg = dict(b.config, data_dir=str(tmp_path / "elsewhere"), log={"durability": "sync"},
               listener=[{"host": "127.0.0.1", "port": 0, "max_connections": 2}])
    del cfg["metrics"]
    b.config_path.write_text(toml_dumps(cfg))
    for _ in range(2):
        mark = b.mark()
        b.send_signal(signal.SIGHUP)
        assert b.wait_log("configuration reloaded", timeout=5, start=mark)
        warnings = [line for line in b.logs[mark:] if "after a restart" in line]
        assert len(warnings) == 1 and warnings[0].endswith(
            "WARNING reload: changes to data_dir, [log], [metrics] take effect after a restart "
            "(the running values stay)"), warnings
    second = b.client(f"{uid}-3")
    assert b.client(f"{uid}-4", expect_rc=3)
    cfg["listener"][0]["max_connections"] = 1
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=5, start=mark)
    assert first.ping() == [] and second.ping() == []
    assert b.client(f"{uid}-5", expect_rc=3)
    assert not (tmp_path / "elsewhere").exists()


def test_sighup_with_broken_config_keeps_running(broker, uid):
    b = broker()
    c = b.client(uid)
    b.config_path.write_text("this is [not toml\n")
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload" in ln.lower() or "config" in ln.lower(), timeout=5, start=mark), \
        "nothing logged about the failed reload"
    assert b.alive()
    assert c.ping() == []
    assert b.client(f"{uid}-2").ping() == []


def test_listen_repeatable(broker, uid):
    b = broker(args=["--listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"])
    assert len(b.listeners) == 2
    for i, (_, port) in enumerate(b.listeners):
        assert b.client(f"{uid}-{i}", port=port).ping() == []


def test_listen_all_ipv4_interfaces_short_form(broker, uid):
    # Not loopback: starts only because anonymous access is allowed explicitly (safe default).
    b = broker(args=["--listen", ":0"], allow_anonymous=True)
    assert b.listeners[0][0] in ("0.0.0.0", ""), b.listeners
    assert b.client(uid).ping() == []


def test_no_wills_on_shutdown(broker, uid):
    """Documented: wills are not published when the broker itself shuts down (the next start
    publishes them: tests/core/test_wills_at_stop.py)."""
    b = broker()
    w = b.client(f"{uid}-w")
    w.subscribe(f"{uid}/will", qos=1)
    b.client(f"{uid}-v", will=(f"{uid}/will", b"gone", 1))
    assert b.stop(signal.SIGTERM) == 0
    assert w.expect_closed(5)
    assert [p for p in w.before_close if p.type == m.PUBLISH] == []


def test_sighup_applies_sys_interval(broker, uid):
    b = broker(sys_interval=0)
    cfg = dict(b.config, sys_interval=1)
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload" in ln.lower(), timeout=5, start=mark)
    c = b.client(uid)
    c.subscribe("$SYS/broker/uptime")
    assert c.recv_publish(timeout=4).topic == "$SYS/broker/uptime"


def test_config_check_command(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(toml_dumps(base_config(tmp_path)))
    r = run_cli("config", "check", "-c", str(good))
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(toml_dumps({**base_config(tmp_path), "limits": {"max_inflight_messages": "many"}}))
    r = run_cli("config", "check", "-c", str(bad))
    assert r.returncode == 2
    assert "limits.max_inflight_messages" in one_error_line(r)


def test_config_check_refuses_the_data_dir_serve_refuses(tmp_path):
    """config check said OK for a data_dir serve could not create (serve: exit 2). It finds the
    same problem, with serve's words, and leaves nothing behind."""
    (tmp_path / "file").write_text("")
    cases = [("/proc/edgebroker-check-test/data", "cannot create /proc/edgebroker-check-test/"
                                                  "data: No such file or directory"),
             (str(tmp_path / "file"), f"cannot create {tmp_path / 'file'}: it exists and is "
                                      f"not a directory"),
             (str(tmp_path / "file" / "d"), f"cannot create {tmp_path / 'file' / 'd'}: Not a "
                                            f"directory")]
    for data_dir, words in cases:
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps({**base_config(tmp_path), "data_dir": data_dir}))
        check = run_cli("config", "check", "-c", str(path))
        assert check.returncode == 2 and check.stdout == "", check.stdout
        assert one_error_line(check) == f"edgebroker: config error: {path}: data_dir: {words}"
        serve = run_cli("serve", "-c", str(path))
        assert serve.returncode == 2
        assert one_error_line(serve) == one_error_line(check)
    missing = tmp_path / "new" / "state"
    path.write_text(toml_dumps({**base_config(tmp_path), "data_dir": str(missing)}))
    before = sorted(os.listdir(tmp_path))
    check = run_cli("config", "check", "-c", str(path))
    assert check.returncode == 0 and f"state directory: {missing})" in check.stdout, check.stderr
    assert sorted(os.listdir(tmp_path)) == before, "config check created something"


def test_config_check_refuses_a_data_dir_its_user_cannot_write():
    """A directory its user may not write: as root (who may write anywhere), the command runs
    as nobody and the directory is root's, 0755; else the directory is the user's own, 0555."""
    root = os.geteuid() == 0
    prefix = as_nobody() if root else []
    top = Path(tempfile.mkdtemp(prefix="edgebroker-check-"))     # /tmp: others may enter
    try:
        os.chmod(top, 0o755)
        data = top / "data"
        data.mkdir()
        os.chmod(data, 0o755 if root else 0o555)
        uid = 65534 if root else os.geteuid()
        for data_dir, words in ((data, f"{data} is not writable: permission denied (owner uid "
                                       f"{data.stat().st_uid}, mode {'0755' if root else '0555'}; "
                                       f"this process runs as uid {uid})"),
                                (data / "new", f"cannot create {data / 'new'}: Permission "
                                               f"denied")):
            path = top / "c.toml"
            path.write_text(toml_dumps({**base_config(top), "data_dir": str(data_dir)}))
            for command in (["config", "check", "-c", str(path)], ["serve", "-c", str(path)]):
                r = subprocess.run([*prefix, *broker_command(), *command], cwd=REPO,
                                   capture_output=True, text=True, timeout=30)
                assert r.returncode == 2, r.stderr
                assert one_error_line(r).endswith(f"data_dir: {words}")
        assert sorted(os.listdir(data)) == []
    finally:
        os.chmod(data, 0o755)
        shutil.rmtree(top)


def test_sighup_with_a_non_utf8_config_keeps_running(broker, uid):
    b = broker()
    b.config_path.write_bytes(b"log_level = \"\xff\xfe\"\n")
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda line: "reload failed" in line and "UTF-8" in line)
    c = b.client(uid)
    c.subscribe(f"{uid}/t")
    c.publish(f"{uid}/t", b"still here")
    assert c.recv_publish().payload == b"still here"


def test_non_utf8_config_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe = 1\n")
    result = run_cli("serve", "-c", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "UTF-8" in lines[0]


def test_serve_names_the_config_file_in_errors_of_the_files_it_names(tmp_path):
    """A password, ACL or certificate file the configuration names that cannot be read: serve
    says which configuration named it, as config check does (docs/config.md)."""
    missing = tmp_path / "missing"
    for key, listener in (("password_file", {}), ("acl_file", {}),
                          ("certfile", {"port": 0, "certfile": str(missing / "c.pem"),
                                        "keyfile": str(missing / "k.pem")})):
        cfg = {**base_config(tmp_path), "data_dir": str(tmp_path / "data")}
        if listener:
            cfg["listener"] = [{**cfg["listener"][0], **listener}]
        else:
            cfg[key] = str(missing / key)
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps(cfg))
        check = run_cli("config", "check", "-c", str(path))
        serve = run_cli("serve", "-c", str(path))
        assert (check.returncode, serve.returncode) == (2, 2), serve.stderr
        assert one_error_line(check).startswith(f"edgebroker: config error: {path}: "), check.stderr
        assert one_error_line(serve) == one_error_line(check), key


def test_a_port_its_user_may_not_bind_stops_serve_with_exit_2():
    """EACCES at bind (a port below 1024 without CAP_NET_BIND_SERVICE) exited 1, which the unit
    restarts every 2 s for ever; a start again fails the same way, so it is exit 2 now, naming
    the capability. Run as nobody in a network namespace of the test's own, whose
    ip_unprivileged_port_start is the kernel's default, 1024."""
    assert shutil.which("unshare"), "unshare (util-linux) is needed"
    top = Path(tempfile.mkdtemp(prefix="edgebroker-port-"))
    try:
        os.chmod(top, 0o755)
        data = top / "data"
        data.mkdir()
        os.chown(data, 65534, 65534)
        path = top / "c.toml"
        path.write_text(toml_dumps({"data_dir": str(data), "sys_interval": 0,
                                    "allow_anonymous": True,
                                    "listener": [{"host": "0.0.0.0", "port": 883}]}))
        os.chmod(path, 0o644)
        r = subprocess.run(["unshare", "--net", *as_nobody(), *broker_command(), "serve", "-c",
                            str(path)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert one_error_line(r) == (
            "edgebroker: config error: cannot listen on 0.0.0.0:883: Permission denied: a port "
            "below 1024 needs the capability CAP_NET_BIND_SERVICE (docs/deploy.md)")
    finally:
        shutil.rmtree(top)
