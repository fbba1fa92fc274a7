"""User names at their limits against a real broker: SCRAM's escapes in a user name ('=2C' is
',', '=3D' is '='), up to a 64 KB name, and what the failed-login throttle keeps of a long one."""

from __future__ import annotations

import mqttraw5 as m5
from security.test_scram import login, password_lines, write_file

USERS = {"we,ird=name": "weird-pw", "=2C": "escaped-pw"}


def test_scram_user_names_with_escapes_log_in_and_a_64_kb_name_is_answered(broker, tmp_path,
                                                                          uid):
    pw = tmp_path / "passwd"
    write_file(pw, password_lines(USERS))
    b = broker(password_file=str(pw))
    # The client writes "we=2Cird=3Dname" and "=3D2C": each escape is undone once.
    for user, password in USERS.items():
        assert login(b, f"{uid}-{password}", user, password)[2].reason == 0
        assert login(b, f"{uid}-bad-{password}", user, password, "guess")[2].reason == 0x86
    # ~21,800 escapes (64 KB in the client-first-message): the exchange runs as for any
    # unknown user (the broker's AUTH, then Bad user name or password) and the log names the
    # user, decoded and cut short.
    name = "," * 21_800
    mark = b.mark()
    c, _, ack = login(b, f"{uid}-long", name, "x")
    assert ack.reason == 0x86
    line = b.wait_log(f"client '{uid}-long' (user {','* 100!r}...) from 127.0.0.1:"
                      f"{c.local_port}: refused (CONNACK 0x86): SCRAM-SHA-256: unknown user",
                      start=mark)
    assert line and len(line) < 400, line


def test_the_throttle_tells_long_user_names_apart_and_names_them_cut_short(broker, tmp_path,
                                                                          uid):
    """Failed logins with 64 KB user names are throttled per (address, user name) as short
    ones are; the refusal names the user by its first 100 characters."""
    pw = tmp_path / "passwd"
    write_file(pw, password_lines(USERS))
    b = broker(password_file=str(pw), max_login_failures=2)
    first, second = "n" * 65_000 + "1", "n" * 65_000 + "2"
    for i in range(2):
        assert login(b, f"{uid}-a{i}", first, "x")[2].reason == 0x86
    mark = b.mark()
    c, _, ack = login(b, f"{uid}-a", first, "x")
    told = ack.properties[m5.REASON_STRING]
    assert ack.reason == 0x87 and told.startswith(
        f"SCRAM-SHA-256: 2 failed logins in a row for user {'n' * 100!r}... from loopback; "
        f"its next password check in "), told[:300]
    assert len(told) < 300
    assert b.wait_log(f"client '{uid}-a' (user {'n' * 100!r}...) from 127.0.0.1:"
                      f"{c.local_port}: refused (CONNACK 0x87): {told}", start=mark)
    # The same first 65,000 characters, another user name: a pair of its own.
    assert login(b, f"{uid}-b", second, "x")[2].reason == 0x86
    # A known user from that address still logs in.
    assert login(b, f"{uid}-ok", "we,ird=name", "weird-pw")[2].reason == 0
