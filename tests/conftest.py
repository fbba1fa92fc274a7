"""Fixtures for the integration tests: the real broker in a subprocess on a free port.

``broker(**overrides)`` writes a TOML config into the test's tmp dir, starts
``python -m edgebroker serve -c CONFIG`` and waits for the readiness line on stderr (no fixed
ports, no sleep-and-retry). stderr keeps being drained into ``Broker.logs`` so tests can assert
on log lines. Teardown sends SIGTERM and requires exit code 0 within 10 s.

``srv`` is one default broker shared by a test module, for tests that need no special config
(they use unique topics and client ids from ``uid``).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqttraw  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
LISTEN_RE = re.compile(r"listening on \[?([0-9A-Za-z.:_-]*?)\]?:(\d+)\b")
UNIX_LISTEN_RE = re.compile(r"listening on unix:(\S+)")
READY_RE = re.compile(r"\bready\b")


# ---------------------------------------------------------------------------------------------
# A tiny TOML writer (enough for our config: scalars, one level of tables, arrays of tables)
# ---------------------------------------------------------------------------------------------

def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, Path):
        return json.dumps(str(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {v!r} as TOML")


def toml_dumps(cfg: dict) -> str:
    lines, tables, arrays = [], [], []
    for k, v in cfg.items():
        if isinstance(v, dict):
            tables.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, v))
        else:
            lines.append(f"{k} = {toml_value(v)}")
    for k, v in tables:
        lines.append(f"\n[{k}]")
        lines += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
    for k, items in arrays:
        for item in items:
            lines.append(f"\n[[{k}]]")
            lines += [f"{kk} = {toml_value(vv)}" for kk, vv in item.items()]
    return "\n".join(lines) + "\n"


def default_config(tmp: Path) -> dict:
    return {
        "data_dir": str(tmp / "data"),
        "log_level": "info",
        "sys_interval": 0,
        # Every test client comes from 127.0.0.1: log each refused or misbehaving connection,
        # so that a test finds its own line (tests of the per-address summaries set it).
        "refusal_log_interval": 0,
        "listener": [{"host": "127.0.0.1", "port": 0}],
    }


def merge_config(base: dict, overrides: dict) -> dict:
    cfg = dict(base)
    for k, v in overrides.items():
        if v is None:
            cfg.pop(k, None)
        elif isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


# ---------------------------------------------------------------------------------------------
# Line-draining helper for subprocess pipes
# ---------------------------------------------------------------------------------------------

class LineCollector:
    """Drains a text pipe in a background thread into ``lines``; waiters block on a condition."""

    def __init__(self, pipe, echo_prefix: str | None = None):
        self.lines: list[str] = []
        self.eof = False
        self._cond = threading.Condition()
        self._echo = echo_prefix
        self._thread = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self._thread.start()

    def _run(self, pipe):
        try:
            for line in iter(pipe.readline, ""):
                with self._cond:
                    self.lines.append(line.rstrip("\n"))
                    self._cond.notify_all()
        except (ValueError, OSError):
            pass
        finally:
            with self._cond:
                self.eof = True
                self._cond.notify_all()

    def wait(self, pred, timeout: float, start: int = 0, proc=None) -> str | None:
        """The first line (from index ``start``) matching ``pred``; None on timeout or EOF."""
        if isinstance(pred, str):
            s = pred
            pred = lambda line: s in line  # noqa: E731
        elif isinstance(pred, re.Pattern):
            rx = pred
            pred = lambda line: rx.search(line) is not None  # noqa: E731
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                while i < len(self.lines):
                    if pred(self.lines[i]):
                        return self.lines[i]
                    i += 1
                if self.eof:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, 0.5))

    def join(self, timeout: float = 5.0):
        self._thread.join(timeout)

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


# ---------------------------------------------------------------------------------------------
# The broker process
# ---------------------------------------------------------------------------------------------

_open_clients: list = []
_live_brokers: list = []


def as_nobody() -> list[str]:
    """The command prefix that runs a command as the user nobody (setpriv, util-linux), for
    tests that need a user other than root (root may write anywhere). Only root can."""
    assert os.geteuid() == 0, "this test runs a command as another user: run the tests as root"
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to run a command as nobody"
    return ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def without_root_file_access() -> list[str]:
    """The prefix that runs a command as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    (setpriv, util-linux): file permissions then hold for it as for the service's user."""
    assert os.geteuid() == 0, "this test needs root: run the tests as root"
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed"
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def broker_command() -> list[str]:
    """``python -m edgebroker``; EDGEBROKER_TEST_BROKER may name another command that follows
    the same CLI contract (used to check the tests themselves against a reference broker)."""
    alt = os.environ.get("EDGEBROKER_TEST_BROKER")
    return alt.split() if alt else [sys.executable, "-m", "edgebroker"]


class Broker:
    def __init__(self, workdir: Path, config: dict | None, args=(), raw_config: str | None = None,
                 config_path: Path | None = None, wrap=None, pass_fds=()):
        """``wrap``: a function of the command giving the command to run (as
        fakesystemd.SocketUnit.wrap), with ``pass_fds`` for Popen."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = config
        cmd = broker_command() + ["serve"]
        if config is not None or raw_config is not None:
            self.config_path = config_path or workdir / "edgebroker.toml"
            self.config_path.write_text(raw_config if raw_config is not None else toml_dumps(config))
            cmd += ["-c", str(self.config_path)]
        else:
            self.config_path = None
        cmd += list(args)
        self.cmd = cmd = wrap(cmd) if wrap is not None else cmd
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.stdout_file = open(workdir / "stdout.txt", "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.stdout_file, stderr=subprocess.PIPE, text=True,
                                     errors="replace", pass_fds=pass_fds)
        self._stderr = LineCollector(self.proc.stderr)
        _live_brokers.append(self)
        self.listeners: list[tuple[str, int]] = []
        self.unix_paths: list[str] = []
        self.stopped = False
        self.returncode = None

    # -- readiness ------------------------------------------------------------------------------
    def wait_ready(self, timeout: float = READY_TIMEOUT) -> "Broker":
        line = self._stderr.wait(READY_RE, timeout)
        if line is None:
            alive = self.proc.poll() is None
            if alive:
                self.proc.kill()
            self.proc.wait(5)
            self.stopped = True
            pytest.fail(f"broker not ready within {timeout} s (exit code {self.proc.returncode}, "
                        f"{'was running' if alive else 'exited'}); cmd={self.cmd}\n"
                        f"stderr:\n{self.log_text()}")
        for ln in self.logs:
            m = UNIX_LISTEN_RE.search(ln)
            if m:
                self.unix_paths.append(m.group(1))
                continue
            m = LISTEN_RE.search(ln)
            if m:
                self.listeners.append((m.group(1) or "127.0.0.1", int(m.group(2))))
            if READY_RE.search(ln):
                break
        assert self.listeners or self.unix_paths, \
            f"no 'listening on HOST:PORT' line before 'ready':\n{self.log_text()}"
        return self

    @property
    def host(self) -> str:
        h = self.listeners[0][0]
        return "127.0.0.1" if h in ("0.0.0.0", "", "localhost") else h

    @property
    def port(self) -> int:
        return self.listeners[0][1]

    # -- logs -----------------------------------------------------------------------------------
    @property
    def logs(self) -> list[str]:
        return self._stderr.lines

    def log_text(self) -> str:
        return self._stderr.text()

    def mark(self) -> int:
        """Index of the next log line, to search only lines logged after this point."""
        return len(self._stderr.lines)

    def wait_log(self, pred, timeout: float = 5.0, start: int = 0) -> str | None:
        return self._stderr.wait(pred, timeout, start)

    # -- clients --------------------------------------------------------------------------------
    def raw(self, port: int | None = None, **transport) -> mqttraw.RawClient:
        """A raw client socket; ``transport``: unix_path, source, ssl_context, rcvbuf (see
        RawClient)."""
        if transport.get("unix_path"):
            c = mqttraw.RawClient("", 0, **transport)
        else:
            c = mqttraw.RawClient(self.host, port or self.port, **transport)
        _open_clients.append(c)
        return c

    def client(self, client_id: str | bytes = "", expect_rc: int = 0, port: int | None = None,
               transport: dict | None = None, rcvbuf: int | None = None,
               **connect_kw) -> mqttraw.RawClient:
        """A raw client connected with CONNACK rc ``expect_rc`` (0 by default)."""
        transport = dict(transport or {})
        if rcvbuf is not None:
            transport["rcvbuf"] = rcvbuf
        c = self.raw(port, **transport)
        ack = c.connect(client_id, **connect_kw)
        assert ack.rc == expect_rc, f"CONNACK rc {ack.rc}, expected {expect_rc}"
        c.connack = ack
        return c

    # -- signals and shutdown -------------------------------------------------------------------
    def send_signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Send ``sig`` and wait for exit; returns the exit code (kills and fails on timeout)."""
        if self.stopped:
            return self.returncode
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            self._finish()
            pytest.fail(f"broker did not exit within {timeout} s of {sig!r}\nstderr:\n{self.log_text()}")
        self._finish()
        return self.returncode

    def _finish(self):
        self._stderr.join(5)
        try:
            self.stdout_file.close()
        except OSError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    # -- the admin socket (docs/metrics.md), through a plain Unix socket ------------------------
    @property
    def admin_path(self) -> Path:
        return Path(self.config["data_dir"]) / "admin.sock"

    def admin(self, cmd: str, timeout: float = 5.0, **args) -> dict:
        """One JSON request on the admin socket; returns the reply (asserts ``ok``)."""
        import socket as _socket

        with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.admin_path))
            s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                assert chunk, f"admin socket closed without a reply to {cmd!r}"
                buf += chunk
        reply = json.loads(buf)
        assert reply.get("ok"), f"admin {cmd!r}: {reply}"
        return reply

    def stats(self) -> dict:
        return self.admin("stats")["stats"]

    def client_row(self, client_id: str) -> dict:
        """The `clients` row of one connected client (fails if it is not connected)."""
        rows = self.admin("clients", limit=0)["clients"]
        found = [r for r in rows if r["id"] == client_id]
        assert found, f"client {client_id!r} not in {[r['id'] for r in rows]}"
        return found[0]


def _start(workdir: Path, overrides: dict, args=(), raw_config=None, wait=True, config_file=True,
           wrap=None, pass_fds=()) -> Broker:
    """A broker on ``default_config`` + ``overrides`` (also for module-scoped fixtures of
    other test modules, with ``_teardown`` to stop it)."""
    cfg = merge_config(default_config(workdir), overrides) if config_file else None
    b = Broker(workdir, cfg, args=args, raw_config=raw_config, wrap=wrap, pass_fds=pass_fds)
    if wait:
        b.wait_ready()
    return b


def _teardown(brokers: list[Broker]) -> None:
    failures = []
    for b in brokers:
        if b.stopped:
            continue
        was_alive = b.alive()
        rc = b.stop()
        if not was_alive:
            failures.append(f"broker had already exited with code {rc} before teardown\n"
                            f"stderr:\n{b.log_text()[-4000:]}")
        elif rc != 0:
            failures.append(f"broker exited with code {rc} on SIGTERM\nstderr:\n{b.log_text()[-4000:]}")
    if failures:
        pytest.fail("\n".join(failures))


@contextmanager
def open_files_allowed(need: int):
    """Raise this process's RLIMIT_NOFILE soft limit to at least ``need`` (children started
    meanwhile inherit it); fails the test when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard} is below the {need} this test needs "
                    f"(raise it: ulimit -Hn, or LimitNOFILE= for a service)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need) if hard == resource.RLIM_INFINITY
                                                else hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(params=["c", "python"])
def native_backend(request, monkeypatch):
    """Runs the test twice: on the C helper and on its pure-Python twin.

    Switches ``edgebroker._native`` (in this process) and sets ``EDGEBROKER_NATIVE`` (for
    subprocesses such as the CLI tests). When the C build is missing the ``c`` runs fail with
    NativeUnavailableError instead of being skipped: CI must build it. Autouse in
    tests/commitlog/; tests/cli/test_inspect.py asks for it too."""
    from edgebroker import _native
    before = _native.BACKEND
    _native.set_backend(request.param)
    monkeypatch.setenv("EDGEBROKER_NATIVE", request.param)
    yield request.param
    _native.set_backend(before)


@pytest.fixture
def broker(tmp_path):
    """Factory: ``broker(limits={...}, sys_interval=1, args=[...])`` -> a ready Broker."""
    started: list[Broker] = []
    counter = itertools.count()

    def start(*, args=(), raw_config=None, wait=True, config_file=True, wrap=None, pass_fds=(),
              **overrides) -> Broker:
        """``config_file=False`` starts without ``-c`` (then pass ``--listen``/``--data-dir``);
        ``wrap``, ``pass_fds``: see Broker."""
        b = _start(tmp_path / f"broker{next(counter)}", overrides, args, raw_config, wait,
                   config_file, wrap, pass_fds)
        started.append(b)
        return b

    yield start
    _close_all_clients()
    _teardown(started)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """One default broker shared by the tests of a module."""
    b = _start(tmp_path_factory.mktemp("srv"), {})
    yield b
    _close_all_clients()
    _teardown([b])


_uid_counter = itertools.count()


@pytest.fixture
def uid(request) -> str:
    """A short unique prefix for topics and client ids of one test."""
    return f"u{os.getpid() % 1000}x{next(_uid_counter)}"


def _close_all_clients():
    while _open_clients:
        c = _open_clients.pop()
        try:
            c.close()
        except Exception:
            pass


@pytest.fixture(autouse=True)
def _cleanup_clients():
    """Closes the test's raw clients; prints the broker log lines of the test (shown on failure)."""
    marks = {id(b): b.mark() for b in _live_brokers}
    yield
    _close_all_clients()
    for b in list(_live_brokers):
        lines = b.logs[marks.get(id(b), 0):]
        if lines:
            print(f"--- broker {b.workdir.name} stderr ---")
            print("\n".join(lines[-200:]))
        if b.stopped:
            _live_brokers.remove(b)


# ---------------------------------------------------------------------------------------------
# paho-mqtt
# ---------------------------------------------------------------------------------------------

class PahoClient:
    """paho-mqtt (v2 callback API) with the network loop in its thread and events to wait on."""

    def __init__(self, port: int, client_id: str = "", clean_session: bool = True, protocol=None,
                 will=None, keepalive: int = 60, host: str = "127.0.0.1", tls: dict | None = None,
                 username: str | None = None, password: str | None = None, reconnect: bool = True,
                 websocket_path: str | None = None):
        """``tls``: keyword arguments of paho's ``tls_set`` (ca_certs, certfile, keyfile, ...);
        ``reconnect=False`` for a client expected to be refused; ``websocket_path``: MQTT over
        WebSockets (paho's transport="websockets") on that path."""
        import paho.mqtt.client as mqtt

        self.mqtt = mqtt
        protocol = mqtt.MQTTv311 if protocol is None else protocol
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             clean_session=clean_session, protocol=protocol,
                             reconnect_on_failure=reconnect,
                             transport="tcp" if websocket_path is None else "websockets")
        if websocket_path is not None:
            self.c.ws_set_options(path=websocket_path)
        if tls is not None:
            self.c.tls_set(**tls)
        if username is not None:
            self.c.username_pw_set(username, password)
        self.messages: queue.Queue = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connect_rc = None
        self.session_present = None
        self._subacks: dict[int, list] = {}
        self._sub_cond = threading.Condition()
        self.c.on_connect = self._on_connect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_unsubscribe = self._on_unsubscribe
        self.c.on_disconnect = self._on_disconnect
        if will is not None:
            topic, payload, *rest = will
            self.c.will_set(topic, payload, qos=rest[0] if rest else 0, retain=rest[1] if len(rest) > 1 else False)
        self.c.connect(host, port, keepalive=keepalive)
        self.c.loop_start()
        assert self.connected.wait(10), "paho: no CONNACK within 10 s"

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self.connect_rc = reason_code
        self.session_present = flags.session_present
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.disconnected.set()

    def _on_message(self, client, userdata, msg):
        self.messages.put(msg)

    def _on_subscribe(self, client, userdata, mid, reason_code_list, properties):
        with self._sub_cond:
            self._subacks[mid] = [int(getattr(rc, "value", rc)) for rc in reason_code_list]
            self._sub_cond.notify_all()

    def _on_unsubscribe(self, client, userdata, mid, reason_code_list, properties):
        with self._sub_cond:
            self._subacks[mid] = []
            self._sub_cond.notify_all()

    def _wait_mid(self, mid: int, timeout: float = 10.0):
        with self._sub_cond:
            ok = self._sub_cond.wait_for(lambda: mid in self._subacks, timeout)
            assert ok, f"paho: no SUBACK/UNSUBACK for mid {mid}"
            return self._subacks.pop(mid)

    def subscribe(self, topic: str, qos: int = 0) -> list:
        rc, mid = self.c.subscribe(topic, qos)
        assert rc == self.mqtt.MQTT_ERR_SUCCESS
        return self._wait_mid(mid)

    def unsubscribe(self, topic: str) -> None:
        rc, mid = self.c.unsubscribe(topic)
        assert rc == self.mqtt.MQTT_ERR_SUCCESS
        self._wait_mid(mid)

    def publish(self, topic: str, payload, qos: int = 0, retain: bool = False, timeout: float = 10.0):
        info = self.c.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(timeout)
        assert info.is_published(), f"paho: publish to {topic} not completed"
        return info

    def get(self, timeout: float = 5.0):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"paho: no message within {timeout} s") from None

    def disconnect(self):
        self.c.disconnect()
        self.disconnected.wait(5)
        self.c.loop_stop()

    def close(self):
        try:
            self.c.disconnect()
        except Exception:
            pass
        try:
            self.c.loop_stop()
        except Exception:
            pass


@pytest.fixture
def paho():
    """Factory: ``paho(port, client_id=..., clean_session=..., protocol=..., will=...)``."""
    made: list[PahoClient] = []

    def make(port: int, **kw) -> PahoClient:
        c = PahoClient(port, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# ---------------------------------------------------------------------------------------------
# mosquitto_pub / mosquitto_sub
# ---------------------------------------------------------------------------------------------

class Proc:
    """A subprocess whose stdout is collected line by line (stderr merged)."""

    def __init__(self, cmd, stdin_data: str | None = None):
        self.cmd = cmd
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  errors="replace")
        if stdin_data is not None:
            self.p.stdin.write(stdin_data)
            self.p.stdin.close()
        self.out = LineCollector(self.p.stdout)

    def wait_line(self, pred, timeout: float = 10.0) -> str:
        line = self.out.wait(pred, timeout)
        assert line is not None, f"{self.cmd}: expected line not seen; output:\n{self.out.text()}"
        return line

    def wait(self, timeout: float = 15.0) -> int:
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)
            pytest.fail(f"{self.cmd} did not finish within {timeout} s; output:\n{self.out.text()}")
        self.out.join(5)
        return rc

    @property
    def lines(self) -> list[str]:
        return self.out.lines

    def kill(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        self.p.wait(5)


@pytest.fixture
def mosq():
    """Factory for mosquitto_pub/mosquitto_sub processes: ``mosq("sub", port, "-t", "a", ...)``."""
    procs: list[Proc] = []

    def run(tool: str, port: int, *args, stdin_data: str | None = None) -> Proc:
        # stdbuf -oL: line-buffered stdout through the pipe, so lines can be waited on as they come
        cmd = ["stdbuf", "-oL", f"mosquitto_{tool}", "-h", "127.0.0.1", "-p", str(port), *args]
        p = Proc(cmd, stdin_data)
        procs.append(p)
        return p

    yield run
    for p in procs:
        if p.p.poll() is None:
            p.kill()


def run_cli(*args, timeout: float = 15.0) -> subprocess.CompletedProcess:
    """Run ``python -m edgebroker ARGS`` to completion (for --version and bad-config cases)."""
    return subprocess.run([*broker_command(), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))


def sigint_ignored(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT (its SigIgn mask in /proc)."""
    with open(f"/proc/{pid}/status") as fh:
        mask = next(int(line.split()[1], 16) for line in fh if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGINT - 1)))


def until(pred, timeout: float, what: str):
    """``pred()``'s first true value, looked at every 50 ms for up to ``timeout`` s; else an
    AssertionError saying ``what`` did not come."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        pause.wait(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def wait_for_snapshot(data_dir: str, client_id: str, timeout: float = 5.0,
                      pred=lambda session: True) -> dict:
    """The snapshot once it lists ``client_id`` with a session entry for which ``pred`` holds
    (it is written at most 1 s after a change)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while time.monotonic() < deadline:
        try:
            with open(f"{data_dir}/sessions.json") as fh:
                doc = json.load(fh)
        except (FileNotFoundError, ValueError):
            doc = {"sessions": []}
        if any(s["client_id"] == client_id and pred(s) for s in doc["sessions"]):
            return doc
        pause.wait(0.05)
    raise AssertionError(f"no snapshot listing {client_id!r} within {timeout} s")


@pytest.fixture
def mosquitto_broker(tmp_path):
    """Factory: ``mosquitto_broker(persistence=True, extra=[...])`` -> a running Mosquitto on a
    free loopback port (tests/mosquitto.py); all are stopped at the end of the test."""
    from mosquitto import MosquittoBroker
    made: list = []

    def start(**kw):
        m = MosquittoBroker(tmp_path / f"mosquitto{len(made)}", **kw).start()
        made.append(m)
        return m

    yield start
    for m in made:
        m.stop(kill=True)
