"""The pieces every configuration section is built from: a setting (a record field with its
check and its one-line meaning, edgebroker.config) and the checks settings share."""

from __future__ import annotations

import math

from edgebroker.errors import ConfigError
from edgebroker.records import field

MiB = 1024 * 1024
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
# A plain setting's type by its annotation, a string (``from __future__ import annotations``).
# "bool | None" style: None is the unset default, never a TOML value.
_TYPES = {"bool": bool, "int": int, "float": float, "str": str}
# "int | str": an integer, or a word its check knows (memory_limit = "auto").


# Settings whose values are secrets: an error about one names its key and type, not its value
# (a numeric PIN written without quotes went to the terminal and the broker's log).
SECRET_KEYS = frozenset(("password", "secret_access_key", "session_token"))


def _got(value, key: str) -> str:
    if key.rpartition(".")[2] in SECRET_KEYS:
        return f"{type(value).__name__} (the value is not shown: a secret)"
    return repr(value)


def coerce(value, annotation: str, key: str):
    """``value`` as the setting's type, or ConfigError naming ``key``. A TOML integer passes for
    a number; a boolean is never a number. Numbers must be finite (nan and inf pass no
    "at least" check, and would stop timers or overflow later) and integers must fit in 64
    bits (they go to C and to struct fields, and to float)."""
    if annotation == "int | str":
        if isinstance(value, str):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer or a string, got {_got(value, key)}")
        annotation = "int"
    kind = _TYPES[annotation.removesuffix(" | None")]
    whole = kind is float and isinstance(value, int)
    if isinstance(value, bool) != (kind is bool) or not (isinstance(value, kind) or whole):
        raise ConfigError(f"{key}: expected {_TYPE_NAMES[kind]}, got {_got(value, key)}")
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            digits = str(value)
            shown = digits if len(digits) <= 24 else f"{digits[:8]}... ({len(digits)} digits)"
            raise ConfigError(f"{key}: out of range, got {shown} (integers must fit in 64 bits: "
                              f"{INT64_MIN} to {INT64_MAX})")
        return float(value) if kind is float else value
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return value


def at_least(minimum):
    def check(value):
        if value < minimum:
            return f"must be at least {minimum}"
        return None
    return check


def off_or_at_least(minimum, zero: str = "off"):
    """0 (off: ``zero`` says what it means), or at least ``minimum`` (a period shorter would
    re-arm its timer without end, a rate smaller make its interval overflow)."""
    def check(value):
        if value != 0 and value < minimum:
            return f"must be 0 ({zero}) or at least {minimum}"
        return None
    return check


def size_or_auto(value):
    """A number of bytes (0: off), or "auto"."""
    if isinstance(value, str):
        return None if value == "auto" else 'must be a number of bytes or "auto"'
    return "must be at least 0" if value < 0 else None


def between(low, high):
    def check(value):
        if not low <= value <= high:
            return f"must be between {low} and {high}"
        return None
    return check


def one_of(*choices):
    def check(value):
        if value not in choices:
            return "must be one of " + ", ".join(repr(c) for c in choices)
        return None
    return check


def setting(default, check=None, doc=""):
    """A record field (edgebroker.records) carrying its validation and its one-line meaning."""
    return field(default=default, metadata={"check": check, "doc": doc})


def octal_mode(value):
    if not value or any(ch not in "01234567" for ch in value) or int(value, 8) > 0o777:
        return "must be octal permission digits such as \"0660\""
    return None


def file_path(value):
    """A path for the operating system: it ends at a NUL byte, so one inside is refused here
    (the calls given it would raise ValueError wherever the path is first used)."""
    if "\x00" in value:
        return "a path cannot contain U+0000 (NUL)"
    return None


def mqtt_text(value):
    """Text the broker sends as an MQTT UTF-8 string (an assigned client id's prefix): no
    U+0000 (MQTT-1.5.4-2), and none of the code points a receiver may refuse (1.5.4: the
    control characters U+0001..U+001F and U+007F..U+009F, and the non-characters); the
    broker itself refuses a client id holding one, so a client could not come back with it."""
    for ch in value:
        code = ord(ch)
        if code == 0:
            return "cannot contain U+0000 (MQTT-1.5.4-2)"
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return f"cannot contain U+{code:04X}, a control character (MQTT-1.5.4)"
        if 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE:
            return f"cannot contain U+{code:04X}, a non-character (MQTT-1.5.4)"
    return None


def url_path(value):
    if (not value.startswith("/") or "?" in value or "#" in value
            or any(not "!" <= ch <= "~" for ch in value)):
        return "must be a URL path such as \"/mqtt\" (a leading /, printable ASCII, no ? or #)"
    return None
