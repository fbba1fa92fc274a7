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

The remote may forget too: restarted from an older save of its sessions, it holds again ids
the bridge saw through to PUBCOMP. So every later CONNACK with Session Present 1 releases
the ids of the bridge's range not in flight the same way (a round trip before new messages).
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
        self._pool_logged = False
        self.ids_saved = saved      # in the checkpoint last written or handed to the writer

    @property
    def packet_ids(self) -> int:
        """The checkpoint's ``packet_ids``: those a crash now may leave at the remote."""
        return max(self.pool, self.old_ids)

    def release_on_connect(self, session_present: bool) -> None:
        """On Connected, before anything new is sent. At every CONNACK with Session Present
        1, not only the first of a run: a remote restarted from an older save of its sessions
        (a SIGKILL, a power cut: Mosquitto saves every ``autosave_interval``) holds again ids
        the bridge had seen through to PUBCOMP, each taking a place of its Receive Maximum (a
        3.1.1 link's refusal is a plain PUBREC: the message was lost, counted as forwarded;
        bridge11), and a new message under one of them would be taken for a duplicate. So
        each id of the range not in flight gets its PUBREL (answered at once when the remote
        holds nothing)."""
        if not session_present:     # no session: nothing is held there any more
            self.releasing = 0      # (nor are the PUBRELs sent for it)
            if self.old_ids:
                self._old_ids_done()
            return
        if self.releasing:          # (in flight: the connection sends them again)
            return
        old = self.old_ids
        self.releasing = release(self.conn, range(1, max(old, self.pool) + 1))
        if old:
            log.info("bridge %s: the remote kept the session: PUBREL for packet ids 1 to %d, "
                     "which the bridge's previous run may have left there past PUBREC "
                     "(MQTT-4.4.0-1); new messages wait for their PUBCOMPs", self.name, old)
            if not self.releasing:
                self._old_ids_done()
        elif not self._pool_logged:
            self._pool_logged = True
            log.info("bridge %s: reconnected, the remote kept the session: PUBREL for the "
                     "packet ids 1 to %d not in flight (a remote restarted from an older save "
                     "of its sessions may hold them past PUBREC), as at each such reconnect "
                     "(logged once)", self.name, self.pool)

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
