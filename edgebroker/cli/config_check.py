"""`edgebroker config check`: validate a configuration file and say so.

Besides the keys, it applies the safe-default rules for listeners, checks that serve
could create or write the state directory (creating nothing), and reads every certificate,
password and ACL file the configuration names, and that each Unix socket's path fits, its
directory exists and no file other than a socket is in its way. The state directory is the
one serve run here would use: without data_dir and $STATE_DIRECTORY, the one outside
systemd, which a note says. It reports
every problem at once, one line each naming the file, the key and what is
wrong (an unknown key with the one it likely meant). Without ``-c`` it checks
what ``serve`` without ``-c`` runs: the built-in defaults.
"""

from __future__ import annotations

import json
import sys

from edgebroker import config as configuration
from edgebroker.cli.options import add_format
from edgebroker.cli.serve import problems_of
from edgebroker.cli.state_dir import UNIT_STATE_DIR, note, outside_systemd
from edgebroker.cli.state_owner import foreign_warning
from edgebroker.errors import ConfigError
from edgebroker.logs import priority_prefix
from edgebroker.server.tls_dates import certificate_date_warnings

DEFAULTS = "built-in defaults"


def add_parser(commands) -> None:
    p = commands.add_parser("config", help="configuration tools")
    sub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check", help="validate a configuration file (every problem at once)",
        description="Check a configuration file as serve reads it: keys, values, listeners, "
                    "and the certificate, password and ACL files it names.")
    check.add_argument("-c", "--config", metavar="FILE",
                       help="the file to check (default: none, as serve: the built-in defaults)")
    add_format(check)
    check.set_defaults(run=run)
    from edgebroker.cli import config_reload
    config_reload.add_parser(sub)


def run(args) -> int:
    where = args.config or DEFAULTS
    try:
        config = configuration.load(args.config)
        problems = []
    except ConfigError as exc:
        # Each names the file already; the files the valid keys name are checked still.
        config, problems = exc.partial, exc.problems
    if config is not None:
        problems += [f"{where}: {p}" for p in problems_of(config)]
    # (said of a file serve would run with: a broken one's problems come first)
    warnings = []       # (one line, one string in --format json, each)
    foreign = config is not None and foreign_warning(config.state_dir())
    if foreign:
        warnings.append(foreign)
    if config is not None and not problems:
        warnings += configuration.exposed_secrets(config)
        warnings += certificate_date_warnings(config.listeners, bridges=config.bridge)
    if config is not None and not problems and config.bridge:
        from edgebroker.bridge_config import bridge_warnings
        warnings += bridge_warnings(config.bridge)
    if args.format == "json":
        print(json.dumps({
            "file": args.config, "ok": not problems, "problems": problems,
            "warnings": warnings,
            "listeners": [] if config is None else [
                _listener(lc) for lc in configuration.undamaged(config.listener)],
            "state_dir": None if config is None else config.state_dir(),
            "state_dir_outside_systemd": config is not None and outside_systemd(config)},
            indent=2))
        return 2 if problems else 0
    prefix = priority_prefix("WARNING")   # "<4>" when stderr is the journal (ExecReload)
    for warning in warnings:    # (the file is still usable: exit 0 when nothing else is wrong)
        print(f"{prefix}warning: {warning}", file=sys.stderr)
    if problems:
        raise ConfigError(*problems)
    listeners = ", ".join(_listener(lc) for lc in config.listeners)
    print(f"{where}: OK (listeners: {listeners}; state directory: {config.state_dir()})")
    if outside_systemd(config):
        command = "edgebroker config check" + (f" -c {args.config}" if args.config else "")
        print("note: " + note(config.state_dir(), f"`STATE_DIRECTORY={UNIT_STATE_DIR} "
                                                   f"{command}` checks that one"))
    return 0


def _listener(lc: configuration.ListenerConfig) -> str:
    return (lc.address + (" (TLS)" if lc.tls else "")
            + (f" (WebSockets {lc.websocket_path})" if lc.protocol == "websockets" else ""))
