"""Retained messages a session holds: sent from the retained store while it still has them.

A retained message sent at SUBSCRIBE may be far older than the log: retention deletes its
record while the retained store keeps the message whole (and the snapshot with it). A session
that goes offline keeps its queue and window as log offsets (``core.session.Stored``); for a
retained message it keeps its topic too (``StoredRetained``), and when the message is to be
sent again it comes from the retained store as long as the store holds that same message (the
same log offset), whether or not the log still has the record. A restart makes such entries
again from the retained messages the snapshot restored. One the store no longer holds
(replaced or cleared since) is read from the log, and counted and logged as lost
(``publish_lost``) when its record is gone, as any other.
"""

from __future__ import annotations

from edgebroker.core.session import Message, Stored, StoredRetained


class RetainedDelivery:
    """The retained messages' part of ``Broker`` (a mixin over the broker's state)."""

    def retained_copy(self, stored: StoredRetained) -> Message | None:
        """The retained store's message when it is still the one ``stored`` refers to (the
        same log offset), else None."""
        message = self.retained.get(stored.topic)
        if message is not None and message.offset == stored.offset:
            return message
        return None

    def retained_offsets(self) -> dict[int, str]:
        """Log offset -> topic of the retained messages in the store (at start: to make a
        restored session's entries ``StoredRetained``, ``stored_ref``)."""
        found: dict[int, str] = {}
        for message in self.retained.values():
            if message.offset is not None:
                found[message.offset] = message.topic
        return found


def stored_ref(offset: int, size: int, retained_at: dict[int, str]) -> Stored:
    """A restored queue or window entry: a ``StoredRetained`` when a retained message in the
    store has its offset (``retained_at``, from ``RetainedDelivery.retained_offsets``)."""
    topic = retained_at.get(offset)
    return Stored(offset, size) if topic is None else StoredRetained(offset, size, topic)
