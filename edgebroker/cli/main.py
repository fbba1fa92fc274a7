"""`edgebroker` command line: one small module per command.

Every command is a plain function taking parsed arguments and returning an
exit code; this module only parses and turns the project's errors into clear
lines on stderr (exit 2 for configuration errors, one line per problem; 1 for
the rest, one line).

Exit codes of every command: 0 done, 1 an error, 2 a configuration or usage error, 130
interrupted (SIGINT or SIGTERM; ``tail --follow`` and ``clients --watch`` end with 0, being
meant to run until stopped), 141 (128 + SIGPIPE, what a shell shows for a Unix tool that
wrote to a closed pipe) when the reader of stdout or stderr went away (``| head``): quietly,
without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys

from edgebroker import __version__
from edgebroker.errors import ConfigError, EdgebrokerError
from edgebroker.cli.options import CommandParser, HelpFormatter, UsageError

# The commands and their modules (edgebroker.cli.<module>), in the order of the help. Only the
# chosen command's module is imported: `serve` does not carry the others' imports (json,
# getpass, the inspect and upload code) through its life (idle memory: docs/deploy.md).
COMMANDS = {
    "serve": "serve",
    "config": "config_check",
    "inspect": "inspect",        # offline log commands and the live ones (inspect_live)
    "passwd": "passwd",
    "upload": "upload",
    "pub": "pub",                # an MQTT client: mosquitto_pub's options
    "sub": "sub",                # an MQTT client: mosquitto_sub's options
}

CLOSED_PIPE = 141   # 128 + SIGPIPE


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


class ArgumentParser(argparse.ArgumentParser):
    """The top-level parser, with HelpFormatter (the command parsers are CommandParser, which
    has it too)."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=CommandParser)
    chosen = None if argv is None else chosen_command(argv)
    for name, module in COMMANDS.items():
        if chosen in (None, name):
            importlib.import_module(f"edgebroker.cli.{module}").add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            if sys.stdout is not None:      # None: fd 1 closed at start (``>&-``)
                sys.stdout.flush()   # a reader gone shows here, not as a traceback at exit
    except BrokenPipeError:
        if not _quiet_closed_pipes():
            raise
        return CLOSED_PIPE


def _run(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # (inside: --version loads the native helper, which a wrong EDGEBROKER_NATIVE refuses)
        had_locale = "locale" in sys.modules
        args = build_parser(argv).parse_args(argv)
        if not had_locale:  # imported by argparse's messages (gettext) when $LANG is set:
            sys.modules.pop("locale", None)     # its tables, 0.1 MiB of an idle broker's
        if args.command != "serve":   # serve has its own SIGTERM handling (server/app.py)
            signal.signal(signal.SIGTERM, _interrupt)
            raise_open_files_limit()
        return args.run(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{_error_prefix()}edgebroker: config error: {problem}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"{_error_prefix()}edgebroker: {exc}", file=sys.stderr)
        return 2
    except EdgebrokerError as exc:
        print(f"{_error_prefix()}edgebroker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _error_prefix() -> str:
    """``<3>`` (priority "err") when stderr is systemd's journal (logs.py), else nothing."""
    from edgebroker.logs import priority_prefix
    return priority_prefix("ERROR")


def raise_open_files_limit() -> None:
    """Raise the open files soft limit (RLIMIT_NOFILE) to the hard one: a read of the log
    holds two descriptors per segment (``inspect``, ``upload status``; ``upload once``, the
    writer, three), and a shell's soft limit is often 1024 where the hard one is 4096 or more.
    Left as it is when that cannot be done."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and soft != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _interrupt(signum, frame):
    """SIGTERM ends a command as Ctrl-C does, also where SIGINT is ignored (a background job
    of a script, some CI runners): ``tail --follow`` and ``clients --watch`` end with 0."""
    raise KeyboardInterrupt


def _quiet_closed_pipes() -> bool:
    """Whether stdout or stderr is a pipe or socket whose reader has gone (``| head``); each
    such one is pointed at /dev/null, so that nothing more (a traceback at exit) is written."""
    closed = False
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, 0)
    for fd, events in poller.poll(0):
        if events & (select.POLLERR | select.POLLHUP):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
            closed = True
    return closed
