"""The ``s3`` sink: batches stored in any S3-compatible object store (AWS S3, MinIO, Ceph RGW).

A small S3 client of its own on the standard library (``http.client``, ``hmac``, ``hashlib``),
signing every request with AWS Signature Version 4: the gateway needs five S3 calls (PutObject,
HeadObject and the three multipart calls) and no new dependency for them. boto3 with botocore
and s3transfer weigh 34 MB installed, minio-py with its dependencies 19 MB (16 MB of it
pycryptodome), against the 15 MB budget of the whole gateway binary (docs/upload.md).

A put is idempotent, as the uploader needs (sinks.py): the object is written with
``If-None-Match: *`` (the store refuses to replace an object) and a 412 answer is a success
when the object there has the same size and checksum (HEAD: ``x-amz-meta-ebb-sha256``, the
SHA-256 of the whole object that every put stores, else the ETag, which is the MD5 for a
single-part put); or when its ``x-amz-meta-ebb-records`` names the same records (offsets, raw
length and CRC32C: the same batch compressed by another zstd release). A store that does not know conditional puts either ignores the header (a retry
then rewrites the same bytes under the same name) or answers 501, after which puts go
unconditionally. Above ``multipart_bytes`` the object goes in parts of that size
(CreateMultipartUpload, UploadPart, CompleteMultipartUpload with ``If-None-Match: *``, whose
200 is a success only with a whole CompleteMultipartUploadResult in its body: s3answer.py); a
failed one is aborted when possible, and a HEAD first skips an object already there.

The connection is kept between requests and batches. A request on a kept-alive connection that
fails before any answer (the store closed it while idle) goes once more at once on a new one
(not a POST), before it counts as an error. The broker's stop cuts a request in flight short
(``interrupt``, s3link.py); a multipart upload so cut short is aborted all the same (one
DELETE, ABORT_SECONDS at most). An answer's body is read up to 64 KiB, and the answer must come
whole within a deadline (s3link.py): past either, a transient error.

Errors: no answer, a reset, a timeout, 5xx, 429 (and 503: after their Retry-After seconds if
longer than the back-off), a temporary redirect (302, 303, 307: not followed, the Location
logged) and the throttling codes are transient
(``TransientSinkError``; ``unreachable`` when no HTTP answer came, so the uploader may probe the
link and retry as soon as it is back; but not for a store that took the connection and let it
time out, closed or reset it: the link is up, a probe would succeed at once); every other 4xx but 412 (bad
credentials, no such bucket, access denied) is permanent (``PermanentSinkError``, the alarm),
and so is a store certificate that does not verify (another TLS failure is transient).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
import os
import socket
import ssl
from typing import Callable
from urllib.parse import quote, urlsplit

from edgebroker.client.tls import not_regular
from edgebroker.errors import ConfigError
from edgebroker.upload_config import url_path
from edgebroker.uploader.s3answer import Response, completed, remote, text_of
from edgebroker.uploader.s3link import IO_TIMEOUT, AnswerError, Link
from edgebroker.uploader.sinks import (
    OTHER_BYTES, PermanentSinkError, TransientSinkError, piece_size,
)
from edgebroker.uploader.throttle import Stopped

MiB = 1024 * 1024
PROBE_TIMEOUT = 2.0
CHUNK = 256 * 1024
# AWS may take minutes over a CompleteMultipartUpload of many parts, sending spaces meanwhile
COMPLETE_DEADLINE = 300.0
ABORT_SECONDS = 2.0   # the abort of an upload the broker's stop cut short: its connect, its answer
SHA_META = "x-amz-meta-ebb-sha256"
RECORDS_META = "x-amz-meta-ebb-records"   # first-last-raw length-raw CRC32C of the batch
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# Answers worth retrying as they are: overload, throttling, a request that took too long.
TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                             "InternalError", "ServiceUnavailable", "RequestLimitExceeded",
                             "TooManyRequests", "OperationAborted"})

# A request on a kept-alive connection that fails so, before any answer, found the connection
# closed by the store while it was idle (stores and proxies close idle ones after 20 s to a few
# minutes): sent once more at once on a new connection when it may be (not a POST: completing
# a multipart upload twice is an error).
STALE_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                ConnectionAbortedError, ssl.SSLEOFError, ssl.SSLZeroReturnError)
IDEMPOTENT = frozenset({"PUT", "HEAD", "GET", "DELETE"})


class S3Unreachable(TransientSinkError):
    """No HTTP answer (refused, reset, timed out, name not resolved): the link is down."""
    unreachable = True


def credentials(config, environ=os.environ) -> tuple[str, str, str]:
    """(access key id, secret, session token) from ``[upload]``, else the AWS variables."""
    if config.access_key_id or config.secret_access_key:
        if not (config.access_key_id and config.secret_access_key):
            empty, given = (("secret_access_key", "access_key_id") if config.access_key_id
                            else ("access_key_id", "secret_access_key"))
            raise ConfigError(f"upload.{empty}: empty while upload.{given} is set: "
                              f"access_key_id and secret_access_key go together")
        return config.access_key_id, config.secret_access_key, config.session_token
    key, secret = environ.get("AWS_ACCESS_KEY_ID", ""), environ.get("AWS_SECRET_ACCESS_KEY", "")
    if not (key and secret):
        raise ConfigError("upload.url is s3:// but no credentials were given: set "
                          "upload.access_key_id and upload.secret_access_key, or "
                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment")
    return key, secret, environ.get("AWS_SESSION_TOKEN", "")


def tls_context(config, environ=os.environ) -> ssl.SSLContext | None:
    """The context the store's certificate is checked with (None over http): ``ca_file``, else
    $AWS_CA_BUNDLE, else the system's CA certificates; ConfigError naming upload.ca_file."""
    if config.endpoint_url and urlsplit(config.endpoint_url).scheme != "https":
        return None
    cafile = config.ca_file or environ.get("AWS_CA_BUNDLE") or None
    if cafile and not_regular(cafile):    # (never opened: a FIFO would block the loop thread)
        where = "upload.ca_file" if config.ca_file else "$AWS_CA_BUNDLE"
        raise ConfigError(f"{where}: {cafile}: not a regular file")
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"upload.ca_file: cannot read the CA certificates {cafile}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None


def config_problems(config, environ=os.environ) -> list[str]:
    """What S3Sink(config) would refuse: the credentials, the CA file; all of it at once."""
    problems = []
    for check in (credentials, tls_context):
        try:
            check(config, environ)
        except ConfigError as exc:
            problems += exc.problems
    return problems


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sign_v4(method: str, host: str, path: str, query: dict[str, str], headers: dict[str, str],
            payload_sha256: str, region: str, key_id: str, secret: str, token: str,
            now: datetime.datetime, service: str = "s3") -> dict[str, str]:
    """The headers to send: ``headers`` plus host, x-amz-date, x-amz-content-sha256, the session
    token if any, and Authorization (AWS Signature Version 4, header form). ``path`` is already
    URI-encoded, as sent."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    out = {**headers, "host": host, "x-amz-date": amz_date,
           "x-amz-content-sha256": payload_sha256}
    if token:
        out["x-amz-security-token"] = token
    canon = {k.lower(): " ".join(str(v).strip().split()) for k, v in out.items()}
    names = sorted(canon)
    canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                               for k, v in sorted(query.items()))
    canonical = "\n".join([method, path, canonical_query,
                           "".join(f"{n}:{canon[n]}\n" for n in names), ";".join(names),
                           payload_sha256])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, _sha256(canonical.encode())])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret).encode(), day), region), service),
                "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, "
                            f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return out


class S3Sink:
    def __init__(self, url: str, config, environ=os.environ):
        self.bucket = urlsplit(url).netloc
        self.prefix = url_path(url).strip("/")   # %XX decoded, as the dir sink's folder
        self.region = (config.region or environ.get("AWS_REGION")
                       or environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        self.key_id, self.secret, self.token = credentials(config, environ)
        self.multipart_bytes = config.multipart_bytes
        if config.endpoint_url:
            ep = urlsplit(config.endpoint_url)
            self.https = ep.scheme == "https"
            self.host = ep.netloc
            self.base = ep.path.rstrip("/") + "/" + self.bucket   # path style
        elif "." in self.bucket:   # AWS, path style: a dotted name breaks the wildcard certificate
            self.https = True
            self.host = f"s3.{self.region}.amazonaws.com"
            self.base = "/" + self.bucket
        else:   # AWS: virtual-hosted style
            self.https = True
            self.host = f"{self.bucket}.s3.{self.region}.amazonaws.com"
            self.base = ""
        self.address = (ep.hostname if config.endpoint_url else self.host,
                        (ep.port if config.endpoint_url else None) or (443 if self.https else 80))
        self.name = f"s3://{self.bucket}/{self.prefix}" + (
            f" at {config.endpoint_url}" if config.endpoint_url else f" ({self.region})")
        self.conditional = True
        self._records = ""
        self.link = Link(self.address, tls_context(config, environ) if self.https else None)

    # -- the uploader's side ---------------------------------------------------------------------
    def put(self, key: str, path: str, size: int, throttle: Callable[[int], None],
            records_id: str = "") -> None:
        name = self.object_name(key)
        sha, md5 = _digests(path, size)
        self._records = records_id
        if size > self.multipart_bytes:
            if self._same(name, size, sha, None):
                return
            self._multipart(name, path, size, sha, throttle)
        else:
            self._single(name, path, size, sha, md5, throttle)

    def object_name(self, key: str) -> str:
        """The object's name in the bucket, as the log lines give it: the prefix, then ``key``."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def reachable(self) -> bool:
        """True when a TCP connection to the store opens (a cheap test that the link is back)."""
        try:
            socket.create_connection(self.address, timeout=PROBE_TIMEOUT).close()
            return True
        except OSError:
            return False

    def interrupt(self) -> None:
        """The broker stops (any thread): the request in flight ends now, no other begins."""
        self.link.interrupt()

    def close(self) -> None:
        self.link.close()

    # -- puts ------------------------------------------------------------------------------------
    def _single(self, name, path, size, sha, md5, throttle) -> None:
        headers = {"Content-Length": str(size), "Content-MD5": base64.b64encode(md5).decode(),
                   "Content-Type": "application/zstd", **self._meta(sha)}
        if self.conditional:
            headers["If-None-Match"] = "*"
        r = self._request("PUT", name, {}, headers, sha, body=(path, 0, size), throttle=throttle)
        if r.status == 200:
            return
        if r.status == 501 and self.conditional:
            self.conditional = False    # the store does not take If-None-Match on a put
            return self._single(name, path, size, sha, md5, throttle)
        if r.status == 412:
            if self._same(name, size, sha, md5.hex()):
                return
            raise PermanentSinkError(f"{self.name}: {name} {OTHER_BYTES}")
        raise self._error("PUT", name, r)

    def _multipart(self, name, path, size, sha, throttle) -> None:
        r = self._request("POST", name, {"uploads": ""},
                          {"Content-Type": "application/zstd", **self._meta(sha)}, EMPTY_SHA256)
        if r.status != 200:
            raise self._error("CreateMultipartUpload", name, r)
        upload_id = text_of(r.body, "UploadId", f"{self.name}: CreateMultipartUpload {name}")
        try:
            etags = []
            part_size = self.multipart_bytes
            for number, offset in enumerate(range(0, size, part_size), 1):
                length = min(part_size, size - offset)
                psha, pmd5 = _digests(path, length, offset)
                r = self._request("PUT", name, {"partNumber": str(number), "uploadId": upload_id},
                                  {"Content-Length": str(length),
                                   "Content-MD5": base64.b64encode(pmd5).decode()},
                                  psha, body=(path, offset, length), throttle=throttle)
                if r.status != 200:
                    raise self._error(f"UploadPart {number}", name, r)
                etags.append(r.headers.get("etag", ""))
            body = ("<CompleteMultipartUpload>" + "".join(
                f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>"
                for n, e in enumerate(etags, 1)) + "</CompleteMultipartUpload>").encode()
            for _ in range(2):
                headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
                if self.conditional:
                    headers["If-None-Match"] = "*"
                r = self._request("POST", name, {"uploadId": upload_id}, headers,
                                  _sha256(body), data=body, deadline=COMPLETE_DEADLINE)
                if not (r.status == 501 and self.conditional):
                    break
                self.conditional = False   # the store does not take If-None-Match: without it
            # the 200 comes first: the result or an error comes in the body (or it is cut short)
            what = f"{self.name}: CompleteMultipartUpload {name}"
            if r.status == 200 and completed(r.body, what):
                return
            if r.status == 412:
                self._abort(name, upload_id)
                if self._same(name, size, sha, None):
                    return
                raise PermanentSinkError(f"{self.name}: {name} {OTHER_BYTES}")
            raise self._error("CompleteMultipartUpload", name, r)
        except BaseException:
            self._abort(name, upload_id)
            raise

    def _abort(self, name: str, upload_id: str) -> None:
        """Best effort: a multipart upload left behind is removed by the bucket's lifecycle rule
        (docs/upload.md). After the broker's stop cut the upload short, one DELETE goes all the
        same, with ABORT_SECONDS for its connect and its answer (well inside the stop's bound)."""
        if self.link.stopping:
            self.link.spare(ABORT_SECONDS)
        try:
            self._request("DELETE", name, {"uploadId": upload_id}, {}, EMPTY_SHA256)
        except Exception:
            pass

    def _meta(self, sha: str) -> dict[str, str]:
        return {SHA_META: sha, **({RECORDS_META: self._records} if self._records else {})}

    def _same(self, name: str, size: int, sha: str, md5_hex: str | None) -> bool:
        """True when ``name`` exists with this size and checksum (ours in the metadata, else
        the single-part ETag), or holds the same records by its metadata."""
        r = self._request("HEAD", name, {}, {}, EMPTY_SHA256)
        if r.status == 404:
            return False
        if r.status == 403:
            raise PermanentSinkError(
                f"{self.name}: HEAD {name}: 403 {r.code() or 'Forbidden'}: the key may not read "
                f"objects, so a batch sent again (after a crash, or a reply lost) cannot be "
                f"recognised as the one already stored: grant s3:GetObject on the prefix as well "
                f"as s3:PutObject (docs/upload.md)")
        if r.status != 200:
            raise self._error("HEAD", name, r)
        if self._records and r.headers.get(RECORDS_META) == self._records:
            return True   # the same records (perhaps compressed by another zstd release)
        length = r.headers.get("content-length", "-1")
        if not _whole(length):
            raise TransientSinkError(f"{self.name}: HEAD {name}: the store's answer has a "
                                     f"Content-Length that is not a number: {length[:40]!r}")
        if int(length) != size:
            return False
        theirs = r.headers.get(SHA_META)
        if theirs is not None:
            return theirs == sha
        return md5_hex is not None and r.headers.get("etag", "").strip('"') == md5_hex

    def _error(self, what: str, name: str, r: Response):
        code = r.code()
        detail = f"{r.status} {code or http.client.responses.get(r.status, '')}".strip()
        if r.status == 200:     # a CompleteMultipartUpload that failed after its 200: retried
            detail = f"200, then the error {code or '(no code)'} in its body"
        text = f"{self.name}: {what} {name}: {detail}" + (f" ({m})" if (m := r.message()) else "")
        if 300 <= r.status < 400:   # the signed request is not sent elsewhere
            text += (f", redirected to {remote(r.headers.get('location') or '(no Location)')}"
                     f": not followed (check upload.endpoint_url and upload.region)")
        if (r.status >= 500 or r.status in (200, 408, 429) or code in TRANSIENT_CODES
                or r.status in (302, 303, 307)):   # (301 and 308: the store moved for good)
            exc = TransientSinkError(text)
            if r.status in (429, 503):
                exc.retry_after = _seconds(r.headers.get("retry-after", ""))
            return exc
        return PermanentSinkError(text)

    # -- HTTP ------------------------------------------------------------------------------------
    def _request(self, method: str, name: str, query: dict[str, str], headers: dict[str, str],
                 payload_sha256: str, body: tuple[str, int, int] | None = None,
                 data: bytes = b"", throttle: Callable[[int], None] | None = None,
                 deadline: float | None = None) -> Response:
        path = quote(f"{self.base}/{name}", safe="/-_.~")
        if not self.base and not path.startswith("/"):
            path = "/" + path
        signed = sign_v4(method, self.host, path, query, headers, payload_sha256, self.region,
                         self.key_id, self.secret, self.token,
                         datetime.datetime.now(datetime.timezone.utc))
        target = path + ("?" + "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                                        if v else quote(k, safe='-_.~')
                                        for k, v in sorted(query.items())) if query else "")
        for attempt in range(2):
            reused = self.link.conn is not None
            self.link.expired = False
            try:
                return self._exchange(method, target, signed, body, data, throttle, deadline)
            except (OSError, http.client.HTTPException) as exc:
                opened = self.link.opened()
                self.close()
                if (attempt == 0 and reused and method in IDEMPOTENT and not self.link.expired
                        and isinstance(exc, STALE_ERRORS)):
                    continue   # a kept-alive connection the store had closed: a new one, at once
                raise self._failure(method, name, exc, opened,
                                    deadline or self.link.answer_deadline) from None
            except BaseException as exc:   # the throttle's Stopped, Ctrl-C: cut off mid-way
                if isinstance(exc, Stopped):
                    self.link.interrupt()   # as the broker's stop does (it may come after)
                self.close()
                raise
        raise AssertionError("unreachable")

    def _failure(self, method: str, name: str, exc: BaseException, opened: bool,
                 deadline: float) -> Exception:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return PermanentSinkError(f"{self.name}: {method} {name}: the store's certificate "
                                      f"is not trusted ({exc.verify_message}; see "
                                      f"upload.ca_file)")
        if isinstance(exc, ssl.SSLError):
            return TransientSinkError(f"{self.name}: {method} {name}: TLS with {self.host} "
                                      f"failed: {exc}")
        if isinstance(exc, AnswerError) or self.link.expired:
            # an answer too long, or not whole in time: the link is up (not "unreachable")
            return TransientSinkError(f"{self.name}: {method} {name}: the store's answer "
                                      + (str(exc) if isinstance(exc, AnswerError) else
                                         f"did not come whole within {deadline:g} s"))
        if opened and isinstance(exc, (TimeoutError, ConnectionError, http.client.HTTPException)):
            # the store took the connection, then let it time out, closed or reset it (the link
            # is up: a probe would succeed at once), so the uploader backs off in full
            how = (f"did not answer within {self.link.timeout:g} s" if isinstance(
                exc, TimeoutError) else f"closed it without an answer ({_describe(exc)})")
            return TransientSinkError(f"{self.name}: {method} {name}: no answer from "
                                      f"{self.host}: it took the connection but {how}")
        return S3Unreachable(f"{self.name}: {method} {name}: no answer from {self.host}: "
                             f"{_describe(exc, self.link.timeout)}")

    def _exchange(self, method, target, signed, body, data, throttle, deadline) -> Response:
        conn = self.link.connection()
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for k, v in signed.items():
            conn.putheader(k, v)
        if body is None and data == b"" and method in ("POST", "PUT"):
            conn.putheader("Content-Length", "0")
        conn.endheaders()
        try:
            if body is not None:
                self._send_file(conn, *body, throttle)
            elif data:
                conn.send(data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the store may have answered early (403, 400) and closed: read it below
        return Response(*self.link.answer(conn, deadline))

    @staticmethod
    def _send_file(conn, path: str, offset: int, length: int, throttle) -> None:
        with open(path, "rb") as fh:
            fh.seek(offset)
            left = length
            step = piece_size(throttle)
            while left:
                chunk = fh.read(min(step, left))
                if not chunk:
                    raise OSError(f"{path} ends before {offset + length} bytes")
                if throttle is not None:
                    throttle(len(chunk))
                conn.send(chunk)
                left -= len(chunk)


def _digests(path: str, length: int, offset: int = 0) -> tuple[str, bytes]:
    """(SHA-256 hex, MD5 digest) of ``length`` bytes of ``path`` from ``offset``."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        fh.seek(offset)
        left = length
        while left:
            chunk = fh.read(min(CHUNK * 4, left))
            if not chunk:
                raise TransientSinkError(f"{path}: the batch file ends before {offset + length} "
                                         f"bytes")
            sha.update(chunk)
            md5.update(chunk)
            left -= len(chunk)
    return sha.hexdigest(), md5.digest()


def _seconds(retry_after: str) -> float:
    """A Retry-After header's seconds (0 when absent, or in its date form: not honoured)."""
    return float(retry_after) if _whole(retry_after) else 0.0


def _whole(text: str) -> bool:
    """``text`` is a whole number of ASCII digits (str.isdigit takes '²', int() does not)."""
    text = text.strip()
    return text.isascii() and text.isdigit()


def _describe(exc: BaseException, timeout: float = IO_TIMEOUT) -> str:
    if isinstance(exc, socket.timeout):
        return f"timed out after {timeout:g} s"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


__all__ = ["S3Sink", "S3Unreachable", "sign_v4", "credentials", "SHA_META", "RECORDS_META"]
