"""The s3 sink against stores that answer oddly (a small S3-like store of the test's own,
s3odd.py): an answer whose body never ends, fast or dripping."""

from __future__ import annotations

import time

import pytest

import mqttraw
from edgebroker.upload_config import UploadConfig
from edgebroker.uploader.configure import open_sink
from edgebroker.uploader.sinks import TransientSinkError

from .s3odd import OddStore, s3_upload
from .test_uploader import uploaded, wait_until


def endless(handler, status: int, chunk: bytes, pause: float, limit: float) -> None:
    """Answer ``status`` with a chunked body of ``chunk`` every ``pause`` s, until the client
    goes or ``limit`` s pass; the bytes written are added to ``handler.server.sent``."""
    handler.body()
    handler.server.note(handler.command, handler.query, status)
    handler.send_response(status)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    end = time.monotonic() + limit
    try:
        while time.monotonic() < end:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            handler.wfile.flush()
            handler.server.sent += len(chunk)
            time.sleep(pause)
    except OSError:
        pass   # the client went
    handler.close_connection = True


def test_an_answer_that_drips_for_ever_ends_at_the_deadline_as_a_transient_error(tmp_path):
    """A 500 whose body comes a byte every 0.1 s: each read came within the 30 s timeout, so
    the put waited for ever. Now the answer must come whole within the deadline (lowered to
    1 s here): a transient error saying so, the link not 'unreachable'."""
    store = OddStore(lambda h, method, q: endless(h, 500, b"<", 0.1, 30) or True)
    store.sent = 0
    try:
        batch = tmp_path / "batch"
        batch.write_bytes(b"x" * 10)
        sink = open_sink(UploadConfig(url="s3://landing/p", endpoint_url=store.url,
                                      access_key_id="AK", secret_access_key="SK"))
        sink.link.answer_deadline = 1.0
        began = time.monotonic()
        with pytest.raises(TransientSinkError) as info:
            sink.put("k.ebb.zst", str(batch), 10, lambda n: None)
        took = time.monotonic() - began
        sink.close()
        assert took < 5, f"the put took {took:.1f} s"
        assert "PUT p/k.ebb.zst: the store's answer did not come whole within 1 s" in str(
            info.value)
        assert not info.value.unreachable
        assert [r[0] for r in store.requests] == ["PUT"], "not sent again as a stale connection"
    finally:
        store.close()


def test_an_endless_answer_body_is_read_to_64_kib_then_a_counted_retry(broker):
    """The first PUT answered 200 with a body of 1 MiB chunks that never ends: the broker read
    it all into memory (243 MiB in 12 s). Now it reads 64 KiB of it, closes the connection,
    logs the error once, counts a retry, and the next put lands the batch."""
    first = []

    def odd(handler, method, query):
        if method == "PUT" and not first:
            first.append(1)
            endless(handler, 200, b"x" * (1 << 20), 0.0, 20)
            return True
        return False

    store = OddStore(odd)
    store.sent = 0
    try:
        b = broker(upload=s3_upload(store))
        c = b.client("pub")
        c.send(mqttraw.publish("t", b"m", qos=1, packet_id=1))
        c.expect(mqttraw.PUBACK, timeout=10)
        c.close()
        wait_until(lambda: uploaded(b) == 1, timeout=60, what="the batch uploaded")
        fig = b.stats()["upload"]
        assert fig["retries"] == 1 and fig["batches"] == 1, fig
        assert "with a body longer than 64 KiB" in fig["last_error"], fig
        failed = [line for line in b.logs if "upload failed" in line]
        assert len(failed) == 1 and "PUT p/gateway=gw-test/" in failed[0], failed
        assert store.sent < 64 << 20, f"the store sent {store.sent >> 20} MiB before the close"
        assert [r[:3] for r in store.requests] == [("PUT", (), 200), ("PUT", (), 200)]
    finally:
        store.close()
