"""Typed, validated configuration: the one place that knows every setting.

The file format is TOML. Every key has a type, a default and a check; an unknown key, a wrong
type or a bad value raises ``ConfigError`` naming the key (``limits.max_inflight_messages``)
and the problem, every problem of the file at once (an unknown key with the likely one it
meant). Names follow Mosquitto's where Mosquitto has the setting. docs/config.md lists them
all. A ``[limits]`` section is edgebroker.limits_config's, a ``[[listener]]`` table
listener_config's, ``[upload]`` upload_config's, a ``[[bridge]]`` table bridge_config's.
"""

from __future__ import annotations

import os
import stat

from edgebroker import records
from edgebroker.config_fields import (
    MiB, at_least, between, coerce, file_path, mqtt_text, off_or_at_least, one_of,
    setting,
)
from edgebroker.errors import ConfigError
from edgebroker.files import owner_problem
from edgebroker.limits_config import Limits
from edgebroker.listener_config import (  # noqa: F401  (parse_address: also config's)
    ADMIN_SOCKET, ListenerConfig, address_problems, listener_problems, parse_address,
)
from edgebroker.records import field, record
from edgebroker.upload_config import UploadConfig

TYPE_CHECKING = False   # typing is imported by type checkers only (the broker's memory)
if TYPE_CHECKING:
    from typing import Any

    from edgebroker.bridge_config import BridgeConfig

LOG_LEVELS = ("debug", "info", "warning", "error")


@record(frozen=True)
class AuthSettings:
    """The authentication settings in force on one listener (top level + its overrides)."""
    allow_anonymous: bool
    password_file: str
    acl_file: str
    identity_as_username: bool
    explicit_anonymous: bool    # allow_anonymous was set, not derived


@record(frozen=True)
class MetricsConfig:
    listen: str = setting(
        "", doc="HOST:PORT of the Prometheus text endpoint (/metrics); empty: off")


DURABILITY = ("none", "batch", "sync")
# Upper bounds of [log] (segment_ms goes to the C helper as a 64-bit integer): a year, a
# century ("for ever") and 1 PiB, beyond any gateway's disk.
MAX_SEGMENT_MS = 365 * 86_400_000
MAX_RETENTION_MS = 100 * 365 * 86_400_000
MAX_RETENTION_BYTES = 1 << 50


@record(frozen=True)
class LogConfig:
    durability: str = setting(
        "batch", one_of(*DURABILITY),
        doc="when QoS 1/2 publishes are acknowledged: none, batch or sync (docs/config.md)")
    flush_interval_ms: int = setting(
        100, between(1, 60_000), doc="with durability batch: records are fsynced at most this many ms after the write")
    segment_bytes: int = setting(
        16 * MiB, between(4096, 1024 * MiB), doc="a segment is rolled before it grows past this")
    segment_ms: int = setting(
        600_000, between(1000, MAX_SEGMENT_MS),
        doc="a segment is rolled once its first record is this old (ms)")
    retention_bytes: int = setting(
        1024 * MiB, between(4096, MAX_RETENTION_BYTES),
        doc="the log's size limit; over it the oldest segments go, uploaded or not")
    retention_ms: int = setting(
        604_800_000, between(1000, MAX_RETENTION_MS),
        doc="a segment is deleted once its newest record is this old (ms) and, with uploading, "
            "it was uploaded")


@record(frozen=True)
class Config:
    data_dir: str = setting(
        "", file_path, doc="state directory (default $STATE_DIRECTORY or ./edgebroker-data)")
    log_level: str = setting("info", one_of(*LOG_LEVELS), doc="debug, info, warning or error")
    sys_interval: float = setting(
        10.0, off_or_at_least(0.1),
        doc="seconds between $SYS publications (at least 0.1); 0 turns them off")
    allow_zero_length_clientid: bool = setting(
        True, doc="accept an empty client id (with clean session) and assign one")
    auto_id_prefix: str = setting("auto-", mqtt_text, doc="prefix of assigned client ids")
    shared_subscriptions: bool = setting(
        True, doc="accept shared subscriptions ($share/<name>/<filter>, from 3.1.1 and 5.0 "
                  "clients); false: refused (SUBACK 0x9E, 3.1.1: 0x80), and the 5.0 CONNACK "
                  "says Shared Subscription Available 0")
    sys_client_metrics: bool = setting(
        False, doc="also publish $SYS/broker/clients/<id>/... for every connected client")
    coalesce_ms: float = setting(
        1.0, between(0, 100), doc="how long the loop may hold the log write and the sends of "
                                   "messages from slow publishers to gather more; 0: never")
    busy_poll_us: float = setting(
        200.0, between(0, 10000), doc="microseconds the loop polls without sleeping for the "
                                       "acknowledgements of messages a session catching up "
                                       "from the log was just sent; 0: never")
    allow_anonymous: bool | None = setting(
        None, doc="accept clients without a user name; unset: true unless a password file applies")
    password_file: str = setting(
        "", file_path, doc="file of username:hash lines; clients must log in")
    acl_file: str = setting(
        "", file_path, doc="Mosquitto-format ACL file: which topics each client may use")
    max_login_failures: int = setting(
        10, at_least(1), doc="failed logins in a row for one user name from one address "
                              "before its password checks are delayed (1 s, doubling); ten "
                              "times as many from one address (any user names) within "
                              "login_failure_window and only known passwords pass")
    login_failure_window: float = setting(
        60.0, at_least(0.001),
        doc="seconds: the longest delay, and how long failed logins are remembered")
    refusal_log_interval: float = setting(
        60.0, off_or_at_least(1), doc="after a refused or misbehaving connection is logged, "
                                      "further ones of its kind from its address are only counted "
                                      "for this many seconds (at least 1), then one line gives "
                                      "their number; 0: log each")
    listener: tuple[ListenerConfig, ...] = field(default=(ListenerConfig(),))
    limits: Limits = field(default_factory=Limits)
    log: LogConfig = field(default_factory=LogConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    upload: UploadConfig = field(default_factory=UploadConfig)
    bridge: tuple[BridgeConfig, ...] = field(default=())
    source: str = field(default="", compare=False)

    @property
    def listeners(self) -> tuple[ListenerConfig, ...]:
        return self.listener

    def auth(self, lc: ListenerConfig) -> AuthSettings:
        """Authentication settings of listener ``lc``: its own, else the top level's."""
        password_file = self.password_file if lc.password_file is None else lc.password_file
        acl_file = self.acl_file if lc.acl_file is None else lc.acl_file
        identity = lc.use_identity_as_username
        explicit = lc.allow_anonymous if lc.allow_anonymous is not None else self.allow_anonymous
        if explicit is None:
            anonymous = not password_file and not identity
        else:
            anonymous = explicit
        return AuthSettings(anonymous, password_file, acl_file, identity, explicit is not None)

    def state_dir(self) -> str:
        """The state directory as an absolute path (what the start line and `config check`
        show): a relative one is relative to the working directory, ``/`` under systemd."""
        state = self.data_dir or os.environ.get("STATE_DIRECTORY", "").split(":")[0]
        return os.path.abspath(state or "edgebroker-data")


def _build(cls, table: Any, prefix: str):
    """``cls`` from a TOML table; ConfigError with every problem of the table."""
    if not isinstance(table, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a table, got {table!r}")
    problems: list[str] = []
    values = {}
    for name, raw in table.items():
        try:
            values[name] = _build_value(cls, name, raw, prefix)
        except ConfigError as exc:
            problems += exc.problems
            if exc.partial is not None:
                values[name] = exc.partial
    if problems:
        raise ConfigError(*problems, partial=cls(**values))
    return cls(**values)


def _build_value(cls, name: str, raw: Any, prefix: str) -> Any:
    key = f"{prefix}{name}"
    f = _fields(cls).get(name)
    if f is None:
        raise ConfigError(f"{key}: unknown setting{_did_you_mean(cls, name, prefix)}")
    if cls is Config and name == "listener":
        return _build_listeners(raw)
    if cls is Config and name == "bridge":
        return _build_bridges(raw)
    if name == "topic" and cls is _bridge_config().BridgeConfig:
        return _build_list(_bridge_config().TopicRule, raw, key, "topic rules: a list of tables "
                           "such as {pattern = \"a/#\", direction = \"out\"}")
    if cls is Config and name in _SECTIONS:
        section = _build(_SECTIONS[name], raw, f"{name}.")
        problems = _SECTION_CHECKS[name](section) if name in _SECTION_CHECKS else []
        if problems:
            raise ConfigError(*problems, partial=section)
        return section
    value = coerce(raw, f.type, key)
    check = f.metadata.get("check")
    problem = check(value) if check else None
    if problem:
        shown = repr(raw)
        raise ConfigError(f"{key}: {problem}, got {shown[:200]}{'...' * (len(shown) > 200)}")
    return value


def _fields(cls) -> dict:
    return {f.name: f for f in records.fields(cls) if f.name != "source"}


def _did_you_mean(cls, name: str, prefix: str) -> str:
    """``; did you mean KEY?`` for a key the user likely meant: a close one in the same table,
    else the same or a close one in another table (a key put under the wrong [table])."""
    import difflib   # here: only a config file with an unknown key needs it
    close = difflib.get_close_matches(name, _fields(cls), n=1)
    if close:
        return f"; did you mean {prefix}{close[0]}?"
    # The closest key of any other table; on a tie, the earlier table here: the top-level
    # and its sections before the [[listener]] and [[bridge]] keys that repeat some of them
    # per listener or bridge (a top-level max_conections meant limits.max_connections).
    tables = [("", Config, "a top-level setting: put it above the first [table]")]
    tables += [(f"{n}.", c, f"a setting of the [{n}] table") for n, c in _SECTIONS.items()]
    tables += [("listener.", ListenerConfig, "a setting of a [[listener]] table"),
               ("bridge.", _bridge_config().BridgeConfig, "a setting of a [[bridge]] table")]
    best = None     # (ratio, prefix, key, where)
    for other_prefix, other, where in tables:
        if other is not cls:
            close = difflib.get_close_matches(name, _fields(other), n=1, cutoff=0.8)
            if close:
                ratio = difflib.SequenceMatcher(None, name, close[0]).ratio()
                if best is None or ratio > best[0]:
                    best = (ratio, other_prefix, close[0], where)
    if best is None:
        return ""
    return f"; did you mean {best[1]}{best[2]}? ({best[3]})"


def _log_problems(log: LogConfig) -> list[str]:
    if log.retention_bytes < log.segment_bytes:
        return [f"log.retention_bytes: must be at least log.segment_bytes "
                f"({log.segment_bytes}), got {log.retention_bytes}"]
    return []


class Tables(tuple):
    """The [[listener]] (or [[bridge]], topic rule) tables of a file with errors, in the
    file's order, so that each keeps its index in problems: a table with errors as its correct
    keys make it (the wrong ones at their defaults), its index in ``damaged``. `config check`
    reads the files such a table names, and checks and reports as listeners only the others
    (``undamaged``): the defaults it holds are not in the file."""
    damaged: frozenset = frozenset()


def _tables(items: list, damaged: list[int]) -> Tables:
    tables = Tables(items)
    tables.damaged = frozenset(damaged)
    return tables


def undamaged(tables: tuple) -> tuple:
    """``tables`` without those with errors (Tables.damaged)."""
    damaged = getattr(tables, "damaged", ())
    return tuple(t for i, t in enumerate(tables) if i not in damaged)


def _build_listeners(raw: Any) -> tuple[ListenerConfig, ...]:
    if not isinstance(raw, list) or not raw:   # (partial: no listener, not the default one)
        raise ConfigError("listener: expected one or more [[listener]] tables", partial=())
    problems: list[str] = []
    listeners = []
    damaged = []
    for i, item in enumerate(raw):
        try:
            lst = _build(ListenerConfig, item, f"listener[{i}].")
        except ConfigError as exc:
            problems += exc.problems
            listeners.append(ListenerConfig() if exc.partial is None else exc.partial)
            damaged.append(i)
            continue
        problems += listener_problems(lst, item, f"listener[{i}]")
        listeners.append(lst)
    if problems:
        raise ConfigError(*problems, partial=_tables(listeners, damaged))
    return tuple(listeners)


def _build_list(cls, raw: Any, key: str, expected: str) -> tuple:
    """A list of tables (``key[i].setting``), every problem of every table at once."""
    if not isinstance(raw, list):
        raise ConfigError(f"{key}: expected {expected}", partial=())
    problems: list[str] = []
    items = []
    damaged = []
    for i, item in enumerate(raw):
        try:
            items.append(_build(cls, item, f"{key}[{i}]."))
        except ConfigError as exc:
            problems += exc.problems
            items.append(cls() if exc.partial is None else exc.partial)
            damaged.append(i)
    if problems:
        raise ConfigError(*problems, partial=_tables(items, damaged))
    return tuple(items)


def _bridge_config():
    """edgebroker.bridge_config, imported for a file with [[bridge]] tables (and for the lists
    of every setting): a broker without bridges does not load it (docs/deploy.md, idle RSS)."""
    from edgebroker import bridge_config
    return bridge_config


def _build_bridges(raw: Any) -> tuple[BridgeConfig, ...]:
    bridge_config = _bridge_config()
    problems: list[str] = []
    try:
        bridges = _build_list(bridge_config.BridgeConfig, raw, "bridge",
                              "one or more [[bridge]] tables")
    except ConfigError as exc:
        if not exc.partial:        # (not a list of tables)
            raise
        bridges, problems = exc.partial, list(exc.problems)
    problems += bridge_config.all_bridge_problems(bridges, raw, problems)
    if problems:
        raise ConfigError(*problems, partial=bridges)
    return bridges


def _metrics_problems(metrics: MetricsConfig) -> list[str]:
    if metrics.listen:
        try:
            parse_address(metrics.listen)
        except ConfigError:
            return [f"metrics.listen: expected HOST:PORT, got {metrics.listen!r}"]
    return []


# The sections of Config, and the rules between the keys of one.
_SECTIONS = {"limits": Limits, "log": LogConfig, "metrics": MetricsConfig, "upload": UploadConfig}
_SECTION_CHECKS = {"log": _log_problems, "metrics": _metrics_problems}


def check_authentication(config: Config) -> None:
    """Safe defaults: no listener reachable from the network without authentication.

    A listener on a non-loopback address starts only with allow_anonymous = true
    set explicitly, a password file, or client-certificate identities; and a
    listener must let some client in.
    """
    problems = []
    for lc in config.listeners:
        auth = config.auth(lc)
        if auth.password_file or auth.identity_as_username:
            continue
        if not auth.allow_anonymous:
            problems.append(
                f"listener {lc.address}: allow_anonymous is false and there is no password_file "
                f"or use_identity_as_username, so no client could connect")
        elif not auth.explicit_anonymous and not lc.is_local():
            problems.append(
                f"listener {lc.address} is reachable from the network and has no "
                f"authentication: set password_file (clients log in) or allow_anonymous = true "
                f"(anyone may connect), at the top level or in its [[listener]] table")
    if problems:
        raise ConfigError(*problems)


def check_addresses(config: Config) -> None:
    """Listeners and the metrics endpoint that could not all listen (listener_config)."""
    problems = address_problems(config.listeners, config.metrics.listen,
                                os.path.join(config.state_dir(), ADMIN_SOCKET))
    if problems:
        raise ConfigError(*problems, partial=config)


def from_dict(table: dict, source: str = "") -> Config:
    try:
        config = _build(Config, table, "")
    except ConfigError as exc:
        partial = exc.partial
        more = [] if partial is None else _address_problems(partial)
        raise ConfigError(*exc.problems, *more, partial=partial) from None
    check_addresses(config)
    return records.replace(config, source=source)


def _address_problems(partial: Config) -> list[str]:
    """address_problems of the listeners without errors, each named by its index in the file."""
    import re   # here: only a file with errors needs it
    index = [i for i in range(len(partial.listener))
             if i not in getattr(partial.listener, "damaged", ())]
    return [re.sub(r"listener\[(\d+)\]", lambda m: f"listener[{index[int(m[1])]}]", p)
            for p in address_problems(undamaged(partial.listener), partial.metrics.listen)]


def load(path: str | None, apart: bool = False) -> Config:
    """Read and validate a config file; ``None`` gives the embedded defaults. ``apart``: the
    file is parsed in a child process before the broker starts (toml_file, serve's)."""
    if path is None:
        return Config()
    from edgebroker.toml_file import read_toml
    return from_table(read_toml(path, apart), path)


def from_table(table: dict, path: str) -> Config:
    """``load`` of the TOML table of the file at ``path``: its problems each name the file."""
    try:
        return from_dict(table, source=path)
    except ConfigError as exc:
        partial = exc.partial and records.replace(exc.partial, source=path)
        raise ConfigError(*(f"{path}: {problem}" for problem in exc.problems),
                          partial=partial) from None


def exposed_secrets(config: Config) -> list[str]:
    """A line per warning on the configuration file's permissions: users other than root and
    the broker's can change it (and with it who may connect), or it holds a secret (a bridge's
    password, the uploader's secret key or session token) other users may read. The file is
    still used; the packages install it root's, 0644, with no secret in it."""
    try:
        st = os.stat(config.source) if config.source else None
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        return []
    mode, where = stat.filemode(st.st_mode), config.source
    warnings = [f"{where}: other users can change it (permissions {mode}): run chmod go-w "
                f"{where}"] if st.st_mode & 0o022 else []
    owner = owner_problem(where, st.st_uid)
    warnings += [f"{where}: {owner}"] if owner else []
    keys = [f"bridge[{i}].password" for i, b in enumerate(config.bridge) if b.password]
    keys += [f"upload.{key}" for key in ("secret_access_key", "session_token")
             if getattr(config.upload, key)]
    if keys and st.st_mode & 0o004:
        uploader = any(key.startswith("upload.") for key in keys)   # (a bridge's cannot be)
        warnings.append(
            f"{where}: other users can read it (permissions {mode}) and it holds "
            f"{', '.join(keys)}: run chmod o-r {where} (the broker's user must still read it)"
            + (", or give the uploader's keys through the environment" if uploader else ""))
    return warnings


def describe() -> list[tuple[str, Any, str]]:
    """(key, default, meaning) for every setting, for docs and `config check`."""
    rows = []
    bridge_config = _bridge_config()
    for prefix, cls in (("", Config), ("listener.", ListenerConfig), ("limits.", Limits),
                        ("log.", LogConfig), ("metrics.", MetricsConfig),
                        ("upload.", UploadConfig), ("bridge.", bridge_config.BridgeConfig),
                        ("bridge.topic.", bridge_config.TopicRule)):
        for f in records.fields(cls):
            if "doc" in f.metadata:
                rows.append((prefix + f.name, f.default, f.metadata["doc"]))
    return rows
