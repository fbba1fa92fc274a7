"""Every limit reached is logged once per connection and per kind of event
(docs/limits.md): one kind logged does not silence another."""


def test_a_refused_subscription_does_not_silence_a_dropped_publish(broker, uid):
    """A SUBSCRIBE refused for max_topic_levels and, later, a QoS 0 PUBLISH dropped for
    the same limit: both are logged, each once; a repeat of either is only counted."""
    b = broker(limits={"max_topic_levels": 3})
    c = b.client(f"{uid}-c")
    mark = b.mark()
    assert c.subscribe(f"{uid}/a/b/c").codes == [0x80]
    assert c.subscribe(f"{uid}/a/b/d").codes == [0x80]          # counted, not logged again
    c.publish(f"{uid}/x/y/z", b"1")                             # new topic: dropped
    c.publish(f"{uid}/x/y/w", b"2")                             # counted, not logged again
    assert c.ping() == []
    line = b.wait_log(lambda ln: f"{uid}/x/y/z" in ln, start=mark)
    assert line is not None and f"{uid}-c" in line and "max_topic_levels (3)" in line
    s = b.stats()
    assert s["limit_hits"]["max_topic_levels"] == 4
    assert s["dropped"]["max_topic_levels"] == 2
    mine = [ln for ln in b.logs[mark:] if f"{uid}-c" in ln and "max_topic_levels" in ln]
    assert len(mine) == 2, mine
    assert f"subscription to '{uid}/a/b/c' refused" in mine[0]
    assert f"publish to new topic '{uid}/x/y/z' refused" in mine[1]


def test_a_full_inflight_window_is_logged_once_per_connection(broker, uid):
    """QoS 1 messages beyond max_inflight_messages wait for an acknowledgement: counted in
    limit_hits and logged once, naming the client and the limit."""
    b = broker(limits={"max_inflight_messages": 1})
    sub = b.client(f"{uid}-slow")
    assert sub.subscribe(f"{uid}/t", qos=1).codes == [1]
    pub = b.client(f"{uid}-pub")
    mark = b.mark()
    for i in range(3):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)          # waits for its PUBACK
    first = sub.recv_publish(ack=False)
    assert first.payload == b"0"
    line = b.wait_log(lambda ln: "max_inflight_messages 1" in ln, start=mark)
    assert line is not None and f"{uid}-slow" in line and "1 QoS 1/2 messages" in line
    sub.ack(first)
    assert [p.payload for p in (sub.recv_publish(), sub.recv_publish())] == [b"1", b"2"]
    assert b.stats()["limit_hits"]["max_inflight_messages"] >= 1
    lines = [ln for ln in b.logs[mark:] if "max_inflight_messages" in ln]
    assert len(lines) == 1, lines
