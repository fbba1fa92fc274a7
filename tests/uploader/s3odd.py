"""A small S3-like store on loopback for the s3 sink's tests of odd answers: ordinary single and
multipart puts with ``If-None-Match: *``, HEAD and abort; ``odd(handler, method, query)`` may
answer a request itself (returning True) to play a store that misbehaves."""

from __future__ import annotations

import itertools
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's signature)
        pass

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status: int, body: bytes = b"", headers=()) -> None:
        self.server.note(self.command, self.query, status)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _any(self):
        url = urlsplit(self.path)
        self.query = dict(parse_qsl(url.query, keep_blank_values=True))
        key = url.path
        store = self.server
        if store.odd is not None and store.odd(self, self.command, self.query):
            return
        exclusive = self.headers.get("If-None-Match") == "*"
        if self.command == "HEAD":
            if key not in store.objects:
                return self.reply(404)
            return self.reply(200, headers=[("Content-Length", str(len(store.objects[key])))])
        if self.command == "PUT" and "partNumber" in self.query:
            store.uploads[self.query["uploadId"]][int(self.query["partNumber"])] = self.body()
            return self.reply(200, headers=[("ETag", '"p%s"' % self.query["partNumber"])])
        if self.command == "PUT":
            data = self.body()
            if exclusive and key in store.objects:
                return self.reply(412, b"<Error><Code>PreconditionFailed</Code></Error>")
            store.objects[key] = data
            return self.reply(200, headers=[("ETag", '"x"')])
        if self.command == "POST" and "uploads" in self.query:
            self.body()
            uid = f"u{next(store.ids)}"
            store.uploads[uid] = {}
            return self.reply(200, b"<InitiateMultipartUploadResult><UploadId>%s</UploadId>"
                                   b"</InitiateMultipartUploadResult>" % uid.encode())
        if self.command == "POST" and "uploadId" in self.query:
            self.body()
            if exclusive and key in store.objects:
                return self.reply(412, b"<Error><Code>PreconditionFailed</Code></Error>")
            parts = store.uploads.pop(self.query["uploadId"])   # (no longer open, as in S3)
            store.objects[key] = b"".join(parts[n] for n in sorted(parts))
            return self.reply(200, b"<CompleteMultipartUploadResult/>")
        if self.command == "DELETE":
            store.uploads.pop(self.query.get("uploadId"), None)
            return self.reply(204)
        self.reply(400)

    do_HEAD = do_PUT = do_POST = do_DELETE = _any


class OddStore(ThreadingHTTPServer):
    """``objects``: path -> bytes; ``uploads``: the multipart uploads open, id -> {part number:
    bytes}; ``requests``: (method, sorted query names, status, time)."""
    daemon_threads = True

    def __init__(self, odd=None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.odd = odd
        self.objects: dict[str, bytes] = {}
        self.uploads: dict[str, dict[int, bytes]] = {}
        self.ids = itertools.count()
        self.requests: list[tuple[str, tuple[str, ...], int, float]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def note(self, method: str, query: dict, status: int) -> None:
        self.requests.append((method, tuple(sorted(query)), status, time.monotonic()))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
