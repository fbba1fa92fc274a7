"""Cursors that ``retention_bytes`` left behind move to the first record kept (core.catchup),
logged as the other cursor moves are: once per episode (docs/limits.md, "Logging under attack").

An offline session's cursor stays where it went offline, so once the log sits at its size
limit every segment deletion moves it again. The first move of an episode is logged with its
offsets; the next ones are only counted (``log_gap``, exact as before) and logged as a number
when the session catches up, comes back, is removed (expired, replaced by a clean one), or at
a clean stop before any of these. A deletion pass
that moves more than SUMMARY_SESSIONS sessions also logs one line for the pass: how many, the
offsets deleted and a few client ids.
"""

from __future__ import annotations

import logging

from edgebroker.errors import name_shown

log = logging.getLogger("edgebroker.broker")

# A pass that moves more sessions than this logs one line saying so, naming IDS_SHOWN of them.
SUMMARY_SESSIONS = 10
IDS_SHOWN = 3
WHY = ("retention deleted its segments: the log was over retention_bytes; its next moves are "
       "counted, logged as a number when it catches up or comes back")


def move_below(broker, first: int, deleted_from: int) -> None:
    """Retention deleted the log's records from ``deleted_from`` to ``first`` (excluded):
    every cursor below ``first`` moves to it."""
    moved = []
    for session in list(broker.behind):
        cursor = session.cursor
        if cursor.offset >= first:
            continue
        if cursor.gone >= 0:
            cursor.gone += broker._skip(session, first, "")
        else:
            broker._skip(session, first, WHY)
            cursor.gone = 0
        moved.append(session.client_id)
    if len(moved) > SUMMARY_SESSIONS:
        log.warning("retention deleted log records %d to %d (the log was over retention_bytes): "
                    "%d sessions behind lost records there (%s and %d more; counted as "
                    "log_gap, each session's first move logged on its own)", deleted_from,
                    first - 1, len(moved), ", ".join(map(name_shown, moved[:IDS_SHOWN])),
                    len(moved) - IDS_SHOWN)


def episode_ends(session, when: str) -> None:
    """``session`` caught up or came back (``when`` says which): what retention took from it
    after the move logged, as a number; the next move starts a new episode."""
    cursor = session.cursor
    if cursor.gone > 0:
        log.warning("session %s %s; %d more records were lost to it for retention_bytes after "
                    "the move logged", name_shown(session.client_id), when, cursor.gone)
    cursor.gone = -1


def counts_at_stop(session) -> None:
    """At a clean stop: what ``session``, behind, counted to log when it catches up."""
    _counts(session, "up to the stop (it had not caught up; a restart logs a new episode)",
            "up to the stop (it had not caught up; a restart logs a new first move)")


def counts_at_removal(session, why: str = "before it was removed") -> None:
    """``session``, behind, is removed (expired, replaced by a clean one) or its cursor is
    dropped (nothing left to read: ``why`` says so): what it counted to log when it catches
    up, as at a stop."""
    _counts(session, why, why)
    session.cursor.gone = session.cursor.aged = -1
    session.cursor.lag_dropped = 0


def _counts(session, skipped: str, lost: str) -> None:
    cursor = session.cursor
    who = name_shown(session.client_id)
    if cursor.lag_dropped:
        log.warning("session %s: %d QoS 0 messages were skipped for max_lag_bytes or "
                    "max_lag_age, %s", who, cursor.lag_dropped, skipped)
    if cursor.aged > 0:
        log.warning("session %s: %d more records were lost to it for max_session_lag_age after "
                    "the move logged, %s", who, cursor.aged, lost)
    if cursor.gone > 0:
        log.warning("session %s: %d more records were lost to it for retention_bytes after the "
                    "move logged, %s", who, cursor.gone, lost)
