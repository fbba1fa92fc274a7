"""The server's side of SCRAM-SHA-256 (edgebroker/security/scram.py) without a broker: RFC 7677's
worked example, SASLprep (RFC 4013's examples), the stored form, and each way an exchange fails."""

from __future__ import annotations

import base64

import pytest

from edgebroker.security import scram

# RFC 7677 section 3: user "user", password "pencil".
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_exchange(users=None) -> scram.Exchange:
    users = {"user": scram.derive("pencil", RFC_SALT, 4096)} if users is None else users
    return scram.Exchange(lambda name: users.get(name, "unknown user"), b"k" * 32,
                          make_nonce=lambda: RFC_SERVER_NONCE)


def test_rfc_7677_example():
    ex = rfc_exchange()
    assert ex.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert ex.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert ex.username == "user" and ex.client_key is not None


def test_wrong_password_fails_at_the_proof():
    ex = rfc_exchange({"user": scram.derive("pencils", RFC_SALT, 4096)})
    assert ex.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    with pytest.raises(scram.Failure) as info:
        ex.final(RFC_CLIENT_FINAL)
    assert info.value.credentials and "wrong password" in str(info.value)
    assert ex.client_key is None


def test_unknown_user_gets_a_steady_salt_and_fails_at_the_proof():
    answers = []
    for _ in range(2):
        ex = rfc_exchange({})
        answers.append(ex.first(RFC_CLIENT_FIRST))
    assert answers[0] == answers[1]             # the same salt each time: nothing to compare
    assert b",i=4096" in answers[0] and b"s=W22Z" not in answers[0]
    with pytest.raises(scram.Failure) as info:
        ex.final(RFC_CLIENT_FINAL)
    assert info.value.credentials and str(info.value) == "unknown user"


def test_user_name_escapes():
    seen = []
    ex = scram.Exchange(lambda name: seen.append(name) or "unknown user", b"k" * 32)
    ex.first(b"n,,n=a=2Cb=3Dc,r=abc")
    assert seen == ["a,b=c"]


@pytest.mark.parametrize("written, name", [
    ("=3D2C", "=2C"),               # an escaped '=' followed by "2C" is not a ','
    ("=3D3D", "=3D"),
    ("=2C3D", ",3D"),
    ("=2C=3D=2C", ",=,"),
    ("=3D=3D", "=="),
    ("=2C", ","),
    ("a=2C", "a,"),
    ("=2Cb", ",b"),
    ("2C3D", "2C3D"),               # no '=': nothing to undo
    ("é=2C€", "é,€"),
    ("=2C" * 21_800, "," * 21_800),
])
def test_user_name_escapes_undone_once_each(written, name):
    assert scram._saslname(written, "client-first-message") == name


@pytest.mark.parametrize("written", ["=", "a=", "=2", "=2c", "=3d", "=2D", "==2C", "=2C=",
                                     "=3D=", "a=3Db=", "=20"])
def test_user_name_with_another_equals_sequence_is_refused(written):
    with pytest.raises(scram.Failure, match="must be =2C or =3D"):
        scram._saslname(written, "client-first-message")


@pytest.mark.parametrize("first, words", [
    (b"p=tls-server-end-point,,n=user,r=abc", "channel binding is not supported"),
    (b"n,a=other,n=user,r=abc", "authorization identity 'other' differs"),
    (b"n,,m=ext,n=user,r=abc", "mandatory extension"),
    (b"n,,n=us=er,r=abc", "=2C or =3D"),
    (b"n,,r=abc,n=user", "expected n=USER,r=NONCE"),
    (b"n,,n=user,r=a\x01c", "printable"),
    (b"n,,n=user", "expected n=USER,r=NONCE"),
    (b"x,,n=user,r=abc", "gs2 flag"),
    (b"n=user,r=abc", "no gs2 header"),
    (b"", "Authentication Data is missing"),
    (None, "Authentication Data is missing"),
    (b"n,,n=\xff,r=abc", "not UTF-8"),
])
def test_client_first_refused(first, words):
    with pytest.raises(scram.Failure) as info:
        rfc_exchange().first(first)
    assert words in str(info.value)
    assert not info.value.credentials


def test_authzid_naming_the_user_itself_and_y_flag_are_accepted():
    ex = rfc_exchange()
    reply = ex.first(b"y,a=user,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert reply == RFC_SERVER_FIRST


@pytest.mark.parametrize("final, words", [
    (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0", "no proof"),
    (b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "does not repeat the gs2 header"),
    (b"c=biws,r=rOprNGfwEbeRWgbNEkqO-other,"
     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "nonce"),
    (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=!!!", "bad base64"),
    (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "expected c=...,r=...,p=..."),
])
def test_client_final_refused(final, words):
    ex = rfc_exchange()
    ex.first(RFC_CLIENT_FIRST)
    with pytest.raises(scram.Failure) as info:
        ex.final(final)
    assert words in str(info.value)
    assert not info.value.credentials


def test_a_short_proof_is_a_wrong_password():
    ex = rfc_exchange()
    ex.first(RFC_CLIENT_FIRST)
    with pytest.raises(scram.Failure) as info:
        ex.final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA")
    assert info.value.credentials


def test_messages_out_of_sequence():
    ex = rfc_exchange()
    with pytest.raises(scram.Failure, match="out of sequence"):
        ex.final(RFC_CLIENT_FINAL)
    ex = rfc_exchange()
    ex.first(RFC_CLIENT_FIRST)
    with pytest.raises(scram.Failure, match="sent twice"):
        ex.first(RFC_CLIENT_FIRST)


def test_stored_form_round_trips():
    keys = scram.derive("pencil", RFC_SALT, 4096)
    text = scram.format_keys(keys)
    assert text.startswith("$scram-sha-256$v=1$i=4096$W22ZaJ0SNY7soEsUEjb6gQ==$")
    assert ":" not in text
    assert scram.parse_keys(text) == keys
    assert scram.derive("pencil", iterations=10_000).iterations == 10_000


@pytest.mark.parametrize("text, words", [
    ("$scram-sha-256$v=2$i=4096$AA==$" + "A" * 43 + "=$" + "A" * 43 + "=", "expected"),
    ("$scram-sha-256$v=1$i=100$AA==$" + "A" * 43 + "=$" + "A" * 43 + "=", "iterations"),
    ("$scram-sha-256$v=1$i=4096$AA==$AAAA$" + "A" * 43 + "=", "32 bytes"),
    ("$scram-sha-256$v=1$i=4096$A$" + "A" * 43 + "=$" + "A" * 43 + "=", "bad base64"),
    ("$scram-sha-1$v=1$i=4096$AA==$" + "A" * 43 + "=$" + "A" * 43 + "=", "expected"),
])
def test_stored_form_errors(text, words):
    with pytest.raises(scram.FormatError) as info:
        scram.parse_keys(text)
    assert words in str(info.value)


@pytest.mark.parametrize("given, prepared", [
    ("I\u00adX", "IX"),          # RFC 4013 section 3: soft hyphen mapped to nothing
    ("user", "user"),
    ("USER", "USER"),
    ("\u00aa", "a"),             # NFKC
    ("\u2168", "IX"),
    ("a\u00a0b", "a b"),         # non-ASCII space mapped to space
])
def test_saslprep(given, prepared):
    assert scram.saslprep(given) == prepared


@pytest.mark.parametrize("given", ["\u0007", "\u0627\u0031"])
def test_saslprep_refuses(given):
    with pytest.raises(ValueError):
        scram.saslprep(given)


def test_a_password_saslprep_refuses_is_used_as_it_is():
    assert scram.prepare_password("\u0007bell") == "\u0007bell".encode()
    assert scram.prepare_password("I\u00adX") == b"IX"
