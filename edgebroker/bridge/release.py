"""The packet ids a bridge's earlier run may have left at the remote past PUBREC.

A QoS 2 message the remote acknowledged with PUBREC is held there under its packet id until
PUBREL comes (MQTT-4.3.3), and MQTT-4.4.0-1 owes the remote that PUBREL, across reconnects
and restarts alike, as long as the session lasts. A crash (or a stop) ends the process that
knew which ids those were, and a new one cannot learn them: the checkpoint is written every
``checkpoint_interval``, not at each PUBREC. Left unreleased they would each keep a place of
the remote's Receive Maximum for good (Mosquitto: 20): the window filled over them is
refused (0x97) and the link flaps; and on a remote that does not compare the content, a new
message sent under one of those ids would be taken as a duplicate and dropped.

So a bridge takes its packet ids from a small range, 1..``pool_of(window)`` (the client
library's ``Connection.packet_ids``), the checkpoint says which (``packet_ids``), and on
the first CONNACK of a run with Session Present 1 the bridge sends PUBREL for every id of
the range its earlier run used, before any new message (client/resume.py's ``release``:
each counts in the window until its PUBCOMP comes). Whatever the remote held is then
released (delivered, and sent again from the log: at least once), and nothing new can meet
an id it still holds. Without that key (a checkpoint of an older version, none, or a
damaged one) the whole range 1..65535 is released. Once the old ids are released (or the
remote had no session) the checkpoint is handed to the writer at once with the bridge's own
range: a crash before the next ``checkpoint_interval`` then releases only those ids.
"""

from __future__ import annotations

import logging

from edgebroker.client.resume import release

log = logging.getLogger("edgebroker.bridge")

ALL_IDS = 0xFFFF


def pool_of(window: int) -> int:
    """The packet ids a bridge with that ``window`` uses: 1 to this (twice the window and
    its SUBSCRIBE: a free id is found at once)."""
    return min(ALL_IDS, 2 * window + 2)


class Releasing:
    """``Bridge``'s side of it (a mixin over its state)."""

    def init_release(self, saved: int | None) -> None:
        """At start; ``saved``: the checkpoint's ``packet_ids`` (None: not known)."""
        self.pool = pool_of(self.config.window)
        self.conn.packet_ids = self.pool
        self.old_ids = ALL_IDS if saved is None else saved   # 1..old_ids to release; 0: done
        self.releasing = 0          # PUBRELs of them in flight
        self._release_sent = False
        self.ids_saved = saved      # in the checkpoint last written or handed to the writer

    @property
    def packet_ids(self) -> int:
        """The checkpoint's ``packet_ids``: those a crash now may leave at the remote."""
        return max(self.pool, self.old_ids)

    def release_on_connect(self, session_present: bool) -> None:
        """On Connected, before anything new is sent."""
        if not session_present:     # no session: nothing is held there any more
            self.releasing = 0      # (nor are the PUBRELs sent for it)
        if not self.old_ids:
            return
        if not session_present:
            self._old_ids_done()
            return
        if self._release_sent:      # (in flight: the connection sends them again)
            return
        self._release_sent = True
        self.releasing = release(self.conn, range(1, self.old_ids + 1))
        log.info("bridge %s: the remote kept the session: PUBREL for packet ids 1 to %d, "
                 "which the bridge's previous run may have left there past PUBREC "
                 "(MQTT-4.4.0-1); new messages wait for their PUBCOMPs", self.name,
                 self.old_ids)
        if not self.releasing:
            self._old_ids_done()

    def released(self) -> None:
        """The PUBCOMP of one of them came."""
        self.releasing -= 1
        if self.releasing <= 0:
            self.releasing = 0
            if self.old_ids:    # (else: those of refusals.py's ``_release_held``)
                log.info("bridge %s: packet ids 1 to %d released", self.name, self.old_ids)
                self._old_ids_done()

    def _old_ids_done(self) -> None:
        """Only the bridge's own ids may be held at the remote now: the checkpoint says so."""
        self.old_ids = 0
        if self.packet_ids != self.ids_saved:
            self.save_checkpoint()
