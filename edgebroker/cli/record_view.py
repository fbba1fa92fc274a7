"""How ``edgebroker inspect tail`` shows a record: one line of text, or one JSON object; and
times in UTC (``fmt_time``), as every ``inspect`` command shows them."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone


def fmt_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


# What json.dumps leaves as it is but a terminal acts on: DEL, the C1 controls (U+009B is
# the CSI of escape sequences, U+0085 a new line) and the line and paragraph separators.
_RAW_CONTROLS = re.compile("[\x7f-\x9f\u2028\u2029]")


def _escape_controls(text: str) -> str:
    return _RAW_CONTROLS.sub(lambda m: "\\u%04x" % ord(m[0]), text)


def render_payload(payload: bytes, limit: int) -> str:
    """A payload as text: UTF-8 with every control character escaped as JSON would (\\n,
    \\u001b, also DEL, C1 and U+2028/U+2029), else ``0x`` and its bytes in hex."""
    try:
        text = payload.decode("utf-8")
        if not text.isprintable():
            text = _escape_controls(json.dumps(text, ensure_ascii=False)[1:-1])
    except UnicodeDecodeError:
        text = "0x" + payload.hex()
    if limit and len(text) > limit:
        text = text[:limit] + f"... ({len(payload)} bytes)"
    return text


def decoded_properties(raw: bytes) -> tuple[dict | None, str | None]:
    """(properties by identifier, None) of a record's stored properties (None, None without
    any), or (None, what is wrong) for bytes that do not decode."""
    from edgebroker.errors import ProtocolError
    from edgebroker.mqtt.properties import decode_body
    try:
        return decode_body(raw), None
    except ProtocolError as exc:
        return None, f"{len(raw)} bytes of properties do not decode: {exc}"


def properties_json(props: dict) -> dict:
    """Names (mqtt.properties.PROPERTIES) to values; binary data in base64; User Property a
    list of [name, value] pairs in order."""
    import base64
    from edgebroker.mqtt.properties import PROPERTIES
    out = {}
    for ident, value in props.items():
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        elif isinstance(value, list):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        out[PROPERTIES[ident][0]] = value
    return out


def properties_text(props: dict) -> str:
    """``{Content Type: text/plain, User Property: unit=C, Correlation Data: 0x0001}``."""
    from edgebroker.mqtt.properties import PROPERTIES
    parts = []
    for ident, value in props.items():
        name = PROPERTIES[ident][0]
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, tuple):
                v = f"{v[0]}={v[1]}"
            elif isinstance(v, bytes):
                v = "0x" + v.hex()
            parts.append(f"{name}: {v}")
    return "{" + ", ".join(parts) + "}"


def record_json(r) -> str:
    obj = {"offset": r.offset, "timestamp_ms": r.timestamp_ms, "time": fmt_time(r.timestamp_ms),
           "qos": r.qos, "retain": r.retain, "client_id": r.client_id.decode("utf-8", "replace"),
           "topic": r.topic.decode("utf-8", "replace")}
    if r.properties:
        props, error = decoded_properties(r.properties)
        if error is None:
            obj["properties"] = properties_json(props)
        else:
            obj["properties_error"] = error
    try:
        obj["payload"] = r.payload.decode("utf-8")
    except UnicodeDecodeError:
        import base64
        obj["payload_base64"] = base64.b64encode(r.payload).decode()
    # (escaped as text is: a reader splitting lines at U+0085 or U+2028 gets whole objects)
    return _escape_controls(json.dumps(obj, ensure_ascii=False))


def record_text(r, limit: int) -> str:
    props = ""
    if r.properties:
        decoded, error = decoded_properties(r.properties)
        props = properties_text(decoded) + " " if error is None else f"{{{error}}} "
    return (f"{r.offset} {fmt_time(r.timestamp_ms)} q{r.qos}{' r' if r.retain else ''} "
            f"{r.topic.decode('utf-8', 'replace')} [{r.client_id.decode('utf-8', 'replace')}] "
            f"{props}{render_payload(r.payload, limit)}")
