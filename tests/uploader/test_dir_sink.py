"""The `dir` sink never replaces an object: two gateways with one gateway_id and one data
directory (a cloned image: /etc/machine-id, the default id, and the log with its life id)
shipping to one landing folder get the alarm, as the s3 sink's conditional put gives it, and
the first one's object stays; the same bytes, or the same records compressed otherwise, under
the name already there are a success."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import zstandard

from edgebroker.uploader.batch import read_batch_file, read_header_file, records_id
from edgebroker.uploader.sinks import DirSink, PermanentSinkError

from .test_uploader import (
    landed_offsets, payload, publish, upload_config, uploaded, wait_until,
)

GOLDEN = Path(__file__).parent / "golden"


def test_two_gateways_with_one_id_and_a_cloned_data_dir_the_second_gets_the_alarm(
        broker, tmp_path):
    """B's data directory is a copy of A's, taken after A's first start (its log and life id):
    the same names for other records. The first object stays."""
    landing = tmp_path / "landing"
    landing.mkdir()
    cfg = upload_config(landing, batch_max_age=1)
    a = broker(data_dir=str(tmp_path / "a"), upload=cfg)
    assert a.stop() == 0
    assert (tmp_path / "a" / "log" / "life").exists()
    shutil.copytree(tmp_path / "a", tmp_path / "b")      # the cloned image
    a = broker(data_dir=str(tmp_path / "a"), upload=cfg)
    publish(a, 0, 5)
    wait_until(lambda: uploaded(a) == 5, what="A's batch")
    (obj,) = landing.rglob("*.ebb.zst")
    before = obj.read_bytes()
    b = broker(data_dir=str(tmp_path / "b"), upload=cfg)
    publish(b, 0, 5, make=lambda i, size: b"other %d" % i)
    wait_until(lambda: b.stats()["upload"]["alarm"], what="B's alarm")
    fig = b.stats()["upload"]
    assert fig["uploaded_offset"] == 0 and fig["permanent_errors"] >= 1
    assert ("already exists with other bytes (another gateway with the same gateway_id and a "
            "copy of this data directory: a cloned image?)") in fig["last_error"], \
        fig["last_error"]
    assert str(obj) in fig["last_error"]
    assert obj.read_bytes() == before, "A's object is not replaced"
    assert [r.payload for r in read_batch_file(str(obj))[1]] == [payload(i) for i in range(5)]
    assert not list(landing.rglob(".*.tmp")), "no temporary file left"
    assert sum("upload alarm" in line for line in b.logs) == 1
    assert not a.stats()["upload"]["alarm"]


def test_the_same_bytes_or_records_again_are_a_success_other_bytes_are_refused(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    sink = DirSink(str(landing))
    golden = GOLDEN / "v1-plain.ebb.zst"
    ident = records_id(read_header_file(str(golden)))
    key = "gateway=g/date=2023-11-14/0-9.ebb.zst"
    size = golden.stat().st_size
    sink.put(key, str(golden), size, lambda n: None, ident)
    sink.put(key, str(golden), size, lambda n: None, ident)        # a retry: the same bytes
    other = tmp_path / "recompressed.ebb.zst"                       # another zstd release
    other.write_bytes(zstandard.ZstdCompressor(level=19).compress(
        zstandard.ZstdDecompressor().decompress(golden.read_bytes())))
    assert other.read_bytes() != golden.read_bytes()
    sink.put(key, str(other), other.stat().st_size, lambda n: None, ident)
    with pytest.raises(PermanentSinkError, match="already exists with other bytes"):
        sink.put(key, str(other), other.stat().st_size, lambda n: None, "0-9-1-00000000")
    assert (landing / key).read_bytes() == golden.read_bytes()
    assert sorted(p.name for p in landing.rglob("*")) == ["0-9.ebb.zst", "date=2023-11-14",
                                                         "gateway=g"]


def test_a_torn_copy_under_the_batch_name_is_replaced_by_the_whole_batch(broker, tmp_path):
    """Half of the batch file under its name in the landing folder (a partial copy): its
    header reads, but it is no whole batch; the put replaces it (one warning) and every
    record lands, readable."""
    landing = tmp_path / "landing"          # missing for now: retried as not mounted yet
    data = tmp_path / "data"
    b = broker(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    publish(b, 0, 2000, size=200, make=lambda i, size: os.urandom(size))
    assert b.wait_log(lambda line: "the landing folder does not exist" in line, timeout=30)
    intent = json.loads((data / "upload" / "intent").read_text())
    whole = (data / "upload" / "batch.ebb.zst.tmp").read_bytes()
    torn = landing / intent["key"]
    torn.parent.mkdir(parents=True)
    torn.write_bytes(whole[:len(whole) // 2])
    read_header_file(str(torn))             # the header alone reads
    b.admin("upload_resume")                # ends the back-off
    wait_until(lambda: uploaded(b) == 2000, what="everything uploaded")
    assert torn.read_bytes() == whole
    assert landed_offsets(landing) == list(range(2000))
    said = [line for line in b.logs if "is no whole batch" in line]
    assert len(said) == 1 and str(torn) in said[0] and "ends inside its frame" in said[0]
    assert not b.stats()["upload"]["alarm"]
    b.stop()


def test_a_fifo_at_the_batch_name_is_the_alarm_not_a_hang(broker, tmp_path):
    """A FIFO under the batch's name in the landing folder: the put opened it to compare it
    with the batch and waited for good (no error, no alarm, and the stop took 10 s). Now it is
    never opened: a permanent error naming it (the alarm, counted, logged once); once it is
    removed, resume lands the batch."""
    landing = tmp_path / "landing"          # missing for now: retried as not mounted yet
    data = tmp_path / "data"
    b = broker(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    publish(b, 0, 3)
    assert b.wait_log(lambda line: "the landing folder does not exist" in line, timeout=30)
    fifo = landing / json.loads((data / "upload" / "intent").read_text())["key"]
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    b.admin("upload_resume")                # ends the back-off
    wait_until(lambda: b.stats()["upload"]["alarm"], what="the alarm")
    fig = b.stats()["upload"]
    assert fig["permanent_errors"] >= 1 and fig["uploaded_offset"] == 0, fig
    assert f"{fifo} is not a regular file (a FIFO) at the batch's name" in fig["last_error"]
    assert sum("upload alarm" in line for line in b.logs) == 1
    fifo.unlink()
    b.admin("upload_resume")
    wait_until(lambda: uploaded(b) == 3, what="the batch uploaded")
    assert landed_offsets(landing) == [0, 1, 2]
    b.stop()
    assert not [line for line in b.logs if "did not stop" in line]


def test_a_record_damaged_inside_a_shipped_batch_before_its_mark_is_not_an_alarm(broker,
                                                                                  tmp_path):
    """The batch 0..19 was stored but the broker stopped before its mark (the mark's file still
    says 0), and at the restart record 10 in its segment reads as damaged: the range cut again
    has the same first and last offsets, so the same object name, but fewer records. The batch
    file built before (all 20 records, the landed bytes) is shipped again instead, a success;
    no "already exists with other bytes" alarm, and the mark moves on."""
    landing = tmp_path / "landing"
    landing.mkdir()
    data = tmp_path / "data"
    cfg = dict(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    publish(b, 0, 20)
    wait_until(lambda: uploaded(b) == 20, what="the batch")
    assert b.stop() == 0
    (obj,) = landing.rglob("*.ebb.zst")
    before = obj.read_bytes()
    intent = json.loads((data / "upload" / "intent").read_text())
    assert (intent["first"], intent["last"]) == (0, 19)
    (data / "log" / "uploaded").write_text('{"uploaded_offset": 0}\n')   # the mark not written
    (segment,) = [p for p in (data / "log").glob("*.seg") if payload(10) in p.read_bytes()]
    raw = bytearray(segment.read_bytes())
    at = raw.index(payload(10))
    raw[at] ^= 0xFF                          # record 10's CRC no longer matches
    segment.write_bytes(bytes(raw))
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == 20, what="the mark moved on")
    assert b.wait_log(lambda line: "shipping their batch file" in line, timeout=5)
    fig = b.stats()["upload"]
    assert not fig["alarm"] and fig["permanent_errors"] == 0, fig
    assert obj.read_bytes() == before and landed_offsets(landing) == list(range(20))
    assert b.stop() == 0
