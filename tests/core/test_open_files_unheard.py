"""A caller accepted on a reserved descriptor (the open files limit: docs/limits.md) that
sends no CONNECT is a refusal for the open files limit, not a connect timeout."""

import resource

import mqttraw as m

NOFILE = 120


def test_a_caller_refused_for_open_files_that_sends_nothing_is_counted_as_open_files(broker,
                                                                                    uid):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    try:
        b = broker(limits={"connect_timeout": 30})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    room = NOFILE - 64 - 4 - 2           # as in test_limits_connections: a new log's needs
    clients = [b.client(f"{uid}-{i}") for i in range(room)]
    mark = b.mark()
    silent = b.raw()                     # on a reserved descriptor; sends nothing
    assert silent.expect_closed(5)
    line = b.wait_log("refused (closed: no CONNECT within 2 s)", start=mark)
    assert line is not None and "open files limit (120)" in line, b.logs[mark:]
    s = b.stats()
    assert s["refused"]["open_files"] == 1 and s["limit_hits"]["open_files"] >= 1
    assert s["limit_hits"]["connect_timeout"] == 0 and s["counters"]["connect_timeouts"] == 0
    assert not any("no CONNECT within" in ln and "closing" in ln for ln in b.logs[mark:])
    late = b.raw()                       # the reserve is free again: the next is refused too
    late.send(m.connect(f"{uid}-late"))
    assert late.expect(m.CONNACK, timeout=3).rc == 3 and late.expect_closed(3)
    assert clients[0].ping() == []
