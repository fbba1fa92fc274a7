"""The s3 sink and the uploader with a fault proxy between them and the store (moto on
loopback): a store that takes the connection and closes or resets it before answering was
"no answer" (the link down), so the uploader probed with a TCP connect every 3 s, the probe
opened at once and the batch went again, whatever the back-off, with a log line at each probe;
now it is backed off from in full, the error logged once. The line after a recovery counts
every failed try of the batch (it said "after 0 retries" after an alarm) and names the object
as the error line did (with the prefix). ``upload run --once`` with a permanent error printed
the broker's "retried every 60 s" alarm line before its own error; now the error alone."""

from __future__ import annotations

import re
import socket
import time

import pytest

from conftest import run_cli
from edgebroker.upload_config import UploadConfig
from edgebroker.uploader.configure import open_sink
from edgebroker.uploader.sinks import TransientSinkError

from .test_s3 import PREFIX, Store, _fresh, check_exactly_once_s3, s3_config
from .test_s3_link import LoopbackServer
from .test_uploader import publish, uploaded, wait_until

FORBIDDEN = (b"<?xml version='1.0'?><Error><Code>InvalidAccessKeyId</Code>"
             b"<Message>no such key</Message></Error>")


@pytest.fixture
def store():
    yield from _fresh(Store())


class FaultProxy(LoopbackServer):
    """Between the sink and moto; ``mode``, read at each request: ``pass`` (forwarded),
    ``close`` (the request read whole, then the connection closed unanswered), ``reset`` (the
    same with a reset) or ``403`` (InvalidAccessKeyId). ``requests``: the modes requests met;
    ``bare``: connections that ended before sending anything (the uploader's link probes)."""

    def __init__(self, upstream: int, mode: str = "pass"):
        self.upstream = upstream
        self.mode = mode
        self.requests: list[str] = []
        self.bare = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            first = True
            while head := _head(f):
                first = False
                body = f.read(_length(head))
                mode = self.mode
                self.requests.append(mode)
                if mode in ("close", "reset"):
                    if mode == "reset":   # (a close with linger 0 sends RST)
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    conn.close()
                    return
                if mode == "403":
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(FORBIDDEN), FORBIDDEN))
                    continue
                conn.sendall(self._forward(head, body))
            if first:
                self.bare += 1
        except OSError:
            pass
        finally:
            f.close()
            conn.close()

    def _forward(self, head: bytes, body: bytes) -> bytes:
        lines = [h for h in head.split(b"\r\n") if h and not h.lower().startswith(b"connection:")]
        with socket.create_connection(("127.0.0.1", self.upstream), timeout=10) as up:
            up.sendall(b"\r\n".join(lines + [b"Connection: close", b"", b""]) + body)
            uf = up.makefile("rb")
            answer = _head(uf)
            length = 0 if head.startswith(b"HEAD ") else _length(answer)
            return answer + uf.read(length)


def _head(f) -> bytes:
    """A request's or answer's head, through its blank line (b"" at the end of the stream)."""
    head = b""
    for _ in range(200):
        line = f.readline()
        head += line
        if line in (b"\r\n", b"\n", b""):
            return head if line else b""
    raise AssertionError("a head of more than 200 lines")


def _length(head: bytes) -> int:
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return int(m.group(1)) if m else 0


def retry_now(b) -> None:
    """End the back-off under way: a pause (it holds until the resume), then a resume."""
    b.admin("upload_pause")
    wait_until(lambda: b.stats()["upload"]["state"] == "paused", what="the pause")
    b.admin("upload_resume")


@pytest.mark.parametrize("mode, how", [("close", "Remote end closed connection"),
                                       ("reset", "Connection reset by peer")])
def test_a_connection_closed_or_reset_unanswered_is_not_the_link_down(store, tmp_path, mode,
                                                                        how):
    proxy = FaultProxy(store.port, mode)
    try:
        batch = tmp_path / "batch"
        batch.write_bytes(b"x" * 1000)
        sink = open_sink(UploadConfig(url="s3://landing/p", endpoint_url=proxy.url,
                                      access_key_id="AK", secret_access_key="SK"))
        with pytest.raises(TransientSinkError) as info:
            sink.put("k.ebb.zst", str(batch), 1000, lambda n: None)
        sink.close()
        assert not info.value.unreachable, "a probe would open at once: no use"
        assert f"it took the connection but closed it without an answer ({how}" in str(
            info.value), str(info.value)
        assert proxy.requests == [mode]
    finally:
        proxy.close()


def test_a_store_closing_connections_is_backed_off_from_and_the_recovery_counts_every_try(
        broker, store, tmp_path):
    proxy = FaultProxy(store.port, "close")
    try:
        b = broker(upload=s3_config(store, batch_max_age=1, endpoint_url=proxy.url))
        publish(b, 0, 5)
        # a back-off with more than 5 s to go: the probe (every 3 s) would have ended it early
        fig = wait_until(lambda: (lambda f: f if f["retry_in_seconds"] > 5 else None)(
            b.stats()["upload"]), timeout=120, what="a long back-off")
        began, left, retries = time.monotonic(), fig["retry_in_seconds"], fig["retries"]
        assert fig["state"] == "retrying" and not fig["alarm"], fig
        wait_until(lambda: b.stats()["upload"]["retries"] > retries, timeout=left + 30,
                   what="the next try")
        took = time.monotonic() - began
        assert took > left - 1, f"the back-off of {left:.1f} s ended after {took:.1f} s"
        assert proxy.bare == 0, "no link probe: the link is up"
        assert not [line for line in b.logs if "answers again" in line]
        assert "closed it without an answer" in fig["last_error"], fig
        failed = [line for line in b.logs if "upload failed" in line]
        assert len(failed) == 1 and "closed it without an answer" in failed[0], failed
        # then a permanent error (the alarm), then the store answers
        proxy.mode = "403"
        retry_now(b)
        wait_until(lambda: b.stats()["upload"]["alarm"], what="the alarm")
        proxy.mode = "pass"
        retry_now(b)
        wait_until(lambda: uploaded(b) == 5, what="the batch landed")
        fig = b.stats()["upload"]
        assert fig["permanent_errors"] == 1 and not fig["alarm"]
        alarm = [line for line in b.logs if "upload alarm" in line]
        assert len(alarm) == 1, alarm
        name = re.search(r"PUT (\S+): 403 InvalidAccessKeyId", alarm[0]).group(1)
        assert name.startswith(PREFIX + "/gateway=") and f"PUT {name}: no answer" in failed[0]
        done = [line for line in b.logs if "succeeded after" in line]
        assert len(done) == 1 and (f"upload of {name} succeeded after {fig['retries']} failed "
                                   f"attempts; uploading resumed") in done[0], (done, fig)
        assert fig["retries"] == len(proxy.requests) - 1 >= 4, proxy.requests
        check_exactly_once_s3(store, tmp_path, 5)
        b.stop()
    finally:
        proxy.close()


def test_run_once_prints_a_permanent_error_once_without_the_brokers_retry_note(
        broker, store, tmp_path):
    data = tmp_path / "data"
    b = broker(data_dir=str(data), log={"segment_bytes": 8192})   # no uploading
    publish(b, 0, 300)
    b.stop()
    proxy = FaultProxy(store.port, "403")
    try:
        config = tmp_path / "upload.toml"
        up = s3_config(store, batch_bytes=4096, endpoint_url=proxy.url)
        config.write_text(f'data_dir = "{data}"\n[log]\nsegment_bytes = 8192\n[upload]\n'
                          + "".join(f'{k} = "{v}"\n' if isinstance(v, str) else f"{k} = {v}\n"
                                    for k, v in up.items()))
        r = run_cli("upload", "run", "--once", "-c", str(config), timeout=60)
        assert r.returncode == 1, r.stderr
        assert proxy.requests == ["403"]
        assert r.stderr.count("403 InvalidAccessKeyId") == 1, r.stderr
        assert "retried every" not in r.stderr and "upload alarm" not in r.stderr, r.stderr
        assert re.search(r"(?m)^edgebroker: .*PUT edge/v1/gateway=\S+: 403 InvalidAccessKeyId",
                         r.stderr), r.stderr
    finally:
        proxy.close()
