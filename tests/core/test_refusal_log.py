"""The log under attack (issue 26, item 8): refused and misbehaving connections are logged in
full the first time a kind comes from an address, then only counted, and one line per interval
says how many (``refusal_log_interval``; core.limits.PeerLog). The counters stay exact.

Before: one line per connection (757,000 lines, 133 MB, in ten minutes of attack)."""

import logging
import re

import mqttraw as m
from edgebroker.core import limits as L

FLOOD = 150


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _logger(name: str) -> tuple[logging.Logger, Lines]:
    logger = logging.getLogger(f"test.peerlog.{name}")
    logger.propagate = False
    logger.handlers[:] = [handler := Lines()]
    logger.setLevel(logging.DEBUG)
    return logger, handler


def test_source_address_of_a_peer():
    assert L.source_of("10.0.0.7:51234") == "10.0.0.7"
    assert L.source_of("[::1]:1883") == "::1"
    assert L.source_of("unix:/run/eb.sock (pid 42, uid 1000)") == "unix:/run/eb.sock (uid 1000)"
    assert L.source_of("unix:/run/eb.sock") == "unix:/run/eb.sock"
    assert L.source_of("fake") == "fake"


def test_first_line_per_kind_and_address_then_a_count_per_period():
    logger, out = _logger("counts")
    log = L.PeerLog(0.0, period=60)
    for i in range(100):
        log.log(logger, logging.WARNING, "protocol_error", f"10.0.0.1:{1000 + i}",
                "client %d: protocol violation", i)
    log.log(logger, logging.INFO, "auth", "10.0.0.1:5", "refused %s", "bad password")
    log.log(logger, logging.WARNING, "protocol_error", "10.0.0.2:5", "client %d: protocol "
            "violation", 100)
    assert out.lines == ["client 0: protocol violation", "refused bad password",
                         "client 100: protocol violation"]
    log.flush(60.0)
    assert out.lines[3:] == ["99 more protocol violations from 10.0.0.1 in the last 60 s "
                             "(counted, not logged)"]
    # Still at it in the next period: only counted; then quiet for a period: forgotten, so the
    # next one is logged in full again.
    log.log(logger, logging.WARNING, "protocol_error", "10.0.0.1:7", "client again")
    log.flush(120.0)
    assert out.lines[4:] == ["1 more protocol violations from 10.0.0.1 in the last 60 s "
                             "(counted, not logged)"]
    log.flush(180.0)
    log.log(logger, logging.WARNING, "protocol_error", "10.0.0.1:8", "client back")
    assert out.lines[5:] == ["client back"]


def test_addresses_beyond_the_cap_are_counted_together():
    logger, out = _logger("cap")
    log = L.PeerLog(0.0, period=60, max_sources=3)
    for i in range(10):
        for _ in range(2):
            log.log(logger, logging.WARNING, "not_mqtt", f"10.0.1.{i}:99", "from %d", i)
    assert out.lines == ["from 0", "from 1", "from 2", "from 3"]
    assert len(log) == 3
    log.flush(60.0)
    assert sorted(out.lines[4:]) == sorted(
        [f"1 more connections not starting with CONNECT from 10.0.1.{i} in the last 60 s "
         "(counted, not logged)" for i in range(3)]
        + ["13 more connections not starting with CONNECT from addresses not tracked (over 3 "
           "addresses were tracked) in the last 60 s (counted, not logged)"])


def test_interval_zero_logs_every_line():
    logger, out = _logger("zero")
    log = L.PeerLog(0.0, period=0)
    for i in range(5):
        log.log(logger, logging.INFO, "auth", "10.0.0.1:1", "line %d", i)
    log.flush(60.0)
    assert out.lines == [f"line {i}" for i in range(5)] and len(log) == 0


def _bad_connect(client_id: str) -> bytes:
    """A CONNECT with the reserved flag set (MQTT-3.1.2-3): a protocol violation."""
    return m.connect(client_id, flags_override=0x03)


def test_a_flood_of_refusals_from_one_address_logs_a_bounded_number_of_lines(broker, uid):
    b = broker(refusal_log_interval=60)
    mark = b.mark()
    for i in range(FLOOD):
        for data in (_bad_connect(f"{uid}-{i}"),                    # protocol violation
                     m.connect(f"{uid}-{i}", level=9),              # refused: CONNACK 1
                     b"\xff\x00garbage"):                            # not MQTT
            c = b.raw()
            c.send(data)
            assert c.expect_closed(5)
    stats = b.stats()       # every one counted
    assert stats["counters"]["protocol_errors"] == FLOOD
    assert stats["refused"]["protocol_version"] == FLOOD
    assert stats["refused"]["not_mqtt"] == FLOOD
    flood = b.logs[mark:]
    assert sum("protocol violation" in ln for ln in flood) == 1
    assert sum("refused (CONNACK 1)" in ln for ln in flood) == 1
    assert sum("does not start with CONNECT" in ln for ln in flood) == 1
    assert len(flood) < 10, flood
    # The first line is as full as ever.
    line = next(ln for ln in flood if "protocol violation" in ln)
    assert "client (before CONNECT) from 127.0.0.1:" in line and "[MQTT-3.1.2-3]" in line
    # A different kind from the same address still gets its own first line.
    c = b.raw()
    c.send(b"GET / HTTP/1.1\r\n\r\n")
    assert c.read_until_closed().startswith(b"HTTP/1.1 400 ")
    assert b.wait_log("HTTP request ('GET') received on MQTT listener", start=mark)
    # The counts come at the end of the interval, or at the stop.
    assert b.stop() == 0
    summaries = [ln for ln in b.logs[mark:] if "more" in ln and "from 127.0.0.1" in ln]
    counts = {re.search(r"\d+ more (.+) from 127\.0\.0\.1", ln).group(1):
              int(re.search(r"(\d+) more", ln).group(1)) for ln in summaries}
    assert counts == {"protocol violations": FLOOD - 1,
                      "CONNECTs refused for their protocol version": FLOOD - 1,
                      "connections not starting with CONNECT": FLOOD - 1}, summaries


def test_max_sessions_refusals_are_logged_once_per_address_then_counted(broker, uid):
    b = broker(refusal_log_interval=60, limits={"max_sessions": 1})
    b.client(f"{uid}-kept", clean=False)
    mark = b.mark()
    for i in range(5):
        c = b.raw()
        c.send(m.connect(f"{uid}-new-{i}", clean=False))
        assert c.expect(m.CONNACK).rc == 3
    assert b.stats()["refused"]["max_sessions"] == 5
    assert b.stop() == 0
    lines = [ln for ln in b.logs[mark:] if "max_sessions" in ln]
    assert len(lines) == 2, lines
    assert f"'{uid}-new-0'" in lines[0] and "refused (CONNACK 3" in lines[0]
    assert "4 more CONNECTs refused for max_sessions from 127.0.0.1" in lines[1], lines
