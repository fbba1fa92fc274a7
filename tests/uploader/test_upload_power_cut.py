"""A power cut between a put and its mark (tests/faults/powercut.c, tests/powercut.py: the
data directory is rebuilt as a power cut would leave it, with only what fsyncs made durable).
The batch file kept for the intent must survive it with the intent, so that a range
``retention_bytes`` deletes before the next upload is shipped again, not reported as a gap."""

from __future__ import annotations

import signal

import powercut

from .test_uploader import landed, landed_offsets, publish, upload_config, uploaded, wait_until

SPOOL = "upload/batch.ebb.zst.tmp"


def test_the_batch_file_kept_for_the_intent_survives_a_power_cut(broker, tmp_path, monkeypatch):
    """The object of offsets 0..9 is stored, the mark is not (its temporary name is a folder),
    and the power goes. The batch file was never fsynced: the rebuilt disk held the intent but
    an empty batch file, and once retention_bytes had deleted the range the uploader reported
    0..9 as a gap, stored as they are. Now the batch file is fsynced (and its folder) before
    the put: it is shipped again, same name, same bytes, and the gap is only what retention
    deleted after it."""
    landing = tmp_path / "landing"
    landing.mkdir()
    data = tmp_path / "data"
    (data / "log").mkdir(parents=True)
    (data / "upload").mkdir()
    shadow = tmp_path / "shadow"
    for name, value in powercut.environment(data, shadow).items():
        monkeypatch.setenv(name, value)
    upload = upload_config(landing, batch_max_age=1)
    b = broker(data_dir=str(data), log={"segment_bytes": 4096}, upload=upload)
    for name in ("LD_PRELOAD", "EB_POWER_DIR", "EB_POWER_SHADOW"):
        monkeypatch.delenv(name)
    (data / "log" / "uploaded.tmp").mkdir()
    publish(b, 0, 10)
    wait_until(lambda: list(landing.rglob("*.ebb.zst")), what="the object")
    assert b.wait_log(lambda line: "cannot write" in line and "uploaded" in line,
                      timeout=30), "the failed mark"
    (obj,) = landing.rglob("*.ebb.zst")
    before = obj.read_bytes()
    b.stop(signal.SIGKILL)

    after = tmp_path / "after"
    sizes = powercut.rebuild(data, shadow, after)
    (after / "log" / "uploaded.tmp").rmdir()
    assert sizes.get("upload/intent"), sizes
    assert sizes.get(SPOOL), f"the batch file did not survive the power cut: {sizes}"

    small = {"segment_bytes": 4096, "retention_bytes": 8192}
    b = broker(data_dir=str(after), log=small)        # no uploader: retention deletes 0..9
    publish(b, 10, 150)
    logdir = after / "log"
    wait_until(lambda: min(int(p.stem) for p in logdir.glob("*.seg")) > 10,
               what="the batch's segment deleted by retention_bytes")
    b.stop()
    first = min(int(p.stem) for p in logdir.glob("*.seg"))
    b = broker(data_dir=str(after), log=small, upload=upload)
    wait_until(lambda: uploaded(b) == 160, what="the rest uploaded")
    assert b.wait_log(lambda line: "shipping their batch file" in line, timeout=5)
    assert obj.read_bytes() == before, "the same object, the same bytes"
    gaps = [(h.gap_first, h.gap_length) for h, _ in landed(landing).values() if h.gap_length]
    assert gaps == [(10, first - 10)], gaps
    assert landed_offsets(landing) == list(range(10)) + list(range(first, 160))
    b.stop()
