"""The salt a SCRAM client is told for an unknown user name (or a user without SCRAM keys) is
made with a secret kept in the state directory, so it is the same before and after a restart,
as a real user's salt is: a client that sees a restart cannot tell which names are users
(docs/security.md, "SCRAM-SHA-256")."""

from __future__ import annotations

import logging
import os
import stat

import pytest

import mqttraw5 as m5
from edgebroker.security import authenticator as A
from edgebroker.security.passwords import hash_password
from scramclient import Scram
from security.test_scram import password_lines, raw5, start, write_file

pytestmark = pytest.mark.timeout(60)

NAMES = ("alice", "olduser", "mallory")     # SCRAM keys, no keys, no such user


def salts(b, uid: str) -> dict[str, tuple[bytes, int]]:
    told = {}
    for name in NAMES:
        c = raw5(b)
        s = Scram(name, "x")
        first = start(c, f"{uid}-{name}", s)
        assert first.type == m5.AUTH and first.reason == 0x18, first
        s.final(first.properties[m5.AUTH_DATA])
        told[name] = (s.salt, s.iterations)
        c.close()
    return told


def test_the_salts_of_unknown_names_stay_the_same_across_a_restart(broker, tmp_path, uid):
    pw = tmp_path / "passwd"
    write_file(pw, password_lines({"alice": "alice-pw"}) + [f"olduser:{hash_password('o-pw')}"])
    data = tmp_path / "data"
    b = broker(password_file=str(pw), data_dir=str(data))
    before = salts(b, uid)
    assert b.stop() == 0
    b = broker(password_file=str(pw), data_dir=str(data))
    assert salts(b, uid) == before
    assert len({salt for salt, _ in before.values()}) == 3
    secret = data / A.SCRAM_SECRET_FILE
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert len(secret.read_bytes()) == A.SECRET_BYTES


def test_a_damaged_secret_is_replaced_with_a_warning(tmp_path, caplog):
    path = tmp_path / A.SCRAM_SECRET_FILE
    path.write_bytes(b"short")
    with caplog.at_level(logging.WARNING, "edgebroker.security"):
        secret = A.load_secret(str(tmp_path))
    assert len(secret) == A.SECRET_BYTES and path.read_bytes() == secret
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [r.getMessage() for r in caplog.records] == [
        f"the SCRAM decoy secret {path} was damaged (5 bytes, not 32): replaced with a new one; "
        f"the salts given to unknown user names change once"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "edgebroker.security"):
        assert A.load_secret(str(tmp_path)) == secret       # kept from now on
    assert caplog.records == []
    assert not (tmp_path / (A.SCRAM_SECRET_FILE + ".tmp")).exists()
