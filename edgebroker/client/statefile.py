"""The client's state file: ``Connection.save()``'s JSON, written so that a crash leaves the
old file or the new one, never a mixture (a temporary file in the same directory, fsync,
rename, fsync of the directory). Format: docs/client.md "The state file"."""

from __future__ import annotations

import json
import os

from edgebroker.files import replace_file


def write_state(path, doc: dict) -> None:
    replace_file(os.fspath(path), json.dumps(doc, separators=(",", ":")).encode("utf-8"))


def read_state(path) -> dict | None:
    """The state in ``path``, or None when there is no file. ValueError names the file when
    it is not a JSON object."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:     # (nested too deep to parse)
        raise ValueError(f"client state file {os.fspath(path)}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"client state file {os.fspath(path)}: not a JSON object "
                         f"({type(doc).__name__})")
    return doc
