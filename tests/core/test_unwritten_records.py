"""A message for a returning persistent session that was logged in the same run of loop passes,
before the loop handed the records to the OS.

The loop writes the log and sends once for several passes while more input is ready
(server.loop.Loop.run), so a subscriber may come back between a PUBLISH being logged and its
record being written. The message must reach it once."""

import os
import time

import mqttraw as m
import pytest
from edgebroker import config
from edgebroker.commitlog.format import LogOptions
from edgebroker.commitlog.log import CommitLog
from edgebroker.commitlog.reader import COPY_LIMIT
from edgebroker.core.broker import Broker
from edgebroker.core.testing import FakeTransport


@pytest.mark.parametrize("payload", [b"while away", b"L" * (COPY_LIMIT + 1)],
                         ids=["small-from-memory", "large-sendfile"])
def test_queued_message_logged_in_the_same_passes_is_sent(tmp_path, payload):
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
    sub.data_received(m.disconnect())                    # offline: it reads from the log later
    pub, _ = connect("pub", clean=True)
    pub.data_received(m.publish("t", payload, qos=1, packet_id=7))
    assert log.pending_bytes > 0, "the record is meant to be still in memory here"

    _, back = connect("sub", clean=False)               # the same run of passes: not written yet
    broker.end_pass()                                   # the pass ends: written, then routed
    assert broker.stats.publish_lost == 0
    # Once: the session's cursor hands over to live routing at the first message not yet
    # routed (Router.live_offset), so it is not also read from the log.
    sent = b"".join(bytes(x) for x in back.out) + b"".join(
        bytes(head) + os.pread(fd, length, position) for head, fd, position, length in back.files)
    frames = [p for p in m.split_frames(bytearray(sent)) if p.type == m.PUBLISH]
    assert [(p.topic, p.payload) for p in frames] == [("t", payload)]
    log.close()
