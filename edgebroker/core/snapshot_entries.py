"""Reading a snapshot's session entries (core.snapshot): each entry's older forms, and the
values out of range left out.

Entries written by older versions have fewer fields (no sizes; inbound QoS 2 packet ids
without their messages' digests), and read as their defaults."""

from __future__ import annotations

import logging

from edgebroker.errors import name_shown

log = logging.getLogger("edgebroker.snapshot")


def awaiting_entries(s: dict) -> dict[int, int | None]:
    """A session's inbound QoS 2 packet ids awaiting PUBREL -> their digests: the ids in
    ``awaiting_release``, each with its digest from ``release_digests`` ([id, digest] pairs);
    None for an id without one (every id of a snapshot written before they were kept)."""
    awaiting = dict.fromkeys(int(p) for p in s["awaiting_release"])
    for p, digest in s.get("release_digests", ()):
        if int(p) in awaiting:
            awaiting[int(p)] = int(digest)
    return awaiting


def release_digests(s) -> list[list[int]]:
    """The [packet id, digest] pairs of a ``SessionState``'s ``awaiting_release`` (those
    with a digest)."""
    return [[p, d] for p, d in sorted(s.awaiting_release.items()) if d is not None]


def inflight_entry(e) -> tuple[int, int, int, bool, int, int]:
    """[pid, offset, qos, retain, state, size]; snapshots without sizes have 5 (size 0)."""
    if len(e) == 5:
        p, o, q, r, st = e
        size = 0
    else:
        p, o, q, r, st, size = e
    return int(p), int(o), int(q), bool(r), int(st), int(size)


def queue_entry(e) -> tuple[int, int, bool, int]:
    """[offset, qos, retain, size]; snapshots without sizes have 3 (size 0)."""
    if len(e) == 3:
        o, q, r = e
        size = 0
    else:
        o, q, r, size = e
    return int(o), int(q), bool(r), int(size)


def queue_entries(s) -> list[tuple[int, int, bool, int]]:
    """A ``SessionState``'s ``queue`` as (log offset, qos, retain, size), whichever form it
    holds; entries of messages not in the log ($SYS) are left out."""
    queue = s.queue
    if not queue or type(queue[0][0]) is int:
        return queue
    return [(ref.offset, qos, retain, ref.size) for ref, qos, retain in queue
            if ref.offset is not None]


def offline_range(r) -> list:
    start, end = r
    return [int(start), None if end is None else int(end)]


def ranged(s, path: str):
    """``s`` (a ``SessionState``) without the entries whose values are out of range (a packet
    id past 65535, a QoS past 2, a negative offset: a snapshot damaged, or edited by hand),
    each kind logged once with the file, the session and what was dropped; the rest is
    kept."""
    dropped = []

    def keep(what: str, entries: list, ok) -> list:
        kept = [e for e in entries if ok(e)]
        if len(kept) != len(entries):
            bad = [e for e in entries if not ok(e)]
            dropped.append(f"{len(bad)} {what} entries such as {list(bad[0])!r}"
                           if isinstance(bad[0], tuple) else f"{what} {bad[:5]}")
        return kept
    s.inflight = keep("inflight", s.inflight, lambda e: 0 < e[0] < 65536 and e[1] >= 0
                      and e[2] in (1, 2) and e[4] in (0, 1) and e[5] >= 0)
    s.queue = keep("queue", s.queue, lambda e: e[0] >= 0 and e[1] in (0, 1, 2) and e[3] >= 0)
    s.held = keep("held", s.held, lambda e: e[0] >= 0 and e[1] >= 0 and e[2] in (0, 1, 2)
                  and e[4] >= 0)
    s.lowered = keep("lowered", s.lowered, lambda e: e[1] >= 0 and e[2] in (1, 2))
    s.kept5 = keep("kept5", s.kept5, lambda e: e[1] >= 0 and 0 <= e[2] < 256)
    s.owed = keep("owed", s.owed, lambda e: 0 <= e[1] < e[2])
    awaiting = s.awaiting_release
    ids = keep("awaiting_release", list(awaiting), lambda p: 0 < p < 65536)
    bad_digests = [p for p in ids if awaiting[p] is not None
                   and not 0 <= awaiting[p] <= 0xFFFFFFFF]
    if bad_digests:
        dropped.append(f"the release_digests of packet ids {bad_digests[:5]} (the ids are "
                       f"kept without: a re-send without DUP is then taken as a new message)")
    s.awaiting_release = {p: None if p in bad_digests else awaiting[p] for p in ids}
    bad_subs = sorted(f for f, q in s.subscriptions.items() if q not in (0, 1, 2))
    if bad_subs:
        dropped.append(f"subscriptions with a QoS past 2: {bad_subs[:5]}")
        s.subscriptions = {f: q for f, q in s.subscriptions.items() if q in (0, 1, 2)}
    if not 0 <= s.next_id < 65536:
        dropped.append(f"next_id {s.next_id}")
        s.next_id = 0
    if s.cursor is not None and s.cursor < 0:
        dropped.append(f"cursor {s.cursor} (it reads from the snapshot's offset)")
        s.cursor = None
    if dropped:
        log.error("%s: session %s: values out of range left out: %s", path, name_shown(s.client_id),
                  "; ".join(dropped))
    return s
