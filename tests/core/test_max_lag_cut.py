"""max_lag_bytes skips QoS 0 records only while the session is that far behind the end of the
log: the records within max_lag_bytes of the end are delivered (docs/limits.md)."""

import pytest


@pytest.mark.parametrize("filters", [("l/#",), ("l/#", "other/#")], ids=["run", "batch"])
def test_qos0_within_max_lag_bytes_of_the_end_is_delivered(broker, uid, filters):
    # One filter: the catch-up reads runs (core.catchup_run); two: batches (core.catchup).
    b = broker(limits={"max_lag_bytes": 2000, "queue_qos0_messages": True})
    sub = b.client(f"{uid}-lag", clean=False)
    for f in filters:
        assert sub.subscribe(f"{uid}/{f}", qos=1).codes == [1]
    sub.disconnect()
    pub = b.client(f"{uid}-pub")
    for i in range(100):                          # about 12 KB of log
        pub.publish(f"{uid}/l/a", b"%03d" % i + b"x" * 100)
    assert pub.ping() == []
    sub = b.client(f"{uid}-lag", clean=False)
    got = []
    for _ in range(100):
        got.append(int(sub.recv_publish(timeout=5).payload[:3]))
        if got[-1] == 99:
            break
    assert got == list(range(100 - len(got), 100)), got
    assert 10 <= len(got) <= 20, got              # 2000 bytes hold about 15 of them
    s = b.stats()
    assert s["dropped"]["max_lag"] == 100 - len(got)
    assert s["limit_hits"]["max_lag_bytes"] >= 1
    assert sub.ping() == []
