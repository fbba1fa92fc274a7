"""After a restart, a bridge whose remote kept the session sends PUBREL for every packet id
its previous run may have left there past PUBREC (MQTT-4.4.0-1), before any new message:
a crash forgets which ones they were, and each held id would keep a place of the remote's
Receive Maximum for good (docs/bridge.md, "QoS 2 across a restart")."""

from __future__ import annotations

import signal
import time

import mqttraw5 as m5

from .helpers import FakeRemote5, bridge_table, checkpoint, wait_figure

RULES = [{"pattern": "s/#", "direction": "out", "qos": 2, "remote_prefix": "r/"}]
WINDOW = 5
POOL = 2 * WINDOW + 2       # the bridge's packet ids: 1 to this (bridge/release.py)


def _table(port: int) -> dict:
    return bridge_table(port, RULES, protocol_version=5, session_expiry=300, window=WINDOW,
                        checkpoint_interval=0.05)


def _complete(end, publish) -> None:
    """The remote's side of a QoS 2 exchange, PUBLISH received."""
    end.send(m5.pubrec5(publish.packet_id))
    assert end.expect(m5.PUBREL).packet_id == publish.packet_id
    end.send(m5.pubcomp5(publish.packet_id))


def _crash_past_pubrec(broker, remote):
    """A gateway that forwarded "0" (its checkpoint written past it), then sent "1" and
    "2", "1" past PUBREC (PUBREL sent, no PUBCOMP), when it is SIGKILLed; the held id."""
    gw = broker(bridge=[_table(remote.port)])
    end = remote.accept()                       # a new session (Session Present 0)
    wait_figure(gw, lambda f: f["state"] == "up")
    data_dir = gw.config["data_dir"]
    pub = gw.client("pub")
    pub.publish("s/x", b"0", qos=1)
    _complete(end, end.expect(m5.PUBLISH))
    wait_figure(gw, lambda f: f["checkpoint_cursor"] >= 1)
    assert checkpoint(data_dir)["packet_ids"] == POOL
    for i in (1, 2):
        pub.publish("s/x", str(i).encode(), qos=1)
    first, second = end.expect(m5.PUBLISH), end.expect(m5.PUBLISH)
    assert (first.payload, second.payload) == (b"1", b"2")
    assert first.packet_id <= POOL and second.packet_id <= POOL
    end.send(m5.pubrec5(first.packet_id))
    assert end.expect(m5.PUBREL).packet_id == first.packet_id
    gw.stop(signal.SIGKILL)
    end.close()
    return data_dir, first.packet_id


def test_a_kept_session_gets_its_pubrels_before_any_new_publish(broker):
    remote = FakeRemote5()
    try:
        data_dir, held = _crash_past_pubrec(broker, remote)
        gw = broker(data_dir=data_dir, bridge=[_table(remote.port)])
        end = remote.accept(m5.connack5(session_present=True,
                                        props={m5.RECEIVE_MAXIMUM: 20}))
        # Every id of the previous run's range is released, before anything else.
        released = [end.expect(m5.PUBREL).packet_id for _ in range(POOL)]
        assert released == list(range(1, POOL + 1))
        # The remote answers: the held one, the others with 0x92 (not found).
        end.send(b"".join(m5.pubcomp5(pid) if pid == held else m5.pubcomp5(pid, 0x92)
                          for pid in released))
        # Then the normal flow: what the checkpoint had not seen acknowledged, again.
        again = [end.expect(m5.PUBLISH) for _ in range(2)]
        assert [(p.topic, p.payload) for p in again] == [("r/s/x", b"1"), ("r/s/x", b"2")]
        for publish in again:
            _complete(end, publish)
        fig = wait_figure(gw, lambda f: f["cursor"] == 3 and f["inflight"] == 0)
        assert fig["refused"] == 0, fig
        assert gw.wait_log(lambda ln: "packet ids 1 to 12 released" in ln, 5)
        # A later reconnect to the kept session releases the bridge's range again, its ids not
        # in flight (a remote restarted from an older save may hold them: bridge11), and new
        # messages wait for the PUBCOMPs.
        end.close()
        end = remote.accept(m5.connack5(session_present=True))
        gw.client("pub").publish("s/x", b"3", qos=1)
        again = [end.expect(m5.PUBREL).packet_id for _ in range(POOL)]
        assert again == list(range(1, POOL + 1))
        end.send(b"".join(m5.pubcomp5(pid, 0x92) for pid in again))
        publish = end.expect(m5.PUBLISH)
        assert publish.payload == b"3"
        _complete(end, publish)
        wait_figure(gw, lambda f: f["cursor"] == 4 and f["inflight"] == 0)
    finally:
        remote.close()


def test_pubrels_are_dropped_when_the_session_is_gone(broker):
    """The link is lost during the release, and the remote then has no session (Session
    Present 0): nothing of the release is sent again (neither PUBREL nor a PUBLISH with an
    empty topic), only the messages."""
    remote = FakeRemote5()
    try:
        data_dir, _ = _crash_past_pubrec(broker, remote)
        gw = broker(data_dir=data_dir, bridge=[_table(remote.port)])
        end = remote.accept(m5.connack5(session_present=True))
        assert [end.expect(m5.PUBREL).packet_id for _ in range(POOL)] == list(
            range(1, POOL + 1))
        end.close()                              # no PUBCOMP came
        end = remote.accept(m5.connack5(session_present=False))
        again = [end.expect(m5.PUBLISH) for _ in range(2)]
        assert [(p.topic, p.payload) for p in again] == [("r/s/x", b"1"), ("r/s/x", b"2")]
        for publish in again:
            _complete(end, publish)
        wait_figure(gw, lambda f: f["cursor"] == 3 and f["inflight"] == 0)
    finally:
        remote.close()


def test_a_crash_before_the_first_checkpoint_interval_releases_only_the_bridges_ids(broker):
    """A first run writes its checkpoint at start with every id (1..65535: an earlier run's
    are not known); once the remote said it has no session, the checkpoint says the bridge's
    own range at once, not only at the next checkpoint_interval: a SIGKILL before that then
    releases POOL ids on the restart, not 65,535."""
    remote = FakeRemote5()
    table = {**_table(remote.port), "checkpoint_interval": 3600}
    try:
        gw = broker(bridge=[table])
        remote.accept(m5.connack5(session_present=False))
        wait_figure(gw, lambda f: f["state"] == "up")
        data_dir = gw.config["data_dir"]
        deadline = time.monotonic() + 10
        while checkpoint(data_dir).get("packet_ids") != POOL:
            assert time.monotonic() < deadline, checkpoint(data_dir)
            time.sleep(0.05)
        gw.stop(signal.SIGKILL)
        gw = broker(data_dir=data_dir, bridge=[table])
        end = remote.accept(m5.connack5(session_present=True))
        released = [end.expect(m5.PUBREL).packet_id for _ in range(POOL)]
        assert released == list(range(1, POOL + 1))
        end.send(b"".join(m5.pubcomp5(pid, 0x92) for pid in released))
        assert gw.wait_log(lambda ln: f"packet ids 1 to {POOL} released" in ln, 10)
    finally:
        remote.close()
