"""A session snapshot's document read back (core.snapshot's ``decode``): imported only when
there is a snapshot to read, so that a broker started without one does not hold its code
(docs/deploy.md, idle RSS)."""

from __future__ import annotations

import json
import logging

from edgebroker.core.snapshot_state import (
    FILENAME, LAST_WALL_MS, READABLE, GroupState, SessionState, Snapshot,
)
from edgebroker.core.snapshot_entries import (
    awaiting_entries, inflight_entry, offline_range, queue_entry, ranged,
)
from edgebroker.core.snapshot_retained import SnapshotError, retained_entry, retained_file_head
from edgebroker.core.will_state import read_will
from edgebroker.errors import topic_shown

log = logging.getLogger("edgebroker.snapshot")


def decode(data: bytes, path: str = FILENAME) -> Snapshot:
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise SnapshotError(f"{path}: damaged snapshot (a JSON {type(doc).__name__}, "
                                f"not an object)")
        if doc.get("format") not in READABLE:
            raise SnapshotError(f"{path}: snapshot format {doc.get('format')!r} is not one of "
                                f"{', '.join(map(str, READABLE))} (written by a newer edgebroker?)")
        exchanges, side = doc.get("exchanges"), doc.get("retained_file")
        snap = Snapshot(log_next_offset=int(doc["log_next_offset"]),
                        written_ms=int(doc.get("written_ms", 0)),
                        exchanges=None if exchanges is None else int(exchanges),
                        retained_file=None if side is None else retained_file_head(side))
        if not 0 <= snap.written_ms <= LAST_WALL_MS:
            raise SnapshotError(f"{path}: damaged snapshot (written_ms {snap.written_ms} is "
                                f"not a time from 1970 to 9999)")
        for s in doc["sessions"]:
            snap.sessions.append(ranged(SessionState(
                client_id=str(s["client_id"]),
                subscriptions={str(f): int(q) for f, q in s["subscriptions"]},
                inflight=[inflight_entry(e) for e in s["inflight"]],
                queue=[queue_entry(e) for e in s["queue"]],
                awaiting_release=awaiting_entries(s),
                next_id=int(s.get("next_id", 0)),
                cursor=None if s.get("cursor") is None else int(s["cursor"]),
                since={str(f): int(o) for f, o in s.get("since", ())},
                offline=[offline_range(r) for r in s.get("offline", ())],
                drops={str(k): int(v) for k, v in s.get("drops", {}).items()},
                done=[int(o) for o in s.get("done", ())],
                held=[(int(a), int(o), int(q), bool(r), int(n)) for a, o, q, r, n in
                      s.get("held", ())],
                unsure_to=max(0, int(s.get("unsure_to", 0))),
                resubscribed=max(0, int(s.get("resubscribed", 0))),
                lowered=[(str(f), int(o), int(q)) for f, o, q in s.get("lowered", ())],
                kept5=[(str(f), int(o), int(v)) for f, o, v in s.get("kept5", ())],
                owed=[(str(f), int(a), int(b)) for f, a, b in s.get("owed", ())],
                offline_ms=None if s.get("offline_ms") is None else int(s["offline_ms"]),
                expiry_interval=None if s.get("expiry") is None else int(s["expiry"]),
                sub5={str(f): [int(o), int(i)] for f, (o, i) in s.get("sub5", ())},
                groups={int(p): str(k) for p, k in s.get("groups", ())},
                will=read_will(s.get("will"), path, str(s["client_id"]))), path))
        for r in doc["retained"]:
            offset = r.get("offset")
            if int(r["qos"]) not in (0, 1, 2) or offset is not None and int(offset) < 0:
                log.error("%s: retained message %s: QoS %r or offset %r out of range; left out",
                          path, topic_shown(str(r["topic"])), r["qos"], offset)
                continue
            state = retained_entry(r)
            if state.place is not None and snap.retained_file is None:
                raise ValueError("a retained message in a side file the snapshot does not name")
            snap.retained.append(state)
        for g in doc.get("shared", ()):
            snap.shared.append(GroupState(
                key=str(g["key"]), cursor=None if g.get("cursor") is None else int(g["cursor"]),
                queue=[queue_entry(e) for e in g["queue"]],
                done=[int(o) for o in g.get("done", ())]))
        for w in doc.get("wills", ()):
            will = read_will(w, path, str(w["client_id"]))
            if will is not None:
                snap.wills.append((str(w["client_id"]), will))
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError,
            RecursionError) as exc:
        # a field of the wrong JSON type, a number int() cannot take (1e400, Infinity), or
        # nested too deep to parse
        raise SnapshotError(f"{path}: damaged snapshot ({type(exc).__name__}: {exc})") from None
    return snap
