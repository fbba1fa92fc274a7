"""Password authentication against the real broker: CONNACK 0/4/5, logging, held packets,
the worker pool under a burst of bad logins, the per-address failure limit, reloads."""

import signal
import threading
import time

import pytest

import mqttraw as m
import mqttraw5 as m5
from conftest import _close_all_clients, _open_clients, _start, _teardown, run_cli, toml_dumps
from secfiles import MOSQUITTO_HASH, MOSQUITTO_PASSWORD, wait_counter, write_passwords

ALICE_PW = "alice-Pa55word"
HELD_PW = "used-once-so-never-cached"
# Users each logged in once (so never from the cache): the check runs on the worker pool.
ONCE = {f"once{i}": f"once-{i}-never-cached" for i in range(4)}


@pytest.fixture(scope="module")
def authsrv(tmp_path_factory):
    """Listener 0: password file, no anonymous. Listener 1: anonymous only (no password file)."""
    d = tmp_path_factory.mktemp("auth")
    pw = write_passwords(d / "passwd", {"alice": ALICE_PW, "held": HELD_PW, **ONCE},
                         extra=(f"mosq:{MOSQUITTO_HASH}", "# a comment"))
    b = _start(d, {"password_file": str(pw), "sys_interval": 0.5,
                   "listener": [{"host": "127.0.0.1", "port": 0},
                                {"host": "127.0.0.1", "port": 0, "allow_anonymous": True,
                                 "password_file": ""}]})
    yield b
    _close_all_clients()
    _teardown([b])


def open_port(b):
    return b.listeners[1][1]


def test_right_password(authsrv, uid):
    c = authsrv.client(uid, username="alice", password=ALICE_PW)
    assert c.ping() == []
    assert authsrv.wait_log(f"client '{uid}' (user 'alice') from 127.0.0.1:{c.local_port} connected")


def test_mosquitto_passwd_hash_accepted(authsrv, uid):
    assert authsrv.client(uid, username="mosq", password=MOSQUITTO_PASSWORD).ping() == []


@pytest.mark.parametrize("username, password, why", [
    ("alice", "wrong-password", "wrong password"),
    ("alice", "", "wrong password"),
    ("nobody", "whatever-pw", "unknown user"),
    ("alice", None, "no password given"),
])
def test_bad_credentials_connack_4(authsrv, uid, username, password, why):
    mark = authsrv.mark()
    c = authsrv.raw()
    ack = c.connect(uid, username=username, password=password)
    assert ack.rc == 4
    assert c.expect_closed(5)
    line = authsrv.wait_log(f"client '{uid}' (user '{username}') from 127.0.0.1:{c.local_port}: "
                            f"refused (CONNACK 4): {why}", start=mark)
    assert line, authsrv.log_text()
    if password:
        assert password not in authsrv.log_text(), "a password was logged"


@pytest.mark.parametrize("username, why", [("alice", "wrong password"),
                                           ("nobody", "unknown user")])
def test_bad_credentials_5_0_reason_string_does_not_tell_user_names_apart(authsrv, uid,
                                                                           username, why):
    """A 5.0 client is told the same for a known and an unknown user name (the log says which),
    as SCRAM's refusals are."""
    mark = authsrv.mark()
    c = m5.RawClient5(authsrv.host, authsrv.port)
    _open_clients.append(c)
    ack = c.connect(uid, username=username, password="wrong-Pa55word")
    assert ack.reason == 0x86, ack
    assert ack.properties == {m5.REASON_STRING: "bad user name or password"}, ack
    assert c.expect_closed(5)
    assert authsrv.wait_log(f"client '{uid}' (user '{username}') from 127.0.0.1:"
                            f"{c.local_port}: refused (CONNACK 0x86): {why}", start=mark), \
        authsrv.log_text()


def test_anonymous_refused_connack_5(authsrv, uid):
    mark = authsrv.mark()
    c = authsrv.client(uid, expect_rc=5)
    assert c.expect_closed(5)
    assert authsrv.wait_log(f"client '{uid}' from 127.0.0.1:{c.local_port}: refused (CONNACK 5): "
                            f"anonymous clients are not allowed on listener 127.0.0.1:"
                            f"{authsrv.port}", start=mark)


def test_unverified_user_name_is_anonymous(authsrv, uid):
    """Without a password file on the listener a user name proves nothing: logged, not trusted."""
    mark = authsrv.mark()
    c = authsrv.client(uid, port=open_port(authsrv), username="alice", password="anything")
    assert c.ping() == []
    assert authsrv.wait_log(f"user name 'alice' not verified (no password_file on listener "
                            f"127.0.0.1:{open_port(authsrv)}); treated as anonymous", start=mark)


def test_packets_sent_with_connect_are_held_then_handled_in_order(authsrv, uid):
    """CONNECT, SUBSCRIBE, PUBLISH and PINGREQ in one segment: the broker answers CONNACK first,
    after the password check, then the rest in order."""
    c = authsrv.raw()
    c.send(m.connect(uid, username="held", password=HELD_PW)
           + m.subscribe(1, [(f"{uid}/t", 1)]) + m.publish(f"{uid}/t", b"early", qos=1, packet_id=7)
           + m.pingreq())
    got = []
    while {m.PINGRESP, m.PUBACK, m.PUBLISH} - {p.type for p in got}:
        got.append(c.recv_packet(10))
    assert got[0].type == m.CONNACK and got[0].rc == 0
    # Handled in order: the subscription exists before the PUBLISH is routed to it. The
    # PUBACK and the delivery wait for the log write at the end of the loop pass, so they may
    # follow the PINGRESP.
    ordered = [p for p in got if p.type not in (m.PINGRESP, m.PUBACK)]
    assert [p.type for p in ordered] == [m.CONNACK, m.SUBACK, m.PUBLISH], got
    assert ordered[2].payload == b"early"
    assert [p.packet_id for p in got if p.type == m.PUBACK] == [7]


def test_second_connect_behind_one_being_checked_is_a_violation(authsrv, uid):
    """What came behind the CONNECT is read once its check is back (as a broker reading a
    packet at a time would): after CONNACK 0, the second CONNECT closes the connection."""
    c = authsrv.raw()
    c.send(m.connect(uid, username="once0", password=ONCE["once0"]) + m.connect(uid))
    assert c.expect_closed(10)
    assert [(p.type, p.rc) for p in c.before_close] == [(m.CONNACK, 0)]
    assert authsrv.wait_log("second CONNECT")


@pytest.mark.parametrize("first, second, user", [
    ("3.1.1", "level 9", "once1"), ("3.1.1", "5.0 malformed", "once2"),
    ("5.0", "level 9", "once3")])
def test_a_bad_second_connect_behind_one_being_checked_gets_no_connack(authsrv, uid, first,
                                                                        second, user):
    """A bad second CONNECT behind the first one, while its password check runs: once the
    first is accepted, a close (MQTT-3.1.0-2), not a CONNACK of its own (3.1.1: CONNACK 1; a
    5.0 CONNACK, malformed for a 3.1.1 client; 5.0: CONNACK 0x84)."""
    login = {"username": user, "password": ONCE[user]}
    c = (authsrv.raw() if first == "3.1.1"
         else m5.RawClient5(authsrv.host, authsrv.port))
    c.send((m.connect(uid, **login) if first == "3.1.1" else m5.connect5(uid, **login))
           + (m.connect(uid, level=9) if second == "level 9"
              else m5.connect5(uid, flags_override=0x03)))
    assert c.expect_closed(10)
    assert [(p.type, p.rc) for p in c.before_close[:1]] == [(m.CONNACK, 0)]
    assert [p.type for p in c.before_close[1:]] == ([] if first == "3.1.1"
                                                    else [m.DISCONNECT])


def test_refusals_counted(authsrv, uid):
    port = open_port(authsrv)
    before = wait_counter(authsrv, "logins/failed", lambda v: True, port)
    authsrv.client(uid, username="alice", password="bad-" + uid, expect_rc=4)
    assert wait_counter(authsrv, "logins/failed", lambda v: v >= before + 1, port) >= before + 1
    refused = wait_counter(authsrv, "logins/refused", lambda v: True, port)
    authsrv.client(uid, expect_rc=5)
    assert wait_counter(authsrv, "logins/refused", lambda v: v >= refused + 1, port)


# ---------------------------------------------------------------------------------------------
# The worker pool: a burst of bad logins never stalls the event loop
# ---------------------------------------------------------------------------------------------

def test_burst_of_bad_logins_leaves_other_clients_served(broker, tmp_path, uid):
    pw = write_passwords(tmp_path / "passwd", {"alice": ALICE_PW})
    b = broker(password_file=str(pw), max_login_failures=1000,
               listener=[{"host": "127.0.0.1", "port": 0},
                         {"host": "127.0.0.1", "port": 0, "allow_anonymous": True,
                          "password_file": ""}])
    other = b.client(f"{uid}-other", port=b.listeners[1][1])
    other.subscribe(f"{uid}/t")
    bad = [b.raw(source="127.0.0.2") for _ in range(40)]
    for i, c in enumerate(bad):
        c.send(m.connect(f"{uid}-bad{i}", username="alice", password=f"guess-{i}"))
    # 40 scrypt checks take a worker pool of two at least ~0.4 s; meanwhile the loop answers.
    started = time.monotonic()
    rtts = []
    for i in range(10):
        t0 = time.monotonic()
        other.publish(f"{uid}/t", f"m{i}".encode())
        assert [p.payload for p in other.ping()] == [f"m{i}".encode()]
        rtts.append(time.monotonic() - t0)
    pings_done = time.monotonic()
    last_connack = 0.0
    for c in bad:
        ack = c.expect(m.CONNACK, timeout=30)
        assert ack.rc == 4
        last_connack = time.monotonic()
    assert max(rtts) < 0.25, f"event loop stalled during the password checks: {rtts}"
    assert pings_done < last_connack, "the burst was over before the pings: nothing measured"
    assert last_connack - started > 0.2
    good = b.client(f"{uid}-good", username="alice", password=ALICE_PW)
    assert good.ping() == []


def _throttled_broker(broker, tmp_path, failures=3):
    pw = write_passwords(tmp_path / "passwd", {"alice": ALICE_PW, "bob": "bob-pw",
                                                "carol": "carol-pw"})
    return broker(password_file=str(pw), max_login_failures=failures, sys_interval=0.5,
                  listener=[{"host": "127.0.0.1", "port": 0},
                            {"host": "127.0.0.1", "port": 0, "allow_anonymous": True,
                             "password_file": ""}])


def test_wrong_passwords_for_one_user_do_not_lock_out_others_from_the_same_address(
        broker, tmp_path, uid):
    """Issue 26, item 7: failed logins are throttled per (address, user name) with growing
    delays. Another user from the same address is not affected; the attacked user's right
    password is refused only while the pair's delay runs, and once it has succeeded it is
    accepted at once, however many wrong ones keep coming."""
    b = _throttled_broker(broker, tmp_path)
    src = {"source": "127.0.0.2"}
    for i in range(3):
        b.client(f"{uid}-{i}", username="alice", password="wrong", transport=src, expect_rc=4)
    mark = b.mark()
    c = b.client(f"{uid}-right", username="alice", password=ALICE_PW, transport=src, expect_rc=5)
    assert c.expect_closed(5)
    line = b.wait_log(f"client '{uid}-right' (user 'alice') from 127.0.0.2:{c.local_port}: "
                      f"refused (CONNACK 5): 3 failed logins in a row for user 'alice' from "
                      f"loopback; its next password check in", start=mark)
    assert line and "; not checked" in line
    # Another user from the same address: served.
    assert b.client(f"{uid}-bob", username="bob", password="bob-pw", transport=src).ping() == []
    # The delay (1 s after the third failure) passes: the next attempt is checked.
    wait = float(line.split("next password check in ")[1].split(" s")[0])
    threading.Event().wait(wait + 0.05)
    assert b.client(f"{uid}-later", username="alice", password=ALICE_PW,
                    transport=src).ping() == []
    # More wrong passwords keep the pair throttled, but the right one, known from its
    # success, is accepted without a check.
    for i in range(5):
        c = b.raw(**src)
        assert c.connect(f"{uid}-w{i}", username="alice", password=f"wrong-{i}").rc in (4, 5)
    checks = b.stats()["counters"]["password_checks"]
    assert b.client(f"{uid}-again", username="alice", password=ALICE_PW,
                    transport=src).ping() == []
    assert b.stats()["counters"]["password_checks"] == checks


def test_a_brute_force_computes_very_few_hashes(broker, tmp_path, uid):
    b = _throttled_broker(broker, tmp_path)
    attempts = []
    started = time.monotonic()
    for batch in range(10):                     # 300 guesses, 30 connections at a time
        conns = [b.raw(source="127.0.0.3") for _ in range(30)]
        for i, c in enumerate(conns):
            c.send(m.connect(f"{uid}-b{batch}-{i}", username="alice",
                             password=f"guess-{batch}-{i}"))
        attempts += [c.expect(m.CONNACK, timeout=20).rc for c in conns]
    took = time.monotonic() - started
    checks = b.stats()["counters"]["password_checks"]
    # 3 checks, then one more 1 s after the last failure, 2 s after that, 4 s after that...
    allowed = 3 + sum(1 for k in range(8) if 2 ** (k + 1) - 1 <= took + 1)
    assert 3 <= checks <= allowed, (checks, took)
    assert attempts.count(4) == checks and attempts.count(5) == 300 - checks
    assert wait_counter(b, "password/checks", lambda v: v == checks, b.listeners[1][1])


def test_a_check_that_cannot_run_is_counted_and_logged_once(broker, tmp_path, uid):
    """The hash library failing (here: out of memory, as a gateway short of it would be, under
    an address-space limit set on the running broker) refuses the login as a failed one;
    the failures are counted and logged once, without a traceback, until a check runs."""
    import base64
    import os
    import resource
    salt, digest = (base64.b64encode(os.urandom(n)).decode().rstrip("=") for n in (16, 32))
    big = f"$scrypt$v=1$ln=18,r=8,p=1${salt}${digest}"      # 256 MiB a check: the most allowed
    pw = tmp_path / "passwd"
    pw.write_text(f"alice:{big}\nbob:$scrypt$v=1$ln=1,r=1,p=1${salt}${digest}\n")
    os.chmod(pw, 0o600)
    b = broker(password_file=str(pw))
    b.client(f"{uid}-b0", username="bob", password="wrong", expect_rc=4)   # a worker started
    vm = next(int(line.split()[1]) << 10 for line in open(f"/proc/{b.proc.pid}/status")
              if line.startswith("VmSize:"))
    before = resource.prlimit(b.proc.pid, resource.RLIMIT_AS)
    mark = b.mark()
    resource.prlimit(b.proc.pid, resource.RLIMIT_AS, (vm + (128 << 20), before[1]))
    try:
        for i in range(3):
            b.client(f"{uid}-a{i}", username="alice", password=f"pw-{i}", expect_rc=4)
            assert b.wait_log(f"client '{uid}-a{i}' (user 'alice') from 127.0.0.1:", start=mark)
    finally:
        resource.prlimit(b.proc.pid, resource.RLIMIT_AS, before)
    assert b.wait_log(f"client '{uid}-a2' (user 'alice') from 127.0.0.1:", start=mark)
    logged = b.logs[mark:]
    errors = [line for line in logged if " ERROR " in line]
    assert len(errors) == 1 and "password check for user 'alice' could not run: ValueError:" \
        in errors[0] and "the login is refused" in errors[0], "\n".join(logged)
    assert not [line for line in logged if "Traceback" in line], "\n".join(logged)
    assert sum("refused (CONNACK 4): the password check could not run" in line
               for line in logged) == 3, "\n".join(logged)
    assert b.stats()["counters"]["password_check_errors"] == 3
    b.client(f"{uid}-b1", username="bob", password="wrong", expect_rc=4)
    assert b.wait_log("password checks run again (3 could not run before)", start=mark)


def test_failed_logins_for_many_user_names_throttle_the_address(broker, tmp_path, uid):
    """Guessing user names as well as passwords: after 10 x max_login_failures failures
    from an address within the window, only passwords that succeeded before are accepted
    from it."""
    b = _throttled_broker(broker, tmp_path)
    src = {"source": "127.0.0.4"}
    assert b.client(f"{uid}-bob", username="bob", password="bob-pw", transport=src).ping() == []
    conns = [b.raw(source="127.0.0.4") for _ in range(40)]
    for i, c in enumerate(conns):
        c.send(m.connect(f"{uid}-s{i}", username=f"user{i}", password="guess"))
    codes = [c.expect(m.CONNACK, timeout=20).rc for c in conns]
    # Sent at once: all checked (checks still running are no failures yet; at most
    # PENDING_PER_HOST, 256, wait from one address).
    assert codes.count(4) == 40, codes
    mark = b.mark()
    b.client(f"{uid}-carol", username="carol", password="carol-pw", transport=src, expect_rc=5)
    assert b.wait_log("too many failed logins from loopback (30 within 60 s, any user names)",
                      start=mark)
    assert b.client(f"{uid}-bob2", username="bob", password="bob-pw", transport=src).ping() == []
    # All of 127.0.0.0/8 is one host to the throttle: 127.0.0.1 is no way around it.
    b.client(f"{uid}-carol2", username="carol", password="carol-pw", expect_rc=5)


def test_connect_timeout_keeps_running_while_authenticating(broker, tmp_path, uid):
    pw = write_passwords(tmp_path / "passwd", {"alice": ALICE_PW})
    b = broker(password_file=str(pw), max_login_failures=1000, limits={"connect_timeout": 0.2})
    bad = [b.raw(source="127.0.0.2") for _ in range(40)]
    for i, c in enumerate(bad):
        c.send(m.connect(f"{uid}-bad{i}", username="alice", password=f"guess-{i}"))
    mark = b.mark()
    late = b.raw()
    late.send(m.connect(f"{uid}-late", username="alice", password=ALICE_PW))
    assert late.expect_closed(10)
    assert all(p.type != m.CONNACK for p in late.before_close)
    assert b.wait_log(f"client '{uid}-late' from 127.0.0.1:{late.local_port}: password check not "
                      f"finished within 0.2 s; closing", start=mark)


# ---------------------------------------------------------------------------------------------
# The file: reloads, permissions, plain text
# ---------------------------------------------------------------------------------------------

def test_changed_password_is_checked_again_after_reload(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_passwords(pw, {"alice": "first-pw"})
    b = broker(password_file=str(pw), log_level="debug")
    assert b.client(f"{uid}-1", username="alice", password="first-pw").ping() == []
    assert b.wait_log("user 'alice': password check done in ")
    mark = b.mark()
    assert b.client(f"{uid}-2", username="alice", password="first-pw").ping() == []
    assert b.wait_log("user 'alice': password accepted from the cache", start=mark)
    assert not any("password check done" in ln for ln in b.logs[mark:])
    write_passwords(pw, {"alice": "second-pw"})
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(f"reload: re-read {pw}", start=mark)
    b.client(f"{uid}-3", username="alice", password="first-pw", expect_rc=4)
    assert b.client(f"{uid}-4", username="alice", password="second-pw").ping() == []


def test_a_connection_opened_before_a_reload_logs_in_against_the_new_file(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_passwords(pw, {"alice": "first-pw"})
    b = broker(password_file=str(pw))
    early = [b.raw() for _ in range(2)]      # accepted now, CONNECT after the reload
    write_passwords(pw, {"alice": "second-pw"})
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(f"reload: re-read {pw}", start=mark)
    assert early[0].connect(f"{uid}-old", username="alice", password="first-pw").rc == 4
    assert early[1].connect(f"{uid}-new", username="alice", password="second-pw").rc == 0


def test_reload_keeps_old_file_when_new_one_is_unsafe(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_passwords(pw, {"alice": ALICE_PW})
    b = broker(password_file=str(pw))
    kept = b.client(f"{uid}-kept", username="alice", password=ALICE_PW)
    write_passwords(pw, {"alice": "new-pw"}, mode=0o644)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark)
    assert line and "let other users read it" in line and f"chmod 600 {pw}" in line, line
    assert kept.ping() == []
    assert b.client(f"{uid}-old", username="alice", password=ALICE_PW).ping() == []


def one_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def config_file(tmp_path, **top):
    cfg = {"data_dir": str(tmp_path / "data"), "sys_interval": 0,
           "listener": [{"host": "127.0.0.1", "port": 0}], **top}
    path = tmp_path / "edgebroker.toml"
    path.write_text(toml_dumps(cfg))
    return path


def test_start_refuses_password_file_readable_by_others(tmp_path):
    pw = write_passwords(tmp_path / "passwd", {"alice": ALICE_PW}, mode=0o644)
    r = run_cli("serve", "-c", str(config_file(tmp_path, password_file=str(pw))))
    assert r.returncode == 2
    line = one_line(r)
    assert f"password_file: {pw}: permissions -rw-r--r-- let other users read it" in line, line


def test_plain_text_file_refused_until_upgraded(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    pw.write_text("alice:plain-secret\nbob:other-secret\n")
    pw.chmod(0o600)
    r = run_cli("serve", "-c", str(config_file(tmp_path, password_file=str(pw))))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()      # every bad line; the way out said once
    assert len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert "line 1: user 'alice'" in lines[0] and f"edgebroker passwd -U {pw}" in lines[0]
    assert "line 2: user 'bob'" in lines[1] and "passwd -U" not in lines[1], lines[1]
    assert "plain-secret" not in r.stderr
    r = run_cli("passwd", "-U", str(pw))
    assert r.returncode == 0, r.stderr
    assert "plain-secret" not in pw.read_text()
    b = broker(password_file=str(pw))
    assert b.client(f"{uid}-a", username="alice", password="plain-secret").ping() == []
    assert b.client(f"{uid}-b", username="bob", password="other-secret").ping() == []
    b.client(f"{uid}-c", username="bob", password="plain-secret", expect_rc=4)


def test_logins_beyond_the_checks_that_may_wait_are_refused_as_auth(broker, tmp_path, uid):
    """More logins at once than password checks may wait (MAX_PENDING, lowered to 2 for the
    test) get CONNACK 3, counted as refused for `auth_busy` (they were counted as `client_id`,
    then as `auth`, the reason of wrong passwords)."""
    import sys
    users = {f"u{i}": f"pw{i}" for i in range(6)}
    pw = write_passwords(tmp_path / "passwd", users)
    patch = ("import runpy, sys; import edgebroker.security.authenticator as a; "
             "a.MAX_PENDING = 2; sys.argv[0] = 'edgebroker'; "
             "runpy.run_module('edgebroker', run_name='__main__')")
    b = broker(password_file=str(pw),
               wrap=lambda cmd: [sys.executable, "-c", patch] + cmd[cmd.index("serve"):])
    clients = [b.raw() for _ in users]
    for i, (c, (user, password)) in enumerate(zip(clients, users.items())):
        c.send(m.connect(f"{uid}-{i}", username=user, password=password))
    codes = [c.expect(m.CONNACK).rc for c in clients]
    busy = codes.count(3)
    assert busy >= 1 and set(codes) <= {0, 3}, codes
    refused = b.stats()["refused"]
    assert refused["auth_busy"] == busy and refused.get("client_id", 0) == 0
    assert refused["auth"] == 0
