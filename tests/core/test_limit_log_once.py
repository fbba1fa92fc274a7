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
