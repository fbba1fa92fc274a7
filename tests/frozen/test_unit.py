"""systemd/edgebroker.service and edgebroker.socket: what they must say, `systemd-analyze
verify` (no output at all: typos only warn) of the service alone and of the pair, with the real
binary in ExecStart, and `systemd-analyze security` of the service at 2.0 ("OK") or better.
systemd-analyze runs offline: no systemd needs to run here."""

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import REPO
from fakesystemd import SocketUnit
from secfiles import write_passwords
from edgebroker import config as configuration
from edgebroker.server import activation

UNIT = REPO / "systemd" / "edgebroker.service"
SOCKET_UNIT = REPO / "systemd" / "edgebroker.socket"
EXAMPLE_CONFIG = REPO / "systemd" / "edgebroker.toml"


def settings(unit=UNIT, wanted: str = "[Service]") -> dict[str, list[str]]:
    """The settings of section ``wanted``: name -> values, in order (a setting may repeat)."""
    found: dict[str, list[str]] = {}
    section = None
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == wanted:
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_unit_settings():
    s = settings()
    one = {k: v[-1] for k, v in s.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "all"
    assert one["ExecStart"].startswith("/usr/local/bin/edgebroker serve")
    # A reload picks where its commands unpack as a start does, checks the file (a failing
    # line stops the reload), then asks the broker and waits for it.
    assert s["ExecReload"] == [
        pick_tmpdir(),
        "/usr/local/bin/edgebroker config check -c /etc/edgebroker/edgebroker.toml",
        "/usr/local/bin/edgebroker config reload -c /etc/edgebroker/edgebroker.toml --pid "
        "$MAINPID"], \
        s["ExecReload"]
    assert one["Restart"] == "on-failure"
    assert one["RestartPreventExitStatus"] == "2"   # a configuration error: no restart loop
    assert int(one["WatchdogSec"].rstrip("s")) > 0
    assert one["StateDirectory"] == "edgebroker"
    # The unpacked binary on disk (page cache, reclaimable), in /run (a tmpfs: RAM) only when
    # the disk has too little room: the file ExecStartPre= writes says which.
    assert (one["CacheDirectory"], one["CacheDirectoryMode"]) == ("edgebroker", "0700")
    assert (one["RuntimeDirectory"], one["RuntimeDirectoryMode"]) == ("edgebroker", "0700")
    assert "TMPDIR=%C/edgebroker" in s["Environment"]
    assert s["EnvironmentFile"] == ["-%t/edgebroker/tmpdir.env"]
    assert one["ExecPaths"].split() == ["%C/edgebroker", "%t/edgebroker"]
    assert s["ExecStartPre"][1] == pick_tmpdir()
    assert one["LimitNOFILE"] == "65536"
    assert one["DynamicUser"] == "yes"
    for key in ("ProtectHome", "PrivateTmp", "NoNewPrivileges"):
        assert one[key] == "yes", key
    assert one["ProtectSystem"] == "strict"
    assert s["CapabilityBoundingSet"] == [""]
    assert one["RestrictAddressFamilies"].split() == ["AF_INET", "AF_INET6", "AF_UNIX"]
    assert s["SystemCallFilter"][0] == "@system-service"


def pick_tmpdir() -> str:
    """The unit's line that picks TMPDIR (the second ExecStartPre=, the first ExecReload=)."""
    [line] = [v for v in settings()["ExecStartPre"] if "tmpdir.env" in v]
    return line


def as_systemd_runs(line: str) -> list[str]:
    """An Exec line's argv as systemd makes it: "$$" is "$", "%%" is "%", quotes as a shell's
    (the lines here use no other specifier nor variable of systemd's)."""
    return shlex.split(line.lstrip("-").replace("$$", "$").replace("%%", "%"))


@pytest.mark.parametrize("free_mb", [64, 39])
def test_tmpdir_is_the_cache_directory_unless_it_has_under_40_mb_free(tmp_path, free_mb):
    """The line that picks TMPDIR, run as systemd runs it, with $CACHE_DIRECTORY on a tmpfs of
    its own (in a mount namespace of the test's: nothing changes outside it) with ``free_mb``
    free: at 40 MB or more the file says the cache directory, silently; under, the runtime
    directory, with one line (priority warning) naming the free space."""
    cache, runtime = tmp_path / "cache", tmp_path / "run"
    cache.mkdir()
    runtime.mkdir()
    script = (f'mount -t tmpfs -o size={free_mb + 1}M tmpfs "$CACHE_DIRECTORY" && '
              f'head -c 1048576 /dev/zero >"$CACHE_DIRECTORY/taken" && exec "$@"')
    # (not root: a user namespace of its own, mapped to root, mounts the tmpfs)
    user_ns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    r = subprocess.run(["unshare", *user_ns, "--mount", "--propagation", "private", "sh", "-c",
                        script, "sh", *as_systemd_runs(pick_tmpdir())],
                       env=dict(os.environ, CACHE_DIRECTORY=str(cache),
                                RUNTIME_DIRECTORY=str(runtime)),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    chosen = (runtime / "tmpdir.env").read_text()
    if free_mb >= 40:
        assert (chosen, r.stdout) == (f"TMPDIR={cache}\n", "")
    else:
        assert chosen == f"TMPDIR={runtime}\n"
        assert r.stdout == (f"<4>edgebroker: {free_mb} MB free in {cache} (under 40 MB): the "
                            f"binary unpacks into {runtime} (RAM) instead\n"), r.stdout


def test_exec_start_pre_removes_only_what_unpacked_binaries_left(tmp_path):
    """systemd does not empty a cache directory: the unit's ExecStartPre= removes the _MEI*
    directories a crash, a SIGKILL or a power cut left in it (19 MB each), and nothing else.
    Its command run here as systemd runs it, with $CACHE_DIRECTORY."""
    pre = settings()["ExecStartPre"][0]
    assert pre.startswith("-")      # a failure there does not stop the start
    pre = pre[1:]
    cache = tmp_path / "cache"
    for name in ("_MEI12345a", "_MEI0000b", "other", "_MEI x"):
        (cache / name / "lib").mkdir(parents=True)
        (cache / name / "lib" / "libpython3.11.so.1.0").write_bytes(b"\0" * 1024)
    (cache / "_MEIfile").write_text("a file")
    (cache / "kept.txt").write_text("not the binary's")
    r = subprocess.run(shlex.split(pre), env=dict(os.environ, CACHE_DIRECTORY=str(cache)),
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stderr) == (0, "")
    assert sorted(p.name for p in cache.iterdir()) == ["kept.txt", "other"]
    assert (cache / "other" / "lib" / "libpython3.11.so.1.0").exists()
    r = subprocess.run(shlex.split(pre), env=dict(os.environ, CACHE_DIRECTORY=str(cache)),
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stderr) == (0, "")   # nothing to remove: a start as any other


def test_socket_unit_settings():
    """Accept=no, a name, and a ListenStream= for each listener of the example configuration
    (by the broker's own rule: the same address), nothing more; the service does not need it."""
    s = settings(SOCKET_UNIT, "[Socket]")
    one = {k: v[-1] for k, v in s.items()}
    assert one["Accept"] == "no" and one["FileDescriptorName"] == "mqtt"
    assert one["BindIPv6Only"] == "both" and int(one["Backlog"]) >= 1024
    streams = s["ListenStream"]
    listeners = configuration.load(str(EXAMPLE_CONFIG)).listeners
    assert sorted(streams) == sorted(activation.listen_stream(activation.listener_key(lc))
                                     for lc in listeners), streams
    assert settings(SOCKET_UNIT, "[Install]")["WantedBy"] == ["sockets.target"]
    unit = settings(UNIT, "[Unit]")
    for key in ("Requires", "BindsTo", "Requisite", "Wants"):
        assert not any("edgebroker.socket" in v for v in unit.get(key, [])), key
    assert "Sockets" not in settings()


@pytest.mark.parametrize("units", [("edgebroker.service",),
                                   ("edgebroker.socket", "edgebroker.service")])
def test_verify_says_nothing(binary, tmp_path, units):
    service = tmp_path / "edgebroker.service"
    service.write_text(UNIT.read_text().replace("=/usr/local/bin/edgebroker ", f"={binary} "))
    (tmp_path / "edgebroker.socket").write_text(SOCKET_UNIT.read_text())
    r = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u) for u in units)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_security_exposure_at_most_2():
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=20",
                        "--no-pager", str(UNIT)], capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for edgebroker\.service: (\d+\.\d+)", r.stdout)
    assert found, r.stdout + r.stderr
    assert float(found[1]) <= 2.0 and r.returncode == 0, r.stdout


def reload_check(binary, config) -> subprocess.CompletedProcess:
    """The unit's ExecReload= line that checks, the binary and the configuration file
    replaced, run with the state directory the unit gives it ($STATE_DIRECTORY: the test's tmp
    folder)."""
    command = settings()["ExecReload"][1].split()
    assert command[:2] == ["/usr/local/bin/edgebroker", "config"] and command[-1] == \
        "/etc/edgebroker/edgebroker.toml", command
    state = config.parent
    return subprocess.run([str(binary), *command[1:-1], str(config)], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, STATE_DIRECTORY=str(state), TMPDIR=str(state)))


def test_example_configuration_checks(binary, tmp_path):
    """The reload's check passes on the example configuration, with the unit's state directory;
    it fails (exit 2, naming the key) on a broken one, which stops the reload before SIGHUP."""
    config = tmp_path / "edgebroker.toml"
    shutil.copy(EXAMPLE_CONFIG, config)
    r = reload_check(binary, config)
    assert r.returncode == 0, r.stderr
    assert f"state directory: {tmp_path}" in r.stdout, r.stdout
    config.write_text(EXAMPLE_CONFIG.read_text().replace('log_level = "info"',
                                                         'log_level = "loud"'))
    r = reload_check(binary, config)
    assert r.returncode == 2 and f"config error: {config}: log_level" in r.stderr, r.stderr


def test_exit_status_2_is_a_configuration_error_only(binary, tmp_path):
    """RestartPreventExitStatus=2 stops only what a restart cannot mend: the binary (as the
    unit runs it) exits 2 for a bad configuration, 1 when its port is another process's, which
    systemd then restarts."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    bad = tmp_path / "bad.toml"
    bad.write_text('log_level = "loud"\n')
    r = subprocess.run([str(binary), "serve", "-c", str(bad), "--data-dir", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=30, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "config error" in r.stderr, (r.returncode, r.stderr)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        r = subprocess.run([str(binary), "serve", "--listen", f"127.0.0.1:{port}",
                            "--data-dir", str(tmp_path / "d")],
                           capture_output=True, text=True, timeout=30, env=env,
                           stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, \
        (r.returncode, r.stderr)


def network_setup(port: int, passwd) -> tuple[str, list[str]]:
    """The example configuration changed as its comments say for clients on the network (the
    network listener instead of the local one, on ``port``, with ``passwd``), and the
    ListenStream= lines they give for the socket unit's drop-in."""
    text = EXAMPLE_CONFIG.read_text()
    local = '[[listener]]\nhost = "127.0.0.1"\nport = 1883\n'
    assert local in text
    for key in ("[[listener]]", "host = ", "port = ", "password_file = "):
        text = re.sub(rf"(?m)^# ({re.escape(key)})", r"\1", text)
    text = text.replace(local, "# " + local.replace("\n", "\n# ", 2))
    text = text.replace("/etc/edgebroker/passwd", str(passwd)).replace("1883", str(port))
    streams = re.findall(r"(?m)^#   ListenStream=(.*)$", EXAMPLE_CONFIG.read_text())
    return text, [s.replace("1883", str(port)) for s in streams]


def test_network_listener_as_the_example_configuration_says(broker, tmp_path):
    """Its comments' steps for clients on the network, under edgebroker.socket: the socket unit's
    drop-in (ListenStream= emptied, then the network address) and the configuration agree, so
    the broker starts on systemd's socket; and the comments say it (the Debian package enables
    the socket unit)."""
    comments = EXAMPLE_CONFIG.read_text()
    assert "edgebroker.socket" in comments and "systemctl edit edgebroker.socket" in comments
    assert "systemctl disable --now edgebroker.socket" in comments
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen(16)
    port = held.getsockname()[1]
    text, streams = network_setup(port, write_passwords(tmp_path / "passwd", {"alice": "pw"}))
    assert streams == ["", f"0.0.0.0:{port}"], streams    # the reset, then the one socket
    unit = SocketUnit()
    unit.pass_other("mqtt", held)
    try:
        b = broker(raw_config=f'data_dir = "{tmp_path / "state"}"\n' + text, wrap=unit.wrap,
                   pass_fds=unit.fds)
        assert b.wait_log(f"listening on 0.0.0.0:{port} (socket from systemd", 0), b.log_text()
        assert b.listeners == [("0.0.0.0", port)], b.listeners
        assert b.client("alice", username="alice", password="pw").ping() == []
    finally:
        unit.close()


def test_the_by_hand_check_reads_the_environment_file(tmp_path):
    """The example configuration's header: the uploader's keys in the unit's EnvironmentFile=
    are not in a root shell's environment, so the plain by-hand check says "no credentials"
    (exit 2) where the unit's reload check passes; the header's other form reads the file.
    Both run as written, but for sudo, the paths and the command (this checkout's)."""
    text = EXAMPLE_CONFIG.read_text()
    found = re.search(r"(?m)^#   sudo (sh -c '.*)\\\n#     (.*')$", text)
    assert found, "the header's check with the EnvironmentFile= is not there"
    env_file = tmp_path / "env"
    env_file.write_text("AWS_ACCESS_KEY_ID=AKIDEXAMPLE\nAWS_SECRET_ACCESS_KEY=secret\n")
    config = tmp_path / "edgebroker.toml"
    config.write_text(EXAMPLE_CONFIG.read_text() + '\n[upload]\nurl = "s3://bucket/prefix"\n'
                      'gateway_id = "gw"\n')
    places = {"/etc/edgebroker/env": str(env_file), "/var/lib/edgebroker": str(tmp_path / "state"),
              "/etc/edgebroker/edgebroker.toml": str(config),
              "edgebroker config": f"{sys.executable} -m edgebroker config"}
    command = found[1] + found[2]
    for old, new in places.items():
        assert old in command, old
        command = command.replace(old, new)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    r = subprocess.run(shlex.split(command), cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    plain = command.replace(f"set -a; . {env_file}; ", "")
    assert plain != command
    r = subprocess.run(shlex.split(plain), cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "no credentials were given" in r.stderr, r.stderr
