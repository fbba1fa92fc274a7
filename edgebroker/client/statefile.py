"""The client's state file: ``Connection.save()``'s JSON, written so that a crash leaves the
old file or the new one, never a mixture (a temporary file in the same directory, fsync,
rename, fsync of the directory). Format: docs/client.md "The state file"."""

from __future__ import annotations

import json
import os


def write_state(path, doc: dict) -> None:
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp"
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_state(path) -> dict | None:
    """The state in ``path``, or None when there is no file. ValueError names the file when
    it is not JSON."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"client state file {os.fspath(path)}: not JSON ({exc})") from None
