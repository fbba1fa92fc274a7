"""Many first logins at once from one address: password checks still waiting are not failed
logins (the per-address limit counts failures only); past PENDING_PER_HOST waiting from one
address, logins are refused as busy (CONNACK 3, 5.0: 0x89), counted as `auth_busy`."""

import sys

import mqttraw as m
import mqttraw5 as m5
from conftest import _open_clients
from secfiles import write_passwords


def test_right_first_logins_beyond_the_address_limit_are_all_accepted(broker, tmp_path, uid):
    """max_login_failures 3: the address limit is 30 failed logins. 45 right passwords, never
    seen before (no cache: as after every start), at once from one address: all accepted."""
    users = {f"u{i}": f"u{i}-pw" for i in range(45)}
    pw = write_passwords(tmp_path / "passwd", users)
    b = broker(password_file=str(pw), max_login_failures=3)
    clients = [b.raw() for _ in users]
    for i, (c, (user, password)) in enumerate(zip(clients, users.items())):
        c.send(m.connect(f"{uid}-{i}", username=user, password=password))
    codes = [c.expect(m.CONNACK, timeout=30).rc for c in clients]
    assert codes == [0] * len(users), codes
    assert "too many failed logins" not in b.log_text()
    assert b.stats()["counters"]["password_checks"] == len(users)


def test_checks_waiting_from_one_address_are_bounded_as_busy(broker, tmp_path, uid):
    """PENDING_PER_HOST lowered to 2 for the test: the logins from one address past it get
    CONNACK 3 (a 5.0 client 0x89, server busy), logged as busy checks, counted as
    `auth_busy`, not as failed logins."""
    users = {f"u{i}": f"u{i}-pw" for i in range(8)}
    pw = write_passwords(tmp_path / "passwd", users)
    patch = ("import runpy, sys; import edgebroker.security.authenticator as a; "
             "a.PENDING_PER_HOST = 2; sys.argv[0] = 'edgebroker'; "
             "runpy.run_module('edgebroker', run_name='__main__')")
    b = broker(password_file=str(pw),
               wrap=lambda cmd: [sys.executable, "-c", patch] + cmd[cmd.index("serve"):])
    mark = b.mark()
    # 4 3.1.1 and 4 5.0 logins at once: read in one pass of the loop, while a check takes tens
    # of milliseconds, so all but about two find two checks waiting from the address.
    v3 = [b.raw(source="127.0.0.2") for _ in range(4)]
    v5 = [m5.RawClient5(b.host, b.port, source="127.0.0.2") for _ in range(4)]
    _open_clients.extend(v5)
    for i, (user, password) in enumerate(users.items()):
        if i < 4:
            v3[i].send(m.connect(f"{uid}-{i}", username=user, password=password))
        else:
            v5[i - 4].send(m5.connect5(f"{uid}-{i}", username=user, password=password))
    codes = [c.expect(m.CONNACK, timeout=30).rc for c in v3]
    reasons = [c.expect(m5.CONNACK, timeout=30).reason for c in v5]
    assert set(codes) <= {0, 3} and set(reasons) <= {0, 0x89}, (codes, reasons)
    assert 3 in codes and 0x89 in reasons and codes.count(0) + reasons.count(0) <= 4, \
        (codes, reasons)
    busy = codes.count(3) + reasons.count(0x89)
    line = b.wait_log("refused (CONNACK 3): too many password checks waiting from loopback (2); "
                      "the checks are busy", start=mark)
    assert line, b.log_text()
    assert "failed logins" not in "\n".join(b.logs[mark:])
    refused = b.stats()["refused"]
    assert refused["auth_busy"] == busy and refused["auth"] == 0, refused
    assert b.client(f"{uid}-later", username="u7", password="u7-pw").ping() == []
