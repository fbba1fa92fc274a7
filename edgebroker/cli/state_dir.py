"""The state directory a command finds as ``serve`` would: ``--data-dir``, else the
configuration's ``data_dir``, else $STATE_DIRECTORY (systemd sets it for the unit's commands:
/var/lib/edgebroker), else ./edgebroker-data. That last one is the state directory of a run
outside systemd: a command run in a shell on the service's file (``-c
/etc/edgebroker/edgebroker.toml``, which leaves data_dir unset) finds it, not the unit's, and
says so rather than reporting a state directory that is not the service's."""

from __future__ import annotations

import os

from edgebroker import config as configuration
from edgebroker.errors import EdgebrokerError

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
        config = configuration.load(args.config) if args.config else configuration.Config()
    path = config.state_dir()
    if outside_systemd(config) and not os.path.isdir(path):
        raise EdgebrokerError("no state directory: "
                              + note(path, f"give --data-dir {UNIT_STATE_DIR}"))
    return path

