"""What the commands' parsers share: the ``--format`` option, and usage errors that show the
usage of the command at fault rather than the top level's."""

from __future__ import annotations

import argparse
import os
import sys

from edgebroker.errors import EdgebrokerError


class UsageError(EdgebrokerError):
    """An option's value or the arguments given are wrong, found after parsing (a topic
    filter, a time, a missing argument): one line, exit 2 as argparse's usage errors."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, given the terminal's width as shutil.get_terminal_size finds it ($COLUMNS,
    else standard output's terminal, else 80 columns): left to itself, argparse imports shutil
    (and with it bz2 and lzma, 0.7 MiB the broker would keep) for every parser it builds."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        if width is None:
            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


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


class CommandParser(argparse.ArgumentParser):
    """The parser of a command (``inspect``, ``inspect stats``, ...). An argument it does not
    know is its own usage error: argparse would hand it up to the top-level parser, whose
    usage (``edgebroker [-h] [--version] COMMAND ...``) says nothing about the command.
    Its help is laid out by HelpFormatter (no shutil)."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error("unrecognized arguments: " + " ".join(extras))
        return namespace, extras


def add_format(parser: argparse.ArgumentParser) -> None:
    """``--format text|json``, the one output option of every command that prints a report
    (``--json`` is kept, unlisted, as another name for ``--format json``)."""
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text for people (default) or json for scripts")
    parser.add_argument("--json", dest="format", action="store_const", const="json",
                        help=argparse.SUPPRESS)


# The longest wait an option may ask for: the event loops wait in milliseconds that must fit
# in a C int (24.8 days), and time.sleep in nanoseconds of 64 bits.
MAX_SECONDS = 1_000_000


def seconds(text: str) -> float:
    """An argparse ``type``: a number of seconds above 0 and at most MAX_SECONDS (nan and inf
    are usage errors, as a wait too long for the calls that make it)."""
    value = _seconds(text)
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text}: must be above 0 and at most {MAX_SECONDS} "
                                         f"seconds")
    return value


def delay(text: str) -> float:
    """An argparse ``type``: a number of seconds of 0 to MAX_SECONDS."""
    value = _seconds(text)
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 to {MAX_SECONDS} seconds")
    return value


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None


def count(text: str, least: int = 0) -> int:
    """An argparse ``type``: an integer of ``least`` (0) or more (less is a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text}: must be {least} or more")
    return value


def positive(text: str) -> int:
    """An argparse ``type``: an integer of 1 or more (``sub -C``, ``pub --repeat``: 0 is a
    usage error, as with mosquitto's clients)."""
    return count(text, 1)
