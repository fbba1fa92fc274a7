"""The session snapshot read at start, and what is done when it cannot be used.

Imported only when the snapshot cannot be used (server/app.py): an idle broker does not keep
it (docs/deploy.md, idle RSS). A snapshot the broker may not read (EACCES, EPERM: a ``sudo cp`` or ``chmod`` mistake) is no
damage: the start is refused naming the file and the fix, and nothing is changed (as for a log
file). A damaged document is moved aside (``sessions.json.damaged``) and the broker starts
without sessions or retained messages. A damaged or missing side file of retained payloads
(core.retained_side) costs only the retained messages the snapshot held: it is moved aside
and the sessions are restored.
"""

from __future__ import annotations

import logging
import os

from edgebroker.core import snapshot as snap
from edgebroker.files import open_regular

log = logging.getLogger("edgebroker.snapshot")


def after_error(state_dir: str, exc: snap.SnapshotError) -> snap.Snapshot | None:
    """The snapshot in ``state_dir`` to restore once ``snap.read(state_dir)`` raised ``exc``:
    None for none (a damaged document); SnapshotError when the start must be refused."""
    document = os.path.join(state_dir, snap.FILENAME)
    side = exc.retained_file
    for path in (document, side):
        if path:
            _refuse_unreadable(path)
    if side:
        state = snap.read(state_dir, payloads=False)
        moved = ""
        if os.path.lexists(side):
            os.replace(side, side + ".damaged")
            moved = f"moved it to {side}.damaged and "
        log.error("%s; %sstarting without the %d retained messages the snapshot held (its "
                  "sessions are restored)", exc, moved, len(state.retained))
        state.retained = []
        return state
    os.replace(document, document + ".damaged")
    log.error("%s; moved it to %s.damaged and starting without sessions or retained "
              "messages", exc, document)
    return None


def _refuse_unreadable(path: str) -> None:
    try:
        os.close(open_regular(path, os.O_RDONLY))
    except PermissionError as exc:
        raise snap.SnapshotError(
            f"{path}: cannot read: {exc.strerror}; nothing was changed: let the broker's user "
            f"read and write it (chown, chmod 600) and start again") from None
    except OSError:
        pass
