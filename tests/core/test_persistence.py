"""What survives a restart or a crash: persistent sessions, queues, windows, retained messages,
and every acknowledged message (it is in the commit log before its PUBACK)."""

import glob
import json
import signal
import subprocess
import sys
import threading
import time

import pytest

import mqttraw as m
from mqttraw import PUBACK, PUBCOMP, PUBLISH, PUBREC, publish
from conftest import wait_for_snapshot


def restart(broker, b, sig=signal.SIGTERM, **overrides):
    """Stop ``b`` (SIGTERM: clean; SIGKILL: a crash) and start a new broker on its data dir."""
    rc = b.stop(sig)
    assert rc == (0 if sig == signal.SIGTERM else -sig)
    return broker(data_dir=b.config["data_dir"], **overrides)




def test_persistent_session_and_its_queue_survive_a_restart(broker, uid):
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(5):
        pub.publish(f"{uid}/t", f"m{i}", qos=1)
    b2 = restart(broker, b)
    again = b2.client(f"{uid}-s", clean=False)
    assert again.connack.session_present
    got = [again.recv_publish() for _ in range(5)]
    assert [p.payload for p in got] == [f"m{i}".encode() for i in range(5)]
    assert all(p.qos == 1 and not p.retain for p in got)
    # The subscription itself survived: new messages arrive too.
    b2.client(f"{uid}-p2").publish(f"{uid}/t", b"after", qos=1)
    assert again.recv_publish().payload == b"after"


def test_clean_sessions_are_not_restored(broker, uid):
    b = broker()
    c = b.client(f"{uid}-c", clean=True)
    c.subscribe(f"{uid}/t", qos=1)
    c.disconnect()
    b2 = restart(broker, b)
    assert not b2.client(f"{uid}-c", clean=False).connack.session_present


def test_retained_messages_survive_a_restart(broker, uid):
    b = broker()
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/keep", b"kept", qos=1, retain=True)
    pub.publish(f"{uid}/gone", b"x", qos=1, retain=True)
    pub.publish(f"{uid}/gone", b"", qos=1, retain=True)  # cleared
    b2 = restart(broker, b)
    c = b2.client(f"{uid}-s")
    c.subscribe(f"{uid}/#", qos=1)
    p = c.recv_publish()
    assert (p.topic, p.payload, p.retain) == (f"{uid}/keep", b"kept", True)
    assert c.ping() == [], "a cleared retained message came back"


def test_retained_churn_is_saved_soon_and_whole(broker, uid):
    """Retained messages set and cleared on thousands of new topics (more than the broker
    lists between snapshots: it then saves the whole store, soon, not at the 30 s snapshot):
    the snapshot holds exactly the messages stored, and a crash right after keeps them and
    brings back none cleared."""
    b = broker()
    data_dir = b.config["data_dir"]
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/old", b"o", qos=1, retain=True)
    pub.publish(f"{uid}/gone", b"g", qos=1, retain=True)
    b.client(f"{uid}-s", clean=False).subscribe(f"{uid}/x", qos=1)   # a snapshot now
    doc = wait_for_snapshot(data_dir, f"{uid}-s")
    mine = lambda doc: sorted(r["topic"] for r in doc["retained"])   # noqa: E731
    assert mine(doc) == [f"{uid}/gone", f"{uid}/old"]
    pub.send(b"".join(publish(f"{uid}/churn/{i}", b"v", retain=True)
                      + publish(f"{uid}/churn/{i}", b"", retain=True) for i in range(5000)))
    pub.publish(f"{uid}/new", b"n", qos=1, retain=True)
    pub.publish(f"{uid}/gone", b"", qos=1, retain=True)
    pause, deadline = threading.Event(), time.monotonic() + 10
    while mine(doc) != [f"{uid}/new", f"{uid}/old"] and time.monotonic() < deadline:
        pause.wait(0.05)
        with open(f"{data_dir}/sessions.json") as fh:
            doc = json.load(fh)
    assert mine(doc) == [f"{uid}/new", f"{uid}/old"], "no snapshot of the churn within 10 s"
    b2 = restart(broker, b, signal.SIGKILL)
    c = b2.client(f"{uid}-c")
    c.subscribe(f"{uid}/#", qos=1)
    got = [p for p in c.ping() if p.name == "PUBLISH"]
    assert sorted((p.topic, p.payload) for p in got) == [(f"{uid}/new", b"n"), (f"{uid}/old", b"o")]


def test_unacknowledged_message_is_resent_with_dup_after_restart(broker, uid):
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    b.client(f"{uid}-p").publish(f"{uid}/t", b"once", qos=2)
    first = sub.recv_publish(ack=False)
    assert not first.dup
    sub.close()
    b2 = restart(broker, b)
    again = b2.client(f"{uid}-s", clean=False)
    p = again.expect(PUBLISH)
    assert (p.payload, p.dup, p.qos, p.packet_id) == (b"once", True, 2, first.packet_id)


@pytest.mark.parametrize("durability", ["none", "batch", "sync"])
def test_acknowledged_message_survives_a_crash(broker, uid, durability):
    """SIGKILL right after PUBACK: the message reaches the offline subscriber after restart
    (it was in the log, and the log is replayed past the last snapshot)."""
    b = broker(log={"durability": durability})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    wait_for_snapshot(b.config["data_dir"], f"{uid}-s")
    b.client(f"{uid}-p").publish(f"{uid}/t", b"acked", qos=1)   # returns after PUBACK
    b2 = restart(broker, b, sig=signal.SIGKILL)
    assert b2.wait_log(lambda line: "replayed 1 log records" in line, timeout=5)
    again = b2.client(f"{uid}-s", clean=False)
    assert again.connack.session_present
    assert again.recv_publish().payload == b"acked"


def test_qos2_id_restored_from_a_snapshot_does_not_swallow_a_new_message(broker, uid):
    """The snapshot holds an inbound QoS 2 id awaiting PUBREL; the exchange completes, then the
    broker crashes before the next snapshot. After the restart the id is free again (the
    PUBREL is in the QoS 2 exchange journal), and the client's next message with that id
    must be routed, not taken for a re-send (MQTT-4.3.3-2)."""
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    sub.disconnect()
    pub = b.client(f"{uid}-p", clean=False)
    pub.send(m.publish(f"{uid}/t", b"first", qos=2, packet_id=5))
    assert pub.expect(PUBREC).packet_id == 5
    b.client(f"{uid}-other", clean=False).disconnect()  # a session change: a snapshot follows
    wait_for_snapshot(data_dir, f"{uid}-p", pred=lambda s: s["awaiting_release"] == [5])
    pub.send(m.pubrel(5))
    assert pub.expect(PUBCOMP).packet_id == 5
    b2 = restart(broker, b, sig=signal.SIGKILL)
    pub = b2.client(f"{uid}-p", clean=False)
    mark = b2.mark()
    pub.send(m.publish(f"{uid}/t", b"second", qos=2, packet_id=5))
    assert pub.expect(PUBREC).packet_id == 5
    pub.send(m.pubrel(5))
    assert pub.expect(PUBCOMP).packet_id == 5
    assert not any("taken as a new message" in line for line in b2.logs[mark:])
    sub = b2.client(f"{uid}-s", clean=False)
    assert [sub.recv_publish().payload for _ in range(2)] == [b"first", b"second"]
    assert sub.ping() == []


@pytest.mark.parametrize("mode", ["log", "queue"])
def test_snapshot_entries_past_the_end_of_a_shortened_log_are_not_restored(broker, uid, mode):
    """A power failure can leave the snapshot holding offsets the log no longer has (its last
    records had not reached the disk). Those offsets are given to new messages; the entries
    (a cursor, or queued offsets with max_queued_messages set) must not lead there, or the
    session would be sent whatever message gets them."""
    limits = {"max_queued_messages": 100} if mode == "queue" else {}
    b = broker(limits=limits)
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    marker = b"never-on-disk-" + uid.encode()
    b.client(f"{uid}-p").publish(f"{uid}/t", marker, qos=1)
    if mode == "queue":
        wait_for_snapshot(data_dir, f"{uid}-s", pred=lambda s: len(s["queue"]) == 1)
    else:
        # Taken after the publish (the snapshot's offset is past it), the cursor before it.
        wait_for_snapshot(data_dir, f"{uid}-s", timeout=40,
                          pred=lambda s: s["cursor"] == 0 and _snapshot_offset(data_dir) == 1)
    b.stop(signal.SIGKILL)
    # What the disk holds after the power failure: the record torn (its payload not written).
    (seg,) = glob.glob(f"{data_dir}/log/*.seg")
    with open(seg, "r+b") as fh:
        data = fh.read()
        fh.seek(data.index(marker))
        fh.write(b"\0" * len(marker))
    b2 = broker(data_dir=data_dir, limits=limits)
    if mode == "queue":
        assert b2.wait_log(lambda ln: "1 queued or unacknowledged messages" in ln, timeout=5)
    else:
        assert b2.wait_log(lambda ln: "but the log ends at 0" in ln, timeout=5)
    b2.client(f"{uid}-p").publish(f"{uid}/other", b"not for the subscriber", qos=1)
    again = b2.client(f"{uid}-s", clean=False)
    assert again.connack.session_present
    assert again.ping() == []
    if mode == "queue":
        assert b2.stats()["counters"]["publish_lost"] == 1
    # The session goes on with new messages.
    b2.client(f"{uid}-p").publish(f"{uid}/t", b"after", qos=1)
    assert again.recv_publish().payload == b"after"


def _snapshot_offset(data_dir: str) -> int:
    with open(f"{data_dir}/sessions.json") as fh:
        return json.load(fh)["log_next_offset"]


@pytest.mark.parametrize("backend", ["c", "python"])
@pytest.mark.parametrize("mode", ["log", "queue"])
def test_a_large_backlog_is_sent_from_the_log_in_order(broker, uid, monkeypatch, backend, mode):
    """An offline session reads its backlog from the log by cursor (or, with
    max_queued_messages set, keeps offsets in its queue); on reconnect large payloads come
    from the segment file (the native helper's sendfile batch, or its pure-Python twin)."""
    monkeypatch.setenv("EDGEBROKER_NATIVE", backend)
    limits = {"max_inflight_messages": 50}
    if mode == "queue":
        limits["max_queued_messages"] = 2000
    b = broker(limits=limits)
    said = {"c": "native helper: C", "python": "native helper: pure Python"}[backend]
    assert any(said in line for line in b.logs), b.logs[:5]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    sizes = [0, 1, 100, 5000, 200_000] + [64] * 295
    # Pipelined, as a device with a window would: all PUBLISHes, then all PUBACKs.
    for i, size in enumerate(sizes):
        pub.send(publish(f"{uid}/t", (f"{i:05d}".encode() * (size // 5 + 1))[:size], qos=1,
                         packet_id=i + 1))
    acked = [pub.expect(PUBACK, timeout=10).packet_id for _ in sizes]
    assert acked == list(range(1, len(sizes) + 1))  # in order (MQTT-4.6.0-2)
    again = b.client(f"{uid}-s", clean=False)
    for i, size in enumerate(sizes):
        p = again.recv_publish(timeout=10)
        assert p.payload == (f"{i:05d}".encode() * (size // 5 + 1))[:size], f"message {i}"
    assert again.ping() == []


def _drops_a_list(doc: bytes) -> bytes:
    d = json.loads(doc)
    d["sessions"][0]["drops"] = []
    return json.dumps(d).encode()


def _number(where: str, text: bytes):
    """Puts ``text`` (JSON that parses to a number int() cannot take) at ``where``: a top-level
    key, or "subscription" for the first session's first subscription's QoS."""
    def damage(doc: bytes) -> bytes:
        d = json.loads(doc)
        if where == "subscription":
            d["sessions"][0]["subscriptions"][0][1] = "@NUMBER@"
        else:
            d[where] = "@NUMBER@"
        return json.dumps(d).encode().replace(b'"@NUMBER@"', text)
    return damage


@pytest.mark.parametrize("damage", [lambda doc: b"{not json", lambda doc: b"null",
                                    lambda doc: b"[]", lambda doc: b"[" * 100_000,
                                    _drops_a_list, _number("log_next_offset", b"1e400"),
                                    _number("written_ms", b"Infinity"),
                                    _number("subscription", b"-Infinity")],
                         ids=["not-json", "null", "list", "deep", "drops-a-list",
                              "offset-1e400", "written-Infinity", "qos-minus-Infinity"])
def test_damaged_snapshot_is_set_aside_not_fatal(broker, uid, damage):
    """Not JSON, or JSON of the wrong shape: moved aside, the broker starts without it."""
    b = broker()
    b.client(f"{uid}-s", clean=False).subscribe(f"{uid}/t")
    b.stop()
    data_dir = b.config["data_dir"]
    with open(f"{data_dir}/sessions.json", "rb") as fh:
        damaged = damage(fh.read())
    with open(f"{data_dir}/sessions.json", "wb") as fh:
        fh.write(damaged)
    r = subprocess.run([sys.executable, "-m", "edgebroker", "inspect", "sessions",
                        "--data-dir", data_dir], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "sessions.json: damaged snapshot" in r.stderr, r.stderr
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda line: "sessions.json" in line and "damaged" in line)
    with open(f"{data_dir}/sessions.json.damaged", "rb") as fh:
        assert fh.read() == damaged
    assert not b2.client(f"{uid}-s", clean=False).connack.session_present


def test_snapshot_values_out_of_range_are_left_out_not_fatal(broker, uid):
    """Valid JSON with a packet id past 65535 in one in-flight entry (a QoS past 2 in a
    retained message): those entries are left out, with an error naming the file and the
    session; the session and its other entries are restored and serve."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/r", b"kept", qos=1, retain=True)
    pub.publish(f"{uid}/bad", b"gone", qos=1, retain=True)
    for i in range(3):
        pub.publish(f"{uid}/t", b"m%d" % i, qos=1)
    for _ in range(3):
        sub.recv_publish(ack=False)                 # three left unacknowledged
    sub.abort()
    b.stop()
    data_dir = b.config["data_dir"]
    path = f"{data_dir}/sessions.json"
    with open(path) as fh:
        doc = json.load(fh)
    mine = next(s for s in doc["sessions"] if s["client_id"] == f"{uid}-s")
    assert len(mine["inflight"]) == 3, mine
    mine["inflight"][0][0] = 70000
    next(r for r in doc["retained"] if r["topic"] == f"{uid}/bad")["qos"] = 9
    with open(path, "w") as fh:
        json.dump(doc, fh)
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda line: "sessions.json" in line and f"'{uid}-s'" in line
                       and "inflight" in line and "70000" in line), b2.log_text()
    assert b2.wait_log(lambda line: "sessions.json" in line and f"'{uid}/bad'" in line)
    again = b2.client(f"{uid}-s", clean=False)
    assert again.connack.session_present
    got = again.ping()
    assert sorted(p.payload for p in got if p.name == "PUBLISH") == [b"m1", b"m2"], got
    c = b2.client(f"{uid}-c")
    c.subscribe(f"{uid}/#", qos=1)
    assert [(p.topic, p.payload) for p in c.ping() if p.name == "PUBLISH"] == \
        [(f"{uid}/r", b"kept")]
    assert not [line for line in b2.logs if "internal error" in line], b2.log_text()


@pytest.mark.parametrize("mode", ["log", "queue"])
def test_snapshot_lists_sessions_by_offset(broker, uid, mode):
    """The snapshot holds offsets into the log, not message copies: an offline session's
    cursor (or, with max_queued_messages set, its queue of offsets)."""
    b = broker(limits={"max_queued_messages": 100} if mode == "queue" else {})
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.disconnect()
    b.client(f"{uid}-p").publish(f"{uid}/t", b"p" * 1000, qos=1)
    b.stop()
    with open(f"{b.config['data_dir']}/sessions.json") as fh:
        doc = json.load(fh)
    (session,) = [s for s in doc["sessions"] if s["client_id"] == f"{uid}-s"]
    assert session["subscriptions"] == [[f"{uid}/t", 1]]
    if mode == "queue":
        assert len(session["queue"]) == 1 and isinstance(session["queue"][0][0], int)
        assert session["cursor"] is None
    else:
        assert session["queue"] == [] and session["cursor"] == 0
        assert session["offline"] == [[0, None]]
    assert "p" * 1000 not in json.dumps(doc)


def test_inspect_sessions_offline_and_live(broker, uid):
    from conftest import run_cli

    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/a", (f"{uid}/b/#", 2), qos=1)
    sub.disconnect()
    pub = b.client(f"{uid}-p")
    for i in range(3):
        pub.publish(f"{uid}/a", b"x", qos=1)
    data_dir = b.config["data_dir"]
    wait_for_snapshot(data_dir, f"{uid}-s")
    live = run_cli("inspect", "sessions", "--data-dir", data_dir, "--format", "json")
    assert live.returncode == 0, live.stderr
    (s,) = [s for s in json.loads(live.stdout)["sessions"] if s["client_id"] == f"{uid}-s"]
    assert s["subscriptions"] == {f"{uid}/a": 1, f"{uid}/b/#": 2}
    b.stop()
    offline = run_cli("inspect", "sessions", "--data-dir", data_dir)
    assert offline.returncode == 0, offline.stderr
    line = next(ln for ln in offline.stdout.splitlines() if ln.startswith(f"{uid}-s"))
    # No inflight, none queued, cursor 0, 3 records behind (bytes, age), none dropped.
    fields = line.split()
    assert f"{uid}/b/# (QoS 2)" in line and fields[-9:-5] == ["0", "0", "0", "3"], line
    assert fields[-1] == "0", line
    as_json = run_cli("inspect", "sessions", "--data-dir", data_dir, "--format", "json")
    (s,) = [s for s in json.loads(as_json.stdout)["sessions"] if s["client_id"] == f"{uid}-s"]
    assert s["cursor"] == 0 and s["lag_records"] == 3 and s["lag_bytes"] > 3 * 34, s
    assert s["lag_seconds"] < 60 and s["drops"] == {}
    missing = run_cli("inspect", "sessions", "--data-dir", str(b.workdir / "nowhere"))
    assert missing.returncode == 1 and "no session snapshot" in missing.stderr


@pytest.mark.parametrize("filters", [["m/#"], ["m/#", "other/#"]])   # a run; records one by one
def test_qos0_deliveries_are_not_repeated_after_a_crash(broker, uid, filters):
    """A persistent session subscribed at QoS 0 got QoS 1 messages live, then the broker was
    killed before its next snapshot: after the restart they were sent again at QoS 0 (QoS 0
    is at most once). Now what it may have been sent before the crash is not sent again at
    QoS 0 (counted as restart_qos0); a QoS 1 subscription still gets its own again (at least
    once), and what is published after the restart reaches both."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(*[(f"{uid}/{f}", 0) for f in filters])
    q1 = b.client(f"{uid}-q1", clean=False)
    q1.subscribe((f"{uid}/m/#", 1))
    for c in (sub, q1):
        wait_for_snapshot(b.config["data_dir"], c.client_id, pred=lambda s: s["subscriptions"])
    pub = b.client(f"{uid}-p")
    for i in range(5):
        pub.publish(f"{uid}/m/a", b"msg-%d" % i, qos=1)
    assert [p.payload for p in sub.ping() if p.type == PUBLISH] == [b"msg-%d" % i
                                                                    for i in range(5)]
    assert len([p for p in q1.ping() if p.type == PUBLISH]) == 5     # not acknowledged
    b2 = restart(broker, b, signal.SIGKILL)
    again = b2.raw()
    assert again.connect(f"{uid}-s", clean=False).session_present
    assert [p for p in again.ping() if p.type == PUBLISH] == []
    assert b2.client_row(f"{uid}-s")["drops"] == {"restart_qos0": 5}
    other = b2.raw()
    assert other.connect(f"{uid}-q1", clean=False).session_present
    assert [p.payload for p in other.ping() if p.type == PUBLISH] == [b"msg-%d" % i
                                                                      for i in range(5)]
    b2.client(f"{uid}-p2").publish(f"{uid}/m/a", b"after", qos=1)
    assert [p.payload for p in again.ping() if p.type == PUBLISH] == [b"after"]


def test_qos0_deliveries_are_not_repeated_after_a_crash_with_the_memory_queue(broker, uid):
    """With max_queued_messages set (queues in memory; the restart's replay queues for the
    sessions) and queue_qos0_messages, the QoS 0 messages a connected session was sent after
    the last snapshot were queued for it again by the replay and sent twice."""
    limits = {"max_queued_messages": 1000, "queue_qos0_messages": True}
    b = broker(limits=limits)
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe((f"{uid}/m/#", 0))
    wait_for_snapshot(b.config["data_dir"], sub.client_id, pred=lambda s: s["subscriptions"])
    pub = b.client(f"{uid}-p")
    for i in range(5):
        pub.publish(f"{uid}/m/a", b"msg-%d" % i, qos=i % 2)
    assert len([p for p in sub.ping() if p.type == PUBLISH]) == 5
    b2 = restart(broker, b, signal.SIGKILL, limits=limits)
    again = b2.raw()
    assert again.connect(f"{uid}-s", clean=False).session_present
    assert [p for p in again.ping() if p.type == PUBLISH] == []
    assert b2.client_row(f"{uid}-s")["drops"] == {"restart_qos0": 5}
    b2.client(f"{uid}-p2").publish(f"{uid}/m/a", b"after", qos=0)
    assert [p.payload for p in again.ping() if p.type == PUBLISH] == [b"after"]


def test_qos0_deliveries_are_not_repeated_after_a_crash_and_a_later_restart(broker, uid):
    """What a crash left a session unsure of was kept in memory only: a session still offline
    at the next restart (here a clean one) got those QoS 0 messages again. The snapshot keeps
    it now (unsure_to), until the session has read past it."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe((f"{uid}/m/#", 0))
    wait_for_snapshot(b.config["data_dir"], sub.client_id, pred=lambda s: s["subscriptions"])
    pub = b.client(f"{uid}-p")
    for i in range(5):
        pub.publish(f"{uid}/m/a", b"msg-%d" % i, qos=1)
    assert len([p for p in sub.ping() if p.type == PUBLISH]) == 5
    b2 = restart(broker, b, signal.SIGKILL)
    b3 = restart(broker, b2)                   # the session stays offline through it
    again = b3.raw()
    assert again.connect(f"{uid}-s", clean=False).session_present
    assert [p for p in again.ping() if p.type == PUBLISH] == []
    assert b3.client_row(f"{uid}-s")["drops"] == {"restart_qos0": 5}


def test_qos1_from_an_offline_spell_still_comes_after_a_lowering_and_a_restart(broker, uid):
    """A session back from an offline spell lowers its subscription to QoS 0 (SUBSCRIBE again)
    and goes away before it has read that spell's QoS 1 messages. After a restart it still
    gets every one of them (its window again, then the rest), at QoS 1: the QoS the filter
    granted before that SUBSCRIBE, which the snapshot keeps (Cursor.lowered)."""
    b = broker()
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe((f"{uid}/t", 1))
    sub.send(m.disconnect())
    assert sub.expect_closed()
    sub.close()
    pub = b.client(f"{uid}-p")
    n = 100
    for i in range(n):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    back = b.client(f"{uid}-s", clean=False)
    window = [back.recv_publish(ack=False) for _ in range(20)]
    assert [(int(p.payload), p.qos) for p in window] == [(i, 1) for i in range(20)]
    assert back.subscribe((f"{uid}/t", 0)).type == m.SUBACK
    back.send(m.disconnect())
    assert back.expect_closed()
    back.close()
    again = restart(broker, b).client(f"{uid}-s", clean=False)
    got = [again.recv_publish() for _ in range(n)]
    assert [(int(p.payload), p.qos) for p in got] == [(i, 1) for i in range(n)]
    assert again.ping() == []
