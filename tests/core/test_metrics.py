"""Metrics exposed over HTTP (Prometheus text) and $SYS (docs/metrics.md)."""

import re
import signal
import socket
import time
import urllib.error
import urllib.request

import edgebroker
from edgebroker.core.limits import DROPS, LIMITS, REFUSALS
from core.test_sys_topics import collect, number

METRICS_RE = re.compile(r"metrics on http://([0-9.]+):(\d+)/metrics")
SAMPLE_RE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-z_]+)="([^"]*)"\})? (\S+)')


def scrape(url: str) -> dict:
    """Parse the exposition strictly: {(name, label value or None): value}; checks HELP/TYPE."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    helped, typed, samples = set(), {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in typed, f"two TYPE lines for {name}"
            assert kind in ("counter", "gauge", "summary")
            typed[name] = kind
        else:
            mm = SAMPLE_RE.fullmatch(line)
            assert mm, f"not a sample line: {line!r}"
            name = mm.group(1)
            family = re.sub(r"_(sum|count)$", "", name)
            family = family if typed.get(family) == "summary" else name
            assert family in helped and family in typed, f"{name} before its HELP/TYPE"
            assert name.startswith("edgebroker_")
            if typed[family] == "counter":
                assert name.endswith("_total"), name
            samples[name, mm.group(4)] = float(mm.group(5))
    return samples


def test_slow_or_idle_connections_do_not_hold_up_the_scrapes(broker):
    """Idle connections and one that sends a byte every 2 s (each read within the 5 s read
    timeout): scrapes go on meanwhile, the idle ones end at the read timeout and the slow one
    is cut off after 10 s in all, each counted."""
    b = broker(metrics={"listen": "127.0.0.1:0"})
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    url = f"http://{host}:{port}/metrics"
    idle = [socket.create_connection((host, int(port))) for _ in range(3)]
    slow = socket.create_connection((host, int(port)))
    slow.sendall(b"G")
    start = time.monotonic()
    cut = None
    for _ in range(8):                                    # 16 s at most
        assert scrape(url)[("edgebroker_info", edgebroker.__version__)] == 1
        time.sleep(2)
        try:
            slow.sendall(b"E")
        except OSError:
            cut = time.monotonic() - start
            break
        slow.settimeout(0.01)
        try:
            if slow.recv(1) == b"":
                cut = time.monotonic() - start
                break
        except socket.timeout:
            pass
    assert cut is not None and 9 < cut < 20, cut
    samples = scrape(url)
    assert samples["edgebroker_metrics_connections_dropped_total", "deadline"] == 1
    assert samples["edgebroker_metrics_connections_dropped_total", "client_error"] == 3
    for sock in idle + [slow]:
        sock.close()


def test_prometheus_endpoint(broker, uid):
    b = broker(metrics={"listen": "127.0.0.1:0"}, limits={"max_topics": 1})
    line = b.wait_log(METRICS_RE)
    host, port = METRICS_RE.search(line).groups()
    url = f"http://{host}:{port}/metrics"
    first = scrape(url)
    for limit in LIMITS:
        assert first["edgebroker_limit_hits_total", limit] == 0
    for reason in REFUSALS:
        assert ("edgebroker_connections_refused_total", reason) in first
    for reason in DROPS:
        assert ("edgebroker_messages_dropped_total", reason) in first
    assert first["edgebroker_process_resident_memory_bytes", None] > 1e6
    assert ("edgebroker_loop_pass_seconds", "0.99") in first
    assert first["edgebroker_info", edgebroker.__version__] == 1

    # A scraper that connects and says nothing does not hold up the broker.
    stalled = socket.create_connection((host, int(port)))
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/a", b"x")
    pub.publish(f"{uid}/b", b"evicts a", retain=True)
    pub.publish(f"{uid}/c", b"over max_topics: b is retained", retain=True)
    assert pub.ping() == []
    stalled.close()

    # The snapshot is refreshed every second: wait (bounded) for one taken after the publishes.
    deadline = time.monotonic() + 5
    while True:
        now = scrape(url)
        if now["edgebroker_publish_received_total", None] >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert now["edgebroker_publish_received_total", None] == 3
    assert now["edgebroker_topics_evicted_total", None] == 1
    assert now["edgebroker_clients_connected", None] == 1
    assert now["edgebroker_topics", None] == 1
    assert now["edgebroker_limit_hits_total", "max_topics"] == 1
    assert now["edgebroker_messages_dropped_total", "max_topics"] == 1
    assert now["edgebroker_loop_pass_seconds_count", None] > first[
        "edgebroker_loop_pass_seconds_count", None]
    # Only /metrics (a query string aside) is served, as the 404 says: / was served too.
    assert scrape(f"{url}?from=test")["edgebroker_info", edgebroker.__version__] == 1
    for path in ("/other", "/", "/metrics/x"):
        try:
            urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5)
            raise AssertionError(f"{path} answered")
        except urllib.error.HTTPError as err:
            assert err.code == 404 and b"only /metrics is served here" in err.read(), path


def test_metrics_listen_error_is_one_clear_line(broker):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    b = broker(metrics={"listen": f"127.0.0.1:{port}"}, wait=False)
    assert b.proc.wait(10) == 1
    b.stopped = True
    assert b.wait_log(f"cannot listen for metrics on 127.0.0.1:{port}")
    taken.close()


def test_sys_limits_refusals_drops_and_per_client_figures(broker):
    b = broker(sys_interval=1, sys_client_metrics=True, limits={"max_topics": 1})
    watcher = b.client("watcher")
    odd = b.client("dev/7+x#")              # needs escaping to be one topic level
    odd.publish("t/1", b"a", retain=True)
    odd.publish("t/2", b"dropped: max_topics", retain=True)
    odd.publish("$SYS/x", b"dropped: sys_topic")
    assert odd.ping() == []
    watcher.subscribe("$SYS/broker/#")
    base = "$SYS/broker/clients/dev%2F7%2Bx%23"
    topics = ([f"$SYS/broker/limits/{name}" for name in LIMITS]
              + [f"$SYS/broker/connections/refused/{r}" for r in REFUSALS]
              + [f"$SYS/broker/publish/messages/dropped/{r}" for r in DROPS]
              + ["$SYS/broker/topics/count", "$SYS/broker/topics/evicted",
                 "$SYS/broker/store/messages/count",
                 "$SYS/broker/store/messages/bytes", "$SYS/broker/clients/throttled",
                 "$SYS/broker/loop/pass/p50", "$SYS/broker/loop/pass/p99",
                 f"{base}/messages/received", f"{base}/messages/dropped",
                 f"{base}/bytes/received", f"{base}/throttled/seconds"])
    seen = collect(watcher, topics, timeout=8)
    assert number(seen["$SYS/broker/limits/max_topics"].payload) == 1
    assert number(seen["$SYS/broker/publish/messages/dropped/max_topics"].payload) == 1
    assert number(seen["$SYS/broker/publish/messages/dropped/sys_topic"].payload) == 1
    assert number(seen["$SYS/broker/topics/count"].payload) == 1
    assert number(seen["$SYS/broker/topics/evicted"].payload) == 0
    assert number(seen[f"{base}/messages/received"].payload) == 3
    assert number(seen[f"{base}/messages/dropped"].payload) == 2
    # Broker-wide figures are retained; per-client ones are not (no trace once a client goes).
    late = b.client("late")
    late.subscribe("$SYS/broker/limits/max_topics", f"{base}/messages/received")
    retained = late.ping()
    # (a live publication may arrive meanwhile: only the retained ones are counted)
    assert [p.topic for p in retained if p.retain] == ["$SYS/broker/limits/max_topics"]
    assert 0 <= number(seen["$SYS/broker/loop/pass/p50"].payload) \
        <= number(seen["$SYS/broker/loop/pass/p99"].payload) < 1


def test_a_client_id_too_long_for_its_sys_topics_is_left_out_not_a_crash(broker, uid):
    """sys_client_metrics: a client id whose escaped level makes $SYS/broker/clients/<id>/...
    longer than a topic can be (22,000 '%', each written '%25') stopped the broker at the next
    sys_interval once someone subscribed to those topics (struct.error encoding the topic).
    Its figures are left out, logged once; the other clients' still go."""
    b = broker(sys_interval=1, sys_client_metrics=True)
    long_id = "%" * 22000
    odd = b.client(long_id)
    watcher = b.client(f"{uid}-w")
    watcher.subscribe("$SYS/broker/clients/#")
    mark = b.mark()
    seen = collect(watcher, [f"$SYS/broker/clients/{uid}-w/messages/received"], timeout=8)
    assert seen
    line = b.wait_log("would be over MQTT's 65,535 bytes", start=mark)
    assert "(66020 bytes before the figure's name): not published" in line, line
    assert odd.ping() == []
    assert b.proc.poll() is None


def test_a_new_clients_rate_is_over_at_least_a_second(broker, uid):
    """A client looked at for the first time a few ms after it connected had its messages
    divided by those ms (1 message in 1 ms: 1000/s, sorted first by inspect clients)."""
    b = broker()
    c = b.client(f"{uid}-c")
    c.publish(f"{uid}/t", b"x")
    assert c.ping() == []
    (row,) = [r for r in b.admin("clients")["clients"] if r["id"] == f"{uid}-c"]
    assert row["msgs_in"] == 1 and row["msgs_in_rate"] <= 1.0, row


def test_packets_sent_counts_the_publish_packets_too(broker, uid):
    """packets_sent ($SYS messages/sent, edgebroker_packets_sent_total) is every MQTT packet
    sent, as documented: the PUBLISH packets a subscriber got were left out."""
    b = broker()
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t")
    pub = b.client(f"{uid}-p")
    for i in range(20):
        pub.publish(f"{uid}/t", b"m%d" % i)
    for _ in range(20):
        sub.recv_publish()
    assert sub.ping() == [] and pub.ping() == []
    counters = b.stats()["counters"]
    assert counters["publish_sent"] == 20
    # 2 CONNACK, 1 SUBACK, 20 PUBLISH, 2 PINGRESP
    assert counters["packets_sent"] == 25, counters


def test_every_counter_of_the_admin_stats_is_exported(broker, tmp_path, uid):
    """The admin socket's and $SYS's counters were not all on the Prometheus endpoint (ACL
    denials, failed logins and TLS handshakes, lost messages, log write failures...): a fleet
    watched through Prometheus could not see them. Each counter is a metric now, value for
    value."""
    from edgebroker.server.metrics_http import METRICS
    from secfiles import write_acl, write_passwords
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw"})
    acl = write_acl(tmp_path / "acl", "user alice\ntopic readwrite alice/#\n")
    b = broker(metrics={"listen": "127.0.0.1:0"}, password_file=str(pw), acl_file=str(acl))
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    b.client(f"{uid}-bad", expect_rc=4, username="alice", password="wrong")
    alice = b.client(f"{uid}-a", username="alice", password="alice-pw")
    assert alice.subscribe("bob/#").codes == [0x80]
    alice.publish("bob/x", b"denied", qos=1)
    counters = b.stats()["counters"]
    numbered = {name: float(i + 1) for i, name in enumerate(counters)}
    exported = {}
    for name, kind, _, value in METRICS:
        try:
            got = value({"counters": numbered})
        except (KeyError, TypeError):
            continue                  # not a counter of the admin socket's
        exported[got] = name
    # (connections_refused is there by reason: edgebroker_connections_refused_total{reason}.)
    missing = [c for c, n in numbered.items() if n not in exported
               and c != "connections_refused"]
    assert missing == [], f"counters not exported: {missing}"
    deadline = time.monotonic() + 5
    while True:                       # the snapshot is refreshed every second
        samples = scrape(f"http://{host}:{port}/metrics")
        if samples["edgebroker_acl_publish_denied_total", None] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert samples["edgebroker_logins_failed_total", None] == 1
    assert samples["edgebroker_acl_subscribe_denied_total", None] == 1
    assert samples["edgebroker_acl_publish_denied_total", None] == 1
    for counter, n in numbered.items():
        assert counter == "connections_refused" or (exported[n], None) in samples, counter


def test_publish_unrouted_counts_received_publishes_not_sys_messages_nor_a_replay(broker, uid):
    """edgebroker_publish_unrouted_total counts the PUBLISHes received that no subscription
    took: not the broker's own $SYS messages, sent to no one every sys_interval, nor the
    records replayed from the log at start."""
    b = broker(sys_interval=1)
    watch = b.client(f"{uid}-w")
    watch.subscribe("$SYS/broker/uptime")
    for _ in range(3):        # retained at SUBSCRIBE, then two more reports
        assert watch.recv_publish().topic == "$SYS/broker/uptime"
    pub = b.client(f"{uid}-p")
    pub.publish(f"{uid}/nobody", b"0", qos=0)
    pub.publish(f"{uid}/nobody", b"1", qos=1)
    assert pub.ping() == []
    counters = b.stats()["counters"]
    assert (counters["publish_received"], counters["publish_unrouted"]) == (2, 2), counters
    b.stop(signal.SIGKILL)
    again = broker(data_dir=b.config["data_dir"])
    counters = again.stats()["counters"]
    assert (counters["publish_received"], counters["publish_unrouted"]) == (0, 0), counters
