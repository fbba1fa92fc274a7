"""A message sent from the commit log (a queued message of a returning persistent session) that
was logged in the same run of loop passes, before the loop handed the records to the OS.

The loop writes the log and sends once for several passes while more input is ready
(server.loop.Loop.run), so a subscriber may come back between a PUBLISH being logged and its
record being written. Its queued message must still be read back from the log and sent."""

import os
import time

import mqttraw as m
from edgebroker import config
from edgebroker.commitlog.format import LogOptions
from edgebroker.commitlog.log import CommitLog
from edgebroker.core.broker import Broker
from edgebroker.core.testing import FakeTransport


def test_queued_message_logged_in_the_same_passes_is_sent(tmp_path):
    log = CommitLog.open(str(tmp_path / "log"), LogOptions())
    broker = Broker(config.Config(), time.monotonic, commit_log=log,
                    wall_ms=lambda: time.time_ns() // 1_000_000)

    def connect(client_id: str, clean: bool):
        transport = FakeTransport(client_id)
        client = transport.client = broker.connection_made(transport)
        client.data_received(m.connect(client_id, clean=clean))
        return client, transport

    sub, _ = connect("sub", clean=False)
    sub.data_received(m.subscribe(1, [("t", 1)]))
    broker.end_pass()
    sub.data_received(m.disconnect())                    # offline: its messages are queued
    pub, _ = connect("pub", clean=True)
    pub.data_received(m.publish("t", b"while away", qos=1, packet_id=7))
    assert log.pending_bytes > 0, "the record is meant to be still in memory here"

    _, back = connect("sub", clean=False)               # the same run of passes: not written yet
    assert broker.stats.publish_lost == 0
    assert len(back.files) == 1, back.out
    head, fd, position, length = back.files[0]
    assert os.pread(fd, length, position) == b"while away"
    assert head[0] >> 4 == 3 and b"t" in head
    log.close()
