"""The uploader thread of a real broker process shipping its log to a `dir` landing folder:
batches cut by size, by age and at segment ends; deterministic names; every record landed once
and none missing across SIGKILLs at several points; a permanent error keeps the data and raises
the alarm; the bandwidth cap; retention without an uploader."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from edgebroker.uploader.batch import object_name, read_batch_file
from edgebroker.uploader.life import life_of_key
from edgebroker.uploader.uploader import Stopped, Throttle

import mqttraw
from conftest import run_cli

GATEWAY = "gw-test"
TIMEOUT = 30.0


def upload_config(landing: Path, **kw) -> dict:
    return {"url": f"file://{landing}", "gateway_id": GATEWAY, **kw}


def payload(i: int, size: int = 100) -> bytes:
    return (b"m%06d-" % i).ljust(size, b"x")


def publish(b, first: int, n: int, size: int = 100, make=payload) -> None:
    """QoS 1 publishes ``first..first+n-1``, all PUBACKs received (the records are written)."""
    c = b.client(f"pub-{first}")
    frames = b"".join(mqttraw.publish(f"t/{i % 7}", make(i, size), qos=1, packet_id=1 + i % 60000)
                      for i in range(first, first + n))
    c.send(frames)
    for _ in range(n):
        c.expect(mqttraw.PUBACK, timeout=TIMEOUT)
    c.close()


def landed(landing: Path) -> dict[str, tuple]:
    """name relative to the landing folder -> (header, records) of every batch there."""
    return {str(p.relative_to(landing)): read_batch_file(str(p))
            for p in sorted(landing.rglob("*.ebb.zst"))}


def landed_offsets(landing: Path) -> list[int]:
    return sorted(r.offset for _, records in landed(landing).values() for r in records)


def wait_until(pred, timeout: float = TIMEOUT, what: str = "condition"):
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def uploaded(b) -> int:
    return b.stats()["upload"]["uploaded_offset"]


def check_exactly_once(landing: Path, n: int, make=payload, size: int = 100) -> None:
    offsets = landed_offsets(landing)
    assert offsets == list(range(n)), "every record once, none missing"
    lives = set()
    for name, (header, records) in landed(landing).items():
        lives.add(life_of_key(name))
        assert name == object_name("", GATEWAY, header.first_offset, header.last_offset,
                                   records[0].timestamp_ms, life_of_key(name))
        for r in records:
            assert r.payload == make(r.offset, size) and r.topic == b"t/%d" % (r.offset % 7)
    assert not [p for p in landing.rglob(".*.tmp")], "no temporary file left"
    assert len(lives) == 1 and None not in lives, f"one life id in every name: {lives}"


def life_of(data_dir) -> str:
    """The life id of the log in ``data_dir`` (its file, ``log/life``)."""
    return (Path(data_dir) / "log" / "life").read_text().strip()


def test_batches_cut_by_size_and_at_segment_ends(broker, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    b = broker(log={"segment_bytes": 32768},
               upload=upload_config(landing, batch_bytes=8192, batch_max_age=86400))
    publish(b, 0, 1000)   # ~140 bytes a record: 4 full segments and some
    segs = sorted(int(p.stem) for p in (Path(b.config["data_dir"]) / "log").glob("*.seg"))
    assert len(segs) >= 5
    tail = segs[-1]
    wait_until(lambda: uploaded(b) == tail, what="every sealed segment uploaded")
    assert landed_offsets(landing) == list(range(tail)), "the segment being written waits"
    ends = set(segs)
    for header, records in landed(landing).values():
        assert header.raw_length <= 8192
        base = max(s for s in segs if s <= header.first_offset)
        assert header.last_offset < min(s for s in segs + [1 << 62] if s > base), \
            "a batch never spans two segments"
        if header.last_offset + 1 not in ends:   # cut by size: the next record did not fit
            assert header.raw_length > 8192 - 200
    fig = b.stats()["upload"]
    assert fig["records"] == tail and fig["batches"] == len(landed(landing))
    assert fig["backlog_bytes"] > 0 and not fig["alarm"]
    assert fig["backlog_batches"] == -(-fig["backlog_bytes"] // 8192)
    b.stop()


def test_landed_objects_and_folders_are_readable_by_others_under_the_units_umask(broker,
                                                                                  tmp_path):
    """Under the shipped unit's UMask=0077 the objects came out 0600 and the folders 0700: the
    job reading the landing folder as another user could not read a batch."""
    landing = tmp_path / "landing"
    landing.mkdir()
    before = os.umask(0o077)                    # the broker process inherits it
    try:
        b = broker(log={"segment_bytes": 32768},
                   upload=upload_config(landing, batch_bytes=8192, batch_max_age=86400))
    finally:
        os.umask(before)
    publish(b, 0, 300)
    wait_until(lambda: uploaded(b) > 0, what="a batch uploaded")
    b.stop()
    # A batch being written is a hidden ``.<name>.<pid>-<random>.tmp`` (0600 until its fchmod,
    # the umask applies at its open): readers skip dot-files; the landed objects are the rest.
    objects = [p for p in landing.rglob("*") if p.is_file() and not p.name.startswith(".")]
    folders = [p for p in landing.rglob("*") if p.is_dir()]
    assert objects and folders
    assert {oct(p.stat().st_mode & 0o777) for p in objects} == {oct(0o644)}
    assert {oct(p.stat().st_mode & 0o777) for p in folders} == {oct(0o755)}


def test_batch_cut_by_age_and_deterministic_names(broker, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    b = broker(upload=upload_config(landing, batch_max_age=1), sys_interval=1)
    publish(b, 0, 5)
    wait_until(lambda: uploaded(b) == 5, what="the quiet segment sealed by age and uploaded")
    publish(b, 5, 3)
    wait_until(lambda: uploaded(b) == 8, what="the second batch")
    batches = landed(landing)
    assert [(h.first_offset, h.last_offset, h.record_count) for h, _ in batches.values()] == \
        [(0, 4, 5), (5, 7, 3)]
    day = time.strftime("%Y-%m-%d", time.gmtime(batches[sorted(batches)[0]][1][0].timestamp_ms / 1000))
    life = life_of(b.config["data_dir"])
    assert sorted(batches)[0] == f"gateway={GATEWAY}/date={day}/{0:020d}-{4:020d}-{life}.ebb.zst"
    check_exactly_once(landing, 8)
    fig = b.stats()["upload"]
    assert (fig["batches"], fig["records"], fig["backlog_bytes"], fig["retries"]) == (2, 8, 0, 0)
    assert fig["bytes"] == sum(p.stat().st_size for p in landing.rglob("*.ebb.zst"))
    live = run_cli("upload", "status", "--data-dir", b.config["data_dir"])
    assert live.returncode == 0 and "broker running" in live.stdout and "mark 8" in live.stdout
    # The same figures in $SYS (published every sys_interval, retained).
    watcher = b.client("sys-watcher")
    watcher.subscribe("$SYS/broker/upload/#")
    seen = {}
    deadline = time.monotonic() + 10
    want = {"batches": b"2", "records": b"8", "uploaded_offset": b"8", "alarm": b"0",
            "backlog_bytes": b"0", "last_error": b""}
    while time.monotonic() < deadline and any(seen.get(k) != v for k, v in want.items()):
        p = watcher.recv_publish(timeout=5)      # the retained ones first, then each interval's
        seen[p.topic.rsplit("/", 1)[1]] = p.payload
    assert {k: seen.get(k) for k in want} == want, seen
    b.stop()
    off = run_cli("upload", "status", "--data-dir", b.config["data_dir"])
    assert off.returncode == 0 and "uploaded up to offset 8" in off.stdout, off.stdout + off.stderr


def test_permanent_error_keeps_the_data_raises_the_alarm_and_lands_once_after_restart(
        broker, tmp_path):
    """The landing path is a file (a check that works as root): the batch is not written, the
    alarm is raised and logged once, the data stays; SIGKILL (the intent written, the object
    not) and a restart with the folder fixed land every record once."""
    landing = tmp_path / "landing"
    landing.write_text("not a folder")
    data = str(tmp_path / "data")
    cfg = dict(data_dir=data, upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    publish(b, 0, 20)
    wait_until(lambda: b.stats()["upload"]["alarm"], what="the alarm")
    fig = b.stats()["upload"]
    assert fig["uploaded_offset"] == 0 and fig["permanent_errors"] >= 1
    assert "not a folder" in fig["last_error"] and str(landing) in fig["last_error"]
    assert fig["backlog_bytes"] > 0
    assert sum("upload alarm" in line for line in b.logs) == 1
    assert (Path(data) / "upload" / "intent").exists()
    b.stop(signal.SIGKILL)
    landing.unlink()
    landing.mkdir()
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == 20, what="upload after the fix")
    check_exactly_once(landing, 20)
    b.stop()


@pytest.mark.parametrize("text", [
    '{"first": 1e400, "last": 19, "gap_first": 0, "gap_length": 0, "key": "k"}',
    '{"first": 0, "last": Infinity, "gap_first": 0, "gap_length": 0, "key": "k"}',
    '{"first": 0, "last": 19, "gap_first": 0, "gap_length": 1e30, "key": "k"}',
    '{"first": 0.5, "last": 19, "gap_first": 0, "gap_length": 0, "key": "k"}',
    '{"first": 0, "last": 19, "gap_first": 0, "gap_length": 0, "key": ["k"]}',
    '[0, 19]',
], ids=["1e400", "Infinity", "past-2^63", "fraction", "key-a-list", "list"])
def test_a_damaged_intent_is_unreadable_and_the_next_batch_is_cut_afresh(broker, tmp_path,
                                                                         text):
    """An intent file that parses as JSON but holds no batch (a number int() cannot take, a
    fraction, a key that is no string): logged as unreadable, ``upload status`` shows no
    batch in flight, and the broker starts and lands every record once. 1e400 raised
    OverflowError out of the start (exit 1 at every start) and out of ``upload status``."""
    landing = tmp_path / "landing"
    landing.mkdir()
    data = tmp_path / "data"
    b = broker(data_dir=str(data))
    publish(b, 0, 20)
    b.stop()
    intent = data / "upload" / "intent"
    intent.parent.mkdir()
    intent.write_text(text)
    status = run_cli("upload", "status", "--data-dir", str(data))
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert f"{intent}: unreadable (" in status.stderr and "in flight" not in status.stdout
    b = broker(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    assert b.wait_log(lambda ln: f"{intent}: unreadable (" in ln and "cut afresh" in ln, 5)
    wait_until(lambda: uploaded(b) == 20, what="the upload")
    check_exactly_once(landing, 20)
    assert b.stop() == 0


def test_sigkill_after_the_write_before_the_mark_rewrites_the_same_object(broker, tmp_path):
    """The mark cannot be written (its temporary name is a folder): the object is stored but the
    mark stays. After SIGKILL and a restart the same object is written again, same name, same
    bytes, and the mark moves on."""
    landing = tmp_path / "landing"
    landing.mkdir()
    data = tmp_path / "data"
    cfg = dict(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    (data / "log" / "uploaded.tmp").mkdir()
    publish(b, 0, 10)
    wait_until(lambda: list(landing.rglob("*.ebb.zst")), what="the object")
    mark = str(data / "log" / "uploaded")
    assert b.wait_log(lambda line: f"uploader: cannot write {mark}: Is a directory" in line,
                      timeout=TIMEOUT), "the failed mark"
    assert uploaded(b) == 0
    (obj,) = landing.rglob("*.ebb.zst")
    before = obj.read_bytes()
    b.stop(signal.SIGKILL)
    (data / "log" / "uploaded.tmp").rmdir()
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == 10, what="the mark after the restart")
    assert b.stats()["upload"]["batches"] == 1, "the batch was shipped again"
    assert obj.read_bytes() == before
    check_exactly_once(landing, 10)
    b.stop()


def test_a_batch_stored_before_a_crash_whose_records_retention_deleted_is_not_a_gap(
        broker, tmp_path):
    """The object is stored, the mark is not (its temporary name is a folder), SIGKILL. The
    broker then runs without an uploader and ``retention_bytes`` deletes the batch's segment.
    With the uploader back, the batch file kept for the intent is shipped again (same name,
    same bytes) and only the records deleted after it count as a gap."""
    landing = tmp_path / "landing"
    landing.mkdir()
    data = tmp_path / "data"
    log_cfg = {"segment_bytes": 4096}
    cfg = dict(data_dir=str(data), log=log_cfg, upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    (data / "log" / "uploaded.tmp").mkdir()
    publish(b, 0, 10)
    wait_until(lambda: list(landing.rglob("*.ebb.zst")), what="the object")
    (obj,) = landing.rglob("*.ebb.zst")
    before = obj.read_bytes()
    assert (data / "upload" / "intent").exists()
    publish(b, 10, 140)                            # about 20 KB: five segments more
    b.stop(signal.SIGKILL)
    (data / "log" / "uploaded.tmp").rmdir()
    small = {"segment_bytes": 4096, "retention_bytes": 8192}
    b = broker(data_dir=str(data), log=small)
    logdir = data / "log"
    wait_until(lambda: min(int(p.stem) for p in logdir.glob("*.seg")) > 10,
               what="the batch's segment deleted by retention_bytes")
    b.stop()
    first = min(int(p.stem) for p in logdir.glob("*.seg"))
    b = broker(**{**cfg, "log": small})
    wait_until(lambda: uploaded(b) == 150, what="the rest uploaded")
    assert obj.read_bytes() == before, "the same object, the same bytes"
    batches = landed(landing)
    gaps = [(h.gap_first, h.gap_length) for h, _ in batches.values() if h.gap_length]
    assert gaps == [(10, first - 10)], gaps
    assert b.stats()["upload"]["gap_offsets"] == first - 10
    assert b.wait_log(lambda line: "shipping their batch file" in line, timeout=5)
    assert landed_offsets(landing) == list(range(10)) + list(range(first, 150))
    b.stop()


def test_a_stored_batch_whose_segment_went_from_the_middle_of_the_log_is_not_a_gap(
        broker, tmp_path):
    """The object of offsets 10..19 is stored, the mark is not (its temporary name is a folder),
    SIGKILL; then their segment is deleted by hand, between segments the log keeps (the start
    reports the hole). The uploader warned "the log now holds -1..-1" and reported 10..19 as a
    gap, stored as they are; now it ships their kept batch file again (same name, same bytes)
    and no batch reports a gap."""
    landing = tmp_path / "landing"
    landing.mkdir()
    data = tmp_path / "data"
    cfg = dict(data_dir=str(data), log={"segment_bytes": 4096},
               upload=upload_config(landing, batch_max_age=1))
    b = broker(**cfg)
    publish(b, 0, 10)
    wait_until(lambda: uploaded(b) == 10, what="the first batch")
    (data / "log" / "uploaded.tmp").mkdir()
    publish(b, 10, 10)
    wait_until(lambda: len(list(landing.rglob("*.ebb.zst"))) == 2, what="the second object")
    assert b.wait_log(lambda line: "cannot write" in line and "uploaded" in line,
                      timeout=TIMEOUT), "the failed mark"
    intent = (data / "upload" / "intent").read_text()
    assert '"first": 10, "last": 19' in intent, intent
    obj = landing / json_key(intent)
    before = obj.read_bytes()
    publish(b, 20, 30)
    b.stop(signal.SIGKILL)
    (data / "log" / "uploaded.tmp").rmdir()
    middle = [p for p in (data / "log").iterdir() if p.stem == "%020d" % 10]
    assert any(p.suffix == ".seg" for p in middle), sorted((data / "log").iterdir())
    for p in middle:
        p.unlink()
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == 50, what="the rest uploaded")
    assert b.wait_log(lambda line: "offsets 10 to 19 are missing" in line, timeout=5)
    assert b.wait_log(lambda line: "shipping their batch file" in line, timeout=5)
    assert obj.read_bytes() == before, "the same object, the same bytes"
    assert not [h for h, _ in landed(landing).values() if h.gap_length]
    assert b.stats()["upload"]["gap_offsets"] == 0
    assert not [line for line in b.logs if "-1..-1" in line or "never uploaded" in line]
    assert landed_offsets(landing) == list(range(50))
    b.stop()


def json_key(intent_text: str) -> str:
    return json.loads(intent_text)["key"]


def kill_while_shipping(broker, cfg: dict, count_objects, rounds: int, seed: int,
                        most: int) -> int:
    """``rounds`` times: start a broker, publish 100 to ``most`` records, SIGKILL it once one
    to five more objects landed (somewhere in the cut, the put or the mark); then a last broker
    ships the rest. The number of records published."""
    rng = random.Random(seed)
    total = 0
    for _ in range(rounds):
        b = broker(**cfg)
        n = rng.randrange(100, most)
        publish(b, total, n)
        total += n
        target = count_objects() + rng.randrange(1, 6)
        wait_until(lambda: count_objects() >= target or uploaded(b) == total,
                   what="some batches landed")
        b.stop(signal.SIGKILL)
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == total, what="everything uploaded after the last restart")
    b.stop()
    return total


def test_sigkill_at_random_points_under_load_lands_every_record_once(broker, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    cfg = dict(data_dir=str(tmp_path / "data"), log={"segment_bytes": 16384},
               upload=upload_config(landing, batch_bytes=4096, batch_max_age=1))
    total = kill_while_shipping(broker, cfg, lambda: len(list(landing.rglob("*.ebb.zst"))),
                                rounds=5, seed=23, most=400)
    check_exactly_once(landing, total)


def test_bandwidth_cap_is_respected_on_average(broker, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    rate = 100_000
    b = broker(log={"segment_bytes": 1 << 20},
               upload=upload_config(landing, batch_bytes=65536, batch_max_age=1,
                                    upload_bandwidth=rate))
    noise = random.Random(5)
    blobs = {}

    def make(i: int, size: int) -> bytes:   # incompressible: the uplink carries ~all of it
        if i not in blobs:
            blobs[i] = (b"m%06d-" % i) + noise.randbytes(size - 8)
        return blobs[i]

    publish(b, 0, 600, size=1000, make=make)
    first = wait_until(lambda: sorted(landing.rglob("*.ebb.zst")), what="the first batch")
    t0 = time.monotonic()
    wait_until(lambda: uploaded(b) == 600, timeout=60, what="everything uploaded")
    elapsed = time.monotonic() - t0
    sizes = sum(p.stat().st_size for p in landing.rglob("*.ebb.zst"))
    after_first = sizes - first[0].stat().st_size
    # the bucket holds one second's worth at most: the rest goes at the rate, or slower
    assert elapsed >= (after_first - rate) / rate * 0.9, (elapsed, after_first)
    assert elapsed < after_first / rate * 3 + 10
    check_exactly_once(landing, 600, make=make, size=1000)
    b.stop()


def test_the_throttle_lets_a_burst_through_then_waits_out_the_debt():
    """uploader.Throttle over rates.TokenBucket: a second's worth goes at once, a request
    past it runs into debt, and the next one waits until the debt is repaid."""
    now = [0.0]
    waits = []
    throttle = Throttle(1000, lambda s: waits.append(s) or False, clock=lambda: now[0])
    throttle.take(1000)
    throttle.take(500)          # into debt: -500
    assert waits == []
    throttle.take(10)           # waits 0.5 s for the debt
    assert waits == [0.5]
    now[0] = 10.0               # long idle: back to one second's worth, no more
    throttle.take(1000)
    assert waits == [0.5]
    stopping = Throttle(1000, lambda s: True, clock=lambda: 0.0)
    stopping.take(2000)
    with pytest.raises(Stopped):
        stopping.take(1)        # the wait says the uploader is stopping
    Throttle(0, None).take(10**9)   # 0: no limit, never waits


def test_retention_by_age_applies_without_an_uploader(broker, tmp_path):
    b = broker(log={"segment_bytes": 4096, "retention_ms": 1000, "segment_ms": 1000})
    publish(b, 0, 100)
    # Retention keeps what the session snapshot on disk does not cover (a restart replays
    # it); a session change has one written within a second, not the 30 s of traffic.
    b.client("persistent", clean=False).subscribe("elsewhere")
    logdir = Path(b.config["data_dir"]) / "log"
    # Segments go as they come of age, one maintenance pass at a time (on a loaded machine
    # the 100 messages may span more than retention_ms): wait for the count, not one line.
    wait_until(lambda: len(list(logdir.glob("*.seg"))) < 100 * 140 // 4096,
               what="segments deleted by age")
    assert b.wait_log(lambda line: "(no uploader)" in line, timeout=5)
    assert "before it was uploaded" not in b.log_text()
    assert b.stats()["upload"] is None
    b.stop()


def test_a_log_written_before_format_version_2_is_uploaded_with_its_version(broker, tmp_path):
    """The upgrade: a data directory whose log is version 1 (tests/commitlog/golden/v1, 60
    records) under a broker that writes version 2. The old segments are shipped as batches
    saying log format 1, the records published since as batches saying 2; every record once."""
    golden = Path(__file__).resolve().parents[1] / "commitlog" / "golden" / "v1"
    data = tmp_path / "data"
    shutil.copytree(golden, data / "log")
    landing = tmp_path / "landing"
    landing.mkdir()
    b = broker(data_dir=str(data), upload=upload_config(landing, batch_max_age=1))
    publish(b, 60, 5)
    wait_until(lambda: uploaded(b) == 65, what="the old segments and the new one uploaded")
    versions = {}
    for header, records in landed(landing).values():
        for r in records:
            versions[r.offset] = header.log_format_version
    assert versions == {i: 1 if i < 60 else 2 for i in range(65)}
    assert [r.payload for _, records in landed(landing).values() for r in records
            if r.offset >= 60] == [payload(i) for i in range(60, 65)]
    b.stop()


def test_the_state_shown_after_a_resume_is_not_paused_before_the_thread_runs():
    """``upload resume`` answers with the figures at once: the uploader's thread may not have
    run since, its state still "paused"; the figures say "idle" then (not "paused" next to
    "paused": false)."""
    from types import SimpleNamespace

    from edgebroker.uploader.figures import state_of
    shown = {(paused, state): state_of(SimpleNamespace(paused=paused, state=state))
             for paused in (True, False) for state in ("paused", "uploading", "idle", "alarm")}
    assert shown == {(True, "paused"): "paused", (True, "uploading"): "uploading",
                     (True, "idle"): "paused", (True, "alarm"): "paused",
                     (False, "paused"): "idle", (False, "uploading"): "uploading",
                     (False, "idle"): "idle", (False, "alarm"): "alarm"}
