"""The Debian package in a booted Debian bookworm (make test-boot; docs/deploy.md): a copy of
the cached root file system (packaging/boot-root.sh) booted with ``systemd-nspawn --boot``, its
own systemd as PID 1. The tests run in order, as one gateway's life: install with
``apt install ./edgebroker_*.deb``, the service active (running) once the broker's READY=1
came, MQTT from this machine (the container shares its network: loopback, a free port set in
/etc/edgebroker/edgebroker.toml), ``systemctl reload`` (one that waits for the broker, and
one a broken file makes fail), the watchdog restarting a stopped broker, an upgrade to the
same package with a higher version, a data_dir outside the state directory, a full disk,
remove, purge.

systemctl and apt run inside through ``nsenter`` into the container's namespaces. The
container is started with ``--register=no --keep-unit``: this machine has no systemd of its
own for systemd-nspawn to register with (without them it stops at "Failed to open system
bus").

A package of another architecture (make test-arm64: arm64 on an x86_64 machine) boots a
root file system of its own architecture, every program in it run by qemu-user through
binfmt_misc. Three things differ there, and only there: /proc/PID/exe names the emulator (the
program is the file it mapped, see ``Container.program``); the container's systemd does not
take nspawn's power-off signal (qemu-user moves real-time signals), so ``stop`` asks it with
``systemctl poweroff``; and the unit's ``PrivateUsers=yes`` cannot be set up
(``unshare(CLONE_NEWUSER)`` needs a single-threaded process, and the emulator has threads of
its own), so a drop-in turns it off, as the one line of the unit not tested there."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO
from frozen.test_binary import wait_for

pytestmark = pytest.mark.timeout(300)

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BOOT_TIMEOUT = 90.0
UNIT = "edgebroker.service"


def emulated(pid: int) -> bool:
    """Whether this machine's process ``pid`` is a program run by qemu-user."""
    return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("qemu-")


class Container:
    """A booted copy of a root file system; ``run`` executes a command inside it."""

    def __init__(self, root: Path, log: Path):
        self.root = root
        self.emulated = False
        self.name = f"edgebroker-boot-{uuid.uuid4().hex[:8]}"
        self.log = open(log, "wb")
        self.logpath = log
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--boot", f"--directory={root}", f"--machine={self.name}",
             "--register=no", "--keep-unit", "--console=pipe", "--link-journal=no"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.leader = wait_for(self._leader, "container PID 1 running systemd", BOOT_TIMEOUT)
        self.emulated = emulated(self.leader)
        # Its manager's socket, then the end of the boot.
        wait_for(lambda: Path(f"/proc/{self.leader}/root/run/systemd/private").exists(),
                 "systemd manager socket in the container", BOOT_TIMEOUT)
        r = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=BOOT_TIMEOUT)
        assert r.stdout.strip() in ("running", "degraded"), self.diagnose(r)

    def _leader(self) -> int | None:
        assert self.proc.poll() is None, f"systemd-nspawn exited:\n{self.logpath.read_text()}"
        try:
            pid = int(Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
                      .split()[0])
            program = os.readlink(f"/proc/{pid}/exe")
            if emulated(pid):   # argv: the emulator, the program, its own argv
                program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1].decode()
            return pid if program.endswith("/systemd") else None
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def run(self, *cmd: str, check: bool = True,
            timeout: float = 60.0) -> subprocess.CompletedProcess:
        r = subprocess.run(
            ["nsenter", f"--target={self.leader}", "--all", "--",
             "env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8",
             "DEBIAN_FRONTEND=noninteractive", "SYSTEMD_PAGER=", *cmd],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check:
            assert r.returncode == 0, self.diagnose(r)
        return r

    def program(self, pid: str) -> str:
        """The file the container's process ``pid`` runs, as its /proc/PID/exe names it (with
        " (deleted)" once that file was replaced); under qemu-user the file it mapped (its
        /proc/PID/maps names it the same way), not the emulator's."""
        exe = self.run("readlink", f"/proc/{pid}/exe").stdout.strip()
        if not self.emulated:
            return exe
        for line in self.run("cat", f"/proc/{pid}/maps").stdout.splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/") and fields[5] != exe:
                return fields[5]
        raise AssertionError(f"no file mapped by {pid}")

    def show(self, *props: str, unit: str = UNIT) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self) -> str:
        return self.run("journalctl", "--unit", UNIT, "--no-pager", "--output=short-precise").stdout

    def diagnose(self, r: subprocess.CompletedProcess) -> str:
        status = subprocess.run(
            ["nsenter", f"--target={self.leader}", "--all", "--", "systemctl", "status",
             "--no-pager", UNIT], capture_output=True, text=True, timeout=30)
        return (f"{r.args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}\n"
                f"--- systemctl status {UNIT}\n{status.stdout}{status.stderr}")

    def stop(self) -> None:
        """Power off (nspawn turns SIGTERM into an orderly shutdown; an emulated systemd is
        asked with systemctl), SIGKILL after 60 s."""
        if self.proc.poll() is None:
            if self.emulated:
                self.run("systemctl", "--no-block", "poweroff", check=False)
            else:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        # What nspawn cannot remove itself here ("Attempted to remove disk file system under
        # /run/systemd/nspawn/propagate/...": /run of this machine is no tmpfs).
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{self.name}", ignore_errors=True)


@pytest.fixture(scope="module")
def package() -> Path:
    given = os.environ.get("EDGEBROKER_DEB")
    assert given, "EDGEBROKER_DEB names the package to install (make test-boot sets it)"
    path = Path(given).resolve()
    assert path.is_file(), f"EDGEBROKER_DEB={given}: no such file"
    return path


@pytest.fixture(scope="module")
def upgrade_package(package, tmp_path_factory) -> tuple[Path, str]:
    """The same package with a higher version: its control file's Version + "+boot1"."""
    work = tmp_path_factory.mktemp("upgrade")
    subprocess.run(["dpkg-deb", "--raw-extract", str(package), str(work / "root")], check=True,
                   timeout=120)
    control = work / "root" / "DEBIAN" / "control"
    text = control.read_text()
    version = re.search(r"(?m)^Version: (\S+)$", text)[1] + "+boot1"
    control.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", text))
    out = work / f"edgebroker_{version}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build",
                    str(work / "root"), str(out)], check=True, capture_output=True, timeout=300)
    return out, version


@pytest.fixture(scope="module")
def units(package) -> list[str]:
    """The package's systemd units: the service, and the socket when systemd/ had one."""
    listing = subprocess.run(["dpkg-deb", "--contents", str(package)], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    return re.findall(r"lib/systemd/system/(edgebroker\.\w+)$", listing, flags=re.M)


@pytest.fixture(scope="module")
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def container(tmp_path_factory, port, package, units):
    arch = subprocess.run(["dpkg-deb", "--field", str(package), "Architecture"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
    # A root file system of the package's architecture (run by qemu-user when not this one's).
    root_fs = subprocess.run([str(REPO / "packaging" / "boot-root.sh")], capture_output=True,
                             text=True, timeout=900, stdin=subprocess.DEVNULL,
                             env={**os.environ, "EDGEBROKER_BOOT_ARCH": arch})
    assert root_fs.returncode == 0, root_fs.stderr
    work = tmp_path_factory.mktemp("boot")
    root = work / "root"
    root.mkdir()
    # The cached tree stays as it is: an overlay takes the container's writes (about 10 MB);
    # where the kernel refuses one, a copy (200 MB, some 10 s each way).
    (work / "upper").mkdir()
    (work / "overlay-work").mkdir()
    overlay = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={root_fs.stdout.strip()},"
         f"upperdir={work / 'upper'},workdir={work / 'overlay-work'}", str(root)],
        capture_output=True, text=True, timeout=60).returncode == 0
    if not overlay:
        subprocess.run(["cp", "-a", "--reflink=auto", f"{root_fs.stdout.strip()}/.", str(root)],
                       check=True, timeout=300)
    # The configuration as an administrator would have provisioned it before the install: the
    # commented default with a free port of this machine (the container shares its network).
    config = (REPO / "systemd" / "edgebroker.toml").read_text()
    ours = re.sub(r"(?m)^port = 1883$", f"port = {port}", config, count=1)
    assert ours != config
    (root / "etc" / "edgebroker").mkdir()
    (root / "etc" / "edgebroker" / "edgebroker.toml").write_text(ours)
    if "edgebroker.socket" in units:
        # The socket's address must be the listener's (systemd/edgebroker.socket): a drop-in,
        # as an administrator would change it.
        dropin = root / "etc/systemd/system/edgebroker.socket.d"
        dropin.mkdir(parents=True)
        (dropin / "port.conf").write_text(
            f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{port}\n")
    if arch != native:
        # Under qemu-user systemd cannot make the unit's user namespace (see the module's doc).
        dropin = root / "etc/systemd/system/edgebroker.service.d"
        dropin.mkdir(parents=True)
        (dropin / "qemu-user.conf").write_text("[Service]\nPrivateUsers=no\n")
    shutil.copy(package, root / "root" / package.name)
    c = Container(root, work / "console.log")
    try:
        yield c
    finally:
        c.stop()
        if overlay:
            subprocess.run(["umount", str(root)], check=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def connect_refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True


def round_trip(mosq, port: int, topic: str, message: str) -> None:
    """A QoS 1 PUBLISH from mosquitto_pub reaches a mosquitto_sub subscribed at QoS 1."""
    sub = mosq("sub", port, "-d", "-t", topic, "-q", "1", "-v", "-C", "1", "-W", "20")
    sub.wait_line(lambda ln: "received SUBACK" in ln)
    pub = mosq("pub", port, "-t", topic, "-m", message, "-q", "1")
    assert pub.wait() == 0, pub.out.text()
    assert sub.wait(25) == 0, sub.out.text()
    assert f"{topic} {message}" in sub.lines, sub.out.text()


def test_install_starts_the_service_on_readiness(container, package, units, port, mosq):
    config = container.root / "etc/edgebroker/edgebroker.toml"
    provisioned = config.read_text()
    # The documented command; the provisioned configuration is kept (--force-confold: dpkg
    # would otherwise ask whether to replace it).
    r = container.run("apt", "install", "-y", "-q", "-o", "Dpkg::Options::=--force-confold",
                      f"/root/{package.name}", timeout=180)
    assert "Setting up edgebroker" in r.stdout, r.stdout
    assert config.read_text() == provisioned
    conffiles = container.run("dpkg-query", "--showformat=${Conffiles}", "--show",
                              "edgebroker").stdout
    assert "/etc/edgebroker/edgebroker.toml" in conffiles

    for unit in units:
        assert container.run("systemctl", "is-enabled", unit).stdout.strip() == "enabled", unit
        assert container.run("systemctl", "is-active", unit).stdout.strip() == "active", unit
    s = container.show("Type", "ActiveState", "SubState", "StatusText", "FragmentPath", "MainPID")
    # Type=notify: "active (running)" only once READY=1 arrived (the broker sends it when its
    # listeners accept), with the broker's STATUS= line.
    assert (s["Type"], s["ActiveState"], s["SubState"]) == ("notify", "active", "running"), s
    assert s["FragmentPath"] == "/lib/systemd/system/edgebroker.service"
    assert s["StatusText"], s
    journal = container.journal()
    listening = re.search(rf"listening on 127\.0\.0\.1:{port}\b.*", journal)
    assert listening, journal
    if "edgebroker.socket" in units:
        assert "socket from systemd" in listening[0], listening[0]
    assert "configuration /etc/edgebroker/edgebroker.toml" in journal, journal
    assert "Started edgebroker.service" in journal, journal
    assert container.program(s["MainPID"]) == "/usr/bin/edgebroker"

    round_trip(mosq, port, "boot/install", "hello from the host")
    # Retained, for the upgrade to keep.
    pub = mosq("pub", port, "-t", "boot/retained", "-m", "kept across the upgrade", "-q", "1", "-r")
    assert pub.wait() == 0, pub.out.text()


def test_the_binary_unpacks_on_disk_and_a_start_removes_what_a_crash_left(container, port, mosq):
    """TMPDIR is the unit's cache directory, on disk (page cache, not the RAM of a tmpfs as
    /run/edgebroker was); systemd does not empty it, so ExecStartPre= removes the _MEI*
    directories a crash left (here one planted, the service user's), and nothing else."""
    cache = container.root / "var/cache/private/edgebroker"     # (DynamicUser=yes)
    assert os.readlink(container.root / "var/cache/edgebroker") == "private/edgebroker"
    [unpacked] = [p.name for p in cache.iterdir()]
    assert unpacked.startswith("_MEI"), unpacked
    # Room in the cache directory: ExecStartPre= named it, in the runtime directory's file.
    assert container.run("cat", "/run/edgebroker/tmpdir.env").stdout == \
        "TMPDIR=/var/cache/edgebroker\n"
    assert container.run("ls", "-A", "/run/edgebroker").stdout == "tmpdir.env\n"
    main = container.show("MainPID")["MainPID"]
    [broker] = container.run("cat", f"/proc/{main}/task/{main}/children").stdout.split()
    maps = container.run("cat", f"/proc/{broker}/maps").stdout
    assert re.search(rf"/var/cache/(private/)?edgebroker/{unpacked}/libpython", maps), maps
    owner = cache.stat()
    left = cache / "_MEIcrashed"
    (left / "lib").mkdir(parents=True)
    (left / "lib" / "libpython3.11.so.1.0").write_bytes(bytes(4096))
    (cache / "kept").write_text("not the binary's")
    for path in (left, left / "lib", left / "lib" / "libpython3.11.so.1.0", cache / "kept"):
        os.chown(path, owner.st_uid, owner.st_gid)
    container.run("systemctl", "restart", UNIT)
    names = sorted(p.name for p in cache.iterdir())
    assert len(names) == 2 and "kept" in names, names
    assert "_MEIcrashed" not in names and unpacked not in names, names
    (cache / "kept").unlink()
    round_trip(mosq, port, "boot/cache", "after the restart")


def test_reload_rereads_the_configuration(container, port, mosq):
    before = container.show("MainPID", "NRestarts")
    line = "configuration reloaded from /etc/edgebroker/edgebroker.toml"
    reloaded = container.journal().count(line)
    container.run("systemctl", "reload", UNIT)
    wait_for(lambda: container.journal().count(line) == reloaded + 1, "the reload's log line", 30)
    after = container.show("MainPID", "NRestarts", "ActiveState", "SubState")
    assert after["MainPID"] == before["MainPID"] and after["NRestarts"] == before["NRestarts"]
    assert (after["ActiveState"], after["SubState"]) == ("active", "running"), after
    round_trip(mosq, port, "boot/reload", "after reload")


def test_reload_returns_once_the_broker_has_reloaded(container):
    """`systemctl reload` waits for the broker (the last ExecReload= line, `edgebroker config
    reload`, asks it and waits for its answer): with the broker process stopped (SIGSTOP) the
    reload stays in progress, its `config reload` waiting, and ends, successful, once the
    broker goes on and has reloaded. (With `kill -HUP` it ended at once, the broker stopped.)"""
    main = container.show("MainPID")["MainPID"]
    [broker] = container.run("cat", f"/proc/{main}/task/{main}/children").stdout.split()
    line = "configuration reloaded from /etc/edgebroker/edgebroker.toml"
    reloaded = container.journal().count(line)
    container.run("kill", "-STOP", broker)
    try:
        reload = subprocess.Popen(
            ["nsenter", f"--target={container.leader}", "--all", "--", "systemctl", "reload",
             UNIT], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)

        def waiting() -> bool:
            s = container.show("ActiveState", "ControlPID")
            if s["ActiveState"] != "reloading" or s["ControlPID"] in ("", "0"):
                return False
            cmdline = container.run("cat", f"/proc/{s['ControlPID']}/cmdline", check=False)
            return "\0config\0reload\0" in cmdline.stdout
        wait_for(waiting, "the reload's `config reload` waiting for the stopped broker", 30)
        assert reload.poll() is None, reload.communicate()
    finally:
        container.run("kill", "-CONT", broker)
    assert reload.wait(40) == 0, reload.communicate()
    assert container.journal().count(line) == reloaded + 1
    s = container.show("ActiveState", "SubState", "MainPID")
    assert (s["ActiveState"], s["SubState"], s["MainPID"]) == ("active", "running", main), s


def test_reload_of_a_broken_configuration_fails_and_keeps_the_broker(container, port, mosq):
    """ExecReload= checks the file before the SIGHUP: with a broken one `systemctl reload`
    fails, naming the problem in the journal, and the broker (no SIGHUP reached it) serves on
    in the same process; the file put back, a reload succeeds."""
    config = container.root / "etc/edgebroker/edgebroker.toml"
    good = config.read_text()
    broken = good.replace('log_level = "info"', 'log_level = "loud"', 1)
    assert broken != good
    before = container.show("MainPID", "NRestarts")
    line = "configuration reloaded from /etc/edgebroker/edgebroker.toml"
    reloaded = container.journal().count(line)
    config.write_text(broken)
    try:
        r = container.run("systemctl", "reload", UNIT, check=False)
        assert r.returncode != 0, container.diagnose(r)
        journal = container.journal()
        assert "config error: /etc/edgebroker/edgebroker.toml: log_level" in journal, journal
    finally:
        config.write_text(good)
    after = container.show("MainPID", "NRestarts", "ActiveState", "SubState")
    assert after["MainPID"] == before["MainPID"] and after["NRestarts"] == before["NRestarts"]
    assert (after["ActiveState"], after["SubState"]) == ("active", "running"), after
    sub = mosq("sub", port, "-t", "boot/retained", "-q", "1", "-v", "-C", "1", "-W", "20")
    assert sub.wait(25) == 0, sub.out.text()
    container.run("systemctl", "reload", UNIT)
    wait_for(lambda: container.journal().count(line) == reloaded + 1, "the reload's log line", 30)
    # The broker takes its signals in order: a SIGHUP of the refused reload would have been
    # logged before this one, as a failed reload.
    assert "reload failed, keeping the running configuration" not in container.journal()


def test_watchdog_restarts_a_stopped_broker(container, port, mosq):
    """The core loop's WATCHDOG=1 pings stop when the broker process (the bootloader's child:
    the bootloader itself only waits) is SIGSTOPped; after WatchdogSec systemd kills the
    service and Restart=on-failure starts it again."""
    s = container.show("MainPID", "NRestarts", "WatchdogUSec")
    # The unit's own value, not shortened for the test.
    watchdog = re.search(r"(?m)^WatchdogSec=(\d+)s$", (REPO / "systemd" / UNIT).read_text())[1]
    assert s["WatchdogUSec"] == f"{watchdog}s", s
    main = s["MainPID"]
    broker = container.run("cat", f"/proc/{main}/task/{main}/children").stdout.split()
    assert len(broker) == 1, broker
    t0 = time.monotonic()
    container.run("kill", "-STOP", broker[0])
    restarted = wait_for(lambda: (lambda a: a if a["NRestarts"] == str(int(s["NRestarts"]) + 1)
                                  and (a["ActiveState"], a["SubState"]) == ("active", "running")
                                  else None)(container.show("NRestarts", "ActiveState", "SubState",
                                                            "MainPID", "Result")),
                         "restart by the watchdog", int(watchdog) + 60)
    elapsed = time.monotonic() - t0
    assert restarted["MainPID"] != main, restarted
    journal = container.journal()
    assert f"Watchdog timeout (limit {watchdog}s)!" in journal, journal
    assert "Failed with result 'watchdog'" in journal, journal
    # Not before the watchdog's time: the pings did keep it alive until the stop.
    assert elapsed >= int(watchdog) * 0.75, elapsed
    round_trip(mosq, port, "boot/watchdog", "after the watchdog restart")


def records(container) -> int:
    out = container.run("edgebroker", "inspect", "segments", "--data-dir", "/var/lib/edgebroker",
                        "--format", "json").stdout
    return sum(s["records"] for s in json.loads(out))


def test_upgrade_keeps_state_and_configuration_and_restarts(container, upgrade_package, units,
                                                             port, mosq):
    package, version = upgrade_package
    config = container.root / "etc/edgebroker/edgebroker.toml"
    provisioned = config.read_text()
    # The five messages published so far: install, retained, cache, reload, watchdog.
    logged = records(container)
    assert logged == 5, logged
    before = container.show("MainPID", "InvocationID")
    socket_units = [u for u in units if u.endswith(".socket")]
    sockets = [container.show("InvocationID", unit=u) for u in socket_units]
    shutil.copy(package, container.root / "root" / package.name)
    container.run("apt", "install", "-y", "-q", f"/root/{package.name}", timeout=180)
    assert container.run("dpkg-query", "--showformat=${Version}", "--show",
                         "edgebroker").stdout == version
    after = container.show("MainPID", "InvocationID", "ActiveState", "SubState")
    assert (after["ActiveState"], after["SubState"]) == ("active", "running"), after
    # Restarted: a new invocation, running the new file (not the replaced one, "(deleted)").
    assert after["InvocationID"] != before["InvocationID"] and after["MainPID"] != before["MainPID"]
    # The socket unit (when packaged) listened throughout: the same invocation.
    assert [container.show("InvocationID", unit=u) for u in socket_units] == sockets
    assert container.program(after["MainPID"]) == "/usr/bin/edgebroker"
    assert config.read_text() == provisioned
    assert records(container) == logged
    sub = mosq("sub", port, "-t", "boot/retained", "-q", "1", "-v", "-C", "1", "-W", "20")
    assert sub.wait(25) == 0, sub.out.text()
    assert "boot/retained kept across the upgrade" in sub.lines, sub.out.text()


def test_a_data_dir_elsewhere_needs_read_write_paths(container, port, mosq):
    """data_dir outside the unit's state directory: ProtectSystem=strict makes it read-only
    for the service (its permissions, 0777 here, allow it), and the start fails with exit
    status 2 naming the reason and the way out; a drop-in with ReadWritePaths= (docs/deploy.md,
    "The log on another disk") lets the broker start and keep its state there."""
    run = container.run
    config = container.root / "etc/edgebroker/edgebroker.toml"
    good = config.read_text()
    dropin = container.root / "etc/systemd/system/edgebroker.service.d/data-dir.conf"
    run("mkdir", "-p", "-m", "0777", "/srv/mqtt/edgebroker")
    config.write_text('data_dir = "/srv/mqtt/edgebroker"\n' + good)
    try:
        assert run("systemctl", "restart", UNIT, check=False).returncode != 0
        s = container.show("ExecMainStatus", "ActiveState")
        assert (s["ExecMainStatus"], s["ActiveState"]) == ("2", "failed"), s
        refusal = ("config error: /etc/edgebroker/edgebroker.toml: data_dir: "
                   "/srv/mqtt/edgebroker is not writable: read-only file system (under "
                   "systemd/edgebroker.service, ProtectSystem=strict leaves every directory but "
                   "the unit's own read-only: add ReadWritePaths=/srv/mqtt/edgebroker in a "
                   "drop-in")
        wait_for(lambda: refusal in container.journal(), "the refusal's line", 30)
        dropin.parent.mkdir(parents=True, exist_ok=True)
        dropin.write_text("[Service]\nReadWritePaths=/srv/mqtt/edgebroker\n")
        run("systemctl", "daemon-reload")
        run("systemctl", "reset-failed", UNIT)
        run("systemctl", "restart", UNIT)
        assert (container.root / "srv/mqtt/edgebroker/log").is_dir()
        round_trip(mosq, port, "boot/elsewhere", "on the other disk")
    finally:
        config.write_text(good)
        dropin.unlink(missing_ok=True)
        run("systemctl", "daemon-reload")
        run("systemctl", "reset-failed", UNIT, check=False)
        run("systemctl", "restart", UNIT)


FALLBACK = ("MB free in /var/cache/edgebroker (under 40 MB): the binary unpacks into "
            "/run/edgebroker (RAM) instead")


def test_a_full_disk_stops_neither_a_start_nor_a_reload(container, port, mosq):
    """State and cache directories on one small file system (a gateway's single root
    partition: a 64 MB tmpfs bound over /var/lib/private and /var/cache/private), filled while
    the service is stopped (a reboot with a runaway writer): the start, with under 40 MB free
    in the cache directory, unpacks the binary into the runtime directory (/run, RAM) and says
    so, and serves; a reload works too (its commands unpack there as well); with room again a
    reload's commands unpack into the cache directory again. The real state is back after."""
    run = container.run
    run("systemctl", "stop", UNIT)
    run("mkdir", "-p", "/srv/disk")
    run("mount", "-t", "tmpfs", "-o", "size=64M,mode=0755", "tmpfs", "/srv/disk")
    mounted = ["/srv/disk"]
    try:
        for name, over in (("lib", "/var/lib/private"), ("cache", "/var/cache/private")):
            run("mkdir", "-m", "0700", f"/srv/disk/{name}")
            run("mount", "--bind", f"/srv/disk/{name}", over)
            mounted.insert(0, over)
        run("systemctl", "start", UNIT)         # room: the cache directory, as always
        assert run("cat", "/run/edgebroker/tmpdir.env").stdout == "TMPDIR=/var/cache/edgebroker\n"
        run("systemctl", "stop", UNIT)
        filled = run("dd", "if=/dev/zero", "of=/srv/disk/filler", "bs=1M", check=False)
        assert "No space left on device" in filled.stderr, filled.stderr
        journal = container.journal()
        run("systemctl", "start", UNIT)
        s = container.show("ActiveState", "SubState", "MainPID", "NRestarts")
        assert (s["ActiveState"], s["SubState"]) == ("active", "running"), s
        assert run("cat", "/run/edgebroker/tmpdir.env").stdout == "TMPDIR=/run/edgebroker\n"
        [broker] = run("cat", f"/proc/{s['MainPID']}/task/{s['MainPID']}/children").stdout.split()
        maps = run("cat", f"/proc/{broker}/maps").stdout
        assert re.search(r" /run/edgebroker/_MEI\w+/libpython", maps), maps
        wait_for(lambda: re.search(rf"edgebroker: 0 {re.escape(FALLBACK)}",
                                   container.journal()[len(journal):]),
                 "the line saying the binary unpacks into /run", 30)
        pub = mosq("pub", port, "-t", "boot/full", "-m", "on a full disk", "-q", "0")
        assert pub.wait() == 0, pub.out.text()

        # A reload: its check and its `config reload` unpack into /run too.
        line = "configuration reloaded from /etc/edgebroker/edgebroker.toml"
        journal = container.journal()
        run("systemctl", "reload", UNIT)
        wait_for(lambda: all(words in container.journal()[len(journal):] for words in
                             (FALLBACK, "/etc/edgebroker/edgebroker.toml: OK (", line)),
                 "the reload's lines", 30)
        # Room again: the reload's commands unpack on disk.
        run("rm", "/srv/disk/filler")
        run("systemctl", "reload", UNIT)
        assert run("cat", "/run/edgebroker/tmpdir.env").stdout == "TMPDIR=/var/cache/edgebroker\n"
        after = container.show("MainPID", "NRestarts", "ActiveState")
        assert (after["MainPID"], after["NRestarts"], after["ActiveState"]) == \
            (s["MainPID"], s["NRestarts"], "active"), after
    finally:
        run("systemctl", "stop", UNIT)
        for path in mounted:
            run("umount", path)
        run("systemctl", "start", UNIT)
    round_trip(mosq, port, "boot/full", "the real state again")


def test_remove_stops_and_keeps_state_purge_removes_it(container, port, units):
    state = container.root / "var/lib/private/edgebroker"
    assert (state / "log").is_dir()
    container.run("apt-get", "remove", "-y", "-q", "edgebroker", timeout=120)
    assert container.run("systemctl", "is-active", UNIT, check=False).stdout.strip() == "inactive"
    assert connect_refused(port)
    assert not (container.root / "usr/bin/edgebroker").exists()
    assert (state / "log").is_dir() and (container.root / "etc/edgebroker/edgebroker.toml").exists()
    # Masked while their files are gone; still enabled, for a reinstall.
    etc = container.root / "etc/systemd/system"
    for unit in units:
        assert os.readlink(etc / unit) == "/dev/null", unit
    assert os.path.lexists(etc / "multi-user.target.wants" / UNIT)

    container.run("apt-get", "purge", "-y", "-q", "edgebroker", timeout=120)
    assert not state.exists() and not os.path.lexists(container.root / "var/lib/edgebroker")
    assert not (container.root / "var/cache/private/edgebroker").exists()
    assert not os.path.lexists(container.root / "var/cache/edgebroker")
    assert not (container.root / "etc/edgebroker/edgebroker.toml").exists()
    # No enablement link nor mask left (the drop-in directory is the administrator's).
    assert [str(p) for p in etc.rglob("edgebroker.*") if p.is_symlink()] == []
