"""Unix-domain socket listeners: clients (raw and mosquitto), file mode, stale files, cleanup."""

import os
import socket
import stat
import subprocess

from conftest import REPO, broker_command, run_cli, toml_dumps, without_root_file_access


def unix_listener(path, **extra):
    return {"unix_socket": str(path), **extra}


def test_unix_listener_serves_clients(broker, tmp_path, mosq, uid):
    path = tmp_path / "mqtt.sock"
    b = broker(listener=[unix_listener(path), {"host": "127.0.0.1", "port": 0}])
    assert b.unix_paths == [str(path)]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    sub = b.client(f"{uid}-s", transport={"unix_path": str(path)})
    sub.subscribe(f"{uid}/t", qos=1)
    pub = b.client(f"{uid}-p")                       # the TCP listener
    pub.publish(f"{uid}/t", b"to the unix socket", qos=1)
    assert sub.recv_publish().payload == b"to the unix socket"
    assert b.wait_log(f"client '{uid}-s' from unix:{path} (pid {os.getpid()}, uid {os.getuid()}) "
                      f"connected")
    tool = mosq("pub", 0, "--unix", str(path), "-t", f"{uid}/t", "-m", "from mosquitto_pub")
    assert tool.wait() == 0, tool.out.text()
    assert sub.recv_publish().payload == b"from mosquitto_pub"
    b.stop()
    assert not path.exists(), "socket file left behind at shutdown"


def test_unix_socket_mode_and_stale_file(broker, tmp_path, uid):
    path = tmp_path / "mqtt.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))          # a socket file nobody listens on (a crashed broker's)
    stale.close()
    b = broker(listener=[unix_listener(path, unix_socket_mode="0600")])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert b.client(uid, transport={"unix_path": str(path)}).ping() == []


def test_unix_socket_path_in_use_or_not_a_socket(broker, tmp_path):
    path = tmp_path / "mqtt.sock"
    broker(listener=[unix_listener(path)])
    cfg = tmp_path / "second.toml"
    cfg.write_text(toml_dumps({"data_dir": str(tmp_path / "d2"), "listener": [unix_listener(path)]}))
    r = run_cli("serve", "-c", str(cfg))
    assert r.returncode == 1
    assert f"cannot listen on unix:{path}: another process is listening there" in r.stderr
    regular = tmp_path / "regular"
    regular.write_text("keep me")
    cfg.write_text(toml_dumps({"data_dir": str(tmp_path / "d2"),
                               "listener": [unix_listener(regular)]}))
    in_the_way = (f"edgebroker: config error: {cfg}: listener[0].unix_socket: {regular}: a "
                  f"file that is not a socket is in the way: serve cannot listen there (remove "
                  f"it, or choose another path)\n")
    r = run_cli("serve", "-c", str(cfg))
    assert (r.returncode, r.stderr) == (2, in_the_way)  # 2: no restart under the unit
    assert regular.read_text() == "keep me"


def test_config_check_refuses_a_file_that_is_not_a_socket_in_the_way(tmp_path):
    """config check said OK; serve then exited 1 (restarted every 2 s under the unit)."""
    cfg = tmp_path / "c.toml"
    for thing in ("regular", "directory"):
        path = tmp_path / thing
        if thing == "regular":
            path.write_text("keep me")
        else:
            path.mkdir()
        cfg.write_text(toml_dumps({"data_dir": str(tmp_path / "d"),
                                   "listener": [unix_listener(path)]}))
        r = run_cli("config", "check", "-c", str(cfg))
        assert (r.returncode, r.stderr) == (
            2, f"edgebroker: config error: {cfg}: listener[0].unix_socket: {path}: a file that "
               f"is not a socket is in the way: serve cannot listen there (remove it, or choose "
               f"another path)\n")
        assert path.exists()


def test_unix_listener_with_its_own_auth(broker, tmp_path, uid):
    """The Unix socket may stay open to local tools while TCP needs a password."""
    from secfiles import write_passwords

    pw = write_passwords(tmp_path / "passwd", {"alice": "pw"})
    path = tmp_path / "mqtt.sock"
    b = broker(password_file=str(pw), listener=[
        {"host": "127.0.0.1", "port": 0},
        unix_listener(path, password_file="", allow_anonymous=True)])
    b.client(f"{uid}-tcp", expect_rc=5)
    assert b.client(f"{uid}-unix", transport={"unix_path": str(path)}).ping() == []


def test_unix_listener_config_errors(tmp_path):
    for listener, words in (
            ({"unix_socket": "/tmp/x.sock", "port": 1883}, "listener[0].port: not used with unix_socket"),
            ({"unix_socket": "/tmp/x.sock", "certfile": "/c"}, "listener[0].certfile: not used"),
            ({"unix_socket": "/tmp/x.sock", "unix_socket_mode": "0999"},
             "listener[0].unix_socket_mode: must be octal"),
            ({"host": "127.0.0.1", "unix_socket_mode": "0600"},
             "listener[0].unix_socket_mode: only with unix_socket")):
        cfg = tmp_path / "c.toml"
        cfg.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [listener]}))
        r = run_cli("config", "check", "-c", str(cfg))
        assert r.returncode == 2 and words in r.stderr, r.stderr


def test_reload_applies_a_new_unix_socket_mode(broker, tmp_path, uid):
    """SIGHUP with a tighter unix_socket_mode: the socket file takes it at once (it kept its
    old mode, with nothing said but "configuration reloaded")."""
    import signal

    path = tmp_path / "mqtt.sock"
    b = broker(listener=[unix_listener(path, unix_socket_mode="0666")])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    b.config_path.write_text(toml_dumps({**b.config, "listener": [
        unix_listener(path, unix_socket_mode="0600")]}))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", start=mark), b.log_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert b.wait_log(f"unix:{path} now has mode 0600", start=mark)
    assert b.client(uid, transport={"unix_path": str(path)}).ping() == []


def test_config_check_refuses_unix_socket_paths_serve_cannot_bind(tmp_path):
    """A path over 107 bytes or in a directory that does not exist: config check said OK and
    serve could not listen."""
    long_path = str(tmp_path / ("s" * 120))
    missing = str(tmp_path / "no-such-dir" / "mqtt.sock")
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [
        unix_listener(long_path), unix_listener(missing)]}))
    r = run_cli("config", "check", "-c", str(cfg))
    assert r.returncode == 2, r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0] == (f"edgebroker: config error: {cfg}: listener[0].unix_socket: {long_path} "
                        f"is longer than 107 bytes (a Unix socket's path limit): serve cannot "
                        f"listen there")
    assert lines[1] == (f"edgebroker: config error: {cfg}: listener[1].unix_socket: the "
                        f"directory {tmp_path / 'no-such-dir'} does not exist: serve cannot "
                        f"listen on {missing}")
    for listener in (unix_listener(long_path), unix_listener(missing)):
        cfg.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [listener]}))
        assert run_cli("serve", "-c", str(cfg)).returncode != 0


def test_a_unix_socket_directory_the_broker_cannot_write_is_a_config_error(tmp_path):
    """Under the unit (ProtectSystem=strict) /run is read-only: `config check` said OK, and
    serve failed with exit 1, which the unit restarted every 2 s without end. Now the check
    says so, and serve exits 2 (not restarted) with the ways out; here as root without the
    capabilities that pass over file permissions, in a directory of another user."""
    cannot = tmp_path / "not-ours"
    cannot.mkdir()
    sock = cannot / "mqtt.sock"
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [unix_listener(sock)]}))
    os.chown(cannot, 65534, 65534)              # 0755, nobody's
    hint = ("let the socket unit make it (ListenStream= with that path), or make the directory "
            "writable for the broker (under systemd: ReadWritePaths=; docs/deploy.md)")

    def run(*args):
        return subprocess.run([*without_root_file_access(), *broker_command(), *args, "-c",
                               str(cfg)], cwd=REPO, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    for command in (("config", "check"), ("serve",)):
        r = run(*command)
        assert (r.returncode, r.stderr) == (
            2, f"edgebroker: config error: {cfg}: listener[0].unix_socket: the directory "
               f"{cannot} is not writable by this user: serve cannot listen on {sock} ({hint})\n"), \
            (command, r.stderr)
    # A socket already there may be systemd's (socket activation): the check passes. One left
    # by a broker that is gone cannot be removed: serve's bind fails, with exit 2 too.
    os.chown(cannot, 0, 0)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))
    stale.close()
    os.chown(cannot, 65534, 65534)
    assert run("config", "check").returncode == 0
    r = run("serve")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, r.stderr
    assert f"config error: cannot listen on unix:{sock}: Permission denied: {hint}\n" in r.stderr
    assert sock.exists()
