"""The ``[upload]`` section: where the log's batches go (edgebroker.uploader, docs/upload.md),
and the checks of its URL and gateway id, which the uploader uses too."""

from __future__ import annotations

from edgebroker.config_fields import MiB, at_least, between, file_path, setting
from edgebroker.records import record

_HEX = frozenset("0123456789abcdefABCDEF")


def check_upload_url(value):
    """Empty (no uploading) or a sink URL this edgebroker has. Its path is decoded as a URL's
    (``%20`` is a space, both sinks alike: ``url_path``); ``?`` and ``#`` would cut it short,
    so they are refused, and so is a ``%`` that is not ``%XX`` of UTF-8."""
    if not value:
        return None
    if "?" in value or "#" in value:
        return ("'?' and '#' may not appear (a URL would end its path there); write them as "
                "%3F and %23")
    try:
        url_path(value)
    except ValueError as exc:
        return str(exc)
    scheme, sep, rest = value.partition("://")
    if scheme == "s3" and sep:
        bucket = rest.partition("/")[0]
        if not (3 <= len(bucket) <= 63) or any(
                not (ch.islower() or ch.isdigit() or ch in ".-") or not ch.isascii()
                for ch in bucket):
            return ("expected s3://bucket/prefix with a bucket name of 3 to 63 lower-case "
                    "letters, digits, '.' and '-'")
        return None
    if scheme != "file" or not sep or not rest.startswith("/") or rest == "/":
        return "expected file:///path/to/landing (an absolute folder path, three slashes)"
    return None


def url_path(url: str) -> str:
    """The path of a sink URL with its %XX decoded (UTF-8); ValueError for a '%' that is not
    '%XX' or bytes that are not UTF-8."""
    from urllib.parse import unquote, urlsplit   # (imported here: see _check_endpoint_url)
    path = urlsplit(url).path
    i = path.find("%")
    while i >= 0:
        if not all(ch in _HEX for ch in path[i + 1:i + 3]) or len(path) < i + 3:
            raise ValueError(f"'%' at {path[i:i + 3]!r} is not %XX (two hex digits; a '%' "
                             f"itself is %25)")
        i = path.find("%", i + 3)
    try:
        decoded = unquote(path, errors="strict")
    except UnicodeDecodeError:
        raise ValueError("its %XX escapes are not UTF-8") from None
    if any(not ch.isprintable() for ch in decoded):
        raise ValueError("its path holds a control character (spaces are fine)")
    return decoded


def check_gateway_id(value):
    """None when ``value`` may name a gateway (in object names and batch headers), else what is
    wrong with it."""
    if not value:
        return "must not be empty"
    if (len(value) > 64 or value[0] in ".-"
            or any(not (ch.isascii() and (ch.isalnum() or ch in "._-")) for ch in value)):
        return ("must be 1 to 64 of the letters A-Z and a-z, digits, '.', '_' and '-', not "
                "starting with '.' or '-'")
    if value == HIVE_NULL_PARTITION:
        return ("is the name Spark and Hive give a null partition value (a folder "
                "gateway=__HIVE_DEFAULT_PARTITION__ reads back as no gateway): choose another")
    return None


# The one id of the characters allowed that a partition folder (gateway=<id>) cannot carry.
HIVE_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def _check_endpoint_url(value):
    """Everything the s3 sink would stumble on at its first request: the scheme, a host, a
    port that is a port (1 to 65535), no user, query or fragment."""
    if not value:
        return None
    expected = "expected http://host:port or https://host:port"
    bad_port = "the port must be a number from 1 to 65535"
    scheme, sep, rest = value.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or rest.startswith("/"):
        return expected
    # Imported here: urllib.parse brings ipaddress, which a broker without [upload] does not
    # load (tests/server/test_lazy_imports.py).
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:   # a port that is no number or past 65535, a broken [IPv6]
        return f"{expected}: " + (bad_port if "Port" in str(exc) else str(exc))
    if not parts.hostname:
        return f"{expected}: no host"
    if port == 0:
        return f"{expected}: {bad_port}"
    if "@" in parts.netloc or parts.query or parts.fragment or "?" in value or "#" in value:
        return f"{expected}, perhaps with a path: no user name, '?' or '#'"
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        return f"{expected}: no spaces or control characters"
    return None


@record(frozen=True)
class UploadConfig:
    url: str = setting(
        "", check_upload_url, doc="where batches of the log go: file:///path/to/landing or "
                                 "s3://bucket/prefix; empty: no uploading")
    gateway_id: str = setting(
        "", lambda v: check_gateway_id(v) if v else None, doc="this gateway's name in object names (empty: the machine id, else the host name)")
    batch_bytes: int = setting(
        8 * MiB, between(4096, 1024 * MiB), doc="a batch holds at most this many bytes of records")
    batch_max_age: float = setting(
        60.0, between(1, 86400), doc="a batch is cut at most this many seconds after its oldest record")
    upload_bandwidth: int = setting(
        0, at_least(0), doc="bytes per second the uploads may send on average; 0: unlimited")
    endpoint_url: str = setting(
        "", _check_endpoint_url, doc="s3: the store's address, http(s)://host:port (MinIO, Ceph); "
                                     "empty: AWS S3 in region")
    region: str = setting("", doc="s3: the region signed for (empty: $AWS_REGION, "
                                   "$AWS_DEFAULT_REGION, else us-east-1)")
    access_key_id: str = setting("", doc="s3: access key id (empty: $AWS_ACCESS_KEY_ID)")
    secret_access_key: str = setting(
        "", doc="s3: secret access key (empty: $AWS_SECRET_ACCESS_KEY)")
    session_token: str = setting("", doc="s3: session token of temporary credentials "
                                          "(empty: $AWS_SESSION_TOKEN when the keys come from "
                                          "the environment)")
    ca_file: str = setting(
        "", file_path,
        doc="s3 over https: PEM file of the CA certificates the store's certificate is "
            "checked against (empty: $AWS_CA_BUNDLE, else the system's)")
    multipart_bytes: int = setting(
        16 * MiB, between(5 * MiB, 5 * 1024 * MiB),
        doc="s3: a batch file larger than this goes as a multipart upload in parts of this size")
