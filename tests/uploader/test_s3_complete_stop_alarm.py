"""The s3 sink and the uploader against a store of the test's own (s3odd.py): a
CompleteMultipartUpload answered 200 whose body the connection's end cuts short counted as
stored (the batch lost); the broker's stop during a multipart upload left it open in the bucket,
and with ``upload_bandwidth`` set did not log that it cut the upload short; after a permanent
error a transient one kept the alarm; ``upload resume`` during a back-off said "already
resumed" though it retries now."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from conftest import run_cli
from core.test_metrics import METRICS_RE, scrape
from edgebroker.uploader.batch import read_batch_file
from edgebroker.uploader.s3answer import completed
from edgebroker.uploader.sinks import TransientSinkError

from .s3odd import OddStore
from .test_s3_link import s3_upload
from .test_uploader import publish, uploaded, wait_until

MULTIPART = 5 << 20
BLOBS = {i: random.Random(i).randbytes(1_000_000) for i in range(6)}   # one batch, two parts


def publish_big(b) -> None:
    publish(b, 0, 6, size=1_000_000, make=lambda i, size: BLOBS[i])


def is_complete(method: str, query: dict) -> bool:
    return method == "POST" and "uploadId" in query


@pytest.mark.parametrize("tail, said", [
    (b"", "answered 200 without a complete result"),
    (b"<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try "
     b"again.</Message></Error>", "CompleteMultipartUpload p/gateway=gw-test/"),
], ids=["cut-short", "error-in-body"])
def test_a_complete_answered_200_cut_short_is_retried_and_every_record_lands(broker, tmp_path,
                                                                             tail, said):
    """The first CompleteMultipartUpload gets 200 with the XML declaration and spaces, no
    Content-Length, then the connection ends: the upload was not completed, yet it counted as
    stored (the mark moved on, nothing in the bucket). Now only a whole
    CompleteMultipartUploadResult is a success: the upload is aborted and goes again. The same
    with an ``Error`` after the 200 (S3 fails while completing): logged with the 200 and the
    error's code (it was logged as a "500")."""
    cut = []

    def odd(handler, method, query):
        if not is_complete(method, query) or cut:
            return False
        cut.append(1)
        handler.body()
        handler.server.note(method, query, 200)
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\n"
                            b"Connection: close\r\n\r\n"
                            b'<?xml version="1.0" encoding="UTF-8"?>\n        ' + tail)
        handler.wfile.flush()
        handler.close_connection = True
        return True

    store = OddStore(odd)
    try:
        b = broker(upload=s3_upload(store, multipart_bytes=MULTIPART))
        publish_big(b)
        wait_until(lambda: uploaded(b) == 6, timeout=60, what="the batch uploaded")
        ((key, body),) = store.objects.items()
        (tmp_path / "batch").write_bytes(body)
        header, records = read_batch_file(str(tmp_path / "batch"))
        assert [(r.offset, r.payload) for r in records] == [(i, BLOBS[i]) for i in range(6)]
        assert (header.first_offset, header.last_offset) == (0, 5)
        assert store.uploads == {}, "the first upload aborted, the second completed"
        assert ("DELETE", ("uploadId",), 204) in [r[:3] for r in store.requests]
        fig = b.stats()["upload"]
        assert (fig["retries"], fig["alarm"]) == (1, False), fig
        failed = [line for line in b.logs if "upload failed" in line]
        assert len(failed) == 1 and said in failed[0], failed
        if tail:
            assert ": 200, then the error InternalError in its body (We encountered an internal " \
                   "error. Please try again.)" in failed[0], failed
    finally:
        store.close()


def test_the_stop_during_a_multipart_upload_aborts_it(broker):
    """SIGTERM while the store holds the answer to part 1: the stop cut the request short and
    then refused the abort's DELETE (the link stopping), leaving the upload open in the bucket.
    Now the DELETE goes all the same, a short one, and the stop stays quick."""
    held, release = threading.Event(), threading.Event()

    def odd(handler, method, query):
        if method == "PUT" and query.get("partNumber") == "1":
            handler.server.uploads[query["uploadId"]][1] = handler.body()
            held.set()
            release.wait(30)   # the answer held (until the test ends)
            handler.reply(200, headers=[("ETag", '"p1"')])
            return True
        return False

    store = OddStore(odd)
    try:
        b = broker(upload=s3_upload(store, multipart_bytes=MULTIPART))
        publish_big(b)
        assert held.wait(30), "part 1 never came"
        assert len(store.uploads) == 1
        began = time.monotonic()
        assert b.stop() == 0
        took = time.monotonic() - began
        assert took < 5, f"the stop took {took:.1f} s"
        assert store.uploads == {}, "the upload left open"
        assert [r[:3] for r in store.requests][-1] == ("DELETE", ("uploadId",), 204)
        assert [line for line in b.logs if "was cut short; it goes again" in line]
    finally:
        release.set()
        store.close()


def test_the_stop_during_a_throttled_upload_says_so_and_aborts_it(broker):
    """With upload_bandwidth set, the stop ended the throttle's wait in the middle of a part:
    no "was cut short" line, and the multipart upload left open. Now both as without it."""
    throttled = threading.Event()

    def odd(handler, method, query):
        if method != "PUT" or query.get("partNumber") != "1":
            return False
        left = int(handler.headers["Content-Length"])
        got = 0
        while left:   # read as it comes: past 600 KB (3 s of it) the sender is throttled
            data = handler.rfile.read1(min(65536, left))
            if not data:
                return True   # the sender went
            got += len(data)
            left -= len(data)
            if got > 600_000:
                throttled.set()
        handler.reply(200, headers=[("ETag", '"p1"')])
        return True

    store = OddStore(odd)
    try:
        b = broker(upload=s3_upload(store, multipart_bytes=MULTIPART, upload_bandwidth=200_000))
        publish_big(b)
        assert throttled.wait(30), "part 1 never came"
        began = time.monotonic()
        assert b.stop() == 0
        assert time.monotonic() - began < 5
        cut = [line for line in b.logs if "was cut short; it goes again" in line]
        assert len(cut) == 1 and "gateway=gw-test/" in cut[0], b.logs[-5:]
        assert store.uploads == {}, "the upload left open"
        assert not [line for line in b.logs if "upload failed" in line]
    finally:
        store.close()


def test_a_transient_error_after_the_alarm_clears_it_and_resume_says_it_retries(broker):
    """403, then 503 with Retry-After 30, then the store answers. The 503 kept the alarm
    (metric 1, state alarm, status "ALARM:"), though the last try failed transiently; and
    ``upload resume`` in either back-off said "upload was already resumed", changed false,
    while it retried at once."""
    answers = [(403, b"<Error><Code>AccessDenied</Code></Error>", []),
               (503, b"<Error><Code>SlowDown</Code></Error>", [("Retry-After", "30")])]

    def odd(handler, method, query):
        if method != "PUT" or not answers:
            return False
        status, body, headers = answers.pop(0)
        handler.body()
        handler.reply(status, body, headers)
        return True

    def backing_off(retries):
        fig = b.stats()["upload"]
        return fig if fig["retries"] == retries and fig["retry_in_seconds"] > 5 else None

    store = OddStore(odd)
    try:
        b = broker(upload=s3_upload(store), metrics={"listen": "127.0.0.1:0"})
        host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
        url = f"http://{host}:{port}/metrics"
        data_dir = b.config["data_dir"]
        publish(b, 0, 1)
        fig = wait_until(lambda: backing_off(1), what="the alarm's back-off")
        assert fig["alarm"] and fig["state"] == "alarm"
        out = run_cli("upload", "resume", "--data-dir", data_dir)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("upload retrying now (the upload was in alarm)\n"), out.stdout
        fig = wait_until(lambda: backing_off(2), what="the 503's back-off")
        assert (fig["alarm"], fig["state"], fig["permanent_errors"]) == (False, "retrying", 1)
        assert scrape(url)[("edgebroker_upload_alarm", None)] == 0
        status = run_cli("upload", "status", "--data-dir", data_dir).stdout
        assert "retrying" in status and "503 SlowDown" in status and "ALARM" not in status
        out = run_cli("upload", "resume", "--data-dir", data_dir, "--format", "json")
        reply = json.loads(out.stdout)
        assert (reply["changed"], reply["was"]) == (True, "retrying"), reply
        wait_until(lambda: uploaded(b) == 1, timeout=10, what="the batch after the resume")
        again = run_cli("upload", "resume", "--data-dir", data_dir)
        assert again.stdout.startswith("upload was already resumed\n"), again.stdout
        assert [r[2] for r in store.requests] == [403, 503, 200]
    finally:
        store.close()


def test_a_complete_answer_counts_only_with_its_whole_result():
    ns = b' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
    assert completed(b'<?xml version="1.0" encoding="UTF-8"?>\n\n<CompleteMultipartUploadResult'
                     + ns + b"><ETag>x</ETag></CompleteMultipartUploadResult>", "w")
    assert completed(b"  <CompleteMultipartUploadResult/>", "w")
    assert not completed(b"<Error><Code>InternalError</Code></Error>", "w")
    assert not completed(b"<Error" + ns + b"><Code>InternalError</Code></Error>", "w")
    for body in (b"", b'<?xml version="1.0"?>\n   ', b"<CompleteMultipartUploadResult><ETag>",
                 b"<html>proxy</html>", b"<InitiateMultipartUploadResult/>"):
        with pytest.raises(TransientSinkError, match="w: answered 200 without a complete "
                                                     "result: "):
            completed(body, "w")
