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


def test_a_reload_reads_the_file_without_a_full_collection(tmp_path):
    """Reading the configuration file unloads the TOML parser and collects (an idle broker
    keeps neither); in a running broker (its start-up frozen) a reload did the same, and the
    full collection walked every object made since the start, holding the loop 160 ms at
    20,000 sessions (mem3). The parser now stays loaded after a reload, and no full
    collection runs."""
    from edgebroker import toml_file
    path = tmp_path / "edgebroker.toml"
    path.write_text('log_level = "info"\n')
    full = []

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(info)

    before = gc.get_threshold()
    gc.callbacks.append(seen)
    try:
        assert toml_file.read_toml(str(path)) == {"log_level": "info"}
        assert full, "the start's read collects"
        full.clear()
        app.tune_garbage_collector()
        assert toml_file.read_toml(str(path)) == {"log_level": "info"}
        assert toml_file.read_toml(str(path)) == {"log_level": "info"}
        assert full == []
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
        gc.set_threshold(*before)
