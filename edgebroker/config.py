"""Typed, validated configuration: the one place that knows every setting.

The file format is TOML. Every key has a type, a default and a check; an
unknown key, a wrong type or a bad value raises ``ConfigError`` naming the
key (``limits.max_inflight_messages``) and the problem. Names follow
Mosquitto's where Mosquitto has the setting. docs/config.md lists them all.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
import typing
from typing import Any

from edgebroker.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1883
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_PACKET_SIZE_311 = 268_435_455  # largest remaining length 3.1.1 can encode, plus header


def _at_least(minimum):
    def check(value):
        if value < minimum:
            return f"must be at least {minimum}"
        return None
    return check


def _between(low, high):
    def check(value):
        if not low <= value <= high:
            return f"must be between {low} and {high}"
        return None
    return check


def _one_of(*choices):
    def check(value):
        if value not in choices:
            return "must be one of " + ", ".join(repr(c) for c in choices)
        return None
    return check


def _setting(default, check=None, doc=""):
    """A dataclass field carrying its validation and its one-line meaning."""
    return field(default=default, metadata={"check": check, "doc": doc})


@dataclass(frozen=True)
class ListenerConfig:
    host: str = _setting(DEFAULT_HOST, doc="address to bind; \"::\" or \"0.0.0.0\" for all")
    port: int = _setting(DEFAULT_PORT, _between(0, 65535), doc="TCP port; 0 picks a free port")

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Limits:
    connect_timeout: float = _setting(
        10.0, _at_least(0.001), doc="seconds a new connection has to send CONNECT")
    max_keepalive: int = _setting(
        65535, _between(0, 65535),
        doc="largest keepalive (s) a client may ask for; a larger one gets CONNACK 2")
    max_packet_size: int = _setting(
        1_048_576, _between(2, MAX_PACKET_SIZE_311),
        doc="largest packet (bytes, whole packet) accepted; larger closes the connection")
    max_client_id_length: int = _setting(
        65535, _between(23, 65535),
        doc="longest client id (bytes); longer gets CONNACK 2 (at least 23, MQTT-3.1.3-5)")
    max_inflight_messages: int = _setting(
        20, _between(1, 65535), doc="outgoing QoS 1/2 messages awaiting acknowledgement per session")
    max_queued_messages: int = _setting(
        1000, _at_least(1),
        doc="messages queued per session beyond the inflight window or while offline; "
            "newer messages are dropped when full")
    queue_qos0_messages: bool = _setting(
        False, doc="also queue QoS 0 messages for offline persistent sessions")


DURABILITY = ("none", "batch", "sync")
MiB = 1024 * 1024


@dataclass(frozen=True)
class LogConfig:
    durability: str = _setting(
        "batch", _one_of(*DURABILITY),
        doc="when QoS 1/2 publishes are acknowledged: none, batch or sync (docs/config.md)")
    flush_interval_ms: int = _setting(
        100, _between(1, 60_000), doc="with durability batch: at most one fsync per this many ms")
    segment_bytes: int = _setting(
        16 * MiB, _between(4096, 1024 * MiB), doc="a segment is rolled before it grows past this")
    segment_ms: int = _setting(
        600_000, _at_least(1000), doc="a segment is rolled once its first record is this old (ms)")
    retention_bytes: int = _setting(
        1024 * MiB, _at_least(4096),
        doc="the log's size limit; over it the oldest segments go, uploaded or not")
    retention_ms: int = _setting(
        604_800_000, _at_least(1000),
        doc="an uploaded segment is deleted once its newest record is this old (ms)")


@dataclass(frozen=True)
class Config:
    data_dir: str = _setting("", doc="state directory (default $STATE_DIRECTORY or ./edgebroker-data)")
    log_level: str = _setting("info", _one_of(*LOG_LEVELS), doc="debug, info, warning or error")
    sys_interval: float = _setting(
        10.0, _at_least(0), doc="seconds between $SYS publications; 0 turns them off")
    allow_zero_length_clientid: bool = _setting(
        True, doc="accept an empty client id (with clean session) and assign one")
    auto_id_prefix: str = _setting("auto-", doc="prefix of assigned client ids")
    listener: tuple[ListenerConfig, ...] = field(default=(ListenerConfig(),))
    limits: Limits = field(default_factory=Limits)
    log: LogConfig = field(default_factory=LogConfig)
    source: str = field(default="", compare=False)

    @property
    def listeners(self) -> tuple[ListenerConfig, ...]:
        return self.listener

    def state_dir(self) -> str:
        if self.data_dir:
            return self.data_dir
        state = os.environ.get("STATE_DIRECTORY", "")
        if state:
            return state.split(":")[0]
        return os.path.abspath("edgebroker-data")


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _coerce(value: Any, kind: type, key: str) -> Any:
    # bool is an int in Python; a TOML boolean is never accepted as a number.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key}: expected {_TYPE_NAMES[kind]}, got {value!r}")


def _build(cls, table: Any, prefix: str):
    if not isinstance(table, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a table, got {table!r}")
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    hints = typing.get_type_hints(cls)
    values = {}
    for name, raw in table.items():
        key = f"{prefix}{name}"
        f = known.get(name)
        if f is None:
            raise ConfigError(f"{key}: unknown setting")
        if cls is Config and name == "listener":
            values[name] = _build_listeners(raw)
        elif cls is Config and name == "limits":
            values[name] = _build(Limits, raw, "limits.")
        elif cls is Config and name == "log":
            values[name] = _build_log(raw)
        else:
            value = _coerce(raw, hints[name], key)
            check = f.metadata.get("check")
            problem = check(value) if check else None
            if problem:
                raise ConfigError(f"{key}: {problem}, got {raw!r}")
            values[name] = value
    return cls(**values)


def _build_log(raw: Any) -> LogConfig:
    log = _build(LogConfig, raw, "log.")
    if log.retention_bytes < log.segment_bytes:
        raise ConfigError(f"log.retention_bytes: must be at least log.segment_bytes "
                          f"({log.segment_bytes}), got {log.retention_bytes}")
    return log


def _build_listeners(raw: Any) -> tuple[ListenerConfig, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("listener: expected one or more [[listener]] tables")
    listeners = tuple(_build(ListenerConfig, item, f"listener[{i}].") for i, item in enumerate(raw))
    seen = set()
    for i, lst in enumerate(listeners):
        if lst.port and (lst.host, lst.port) in seen:
            raise ConfigError(f"listener[{i}]: {lst.address} is listed twice")
        seen.add((lst.host, lst.port))
    return listeners


def from_dict(table: dict, source: str = "") -> Config:
    config = _build(Config, table, "")
    return dataclasses.replace(config, source=source)


def load(path: str | None) -> Config:
    """Read and validate a config file; ``None`` gives the embedded defaults."""
    if path is None:
        return Config()
    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): not valid TOML") from None
    try:
        return from_dict(table, source=path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_address(text: str) -> ListenerConfig:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (all interfaces) for ``--listen``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    port_no = int(port)
    if port_no > 65535:
        raise ConfigError(f"--listen {text!r}: port must be between 0 and 65535")
    return ListenerConfig(host=host, port=port_no)


def describe() -> list[tuple[str, Any, str]]:
    """(key, default, meaning) for every setting, for docs and `config check`."""
    rows = []
    for prefix, cls in (("", Config), ("listener.", ListenerConfig), ("limits.", Limits),
                        ("log.", LogConfig)):
        for f in dataclasses.fields(cls):
            if "doc" in f.metadata:
                rows.append((prefix + f.name, f.default, f.metadata["doc"]))
    return rows
