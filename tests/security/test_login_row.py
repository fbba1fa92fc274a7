"""A successful login starts a pair's "failed logins in a row" again (docs/security.md,
"Logging in"): failures before and after it do not add up, for a password login and for a
SCRAM login alike."""

from __future__ import annotations

import pytest

from secfiles import write_passwords
from security.test_scram import login, password_lines, write_file

pytestmark = pytest.mark.timeout(60)


def test_a_successful_password_login_resets_the_failures_in_a_row(broker, tmp_path, uid):
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw"})
    b = broker(password_file=str(pw), max_login_failures=3, refusal_log_interval=0)
    codes = []
    for i, password in enumerate(["wrong", "wrong", "alice-pw", "wrong", "wrong", "wrong",
                                  "wrong"]):
        c = b.raw()
        codes.append(c.connect(f"{uid}-{i}", username="alice", password=password).rc)
        c.close()
    # Three checked failures after the success (4, 4, 4), then the throttle (5).
    assert codes == [4, 4, 0, 4, 4, 4, 5], codes
    assert b.wait_log(f"client '{uid}-6' (user 'alice') from 127.0.0.1")
    assert b.stats()["counters"]["password_checks"] == 6


def test_a_successful_scram_login_resets_the_failures_in_a_row(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw"}))
    b = broker(password_file=str(pw), max_login_failures=3)
    reasons = []
    for i, proof in enumerate(["guess", "guess", None, "guess", "guess", "guess", "guess"]):
        reasons.append(login(b, f"{uid}-{i}", "alice", "alice-pw", proof)[2].reason)
    assert reasons == [0x86, 0x86, 0x00, 0x86, 0x86, 0x86, 0x87], reasons

