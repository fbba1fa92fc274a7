"""`edgebroker config check`: validate a configuration file and say so."""

from __future__ import annotations

from edgebroker import config as configuration


def add_parser(commands) -> None:
    p = commands.add_parser("config", help="configuration tools")
    sub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="validate a configuration file")
    check.add_argument("-c", "--config", metavar="FILE", required=True)
    check.set_defaults(run=run)


def run(args) -> int:
    config = configuration.load(args.config)
    listeners = ", ".join(lc.address for lc in config.listeners)
    print(f"{args.config}: OK (listeners: {listeners}; state directory: {config.state_dir()})")
    return 0
