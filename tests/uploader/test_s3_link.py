"""The s3 sink's connection to the store, against a small S3-like HTTP server on loopback that
notes how each request body arrives: with a low ``upload_bandwidth`` the body keeps flowing
(no long silence in the middle of a PUT, which a store ends with 400 RequestTimeout); a
kept-alive connection the store closed while idle is replaced at once, not counted as a
failure; a URL's %XX mean the same to both sinks."""

from __future__ import annotations

import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import mqttraw
from edgebroker.upload_config import UploadConfig
from edgebroker.uploader.configure import open_sink

from .test_uploader import uploaded, wait_until


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's signature)
        pass

    def do_HEAD(self):
        self.server.note(self.command, 0, 0.0, self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_PUT(self):
        left = int(self.headers.get("Content-Length", 0))
        last, longest = time.monotonic(), 0.0
        while left:
            data = self.rfile.read1(min(65536, left))
            if not data:
                return
            now = time.monotonic()
            longest, last = max(longest, now - last), now
            left -= len(data)
        size = int(self.headers["Content-Length"])
        self.server.note(self.command, size, longest, self.path)
        self.send_response(200)
        self.send_header("ETag", '"x"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        if self.server.close_after:
            self.close_connection = True   # without saying so: as an idle timeout does


class Store(ThreadingHTTPServer):
    """Answers HEAD 404 and PUT 200 (``close_after``: then closes the connection, as a store
    closes an idle one, without a ``Connection: close``); ``requests``: (method, body bytes,
    longest silence in the body in seconds); ``paths``: their targets."""
    daemon_threads = True

    def __init__(self, close_after: bool = False):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.close_after = close_after
        self.requests: list[tuple[str, int, float]] = []
        self.paths: list[str] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def note(self, method: str, size: int, silence: float, path: str) -> None:
        self.requests.append((method, size, silence))
        self.paths.append(path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def s3_upload(store: Store, **kw) -> dict:
    return {"url": "s3://landing/p", "endpoint_url": store.url, "access_key_id": "AK",
            "secret_access_key": "SK", "gateway_id": "gw-test", "batch_max_age": 1, **kw}


def test_a_low_bandwidth_cap_keeps_the_body_flowing(broker):
    """100 KB/s and one incompressible 300 KB batch: sent in 256 KiB pieces, the second waited
    1.6 s in the middle of the PUT (at 10 KB/s, 25 s: the store gives up); in pieces of a
    quarter of a second's worth, no silence reaches half a second."""
    store = Store()
    try:
        b = broker(upload=s3_upload(store, upload_bandwidth=100_000))
        c = b.client("pub")
        c.send(mqttraw.publish("t", random.Random(7).randbytes(300_000), qos=1, packet_id=1))
        c.expect(mqttraw.PUBACK, timeout=10)
        c.close()
        wait_until(lambda: uploaded(b) == 1, timeout=60, what="the batch uploaded")
        puts = [r for r in store.requests if r[0] == "PUT"]
        assert len(puts) == 1 and puts[0][1] > 300_000, store.requests
        assert puts[0][2] < 0.5, f"the body stalled {puts[0][2]:.2f} s"
        assert b.stats()["upload"]["retries"] == 0
    finally:
        store.close()


def test_a_connection_the_store_closed_while_idle_is_replaced_at_once(broker):
    """Three batches, the store closing the connection after each answer: each later batch's
    PUT found the kept-alive connection closed ("Remote end closed connection without
    response"), logged a warning and counted a retry; now it goes again at once on a new
    connection."""
    store = Store(close_after=True)
    try:
        b = broker(upload=s3_upload(store))
        for i in range(3):
            c = b.client(f"pub{i}")
            c.send(mqttraw.publish("t", b"m%d" % i, qos=1, packet_id=1))
            c.expect(mqttraw.PUBACK, timeout=10)
            c.close()
            wait_until(lambda: uploaded(b) == i + 1, what=f"batch {i}")
        fig = b.stats()["upload"]
        assert (fig["retries"], fig["last_error"]) == (0, ""), fig
        assert [r[0] for r in store.requests] == ["PUT"] * 3
        assert not [line for line in b.logs if "upload failed" in line]
    finally:
        store.close()


def test_both_sinks_decode_percent_escapes_of_the_url_alike(tmp_path):
    """file:// decoded %XX (a%20b: the folder 'a b') while s3:// kept it (the prefix 'a%20b',
    sent as a%2520b): both now take the URL's path decoded."""
    store = Store()
    try:
        batch = tmp_path / "batch"
        batch.write_bytes(b"x" * 10)
        key = "gateway=g/date=2023-11-14/0-9.ebb.zst"
        cfg = UploadConfig(url="s3://landing/a%20b/%C3%BC", endpoint_url=store.url,
                           access_key_id="AK", secret_access_key="SK")
        sink = open_sink(cfg)
        sink.put(key, str(batch), 10, lambda n: None)
        sink.close()
        assert store.paths == ["/landing/a%20b/%C3%BC/" + quote(key, safe="/")]
        (tmp_path / "land" / "a b" / "\u00fc").mkdir(parents=True)   # the landing folder
        open_sink(UploadConfig(url=f"file://{tmp_path}/land/a%20b/%C3%BC")).put(
            key, str(batch), 10, lambda n: None)
        assert (tmp_path / "land" / "a b" / "\u00fc" / key).read_bytes() == b"x" * 10
    finally:
        store.close()
