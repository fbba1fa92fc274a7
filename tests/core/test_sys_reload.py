"""$SYS turned on or off by a reload: turned on, $SYS/broker/version is published as at a
start with $SYS on (it was published at start only, so never); turned off, the retained $SYS
messages are cleared instead of staying frozen at their last values."""

import signal

import edgebroker
from conftest import toml_dumps


def reload_with(b, **changes) -> None:
    b.config = {**b.config, **changes}
    b.config_path.write_text(toml_dumps(b.config))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", start=mark, timeout=10), b.log_text()


def retained_under_sys(b, client_id: str) -> list:
    """The retained $SYS messages a new subscriber gets (a marker published after the
    SUBSCRIBE on the same connection ends the wait: they come before it)."""
    c = b.client(client_id)
    c.subscribe("$SYS/#")
    c.subscribe(f"{client_id}/end")
    c.publish(f"{client_id}/end", b"end")
    got = []
    for _ in range(1000):
        p = c.recv_publish()
        if p.topic == f"{client_id}/end":
            return got
        got.append(p)
    raise AssertionError("no end marker")


def test_sys_turned_on_by_a_reload_publishes_the_version(broker, uid):
    b = broker(sys_interval=0)
    c = b.client(uid)
    c.subscribe("$SYS/broker/version")
    c.subscribe("$SYS/broker/uptime")
    reload_with(b, sys_interval=1)
    p = c.recv_publish(timeout=5)
    assert (p.topic, p.payload) == ("$SYS/broker/version",
                                    f"edgebroker version {edgebroker.__version__}".encode())
    assert c.recv_publish(timeout=5).topic == "$SYS/broker/uptime"   # the first report
    topics = {p.topic for p in retained_under_sys(b, uid + "n")}
    assert "$SYS/broker/version" in topics and "$SYS/broker/uptime" in topics


def test_sys_turned_off_by_a_reload_clears_the_retained_sys_messages(broker, uid):
    b = broker(sys_interval=1)
    c = b.client(uid)
    c.subscribe("$SYS/broker/uptime")
    assert c.recv_publish(timeout=5).payload
    reload_with(b, sys_interval=0)
    for _ in range(100):            # a report may come before the reload: then the clearing
        p = c.recv_publish(timeout=5)
        if not p.payload:
            break
    assert (p.topic, p.payload) == ("$SYS/broker/uptime", b"")
    assert retained_under_sys(b, uid + "n") == []
    reload_with(b, sys_interval=1)      # and on again: all of it, the version included
    assert c.recv_publish(timeout=5).payload      # (the first report: uptime)
    topics = {p.topic for p in retained_under_sys(b, uid + "m")}
    assert "$SYS/broker/version" in topics and "$SYS/broker/uptime" in topics
