"""What ``inspect verify`` says of the session snapshot next to the log (docs/log-format.md).

``snapshot_ahead``: a snapshot taken past the log's end (records it counted on are gone from
the end). ``snapshot_damage``: a snapshot or retained-payload side file the broker's next
start would call damaged, and what that start would give up for it (docs/persistence.md).
Both read only; nothing is moved aside here.
"""

from __future__ import annotations

import os

from edgebroker.core import retained_side, snapshot
from edgebroker.files import open_regular

# Reads of the document and its side file while a broker replaces them (one snapshot a
# second at most): a side file gone between the two reads is read again with the new pair.
_TRIES = 3


def snapshot_ahead(state_dir: str, held: bool, log_end: int) -> tuple[str, int] | None:
    """(path, offset) of the session snapshot when it was taken past ``log_end``: records it
    counted on are gone from the end of the log (docs/persistence.md). Not asked while a
    broker holds the log (``held``): its snapshot may count records it has not written yet."""
    if held:
        return None
    try:
        state = snapshot.read(state_dir, payloads=False)
    except snapshot.SnapshotError:
        return None     # (snapshot_damage names it)
    if state is None or state.log_next_offset <= log_end:
        return None
    return os.path.join(state_dir, snapshot.FILENAME), state.log_next_offset


def snapshot_damage(state_dir: str) -> dict | None:
    """The damage the broker's start would find in the snapshot of ``state_dir``, None for
    none (or no snapshot): {"file", "problem", "loses", "unreadable"}; ``loses`` is
    "retained" (a side file: its retained messages, the sessions kept) or "sessions" (the
    document: sessions and retained messages). A file this user may not read is no damage
    (``unreadable`` True: not checked)."""
    document = os.path.join(state_dir, snapshot.FILENAME)
    last = None
    for _ in range(_TRIES):
        try:
            state = snapshot.read(state_dir, payloads=False)
        except snapshot.SnapshotError as exc:
            return _found(str(exc), document, "sessions")
        if state is None or state.retained_file is None:
            return None
        try:
            retained_side.verify(state_dir, state.retained_file, state.retained, document)
            return None
        except snapshot.SnapshotError as exc:
            if exc.retained_file is None:    # a place past the side file's end
                return _found(str(exc), document, "sessions")
            found = _found(str(exc), exc.retained_file, "retained", len(state.retained))
        if state.retained_file == last:
            break
        last = state.retained_file           # perhaps replaced meanwhile: read the pair again
    return found


def _found(problem: str, file: str, loses: str, retained: int = 0) -> dict:
    return {"file": file, "problem": problem, "loses": loses, "retained": retained,
            "unreadable": _unreadable(file)}


def _unreadable(path: str) -> bool:
    """This user may not read ``path``: the broker's user may (not damage; its start refuses
    a file it may not read, core.snapshot_damage)."""
    try:
        os.close(open_regular(path, os.O_RDONLY))
    except PermissionError:
        return True
    except OSError:
        pass
    return False


def describe(damage: dict) -> str:
    """The ``inspect verify`` line for ``damage``."""
    if damage["unreadable"]:
        return f"note   {damage['problem']} (not checked)"
    if damage["loses"] == "retained":
        then = (f"moves it aside and starts without the {damage['retained']} retained "
                f"messages the snapshot holds (its sessions are restored)")
    else:
        then = "moves it aside and starts without sessions or retained messages"
    return f"DAMAGE {damage['problem']}; the broker's next start {then}"
