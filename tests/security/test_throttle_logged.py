"""A login refused because its (address, user name) is throttled after failed logins is logged
with its reason at the default refusal_log_interval: the wrong passwords before it, logged
once per address and interval, do not hide it (docs/security.md, "Every refusal is counted
and logged")."""

from __future__ import annotations

import pytest

from secfiles import write_passwords

pytestmark = pytest.mark.timeout(60)


def test_the_first_throttled_login_is_logged_once_at_the_default_interval(broker, tmp_path,
                                                                             uid):
    pw = write_passwords(tmp_path / "passwd", {"alice": "alice-pw", "bob": "bob-pw"})
    b = broker(password_file=str(pw), max_login_failures=3, refusal_log_interval=60)
    src = {"source": "127.0.0.5"}
    for i in range(5):
        b.client(f"{uid}-w{i}", username="alice", password=f"guess-{i}", transport=src,
                 expect_rc=4 if i < 3 else 5)
    # The right password, never seen before: refused unchecked while the pair's delay runs.
    b.client(f"{uid}-right", username="alice", password="alice-pw", transport=src, expect_rc=5)
    # A line logged after all of those: every line about them is in the log by then.
    b.client(f"{uid}-bob", username="bob", password="bob-pw", transport=src)
    assert b.wait_log(f"client '{uid}-bob' (user 'bob') from 127.0.0.5:")
    logged = b.logs[:]
    throttled = [ln for ln in logged if "refused (CONNACK 5): 3 failed logins in a row for "
                 "user 'alice' from loopback; its next password check in " in ln]
    assert len(throttled) == 1, "\n".join(logged)
    assert f"client '{uid}-w3' (user 'alice') from 127.0.0.5:" in throttled[0]
    assert throttled[0].endswith("; not checked")
    wrong = [ln for ln in logged if "refused (CONNACK 4): wrong password" in ln]
    assert len(wrong) == 1 and f"client '{uid}-w0'" in wrong[0], "\n".join(logged)
    assert b.stats()["refused"]["auth"] == 6
