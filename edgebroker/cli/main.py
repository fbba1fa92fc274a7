"""`edgebroker` command line: one small module per command.

Every command is a plain function taking parsed arguments and returning an
exit code; this module only parses and turns the project's errors into one
clear line on stderr (exit 2 for configuration errors, 1 for the rest).
"""

from __future__ import annotations

import argparse
import sys

from edgebroker import __version__
from edgebroker.errors import ConfigError, EdgebrokerError
from edgebroker.cli import config_check, inspect, passwd, serve, upload


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgebroker", description="MQTT broker for edge gateways with a durable commit log.")
    parser.add_argument("--version", action="version", version=f"edgebroker {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve.add_parser(commands)
    config_check.add_parser(commands)
    inspect.add_parser(commands)   # offline log commands and the live ones (inspect_live)
    passwd.add_parser(commands)
    upload.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"edgebroker: config error: {exc}", file=sys.stderr)
        return 2
    except EdgebrokerError as exc:
        print(f"edgebroker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
