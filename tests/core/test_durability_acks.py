"""When a QoS 1 publish is acknowledged under each `[log] durability` setting.

The broker's own figures (`inspect stats` through the admin socket, section "log") show the
log's offsets: `written_offset` (handed to the OS) and `durable_offset` (covered by an fsync).
A flush interval of a minute makes the difference between the settings visible.
"""

import pytest

N = 20


def log_figures(b) -> dict:
    return b.stats()["log"]


def test_sync_acknowledges_only_what_an_fsync_covers(broker, uid):
    b = broker(log={"durability": "sync", "flush_interval_ms": 60_000})
    pub = b.client(f"{uid}-p")
    for i in range(N):
        offset = log_figures(b)["next_offset"]          # the offset this publish gets
        pub.publish(f"{uid}/t", b"m%d" % i, qos=1)      # returns once PUBACK is in
        fig = log_figures(b)
        assert fig["durable_offset"] > offset, (i, offset, fig)
    assert fig["fsyncs"] >= 1 and fig["acks_waiting"] == 0


def test_batch_acknowledges_after_the_write_and_fsyncs_later(broker, uid):
    # One fsync at once for the first write after a quiet spell, the next a minute later: under
    # the minute, the acknowledgements of the later publishes did not wait for an fsync.
    b = broker(log={"durability": "batch", "flush_interval_ms": 60_000})
    pub = b.client(f"{uid}-p")
    first = log_figures(b)["next_offset"]
    for i in range(N):
        pub.publish(f"{uid}/t", b"m%d" % i, qos=1, timeout=5)
    fig = log_figures(b)
    assert fig["written_offset"] == first + N, fig
    assert fig["durable_offset"] < fig["written_offset"], fig
    assert fig["fsyncs"] <= 1 and fig["acks_waiting"] == 0


@pytest.mark.parametrize("durability", ["none", "batch"])
def test_sequential_publishes_are_not_held_by_the_flush_interval(broker, uid, durability):
    b = broker(log={"durability": durability, "flush_interval_ms": 60_000})
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=1)
    pub = b.client(f"{uid}-p")
    for i in range(N):
        pub.publish(f"{uid}/t", b"m%d" % i, qos=1, timeout=5)
    assert [sub.recv_publish().payload for _ in range(N)] == [b"m%d" % i for i in range(N)]
    fig = log_figures(b)
    assert fig["durable_offset"] < fig["written_offset"], fig    # acknowledged before any fsync
