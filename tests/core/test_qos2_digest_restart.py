"""QoS 2 re-sends without DUP across a restart (core.handlers.publish, docs/persistence.md).

A publisher sends a QoS 2 PUBLISH, gets PUBREC and sends no PUBREL; the broker restarts. The
publisher then sends the same PUBLISH again with DUP 0 (paho-mqtt does so at reconnect): the
id's digest of the message, kept by the snapshot (a clean stop, or a crash after a snapshot)
or by the exchange journal (a crash before one), tells it is a re-send: PUBREC, not delivered
again. Another message with that id is new: delivered. Files written before digests were kept
(ids only) still load; such an id takes a re-send without DUP as new, as it did."""

import glob
import json
import os
import signal

import pytest

import mqttraw as m
import mqttraw5 as R
from conftest import wait_for_snapshot
from mqttraw import PUBCOMP, PUBREC

EXPIRY = {R.SESSION_EXPIRY: 3600}


class Publisher:
    """A raw publisher with a persistent session, 3.1.1 (clean session 0) or 5.0 (a Session
    Expiry Interval)."""

    def __init__(self, b, client_id: str, v5: bool):
        if v5:
            self.c = R.RawClient5(b.host, b.port)
            self.c.connect(client_id, clean_start=False, props=EXPIRY)
        else:
            self.c = b.client(client_id, clean=False)
        self.v5 = v5

    def publish(self, topic: str, payload: bytes, dup: bool = False) -> None:
        make = R.publish5 if self.v5 else m.publish
        self.c.send(make(topic, payload, qos=2, packet_id=7, dup=dup))
        got = self.c.recv_packet()
        assert (got.type, got.packet_id) == (PUBREC, 7), got

    def release(self) -> None:
        self.c.send(R.pubrel5(7) if self.v5 else m.pubrel(7))
        got = self.c.recv_packet()
        assert (got.type, got.packet_id) == (PUBCOMP, 7), got

    def close(self) -> None:
        self.c.close()


def _held_before_restart(broker, uid: str, how: str, v5: bool):
    """The publisher's message ``once`` held with id 7 (PUBREC, no PUBREL), delivered to the
    subscriber; then the broker stopped (``stop``) or killed after a snapshot holding the id
    (``kill-snapshot``) or before one (``kill-journal``). Returns (data dir, a new broker)."""
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = Publisher(b, f"{uid}-p", v5)
    wait_for_snapshot(data_dir, f"{uid}-p")              # no session changes after this one
    pub.publish(f"{uid}/t", b"once")
    assert sub.recv_publish().payload == b"once"
    assert sub.ping() == []                             # (its PUBCOMP is read before the stop)
    if how == "kill-snapshot":
        b.client(f"{uid}-other", clean=False).disconnect()  # a session change: a snapshot
        wait_for_snapshot(data_dir, f"{uid}-p", pred=lambda s: s["awaiting_release"] == [7])
    rc = b.stop(signal.SIGTERM if how == "stop" else signal.SIGKILL)
    assert rc == (0 if how == "stop" else -signal.SIGKILL)
    pub.close()
    return data_dir


def _session(data_dir: str, client_id: str) -> dict:
    with open(os.path.join(data_dir, "sessions.json")) as fh:
        return next(s for s in json.load(fh)["sessions"] if s["client_id"] == client_id)


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("how", ["stop", "kill-snapshot", "kill-journal"])
def test_a_re_send_without_dup_after_a_restart_is_not_delivered_again(broker, uid, how, v5):
    data_dir = _held_before_restart(broker, uid, how, v5)
    held = _session(data_dir, f"{uid}-p")
    if how == "kill-journal":       # the snapshot predates the message: the journal has it
        assert held["awaiting_release"] == [], held
    else:
        assert held["awaiting_release"] == [7] and held["release_digests"][0][0] == 7, held
    b2 = broker(data_dir=data_dir)
    if how == "kill-journal":
        assert b2.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    sub = b2.client(f"{uid}-s", clean=False)
    assert sub.connack.session_present
    pub = Publisher(b2, f"{uid}-p", v5)
    mark = b2.mark()
    pub.publish(f"{uid}/t", b"once")                      # the re-send, DUP 0
    assert sub.ping() == [], "the re-send without DUP was delivered again"
    pub.publish(f"{uid}/t", b"another")                   # another message, the same id
    assert sub.recv_publish().payload == b"another"
    pub.release()
    assert sub.ping() == []
    line = b2.wait_log(lambda ln: "packet id 7 (DUP 0)" in ln, start=mark)
    assert line and "another topic, payload or RETAIN" in line, line
    pub.close()


@pytest.mark.parametrize("kind", ["snapshot", "journal"])
def test_ids_saved_without_digests_still_load(broker, uid, kind):
    """A snapshot (``awaiting_release`` without ``release_digests``) or an ``I`` record of
    four fields, as written before digests were kept: the id is held again, a DUP re-send is
    acknowledged only, and a re-send without DUP is taken as a new message (no digest to
    compare), with the warning saying why."""
    data_dir = _held_before_restart(broker, uid, "stop" if kind == "snapshot" else
                                    "kill-journal", False)
    if kind == "snapshot":
        name = os.path.join(data_dir, "sessions.json")
        with open(name) as fh:
            doc = json.load(fh)
        for s in doc["sessions"]:
            s.pop("release_digests", None)
        with open(name, "w") as fh:
            json.dump(doc, fh)
    else:
        names = glob.glob(os.path.join(data_dir, "exchanges-*.jsonl"))
        cut = 0
        for name in names:
            with open(name) as fh:
                records = [json.loads(line) for line in fh if line.strip()]
            for record in records:
                if record[0] == "I":
                    assert len(record) == 5, record
                    del record[4]
                    cut += 1
            with open(name, "w") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in records))
        assert cut == 1, names
    b2 = broker(data_dir=data_dir)
    assert not any("damaged QoS 2 exchange" in ln for ln in b2.logs), b2.log_text()
    sub = b2.client(f"{uid}-s", clean=False)
    pub = Publisher(b2, f"{uid}-p", False)
    mark = b2.mark()
    pub.publish(f"{uid}/t", b"once", dup=True)           # DUP: a re-send
    assert sub.ping() == []
    pub.publish(f"{uid}/t", b"once")                      # DUP 0, nothing to compare: new
    assert sub.recv_publish().payload == b"once"
    pub.release()
    line = b2.wait_log(lambda ln: "packet id 7 (DUP 0)" in ln, start=mark)
    assert line and "held from before a restart" in line, line
    pub.close()


def test_a_digest_out_of_range_in_the_snapshot_is_left_out_and_logged(broker, uid):
    """A snapshot edited by hand (a digest past 32 bits): the id is kept without it, and the
    error line names the file, the session and the id."""
    data_dir = _held_before_restart(broker, uid, "stop", False)
    name = os.path.join(data_dir, "sessions.json")
    with open(name) as fh:
        doc = json.load(fh)
    for s in doc["sessions"]:
        if s["client_id"] == f"{uid}-p":
            s["release_digests"] = [[7, 1 << 40]]
    with open(name, "w") as fh:
        json.dump(doc, fh)
    b2 = broker(data_dir=data_dir)
    line = b2.wait_log(lambda ln: "release_digests of packet ids [7]" in ln)
    assert line and name in line and f"{uid}-p" in line, b2.log_text()
    sub = b2.client(f"{uid}-s", clean=False)
    pub = Publisher(b2, f"{uid}-p", False)
    pub.publish(f"{uid}/t", b"once", dup=True)           # still held: a DUP re-send
    assert sub.ping() == []
    pub.release()
    pub.close()
