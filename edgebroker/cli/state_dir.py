"""The state directory a command finds as ``serve`` would: ``--data-dir``, else the
configuration's ``data_dir``, else $STATE_DIRECTORY (systemd sets it for the unit's commands:
/var/lib/edgebroker), else ./edgebroker-data. That last one is the state directory of a run
outside systemd: a command run in a shell on the service's file (``-c
/etc/edgebroker/edgebroker.toml``, which leaves data_dir unset) finds it, not the unit's, and
says so rather than reporting a state directory that is not the service's."""

from __future__ import annotations

import json
import os
import sys

from edgebroker import config as configuration
from edgebroker.errors import ConfigError, EdgebrokerError

# systemd/edgebroker.service: StateDirectory=edgebroker.
UNIT_STATE_DIR = "/var/lib/edgebroker"


def outside_systemd(config: configuration.Config) -> bool:
    """Whether ``config.state_dir()`` is the one of a run outside systemd: no data_dir and
    no $STATE_DIRECTORY."""
    return not config.data_dir and not os.environ.get("STATE_DIRECTORY", "")


def note(state_dir: str, then: str) -> str:
    """What to say with ``state_dir`` when it is the one outside systemd; ``then``: how the
    command reaches the unit's."""
    return (f"{state_dir} is the state directory outside systemd (no data_dir, no "
            f"$STATE_DIRECTORY); under systemd/edgebroker.service it is {UNIT_STATE_DIR}: "
            f"{then}")


def state_dir_of(args, config: configuration.Config | None = None) -> str:
    """``args.data_dir``, else the state directory of ``config`` (default: that of ``-c
    FILE``, or of the built-in defaults). The one outside systemd must exist: a command about
    a state directory that is not there says where the service's is (EdgebrokerError)."""
    if args.data_dir:
        return args.data_dir
    if config is None:
        config = read_config(args.config)
    path = config.state_dir()
    if outside_systemd(config) and not os.path.isdir(path):
        raise EdgebrokerError("no state directory: "
                              + note(path, f"give --data-dir {UNIT_STATE_DIR}"))
    return path


_noted: set = set()     # files read_config said have problems (once a command)


def read_config(path: str | None, keys: tuple[str, ...] = ("data_dir",)) -> configuration.Config:
    """The configuration of ``path`` (None: the defaults) for a read-only command that takes
    only ``keys`` from it (``data_dir`` to find the state directory; a dotted key is one of a
    table): a file that is TOML with problems elsewhere (an unknown key, a value a reload
    refused) still gives them, with a note on stderr saying what was taken; a problem with one
    of ``keys``, or a file that is not TOML, is the ConfigError. So are the file's problems
    when one of ``keys`` is not set where it belongs and the file has an unknown key or a
    table that is not one: that could be the key, misplaced or misspelled (``[log]
    data_dir``, ``data-dir``), and the default in its place another broker's directory."""
    if path is None:
        return configuration.Config()
    from edgebroker.toml_file import read_toml    # (read once: -c may be a pipe)
    table = read_toml(path)
    try:
        return configuration.from_table(table, path)
    except ConfigError as exc:
        if exc.partial is None or not isinstance(exc.partial, configuration.Config):
            raise
        mine = [p for p in exc.problems if any(p.startswith(f"{path}: {key}:") for key in keys)]
        if mine:
            raise ConfigError(*mine) from None
        taken = []
        for key in keys:
            value = _setting(table, key)
            if value is None and (_could_hide(exc.problems, path, key)
                                  or _anywhere(table, key.rsplit(".", 1)[-1])):
                raise
            taken.append(f"{key} unset" if value is None else
                         f"{key} = {json.dumps(value)}")
        if path not in _noted:
            _noted.add(path)
            print(f"edgebroker: note: {path} has {len(exc.problems)} problem(s) "
                  f"(`edgebroker config check -c {path}` names them); taken from it: "
                  f"{', '.join(taken)}", file=sys.stderr)
        return exc.partial


def _setting(table: dict, key: str):
    """The value of the dotted ``key`` in the file's ``table``, or None when not there."""
    *tables, name = key.split(".")
    for part in tables:
        table = table.get(part)
        if not isinstance(table, dict):
            return None
    return table.get(name)


def _anywhere(table, name: str) -> bool:
    """Whether a key spelled ``name`` (``-`` for ``_``, any case) is anywhere in the file's
    ``table``: under a table the file has wrong (``[listener]`` for ``[[listener]]``, whose
    keys are never checked one by one), it is the setting in the wrong place."""
    want = name.replace("-", "_").lower()
    if isinstance(table, dict):
        return any(str(k).replace("-", "_").lower() == want or _anywhere(v, name)
                   for k, v in table.items())
    if isinstance(table, list):
        return any(_anywhere(v, name) for v in table)
    return False


def _could_hide(problems: tuple[str, ...] | list[str], path: str, key: str) -> bool:
    """Whether one of the file's ``problems`` could be ``key`` itself, written in another
    table or spelled otherwise: an unknown setting (any: ``state_dir`` is not a spelling of
    data_dir a guess would find), or a table of ``key`` that is not one (``limits = 5``)."""
    enclosing = [f"{path}: {key.rsplit('.', 1)[0]}:"] if "." in key else []
    return any(": unknown setting" in p or any(p.startswith(e) for e in enclosing)
               for p in problems)


# Said with a state directory the service may not write, under systemd (docs/deploy.md).
SYSTEMD_HINT = ("under systemd/edgebroker.service, ProtectSystem=strict leaves every directory "
                "but the unit's own read-only: add ReadWritePaths={path} in a drop-in "
                "(`systemctl edit edgebroker`), and give the directory to the service's user "
                "(`useradd --system edgebroker`, then `chown edgebroker:edgebroker {path}`): "
                "docs/deploy.md")
# The same for a directory not there yet: a ReadWritePaths= naming a missing path stops the
# unit's start (status 226/NAMESPACE), and a chown of it fails.
SYSTEMD_HINT_MISSING = ("under systemd/edgebroker.service the service cannot make it "
                        "(ProtectSystem=strict): as root, `useradd --system edgebroker`, "
                        "`install -d -o edgebroker -g edgebroker -m 0750 {path}`, then add "
                        "ReadWritePaths={path} in a drop-in (`systemctl edit edgebroker`): "
                        "docs/deploy.md")


def under_systemd() -> bool:
    """Whether this process is one of a systemd unit's ($INVOCATION_ID, $STATE_DIRECTORY)."""
    return bool(os.environ.get("INVOCATION_ID") or os.environ.get("STATE_DIRECTORY"))


def with_hint(path: str, why: str) -> str:
    """``why`` a state directory at ``path`` cannot be made or written, with the way out
    under systemd (only there: a shell's permission problem is plain)."""
    if not under_systemd():
        return why
    hint = SYSTEMD_HINT if os.path.lexists(path) else SYSTEMD_HINT_MISSING
    return f"{why} ({hint.format(path=path)})"


def unwritable(path: str) -> str | None:
    """Why the directory ``path`` cannot be written (the data_dir problem), or None when it
    can. ``os.access`` says only whether: a read-only mount (the unit's ProtectSystem=strict)
    is told from permissions by the mount's flag, without writing anything (a full disk must
    not stop a start)."""
    if os.access(path, os.W_OK):
        return None
    try:
        readonly = os.statvfs(path).f_flag & os.ST_RDONLY
    except OSError:
        readonly = False
    if readonly:
        why = "read-only file system"
    else:
        st = os.stat(path)
        why = (f"permission denied (owner uid {st.st_uid}, mode {st.st_mode & 0o7777:04o}; "
               f"this process runs as uid {os.geteuid()})")
    return with_hint(path, f"data_dir: {path} is not writable: {why}")
