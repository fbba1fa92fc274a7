"""The pieces every configuration section is built from: a setting (a record field with its
check and its one-line meaning, edgebroker.config) and the checks settings share."""

from __future__ import annotations

from edgebroker.records import field

MiB = 1024 * 1024


def at_least(minimum):
    def check(value):
        if value < minimum:
            return f"must be at least {minimum}"
        return None
    return check


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


def url_path(value):
    if (not value.startswith("/") or "?" in value or "#" in value
            or any(not "!" <= ch <= "~" for ch in value)):
        return "must be a URL path such as \"/mqtt\" (a leading /, printable ASCII, no ? or #)"
    return None
