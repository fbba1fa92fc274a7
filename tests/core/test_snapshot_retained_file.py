"""Retained messages' payloads in a side file next to the session snapshot (format 3,
core.retained_side). The snapshot kept each payload base64 in its one JSON document, cached
that encoding on each message for the next snapshots and joined it all into one bytes object:
a broker holding 15,000 retained 16 KiB messages went from 291 MB to 911 MB during a snapshot.
Now the payloads are streamed into ``retained-<N>.bin``, which a snapshot that changed sessions
only names again; a damaged side file costs the retained messages it held, not the sessions;
format 2 snapshots (payloads in the document) still load."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
from pathlib import Path

import pytest

import mqttraw5 as R
from conftest import _open_clients, run_cli, wait_for_snapshot
from mqttraw import publish

pytestmark = pytest.mark.timeout(120)

BINARY = bytes(range(256)) * 3 + b"\x00" * 100 + b"\xff\x00end"
PROPS = {R.CONTENT_TYPE: "application/x-bin", R.CORRELATION_DATA: b"\x00\x01\x02",
         R.USER_PROPERTY: [("k", "v"), ("k2", "\u00e9")]}


def raw5(b, client_id, **kw) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    c.connack = c.connect(client_id, **kw)
    assert c.connack.reason == 0, c.connack
    return c


def side_files(data_dir) -> list[str]:
    return sorted(n for n in os.listdir(data_dir) if re.fullmatch(r"retained-\d+\.bin", n))


def snapshot_of(b, client_id: str) -> dict:
    """The snapshot once it lists the persistent session ``client_id``, made here (a
    subscription: a snapshot within a second)."""
    raw5(b, client_id, clean_start=False, props={R.SESSION_EXPIRY: 3600}).subscribe(
        "none/yet", qos=1)
    return wait_for_snapshot(b.config["data_dir"], client_id)


def publish_kept(b, uid) -> None:
    pub = raw5(b, f"{uid}-p")
    pub.publish(f"{uid}/bin", BINARY, qos=1, retain=True)
    pub.publish(f"{uid}/props", b"\x00with props\x00", qos=1, retain=True, props=PROPS)
    pub.publish(f"{uid}/expires", b"for an hour", qos=1, retain=True,
                props={R.MESSAGE_EXPIRY: 3600})
    pub.publish(f"{uid}/cleared", b"soon gone", qos=1, retain=True)
    pub.publish(f"{uid}/cleared", b"", qos=1, retain=True)   # an empty payload clears it


def check_kept(b, uid) -> None:
    c = raw5(b, f"{uid}-c")
    c.subscribe(f"{uid}/#", qos=1)
    got = {}
    for p in [c.wait_for(lambda p: p.type == R.PUBLISH) for _ in range(3)]:
        got[p.topic] = p
        c.ack(p)
    assert c.ping() == [], "a cleared retained message came back"
    assert sorted(got) == [f"{uid}/bin", f"{uid}/expires", f"{uid}/props"]
    assert got[f"{uid}/bin"].payload == BINARY and got[f"{uid}/bin"].retain
    props = got[f"{uid}/props"]
    assert props.payload == b"\x00with props\x00"
    assert {k: props.properties.get(k) for k in PROPS} == PROPS, props.properties
    expires = got[f"{uid}/expires"]
    assert expires.payload == b"for an hour"
    assert 3000 < expires.properties[R.MESSAGE_EXPIRY] <= 3600, expires.properties


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["crash", "stop"])
def test_retained_payloads_survive_byte_exact_in_the_side_file(broker, uid, sig):
    b = broker()
    data_dir = b.config["data_dir"]
    publish_kept(b, uid)
    doc = snapshot_of(b, f"{uid}-s")
    assert doc["format"] == 3
    name, size, _ = doc["retained_file"]
    assert side_files(data_dir) == [name] and os.path.getsize(Path(data_dir, name)) == size
    mine = [r for r in doc["retained"] if r["topic"].startswith(f"{uid}/")]
    assert len(mine) == 3 and not any("payload" in r for r in mine), mine
    assert b.stop(sig) == (0 if sig == signal.SIGTERM else -sig)
    again = broker(data_dir=data_dir)
    check_kept(again, uid)
    # Restored, then written again by this run (a new side file, the old one deleted): read
    # back once more after a crash.
    doc = snapshot_of(again, f"{uid}-s2")
    assert side_files(data_dir) == [doc["retained_file"][0]] != [name]
    assert again.stop(signal.SIGKILL) == -signal.SIGKILL
    check_kept(broker(data_dir=data_dir), uid)


def test_the_side_file_is_kept_while_only_sessions_change(broker, uid):
    b = broker()
    data_dir = b.config["data_dir"]
    publish_kept(b, uid)
    first = snapshot_of(b, f"{uid}-s1")["retained_file"]
    path = Path(data_dir, first[0])
    st = os.stat(path)
    second = snapshot_of(b, f"{uid}-s2")["retained_file"]    # sessions only
    assert second == first
    again = os.stat(path)
    assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    kept = path.read_bytes()
    raw5(b, f"{uid}-p2").publish(f"{uid}/bin", b"replaced", qos=1, retain=True)
    # A change is appended to the same file (test_snapshot_retained_append), what it held
    # left as it was.
    third = snapshot_of(b, f"{uid}-s3")["retained_file"]
    assert third[:2] == [first[0], first[1] + len(b"replaced")]
    assert side_files(data_dir) == [first[0]] and path.read_bytes()[:first[1]] == kept
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL
    c = raw5(broker(data_dir=data_dir), f"{uid}-c")
    c.subscribe(f"{uid}/bin", qos=1)
    assert c.wait_for(lambda p: p.type == R.PUBLISH).payload == b"replaced"


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as fh:
        rows = [line.split() for line in fh if line.startswith(("VmRSS:", "VmHWM:"))]
    return {row[0].rstrip(":"): int(row[1]) * 1024 for row in rows}


N, SIZE = 3000, 16 << 10


def test_a_snapshot_costs_no_copy_of_the_retained_payloads(broker, uid):
    """3,000 retained 16 KiB messages (48 MB): the broker's peak memory across a snapshot grows
    by less than half of that (it took about 2.5 times it: base64 copies cached, then joined)."""
    b = broker()
    data_dir = b.config["data_dir"]
    pub = b.client(f"{uid}-p")
    for first in range(0, N, 100):      # 100 at a time, each batch answered before the next
        pub.send(b"".join(publish(f"{uid}/r/{i}", i.to_bytes(4, "big") * (SIZE // 4),
                                  retain=True) for i in range(first, first + 100)))
        assert pub.ping(timeout=10) == []
    before = _status(b.proc.pid)["VmRSS"]
    for k in range(2):                  # the first writes the side file, the second keeps it
        doc = snapshot_of(b, f"{uid}-s{k}")
        assert sum(r["topic"].startswith(f"{uid}/r/") for r in doc["retained"]) == N
    grew = _status(b.proc.pid)["VmHWM"] - before
    print(f"VmRSS before the snapshots {before >> 20} MiB, peak growth {grew >> 20} MiB")
    assert grew < N * SIZE // 2, f"a snapshot took {grew >> 20} MiB more ({N * SIZE >> 20} MiB held)"
    assert b.stop() == 0
    # Read back by position: the start holds no second copy of them all for a while.
    again = broker(data_dir=data_dir)
    status = _status(again.proc.pid)
    print(f"restarted: VmRSS {status['VmRSS'] >> 20} MiB, VmHWM {status['VmHWM'] >> 20} MiB")
    assert status["VmHWM"] - status["VmRSS"] < N * SIZE // 2, status
    c = again.client(f"{uid}-c")
    c.subscribe(f"{uid}/r/2999", qos=1)
    assert c.recv_publish().payload == (2999).to_bytes(4, "big") * (SIZE // 4)


def _stopped_with_a_side_file(broker, uid):
    """A stopped broker's state directory holding a persistent session and retained messages:
    (data_dir, the side file's path)."""
    b = broker()
    publish_kept(b, uid)
    name = snapshot_of(b, f"{uid}-s")["retained_file"][0]
    assert b.stop() == 0
    data_dir = b.config["data_dir"]
    return data_dir, Path(data_dir, name)


def _cut(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 10)


def _flipped(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF             # (inside a payload: the lengths still match)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, said", [
    (_cut, r"damaged \(cut off: \d+ bytes, .*sessions.json says \d+\)"),
    (_flipped, r"damaged \(its CRC-32 is [0-9a-f]{8}, .*sessions.json says [0-9a-f]{8}\)"),
    (os.unlink, r"missing \(it holds the retained messages of .*sessions.json\)"),
], ids=["cut-off", "changed", "missing"])
def test_a_damaged_side_file_costs_only_the_retained_messages(broker, uid, damage, said):
    """An error naming the side file and what is wrong; the side file moved aside, the
    sessions restored (a damaged side file must not cost the persistent sessions' cursors),
    and the broker starts without the snapshot's retained messages."""
    data_dir, side = _stopped_with_a_side_file(broker, uid)
    assert _verify(data_dir)[0] == 0
    damage(side)
    kept = side.read_bytes() if side.exists() else None
    # inspect verify names it as the start will, and changes nothing
    rc, out = _verify(data_dir)
    assert rc == 1, out
    line = next(ln for ln in out.splitlines() if ln.startswith("DAMAGE"))
    assert re.search(re.escape(f"DAMAGE {side}: ") + said, line), out
    assert line.endswith("; the broker's next start moves it aside and starts without the 3 "
                         "retained messages the snapshot holds (its sessions are restored)"), line
    assert out.rstrip().endswith("DAMAGED: the session snapshot damaged"), out
    rc, out = _verify(data_dir, "--format", "json")
    js = json.loads(out)
    assert rc == 1 and js["ok"] is False and js["snapshot_damage"]["file"] == str(side)
    assert js["snapshot_damage"]["loses"] == "retained" and js["snapshot_damage"]["retained"] == 3
    assert (side.read_bytes() if side.exists() else None) == kept
    b = broker(data_dir=data_dir)
    line = b.wait_log(lambda ln: "ERROR" in ln and str(side) in ln)
    assert line and re.search(re.escape(f"{side}: ") + said, line), b.log_text()
    moved = f"moved it to {side}.damaged and " if kept is not None else ""
    assert f"; {moved}starting without the 3 retained messages the snapshot held (its " \
           f"sessions are restored)" in line, line
    assert not side.exists() and os.path.exists(f"{data_dir}/sessions.json")
    if kept is not None:
        assert Path(f"{side}.damaged").read_bytes() == kept
    assert raw5(b, f"{uid}-s", clean_start=False).connack.session_present
    c = raw5(b, f"{uid}-c")
    c.subscribe(f"{uid}/#", qos=1)
    assert c.ping() == [], "a retained message of the damaged side file was served"


def _verify(data_dir, *fmt) -> tuple[int, str]:
    r = run_cli("inspect", "verify", "--data-dir", str(data_dir), *fmt, timeout=60)
    return r.returncode, r.stdout


def test_verify_names_a_damaged_snapshot_document(broker, uid):
    data_dir, _ = _stopped_with_a_side_file(broker, uid)
    doc = Path(data_dir, "sessions.json")
    head = json.loads(doc.read_bytes())
    head["retained_file"][1] += 5     # the side file is shorter than the document says
    doc.write_text(json.dumps(head))
    rc, out = _verify(data_dir)
    assert rc == 1 and "DAMAGE " in out and "cut off" in out, out
    head["retained_file"][1] -= 5
    doc.write_text(json.dumps(head)[:-20])
    rc, out = _verify(data_dir)
    assert rc == 1, out
    assert f"DAMAGE {doc}: damaged snapshot (" in out, out
    assert "; the broker's next start moves it aside and starts without sessions or retained " \
           "messages" in out, out
    js = json.loads(_verify(data_dir, "--format", "json")[1])
    assert js["snapshot_damage"]["file"] == str(doc) and js["snapshot_damage"]["loses"] == "sessions"


def test_a_side_file_the_broker_may_not_read_refuses_the_start(broker, uid):
    """As a sessions.json it may not read: no damage, nothing moved, the start refused."""
    from conftest import without_root_file_access
    data_dir, side = _stopped_with_a_side_file(broker, uid)
    os.chmod(side, 0)
    refused = broker(data_dir=data_dir, wait=False,
                     wrap=lambda cmd: without_root_file_access() + cmd)
    assert refused.proc.wait(15) == 1
    refused.stopped = True
    assert refused.wait_log(lambda ln: f"{side}: cannot read: Permission denied; nothing was "
                                       f"changed" in ln), refused.log_text()
    assert side.exists() and os.path.exists(f"{data_dir}/sessions.json")
    os.chmod(side, 0o600)
    check_kept(broker(data_dir=data_dir), uid)


def test_a_format_2_snapshot_with_payloads_in_the_document_is_restored(broker, uid, tmp_path):
    """Written by an older edgebroker: retained payloads (and properties) base64 in the
    document. Restored, then written as format 3 with a side file."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    content_type = b"\x03\x00\x09text/x-ab"       # Content Type "text/x-ab"
    doc = {"format": 2, "written_ms": 1_700_000_000_000, "log_next_offset": 0,
           "sessions": [{"client_id": f"{uid}-s", "subscriptions": [[f"{uid}/t", 1]],
                         "inflight": [], "queue": [], "awaiting_release": [], "next_id": 0,
                         "cursor": None, "since": [], "offline": [], "drops": {},
                         "offline_ms": None}],
           "retained": [{"topic": f"{uid}/bin", "qos": 1, "offset": None,
                         "payload": base64.b64encode(BINARY).decode()},
                        {"topic": f"{uid}/props", "qos": 0, "offset": None,
                         "payload": base64.b64encode(b"\x00p\x00").decode(),
                         "properties": base64.b64encode(content_type).decode(),
                         "client_id": f"{uid}-p"}]}
    (data_dir / "sessions.json").write_text(json.dumps(doc))
    b = broker(data_dir=str(data_dir))
    assert b.wait_log("restored 1 persistent sessions and 2 retained messages")
    c = raw5(b, f"{uid}-c")
    c.subscribe(f"{uid}/#", qos=1)
    got = {p.topic: p for p in [c.wait_for(lambda p: p.type == R.PUBLISH) for _ in range(2)]}
    assert got[f"{uid}/bin"].payload == BINARY
    assert (got[f"{uid}/props"].payload, got[f"{uid}/props"].properties[R.CONTENT_TYPE]) == \
        (b"\x00p\x00", "text/x-ab")
    new = snapshot_of(b, f"{uid}-s2")
    assert new["format"] == 3 and side_files(data_dir) == [new["retained_file"][0]]
    s = b.raw()
    assert s.connect(f"{uid}-s", clean=False).session_present
