"""The bridge's checkpoint against the commit log: never ahead of what the log has on disk (a
power cut that takes the log's tail must not leave a cursor past it), a checkpoint past the
log's end at the start is moved back to it, counted and logged; a damaged one is moved aside
and counted, and so are failed writes; over a real log (unit), and through a real broker
whose checkpoint is past its log."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
from types import SimpleNamespace

import mqttraw as m

from edgebroker.bridge import checkpoint
from edgebroker.bridge.bridge import Bridge
from edgebroker.bridge.release import pool_of
from edgebroker.bridge_config import BridgeConfig, TopicRule
from edgebroker.cli.inspect_live import format_bridges

from .helpers import FakeRemote, bridge_table, wait_figure
from .test_outbound import _log


def _bridge(tmp_path, commit_log, durability="batch") -> Bridge:
    """A Bridge over ``commit_log`` with the broker reduced to what the checkpoint needs
    (no link: connecting is not part of these tests)."""
    broker = SimpleNamespace(clock=lambda: 0.0, schedule=lambda timer: None,
                             unschedule=lambda timer: None,
                             journal=SimpleNamespace(log=commit_log, durability=durability),
                             limits=SimpleNamespace(max_packet_size=1 << 20))
    config = BridgeConfig(name="up", address="127.0.0.1:1", topic=(TopicRule(pattern="a/#"),))
    bridge = Bridge(config, broker, None, None, str(tmp_path))
    bridge.writer = checkpoint.CheckpointWriter()     # not started: submit() keeps the value
    bridge._connect = lambda: None
    return bridge


def _submitted(bridge) -> tuple | None:
    wanted = bridge.writer._wanted.pop(bridge.path, None)
    return wanted[1:3] if wanted else None


def test_the_checkpoint_never_gets_ahead_of_the_durable_log(tmp_path):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 10)     # written, not fsynced
    assert (log.written_offset, log.durable_offset) == (10, 0)
    bridge = _bridge(tmp_path, log)
    checkpoint.write(bridge.path, "up", 0, 0, 0xFFFF)
    bridge.start()
    ob = bridge.outbound
    assert ob.cursor == 0
    ob.read()
    while ob.take() is not None:
        pass
    for offset in range(10):
        ob.acked(offset)
    assert ob.cursor == 10
    bridge._on_checkpoint()
    assert _submitted(bridge) is None and ob.saved == 0   # nothing past the durable offset
    log.sync()
    assert log.durable_offset == 10
    bridge._on_checkpoint()
    assert _submitted(bridge) == (10, 10) and ob.saved == 10
    log.close()


def test_a_checkpoint_past_the_end_of_the_log_goes_back_to_it(tmp_path, caplog):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 5)
    bridge = _bridge(tmp_path, log)
    checkpoint.write(bridge.path, "up", 50, 60)      # the log lost its tail after this
    bridge.start()
    assert (bridge.outbound.cursor, bridge.outbound.sent_to) == (5, 5)
    assert bridge.checkpoint_ahead == 1
    assert "its checkpoint (offset 50) is past the end of the log (next offset 5)" in caplog.text
    log.append(1_700_000_000_000, 1, False, b"dev", b"a/x", b"new")
    log.write_pending()
    bridge.outbound.read()
    assert bridge.outbound.take()[0] == 5           # the new record is forwarded
    log.close()


def test_a_checkpoint_moved_back_to_the_end_of_the_log_is_written_at_once(tmp_path):
    """Nothing is acknowledged upstream (the link is down) while the log grows past the old
    checkpoint: a restart then goes on from where the log ended at the start, not from the
    old checkpoint, past records never forwarded."""
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 5)
    log.sync()
    bridge = _bridge(tmp_path, log)
    checkpoint.write(bridge.path, "up", 50, 50)
    bridge.start()
    assert json.loads(Path(bridge.path).read_text())["cursor"] == 5
    for _ in range(60):
        log.append(1_700_000_000_000, 1, False, b"dev", b"a/x", b"new")
    log.write_pending()
    log.sync()
    bridge._on_checkpoint()
    again = _bridge(tmp_path, log)                  # a crash, and a restart
    again.start()
    assert again.outbound.cursor == 5 and again.checkpoint_ahead == 0
    log.close()


def test_a_moved_back_checkpoint_whose_write_failed_is_written_again(tmp_path):
    """The start's write of the checkpoint moved back to the end of the log fails: it is
    tried again at the next checkpoint (before, the bridge took it as written: with the same
    packet ids nothing was written until the cursor moved, and a crash went back to the old
    cursor, past records never forwarded)."""
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 5)
    log.sync()
    bridge = _bridge(tmp_path, log)
    checkpoint.write(bridge.path, "up", 50, 50, pool_of(bridge.config.window))   # its ids
    blocker = Path(bridge.path + ".tmp")    # the temp file cannot be made: the write fails
    blocker.mkdir()
    (blocker / "x").write_text("x")
    bridge.start()
    assert bridge.checkpoint_ahead == 1 and bridge.figures(0)["checkpoint_failures"] == 1
    assert json.loads(Path(bridge.path).read_text())["cursor"] == 50
    assert bridge.figures(0)["checkpoint_cursor"] == 50     # what the file holds
    (blocker / "x").unlink()
    blocker.rmdir()
    bridge._on_checkpoint()
    assert _submitted(bridge) == (5, 5)
    log.close()


def test_a_broker_whose_checkpoint_is_past_its_log_forwards_new_messages(broker):
    remote = FakeRemote()
    try:
        table = bridge_table(remote.port, [{"pattern": "s/#", "direction": "both"}])
        gw = broker(bridge=[table])
        remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        data_dir = gw.config["data_dir"]
        assert gw.stop() == 0
        # What a power cut can leave: the checkpoint fsynced at 50, the log's tail lost.
        path = Path(data_dir) / "bridge-up.json"
        doc = json.loads(path.read_text())
        assert doc["cursor"] < 50
        path.write_text(json.dumps({**doc, "cursor": 50, "sent": 50}))
        gw = broker(bridge=[table], data_dir=data_dir)
        end = remote.accept()
        fig = wait_figure(gw, lambda f: f["state"] == "up")
        assert fig["checkpoint_ahead"] == 1
        assert gw.wait_log(lambda ln: "its checkpoint (offset 50) is past the end of the log"
                           in ln, 5)
        pub = gw.client("pub")
        for i in range(5):
            pub.publish("s/x", str(i).encode(), qos=1)
        got = []
        while len(got) < 5:
            p = end.expect(m.PUBLISH, 5)
            got.append(p.payload)
            end.send(m.puback(p.packet_id))
        assert got == [b"0", b"1", b"2", b"3", b"4"]
        wait_figure(gw, lambda f: f["forwarded"] == 5)
        assert gw.stop() == 0
    finally:
        remote.close()


def test_a_damaged_checkpoint_is_moved_aside_counted_and_the_bridge_starts_at_the_head(
        tmp_path, caplog):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 5)
    bridge = _bridge(tmp_path, log)
    Path(bridge.path).write_text('{"version": 1, "cursor": ')     # cut short
    caplog.set_level(logging.INFO, "edgebroker.bridge")
    bridge.start()
    assert bridge.checkpoint_damaged == 1 and bridge.checkpoint_ahead == 0
    assert Path(bridge.path + ".damaged").read_text() == '{"version": 1, "cursor": '
    assert json.loads(Path(bridge.path).read_text())["cursor"] == 5   # a new one, at the head
    assert bridge.outbound.cursor == 5
    assert "cannot be read" in caplog.text and "counted in checkpoint_damaged" in caplog.text
    assert "bridge up: its checkpoint was damaged: it forwards from the head" in caplog.text
    fig = bridge.figures(0)
    assert (fig["checkpoint_damaged"], fig["checkpoint_failures"]) == (1, 0)
    assert ("up: started 1 time(s) at the head of the log, its checkpoint damaged"
            in format_bridges([fig]))
    log.close()


@pytest.mark.parametrize("text", [
    '{"version": 1, "bridge": "up", "cursor": 1e400, "sent": 1e400}',     # float overflow
    '{"version": 1, "bridge": "up", "cursor": Infinity, "sent": Infinity}',
    '{"version": 1, "bridge": "up", "cursor": NaN, "sent": NaN}',
    '{"version": 1, "bridge": "up", "cursor": 3.5, "sent": 4}',
    '{"version": 1, "bridge": "up", "cursor": true, "sent": true}',
    "[" * 100_000 + "]" * 100_000,                                          # too deep
    "[1, 2]",
    '{"version": 1, "bridge": "up", "cursor": 0, "sent": 0, "subscriptions": ["a/#"]}',
    '{"version": 1, "bridge": "up", "cursor": 0, "sent": 0, "subscriptions": {"a/#": -1}}',
    '{"version": 1, "bridge": "up", "cursor": 0, "sent": 0, "subscriptions": {"": 1}}',
], ids=["1e400", "Infinity", "NaN", "fraction", "true", "deep", "list", "subs-list",
        "subs-id", "subs-empty"])
def test_a_broker_with_any_damaged_checkpoint_starts(broker, mosquitto_broker, tmp_path,
                                                     text):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "bridge-up.json").write_text(text)
    remote = mosquitto_broker()
    table = bridge_table(remote.port, [{"pattern": "s/#", "direction": "out"}])
    gw = broker(bridge=[table], data_dir=str(data_dir))
    fig = wait_figure(gw, lambda f: f["state"] == "up")
    assert (fig["checkpoint_damaged"], fig["cursor"]) == (1, 0), fig
    assert (data_dir / "bridge-up.json.damaged").read_text() == text
    assert gw.wait_log(lambda ln: "bridge-up.json cannot be read" in ln, 5)
    assert gw.stop() == 0


def test_a_fifo_at_the_checkpoint_path_is_moved_aside_and_the_broker_starts(
        broker, mosquitto_broker, tmp_path):
    """open() of a FIFO waits for a writer: the broker would hang at start. It is damage like
    any other: moved aside (still a FIFO), counted, logged, the bridge starts at the head."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    os.mkfifo(data_dir / "bridge-up.json")
    remote = mosquitto_broker()
    table = bridge_table(remote.port, [{"pattern": "s/#", "direction": "out"}])
    gw = broker(bridge=[table], data_dir=str(data_dir))
    fig = wait_figure(gw, lambda f: f["state"] == "up")
    assert (fig["checkpoint_damaged"], fig["cursor"]) == (1, 0), fig
    assert stat.S_ISFIFO(os.stat(data_dir / "bridge-up.json.damaged").st_mode)
    assert stat.S_ISREG(os.stat(data_dir / "bridge-up.json").st_mode)    # a new one
    assert gw.wait_log(lambda ln: "bridge-up.json cannot be read (not a regular file (a FIFO))"
                       in ln, 5)
    assert gw.stop() == 0


def test_failed_checkpoint_writes_are_counted_per_bridge(tmp_path, caplog):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 2)
    bridge = _bridge(tmp_path, log)
    bridge.start()
    writer = bridge.writer = checkpoint.CheckpointWriter()
    writer.start()
    bridge.path = str(tmp_path / "no-such-folder" / "bridge-up.json")    # cannot be written
    other = str(tmp_path / "bridge-other.json")
    writer.submit(bridge.path, "up", 1, 1)
    writer.submit(other, "other", 4, 4)
    writer.stop()
    assert writer.failed == {bridge.path: 1} and writer.failures == 1
    assert writer.on_disk == {other: 4}
    assert "bridge up: cannot write its checkpoint" in caplog.text
    fig = bridge.figures(0)
    assert fig["checkpoint_failures"] == 1
    assert "up: 1 checkpoint writes failed" in format_bridges([fig])
    log.close()


def test_a_first_checkpoint_that_cannot_be_written_is_counted_and_the_bridge_starts(
        tmp_path, caplog):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 3)
    bridge = _bridge(tmp_path, log)
    bridge.path = str(tmp_path / "no-such-folder" / "bridge-up.json")
    caplog.set_level(logging.INFO, "edgebroker.bridge")
    bridge.start()
    assert bridge.outbound.cursor == 3
    assert bridge.figures(0)["checkpoint_failures"] == 1
    assert "bridge up: no checkpoint: it forwards from the head" in caplog.text
    assert "bridge up: cannot write its checkpoint" in caplog.text
    log.close()


def test_a_checkpoint_write_that_failed_is_tried_again_and_holds_the_log_meanwhile(tmp_path):
    """The file stays at 0 while writes of cursor 5 fail: age retention may delete only
    below 0 (a crash goes back there), and the next checkpoint tick tries again."""
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 5)
    log.sync()
    bridge = _bridge(tmp_path, log)
    checkpoint.write(bridge.path, "up", 0, 0)
    bridge.start()
    ob = bridge.outbound
    ob.read()
    while ob.take() is not None:
        pass
    for offset in range(5):
        ob.acked(offset)
    bridge._on_checkpoint()
    assert _submitted(bridge) == (5, 5)       # handed to the writer, whose write fails:
    assert bridge.writer.on_disk[bridge.path] == 0
    assert bridge.hold() == 0
    bridge._on_checkpoint()
    assert _submitted(bridge) == (5, 5)       # again
    bridge.writer.on_disk[bridge.path] = 5    # written
    assert bridge.hold() == 5
    bridge._on_checkpoint()
    assert _submitted(bridge) is None
    log.close()
