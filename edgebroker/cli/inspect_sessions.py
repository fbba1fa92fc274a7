"""`edgebroker inspect sessions`: the persistent sessions of the last session snapshot, each
with its subscriptions and backlog, whether it was connected, and when it expires.

A session's expiry is worked out as the broker does (core/sessions.py ``_expire_later``): its
Session Expiry Interval (MQTT 5.0), at most ``persistent_client_expiration`` when that is set;
``persistent_client_expiration`` for a 3.1.1 session; 0 or 0xFFFFFFFF: never. That setting is
read from ``-c FILE`` (without it: the built-in default, 0). It counts from the time the session
went offline (the snapshot's ``offline_ms``), the time the broker was down included: a session
past it is removed at the broker's next start, or was removed since the snapshot while it runs.
"""

from __future__ import annotations

import json
import os
import time

from edgebroker.cli import log_lock
from edgebroker.cli.inspect_common import human_bytes, log_dir, open_log, out, table
from edgebroker.cli.inspect_live import duration
from edgebroker.cli.record_view import fmt_time
from edgebroker.cli.state_dir import read_config, state_dir_of
from edgebroker.core import snapshot
from edgebroker.core.mqtt5 import kept_offline
from edgebroker.errors import EdgebrokerError


def add_subcommand(sub, common) -> None:
    """``inspect sessions`` under the ``inspect`` parser (``common``: its shared options)."""
    sp = sub.add_parser("sessions", help="persistent sessions: subscriptions, backlog, online "
                                         "or offline, expiry (from the last snapshot)")
    common(sp)
    sp.set_defaults(run=run_sessions)


def expiry_seconds(expiry_interval: int | None, cap: float) -> float | None:
    """How long a session is kept offline, in seconds (None: for ever), as the broker's
    ``_expire_later``: ``expiry_interval`` (5.0; None for 3.1.1) at most ``cap``
    (persistent_client_expiration, 0: none), else ``cap``."""
    return kept_offline(expiry_interval, cap) or None


def session_state(s: snapshot.SessionState, cap: float, now_ms: int) -> dict:
    """``online``, ``offline_ms``, ``expiry_seconds``, ``expires_ms`` and ``expired`` of a
    session of the snapshot (docs/persistence.md, "Seeing it")."""
    seconds = expiry_seconds(s.expiry_interval, cap)
    offline = s.offline_ms
    expires = None if offline is None or seconds is None else offline + int(seconds * 1000)
    return {"online": offline is None, "offline_ms": offline, "expiry_seconds": seconds,
            "expires_ms": expires, "expired": expires is not None and expires <= now_ms}


def _state_text(state: dict, now_ms: int) -> str:
    if state["online"]:
        return "online"
    return f"offline {duration(max(0, now_ms - state['offline_ms']) / 1000)}"


def _expires_text(state: dict, now_ms: int, running: bool) -> str:
    if state["expiry_seconds"] is None:
        return "never"
    if state["online"]:
        return f"{duration(state['expiry_seconds'])} after it goes offline"
    if state["expired"]:
        return "expired (removed since the snapshot)" if running else \
            "expired (removed at the next start)"
    return f"in {duration((state['expires_ms'] - now_ms) / 1000)}"


def run_sessions(args) -> int:
    """Persistent sessions as of the last snapshot (while the broker runs: about 1 s after a
    session changes, else up to 30 s old; the output says when it was taken), with how far
    each one's cursor is behind the head of the log (read now)."""
    keys = ("data_dir",) * (not args.data_dir) + ("limits.persistent_client_expiration",)
    config = read_config(args.config, keys)
    cap = config.limits.persistent_client_expiration
    # The state directory from the file read once (-c may be a pipe): the log's below it.
    args.data_dir = state_dir = state_dir_of(args, config)
    state = snapshot.read(state_dir, payloads=False)
    if state is None:
        raise EdgebrokerError(f"{os.path.join(state_dir, snapshot.FILENAME)}: no session "
                              f"snapshot (has a broker run with this state directory?)")
    sessions = sorted(state.sessions, key=lambda s: s.client_id)
    retained = {r.offset for r in state.retained}
    now_ms = time.time_ns() // 1_000_000
    lags = {}
    if any(s.cursor is not None for s in sessions) and os.path.isdir(log_dir(args)):
        commit_log = open_log(args)
        try:
            lags = {s.client_id: commit_log.lag(snapshot.first_unsent(s, retained), now_ms)
                    for s in sessions if s.cursor is not None}
        finally:
            commit_log.close()
    states = {s.client_id: session_state(s, cap, now_ms) for s in sessions}
    none = {"lag_records": 0, "lag_bytes": 0, "lag_seconds": 0.0}
    if args.format == "json":
        out(json.dumps({
            "written_ms": state.written_ms, "log_next_offset": state.log_next_offset,
            "retained": len(state.retained),
            "sessions": [{"client_id": s.client_id, "subscriptions": s.subscriptions,
                          "inflight": len(s.inflight), "queued": len(s.queue),
                          "oldest_offset": _oldest(s), "cursor": snapshot.first_unsent(s, retained),
                          **lags.get(s.client_id, none), "drops": s.drops,
                          **states[s.client_id]}
                         for s in sessions]}, indent=2))
        return 0
    running = log_lock.held(log_dir(args)) is True
    rows = [["CLIENT ID", "STATE", "EXPIRES", "SUBSCRIPTIONS", "INFLIGHT", "QUEUED", "CURSOR",
             "LAG", "LAG BYTES", "LAG AGE", "DROPPED"]]
    for s in sessions:
        subs = ", ".join(f"{f} (QoS {q})" for f, q in sorted(s.subscriptions.items())) or "-"
        lag = lags.get(s.client_id)
        st = states[s.client_id]
        rows.append([s.client_id, _state_text(st, now_ms), _expires_text(st, now_ms, running),
                     subs, str(len(s.inflight)), str(len(s.queue)),
                     "-" if s.cursor is None else str(snapshot.first_unsent(s, retained)),
                     "-" if lag is None else str(lag["lag_records"]),
                     "-" if lag is None else human_bytes(lag["lag_bytes"]),
                     "-" if lag is None else f"{lag['lag_seconds']:.0f} s",
                     str(sum(s.drops.values()))])
    out(table(rows, right={4, 5, 6, 7, 8, 9, 10}))
    behind = sum(1 for s in sessions if s.cursor is not None)
    expired = sum(1 for st in states.values() if st["expired"])
    out(f"{len(sessions)} persistent sessions ({behind} reading from the log, {expired} "
        f"expired), {sum(len(s.queue) + len(s.inflight) for s in sessions)} messages in their "
        f"queues and windows, {len(state.retained)} retained messages; snapshot of "
        f"{fmt_time(state.written_ms)} at log offset {state.log_next_offset}")
    return 0


def _oldest(s) -> int | None:
    offsets = [e[1] for e in s.inflight] + [e[0] for e in s.queue]
    return min(offsets) if offsets else None
