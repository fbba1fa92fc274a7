"""Lives of a gateway's log (uploader/life.py): a gateway whose data directory is wiped and
that keeps its gateway_id numbers its records from 0 again, and its new batches land beside
the old ones of the same day (no "already exists with other bytes" alarm); a log written before
life ids ships the batch its intent file names under the old name, then names its batches
with a life id; an intent of another life, or a damaged life file, loses nothing."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from edgebroker.uploader.batch import read_batch_file
from edgebroker.uploader.life import life_of_key

from .test_uploader import (
    GATEWAY, landed, life_of, payload, publish, upload_config, uploaded, wait_until,
)


def names_and_payloads(landing: Path) -> dict[str, list[bytes]]:
    return {name: [r.payload for r in records] for name, (_, records) in landed(landing).items()}


def first_batch(broker, tmp_path, what: str):
    """A broker uploading to a landing folder whose first batch, 0..2, has landed: (the broker,
    the landing folder, the data directory, its configuration)."""
    landing = tmp_path / "landing"
    landing.mkdir()
    data = tmp_path / "data"
    cfg = dict(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    publish(b, 0, 3)
    wait_until(lambda: uploaded(b) == 3, what=what)
    return b, landing, data, cfg


def test_a_reimaged_gateway_keeping_its_id_uploads_its_new_life_beside_the_old_one(
        broker, tmp_path):
    """Life 1 ships 0..2; the data directory is wiped; life 2, the same gateway_id on the same
    day, ships its own 0..2: both objects land, under names that differ by their life id, and
    no alarm. Before life ids life 2's name was life 1's, and the alarm stayed for good."""
    b, landing, data, cfg = first_batch(broker, tmp_path, "life 1's batch")
    ((name1, _),) = landed(landing).items()
    assert b.stop() == 0
    shutil.rmtree(data)                                  # re-imaged: a new data directory
    b = broker(**cfg)
    publish(b, 0, 3, make=lambda i, size: b"life 2, %d" % i)
    wait_until(lambda: uploaded(b) == 3, what="life 2's batch")
    fig = b.stats()["upload"]
    assert not fig["alarm"] and fig["permanent_errors"] == 0, fig
    assert not [line for line in b.logs if "upload alarm" in line]
    life1, life2 = life_of_key(name1), life_of(data)
    assert life2 != life1 and life1 is not None
    got = names_and_payloads(landing)
    assert len(got) == 2, got
    by_life = {life_of_key(name): (name, payloads) for name, payloads in got.items()}
    assert set(by_life) == {life1, life2}
    (name1, payloads1), (name2, payloads2) = by_life[life1], by_life[life2]
    assert payloads1 == [payload(i) for i in range(3)]
    assert payloads2 == [b"life 2, %d" % i for i in range(3)]
    assert name1.rsplit("/", 1)[0] == name2.rsplit("/", 1)[0], "the same gateway and day"
    for name, life in ((name1, life1), (name2, life2)):
        assert name.endswith(f"/{0:020d}-{2:020d}-{life}.ebb.zst")
        header, _ = read_batch_file(str(landing / name))
        assert (header.gateway_id, header.first_offset, header.last_offset) == (GATEWAY, 0, 2)
    assert b.stop() == 0


def test_a_log_from_before_life_ids_ships_its_intent_under_the_old_name_then_uses_a_life(
        broker, tmp_path):
    """The intent file names 0..4 under a name without a life id, and the log has no life
    file (a gateway upgraded between the intent and the put): that batch lands under its old
    name, the log gets a life id (logged), and the next batch is named with it."""
    landing = tmp_path / "landing"
    landing.write_text("not a folder")              # the put fails: the intent stays
    data = tmp_path / "data"
    cfg = dict(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    publish(b, 0, 5)
    wait_until(lambda: b.stats()["upload"]["alarm"], what="the alarm")
    b.stop(signal.SIGKILL)
    intent_path = data / "upload" / "intent"
    intent = json.loads(intent_path.read_text())
    assert (intent["first"], intent["last"]) == (0, 4)
    new_style = intent["key"]
    old = life_of(data)
    assert new_style.endswith(f"-{old}.ebb.zst")
    old_name = new_style.replace(f"-{old}.ebb.zst", ".ebb.zst")   # as the old version named it
    intent_path.write_text(json.dumps(dict(intent, key=old_name)) + "\n")
    (data / "log" / "life").unlink()
    landing.unlink()
    landing.mkdir()
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == 5, what="the intent's batch")
    life = life_of(data)
    assert b.wait_log(lambda ln: "had no life id" in ln and life in ln, 5)
    publish(b, 5, 3)
    wait_until(lambda: uploaded(b) == 8, what="the next batch")
    got = names_and_payloads(landing)
    assert sorted(got) == sorted([old_name, old_name.rsplit("/", 1)[0]
                                  + f"/{5:020d}-{7:020d}-{life}.ebb.zst"]), got
    assert got[old_name] == [payload(i) for i in range(5)]
    assert not b.stats()["upload"]["alarm"]
    assert b.stop() == 0


def test_an_intent_of_a_wiped_log_is_dropped_not_cut_again_from_the_new_log(broker, tmp_path):
    """The log folder is wiped and the upload folder kept: the intent names 0..4 of the old log
    (its life id in the name). The new log's first batch, 0..2, is cut afresh and named with
    the new life id. Before, the new log seemed to have lost records of the intent's range:
    the old log's batch file was shipped again and the mark moved to 5 past the new 0..2,
    which were never uploaded."""
    landing = tmp_path / "landing"
    landing.write_text("not a folder")
    data = tmp_path / "data"
    cfg = dict(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    publish(b, 0, 5)
    wait_until(lambda: b.stats()["upload"]["alarm"], what="the alarm")
    old = life_of(data)
    assert b.stop() == 0
    shutil.rmtree(data / "log")
    landing.unlink()
    landing.mkdir()
    b = broker(**cfg)
    publish(b, 0, 3, make=lambda i, size: b"new log %d" % i)
    wait_until(lambda: uploaded(b) >= 3, what="the new log's batch")
    assert uploaded(b) == 3
    life = life_of(data)
    assert b.wait_log(lambda ln: "of another life of the log" in ln and old in ln, 5)
    got = names_and_payloads(landing)
    ((name, payloads),) = got.items()
    assert life_of_key(name) == life != old
    assert payloads == [b"new log %d" % i for i in range(3)]
    assert b.stop() == 0


def test_an_intent_of_another_life_is_removed_so_no_later_start_takes_its_life_id(
        broker, tmp_path):
    """The log folder wiped, the intent of the old life dropped at the next start, but left on
    disk: a later start of the new log without a life file (that run could not write it: a
    full disk, simulated by removing it) took the old life's id from it, and two lives of the
    log shared one id (diff27). The intent file is removed when it is dropped."""
    b, landing, data, cfg = first_batch(broker, tmp_path, "the old life's batch")
    assert b.stop() == 0
    old = life_of(data)
    shutil.rmtree(data / "log")
    slow = dict(cfg, upload=upload_config(landing, batch_max_age=3600))
    b = broker(**slow)
    assert b.wait_log(lambda ln: "of another life of the log" in ln and old in ln
                      and "the file is removed" in ln, 5)
    assert not (data / "upload" / "intent").exists()
    publish(b, 0, 3, make=lambda i, size: b"new life %d" % i)    # no batch cut (1 h)
    assert b.stop() == 0
    (data / "log" / "life").unlink()
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == 3, what="the new log's batch")
    assert life_of(data) != old
    got = names_and_payloads(landing)
    (name,) = [n for n in got if life_of_key(n) != old]
    assert got[name] == [b"new life %d" % i for i in range(3)]
    assert not b.stats()["upload"]["alarm"]
    assert b.stop() == 0


def test_a_clone_given_its_own_life_id_as_the_docs_say_uploads_beside_its_twin(broker,
                                                                             tmp_path):
    """docs/upload.md's remedy for a cloned data directory: stop the clone, remove its
    log/life and upload/intent; its next records land under its own life id beside the
    twin's, no alarm."""
    b, landing, data, cfg = first_batch(broker, tmp_path, "the twin's first batch")
    assert b.stop() == 0
    twin = life_of(data)
    clone = tmp_path / "clone"
    shutil.copytree(data, clone)
    (clone / "log" / "life").unlink()
    (clone / "upload" / "intent").unlink()
    c = broker(**{**cfg, "data_dir": str(clone)})
    mine = life_of(clone)
    assert mine != twin
    publish(c, 3, 3, make=lambda i, size: b"clone %d" % i)
    wait_until(lambda: uploaded(c) == 6, what="the clone's batch")
    fig = c.stats()["upload"]
    assert not fig["alarm"] and fig["permanent_errors"] == 0, fig
    got = names_and_payloads(landing)
    assert sorted(life_of_key(n) for n in got) == sorted([twin, mine]), got
    (name,) = [n for n in got if life_of_key(n) == mine]
    assert got[name] == [b"clone %d" % i for i in range(3, 6)]
    assert c.stop() == 0


@pytest.mark.parametrize("intent", [True, False], ids=["with-intent", "no-intent"])
def test_a_damaged_life_file_is_replaced_and_uploading_goes_on(broker, tmp_path, intent):
    """The life file holds no life id: it is replaced (a warning naming it) by the life id in
    the intent file's name when there is one (this log's), else by a new one; the next batch
    lands under the id the file now holds, no alarm."""
    b, landing, data, cfg = first_batch(broker, tmp_path, "the first batch")
    assert b.stop() == 0
    old = life_of(data)
    path = data / "log" / "life"
    path.write_text("XYZ\n")
    if not intent:
        (data / "upload" / "intent").unlink()
    b = broker(**cfg)
    how = f"{old}, the life id of the intent file's batch" if intent else "a new life id"
    assert b.wait_log(lambda ln: f"{path} holds b'XYZ\\n', not 8 lowercase hex digits: "
                      f"replaced by {how}" in ln, 5)
    publish(b, 3, 2)
    wait_until(lambda: uploaded(b) == 5, what="the second batch")
    life = life_of(data)
    assert (life == old) == intent and len(life) == 8 and int(life, 16) >= 0
    assert sorted(life_of_key(n) for n in landed(landing)) == sorted([old, life])
    assert not b.stats()["upload"]["alarm"]
    assert b.stop() == 0
