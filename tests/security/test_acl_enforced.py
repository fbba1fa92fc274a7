"""ACLs on the real broker: partly denied subscriptions, dropped publishes, reads checked at
delivery (retained messages too), %c/%u patterns, the anonymous section, wills, reloads."""

import signal

import pytest

import mqttraw as m
from conftest import _close_all_clients, _start, _teardown, toml_dumps
from secfiles import wait_counter, write_acl, write_passwords

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "admin": "admin-pw"}

ACL = """\
# anonymous clients
topic read public/#

user alice
topic readwrite alice/#
topic deny alice/secret/#
topic read shared/#
topic write shared/alice

user bob
topic readwrite bob/#
topic read alice/status

user admin
topic readwrite #
topic read $SYS/#

pattern readwrite devices/%c/#
pattern read users/%u/inbox
"""


@pytest.fixture(scope="module")
def aclsrv(tmp_path_factory):
    """Listener 0: passwords + ACL. Listener 1: anonymous + the same ACL.
    Listener 2: anonymous, no ACL (for watching everything, $SYS included)."""
    d = tmp_path_factory.mktemp("acl")
    pw = write_passwords(d / "passwd", PASSWORDS)
    acl = write_acl(d / "acl", ACL)
    b = _start(d, {"password_file": str(pw), "acl_file": str(acl), "sys_interval": 0.5,
                   "listener": [{"host": "127.0.0.1", "port": 0},
                                {"host": "127.0.0.1", "port": 0, "allow_anonymous": True,
                                 "password_file": ""},
                                {"host": "127.0.0.1", "port": 0, "allow_anonymous": True,
                                 "password_file": "", "acl_file": ""}]})
    yield b
    _close_all_clients()
    _teardown([b])


def login(b, user, client_id, **kw):
    return b.client(client_id, username=user, password=PASSWORDS[user], **kw)


def anon(b, client_id, **kw):
    return b.client(client_id, port=b.listeners[1][1], **kw)


def watcher(b, client_id):
    return b.client(client_id, port=b.listeners[2][1])


def publishes(c):
    """Messages that arrived before a PINGRESP (everything the broker queued for us so far)."""
    return [(p.topic, p.payload, p.retain) for p in c.ping() if p.type == m.PUBLISH]


def test_subscription_partly_denied(aclsrv, uid):
    alice = login(aclsrv, "alice", f"{uid}-a")
    mark = aclsrv.mark()
    ack = alice.subscribe(("alice/x", 1), ("bob/x", 1), ("shared/#", 0), ("#", 0),
                          ("alice/secret/y", 1), ("alice/+", 2))
    assert ack.codes == [1, 0x80, 0, 0x80, 0x80, 2]
    assert aclsrv.wait_log(f"client '{uid}-a' (user 'alice') from 127.0.0.1:{alice.local_port}: "
                           f"subscription to 'bob/x' denied by the ACL (SUBACK 0x80)", start=mark)
    # The granted filters work; the denied ones were not made.
    admin = login(aclsrv, "admin", f"{uid}-adm")
    for topic in ("alice/x", "bob/x", "shared/room", "other/t"):
        admin.publish(topic, f"{uid} {topic}".encode(), qos=1)
    # Overlapping alice/x and alice/+ deliver once; retained messages of other tests are ignored.
    got = [t for t, payload, _ in publishes(alice) if uid.encode() in payload]
    assert got == ["alice/x", "shared/room"], got


def test_denied_publish_dropped_silently_and_counted(aclsrv, uid):
    port = aclsrv.listeners[2][1]
    before = wait_counter(aclsrv, "acl/publish/denied", lambda v: True, port)
    w = watcher(aclsrv, f"{uid}-w")
    w.subscribe(f"alice/{uid}/#", "bob/#")
    bob = login(aclsrv, "bob", f"{uid}-b")
    mark = aclsrv.mark()
    bob.publish(f"alice/{uid}/forged", b"x", qos=1)      # PUBACK still comes (3.1.1)
    bob.publish(f"alice/{uid}/forged", b"y", qos=2)
    bob.publish(f"alice/{uid}/forged", b"z", qos=0)
    bob.publish(f"bob/{uid}", b"allowed", qos=1)
    assert publishes(w) == [(f"bob/{uid}", b"allowed", False)]
    assert bob.ping() == []                              # still connected
    line = aclsrv.wait_log(f"(user 'bob') from 127.0.0.1:{bob.local_port}: publish to "
                           f"'alice/{uid}/forged' denied by the ACL; dropped", start=mark)
    assert line
    assert wait_counter(aclsrv, "acl/publish/denied", lambda v: v >= before + 3, port)
    # One log line per topic and connection, however many publishes.
    assert sum("denied by the ACL; dropped" in ln for ln in aclsrv.logs[mark:]) == 1


def test_denied_publishes_to_many_topics_are_logged_for_sixteen_then_once(aclsrv, uid):
    bob = login(aclsrv, "bob", f"{uid}-b")
    mark = aclsrv.mark()
    for i in range(20):
        bob.publish(f"alice/{uid}/t{i}", b"x", qos=1)
    bob.publish(f"alice/{uid}/t0", b"x", qos=1)
    assert bob.ping() == []
    aclsrv.wait_log("more publishes denied by the ACL; counted, no longer logged", start=mark)
    lines = aclsrv.logs[mark:]
    logged = [ln for ln in lines if f"{uid}-b" in ln and "denied by the ACL; dropped" in ln]
    assert len(logged) == 16, logged
    assert all(f"'alice/{uid}/t{i}'" in logged[i] for i in range(16))
    assert sum("more publishes denied" in ln for ln in lines) == 1


def test_read_checked_at_delivery(aclsrv, uid):
    """A subscription granted under a deny rule that covers part of it gets everything else."""
    alice = login(aclsrv, "alice", f"{uid}-a")
    assert alice.subscribe("alice/#").codes == [0]
    admin = login(aclsrv, "admin", f"{uid}-adm")
    admin.publish(f"alice/{uid}/open", b"1", qos=1)
    admin.publish(f"alice/secret/{uid}", b"2", qos=1)
    admin.publish(f"alice/{uid}/open2", b"3", qos=1)
    assert publishes(alice) == [(f"alice/{uid}/open", b"1", False),
                                (f"alice/{uid}/open2", b"3", False)]


def test_retained_messages_not_leaked(aclsrv, uid):
    admin = login(aclsrv, "admin", f"{uid}-adm")
    admin.publish(f"alice/{uid}/r", b"alice-visible", qos=1, retain=True)
    admin.publish(f"alice/secret/{uid}/r", b"hidden", qos=1, retain=True)
    admin.publish("alice/status", b"online", qos=1, retain=True)
    admin.publish(f"bob/{uid}/r", b"bob-only", qos=1, retain=True)
    alice = login(aclsrv, "alice", f"{uid}-a")
    assert alice.subscribe("alice/#").codes == [0]
    got = publishes(alice)
    assert (f"alice/{uid}/r", b"alice-visible", True) in got
    assert all(b"hidden" != payload for _, payload, _ in got), got
    assert alice.subscribe("bob/#").codes == [0x80]
    assert publishes(alice) == []
    # bob may read alice/status only: the retained status, nothing else of alice's.
    bob = login(aclsrv, "bob", f"{uid}-b")
    assert bob.subscribe("alice/status", "alice/+", "alice/#").codes == [0, 0x80, 0x80]
    assert publishes(bob) == [("alice/status", b"online", True)]
    # The anonymous section: public/# only.
    a = anon(aclsrv, f"{uid}-anon")
    assert a.subscribe("alice/#", "public/#").codes == [0x80, 0]
    assert publishes(a) == []


def test_patterns_client_id_and_username(aclsrv, uid):
    dev = login(aclsrv, "bob", "dev-" + uid)
    assert dev.subscribe(f"devices/dev-{uid}/#", f"devices/other-{uid}/#").codes == [0, 0x80]
    dev.publish(f"devices/dev-{uid}/temp", b"21.5", qos=1)
    dev.publish(f"devices/other-{uid}/temp", b"forged", qos=1)
    assert publishes(dev) == [(f"devices/dev-{uid}/temp", b"21.5", False)]
    # %u: each user reads its own inbox only.
    alice = login(aclsrv, "alice", f"{uid}-a")
    bob = login(aclsrv, "bob", f"{uid}-b")
    assert alice.subscribe("users/alice/inbox").codes == [0]
    assert bob.subscribe("users/alice/inbox").codes == [0x80]
    login(aclsrv, "admin", f"{uid}-adm").publish("users/alice/inbox", b"hi alice", qos=1)
    assert publishes(alice) == [("users/alice/inbox", b"hi alice", False)]
    assert publishes(bob) == []
    # Anonymous clients match %c patterns but never %u.
    a = anon(aclsrv, "anon-" + uid)
    assert a.subscribe(f"devices/anon-{uid}/x", "users/None/inbox", "users/+/inbox").codes == \
        [0, 0x80, 0x80]


def test_unverified_username_gets_anonymous_rules(aclsrv, uid):
    """On the anonymous listener, claiming to be admin gives the anonymous section's rights."""
    c = anon(aclsrv, uid, username="admin", password="whatever")
    assert c.subscribe("#", "public/#").codes == [0x80, 0]


def test_will_topic_denied_connack_5(aclsrv, uid):
    mark = aclsrv.mark()
    c = aclsrv.client(uid, username="bob", password=PASSWORDS["bob"],
                      will=("alice/will", b"x", 1), expect_rc=5)
    assert c.expect_closed(5)
    assert aclsrv.wait_log(f"client '{uid}' (user 'bob') from 127.0.0.1:{c.local_port}: refused "
                           f"(CONNACK 5): the ACL does not let it publish its will on "
                           f"'alice/will'", start=mark)
    ok = aclsrv.client(f"{uid}-ok", username="bob", password=PASSWORDS["bob"],
                       will=("bob/will", b"x", 1))
    assert ok.ping() == []


def test_a_will_the_reloaded_acl_denies_is_dropped_counted_and_logged(broker, tmp_path, uid):
    """The will's topic was checked only at CONNECT: after a reload took the right away, the
    client could no longer publish there, yet its will still was."""
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    acl = write_acl(tmp_path / "acl", ACL)
    b = broker(password_file=str(pw), acl_file=str(acl))
    admin = login(b, "admin", f"{uid}-adm")
    assert admin.subscribe(("alice/#", 1)).codes == [1]
    alice = login(b, "alice", f"{uid}-a", will=("alice/will", b"gone", 1))
    denied = b.stats()["counters"]["acl_publish_denied"]
    write_acl(acl, ACL.replace("topic readwrite alice/#\n", "topic read alice/#\n"))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload: re-read" in ln and str(acl) in ln, start=mark)
    alice.close()                                # no DISCONNECT: the will is due
    line = b.wait_log(lambda ln: "will of" in ln and f"{uid}-a" in ln, start=mark)
    assert line and "on 'alice/will' dropped: the ACL (reloaded since it connected)" in line
    assert publishes(admin) == []
    assert b.stats()["counters"]["acl_publish_denied"] == denied + 1


def test_sys_readable_only_with_a_rule(aclsrv, uid):
    alice = login(aclsrv, "alice", f"{uid}-a")
    assert alice.subscribe("$SYS/#").codes == [0x80]
    admin = login(aclsrv, "admin", f"{uid}-adm")
    assert admin.subscribe("$SYS/broker/uptime").codes == [0]
    assert admin.recv_publish(timeout=5).topic == "$SYS/broker/uptime"


def test_persistent_session_queue_is_filtered(aclsrv, uid):
    """Messages for an offline session are checked before they are queued."""
    cid = f"{uid}-persist"
    alice = login(aclsrv, "alice", cid, clean=False)
    assert alice.subscribe(("alice/#", 1)).codes == [1]
    alice.disconnect()
    admin = login(aclsrv, "admin", f"{uid}-adm")
    admin.publish(f"alice/{uid}/q", b"queued", qos=1)
    admin.publish(f"alice/secret/{uid}", b"hidden", qos=1)
    alice = login(aclsrv, "alice", cid, clean=False)
    assert alice.connack.session_present
    # (Retained messages of other tests arrive too: only this test's topics count.)
    assert [(p.topic, p.payload) for p in alice.ping() if p.type == m.PUBLISH and uid in p.topic] \
        == [(f"alice/{uid}/q", b"queued")]
    alice.disconnect()
    login(aclsrv, "alice", cid).disconnect()


def test_acl_reload_applies_to_connected_clients(broker, tmp_path, uid):
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    acl = write_acl(tmp_path / "acl", ACL)
    b = broker(password_file=str(pw), acl_file=str(acl))
    alice = login(b, "alice", f"{uid}-a")
    assert alice.subscribe("shared/#").codes == [0]
    admin = login(b, "admin", f"{uid}-adm")
    admin.publish("shared/x", b"before", qos=1)
    assert publishes(alice) == [("shared/x", b"before", False)]
    write_acl(acl, ACL.replace("topic read shared/#\n", ""))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload: re-read" in ln and str(acl) in ln, start=mark)
    admin.publish("shared/x", b"after", qos=1)
    assert publishes(alice) == []
    assert alice.subscribe("shared/y").codes == [0x80]
    # A broken ACL file keeps the running rules.
    write_acl(acl, "topic readwrite #\nnonsense line\n")
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark)
    assert line and "line 2: unknown keyword 'nonsense'" in line, line
    assert alice.subscribe("shared/y").codes == [0x80]


def test_a_login_whose_password_check_spans_a_reload_gets_the_new_acl(broker, tmp_path, uid):
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    acl = write_acl(tmp_path / "acl", ACL)
    config = {"password_file": str(pw), "acl_file": str(acl), "max_login_failures": 1000,
              "sys_interval": 0.2,
              "listener": [{"host": "127.0.0.1", "port": 0},
                           {"host": "127.0.0.1", "port": 0, "allow_anonymous": True,
                            "password_file": "", "acl_file": ""}]}
    b = broker(**config)
    # Wrong passwords queued first, so that alice's check waits behind them.
    bad = [b.raw(source="127.0.0.2") for _ in range(60)]
    for i, c in enumerate(bad):
        c.send(m.connect(f"{uid}-bad{i}", username="bob", password=f"guess-{i}"))
    alice = b.raw()
    alice.send(m.connect(f"{uid}-a", username="alice", password=PASSWORDS["alice"]))
    assert wait_counter(b, "password/checks", lambda v: v == 61, b.listeners[1][1]), \
        "alice's check is queued"
    write_acl(acl, ACL.replace("topic read shared/#\n", ""))
    _reload(b, config)
    assert alice.expect(m.CONNACK, timeout=30).rc == 0
    # (The CONNACK may come before the test has read the log line the broker wrote first.)
    assert b.wait_log(lambda ln: f"client '{uid}-a' (user" in ln)
    reloaded = next(i for i, ln in enumerate(b.logs) if "reload: re-read" in ln)
    connected = next(i for i, ln in enumerate(b.logs) if f"client '{uid}-a' (user" in ln)
    assert reloaded < connected, "the check ended after the reload"
    assert alice.subscribe("shared/#").codes == [0x80]


def _reload(b, config: dict) -> None:
    b.config_path.write_text(toml_dumps(config))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload: re-read" in ln, start=mark)


def test_reload_taking_the_acl_off_one_listener_leaves_it_on_the_other(broker, tmp_path, uid):
    """Two listeners share one ACL file; a reload takes it off the second. The clients of the
    first still get its rules (they followed whatever the last listener reloaded got)."""
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    acl = write_acl(tmp_path / "acl", ACL)
    config = {"password_file": str(pw), "acl_file": str(acl),
              "listener": [{"host": "127.0.0.1", "port": 0},
                           {"host": "127.0.0.1", "port": 0}]}
    b = broker(**config)
    alice = login(b, "alice", f"{uid}-a")
    assert alice.subscribe("alice/#").codes == [0]
    ports = [port for _, port in b.listeners]
    config["listener"][1]["acl_file"] = ""
    _reload(b, config)
    admin = login(b, "admin", f"{uid}-adm")
    admin.publish("alice/secret/x", b"denied", qos=1)
    admin.publish("alice/open", b"allowed", qos=1)
    assert publishes(alice) == [("alice/open", b"allowed", False)]
    assert alice.subscribe("bob/#").codes == [0x80]
    # The second listener's clients have no ACL now.
    free = login(b, "alice", f"{uid}-a2", port=ports[1])
    assert free.subscribe("bob/#").codes == [0]


def test_reload_adding_an_acl_file_restricts_connected_clients(broker, tmp_path, uid):
    """A listener without an ACL file gets one: its connected clients follow it at once,
    for deliveries on subscriptions made before and for their publishes."""
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    config = {"password_file": str(pw), "listener": [{"host": "127.0.0.1", "port": 0}]}
    b = broker(**config)
    alice = login(b, "alice", f"{uid}-a")
    assert alice.subscribe("#").codes == [0]
    spy = login(b, "bob", f"{uid}-b")
    assert spy.subscribe("bob/#").codes == [0]
    config["acl_file"] = str(write_acl(tmp_path / "acl", ACL))
    _reload(b, config)
    admin = login(b, "admin", f"{uid}-adm")
    admin.publish("other/topic", b"not for alice", qos=1)
    admin.publish("alice/x", b"for alice", qos=1)
    assert publishes(alice) == [("alice/x", b"for alice", False)]
    alice.publish("bob/x", b"alice may not write here", qos=1)
    assert publishes(spy) == []


def test_an_acl_a_reload_adds_holds_for_records_a_catch_up_already_read(broker, tmp_path, uid):
    """A 3.1.1 session with one subscription and no ACL reads the log as a run (a chunk of
    records sent with nothing checked per record). A reload that gave it an ACL did not stop
    the run: what it held was sent although the ACL now denied it. The rest of the run is read
    again through the checked path: nothing denied goes out, and each record is counted."""
    config = {"listener": [{"host": "127.0.0.1", "port": 0}]}
    b = broker(**config)
    sub = b.client(f"{uid}-sub")
    assert sub.subscribe(("#", 1)).codes == [1]
    pub = b.client(f"{uid}-pub")
    n, read = 1000, 300
    # Pipelined: 20 fill the window, 256 the queue, the rest is read from the log.
    pub.send(b"".join(m.publish("t/secret", f"m{i}".encode(), 1, packet_id=i + 1)
                      for i in range(n)))
    pub.wait_for(lambda p: p.type == m.PUBACK and p.packet_id == n, 10)
    window = []
    for i in range(read):           # past the queue: into the run, then the window is full
        p = sub.recv_publish(ack=False)
        assert p.payload == f"m{i}".encode()
        window.append(p)
        if i < read - 20:
            sub.ack(window.pop(0))
    config["acl_file"] = str(write_acl(tmp_path / "acl", "topic readwrite other/#\n"))
    _reload(b, config)
    denied = b.stats()["counters"]["acl_deliveries_denied"]
    for p in window:
        sub.ack(p)
    pub.publish("other/done", b"after the backlog", qos=1)
    p = sub.recv_publish()
    assert (p.topic, p.payload) == ("other/done", b"after the backlog")
    assert b.stats()["counters"]["acl_deliveries_denied"] == denied + n - read


def _fill_window(b, admin, topic, prefix, n=25):
    """``n`` QoS 1 messages on ``topic``: 20 fill the subscriber's in-flight window
    (max_inflight_messages), the rest wait in its session's queue."""
    for i in range(n):
        admin.publish(topic, f"{prefix}{i}".encode(), qos=1)


def test_queued_messages_are_checked_against_the_acl_as_they_go_out(broker, tmp_path, uid):
    """Messages waiting behind a full in-flight window were sent later without a read check:
    after a reload that took the right away, and to another user resuming the session (the
    same client id). The reads are checked as they leave the queue now, as on every other
    path, and counted."""
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    acl = write_acl(tmp_path / "acl", ACL)
    b = broker(password_file=str(pw), acl_file=str(acl))
    admin = login(b, "admin", f"{uid}-adm")
    alice = login(b, "alice", f"{uid}-a")
    assert alice.subscribe(("alice/#", 1)).codes == [1]
    _fill_window(b, admin, "alice/c", "m")
    window = [alice.recv_publish(ack=False) for _ in range(20)]
    assert [p.payload for p in window] == [f"m{i}".encode() for i in range(20)]
    write_acl(acl, ACL.replace("topic readwrite alice/#\n", "topic write alice/#\n"))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload: re-read" in ln and str(acl) in ln, start=mark)
    denied = b.stats()["counters"]["acl_deliveries_denied"]
    for p in window:
        alice.ack(p)
    assert publishes(alice) == []
    assert b.stats()["counters"]["acl_deliveries_denied"] == denied + 5
    # Another user resumes alice's session: the messages still queued are not hers to read.
    write_acl(acl, ACL)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload: re-read" in ln and str(acl) in ln, start=mark)
    dev = login(b, "alice", f"{uid}-dev", clean=False)
    assert dev.subscribe(("alice/#", 1)).codes == [1]
    _fill_window(b, admin, "alice/d", "secret")
    assert len([dev.recv_publish(ack=False) for _ in range(20)]) == 20
    dev.disconnect()
    bob = login(b, "bob", f"{uid}-dev", clean=False)
    got = [p for p in bob.ping() if p.type == m.PUBLISH]
    # The 20 in flight are resent (MQTT-4.4.0-1); none of the 5 queued is sent.
    assert [p.payload for p in got] == [f"secret{i}".encode() for i in range(20)]
    assert all(p.dup for p in got)


def test_denied_subscriptions_are_logged_a_few_times_each_shortened(aclsrv, uid):
    """One SUBSCRIBE of thousands of denied filters, or of 60 KB ones, wrote a warning line
    each with the whole filter (one client could fill the disk through the log): the first
    16 of a connection are logged, each filter shortened, then one line that more are not;
    all are counted. Publish denials keep their own lines."""
    alice = login(aclsrv, "alice", f"{uid}-a")
    before = aclsrv.stats()["counters"]["acl_subscribe_denied"]
    mark = aclsrv.mark()
    filters = [f"bob/{i}" for i in range(2000)] + ["bob/" + "x" * 60000]
    assert alice.subscribe(*filters, qos=1).codes == [0x80] * 2001
    assert alice.subscribe("bob/" + "y" * 60000, qos=1).codes == [0x80]
    assert aclsrv.stats()["counters"]["acl_subscribe_denied"] == before + 2002
    alice.publish("bob/x", b"no", qos=1)
    assert aclsrv.wait_log(lambda ln: f"'{uid}-a'" in ln and "publish to 'bob/x' denied" in ln,
                           start=mark)
    alice.publish("bob/" + "p" * 60000, b"no", qos=1)      # shown shortened too
    assert aclsrv.wait_log(lambda ln: f"'{uid}-a'" in ln and ("publish to 'bob/" + "p" * 196
                           + "'... (60004 characters) denied by the ACL; dropped") in ln,
                           start=mark)
    lines = [ln for ln in aclsrv.logs[mark:] if f"'{uid}-a'" in ln and "subscri" in ln]
    assert len(lines) == 17, lines[-3:]
    assert lines[0].endswith("subscription to 'bob/0' denied by the ACL (SUBACK 0x80)")
    assert lines[-1].endswith("more subscriptions refused; counted, no longer logged for this "
                              "connection")
    assert max(len(ln) for ln in aclsrv.logs[mark:]) < 500
    bob = login(aclsrv, "bob", f"{uid}-b")
    mark = aclsrv.mark()
    assert bob.subscribe("alice/" + "z" * 60000).codes == [0x80]
    line = aclsrv.wait_log(lambda ln: f"'{uid}-b'" in ln and "denied by the ACL" in ln,
                           start=mark)
    assert line.endswith(f"subscription to {'alice/' + 'z' * 194!r}... (60006 characters) "
                         f"denied by the ACL (SUBACK 0x80)"), line[-300:]


def test_files_saved_with_a_byte_order_mark_are_read(broker, tmp_path, uid):
    """A password file saved with a UTF-8 byte order mark (as Windows editors write) locked
    its first user out without a word ('\\ufeffalice' was the name); an ACL file so saved was
    refused ("unknown keyword"). The mark is skipped in both."""
    pw = write_passwords(tmp_path / "passwd", PASSWORDS)
    pw.write_bytes(b"\xef\xbb\xbf" + pw.read_bytes())
    acl = write_acl(tmp_path / "acl", "")
    acl.write_bytes(b"\xef\xbb\xbf" + ACL.replace("# anonymous clients\n", "").encode())
    b = broker(password_file=str(pw), acl_file=str(acl))
    alice = login(b, "alice", f"{uid}-a")
    assert alice.subscribe(("alice/x", 1), ("bob/x", 1)).codes == [1, 0x80]
