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
        return Intent(int(d["first"]), int(d["last"]), int(d["gap_first"]), int(d["gap_length"]),
                      str(d["key"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        log.warning("%s: unreadable (%s); the next batch is cut afresh", path, exc)
        return None


__all__ = ["Intent", "read_intent", "INTENT_FILE"]
