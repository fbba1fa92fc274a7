"""SCRAM-SHA-256 (MQTT 5.0 enhanced authentication) against the real broker, from raw sockets:
the exchange at CONNECT, its failures and refusals, out-of-sequence packets, the CONNECT
timeout, re-authentication, the ACL and throttles applied to a SCRAM user, plain password
login beside it, and a reload adding a user. The client side is tests/scramclient.py."""

from __future__ import annotations

import signal

import pytest

import mqttraw5 as m5
from conftest import _close_all_clients, _open_clients, _start, _teardown
from edgebroker.security.passwords import hash_password
from scramclient import METHOD, Scram, keys_field
from secfiles import MOSQUITTO_HASH, MOSQUITTO_PASSWORD, write_acl
from server.test_websocket_clients import mqttjs  # noqa: F401 (the MQTT.js fixture)

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw", "erin": "erin-pw"}
OLD_USER, OLD_PW = "olduser", "old-pw"      # added before SCRAM keys were written

ACL = """\
user alice
topic readwrite alice/#

user bob
topic readwrite bob/#

user carol
topic readwrite carol/#

user erin
topic readwrite erin/#

user olduser
topic readwrite olduser/#
"""


def password_lines(users: dict[str, str]) -> list[str]:
    return [f"{u}:{hash_password(p)}:{keys_field(p)}" for u, p in users.items()]


def write_file(path, lines) -> None:
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)


@pytest.fixture(scope="module")
def srv5(tmp_path_factory):
    """Listener 0: password file with SCRAM keys, ACL. Listener 1: anonymous, no password file."""
    d = tmp_path_factory.mktemp("scram")
    pw = d / "passwd"
    write_file(pw, password_lines(PASSWORDS) + [f"{OLD_USER}:{hash_password(OLD_PW)}",
                                                f"mosq:{MOSQUITTO_HASH}", "# a comment"])
    acl = write_acl(d / "acl", ACL)
    b = _start(d, {"password_file": str(pw), "acl_file": str(acl),
                   "listener": [{"host": "127.0.0.1", "port": 0},
                                {"host": "127.0.0.1", "port": 0, "allow_anonymous": True,
                                 "password_file": "", "acl_file": ""}]})
    yield b
    _close_all_clients()
    _teardown([b])


def raw5(b, port: int | None = None) -> m5.RawClient5:
    c = m5.RawClient5(b.host, port or b.port)
    _open_clients.append(c)
    return c


def auth_props(data: bytes, method: str = METHOD) -> dict:
    return {m5.AUTH_METHOD: method, m5.AUTH_DATA: data}


def start(c, client_id: str, s: Scram, **kw) -> m5.Packet5:
    """CONNECT with the client-first-message; the broker's first answer."""
    props = dict(kw.pop("props", None) or {})
    props.update(auth_props(s.first()))
    c.send(m5.connect5(client_id, props=props, **kw))
    return c.recv_packet()


def login(b, client_id: str, user: str, password: str, proof_password: str | None = None,
          **kw) -> tuple[m5.RawClient5, Scram, m5.Packet5]:
    """A whole SCRAM CONNECT: (client, its Scram, the CONNACK)."""
    c = raw5(b)
    s = Scram(user, password)
    first = start(c, client_id, s, **kw)
    if first.type == m5.CONNACK:
        return c, s, first
    assert first.type == m5.AUTH and first.reason == 0x18, first
    assert first.properties[m5.AUTH_METHOD] == METHOD
    c.auth(0x18, auth_props(s.final(first.properties[m5.AUTH_DATA], proof_password)))
    return c, s, c.expect(m5.CONNACK)


def counters(b) -> dict:
    return b.stats()["counters"]


def test_success_without_sending_the_password(srv5, uid):
    before = counters(srv5)
    mark = srv5.mark()
    c, s, ack = login(srv5, uid, "alice", PASSWORDS["alice"], keepalive=30)
    assert ack.reason == 0x00, ack
    assert ack.properties[m5.AUTH_METHOD] == METHOD              # MQTT-4.12.0-5
    assert s.verify(ack.properties[m5.AUTH_DATA]), "server-final-message does not verify"
    assert c.ping() == []
    assert srv5.wait_log(f"client '{uid}' (user 'alice') from 127.0.0.1:{c.local_port} connected",
                         start=mark)
    after = counters(srv5)
    assert after["scram_succeeded"] == before["scram_succeeded"] + 1
    assert after["scram_failed"] == before["scram_failed"]
    assert after["password_checks"] == before["password_checks"]   # no password hash computed
    assert PASSWORDS["alice"] not in srv5.log_text()


@pytest.mark.parametrize("user, password, proof, why", [
    ("carol", PASSWORDS["carol"], "not-carols-pw", "wrong password (SCRAM proof)"),
    ("nobody", "whatever-pw", None, "unknown user"),
    (OLD_USER, OLD_PW, None, "no SCRAM keys for this user (added before edgebroker passwd wrote "
                             "them: set its password again with edgebroker passwd; its password "
                             "login works)"),
])
def test_bad_credentials_get_0x86(srv5, uid, user, password, proof, why):
    before = counters(srv5)
    mark = srv5.mark()
    c, s, ack = login(srv5, uid, user, password, proof)
    assert ack.reason == 0x86, ack
    # The client is not told which of the three it was (which user names exist); the log is.
    assert ack.properties[m5.REASON_STRING] == "bad user name or password"
    assert m5.AUTH_DATA not in ack.properties
    assert c.expect_closed(5)
    assert srv5.wait_log(f"client '{uid}' (user '{user}') from 127.0.0.1:{c.local_port}: refused "
                         f"(CONNACK 0x86): SCRAM-SHA-256: {why}", start=mark)
    after = counters(srv5)
    assert after["scram_failed"] == before["scram_failed"] + 1
    assert after["logins_failed"] == before["logins_failed"] + 1


def test_unknown_user_cannot_be_told_from_a_known_one_by_the_salt(srv5, uid):
    salts = []
    for i in range(2):
        c = raw5(srv5)
        s = Scram("nobody-" + uid, "x")
        first = start(c, f"{uid}-{i}", s)
        assert first.type == m5.AUTH and first.reason == 0x18
        s.final(first.properties[m5.AUTH_DATA])
        salts.append((s.salt, s.iterations))
        c.close()
    assert salts[0] == salts[1] and len(salts[0][0]) == 16 and salts[0][1] == 4096


def test_unknown_user_is_told_the_iteration_count_most_users_have(broker, tmp_path, uid):
    """With users written with more iterations than the default (as docs/security.md
    suggests), a made-up user name was told i=4096 and stood out from the real ones."""
    pw = tmp_path / "passwd"
    write_file(pw, [f"{u}:{hash_password(p)}:{keys_field(p, iterations=8192)}"
                    for u, p in (("alice", "alice-pw"), ("bob", "bob-pw"))]
               + [f"carol:{hash_password('carol-pw')}:{keys_field('carol-pw')}"])
    b = broker(password_file=str(pw))
    told = {}
    for user in ("alice", "carol", "nobody-" + uid):
        c = raw5(b)
        s = Scram(user, "x")
        first = start(c, f"{uid}-{len(told)}", s)
        assert first.type == m5.AUTH and first.reason == 0x18
        s.final(first.properties[m5.AUTH_DATA])
        told[user] = s.iterations
        c.close()
    assert list(told.values()) == [8192, 4096, 8192]


def test_user_without_keys_still_logs_in_with_its_password(srv5, uid):
    c = raw5(srv5)
    assert c.connect(uid, username=OLD_USER, password=OLD_PW).reason == 0
    assert c.publish(f"{OLD_USER}/t", b"x", qos=1).reason == 0
    srv5.client(f"{uid}-311", username=OLD_USER, password=OLD_PW).disconnect()
    srv5.client(f"{uid}-mosq", username="mosq", password=MOSQUITTO_PASSWORD).disconnect()


def test_plain_password_login_still_works_for_a_scram_user(srv5, uid):
    srv5.client(uid, username="alice", password=PASSWORDS["alice"]).disconnect()
    c = raw5(srv5)
    ack = c.connect(f"{uid}-5", username="alice", password=PASSWORDS["alice"])
    assert ack.reason == 0 and m5.AUTH_METHOD not in ack.properties     # MQTT-4.12.0-6
    srv5.client(f"{uid}-bad", username="alice", password="wrong", expect_rc=4)


def test_unknown_method_and_scram_without_password_file_get_0x8c(srv5, uid):
    c = raw5(srv5)
    c.send(m5.connect5(uid, props=auth_props(b"hello", "FANCY-AUTH")))
    ack = c.expect(m5.CONNACK)
    assert ack.reason == 0x8C
    assert "'FANCY-AUTH' is not supported (only SCRAM-SHA-256)" in ack.properties[m5.REASON_STRING]
    assert c.expect_closed(5)
    c = raw5(srv5, srv5.listeners[1][1])
    ack = start(c, uid, Scram("alice", PASSWORDS["alice"]))
    assert ack.type == m5.CONNACK and ack.reason == 0x8C
    assert ack.properties[m5.REASON_STRING] == (
        f"SCRAM-SHA-256 needs a password_file on listener 127.0.0.1:{srv5.listeners[1][1]}")


@pytest.mark.parametrize("gs2, words", [
    ("p=tls-server-end-point,,", "channel binding is not supported"),
    ("n,a=bob,", "authorization identity 'bob' differs from the user name 'alice'"),
])
def test_channel_binding_and_another_identity_are_refused_0x87(srv5, uid, gs2, words):
    before = counters(srv5)
    c = raw5(srv5)
    ack = start(c, uid, Scram("alice", PASSWORDS["alice"], gs2=gs2))
    assert ack.type == m5.CONNACK and ack.reason == 0x87
    assert words in ack.properties[m5.REASON_STRING]
    assert c.expect_closed(5)
    after = counters(srv5)
    assert after["scram_failed"] == before["scram_failed"] + 1
    assert after["logins_refused"] == before["logins_refused"] + 1


def test_connect_user_name_must_be_the_scram_user(srv5, uid):
    c = raw5(srv5)
    ack = start(c, uid, Scram("alice", PASSWORDS["alice"]), username="bob")
    assert ack.type == m5.CONNACK and ack.reason == 0x87
    assert "User Name 'bob' is not the SCRAM user name 'alice'" in ack.properties[m5.REASON_STRING]
    c, s, ack = login(srv5, f"{uid}-same", "alice", PASSWORDS["alice"], username="alice")
    assert ack.reason == 0 and s.verify(ack.properties[m5.AUTH_DATA])


@pytest.mark.parametrize("second, words", [
    (m5.publish5("alice/t", b"early"), "PUBLISH before the authentication exchange ended"),
    (m5.subscribe5(1, [("alice/#", 0)]), "SUBSCRIBE before the authentication exchange ended"),
    (m5.auth5(0x18, auth_props(b"c=biws,r=x,p=AAAA", "OTHER")),
     "AUTH with Authentication Method 'OTHER'; the CONNECT's was 'SCRAM-SHA-256'"),
    (m5.auth5(0x19, auth_props(b"n,,n=alice,r=abc")), "AUTH 0x19 during the authentication"),
])
def test_out_of_sequence_during_the_exchange_gets_connack_0x82(srv5, uid, second, words):
    c = raw5(srv5)
    first = start(c, uid, Scram("alice", PASSWORDS["alice"]))
    assert first.type == m5.AUTH
    mark = srv5.mark()
    c.send(second)
    ack = c.expect(m5.CONNACK)
    assert ack.reason == 0x82 and words in ack.properties[m5.REASON_STRING]
    assert c.expect_closed(5)
    assert srv5.wait_log(words, start=mark)


def test_disconnect_during_the_exchange_closes_quietly(srv5, uid):
    c = raw5(srv5)
    assert start(c, uid, Scram("alice", PASSWORDS["alice"])).type == m5.AUTH
    mark = srv5.mark()
    c.send(m5.disconnect5())
    assert c.expect_closed(5) and c.before_close == []
    assert srv5.wait_log(f"client '{uid}' from 127.0.0.1:{c.local_port} disconnected during the "
                         f"authentication exchange", start=mark)


@pytest.mark.parametrize("packet, words", [
    (m5.auth5(0x18, auth_props(b"c=biws,r=x,p=AAAA")), "AUTH 0x18 with no authentication "
                                                         "exchange running"),
    (m5.auth5(0x19, auth_props(b"n,,n=alice,r=abc", "OTHER")), "AUTH with Authentication "
                                                                "Method 'OTHER'"),
    (m5.auth5(0x00, auth_props(b"")), "AUTH 0x00 (Success) is sent only by the server"),
])
def test_out_of_sequence_auth_when_connected_gets_disconnect_0x82(srv5, uid, packet, words):
    c, _, ack = login(srv5, uid, "alice", PASSWORDS["alice"])
    assert ack.reason == 0
    c.send(packet)
    d = c.expect_disconnect()
    assert d.reason == 0x82 and words in d.properties[m5.REASON_STRING]


def test_auth_without_a_method_at_connect_is_a_protocol_error(srv5, uid):
    c = raw5(srv5)
    assert c.connect(uid, username="alice", password=PASSWORDS["alice"]).reason == 0
    c.send(m5.auth5(0x19, auth_props(b"n,,n=alice,r=abc")))
    d = c.expect_disconnect()
    assert d.reason == 0x82 and "MQTT-4.12.0-7" in d.properties[m5.REASON_STRING]


def test_acl_applies_to_the_scram_user(srv5, uid):
    c, _, ack = login(srv5, uid, "alice", PASSWORDS["alice"])
    assert ack.reason == 0
    assert c.subscribe("alice/#", ("bob/#", 1)).codes == [0x00, 0x87]
    assert c.publish("alice/in", b"mine", qos=1).reason == 0x00
    assert c.publish("bob/in", b"not mine", qos=1).reason == 0x87
    got = c.recv_publish()
    assert (got.topic, got.payload) == ("alice/in", b"mine")


def reauth(c, s: Scram, proof_password: str | None = None, others=()):
    """AUTH 0x19 with the client-first-message; send ``others`` while the exchange runs; then
    AUTH 0x18 with the client-final-message. Returns the broker's first answer (AUTH 0x18)."""
    c.auth(0x19, auth_props(s.first()))
    first = c.wait_for(lambda p: p.type == m5.AUTH)
    assert first.reason == 0x18 and first.properties[m5.AUTH_METHOD] == METHOD, first
    for packet in others:
        c.send(packet)
    c.auth(0x18, auth_props(s.final(first.properties[m5.AUTH_DATA], proof_password)))
    return first


def test_reauthentication_succeeds_and_packets_flow_meanwhile(srv5, uid):
    c, _, ack = login(srv5, uid, "bob", PASSWORDS["bob"])
    assert ack.reason == 0
    assert c.subscribe("bob/#", qos=1).codes == [1]
    before = counters(srv5)
    mark = srv5.mark()
    s = Scram("bob", PASSWORDS["bob"])
    # A PUBLISH between the two AUTH packets is handled at once (section 4.12.1).
    reauth(c, s, others=[m5.publish5("bob/during", b"still flowing", qos=1, packet_id=9)])
    got = [c.wait_for(lambda p: p.type == t) for t in (m5.PUBACK, m5.PUBLISH, m5.AUTH)]
    assert got[0].packet_id == 9 and got[0].reason == 0
    assert got[1].payload == b"still flowing"
    done = got[2]
    assert done.reason == 0x00 and done.properties[m5.AUTH_METHOD] == METHOD
    assert s.verify(done.properties[m5.AUTH_DATA])
    assert c.ping() == []
    assert srv5.wait_log(f"client '{uid}' (user 'bob') from 127.0.0.1:{c.local_port} "
                         f"re-authenticated (SCRAM-SHA-256; later ones", start=mark)
    assert counters(srv5)["scram_succeeded"] == before["scram_succeeded"] + 1
    # The client decides how often it re-authenticates: each was logged at INFO (300 a
    # second, 300 lines); the next ones of the connection are at debug level.
    for _ in range(5):
        reauth(c, Scram("bob", PASSWORDS["bob"]))
        assert c.wait_for(lambda p: p.type == m5.AUTH).reason == 0x00
    assert c.ping() == []
    assert counters(srv5)["scram_succeeded"] == before["scram_succeeded"] + 6
    lines = [ln for ln in srv5.logs[mark:] if f"from 127.0.0.1:{c.local_port}" in ln]
    assert len(lines) == 1 and lines[0].endswith(
        "re-authenticated (SCRAM-SHA-256; later ones of this connection are logged at debug "
        "level)"), lines


@pytest.mark.parametrize("user, proof, why", [
    ("erin", "wrong-pw", "wrong password (SCRAM proof)"),
    ("bob", None, "re-authentication as user 'bob': the connection's user is 'erin'"),
])
def test_failed_reauthentication_gets_disconnect_0x87_and_the_will(srv5, uid, user, proof, why):
    watcher = raw5(srv5)
    assert watcher.connect(f"{uid}-w", username="erin", password=PASSWORDS["erin"]).reason == 0
    assert watcher.subscribe("erin/will").codes == [0]
    c, _, ack = login(srv5, uid, "erin", PASSWORDS["erin"], will=("erin/will", b"gone"))
    assert ack.reason == 0
    before = counters(srv5)
    mark = srv5.mark()
    if user == "erin":          # the connection's own user, with a wrong proof
        reauth(c, Scram(user, PASSWORDS[user]), proof)
    else:   # refused at the client-first-message
        c.auth(0x19, auth_props(Scram(user, PASSWORDS[user]).first()))
    d = c.expect_disconnect()
    assert d.reason == 0x87
    told = "bad user name or password" if proof else why
    assert d.properties[m5.REASON_STRING] == f"re-authentication failed: {told}"
    assert srv5.wait_log(f"client '{uid}' (user 'erin') from 127.0.0.1:{c.local_port}: "
                         f"re-authentication failed (DISCONNECT 0x87): SCRAM-SHA-256: {why}",
                         start=mark)
    assert watcher.recv_publish().payload == b"gone"
    assert counters(srv5)["scram_failed"] == before["scram_failed"] + 1


def test_publishes_before_a_failed_reauthentication_are_acknowledged(srv5, uid):
    """QoS 1 PUBLISHes sent in one write with an AUTH that fails: their PUBACKs go out before
    the DISCONNECT (they were dropped at the close: the client sent them again)."""
    c, _, ack = login(srv5, uid, "erin", PASSWORDS["erin"])
    assert ack.reason == 0
    c.send(b"".join(m5.publish5("erin/t", b"%d" % i, qos=1, packet_id=i + 1) for i in range(50))
           + m5.auth5(0x19, auth_props(Scram("bob", PASSWORDS["bob"]).first())))
    acks = [c.wait_for(lambda p: p.type in (m5.PUBACK, m5.DISCONNECT)) for _ in range(51)]
    assert [(p.type, p.packet_id) for p in acks[:50]] == [(m5.PUBACK, i + 1) for i in range(50)]
    assert acks[50].type == m5.DISCONNECT and acks[50].reason == 0x87


def test_mqttjs_logs_in_by_scram(srv5, mqttjs, uid):
    """A real 5.0 client (MQTT.js, its handleAuth answering the AUTH) logs in and is served."""
    js = mqttjs()
    url = f"mqtt://127.0.0.1:{srv5.port}"
    js.send("connect", url=url, options={"protocolVersion": 5, "clientId": uid},
            scram={"user": "alice", "password": PASSWORDS["alice"]})
    assert js.wait("connect")["scramVerified"] is True
    assert js.subscribe("alice/js", qos=1) == [1]
    js.publish("alice/js", b"over scram", qos=1)
    assert js.message()["payload"] == b"over scram"
    js.end()
    bad = mqttjs()
    bad.send("connect", url=url, options={"protocolVersion": 5, "clientId": f"{uid}-bad"},
             scram={"user": "alice", "password": "wrong"})
    with pytest.raises(AssertionError, match="Bad User Name or Password"):
        bad.wait("connect")


# ---------------------------------------------------------------------------------------------
# Brokers of their own: the CONNECT timeout, throttles, reload
# ---------------------------------------------------------------------------------------------

def test_a_client_that_never_answers_is_closed_at_connect_timeout(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw"}))
    b = broker(password_file=str(pw), limits={"connect_timeout": 0.3})
    c = raw5(b)
    assert start(c, uid, Scram("alice", "alice-pw")).type == m5.AUTH
    mark = b.mark()
    assert c.expect_closed(10) and c.before_close == []
    assert b.wait_log(f"client '{uid}' from 127.0.0.1:{c.local_port}: authentication exchange "
                      f"not finished within 0.3 s; closing", start=mark)
    assert b.stats()["counters"]["connect_timeouts"] >= 1


def test_failed_scram_logins_are_throttled_like_passwords(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw", "bob": "bob-pw"}))
    b = broker(password_file=str(pw), max_login_failures=2)
    # A right login first: alice's client key is known from then on.
    assert login(b, f"{uid}-ok", "alice", "alice-pw")[2].reason == 0
    for i in range(2):
        assert login(b, f"{uid}-bad{i}", "alice", "alice-pw", "guess")[2].reason == 0x86
    ack = login(b, f"{uid}-guess", "alice", "alice-pw", "guess")[2]
    assert ack.reason == 0x87 and "2 failed logins in a row for user 'alice'" in \
        ack.properties[m5.REASON_STRING]
    # Known right (since the start): accepted whatever the throttle says, as a password is.
    assert login(b, f"{uid}-known", "alice", "alice-pw")[2].reason == 0
    # bob's right password was never seen: refused while the pair is throttled.
    for i in range(2):
        assert login(b, f"{uid}-b{i}", "bob", "bob-pw", "guess")[2].reason == 0x86
    assert login(b, f"{uid}-bob", "bob", "bob-pw")[2].reason == 0x87
    # Password logins share the throttle.
    b.client(f"{uid}-p", username="bob", password="bob-pw", expect_rc=5)


def test_a_throttled_scram_login_is_logged_at_the_default_interval(broker, tmp_path, uid):
    """Its own kind in the refusal log: the wrong proofs before it do not hide it."""
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw", "bob": "bob-pw"}))
    b = broker(password_file=str(pw), max_login_failures=2, refusal_log_interval=60)
    for i in range(2):
        assert login(b, f"{uid}-bad{i}", "alice", "alice-pw", "guess")[2].reason == 0x86
    for i in range(2):
        assert login(b, f"{uid}-t{i}", "alice", "alice-pw")[2].reason == 0x87
    b.client(f"{uid}-bob", username="bob", password="bob-pw")     # a line after them all
    assert b.wait_log(f"client '{uid}-bob' (user 'bob') from 127.0.0.1:")
    lines = [ln for ln in b.logs if "refused (CONNACK 0x87): SCRAM-SHA-256: 2 failed logins "
             "in a row for user 'alice' from loopback; its next password check in" in ln]
    assert len(lines) == 1 and f"client '{uid}-t0'" in lines[0], "\n".join(b.logs)


def test_reload_picks_up_a_new_user_and_changed_keys(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw"}))
    b = broker(password_file=str(pw))
    assert login(b, f"{uid}-d0", "dave", "dave-pw")[2].reason == 0x86
    c, _, ack = login(b, f"{uid}-a", "alice", "alice-pw")
    assert ack.reason == 0
    write_file(pw, password_lines({"alice": "alice-new", "dave": "dave-pw"}))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("reload: re-read", start=mark)
    c2, s, ack = login(b, f"{uid}-d1", "dave", "dave-pw")
    assert ack.reason == 0 and s.verify(ack.properties[m5.AUTH_DATA])
    # The connected client re-authenticates against the file as it is now.
    s = Scram("alice", "alice-new")
    reauth(c, s)
    done = c.expect(m5.AUTH)
    assert done.reason == 0 and s.verify(done.properties[m5.AUTH_DATA])
    assert login(b, f"{uid}-a2", "alice", "alice-pw")[2].reason == 0x86


def test_a_websocket_client_closing_during_the_exchange_is_closed_at_once(broker, tmp_path):
    """A 5.0 client over a WebSocket starts SCRAM, gets the server's first AUTH, then sends a
    close frame: answered at once (as a TCP FIN is), not held for connect_timeout (the close
    waited for the CONNECT still being decided) and counted as a connect timeout."""
    import socket
    import time
    from wsproto.events import CloseConnection
    from wsclient import WebSocketSocket
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw"}))
    b = broker(password_file=str(pw), limits={"connect_timeout": 30},
               listener=[{"host": "127.0.0.1", "port": 0, "protocol": "websockets"}])
    ws = WebSocketSocket(socket.create_connection((b.host, b.port), timeout=10), "/mqtt")
    try:
        scram = Scram("alice", "alice-pw")
        ws.sendall(m5.connect5("scram-ws", props=auth_props(scram.first())))
        assert ws.recv(65536)[0] >> 4 == 15                  # the server's first AUTH
        started = time.monotonic()
        ws.send_event(CloseConnection(code=1000))
        assert ws.wait_close(20) == 1000
        assert time.monotonic() - started < 10      # (connect_timeout is 30 s)
    finally:
        ws.close()
    assert b.stats()["counters"]["connect_timeouts"] == 0

