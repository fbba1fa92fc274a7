"""`edgebroker` command line: one small module per command.

Every command is a plain function taking parsed arguments and returning an
exit code; this module only parses and turns the project's errors into one
clear line on stderr (exit 2 for configuration errors, 1 for the rest).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from edgebroker import __version__
from edgebroker.errors import ConfigError, EdgebrokerError

# The commands and their modules (edgebroker.cli.<module>), in the order of the help. Only the
# chosen command's module is imported: `serve` does not carry the others' imports (json,
# getpass, the inspect and upload code) through its life (idle memory: docs/deploy.md).
COMMANDS = {
    "serve": "serve",
    "config": "config_check",
    "inspect": "inspect",        # offline log commands and the live ones (inspect_live)
    "passwd": "passwd",
    "upload": "upload",
}


def version_line() -> str:
    """``edgebroker 0.1.0 (native backend: c, CRC32C: sse4.2; frozen binary)``."""
    from edgebroker import _native
    backend = f"native backend: {_native.BACKEND}"
    if _native.BACKEND == "c":
        backend += f", CRC32C: {_native.CRC_METHOD}"
    elif _native.FALLBACK_REASON:
        backend += f" ({_native.FALLBACK_REASON})"
    build = "frozen binary" if getattr(sys, "frozen", False) else f"Python {sys.version.split()[0]}"
    return f"edgebroker {__version__} ({backend}; {build})"


class VersionAction(argparse.Action):
    """--version: loads the native helper only when asked, to name the backend it runs."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, given the terminal's width as shutil.get_terminal_size finds it ($COLUMNS,
    else standard output's terminal, else 80 columns): left to itself, argparse imports shutil
    (and with it bz2 and lzma, 0.7 MiB the broker would keep) for every parser it builds."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        if width is None:
            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


class ArgumentParser(argparse.ArgumentParser):
    """With HelpFormatter; the command parsers (add_subparsers) are of this class too."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def terminal_columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def chosen_command(argv: list[str]) -> str | None:
    """The command named by ``argv`` (its first word that is not an option), or None."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def build_parser(argv: list[str] | None = None) -> ArgumentParser:
    """The parser of every command, or with ``argv`` naming one, of that command only (the
    top-level help, a missing or an unknown command: every command)."""
    parser = ArgumentParser(
        prog="edgebroker", description="MQTT broker for edge gateways with a durable commit log.")
    parser.add_argument("--version", action=VersionAction, nargs=0,
                        help="print the version and the native backend in use, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = None if argv is None else chosen_command(argv)
    for name, module in COMMANDS.items():
        if chosen in (None, name):
            importlib.import_module(f"edgebroker.cli.{module}").add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
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
