"""The s3 sink's connection to the store, against a small S3-like HTTP server on loopback that
notes how each request body arrives: with a low ``upload_bandwidth`` the body keeps flowing
(no long silence in the middle of a PUT, which a store ends with 400 RequestTimeout); a
kept-alive connection the store closed while idle is replaced at once, not counted as a
failure; a URL's %XX mean the same to both sinks. A store that takes connections and never
answers: the broker's stop cuts the put short, and its timeouts back off in full."""

from __future__ import annotations

import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest

import mqttraw
from edgebroker.upload_config import UploadConfig
from edgebroker.uploader.configure import open_sink
from edgebroker.uploader.sinks import TransientSinkError

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


class LoopbackServer:
    """A TCP server on loopback that hands each connection to ``serve(conn)`` in a thread of
    its own; ``close`` ends it and every connection."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return   # closed
            self.conns.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)   # ends the accept() (a close alone does not)
        self.server.close()
        for conn in self.conns:
            conn.close()


class Silent(LoopbackServer):
    """A store that takes every connection, reads what comes and never answers; ``got`` is set
    once the first request's head has come."""

    def __init__(self):
        self.got = threading.Event()
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        head = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            head += data[:4096]
            if b"\r\n\r\n" in head:
                self.got.set()


def test_the_stop_cuts_short_a_put_the_store_never_answers(broker):
    """The PUT waited 30 s for an answer and the stop did not cut it short: the broker's stop
    waited 10 s for the uploader ("did not stop within 10 s") and took more. Now the stop
    shuts the connection down and the broker exits at once; the batch stays for the next
    start."""
    silent = Silent()
    try:
        b = broker(upload=s3_upload(silent))
        c = b.client("pub")
        c.send(mqttraw.publish("t", b"m", qos=1, packet_id=1))
        c.expect(mqttraw.PUBACK, timeout=10)
        c.close()
        assert silent.got.wait(30), "no request reached the store"
        began = time.monotonic()
        assert b.stop(timeout=30) == 0
        took = time.monotonic() - began
        assert took < 5, f"the stop took {took:.1f} s"
        assert not [line for line in b.logs if "did not stop within" in line]
        assert [line for line in b.logs if "was cut short; it goes again" in line]
        assert not [line for line in b.logs if "upload failed" in line]
    finally:
        silent.close()


def test_a_store_that_takes_the_connection_and_never_answers_is_backed_off_from(tmp_path):
    """Its timeout was an 'unreachable' error, so the uploader probed the link every 3 s while
    backing off, the probe's connection opened at once and the batch went again: a try every
    30 s + 3 s whatever the back-off. Now such a timeout is a transient error like a 503 (the
    full back-off); the probe still serves a link that is down (connection refused)."""
    silent = Silent()
    try:
        batch = tmp_path / "batch"
        batch.write_bytes(b"x" * 10)
        sink = open_sink(UploadConfig(url="s3://landing/p", endpoint_url=silent.url,
                                      access_key_id="AK", secret_access_key="SK"))
        sink.link.timeout = 0.5
        with pytest.raises(TransientSinkError) as info:
            sink.put("k.ebb.zst", str(batch), 10, lambda n: None)
        sink.close()
        assert not info.value.unreachable
        assert "took the connection but did not answer within 0.5 s" in str(info.value)
        assert silent.got.is_set() and sink.reachable()
    finally:
        silent.close()
    with pytest.raises(TransientSinkError) as info:   # now refused: unreachable
        sink.put("k.ebb.zst", str(batch), 10, lambda n: None)
    assert info.value.unreachable and not sink.reachable()
