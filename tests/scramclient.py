"""The client's side of SCRAM-SHA-256 for the tests, written from RFC 5802 and RFC 7677 with
hashlib and hmac alone: it imports nothing from ``edgebroker``, so a mistake in the broker's
SCRAM cannot hide behind the same mistake here.

``Scram(user, password)`` makes the client-first-message (``first()``), answers the
server-first-message (``final(server_first)``) and checks the server-final-message
(``verify(server_final)``). ``stored_keys(password, salt, iterations)`` gives what the server
must keep for a user (StoredKey, ServerKey), and ``keys_field`` the password file's field
as docs/security.md describes it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

METHOD = "SCRAM-SHA-256"


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    # Hi() of RFC 5802 is PBKDF2 with HMAC-SHA-256 and one block (ASCII passwords here, so
    # SASLprep leaves them as they are).
    return hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)


def stored_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) for ``password``."""
    salted = salted_password(password, salt, iterations)
    return (hashlib.sha256(_hmac(salted, b"Client Key")).digest(),
            _hmac(salted, b"Server Key"))


def keys_field(password: str, salt: bytes | None = None, iterations: int = 4096) -> str:
    """``$scram-sha-256$v=1$i=N$SALT$STOREDKEY$SERVERKEY`` (base64 with padding)."""
    salt = os.urandom(16) if salt is None else salt
    stored, server = stored_keys(password, salt, iterations)
    b64 = lambda b: base64.b64encode(b).decode()   # noqa: E731
    return f"$scram-sha-256$v=1$i={iterations}${b64(salt)}${b64(stored)}${b64(server)}"


def saslname(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


class Scram:
    def __init__(self, user: str, password: str, gs2: str = "n,,", nonce: str | None = None):
        self.user, self.password, self.gs2 = user, password, gs2
        # base64 has no ',' : a valid nonce.
        self.nonce = nonce or base64.b64encode(os.urandom(18)).decode()
        self.bare = f"n={saslname(user)},r={self.nonce}"
        self.server_signature = None
        self.salt = self.iterations = None

    def first(self) -> bytes:
        return (self.gs2 + self.bare).encode()

    def final(self, server_first: bytes, proof_password: str | None = None) -> bytes:
        """The client-final-message (``proof_password``: compute the proof from another
        password, as a client with a wrong one does)."""
        text = server_first.decode()
        attrs = dict(part.split("=", 1) for part in text.split(","))
        assert attrs["r"].startswith(self.nonce) and len(attrs["r"]) > len(self.nonce), text
        self.salt, self.iterations = base64.b64decode(attrs["s"]), int(attrs["i"])
        salted = salted_password(proof_password or self.password, self.salt, self.iterations)
        client_key = _hmac(salted, b"Client Key")
        binding = base64.b64encode(self.gs2.encode()).decode()
        without_proof = f"c={binding},r={attrs['r']}"
        auth_message = f"{self.bare},{text},{without_proof}".encode()
        signature = _hmac(hashlib.sha256(client_key).digest(), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self.server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        """Whether the server-final-message proves the server holds the user's keys."""
        return server_final == b"v=" + base64.b64encode(self.server_signature)
