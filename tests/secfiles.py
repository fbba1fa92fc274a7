"""Helpers for the security tests: password and ACL files, $SYS security counters."""

from __future__ import annotations

import os
import time
from pathlib import Path

from edgebroker.security.passwords import hash_password

# Written by Debian's mosquitto_passwd 2.0.11 (`mosquitto_passwd -c -b FILE alice secret`).
MOSQUITTO_HASH = ("$7$101$JH+6Hli0CqyukLgm$5MJFOzylJBakHveFzrL4Wu33qGGjvOqnzFfeGHUEpQfEBL6eqoMpp80"
                  "EhhUUo6Mx4m8ZNbvZl7PEjyYd74SE2w==")
MOSQUITTO_PASSWORD = "secret"


def write_passwords(path: Path, users: dict[str, str], extra: tuple[str, ...] = (),
                    mode: int = 0o600) -> Path:
    """A password file with scrypt hashes of ``users`` (name -> password) plus ``extra`` lines."""
    lines = [f"{name}:{hash_password(password)}" for name, password in users.items()]
    path.write_text("\n".join(lines + list(extra)) + "\n")
    os.chmod(path, mode)
    return path


def write_acl(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


def wait_counter(broker, name: str, pred, port: int, timeout: float = 10.0, **client_kw) -> int:
    """Subscribe to ``$SYS/broker/security/NAME`` on ``port`` (a listener whose client may read
    $SYS) and return the first published value for which ``pred(value)`` holds."""
    c = broker.client(f"counter-{name.replace('/', '-')}-{time.monotonic_ns()}", port=port,
                      **client_kw)
    c.subscribe(f"$SYS/broker/security/{name}")
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"$SYS/broker/security/{name}: no wanted value; saw {seen}"
        value = int(c.recv_publish(timeout=remaining).payload)
        seen.append(value)
        if pred(value):
            c.disconnect()
            return value
