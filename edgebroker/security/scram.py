"""SCRAM-SHA-256 (RFC 5802, RFC 7677), the server's side, with no I/O: messages in, messages out.

A client proves it knows a password without sending it. The server keeps, per user, a salt,
an iteration count and two keys derived from the password (``Keys``): StoredKey checks the
client's proof, ServerKey signs the server's answer so the client knows the server holds the
keys too. ``derive`` computes them (``edgebroker passwd``); ``format_keys`` and ``parse_keys``
are their form in the password file (docs/security.md, "SCRAM-SHA-256").

One ``Exchange`` is one authentication::

    server_first = exchange.first(client_first)    # client-first-message -> server-first
    server_final = exchange.final(client_final)    # client-final-message -> server-final

Either raises ``Failure`` (``credentials``: a wrong proof, an unknown user or one without
keys, as opposed to a message the server cannot accept). An unknown user, or one without
keys, gets a salt made from the user name and a secret kept in the state directory (the
same across restarts, as a real user's salt is), so the server's first answer does not tell
which names exist; its exchange fails at the proof, like a wrong
password. Proofs are compared in constant time; nonces come from ``secrets``.

What the server accepts (the choices RFC 5802 leaves):

- gs2 header ``n,,`` or ``y,,`` (no channel binding); ``p=...`` asks for channel binding,
  which is not offered (that would be SCRAM-SHA-256-PLUS): refused.
- an authorization identity ``a=`` only when it names the user itself.
- a mandatory extension (``m=``) is refused, as the RFC requires; other extensions ignored.
- the user name is compared as given, byte for byte (as for a password login); passwords are
  prepared with SASLprep (RFC 4013) when the keys are derived, and used as they are when
  SASLprep refuses them (as PostgreSQL does).
"""

from __future__ import annotations

import binascii
import os
from collections import namedtuple
from collections.abc import Callable

from edgebroker.errors import shown

# hashlib, hmac and secrets load OpenSSL, stringprep the Unicode tables: each is imported
# where it is used, so a broker without a password file does without them (docs/deploy.md).
# Base64 through binascii and Keys a collections.namedtuple: the base64 and typing modules
# would stay loaded in every broker for these few lines (idle memory, docs/deploy.md).

METHOD = "SCRAM-SHA-256"
PREFIX = "$scram-sha-256$"
VERSION = 1
DEFAULT_ITERATIONS = 4096   # RFC 7677's minimum
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 10_000_000
SALT_BYTES = 16
KEY_BYTES = 32              # SHA-256
NONCE_BYTES = 18            # 24 characters of base64
# Characters of a name the client sent (a=, n=) shown in a failure's text: as the
# authenticator's NAME_SHOWN (not imported: security.authenticator loads security.passwords,
# which loads this module).
NAME_SHOWN = 100


class FormatError(ValueError):
    """A stored SCRAM key field is not in the format this module writes."""


class Failure(Exception):
    """The exchange fails: ``credentials`` when the user or password is wrong (bad user name
    or password), False when the client's message cannot be accepted (not authorized)."""

    def __init__(self, why: str, credentials: bool = False):
        super().__init__(why)
        self.credentials = credentials


# A user's SCRAM keys: salt (bytes), iterations (int), stored_key and server_key (KEY_BYTES
# bytes each).
Keys = namedtuple("Keys", "salt iterations stored_key server_key")


def _hmac(key: bytes, msg: bytes) -> bytes:
    import hashlib
    import hmac
    return hmac.new(key, msg, hashlib.sha256).digest()


def derive(password: str | bytes, salt: bytes | None = None,
           iterations: int = DEFAULT_ITERATIONS) -> Keys:
    """The keys of ``password`` (RFC 5802 section 3), with a new random salt unless given."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS}")
    import hashlib
    if salt is None:
        salt = os.urandom(SALT_BYTES)
    salted = hashlib.pbkdf2_hmac("sha256", prepare_password(password), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return Keys(salt, iterations, hashlib.sha256(client_key).digest(),
                _hmac(salted, b"Server Key"))


def prepare_password(password: str | bytes) -> bytes:
    """The password's bytes as SCRAM hashes them: SASLprep'd, or as given if SASLprep
    refuses it (a prohibited or unassigned character)."""
    if isinstance(password, bytes):
        try:
            password = password.decode("utf-8")
        except UnicodeDecodeError:
            return password
    try:
        return saslprep(password).encode("utf-8")
    except ValueError:
        return password.encode("utf-8")


def saslprep(text: str) -> str:
    """SASLprep (RFC 4013) for a stored string: ValueError when ``text`` has a prohibited or
    unassigned character, or breaks the bidirectional rules."""
    import stringprep
    import unicodedata
    prohibited = (stringprep.in_table_c12, stringprep.in_table_c21, stringprep.in_table_c22,
                  stringprep.in_table_c3, stringprep.in_table_c4, stringprep.in_table_c5,
                  stringprep.in_table_c6, stringprep.in_table_c7, stringprep.in_table_c8,
                  stringprep.in_table_c9)
    mapped = "".join(" " if stringprep.in_table_c12(ch) else ch for ch in text
                     if not stringprep.in_table_b1(ch))
    # Normalized with the Unicode version stringprep's tables are from (3.2).
    text = unicodedata.ucd_3_2_0.normalize("NFKC", mapped)
    for ch in text:
        if any(table(ch) for table in prohibited):
            raise ValueError(f"prohibited character U+{ord(ch):04X}")
        if stringprep.in_table_a1(ch):
            raise ValueError(f"unassigned code point U+{ord(ch):04X}")
    if any(stringprep.in_table_d1(ch) for ch in text):
        if any(stringprep.in_table_d2(ch) for ch in text):
            raise ValueError("mixes right-to-left and left-to-right characters")
        if not (stringprep.in_table_d1(text[0]) and stringprep.in_table_d1(text[-1])):
            raise ValueError("right-to-left text must start and end with a right-to-left "
                             "character")
    return text


# --------------------------------------------------------------------------- the stored form

def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _b64decode(text) -> bytes:
    """Strict base64 (padding required, nothing but the alphabet): binascii.Error or
    ValueError otherwise."""
    return binascii.a2b_base64(text, strict_mode=True)


def _unb64(text: str, what: str) -> bytes:
    try:
        return _b64decode(text)
    except (binascii.Error, ValueError):
        raise FormatError(f"{what}: bad base64") from None


def format_keys(keys: Keys) -> str:
    """``$scram-sha-256$v=1$i=ITERATIONS$SALT$STOREDKEY$SERVERKEY`` (base64 with padding)."""
    return (f"{PREFIX}v={VERSION}$i={keys.iterations}${_b64(keys.salt)}"
            f"${_b64(keys.stored_key)}${_b64(keys.server_key)}")


def parse_keys(text: str) -> Keys:
    """The keys of a stored field (``format_keys``'s form). Raises FormatError."""
    parts = text.split("$")
    # ['', 'scram-sha-256', 'v=1', 'i=4096', SALT, STOREDKEY, SERVERKEY]
    if (len(parts) != 7 or parts[0] or f"${parts[1]}$" != PREFIX
            or parts[2] != f"v={VERSION}" or not parts[3].startswith("i=")):
        raise FormatError("SCRAM keys: expected $scram-sha-256$v=1$i=N$SALT$STOREDKEY$SERVERKEY")
    count = parts[3][2:]
    digits = count.lstrip("0") or "0"     # (int() refuses more than 4300 digits)
    if (not (count.isascii() and count.isdigit()) or len(digits) > 18
            or not MIN_ITERATIONS <= int(digits) <= MAX_ITERATIONS):
        raise FormatError(f"SCRAM keys: iterations must be {MIN_ITERATIONS} to "
                          f"{MAX_ITERATIONS}")
    salt = _unb64(parts[4], "SCRAM keys: salt")
    stored, server = _unb64(parts[5], "SCRAM keys: StoredKey"), _unb64(parts[6],
                                                                      "SCRAM keys: ServerKey")
    if not salt:
        raise FormatError("SCRAM keys: empty salt")
    if len(stored) != KEY_BYTES or len(server) != KEY_BYTES:
        raise FormatError(f"SCRAM keys: StoredKey and ServerKey must be {KEY_BYTES} bytes")
    return Keys(salt, int(digits), stored, server)


# --------------------------------------------------------------------------- the exchange

def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    """``a=value,b=value`` as (name, value) pairs (values may hold '=')."""
    out = []
    for part in message.split(","):
        name, sep, value = part.partition("=")
        if not sep or len(name) != 1 or not name.isalpha():
            raise Failure(f"malformed {what}: {part[:40]!r} is not an attribute=value pair")
        out.append((name, value))
    return out


def _saslname(value: str, what: str) -> str:
    """A user name as written in a message: '=2C' is ',' and '=3D' is '=' (RFC 5802 5.1).
    Any other '=' is refused. Each '=' starts at most one escape and escapes never overlap
    (their other characters are not '='), so counting them checks the name, and undoing the
    ',' escapes cannot make new '=3D' ones: a few passes of C code, whatever the name holds
    (undoing the escapes one by one, copying the rest each time, cost a 64 KB name of them
    ~45 ms of the loop)."""
    if not value:
        raise Failure(f"malformed {what}: empty user name")
    equals = value.count("=")
    if not equals:
        return value
    if equals != value.count("=2C") + value.count("=3D"):
        raise Failure(f"malformed {what}: '=' in the user name must be =2C or =3D")
    return value.replace("=2C", ",").replace("=3D", "=")


def _printable(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(ch) <= 0x7E and ch != "," for ch in nonce)


# A user's keys: Keys, or the reason there are none ("unknown user", "no SCRAM keys ...").
Lookup = Callable[[str], "Keys | str"]


class Exchange:
    """One SCRAM-SHA-256 authentication, server side (see the module doc)."""

    __slots__ = ("_lookup", "_secret", "_make_nonce", "username", "missing", "keys",
                 "client_key", "_header", "_first_bare", "_server_first", "_nonce", "_state",
                 "_decoy_iterations")

    def __init__(self, lookup: Lookup, secret: bytes,
                 make_nonce: Callable[[], str] | None = None,
                 decoy_iterations: int = DEFAULT_ITERATIONS):
        self._lookup = lookup
        self._secret = secret       # kept across restarts: makes the salts of unknown users
        # the iteration count told for a user without keys: the one most users have, so
        # that a made-up name does not stand out from real ones by it
        self._decoy_iterations = decoy_iterations
        self._make_nonce = make_nonce   # the server's part of the nonce (tests give their own)
        self.username: str | None = None
        self.missing: str | None = None   # why the user has no keys (then the proof fails)
        self.keys: Keys | None = None
        self.client_key: bytes | None = None   # set once a proof was right
        self._state = "first"

    def first(self, data: bytes | None) -> bytes:
        """The client-first-message in, the server-first-message out."""
        if self._state != "first":
            raise Failure("client-first-message sent twice")
        self._state = "final"
        text = self._text(data, "client-first-message")
        cbind, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2:
            raise Failure("malformed client-first-message: no gs2 header (expected 'n,,')")
        if cbind.startswith("p="):
            raise Failure("channel binding is not supported (SCRAM-SHA-256, not -PLUS); the "
                          "client asked for it with 'p='")
        if cbind not in ("n", "y"):
            raise Failure(f"malformed client-first-message: gs2 flag {cbind[:20]!r}")
        if authzid and not authzid.startswith("a="):
            raise Failure("malformed client-first-message: authorization identity")
        attrs = _attributes(bare, "client-first-message")
        if attrs[0][0] == "m":
            raise Failure("a mandatory extension (m=) is not supported")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise Failure("malformed client-first-message: expected n=USER,r=NONCE")
        username = self.username = _saslname(attrs[0][1], "client-first-message")
        if authzid and _saslname(authzid[2:], "client-first-message") != username:
            raise Failure(f"authorization identity {shown(authzid[2:], NAME_SHOWN)} differs "
                          f"from the user name {shown(username, NAME_SHOWN)} (acting as another "
                          f"user is not supported)")
        client_nonce = attrs[1][1]
        if not _printable(client_nonce):
            raise Failure("malformed client-first-message: the nonce must be printable "
                          "characters other than ','")
        found = self._lookup(username)
        if isinstance(found, Keys):
            self.keys = found
        else:
            self.missing = found
            self.keys = self._decoy(username)
        self._header = f"{cbind},{authzid},"
        self._first_bare = bare
        if self._make_nonce is None:
            import secrets
            self._nonce = client_nonce + secrets.token_urlsafe(NONCE_BYTES)
        else:
            self._nonce = client_nonce + self._make_nonce()
        self._server_first = (f"r={self._nonce},s={_b64(self.keys.salt)},"
                              f"i={self.keys.iterations}")
        return self._server_first.encode("ascii")

    def final(self, data: bytes | None) -> bytes:
        """The client-final-message in, the server-final-message (``v=`` signature) out."""
        if self._state != "final":
            raise Failure("client-final-message out of sequence")
        self._state = "done"
        text = self._text(data, "client-final-message")
        without_proof, sep, proof_attr = text.rpartition(",")
        if not sep or not proof_attr.startswith("p="):
            raise Failure("malformed client-final-message: no proof (p=) at the end")
        attrs = _attributes(without_proof, "client-final-message")
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise Failure("malformed client-final-message: expected c=...,r=...,p=...")
        try:
            binding = _b64decode(attrs[0][1])
            proof = _b64decode(proof_attr[2:])
        except (binascii.Error, ValueError):
            raise Failure("malformed client-final-message: bad base64") from None
        if binding != self._header.encode("utf-8"):
            raise Failure("the channel binding (c=) does not repeat the gs2 header")
        if attrs[1][1] != self._nonce:
            raise Failure("the nonce (r=) is not the one this exchange agreed")
        import hashlib
        import hmac
        keys = self.keys
        auth_message = ",".join((self._first_bare, self._server_first,
                                 without_proof)).encode("utf-8")
        signature = _hmac(keys.stored_key, auth_message)
        if len(proof) != KEY_BYTES:
            client_key = b"\0" * KEY_BYTES
        else:
            client_key = bytes(a ^ b for a, b in zip(proof, signature))
        right = hmac.compare_digest(hashlib.sha256(client_key).digest(), keys.stored_key)
        if self.missing is not None:
            raise Failure(self.missing, credentials=True)
        if not right:
            raise Failure("wrong password (SCRAM proof)", credentials=True)
        self.client_key = client_key
        return b"v=" + binascii.b2a_base64(_hmac(keys.server_key, auth_message), newline=False)

    @staticmethod
    def _text(data: bytes | None, what: str) -> str:
        if not data:
            raise Failure(f"no {what} (the Authentication Data is missing or empty)")
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise Failure(f"malformed {what}: not UTF-8") from None

    def _decoy(self, username: str) -> Keys:
        """Keys for a user without any: the same salt each time for one name (until the broker
        restarts), keys nobody can match."""
        salt = _hmac(self._secret, b"salt\0" + username.encode("utf-8"))[:SALT_BYTES]
        return Keys(salt, self._decoy_iterations, os.urandom(KEY_BYTES), os.urandom(KEY_BYTES))
