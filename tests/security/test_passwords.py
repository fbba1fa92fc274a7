"""Password hashes and the password file: formats, verification, file rules."""

import os
import re

import pytest

from edgebroker.errors import ConfigError
from edgebroker.security import passwords as pw
from scramclient import keys_field, stored_keys

# Written by Debian's mosquitto_passwd 2.0.11 (`mosquitto_passwd -c -b FILE alice secret`).
MOSQUITTO_LINE = ("alice:$7$101$JH+6Hli0CqyukLgm$5MJFOzylJBakHveFzrL4Wu33qGGjvOqnzFfeGHUEpQfEBL6e"
                  "qoMpp80EhhUUo6Mx4m8ZNbvZl7PEjyYd74SE2w==")


def test_scrypt_format_and_verify():
    h = pw.hash_password("correct horse")
    assert re.fullmatch(r"\$scrypt\$v=1\$ln=14,r=8,p=1\$[A-Za-z0-9+/]{22}\$[A-Za-z0-9+/]{43}", h), h
    assert pw.verify_password(h, "correct horse")
    assert pw.verify_password(h, b"correct horse")
    assert not pw.verify_password(h, "correct horsf")
    assert not pw.verify_password(h, "")


def test_salt_differs_per_hash():
    assert pw.hash_password("same") != pw.hash_password("same")


def test_unicode_password():
    h = pw.hash_password("pässwörd✓")
    assert pw.verify_password(h, "pässwörd✓".encode())
    assert not pw.verify_password(h, "passwoord")


def test_pbkdf2_own_and_mosquitto():
    h = pw.hash_password("s3cret", "pbkdf2")
    assert h.startswith(f"$7${pw.PBKDF2_ITERATIONS}$")
    assert pw.verify_password(h, "s3cret") and not pw.verify_password(h, "s3cre")
    assert not pw.is_weak(pw.parse_hash(h))
    mosq = MOSQUITTO_LINE.partition(":")[2]
    assert pw.verify_password(mosq, "secret")
    assert not pw.verify_password(mosq, "Secret")
    assert pw.is_weak(pw.parse_hash(mosq))


@pytest.mark.parametrize("stored, words", [
    ("secret", "plain-text"),
    ("", "plain-text"),
    ("$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA", "unknown hash format"),
    ("$scrypt$v=2$ln=14,r=8,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "v=1"),
    ("$scrypt$v=1$ln=40,r=8,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "needs 1,073,741,824 MiB"),
    ("$scrypt$v=1$ln=99,r=8,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "out of range (ln 1 to 63"),
    # More than hashlib.scrypt can be asked for (it would fail at every check), and 1 GiB.
    ("$scrypt$v=1$ln=20,r=32,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43,
     "ln=20, r=32 needs 4,096 MiB of memory per check, more than the 256 MiB allowed "
     "(128 * r * 2**ln; the default ln=14, r=8 needs 16 MiB)"),
    ("$scrypt$v=1$ln=20,r=8,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "needs 1,024 MiB"),
    ("$scrypt$v=1$ln=19,r=8,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "needs 512 MiB"),
    # 8 MiB, within the bound, but OpenSSL's scrypt needs N < 2**(16 * r).
    ("$scrypt$v=1$ln=16,r=1,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43,
     "ln=16, r=1, p=1 cannot be checked (scrypt needs N = 2**ln below 2**(16 * r): with r=1, "
     "ln must be at most 15): no password, the right one included, would match"),
    ("$scrypt$v=1$ln=14,r=8$c2FsdHNhbHRzYWx0$" + "A" * 43, "ln, r and p"),
    ("$scrypt$v=1$ln=14,r=8,p=1$!!!$" + "A" * 43, "base64"),
    ("$scrypt$v=1$ln=14,r=8,p=1$c2FsdA$QUFB", "too short"),
    ("$7$0$c2FsdA==$" + "A" * 88, "out of range"),
    ("$7$abc$c2FsdA==$" + "A" * 88, "$7$ITERATIONS"),
])
def test_bad_hashes(stored, words):
    with pytest.raises(pw.HashError) as info:
        pw.parse_hash(stored)
    message = str(info.value)
    if words == "plain-text":
        assert "plain" in message
    else:
        assert words in message, message


def test_scrypt_memory_bound_is_inclusive():
    """ln=18, r=8 (256 MiB) and ln=14, r=32 are the most a file may ask for; they load."""
    for params in ("ln=18,r=8,p=1", "ln=16,r=32,p=16", "ln=1,r=1,p=1"):
        parsed = pw.parse_hash(f"$scrypt$v=1${params}$c2FsdHNhbHRzYWx0$" + "A" * 43)
        assert parsed[0] == "scrypt"


def _hashlib_runs(ln, r, p, dklen=32):
    import hashlib
    try:
        hashlib.scrypt(b"pw", salt=b"salt", n=1 << ln, r=r, p=p, maxmem=pw._maxmem(ln, r, p),
                       dklen=dklen)
    except (ValueError, OverflowError, MemoryError):
        return False
    return True


def test_scrypt_refusal_matches_what_hashlib_scrypt_runs():
    """The arithmetic check at load agrees with hashlib.scrypt: each parameter set it refuses,
    hashlib refuses too (before computing anything, so that is cheap to try), and each it
    accepts that is cheap to run does run. The limits of the file (r, p, memory) aside."""
    refused = ran = 0
    for ln in (1, 2, 14, 15, 16, 17, 31, 32, 47, 48, 63):
        for r in (1, 2, 3, 4, 1 << 20, 1 << 24, (1 << 32) - 1):
            for p in (1, 2, 1 << 10, (1 << 30) // r or 1, 1 << 30):
                for dklen in (16, 32):
                    why = pw.scrypt_refusal(ln, r, p, dklen)
                    if why is not None:
                        assert not _hashlib_runs(ln, r, p, dklen), (ln, r, p, why)
                        refused += 1
                    elif 128 * r * ((1 << ln) + p + 2) <= 4 << 20 and p <= 2:
                        assert _hashlib_runs(ln, r, p, dklen), (ln, r, p)
                        ran += 1
    assert refused > 100 and ran >= 8, (refused, ran)
    assert pw.scrypt_refusal(15, 1, 1, 32) is None
    assert "ln must be at most 15" in pw.scrypt_refusal(16, 1, 1, 32)
    assert "ln must be at most 31" in pw.scrypt_refusal(32, 2, 1, 32)


def write(path, text, mode=0o600):
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_file_load(tmp_path):
    h = pw.hash_password("a")
    path = write(tmp_path / "pw", f"# users\n\nalice:{h}\n{MOSQUITTO_LINE.replace('alice', 'bob')}\n")
    f = pw.PasswordFile.load(path)
    assert len(f) == 2
    stored, parsed = f.lookup("alice")
    assert stored == h and pw.verify_password(parsed, "a")
    assert f.lookup("carol") is None
    assert f.weak == ["bob"]


def test_unknown_users_are_checked_against_the_files_own_hash(tmp_path):
    """The hash an unknown user's password is checked against has the scheme and parameters
    most of the file's users have (with scrypt's always, a file of PBKDF2 hashes answered an
    unknown user sooner than a known one), and matches no password."""
    pbkdf2 = [pw.hash_password(str(i), "pbkdf2") for i in range(2)]
    lines = [f"u{i}:{h}" for i, h in enumerate(pbkdf2)] + [f"s:{pw.hash_password('x')}",
                                                             MOSQUITTO_LINE]
    f = pw.PasswordFile.load(write(tmp_path / "pw", "\n".join(lines) + "\n"))
    dummy = f.dummy()
    assert dummy[:2] == ("pbkdf2", pw.PBKDF2_ITERATIONS) and dummy is f.dummy()
    known = f.lookup("u0")[1]
    assert len(dummy[2]) == len(known[2]) and len(dummy[3]) == len(known[3])
    assert dummy[2:] != known[2:] and not pw.verify_password(dummy, "0")
    scrypt_file = pw.PasswordFile.load(write(tmp_path / "pw2", f"a:{pw.hash_password('x')}\n"))
    assert scrypt_file.dummy()[:4] == ("scrypt", 14, 8, 1)


def test_the_decoy_of_a_file_without_users_costs_no_hash_to_make(tmp_path, monkeypatch):
    """It is made on the loop thread, at the first unknown user's login: it computed an
    scrypt hash there (about 50 ms, where no check may run). It has the default parameters,
    so an unknown user's check costs what a new user's would, and matches no password."""
    import hashlib

    def no_hash(*args, **kwargs):
        raise AssertionError("a hash was computed to make the decoy")

    f = pw.PasswordFile.load(write(tmp_path / "pw", "# no users yet\n"))
    monkeypatch.setattr(pw, "_dummy", None)
    with monkeypatch.context() as m:
        m.setattr(hashlib, "scrypt", no_hash)
        m.setattr(hashlib, "pbkdf2_hmac", no_hash)
        dummy = f.dummy()
    assert dummy[:4] == ("scrypt", pw.SCRYPT_LN, pw.SCRYPT_R, pw.SCRYPT_P)
    assert len(dummy[4]) == pw.SALT_BYTES and len(dummy[5]) == pw.HASH_BYTES
    assert dummy is f.dummy() and not pw.verify_password(dummy, "")


def test_user_names_that_would_break_the_line_are_refused():
    """Every character str.splitlines ends a line at, and every one of Unicode categories Cc,
    Zl and Zp, is refused in a user name; other characters (a no-break space, an accent) are
    not. A name starting with '#' (after spaces) would read as a comment."""
    import sys
    import unicodedata
    breaking = {chr(c) for c in range(sys.maxunicode + 1)
                if unicodedata.category(chr(c)) in ("Cc", "Zl", "Zp")}
    breaking |= {ch for ch in map(chr, range(0x3000)) if len(f"a{ch}b".splitlines()) > 1}
    assert {"\n", "\r", "\x0b", "\x85", "\u2028", "\u2029"} <= breaking
    for ch in breaking:
        assert "line separators" in pw.check_username(f"bob{ch}x"), repr(ch)
    for name in ("b\u00a0b", "j\u00f6rg", "\u7528\u6237", "a#b", "a b"):
        assert pw.check_username(name) is None, name
    for name in ("#admin", "  #admin", "\t#admin"):
        assert pw.check_username(name) is not None, name
    assert "cannot start with '#'" in pw.check_username(" #admin")


def test_file_lines_end_at_newline_only(tmp_path):
    """A comment may hold U+2028 and other line breaks str.splitlines knows; "\\r\\n" line ends
    still load. A user name holding one is refused with its line."""
    h = pw.hash_password("a")
    path = write(tmp_path / "pw",
                 f"# caf\u00e9 \u2028 note\x85 \x0c\r\nalice:{h}\r\n\r\nbob:{h}\n")
    f = pw.PasswordFile.load(path)
    assert sorted(f.entries) == ["alice", "bob"] and f.lookup("alice")[0] == h
    path = write(tmp_path / "pw2", f"alice:{h}\nbob\u2028x:{h}\n")
    with pytest.raises(ConfigError) as info:
        pw.PasswordFile.load(path)
    assert f"{path} line 2: a user name cannot contain control characters or line separators " \
           f"(it has U+2028)" in str(info.value)


def test_file_with_scram_keys_beside_some_hashes(tmp_path):
    """A third field holds SCRAM keys; lines without one (older users, Mosquitto's) load as
    before and say why they have no keys."""
    field = keys_field("a", b"s" * 16, 8192)
    path = write(tmp_path / "pw", f"alice:{pw.hash_password('a')}:{field}\n"
                                  f"{MOSQUITTO_LINE.replace('alice', 'bob')}\n"
                                  f"carol:{pw.hash_password('c')}\n")
    f = pw.PasswordFile.load(path)
    assert len(f) == 3 and pw.verify_password(f.lookup("alice")[1], "a")
    keys = f.scram_keys("alice")
    assert (keys.salt, keys.iterations) == (b"s" * 16, 8192)
    assert (keys.stored_key, keys.server_key) == stored_keys("a", b"s" * 16, 8192)
    assert "no SCRAM keys" in f.scram_keys("bob") and "edgebroker passwd" in f.scram_keys("carol")
    assert f.scram_keys("dave") == "unknown user"


@pytest.mark.parametrize("text, words", [
    ("alice\n", "line 1: expected username:hash"),
    ("alice:{h}:$scram-sha-256$v=1$i=4096$AA==$AA==$AA==\n",
     "line 1: user 'alice': SCRAM keys: StoredKey and ServerKey must be 32 bytes (the third "
     "field holds the SCRAM keys)"),
    ("alice:{h}:junk\n", "line 1: user 'alice': SCRAM keys: expected"),
    ("# c\nalice:plain\n", "line 2: user 'alice': not a hash"),
    (":$scrypt$x\n", "user name is empty"),
    ("alice:{h}\nalice:{h}\n", "line 2: user 'alice' is listed twice"),
    ("alice:$5$rounds=5000$salt$hash\n", "unknown hash format"),
    ("# c\nalice:{h}\nbob:$scrypt$v=1$ln=20,r=32,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43 + "\n",
     "line 3: user 'bob': scrypt hash: ln=20, r=32 needs 4,096 MiB of memory per check, more "
     "than the 256 MiB allowed"),
    ("alice:$scrypt$v=1$ln=16,r=1,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43 + "\n",
     "line 1: user 'alice': scrypt hash: ln=16, r=1, p=1 cannot be checked"),
])
def test_file_errors_name_the_line(tmp_path, text, words):
    path = write(tmp_path / "pw", text.replace("{h}", pw.hash_password("x")))
    with pytest.raises(ConfigError) as info:
        pw.PasswordFile.load(path)
    assert str(info.value).startswith(f"password_file: {path} ")
    assert words in str(info.value)


def test_plain_text_file_points_to_upgrade(tmp_path):
    path = write(tmp_path / "pw", "alice:secret\n")
    with pytest.raises(ConfigError, match=r"plain-text passwords are not accepted: run "
                                          r"'edgebroker passwd -U .*pw' to hash them"):
        pw.PasswordFile.load(path)


@pytest.mark.parametrize("mode, ok, word", [
    (0o600, True, ""), (0o640, True, ""), (0o400, True, ""),
    (0o644, False, "read"), (0o604, False, "read"), (0o660, False, "change"),
    (0o666, False, "change"), (0o602, False, "change"),
])
def test_file_permissions(tmp_path, mode, ok, word):
    path = write(tmp_path / "pw", f"alice:{pw.hash_password('a')}\n", mode)
    if ok:
        assert len(pw.PasswordFile.load(path)) == 1
        return
    with pytest.raises(ConfigError) as info:
        pw.PasswordFile.load(path)
    message = str(info.value)
    assert f"let other users {word} it" in message and f"chmod 600 {path}" in message, message


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        pw.PasswordFile.load(str(tmp_path / "nope"))


def test_write_atomic_mode_and_replace(tmp_path):
    path = tmp_path / "pw"
    path.write_text("old\n")
    os.chmod(path, 0o644)
    inode = path.stat().st_ino
    pw.write_atomic(str(path), ["a:1", "# b"])
    assert path.read_text() == "a:1\n# b\n"
    assert path.stat().st_mode & 0o777 == 0o640        # others' bits cleared, group read kept
    assert path.stat().st_ino != inode, "not replaced by rename"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pw"], "temporary file left behind"
