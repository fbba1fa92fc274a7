"""Logins around a reload (SIGHUP): a password check or SCRAM exchange that began before the
reload ends against the password file in force when it ends (docs/security.md)."""

import signal

import mqttraw as m
import mqttraw5 as m5
from secfiles import write_passwords
from security.test_scram import auth_props, password_lines, raw5, start, write_file
from scramclient import Scram

USERS = {f"u{i}": f"u{i}-pw" for i in range(40)}


def test_users_removed_by_a_reload_while_their_checks_wait_are_refused(broker, tmp_path, uid):
    """40 first logins wait for the two workers; the file loses all of them but u0 (whose
    password changes) and is reloaded meanwhile. No login that ends after the reload is
    accepted: the removed users get CONNACK 4 (unknown user), u0's old password is checked
    again against its new hash (wrong password)."""
    pw = write_passwords(tmp_path / "passwd", USERS)
    b = broker(password_file=str(pw), log_level="debug")
    clients = [b.raw() for _ in USERS]
    for i, (c, (user, password)) in enumerate(zip(clients, USERS.items())):
        c.send(m.connect(f"{uid}-{i}", username=user, password=password))
    write_passwords(pw, {"u0": "u0-new-pw"})
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(f"reload: re-read {pw}", start=mark)
    codes = [c.expect(m.CONNACK, timeout=30).rc for c in clients]
    after = b.logs[b.logs.index(next(ln for ln in b.logs[mark:]
                                     if f"reload: re-read {pw}" in ln)):]
    checked_after = [ln for ln in after if "password check done" in ln]
    assert checked_after, "every check ended before the reload: nothing measured"
    assert not [ln for ln in after if f"client '{uid}-" in ln and " connected" in ln], \
        "\n".join(after)
    removed = [ln for ln in after if "refused (CONNACK 4): unknown user (removed from the "
               "password file by a reload while its password was checked)" in ln]
    assert len(removed) >= len(checked_after) - 2, "\n".join(after)
    assert set(codes) <= {0, 4} and codes.count(4) >= len(removed), codes
    if codes[0] == 4:       # u0's check ended after the reload: checked again, new hash
        assert b.wait_log("user 'u0': the password file was reloaded with another password",
                          start=mark)
        assert b.wait_log(f"client '{uid}-0' (user 'u0') from 127.0.0.1:{clients[0].local_port}"
                          f": refused (CONNACK 4): wrong password", start=mark)
    assert b.client(f"{uid}-new", username="u0", password="u0-new-pw").ping() == []


def test_a_scram_exchange_ended_after_a_reload_removed_its_user_is_refused(broker, tmp_path,
                                                                           uid):
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw", "bob": "bob-pw"}))
    b = broker(password_file=str(pw))
    exchanges = []
    for user in ("alice", "bob"):
        c, s = raw5(b), Scram(user, f"{user}-pw")
        first = start(c, f"{uid}-{user}", s)
        assert first.type == m5.AUTH and first.reason == 0x18, first
        exchanges.append((c, s, first))
    # alice removed, bob's password (and so his salt and keys) changed
    write_file(pw, password_lines({"bob": "bob-new-pw"}))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(f"reload: re-read {pw}", start=mark)
    for (c, s, first), why in zip(exchanges, ("unknown user", "its SCRAM keys changed")):
        c.auth(0x18, auth_props(s.final(first.properties[m5.AUTH_DATA])))
        assert c.expect(m5.CONNACK).reason == 0x86
        assert b.wait_log(f"{why} (the password file was reloaded during the exchange)",
                          start=mark)
