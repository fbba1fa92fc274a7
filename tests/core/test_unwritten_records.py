"""A message sent from the commit log (a queued message of a returning persistent session) that
was logged in the same run of loop passes, before the loop handed the records to the OS.

The loop writes the log and sends once for several passes while more input is ready
(server.loop.Loop.run), so a subscriber may come back between a PUBLISH being logged and its
record being written. Its queued message must still be read back from the log and sent."""

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
    assert broker.stats.publish_lost == 0
    if len(payload) > COPY_LIMIT:
        # Payloads this large go from the segment file (sendfile).
        assert len(back.files) == 1, back.out
        head, fd, position, length = back.files[0]
        assert os.pread(fd, length, position) == payload
        assert head[0] >> 4 == 3 and b"t" in head
    else:
        # Smaller ones are copied out of the batch read from the log.
        assert back.files == []
        frames = b"".join(bytes(x) for x in back.out)
        assert frames.endswith(b"\x00\x01t\x00\x01" + payload), frames
    log.close()
