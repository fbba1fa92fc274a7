"""The s3 sink against stores that answer oddly (a small S3-like store of the test's own,
s3odd.py): an answer whose body never ends, fast or dripping; 501 to a conditional
CompleteMultipartUpload; 429 with Retry-After; a temporary redirect; a HEAD whose
Content-Length is not a number."""

from __future__ import annotations

import re
import time

import pytest

import mqttraw
from edgebroker.upload_config import UploadConfig
from edgebroker.uploader.configure import open_sink
from edgebroker.uploader.sinks import TransientSinkError

from .s3odd import OddStore
from .test_s3_link import s3_upload
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


def refuse_conditions(handler, method, query) -> bool:
    """A store that does not know conditional writes: 501 to If-None-Match."""
    if handler.headers.get("If-None-Match") != "*":
        return False
    handler.body()
    handler.reply(501, b"<Error><Code>NotImplemented</Code><Message>A header you provided "
                       b"implies functionality that is not implemented</Message></Error>")
    return True


def test_a_store_answering_501_to_a_conditional_complete_gets_it_without(tmp_path):
    """501 to If-None-Match on CompleteMultipartUpload was a transient error: the batch went
    again in full for ever. Now, as for a single put, the condition is dropped: the Complete
    goes again at once without it, and later puts go without it too."""
    store = OddStore(refuse_conditions)
    try:
        sink = open_sink(UploadConfig(url="s3://landing/p", endpoint_url=store.url,
                                      access_key_id="AK", secret_access_key="SK",
                                      multipart_bytes=5 << 20))
        batch = tmp_path / "big"
        batch.write_bytes(bytes(range(256)) * (6 << 12))   # 6 MiB: two parts
        sink.put("k/big.ebb.zst", str(batch), 6 << 20, lambda n: None)
        assert store.objects == {"/landing/p/k/big.ebb.zst": batch.read_bytes()}
        assert [r[:3] for r in store.requests] == [
            ("HEAD", (), 404), ("POST", ("uploads",), 200),
            ("PUT", ("partNumber", "uploadId"), 200), ("PUT", ("partNumber", "uploadId"), 200),
            ("POST", ("uploadId",), 501), ("POST", ("uploadId",), 200)]
        store.requests.clear()
        sink.put("k/small.ebb.zst", str(batch), 1000, lambda n: None)
        assert [r[:3] for r in store.requests] == [("PUT", (), 200)], "no condition any more"
        sink.close()
    finally:
        store.close()


def first_put_answered(status: int, headers, body: bytes = b""):
    """``odd`` for OddStore: the first PUT gets ``status`` with ``headers``, the rest as usual."""
    done = []

    def odd(handler, method, query):
        if method != "PUT" or done:
            return False
        done.append(1)
        handler.body()
        handler.reply(status, body, headers)
        return True
    return odd


def ship_one(store: OddStore, broker):
    b = broker(upload=s3_upload(store))
    c = b.client("pub")
    c.send(mqttraw.publish("t", b"m", qos=1, packet_id=1))
    c.expect(mqttraw.PUBACK, timeout=10)
    c.close()
    wait_until(lambda: uploaded(b) == 1, timeout=20, what="the batch uploaded")
    return b


def test_429_with_retry_after_waits_that_long(broker):
    """429 with Retry-After: 3 was retried after the back-off alone (under 1 s the first
    time). Now the retry waits the seconds the store asked for."""
    store = OddStore(first_put_answered(429, [("Retry-After", "3")], b"<Error><Code>"
                                        b"SlowDown</Code></Error>"))
    try:
        b = ship_one(store, broker)
        puts = [r for r in store.requests if r[0] == "PUT"]
        assert [r[2] for r in puts] == [429, 200]
        assert puts[1][3] - puts[0][3] >= 3.0, f"retried after {puts[1][3] - puts[0][3]:.1f} s"
        assert b.stats()["upload"]["retries"] == 1
    finally:
        store.close()


def test_a_temporary_redirect_is_a_transient_error_naming_the_location(broker):
    """307 TemporaryRedirect (AWS, for a bucket new in another region) was a permanent error:
    the alarm, and a retry 60 s later. Now it is retried with the back-off, not followed (the
    request is signed for this host), and the error names where the store points."""
    where = "http://127.0.0.1:9/landing/elsewhere"
    store = OddStore(first_put_answered(307, [("Location", where)], b"<Error><Code>"
                                        b"TemporaryRedirect</Code></Error>"))
    try:
        b = ship_one(store, broker)
        fig = b.stats()["upload"]
        assert (fig["retries"], fig["permanent_errors"], fig["alarm"]) == (1, 0, False), fig
        failed = [line for line in b.logs if "upload failed" in line]
        assert len(failed) == 1 and f"307 TemporaryRedirect, redirected to {where}" in failed[0]
        assert [r[2] for r in store.requests] == [307, 200]
    finally:
        store.close()


@pytest.mark.parametrize("length", ["abc", "--5", "\u00b2"])
def test_a_head_with_a_content_length_not_a_number_is_a_sink_error(tmp_path, length):
    """A 412, then a HEAD answering Content-Length: abc (or --5, or a superscript two, which
    str.isdigit takes): int() raised ValueError, counted as one of the uploader's own local
    errors. Now it is a transient sink error naming it."""
    def odd(handler, method, query):
        if method == "PUT":
            handler.body()
            handler.reply(412, b"<Error><Code>PreconditionFailed</Code></Error>")
            return True
        if method == "HEAD":
            handler.server.note(method, query, 200)
            handler.send_response(200)
            handler.send_header("Content-Length", length)
            handler.end_headers()
            return True
        return False

    store = OddStore(odd)
    try:
        batch = tmp_path / "batch"
        batch.write_bytes(b"x" * 10)
        sink = open_sink(UploadConfig(url="s3://landing/p", endpoint_url=store.url,
                                      access_key_id="AK", secret_access_key="SK"))
        with pytest.raises(TransientSinkError, match="HEAD p/k.ebb.zst: the store's answer has "
                                                     "a Content-Length that is not a number: "
                                                     + re.escape(repr(length))):
            sink.put("k.ebb.zst", str(batch), 10, lambda n: None)
        sink.close()
    finally:
        store.close()
