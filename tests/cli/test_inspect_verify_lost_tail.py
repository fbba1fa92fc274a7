"""Records lost from the end of the log after they were on disk (the last segment truncated or
deleted after a clean stop): the broker's start warns that the recovery point is past the end
and counts the offsets as log_gap, but `inspect verify` said OK and exited 0, as it read only
the segments. It reports each offset file past the end (the offsets, the file, its value) and
exits 1, and notes a session snapshot taken past the end (which a power cut also leaves)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mqttraw as m
from commitlog.logutil import append_n, open_log, segment_files
from conftest import run_cli

N = 50
PAST = "is past the end of the commit log"


def _verify(data: Path, *fmt) -> tuple[int, str]:
    r = run_cli("inspect", "verify", "--data-dir", str(data), *fmt, timeout=60)
    return r.returncode, r.stdout


def _stopped_broker_with_a_session(broker, uid) -> Path:
    """A broker stopped cleanly after N QoS 1 messages for an offline persistent session:
    its data directory (recovery point and snapshot both at N)."""
    b = broker()
    sub = b.client(f"{uid}-sub", clean=False)
    sub.subscribe(f"{uid}/#", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-pub")
    pub.send(b"".join(m.publish(f"{uid}/x", b"%d" % i, qos=1, packet_id=1 + i)
                      for i in range(N)))
    for _ in range(N):
        pub.expect(m.PUBACK, 10)
    pub.disconnect()
    assert b.stop() == 0, b.log_text()
    data = Path(b.config["data_dir"])
    assert json.loads((data / "log" / "recovery-point").read_text()) == {"recovery_point": N}
    assert json.loads((data / "sessions.json").read_text())["log_next_offset"] == N
    return data


def _truncate_the_last_segment(data: Path) -> tuple[Path, int]:
    """Cut the last segment to its header: (the file, its base offset)."""
    last = segment_files(data / "log")[-1]
    os.truncate(last, 32)
    return last, int(last.name[:20])


def test_verify_reports_fsynced_records_gone_from_the_end_as_the_start_does(broker, uid):
    data = _stopped_broker_with_a_session(broker, uid)
    last, base = _truncate_the_last_segment(data)
    rp = data / "log" / "recovery-point"
    rc, out = _verify(data)
    assert rc == 1, out
    lines = out.splitlines()
    assert (f"LOST   offsets {base} to {N - 1}: {rp} ({N}) says they were fsynced, but the log "
            f"ends at {base} (in {last};") in out, out
    assert any(ln.startswith(f"note   offsets {base} to {N - 1}: the session snapshot "
                             f"{data / 'sessions.json'} was taken at log offset {N}")
               for ln in lines), out
    assert lines[-1].endswith(f"DAMAGED: offsets {base} to {N - 1} lost from the end of the "
                              f"log"), out
    rc, out = _verify(data, "--format", "json")
    js = json.loads(out)
    assert rc == 1 and js["ok"] is False
    assert js["past_end"] == [{"file": str(rp), "value": N, "says": "fsynced",
                               "from_offset": base, "to_offset": N - 1,
                               "log_ends_in": str(last)}]
    assert js["snapshot_past_end"] == {"file": str(data / "sessions.json"),
                                       "log_next_offset": N, "from_offset": base,
                                       "to_offset": N - 1}
    # The broker's start names the same offsets and the same file.
    b = broker(data_dir=str(data))
    assert any(f"{rp}: {N} {PAST}" in ln and f"records {base} to {N - 1} " in ln
               for ln in b.logs), b.log_text()


def test_a_snapshot_past_the_end_alone_is_a_note(broker, uid):
    """What a power cut leaves: the recovery point at the last segment's base (the segments
    before it fsynced), the snapshot past the records that reached the disk. The log is
    consistent (docs/persistence.md: verify passes); the offsets are named all the same."""
    data = _stopped_broker_with_a_session(broker, uid)
    _, base = _truncate_the_last_segment(data)
    (data / "log" / "recovery-point").write_text(json.dumps({"recovery_point": base}))
    rc, out = _verify(data)
    assert rc == 0, out
    assert f"note   offsets {base} to {N - 1}: the session snapshot" in out, out
    assert "LOST" not in out and out.rstrip().endswith(": OK"), out
    js = json.loads(_verify(data, "--format", "json")[1])
    assert js["ok"] is True and js["past_end"] == []
    assert js["snapshot_past_end"]["to_offset"] == N - 1


def test_verify_reports_uploaded_records_gone_from_the_end(tmp_path):
    data = tmp_path / "data"
    log = open_log(data / "log", segment_bytes=4096)
    append_n(log, 200)
    log.write_pending()
    log.mark_uploaded(200)
    log.close()
    last = segment_files(data / "log")[-1]
    base = int(last.name[:20])
    last.unlink()
    last.with_suffix(".idx").unlink()
    before = segment_files(data / "log")[-1]
    rc, out = _verify(data)
    assert rc == 1, out
    assert (f"LOST   offsets {base} to 199: {data / 'log' / 'uploaded'} (200) says they were "
            f"uploaded, but the log ends at {base} (in {before};") in out, out
    assert "gives new records offsets from 200: sessions count these as log_gap" in out, out
    js = json.loads(_verify(data, "--format", "json")[1])
    assert {(e["file"], e["says"], e["from_offset"], e["to_offset"]) for e in js["past_end"]} \
        == {(str(data / "log" / "recovery-point"), "fsynced", base, 199),
            (str(data / "log" / "uploaded"), "uploaded", base, 199)}
    assert js["snapshot_past_end"] is None
