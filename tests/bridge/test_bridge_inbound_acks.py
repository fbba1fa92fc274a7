"""The bridge acknowledges an inbound message to the remote only once the gateway's log has
written it (the journal's gate, as for a client's PUBACK): on a full disk no PUBACK goes
out until the write succeeds, and a message received but not written when the gateway is
SIGKILLed is sent again by the remote and logged here. The remote is played by the test
(FakeRemote), so every PUBACK the bridge sends is seen; the full disk is a private tmpfs
(tests/diskfull.py)."""

from __future__ import annotations

import os
import signal

import mqttraw as m
from core.test_disk_full import _log_payloads, _small_disk
from diskfull import fill_up, in_private_mount_namespace

from .helpers import FakeRemote, bridge_table, checkpoint, figures, wait_figure

RULES = [{"pattern": "cmd/#", "direction": "in", "qos": 1}]
# Large enough to need pages the full disk cannot give (tests/core/test_disk_full.py).
BIG = b"not acknowledged before it is written " * 1000


def _no_puback(end) -> None:
    try:
        got = end.recv_packet(timeout=1.5)
    except TimeoutError:
        return
    raise AssertionError(f"{got!r} sent while the record could not be written")


def test_inbound_acknowledged_once_written_and_resent_after_a_sigkill(broker, tmp_path,
                                                                      request):
    if not in_private_mount_namespace(request):
        return
    small, data_dir = _small_disk(tmp_path)
    remote = FakeRemote()
    try:
        gw = broker(data_dir=data_dir, bridge=[bridge_table(remote.port, RULES)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        # The checkpoint names the bridge's packet ids (released after the restart below).
        wait_figure(gw, lambda f: checkpoint(data_dir).get("packet_ids") == 202)
        local = gw.client("local")
        local.subscribe("cmd/#", qos=1)

        # 1. The disk has room: acknowledged (once written) and routed here.
        end.send(m.publish("cmd/a", b"one", qos=1, packet_id=1))
        assert end.expect(m.PUBACK).packet_id == 1
        assert local.recv_publish().payload == b"one"

        # 2. The disk is full: no PUBACK while the record cannot be written; then it is.
        fill_up(small / "filler")
        mark = gw.mark()
        end.send(m.publish("cmd/a", BIG, qos=1, packet_id=2))
        assert gw.wait_log(lambda ln: "commit log cannot write" in ln, 5, mark)
        _no_puback(end)
        os.unlink(small / "filler")
        assert end.expect(m.PUBACK).packet_id == 2
        assert local.recv_publish().payload == BIG
        assert gw.wait_log(lambda ln: "writes work again" in ln, 5, mark)

        # 3. Full again; the gateway is SIGKILLed with the record unwritten (so unacknowledged):
        # the remote sends it again to the restarted gateway, which logs it.
        fill_up(small / "filler")
        mark = gw.mark()
        third = b"three " + BIG
        end.send(m.publish("cmd/a", third, qos=1, packet_id=3))
        assert gw.wait_log(lambda ln: "commit log cannot write" in ln, 5, mark)
        _no_puback(end)
        gw.stop(signal.SIGKILL)
        assert end.expect_closed(5) and not [p for p in end.before_close
                                              if p.type == m.PUBACK]
        os.unlink(small / "filler")
        gw = broker(data_dir=data_dir, bridge=[bridge_table(remote.port, RULES)])
        # The kept session first gets PUBREL for the previous run's packet ids (1 to twice
        # the window and 2: bridge/release.py), which the remote answers.
        end = remote.accept(session_present=True, released=202)
        end.send(m.publish("cmd/a", third, qos=1, dup=True, packet_id=3))
        assert end.expect(m.PUBACK).packet_id == 3
        fig = wait_figure(gw, lambda f: f["received"] == 1)
        assert fig["received_dropped"] == 0
        assert gw.stop() == 0
        assert _log_payloads(data_dir) == ["one", BIG.decode(), third.decode()]
    finally:
        remote.close()


def test_reconnects_while_the_disk_is_full_keep_reading_paused(broker, tmp_path, request):
    """While the log cannot write the link is not read, so its PINGRESP is not either: the
    keepalive drops the link and the bridge connects again. Each new link is not read
    either (past its CONNACK): what the remote sends waits there, not in the gateway's
    memory, however many times the link is made again."""
    if not in_private_mount_namespace(request):
        return
    small, data_dir = _small_disk(tmp_path)
    remote = FakeRemote()
    try:
        gw = broker(data_dir=data_dir, bridge=[bridge_table(remote.port, RULES, keepalive=1)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        fill_up(small / "filler")
        mark = gw.mark()
        end.send(m.publish("cmd/a", BIG, qos=1, packet_id=1))
        assert gw.wait_log(lambda ln: "commit log cannot write" in ln, 5, mark)
        wait_figure(gw, lambda f: f["received"] == 1)   # waits for the disk, not acknowledged
        for connects in (2, 3):
            # No PINGRESP is read: the link is dropped and made again (keepalive 1 s).
            new = remote.accept(session_present=True, subscribe=False)
            end.close()
            end = new
            wait_figure(gw, lambda f: f["connects"] == connects)
            # The remote sends the unacknowledged message again, and more: none is read.
            end.send(m.publish("cmd/a", BIG, qos=1, dup=True, packet_id=1)
                     + b"".join(m.publish("cmd/b", b"%d" % i, qos=1, packet_id=2 + i)
                                for i in range(20)))
        fig = figures(gw)
        assert (fig["received"], fig["received_held"], fig["connects"]) == (1, 0, 3), fig
        os.unlink(small / "filler")
        assert gw.wait_log(lambda ln: "writes work again" in ln, 5, mark)
        assert gw.stop() == 0
        assert _log_payloads(data_dir)[0] == BIG.decode()
    finally:
        remote.close()
