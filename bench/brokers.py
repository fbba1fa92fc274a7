"""Start, watch and stop the brokers under test (edgebroker and Mosquitto), one fresh process per run.

Both listen on 127.0.0.1 only and log to a file in a temporary directory (never to a
pipe nobody reads). edgebroker runs at its default configuration (its subscribers that
fall behind read from the commit log: it has no reason to drop); Mosquitto gets queue
limits (``LIMITS``) high enough that it drops nothing either, so that both report numbers
without loss. Readiness is a bounded TCP-connect poll.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0

# Mosquitto's: the queue limit is above the largest message count of any scenario, so it has
# no reason to drop: loss then means a bug, not a policy.
# (With Mosquitto's defaults, 20 in flight and 1000 queued, or even with 100,000 queued,
# Mosquitto drops about a quarter of the QoS 1 fan-in messages: it acknowledges
# publishers faster than it delivers to the one subscriber.)
# The QoS 1/2 window is 20, Mosquitto's default and edgebroker's, so that both brokers have
# the same (it was 1000 for Mosquitto only, against edgebroker's 20); run.py --inflight N
# gives both N.
LIMITS = {"max_inflight_messages": 20, "max_queued_messages": 1_000_000}
# run.py --inflight: max_inflight_messages for both brokers in every scenario (None: LIMITS
# for Mosquitto, the default for edgebroker, and each scenario's own).
INFLIGHT: int | None = None
# edgebroker's: none. At its defaults a subscriber that falls behind reads from the commit
# log (docs/persistence.md), so nothing is dropped; setting max_queued_* would switch it to
# in-memory queues that drop (Mosquitto's meaning), which is not what users run.
EDGEBROKER_LIMITS: dict = {}
# An ACL file both brokers load (run.py --acl), or None.
ACL_FILE = None
# Where the brokers' temporary state directories (edgebroker's commit log) go: a directory on
# a disk, never tmpfs, so that the durability settings measure real fsyncs (state_root()).
STATE_ROOT_CANDIDATES = ("/var/tmp", tempfile.gettempdir(), os.path.join(REPO, "bench", "results"))
_state_root: tuple[str, str] | None = None

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is an install requirement of edgebroker
    psutil = None


def free_port() -> int:
    """A free port below the kernel's ephemeral range. A listening port from inside that range
    can equal the ephemeral port of a later client whose 4-tuple then mirrors a TIME_WAIT
    socket of an earlier run; its SYN is dropped (PAWS) and retried after 1 s, a stall that
    the connect rate of 10,000 clients would show."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    if low > 11000:
        for _ in range(100):
            port = random.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fs_type(path: str) -> str:
    """The file system type of the mount holding ``path`` (from /proc/mounts; "" if unknown)."""
    path = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        pass
    return fstype


def state_root() -> tuple[str, str]:
    """(directory, file system type) for the brokers' state: the first writable candidate
    (``$BENCH_STATE_DIR`` first) that is not on tmpfs/ramfs."""
    global _state_root
    if _state_root is None:
        env = os.environ.get("BENCH_STATE_DIR")
        for cand in ((env,) if env else ()) + STATE_ROOT_CANDIDATES:
            fstype = _fs_type(cand)
            if (os.path.isdir(cand) and os.access(cand, os.W_OK)
                    and fstype not in ("tmpfs", "ramfs")):
                _state_root = (cand, fstype or "unknown")
                break
        else:
            _state_root = (tempfile.gettempdir(), _fs_type(tempfile.gettempdir()) or "unknown")
    return _state_root


def raise_nofile(want: int) -> int:
    """Raise RLIMIT_NOFILE of this process (inherited by the brokers and generators it starts)
    to at least ``want`` where allowed (the hard limit too when privileged); returns the soft
    limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
                return want
            except (ValueError, OSError):
                want = hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft


def mosquitto_path() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    for candidate in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_mosquitto() -> str | None:
    """The mosquitto binary, installed with apt-get (sudo when not root) when missing."""
    path = mosquitto_path()
    if path:
        return path
    if not shutil.which("apt-get"):
        print("mosquitto is missing and apt-get is not available", file=sys.stderr)
        return None
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    print("mosquitto not found: installing the Debian package", flush=True)
    install = sudo + env + ["apt-get", "install", "-y", "-q", "--no-install-recommends", "mosquitto"]
    try:
        if subprocess.run(install, timeout=600).returncode != 0:
            subprocess.run(sudo + env + ["apt-get", "update", "-q"], timeout=600)
            subprocess.run(install, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"installing mosquitto failed: {exc}", file=sys.stderr)
    return mosquitto_path()


def mosquitto_version(path: str | None) -> str:
    if not path:
        return "not installed"
    try:
        out = subprocess.run([path, "-h"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in out.splitlines():
        if "version" in line:
            return line.split("version", 1)[1].strip()
    return "unknown"


def wait_port(host: str, port: int, proc: subprocess.Popen, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise RuntimeError(f"broker not accepting on {host}:{port} after {timeout:.0f} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class Broker:
    """One broker process for one run.

    ``cfg`` adjusts it for one scenario: ``limits`` (edgebroker ``[limits]`` keys over
    EDGEBROKER_LIMITS, Mosquitto options over LIMITS; None restores the broker's
    default), ``log`` (edgebroker ``[log]`` keys), ``toml`` (edgebroker: more tables as
    TOML text), ``mosquitto`` (extra lines of
    mosquitto.conf), ``nofile`` (open files the process needs: RLIMIT_NOFILE is raised before
    it starts and inherited).
    """

    name = "?"

    def __init__(self, cfg: dict | None = None):
        self.cfg = cfg or {}
        self.tmp = tempfile.mkdtemp(prefix=f"bench-{self.name}-", dir=state_root()[0])
        self.host = "127.0.0.1"
        self.port = free_port()
        self.log_path = os.path.join(self.tmp, "broker.log")
        self.proc: subprocess.Popen | None = None
        self._ps = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict | None:
        return None

    def start(self) -> "Broker":
        if self.cfg.get("nofile"):
            raise_nofile(self.cfg["nofile"])
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                         env=self.env(), start_new_session=True)
        wait_port(self.host, self.port, self.proc)
        if psutil is not None:
            self._ps = psutil.Process(self.proc.pid)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self) -> float:
        """user + system CPU time of the broker process so far."""
        if self._ps is not None:
            t = self._ps.cpu_times()
            return t.user + t.system
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        if self._ps is not None:
            return self._ps.memory_info().rss
        with open(f"/proc/{self.proc.pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def admin_stats(self) -> dict | None:
        """The broker's own figures (edgebroker's admin socket), or None."""
        return None

    def peak_rss_bytes(self) -> int | None:
        """The kernel's high-water mark of the broker's RSS (VmHWM) since it started or since
        ``reset_peak_rss``; None where /proc does not tell."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def rss_parts(self) -> dict | None:
        """The RSS now, split as the kernel counts it (MB): anonymous memory (the heap),
        file-backed pages mapped (code, libraries, memory-mapped files such as edgebroker's
        log index), shared memory; None where /proc does not tell."""
        keys = {"RssAnon:": "anon_mb", "RssFile:": "file_mb", "RssShmem:": "shmem_mb"}
        out = {}
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    parts = line.split()
                    if parts and parts[0] in keys:
                        out[keys[parts[0]]] = round(int(parts[1]) / 1024, 1)
        except (OSError, ValueError, IndexError):
            return None
        return out or None

    def reset_peak_rss(self) -> bool:
        """Reset VmHWM to the current RSS (``clear_refs`` 5); False where that is not allowed."""
        try:
            with open(f"/proc/{self.proc.pid}/clear_refs", "w") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _limits(base: dict, cfg: dict) -> dict:
    """A broker's limits: ``base``, then the scenario's own, then ``INFLIGHT``."""
    limits = {**base, **cfg.get("limits", {})}
    if INFLIGHT is not None:
        limits["max_inflight_messages"] = INFLIGHT
    return limits


class Edgebroker(Broker):
    name = "edgebroker"

    def command(self) -> list[str]:
        cfg = os.path.join(self.tmp, "edgebroker.toml")
        with open(cfg, "w") as fh:
            if ACL_FILE:
                fh.write(f"acl_file = {ACL_FILE!r}\n")
            fh.write("[limits]\n")
            for key, value in _limits(EDGEBROKER_LIMITS, self.cfg).items():
                if value is not None:
                    fh.write(f"{key} = {_toml(value)}\n")
            if self.cfg.get("log"):
                fh.write("[log]\n")
                for key, value in self.cfg["log"].items():
                    fh.write(f"{key} = {_toml(value)}\n")
            fh.write(self.cfg.get("toml", ""))    # more tables, as TOML text ([[bridge]])
        return [sys.executable, "-m", "edgebroker", "serve", "-c", cfg,
                "--listen", f"{self.host}:{self.port}", "--data-dir", os.path.join(self.tmp, "data")]

    def admin_stats(self, timeout: float = 5.0) -> dict | None:
        """``stats`` from the admin socket (docs/metrics.md): counters, drops by reason,
        sessions behind; None when it does not answer."""
        path = os.path.join(self.tmp, "data", "admin.sock")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(path)
                s.sendall(b'{"cmd": "stats"}\n')
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        return None
                    buf += chunk
            reply = json.loads(buf)
        except (OSError, ValueError):
            return None
        return reply.get("stats") if reply.get("ok") else None

    def env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env


class Mosquitto(Broker):
    name = "mosquitto"
    binary = None

    def command(self) -> list[str]:
        cfg = os.path.join(self.tmp, "mosquitto.conf")
        with open(cfg, "w") as fh:
            fh.write(f"listener {self.port} {self.host}\n"
                     "allow_anonymous true\n"
                     "persistence false\n"
                     "log_dest stderr\n"
                     "log_type error\n"
                     "log_type warning\n")
            if ACL_FILE:
                fh.write(f"acl_file {ACL_FILE}\n")
            for key, value in _limits(LIMITS, self.cfg).items():
                if value is not None:
                    fh.write(f"{key} {value}\n")
            for line in self.cfg.get("mosquitto", ()):
                fh.write(line + "\n")
        os.chmod(self.tmp, 0o755)    # mosquitto drops privileges when started as root
        os.chmod(cfg, 0o644)
        return [self.binary or "mosquitto", "-c", cfg]


BROKERS = {"edgebroker": Edgebroker, "mosquitto": Mosquitto}


def parse_with_repo(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse ``ap``'s arguments plus ``--repo DIR``, which makes the brokers run from another
    checkout (for a before figure); the attack scripts (bench/attack_*.py) use it."""
    global REPO
    ap.add_argument("--repo", help="run the broker from this checkout (default: this one)")
    args = ap.parse_args()
    if args.repo:
        REPO = os.path.abspath(args.repo)
    return args
