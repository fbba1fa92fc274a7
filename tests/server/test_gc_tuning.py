"""The garbage collector once the broker is started (server/app.py tune_garbage_collector):
what start-up made is frozen out of later collections, and full collections come at most every
GC_FULL_EVERY middle ones (with 500 sessions catching up, the default's one a second took the
loop 80 to 150 ms each, freeing nothing: catchup5)."""

from __future__ import annotations

import gc

from edgebroker.server import app


def test_start_up_objects_are_frozen_and_full_collections_are_rarer():
    before = gc.get_threshold()
    try:
        kept = [[i] for i in range(1000)]     # made before: frozen with the rest
        app.tune_garbage_collector()
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (before[0], before[1], app.GC_FULL_EVERY)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
