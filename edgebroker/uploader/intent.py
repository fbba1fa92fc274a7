"""The intent file, ``<state dir>/upload/intent``: the range of the batch being uploaded,
written (fsynced) before its batch file, so that after a crash the batch is cut again from the
same range, under the same name with the same bytes (uploader.py)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from edgebroker.files import read_small_file

log = logging.getLogger("edgebroker.upload")

INTENT_FILE = "intent"


@dataclass(slots=True)
class Intent:
    first: int
    last: int
    gap_first: int
    gap_length: int
    key: str

    def encode(self) -> bytes:
        return json.dumps({"first": self.first, "last": self.last, "gap_first": self.gap_first,
                           "gap_length": self.gap_length, "key": self.key}).encode() + b"\n"


def read_intent(upload_dir: str) -> Intent | None:
    """The intent file's batch (None when there is none or it cannot be read: logged)."""
    path = os.path.join(upload_dir, INTENT_FILE)
    try:
        d = json.loads(read_small_file(path))      # a FIFO there: unreadable, no wait
        if type(d) is not dict:
            raise ValueError(f"a JSON {type(d).__name__}, not an object")
        key = d["key"]
        if type(key) is not str:
            raise ValueError(f"key {str(key)[:40]!r} is not a string")
        return Intent(_offset(d, "first"), _offset(d, "last"), _offset(d, "gap_first"),
                      _offset(d, "gap_length"), key)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        log.warning("%s: unreadable (%s); the next batch is cut afresh", path, exc)
        return None


def _offset(d: dict, name: str) -> int:
    """``d[name]``: a log offset or count, a whole number from 0 to 2^63 - 1 (1e400, Infinity,
    3.5, true and text are refused with ValueError naming the field; int() took 3.5 and true,
    and raised OverflowError for 1e400)."""
    value = d[name]
    if type(value) is not int or not 0 <= value < 1 << 63:
        raise ValueError(f"{name} {str(value)[:40]!r} is not a whole number from 0 to 2^63 - 1")
    return value


__all__ = ["Intent", "read_intent", "INTENT_FILE"]
