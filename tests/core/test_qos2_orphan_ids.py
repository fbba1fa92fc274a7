"""Inbound QoS 2 ids of a persistent session the snapshot lacks (core.exchange_restore,
docs/persistence.md "Exactly once across a crash").

A publisher's persistent session is made after the last snapshot; it publishes at QoS 2, gets
PUBREC, and the broker is killed before the next snapshot. The restart does not restore that
session (Session Present 0), but the exchange journal's ``I`` record keeps its packet id and
digest for the client's next connection without Clean Start: the re-send (DUP) is acknowledged
and not delivered again (also after a power cut following the restart), PUBREL gets PUBCOMP,
and another message under that id afterwards is delivered. A connection with Clean Start drops
the id, and so does an MQTT 5.0 client's (told Session Present 0, it discards its session
state). The subscriber's persistent session is in the snapshot."""

import glob
import json
import os
import signal
import time
from pathlib import Path

import pytest

import mqttraw as m
import mqttraw5 as R
import powercut
from conftest import wait_for_snapshot
from mqttraw import PUBCOMP, PUBREC

EXPIRY = {R.SESSION_EXPIRY: 3600}
PID = 77


class Publisher:
    """A raw publisher, 3.1.1 (clean session 0 or 1) or 5.0 (Clean Start 0 with a Session
    Expiry Interval, or Clean Start 1)."""

    def __init__(self, b, client_id: str, v5: bool, clean: bool = False):
        if v5:
            self.c = R.RawClient5(b.host, b.port)
            self.present = self.c.connect(client_id, clean_start=clean,
                                          props=EXPIRY).session_present
        else:
            self.c = b.client(client_id, clean=clean)
            self.present = self.c.connack.session_present
        self.v5 = v5

    def publish(self, topic: str, payload: bytes, dup: bool = False) -> None:
        make = R.publish5 if self.v5 else m.publish
        self.c.send(make(topic, payload, qos=2, packet_id=PID, dup=dup))
        got = self.c.recv_packet()
        assert (got.type, got.packet_id) == (PUBREC, PID), got

    def release(self) -> None:
        self.c.send(R.pubrel5(PID) if self.v5 else m.pubrel(PID))
        got = self.c.recv_packet()
        assert (got.type, got.packet_id) == (PUBCOMP, PID), got

    def close(self) -> None:
        self.c.close()


def _sessions(data_dir: str) -> list[str]:
    with open(os.path.join(data_dir, "sessions.json")) as fh:
        return [s["client_id"] for s in json.load(fh)["sessions"]]


def _crash_after_pubrec(broker, uid: str, v5: bool) -> str:
    """The subscriber's session in a snapshot; then, within the second before the next one,
    the publisher's new persistent session, its QoS 2 ``once`` acknowledged with PUBREC, and
    SIGKILL. Returns the data dir."""
    b = broker()
    data_dir = b.config["data_dir"]
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    sub.disconnect()
    wait_for_snapshot(data_dir, f"{uid}-s")     # the next one: a second from now at the soonest
    pub = Publisher(b, f"{uid}-p", v5)
    pub.publish(f"{uid}/t", b"once")
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL
    pub.close()
    assert f"{uid}-p" not in _sessions(data_dir), "the snapshot came first: no crash case"
    return data_dir


def _wait_for_one_journal_file(data_dir: str, timeout: float = 5.0) -> None:
    """The start's snapshot is on disk and the journal files before it are deleted."""
    first = min(glob.glob(os.path.join(data_dir, "exchanges-*.jsonl")),
                key=lambda name: int(name.rsplit("-", 1)[1].split(".")[0]))
    deadline = time.monotonic() + timeout
    while os.path.exists(first):
        assert time.monotonic() < deadline, f"{first} not deleted"
        time.sleep(0.05)


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("crashes", [1, 2])
def test_a_re_send_after_a_crash_is_not_delivered_twice(broker, uid, v5, crashes):
    data_dir = _crash_after_pubrec(broker, uid, v5)
    b2 = broker(data_dir=data_dir)
    line = b2.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and "1 packet ids of 1 clients kept" in line, line
    if crashes == 2:    # again before the client is back, once the old journal files went
        _wait_for_one_journal_file(data_dir)
        assert b2.stop(signal.SIGKILL) == -signal.SIGKILL
        b2 = broker(data_dir=data_dir)
        line = b2.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
        assert line and "1 packet ids of 1 clients kept" in line, line
    sub = b2.client(f"{uid}-s", clean=False)
    assert sub.connack.session_present
    assert sub.recv_publish().payload == b"once"
    pub = Publisher(b2, f"{uid}-p", v5)
    assert not pub.present                      # its session was not restored
    if v5:
        # Told Session Present 0, a 5.0 client discards its session state (MQTT-3.2.2-5):
        # the ids go, and what it sends under the id is a new message, however alike.
        assert b2.wait_log(lambda ln: "an MQTT 5.0 client discards its session state" in ln)
        pub.publish(f"{uid}/t", b"once")
        assert sub.recv_publish().payload == b"once"
        pub.release()
        assert sub.ping() == []
        return
    pub.publish(f"{uid}/t", b"once", dup=True)  # the re-send
    pub.publish(f"{uid}/t", b"once")            # and once more without DUP (paho does so)
    assert sub.ping() == [], "the re-send was delivered again"
    pub.release()
    pub.publish(f"{uid}/t", b"another")         # a new message under the id
    assert sub.recv_publish().payload == b"another"
    pub.release()
    assert sub.ping() == []
    assert not any("taken as a new message" in ln for ln in b2.logs)


def _journal_files(data_dir) -> list[str]:
    names = glob.glob(os.path.join(data_dir, "exchanges-*.jsonl"))
    return sorted(os.path.basename(name) for name in names)


def _wait_until(pred, what: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return got


def test_a_power_cut_after_the_restart_keeps_the_ids(broker, uid, tmp_path, monkeypatch):
    """The restart carries the ids into its new journal file and the snapshot writer deletes
    the file they were in. A later snapshot (another client's persistent session) fsyncs the
    directory, making that deletion durable, and then the power goes (tests/faults/powercut.c).
    The new file was written but never fsynced (no publish since the start, so no log fsync):
    the rebuilt disk held it empty, the ids were gone and the re-send was delivered twice.
    Now the file carrying them is fsynced with its directory before the snapshot goes out."""
    data = Path(_crash_after_pubrec(broker, uid, False))
    shadow = tmp_path / "shadow"
    powercut.sync_all(data, shadow)       # what the first run left is on the disk by now
    for name, value in powercut.environment(data, shadow).items():
        monkeypatch.setenv(name, value)
    b2 = broker(data_dir=str(data))       # durability batch (the default)
    for name in ("LD_PRELOAD", "EB_POWER_DIR", "EB_POWER_SHADOW"):
        monkeypatch.delenv(name)
    line = b2.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and "1 packet ids of 1 clients kept" in line, line
    # The start's snapshot is on disk and the file the ids were in is deleted.
    (carried,) = _wait_until(lambda: len(_journal_files(data)) == 1 and _journal_files(data),
                             "the journal files before the start's snapshot not deleted")
    other = b2.client(f"{uid}-other", clean=False)    # a snapshot that fsyncs the directory
    other.subscribe(f"{uid}/x", qos=1)
    other.disconnect()
    wait_for_snapshot(str(data), f"{uid}-other")
    _wait_until(lambda: carried not in _journal_files(data),
                f"{carried} not deleted by the next snapshot")   # (after its directory fsync)
    assert b2.stop(signal.SIGKILL) == -signal.SIGKILL            # the power cut
    after = tmp_path / "after"
    sizes = powercut.rebuild(data, shadow, after)
    assert sizes.get("sessions.json"), sizes

    b3 = broker(data_dir=str(after))
    sub = b3.client(f"{uid}-s", clean=False)
    assert sub.connack.session_present
    assert sub.recv_publish().payload == b"once"
    pub = Publisher(b3, f"{uid}-p", False)
    pub.publish(f"{uid}/t", b"once", dup=True)  # the re-send
    assert sub.ping() == [], f"the re-send was delivered again after the power cut: {sizes}"
    pub.release()
    line = b3.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and "1 packet ids of 1 clients kept" in line, line


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_a_connection_with_clean_start_drops_the_ids(broker, uid, v5):
    data_dir = _crash_after_pubrec(broker, uid, v5)
    b2 = broker(data_dir=data_dir)
    sub = b2.client(f"{uid}-s", clean=False)
    assert sub.recv_publish().payload == b"once"
    pub = Publisher(b2, f"{uid}-p", v5, clean=True)
    assert b2.wait_log(lambda ln: "dropped (it connected with clean start)" in ln)
    pub.publish(f"{uid}/t", b"once", dup=True)  # a new session's message: delivered
    assert sub.recv_publish().payload == b"once"
    pub.release()
    pub.close()
    # Dropped for good: neither the next connection nor a crash brings them back.
    assert b2.stop(signal.SIGKILL) == -signal.SIGKILL
    b3 = broker(data_dir=data_dir)
    line = b3.wait_log(lambda ln: "QoS 2 exchange records written after the snapshot" in ln)
    assert line and "0 packet ids of 0 clients kept" in line, line
    pub = Publisher(b3, f"{uid}-p", v5)
    pub.publish(f"{uid}/t", b"twice", dup=True)
    sub = b3.client(f"{uid}-s", clean=False)
    assert sub.recv_publish().payload == b"twice"
