"""What the commands' parsers share: the ``--format`` option, and usage errors that show the
usage of the command at fault rather than the top level's."""

from __future__ import annotations

import argparse


class CommandParser(argparse.ArgumentParser):
    """The parser of a command (``inspect``, ``inspect stats``, ...). An argument it does not
    know is its own usage error: argparse would hand it up to the top-level parser, whose
    usage (``edgebroker [-h] [--version] COMMAND ...``) says nothing about the command."""

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
