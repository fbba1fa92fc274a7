"""Connection limits with real clients (docs/limits.md): max_connections broker-wide and per
listener, the connection rate, the memory guard, and clients that do not speak MQTT."""

import resource
import socket
import ssl
import time
from pathlib import Path
import urllib.error
import urllib.request

import psutil
import pytest

import mqttraw as m
import mqttraw5 as R
from conftest import toml_dumps
from mqttraw import CONNACK


def _wait_stats(b, pred, timeout: float = 5.0) -> dict:
    """The broker's stats once ``pred(stats)`` holds (bounded wait)."""
    deadline = time.monotonic() + timeout
    while True:
        s = b.stats()
        if pred(s):
            return s
        assert time.monotonic() < deadline, s
        time.sleep(0.02)


def refused_connack(b, client_id, port=None) -> int:
    """CONNECT and return the CONNACK code of a refusal, checking the connection then closes."""
    c = b.raw(port)
    ack = c.connect(client_id)
    assert ack.rc != 0, f"{client_id} was accepted"
    assert c.expect_closed(5)
    return ack.rc


def test_max_connections_refuses_with_connack_3_and_counts(broker, uid):
    b = broker(limits={"max_connections": 3})
    first = [b.client(f"{uid}-{i}") for i in range(3)]
    mark = b.mark()
    assert refused_connack(b, f"{uid}-extra") == 3
    line = b.wait_log("refused (CONNACK 3", start=mark)
    assert line and f"{uid}-extra" in line and "max_connections" in line
    for c in first:  # the others keep working
        assert c.ping() == []
    # The same client id again is a takeover, not a fourth connection.
    again = b.client(f"{uid}-0")
    assert first[0].expect_closed(5)
    assert again.ping() == []
    first[1].disconnect()
    b.client(f"{uid}-later")  # room again
    s = b.stats()
    assert s["refused"]["max_connections"] == 1 and s["limit_hits"]["max_connections"] == 1
    assert s["clients_connected"] == 3


@pytest.mark.parametrize("limit", [20, 4])
def test_a_5_0_refusal_at_max_connections_keeps_to_the_clients_maximum_packet_size(
        broker, uid, limit):
    """MQTT-3.1.2-24: the CONNACK 0x97 went whatever the client's limit (5 bytes to a client of
    4), and the line said CONNACK 3; now its Reason String is left out, or, when even that
    does not fit, the connection closes without one, and the line says which."""
    b = broker(limits={"max_connections": 1})
    held = b.client(f"{uid}-0")
    mark = b.mark()
    c = R.RawClient5(b.host, b.port)
    c.send(R.connect5(f"{uid}-x", props={R.MAXIMUM_PACKET_SIZE: limit}))
    assert c.expect_closed()
    line = b.wait_log(f"{uid}-x", start=mark)
    if limit == 20:
        [ack] = c.before_close
        assert ack.reason == 0x97 and not ack.properties, ack
        assert "refused (CONNACK 0x97)" in line, line
    else:
        assert c.before_close == []
        assert "refused (closed: a CONNACK 0x97 would be larger than its Maximum Packet Size " \
               "(4))" in line, line
    c.close()
    assert held.ping() == []


@pytest.mark.parametrize("limit", ["max_connections", "max_sessions"])
def test_logins_checked_side_by_side_do_not_pass_the_limit(broker, uid, tmp_path, limit):
    """Three CONNECTs with passwords at once, room for one: the password checks run side by
    side and each CONNECT was admitted before its check, so all three got in (uncounted).
    The limits are asked again once a check is back: one gets in, two get CONNACK 3."""
    from secfiles import write_passwords
    users = {f"u{i}": f"pw{i}" for i in range(3)}
    pw = write_passwords(tmp_path / "passwd", users)
    b = broker(password_file=str(pw), limits={limit: 1})
    clients = [b.raw() for _ in users]
    for i, (c, (user, password)) in enumerate(zip(clients, users.items())):
        c.send(m.connect(f"{uid}-{i}", clean=limit != "max_sessions", username=user,
                         password=password))
    codes = sorted(c.expect(CONNACK).rc for c in clients)
    assert codes == [0, 3, 3]
    s = b.stats()
    assert s["refused"][limit] == 2 and s["limit_hits"][limit] == 2
    assert s["clients_connected"] == 1


def test_listener_max_connections(broker, uid):
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "max_connections": 1},
                         {"host": "127.0.0.1", "port": 0}])
    (_, small), (_, other) = b.listeners
    b.client(f"{uid}-a", port=small)
    assert refused_connack(b, f"{uid}-b", port=small) == 3
    b.client(f"{uid}-c", port=other)
    b.client(f"{uid}-d", port=other)
    s = b.stats()
    assert s["refused"]["listener_max_connections"] == 1
    assert s["limit_hits"]["listener_max_connections"] == 1 and s["clients_connected"] == 3
    rows = {r["id"]: r for r in b.admin("clients", limit=0)["clients"]}
    assert rows[f"{uid}-a"]["listener"].endswith(f":{small}")


def test_connection_rate_pauses_accepting_without_spinning(broker, uid):
    rate, burst, n = 5, 3, 10
    b = broker(limits={"max_connection_rate": rate, "connection_burst": burst})
    busy = b.client(f"{uid}-busy")  # uses one token
    proc = psutil.Process(b.proc.pid)
    cpu0 = sum(proc.cpu_times()[:2])
    mark = b.mark()
    t0 = time.monotonic()
    socks = [b.raw() for _ in range(n)]  # the kernel completes these from the listen backlog
    for i, s in enumerate(socks):
        s.send(m.connect(f"{uid}-{i}"))
    # While accepting is paused, connected clients are served at once.
    t_ping = time.monotonic()
    assert busy.ping() == []
    assert time.monotonic() - t_ping < 0.5
    times = []
    for s in socks:
        assert s.expect(CONNACK, timeout=10).rc == 0
        times.append(time.monotonic() - t0)
    # burst - 1 tokens were left; the rest come at the rate (+ one pause of slack).
    expected = (n - (burst - 1)) / rate
    assert times[-1] >= expected - 1 / rate, times
    assert times[-1] < expected + 3.0, times
    assert sum(t < 0.15 for t in times) <= burst
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    assert cpu < 0.5 * times[-1], f"broker used {cpu:.2f} s CPU while pausing for {times[-1]:.2f} s"
    assert b.stats()["limit_hits"]["max_connection_rate"] >= 1
    line = b.wait_log("max_connection_rate", start=mark)
    assert line and "accepting paused" in line


def test_memory_limit_refuses_new_connections_and_topics_then_recovers(broker, uid):
    """Above memory_limit a new connection is closed as soon as it is accepted (nothing of it
    is read: a caller not yet connected may hold up to the largest valid CONNECT), and a
    publish to a new topic is dropped; connected clients and known topics keep working."""
    b = broker()
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/#")
    pub = b.client(f"{uid}-pub")
    pub.publish(f"{uid}/known", b"1")
    assert sub.recv_publish().payload == b"1"

    def reload(**limits):
        b.config_path.write_text(toml_dumps(dict(b.config, limits=limits)))
        b.send_signal(__import__("signal").SIGHUP)

    mark = b.mark()
    reload(memory_limit=1_000_000)  # far below any Python process
    line = b.wait_log("above memory_limit", timeout=5, start=mark)
    assert line and "refusing new connections and new topics" in line
    late = b.raw()                          # closed at once, before its CONNECT is read
    late.send(m.connect(f"{uid}-new"))
    assert late.expect_closed(5)
    closed = b.wait_log("closed at once", timeout=5, start=mark)
    assert closed and "above memory_limit" in closed, closed
    pub.publish(f"{uid}/known", b"2")       # known topic: delivered
    pub.publish(f"{uid}/new", b"3")         # new topic: dropped (QoS 0)
    assert pub.ping() == []
    got = sub.ping()
    assert [p.payload for p in got] == [b"2"]
    b.raw().expect_closed(5)                # a second one: counted, not logged again
    s = b.stats()
    assert s["process"]["memory_over_limit"] is True
    assert s["refused"]["memory_limit"] == 2 and s["dropped"]["memory_limit"] == 1
    assert s["limit_hits"]["memory_limit"] == 3
    assert len([ln for ln in b.logs[mark:] if "closed at once" in ln]) == 1
    assert b.alive()

    mark = b.mark()
    reload(memory_limit=0)
    assert b.wait_log("memory_limit turned off", timeout=5, start=mark)
    b.client(f"{uid}-new")
    pub.publish(f"{uid}/new", b"4")
    assert sub.recv_publish().payload == b"4"


def test_memory_limit_auto_by_default_is_half_the_memory_available(broker):
    """At the default configuration memory_limit is "auto": half of the machine's memory, or
    of the control group's limit when that is lower; the start log says which. A reload to
    0 turns it off, and back to "auto" says the figure again."""
    b = broker()
    line = b.wait_log("memory_limit ", timeout=5)
    assert line and "(auto: half of" in line, line
    limit = b.stats()["process"]["memory_limit_bytes"]
    machine = psutil.virtual_memory().total
    if "(the machine's memory)" in line:
        assert limit == machine // 2
    else:       # a control group's file, named in the line: its figure
        path = line.rsplit("(", 1)[1].rstrip(")").strip()
        assert path.startswith("/sys/fs/cgroup/"), line
        assert limit == int(Path(path).read_text()) // 2 < machine // 2
    assert f"memory_limit {limit} bytes" in line
    assert b.stats()["process"]["memory_over_limit"] is False

    def reload(**limits):
        b.config_path.write_text(toml_dumps(dict(b.config, limits=limits)))
        b.send_signal(__import__("signal").SIGHUP)

    mark = b.mark()
    reload(memory_limit=0)
    assert _wait_stats(b, lambda s: s["process"]["memory_limit_bytes"] == 0)
    reload(memory_limit="auto")
    assert _wait_stats(b, lambda s: s["process"]["memory_limit_bytes"] == limit)
    # (The line may reach the test's log reader after the stats answer.)
    assert b.wait_log("(auto: half of", timeout=5, start=mark)
    assert len([ln for ln in b.logs[mark:] if "(auto: half of" in ln]) == 1


def test_tls_client_on_plain_port_is_told_and_closed(broker):
    b = broker()
    mark = b.mark()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((b.host, b.port), timeout=5) as raw:
        local = raw.getsockname()[1]
        try:
            ctx.wrap_socket(raw, server_hostname="gateway").close()
            handshake_failed = False
        except (ssl.SSLError, OSError):
            handshake_failed = True
    assert handshake_failed
    want = (f"TLS handshake received on plain MQTT listener 127.0.0.1:{b.port} from "
            f"127.0.0.1:{local} — use the TLS listener or disable TLS in the client")
    assert b.wait_log(want, start=mark), b.log_text()
    assert b.stats()["refused"]["tls"] == 1


def test_http_client_on_mqtt_port_gets_400(broker):
    b = broker()
    mark = b.mark()
    try:
        urllib.request.urlopen(f"http://{b.host}:{b.port}/status", timeout=5)
        raise AssertionError("HTTP request succeeded on the MQTT port")
    except urllib.error.HTTPError as err:
        assert err.code == 400
        body = err.read()
    assert b"MQTT port" in body and body.count(b"\n") == 1
    line = b.wait_log("HTTP request", start=mark)
    assert line and "'GET'" in line and f"127.0.0.1:{b.port}" in line
    stats = b.stats()
    assert stats["refused"]["http"] == 1
    # The total counts refusals before CONNECT too (it disagreed with the breakdown).
    assert stats["counters"]["connections_refused"] == 1


def test_not_mqtt_is_closed_and_logged_in_hex(broker, uid):
    b = broker()
    mark = b.mark()
    c = b.raw()
    c.send(b"\xff\xfe\x00\x01hello")
    assert c.expect_closed(5) and c.before_close == []
    line = b.wait_log("does not start with CONNECT", start=mark)
    assert line and "ff fe 00 01 68 65 6c 6c 6f" in line
    assert b.stats()["refused"]["not_mqtt"] == 1
    assert b.client(uid).ping() == []


def test_open_files_limit_refuses_callers_before_the_broker_runs_out(broker, uid):
    # A broker whose open files limit is far below max_connections: connections may take what
    # is left after the commit log's descriptors, the broker's own (64) and 4 kept in reserve,
    # never the last ones. So the admin socket keeps answering and the log can still roll; new
    # callers are accepted with a reserved descriptor and refused with CONNACK 3 at once.
    nofile = 160
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    try:
        b = broker(log={"segment_bytes": 1 << 20, "retention_bytes": 4 << 20})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # At its retention the log holds 4 MiB / 1 MiB + 1 = 5 segments, 2 more while retention
    # waits for a session snapshot (commitlog/retention.py), 3 descriptors each, and the next
    # segment's file, made ahead.
    line = b.wait_log("the open files limit (160) leaves room for 74 sockets once the commit "
                      "log holds 7 segments (22 descriptors)", timeout=1)
    assert line and "fewer than max_connections (10000)" in line, b.log_text()
    # A new log holds no segment file yet: one for a sync's copy of its directory, one for the
    # next segment's file.
    room = nofile - 64 - 4 - 2
    clients = [b.client(f"{uid}-{i}") for i in range(room)]
    mark = b.mark()
    # More callers at once than descriptors in reserve: each one is refused, none hangs.
    late = [b.raw() for _ in range(6)]
    started = time.monotonic()
    for i, c in enumerate(late):
        c.send(m.connect(f"{uid}-late{i}"))
    for c in late:
        assert c.expect(CONNACK, timeout=3).rc == 3
        assert c.expect_closed(3)
    assert time.monotonic() - started < 2.0
    # One that half-closes after its CONNECT still gets its CONNACK.
    half = b.raw()
    half.send(m.connect(f"{uid}-half"))
    half.sock.shutdown(socket.SHUT_WR)
    assert half.expect(CONNACK, timeout=3).rc == 3 and half.expect_closed(3)
    line = b.wait_log("refusing new connections (CONNACK 3)", start=mark)
    assert line and f"{room} sockets open, all that the open files limit (160) leaves" in line, b.logs[mark:]
    assert "LimitNOFILE" in line, b.log_text()
    line = b.wait_log(f"client '{uid}-late0' from 127.0.0.1:", start=mark)
    assert line and "refused (CONNACK 3, server unavailable)" in line and "open files" in line
    s = b.stats()                        # the admin socket still has a descriptor
    assert s["refused"]["open_files"] == 7 and s["limit_hits"]["open_files"] >= 7
    assert s["sockets_open"] == room and s["clients_connected"] == room
    # The log still rolls, deletes past its retention, and fsyncs (the flusher dups what it
    # syncs): all with descriptors connections could not take.
    pub = clients[0]
    for _ in range(12):
        pub.publish(f"{uid}/big", b"x" * 600_000, qos=1)
    segs = sorted(p.name for p in Path(b.config["data_dir"]).glob("**/*.seg"))
    assert 3 <= len(segs) <= 10 and segs[0] != f"{0:020d}.seg", segs  # rolled and deleted
    assert "Too many open files" not in b.log_text()
    for c in clients[-50:]:              # the log now holds up to 10 segments' descriptors
        c.disconnect()
    _wait_stats(b, lambda s: s["sockets_open"] == room - 50)
    again = b.client(f"{uid}-again")     # room again: connected normally
    assert b.wait_log("accepting connections again", start=mark)
    assert again.ping() == [] and clients[1].ping() == []
    assert sum("refusing new connections" in ln for ln in b.logs[mark:]) == 1
    assert "Too many open files" not in b.log_text()


def test_callers_are_refused_when_accept_runs_out_of_descriptors(broker, uid):
    # The process's limit lowered under the running broker to what it holds (prlimit): accept
    # fails with EMFILE, and a descriptor of the reserve takes the caller, refused with
    # CONNACK 3 and closed, then the reserve is whole again for the next one.
    b = broker()
    kept = [b.client(f"{uid}-{i}") for i in range(5)]
    proc = psutil.Process(b.proc.pid)
    before = resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE)
    mark = b.mark()
    resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, (proc.num_fds(), before[1]))
    refused = accepted = 0
    try:
        for i in range(12):
            c = b.raw()
            c.send(m.connect(f"{uid}-late{i}"))
            if i % 2:
                c.sock.shutdown(socket.SHUT_WR)     # half-closed after its CONNECT
            rc = c.expect(CONNACK, timeout=3).rc
            if rc == 0:
                # A descriptor the broker holds for a moment (a /proc read of its memory
                # check, once a second: when its count was read, or between a refusal and
                # the reserve's reopening) was free: this one took it. Kept open, unless it
                # half-closed (its end reaches the broker: closed).
                accepted += 1
                assert accepted <= 2, "more callers accepted than passing reads explain"
                if i % 2:
                    assert c.expect_closed(3)
                else:
                    kept.append(c)
                continue
            assert rc == 3 and c.expect_closed(3)
            refused += 1
        assert kept[0].ping() == []
    finally:
        resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, before)
    assert refused >= 10
    line = b.wait_log("accept failed (Too many open files)", start=mark)
    assert line and "refusing new connections (CONNACK 3)" in line, b.logs[mark:]
    assert b.client(f"{uid}-after").ping() == []
    s = b.stats()
    assert s["refused"]["open_files"] == refused and s["clients_connected"] == len(kept) + 1


def test_a_client_that_half_closes_after_connect_gets_its_connack(broker, uid):
    b = broker()
    for i in range(20):
        c = b.raw()
        c.send(m.connect(f"{uid}-{i}"))
        c.sock.shutdown(socket.SHUT_WR)
        assert c.expect(CONNACK, timeout=3).rc == 0
        assert c.expect_closed(3)
    assert b.stats()["counters"]["connects_accepted"] == 20


def test_before_connect_no_packet_beyond_the_largest_valid_connect_is_read(broker, uid):
    """Until its CONNECT has arrived a connection may send no packet larger than the largest
    CONNECT the limits let through (core.limits.connect_size_limit: 393,236 bytes with the
    defaults), not max_packet_size (1 MiB): closed as soon as the fixed header says so,
    counted and logged. Once connected, max_packet_size applies, also to a packet that
    came in the same read as the CONNECT."""
    b = broker()
    mark = b.mark()
    raw = b.raw()
    body = 400_000
    raw.send(bytes([0x10]) + m.varint(body) + b"\x00\x04MQTT\x04\x02\x00\x3c")
    assert raw.expect_closed(5)
    line = b.wait_log("exceeds the maximum packet size 393236", timeout=5, start=mark)
    assert line and "(before CONNECT)" in line, line
    assert b.stats()["limit_hits"]["max_packet_size"] == 1
    sub = b.client(f"{uid}-sub")
    sub.subscribe(f"{uid}/big")
    payload = b"p" * 500_000
    pub = b.raw()                            # CONNECT and a 500 KB PUBLISH in one send
    pub.send(m.connect(f"{uid}-pub") + m.publish(f"{uid}/big", payload))
    assert pub.expect(m.CONNACK).rc == 0
    assert sub.recv_publish(timeout=10).payload == payload
    assert pub.ping() == []
    assert b.stats()["limit_hits"]["max_packet_size"] == 1


def test_a_long_client_id_is_shown_shortened_in_log_lines(broker):
    """Client ids may be 64 KB long (max_client_id_length): every line naming the client
    carried the whole id (a reconnecting client wrote 128 KB of log per connection). It is
    shown up to 100 characters."""
    b = broker()
    client_id = "d" * 60000
    mark = b.mark()
    c = b.client(client_id)
    c.disconnect()
    line = b.wait_log("disconnected", start=mark)
    assert f"client {client_id[:100]!r}... from 127.0.0.1:" in line, line[:300]
    assert max(len(ln) for ln in b.logs[mark:]) < 400
