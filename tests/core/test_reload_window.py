"""A reload that raises max_inflight_messages (or max_inflight_bytes) fills a connected
client's window at once, not at its next acknowledgement (docs/config.md, "Reloading")."""

import signal

import mqttraw as m
from conftest import toml_dumps


def reload_with(b, **limits):
    b.config_path.write_text(toml_dumps(dict(b.config, limits={**b.config.get("limits", {}),
                                                               **limits})))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", start=mark), b.log_text()


def test_a_raised_window_is_filled_at_the_reload(broker, uid):
    b = broker(limits={"max_inflight_messages": 5})
    sub = b.raw()
    assert sub.connect(f"{uid}-sub", clean=False).rc == 0
    sub.subscribe(f"{uid}/t", qos=1)
    pub = b.client(f"{uid}-pub")
    for i in range(20):
        pub.publish(f"{uid}/t", f"m{i}".encode(), qos=1)
    got = [p for p in sub.ping() if p.type == m.PUBLISH]
    while len(got) < 5:
        got.append(sub.expect(m.PUBLISH))
    assert [p.payload for p in got] == [f"m{i}".encode() for i in range(5)]
    assert [p for p in sub.ping() if p.type == m.PUBLISH] == []     # window full, no ack sent
    reload_with(b, max_inflight_messages=30)
    more = [p.payload for p in sub.ping() if p.type == m.PUBLISH]
    assert more == [f"m{i}".encode() for i in range(5, 20)], more
