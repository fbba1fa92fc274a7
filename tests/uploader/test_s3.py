"""The `s3` sink against a real S3-compatible HTTP server on loopback (moto in server mode,
started by the test on a free port; boto3, moto's own client, checks what landed): the SigV4
signature against botocore's; deterministic names; conditional puts (moto answers 412 to
``If-None-Match: *`` on PutObject and CompleteMultipartUpload) counted as success for the same
bytes, refused for other bytes; multipart above ``multipart_bytes``; every record once across
SIGKILLs; the link down then back; a missing bucket and a wrong secret (permanent: alarm, data
kept; moto checks signatures and permissions with an IAM user there); pause and resume;
``upload run --once``."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import json
import os
import random
import pty
import signal
import ssl
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from moto.core.authorization import disable_iam_authentication, enable_iam_authentication
from moto.moto_server.werkzeug_app import (DomainDispatcherApplication, MotoRequestHandler,
                                           create_backend_app)
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

from edgebroker.upload_config import UploadConfig
from edgebroker.uploader.batch import object_name, read_batch_file
from edgebroker.uploader.life import life_of_key
from edgebroker.uploader.s3 import EMPTY_SHA256, SHA_META, Response, S3Sink, sign_v4
from edgebroker.uploader.sinks import PermanentSinkError, TransientSinkError

from certs import make_pki
from conftest import REPO, broker_command, run_cli
from .test_uploader import GATEWAY, kill_while_shipping, payload, publish, uploaded, wait_until

BUCKET = "landing"
PREFIX = "edge/v1"
KEY_ID, SECRET = "AKIDTEST", "secret-test"


class TLSMotoServer(ThreadedMotoServer):
    """Moto's threaded server over https, with the certificate and key given."""

    def __init__(self, cert: Path, key: Path, **kw):
        super().__init__(**kw)
        self._tls = (str(cert), str(key))

    def _server_entry(self) -> None:
        self._server = make_server(self._ip_address, self._port,
                                   DomainDispatcherApplication(create_backend_app), True,
                                   request_handler=MotoRequestHandler, ssl_context=self._tls)
        self._server_ready_event.set()
        self._server.serve_forever()


class Store:
    """A moto server on 127.0.0.1 (stop() and start() again on the same port keep its
    buckets: moto's state lives in this process); over https with ``tls`` (cert, key, CA)."""

    def __init__(self, tls=None):
        self.port = 0
        self.server = None
        self.tls = tls
        self.start()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.s3 = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                               aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                               verify=str(tls[2]) if tls else None)

    def start(self):
        if self.tls:
            self.server = TLSMotoServer(self.tls[0], self.tls[1], ip_address="127.0.0.1",
                                        port=self.port, verbose=False)
        else:
            self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port,
                                             verbose=False)
        self.server.start()
        self.port = self.server.get_host_and_port()[1]

    def stop(self):
        self.server.stop()

    def objects(self, bucket=BUCKET) -> dict[str, bytes]:
        out = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", ()):
                out[item["Key"]] = self.s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return out


@pytest.fixture
def store():
    yield from _fresh(Store())


def _fresh(s: Store):
    # moto keeps its buckets in this process: start each test empty
    tls = ssl.create_default_context(cafile=str(s.tls[2])) if s.tls else None
    urllib.request.urlopen(urllib.request.Request(s.url + "/moto-api/reset", method="POST"),
                           timeout=10, context=tls).close()
    s.s3.create_bucket(Bucket=BUCKET)
    yield s
    s.stop()


def iam_user(store, name: str, action: str) -> tuple[str, str]:
    """An IAM user of moto's allowed ``action`` on everything: (access key id, secret)."""
    iam = boto3.client("iam", endpoint_url=store.url, region_name="us-east-1",
                       aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="landing", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture
def iam_key(store):
    """Moto checking signatures and permissions (in this process, where its server runs): an
    IAM user allowed s3:*, its (access key id, secret)."""
    key = iam_user(store, "gateway", "s3:*")
    with enable_iam_authentication():
        yield key


def s3_config(store, bucket=BUCKET, **kw) -> dict:
    return {"url": f"s3://{bucket}/{PREFIX}", "endpoint_url": store.url, "region": "us-east-1",
            "access_key_id": KEY_ID, "secret_access_key": SECRET, "gateway_id": GATEWAY, **kw}


def landed_s3(store, tmp_path) -> dict[str, tuple]:
    """key -> (header, records) of every batch in the bucket."""
    out = {}
    spool = tmp_path / "read.ebb.zst"
    for key, body in store.objects().items():
        spool.write_bytes(body)
        out[key] = read_batch_file(str(spool))
    return out


def check_exactly_once_s3(store, tmp_path, n: int) -> None:
    batches = landed_s3(store, tmp_path)
    offsets = sorted(r.offset for _, records in batches.values() for r in records)
    assert offsets == list(range(n)), "every record once, none missing"
    for key, (header, records) in batches.items():
        assert key == PREFIX + "/" + object_name("", GATEWAY, header.first_offset,
                                                 header.last_offset, records[0].timestamp_ms,
                                                 life_of_key(key))
        assert life_of_key(key) is not None
        for r in records:
            assert r.payload == payload(r.offset)
        head = store.s3.head_object(Bucket=BUCKET, Key=key)
        body = store.objects()[key]
        assert head["Metadata"]["ebb-sha256"] == hashlib.sha256(body).hexdigest()
        assert head["Metadata"]["ebb-records"] == (
            f"{header.first_offset}-{header.last_offset}-{header.raw_length}-"
            f"{header.raw_crc32c:08x}")


def test_signature_is_the_one_botocore_computes():
    path = quote("/bkt/edge/gateway=gw-1/date=2026-11-26/0-9.ebb.zst", safe="/-_.~")
    for query in ({}, {"uploads": ""}, {"partNumber": "2", "uploadId": "a/b+c=="}):
        headers = {"Content-Length": "0", "If-None-Match": "*", SHA_META: "ab"}
        qs = "&".join(f"{k}={quote(v, safe='-_.~')}" if v else k for k, v in sorted(query.items()))
        req = AWSRequest("PUT", "http://127.0.0.1:9000" + path + ("?" + qs if qs else ""),
                         headers=dict(headers))
        S3SigV4Auth(Credentials("AK", "SK", "TOKEN"), "s3", "eu-west-1").add_auth(req)
        when = datetime.datetime.strptime(req.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
        ours = sign_v4("PUT", "127.0.0.1:9000", path, query, headers, EMPTY_SHA256, "eu-west-1",
                       "AK", "SK", "TOKEN", when)
        assert ours["Authorization"] == req.headers["Authorization"]
        assert ours["x-amz-security-token"] == "TOKEN"


def test_errors_are_classified_transient_or_permanent(store):
    sink = S3Sink(f"s3://{BUCKET}/{PREFIX}", UploadConfig(**{
        k: v for k, v in s3_config(store).items() if k != "gateway_id"}))

    def answer(status, code=""):
        body = f"<Error><Code>{code}</Code><Message>m</Message></Error>".encode() if code else b""
        return sink._error("PUT", "k", Response(status, {}, body))

    for status, code in ((500, "InternalError"), (503, "SlowDown"), (503, ""), (429, ""),
                         (408, ""), (400, "RequestTimeout"), (400, "SlowDown"),
                         (307, "TemporaryRedirect")):
        assert type(answer(status, code)) is TransientSinkError, (status, code)
    for status, code in ((403, "AccessDenied"), (403, "InvalidAccessKeyId"), (404, "NoSuchBucket"),
                         (400, "InvalidBucketName"), (403, "RequestTimeTooSkewed"), (405, ""),
                         (301, "PermanentRedirect")):
        assert type(answer(status, code)) is PermanentSinkError, (status, code)
    assert "403 AccessDenied (m)" in str(answer(403, "AccessDenied"))


def test_addressing_path_style_with_an_endpoint_virtual_hosted_on_aws():
    def sink(url, **kw):
        return S3Sink(url, UploadConfig(url=url, access_key_id="a", secret_access_key="b", **kw))

    minio = sink("s3://landing/x", endpoint_url="http://10.0.0.5:9000")
    assert (minio.host, minio.base, minio.address, minio.https) == (
        "10.0.0.5:9000", "/landing", ("10.0.0.5", 9000), False)
    aws = sink("s3://landing/x", region="eu-west-1")
    assert (aws.host, aws.base, aws.address, aws.https) == (
        "landing.s3.eu-west-1.amazonaws.com", "", ("landing.s3.eu-west-1.amazonaws.com", 443),
        True)
    dotted = sink("s3://my.landing/x", region="eu-west-1")
    assert (dotted.host, dotted.base) == ("s3.eu-west-1.amazonaws.com", "/my.landing")


class Counting(S3Sink):
    """The sink, remembering each request's method and answer status."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def _request(self, method, name, query, *a, **kw):
        r = super()._request(method, name, query, *a, **kw)
        self.calls.append((method, tuple(sorted(query)), r.status))
        return r


def test_conditional_put_412_same_bytes_or_records_is_success_other_bytes_refused(store,
                                                                                  tmp_path):
    sink = Counting(f"s3://{BUCKET}/{PREFIX}", UploadConfig(**{
        k: v for k, v in s3_config(store).items() if k != "gateway_id"}))
    batch = tmp_path / "b"
    batch.write_bytes(os.urandom(5000))
    sink.put("k/one.ebb.zst", str(batch), 5000, lambda n: None, "0-9-900-0badf00d")
    assert sink.calls == [("PUT", (), 200)]
    sink.calls.clear()
    sink.put("k/one.ebb.zst", str(batch), 5000, lambda n: None, "0-9-900-0badf00d")   # a retry
    assert sink.calls == [("PUT", (), 412), ("HEAD", (), 200)], "412, then the HEAD agrees"
    other = tmp_path / "c"
    other.write_bytes(os.urandom(4000))
    sink.calls.clear()
    # other bytes, the same records: the batch compressed by another zstd release
    sink.put("k/one.ebb.zst", str(other), 4000, lambda n: None, "0-9-900-0badf00d")
    assert sink.calls == [("PUT", (), 412), ("HEAD", (), 200)]
    with pytest.raises(PermanentSinkError, match="already exists with other bytes"):
        sink.put("k/one.ebb.zst", str(other), 4000, lambda n: None, "0-9-900-12345678")
    assert store.objects()[f"{PREFIX}/k/one.ebb.zst"] == batch.read_bytes(), "not replaced"
    head = store.s3.head_object(Bucket=BUCKET, Key=f"{PREFIX}/k/one.ebb.zst")
    assert head["ETag"].strip('"') == hashlib.md5(batch.read_bytes()).hexdigest()
    sink.close()


def test_a_key_that_may_only_put_gets_a_clear_alarm_on_a_batch_sent_again(store, tmp_path):
    """A key with s3:PutObject alone: the first put lands; the same batch sent again (after
    a crash between put and mark) gets 412, and the HEAD that would recognise it gets 403:
    a permanent error that says which permission is missing."""
    key_id, secret = iam_user(store, "writer", "s3:PutObject")
    config = {**s3_config(store), "access_key_id": key_id, "secret_access_key": secret}
    del config["gateway_id"]
    batch = tmp_path / "b"
    batch.write_bytes(os.urandom(3000))
    with enable_iam_authentication():
        sink = Counting(f"s3://{BUCKET}/{PREFIX}", UploadConfig(**config))
        sink.put("k/one.ebb.zst", str(batch), 3000, lambda n: None, "0-9-900-0badf00d")
        with pytest.raises(PermanentSinkError, match="grant s3:GetObject") as raised:
            sink.put("k/one.ebb.zst", str(batch), 3000, lambda n: None, "0-9-900-0badf00d")
        sink.close()
    assert sink.calls == [("PUT", (), 200), ("PUT", (), 412), ("HEAD", (), 403)]
    assert f"HEAD {PREFIX}/k/one.ebb.zst: 403 Forbidden" in str(raised.value)
    assert store.objects()[f"{PREFIX}/k/one.ebb.zst"] == batch.read_bytes()


def test_an_answer_that_is_not_xml_is_a_transient_error_naming_the_request(tmp_path):
    """Something in front of the store (a proxy's login page) answers 200 with HTML to
    CreateMultipartUpload: a transient error that names the request and shows the answer,
    not a traceback."""

    class NotAStore(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = b"<html><body>proxy login</body>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotAStore)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        sink = S3Sink(f"s3://{BUCKET}/{PREFIX}", UploadConfig(
            url=f"s3://{BUCKET}/{PREFIX}", endpoint_url=url, region="us-east-1",
            access_key_id=KEY_ID, secret_access_key=SECRET, multipart_bytes=5 << 20))
        batch = tmp_path / "big"
        batch.write_bytes(bytes(6 << 20))
        with pytest.raises(TransientSinkError) as err:
            sink.put("k/big.ebb.zst", str(batch), 6 << 20, lambda n: None)
        assert f"CreateMultipartUpload {PREFIX}/k/big.ebb.zst" in str(err.value)
        assert "not XML" in str(err.value) and "proxy login" in str(err.value)
        sink.close()
    finally:
        server.shutdown()
        server.server_close()


def test_multipart_above_multipart_bytes(store, iam_key, tmp_path):
    """multipart_bytes lowered to its minimum, 5 MiB (S3's smallest part): an 11 MiB batch file
    goes in three parts; a re-put finds it by HEAD and sends nothing. Moto checks every
    request's signature."""
    sent = []
    cfg = {k: v for k, v in s3_config(store).items() if k != "gateway_id"}
    cfg["access_key_id"], cfg["secret_access_key"] = iam_key
    sink = Counting(f"s3://{BUCKET}/{PREFIX}", UploadConfig(**cfg, multipart_bytes=5 << 20))
    size = 11 << 20
    batch = tmp_path / "big"
    batch.write_bytes(random.Random(7).randbytes(size))
    sink.put("k/big.ebb.zst", str(batch), size, sent.append)
    assert [c[:2] for c in sink.calls] == [
        ("HEAD", ()), ("POST", ("uploads",)), ("PUT", ("partNumber", "uploadId")),
        ("PUT", ("partNumber", "uploadId")), ("PUT", ("partNumber", "uploadId")),
        ("POST", ("uploadId",))]
    assert sum(sent) == size, "every byte through the throttle"
    with disable_iam_authentication():   # for boto3, with moto's dummy keys
        head = store.s3.head_object(Bucket=BUCKET, Key=f"{PREFIX}/k/big.ebb.zst")
        assert store.objects()[f"{PREFIX}/k/big.ebb.zst"] == batch.read_bytes()
    assert head["ContentLength"] == size and head["ETag"].strip('"').endswith("-3")
    assert head["Metadata"]["ebb-sha256"] == hashlib.sha256(batch.read_bytes()).hexdigest()
    sink.calls.clear()
    sink.put("k/big.ebb.zst", str(batch), size, sent.append)
    assert sink.calls == [("HEAD", (), 200)], "already there: nothing sent again"
    sink.close()


def test_https_store_checked_against_ca_file(broker, tmp_path):
    """A store over https with a private CA: with ca_file the batches land; with another CA
    the certificate is refused: the alarm (someone must fix ca_file), the data kept."""
    pki = make_pki(tmp_path / "pki")
    for store in _fresh(Store(tls=(pki.server.cert, pki.server.key, pki.ca.cert))):
        b = broker(upload=s3_config(store, batch_max_age=1, ca_file=str(pki.ca.cert)))
        publish(b, 0, 5)
        wait_until(lambda: uploaded(b) == 5, what="the batch over https")
        check_exactly_once_s3(store, tmp_path, 5)
        b.stop()
        wrong = broker(upload=s3_config(store, batch_max_age=1,
                                        ca_file=str(pki.other_ca.cert)))
        publish(wrong, 0, 3)
        wait_until(lambda: wrong.stats()["upload"]["alarm"], what="a refused certificate")
        fig = wrong.stats()["upload"]
        assert "certificate is not trusted" in fig["last_error"] and "ca_file" in fig["last_error"]
        assert fig["uploaded_offset"] == 0 and fig["backlog_bytes"] > 0
        wrong.stop()


def test_broker_ships_a_large_batch_as_multipart(broker, store, tmp_path):
    """Six incompressible messages of 1,000,000 bytes make one batch of about 6 MB, over
    multipart_bytes = 5 MiB: two parts."""
    blobs = {i: random.Random(i).randbytes(1_000_000) for i in range(6)}
    b = broker(upload=s3_config(store, batch_max_age=1, multipart_bytes=5 << 20))
    publish(b, 0, 6, size=1_000_000, make=lambda i, size: blobs[i])
    wait_until(lambda: uploaded(b) == 6, what="the large batch")
    ((key, (header, records)),) = landed_s3(store, tmp_path).items()
    assert [r.payload for r in records] == [blobs[i] for i in range(6)]
    head = store.s3.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] > 5 << 20 and head["ETag"].strip('"').endswith("-2")
    assert head["Metadata"]["ebb-records"].startswith("0-5-")
    fig = b.stats()["upload"]
    assert (fig["batches"], fig["retries"], fig["bytes"]) == (1, 0, head["ContentLength"])
    b.stop()


def test_no_credentials_is_a_clear_error_at_start(broker, store, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    cfg = s3_config(store)
    del cfg["access_key_id"], cfg["secret_access_key"]
    b = broker(upload=cfg, wait=False)
    assert b.proc.wait(15) != 0
    b.stopped = True
    assert b.wait_log("no credentials were given: set upload.access_key_id and "
                      "upload.secret_access_key, or AWS_ACCESS_KEY_ID")
    half = broker(upload=dict(cfg, access_key_id=KEY_ID), wait=False)
    assert half.proc.wait(15) != 0
    half.stopped = True
    assert half.wait_log("access_key_id and secret_access_key go together")


def test_batches_land_with_deterministic_names_credentials_from_the_environment(
        broker, store, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    cfg = s3_config(store, batch_max_age=1)
    del cfg["access_key_id"], cfg["secret_access_key"]
    b = broker(upload=cfg)
    publish(b, 0, 5)
    wait_until(lambda: uploaded(b) == 5, what="the first batch")
    publish(b, 5, 3)
    wait_until(lambda: uploaded(b) == 8, what="the second batch")
    batches = landed_s3(store, tmp_path)
    day = time.strftime("%Y-%m-%d", time.gmtime(batches[min(batches)][1][0].timestamp_ms / 1000))
    life = (Path(b.config["data_dir"]) / "log" / "life").read_text().strip()
    assert min(batches) == \
        f"{PREFIX}/gateway={GATEWAY}/date={day}/{0:020d}-{4:020d}-{life}.ebb.zst"
    check_exactly_once_s3(store, tmp_path, 8)
    fig = b.stats()["upload"]
    assert (fig["batches"], fig["retries"], fig["alarm"]) == (2, 0, False)
    assert fig["url"].startswith(f"s3://{BUCKET}/{PREFIX} at {store.url}")
    assert fig["bytes"] == sum(len(v) for v in store.objects().values())
    b.stop()


def test_sigkill_after_the_put_before_the_mark_re_put_gets_412_and_counts(broker, store,
                                                                           tmp_path):
    data = tmp_path / "data"
    cfg = dict(data_dir=str(data), upload=s3_config(store, batch_max_age=1))
    b = broker(**cfg)
    (data / "log" / "uploaded.tmp").mkdir()   # the mark cannot be written
    publish(b, 0, 10)
    wait_until(lambda: store.objects(), what="the object")
    mark = str(data / "log" / "uploaded")
    assert b.wait_log(lambda line: f"uploader: cannot write {mark}: Is a directory" in line,
                      timeout=30), "the failed mark"
    before = store.objects()
    b.stop(signal.SIGKILL)
    (data / "log" / "uploaded.tmp").rmdir()
    b = broker(**cfg)
    wait_until(lambda: uploaded(b) == 10, what="the mark after the restart")
    fig = b.stats()["upload"]
    assert (fig["batches"], fig["retries"], fig["alarm"]) == (1, 0, False), \
        "the 412 for the same bytes is a success"
    assert store.objects() == before
    check_exactly_once_s3(store, tmp_path, 10)
    b.stop()


def test_sigkill_at_random_points_under_load_lands_every_record_once(broker, store, tmp_path):
    cfg = dict(data_dir=str(tmp_path / "data"), log={"segment_bytes": 16384},
               upload=s3_config(store, batch_bytes=4096, batch_max_age=1))
    total = kill_while_shipping(broker, cfg, lambda: len(store.objects()), rounds=4, seed=230,
                                most=300)
    check_exactly_once_s3(store, tmp_path, total)


def test_link_down_then_back_resumes_within_30_s(broker, store, tmp_path):
    b = broker(upload=s3_config(store, batch_max_age=1))
    publish(b, 0, 5)
    wait_until(lambda: uploaded(b) == 5, what="the first batch")
    store.stop()
    publish(b, 5, 5)
    # until a back-off of more than 6 s is under way (the probe runs every 3 s)
    fig = wait_until(lambda: (lambda f: f if f["retry_in_seconds"] > 6 else None)(
        b.stats()["upload"]), timeout=90, what="a long back-off")
    assert fig["state"] == "retrying" and not fig["alarm"] and "no answer" in fig["last_error"]
    assert fig["uploaded_offset"] == 5 and fig["retries"] >= 1
    store.start()
    back = time.monotonic()
    wait_until(lambda: uploaded(b) == 10, timeout=30, what="uploading resumed")
    took = time.monotonic() - back
    assert took < fig["retry_in_seconds"], "resumed before the back-off ran out"
    assert b.wait_log(lambda line: "the upload store answers again" in line, timeout=5)
    print(f"uploading resumed {took:.1f} s after the store came back "
          f"(the back-off had {fig['retry_in_seconds']:.1f} s to go)")
    check_exactly_once_s3(store, tmp_path, 10)
    b.stop()


def test_missing_bucket_raises_the_alarm_keeps_the_data_and_resume_retries_at_once(
        broker, store, tmp_path):
    b = broker(upload=s3_config(store, bucket="no-such-bucket", batch_max_age=1))
    publish(b, 0, 6)
    wait_until(lambda: b.stats()["upload"]["alarm"], what="the alarm")
    fig = b.stats()["upload"]
    assert fig["uploaded_offset"] == 0 and fig["permanent_errors"] == 1
    assert "404 NoSuchBucket" in fig["last_error"] and fig["backlog_bytes"] > 0
    assert sum("upload alarm" in line for line in b.logs) == 1
    store.s3.create_bucket(Bucket="no-such-bucket")   # fixed; the next try is up to 60 s away
    data_dir = b.config["data_dir"]
    paused = run_cli("upload", "pause", "--data-dir", data_dir)
    assert paused.returncode == 0 and "upload paused" in paused.stdout, paused.stderr
    resumed = run_cli("upload", "resume", "--data-dir", data_dir)
    assert resumed.returncode == 0 and "upload resumed" in resumed.stdout, resumed.stderr
    wait_until(lambda: uploaded(b) == 6, timeout=10, what="the retry after resume")
    assert not b.stats()["upload"]["alarm"]
    assert sorted(store.objects("no-such-bucket")) and not store.objects()
    b.stop()


def test_wrong_secret_raises_the_alarm_keeps_the_data_and_the_right_one_lands_it(
        broker, store, iam_key, tmp_path):
    """Moto checks signatures: with a wrong secret every put is refused (403
    SignatureDoesNotMatch, permanent: the alarm, logged once, the data kept); after a restart
    with the right one, every record lands once."""
    key_id, secret = iam_key
    data = str(tmp_path / "data")
    up = s3_config(store, batch_max_age=1, access_key_id=key_id, secret_access_key="wrong")
    b = broker(data_dir=data, upload=up)
    publish(b, 0, 7)
    wait_until(lambda: b.stats()["upload"]["alarm"], what="the alarm")
    fig = b.stats()["upload"]
    assert "403 SignatureDoesNotMatch" in fig["last_error"] and fig["uploaded_offset"] == 0
    assert fig["backlog_bytes"] > 0 and sum("upload alarm" in line for line in b.logs) == 1
    b.stop()
    b = broker(data_dir=data, upload=dict(up, secret_access_key=secret))
    wait_until(lambda: uploaded(b) == 7, what="the upload with the right secret")
    assert not b.stats()["upload"]["alarm"]
    b.stop()
    with disable_iam_authentication():
        check_exactly_once_s3(store, tmp_path, 7)


def test_pause_holds_uploads_and_resume_ships_them(broker, store, tmp_path):
    b = broker(upload=s3_config(store, batch_max_age=1))
    data_dir = b.config["data_dir"]
    out = run_cli("upload", "pause", "--data-dir", data_dir)
    assert out.returncode == 0 and "upload paused" in out.stdout, out.stderr
    again = run_cli("upload", "pause", "--data-dir", data_dir)
    assert "already paused" in again.stdout
    publish(b, 0, 5)
    wait_until(lambda: b.stats()["upload"]["backlog_segments"] >= 1,
               what="the batch sealed by age")
    status = run_cli("upload", "status", "--data-dir", data_dir)
    assert "paused" in status.stdout
    # sealed and due, and still held: watch it over three of the uploader's polls
    watch_until = time.monotonic() + 1.5
    while time.monotonic() < watch_until:
        fig = b.stats()["upload"]
        assert fig["uploaded_offset"] == 0 and fig["paused"] and fig["state"] == "paused"
        time.sleep(0.1)
    assert not store.objects()
    prom = b.stats()
    assert prom["upload"]["paused"] is True
    out = run_cli("upload", "resume", "--data-dir", data_dir)
    assert out.returncode == 0 and "upload resumed" in out.stdout
    wait_until(lambda: uploaded(b) == 5, what="the batch after resume")
    assert not b.stats()["upload"]["paused"]
    check_exactly_once_s3(store, tmp_path, 5)
    b.stop()


def run_on_terminal(*args, timeout: float = 60.0) -> tuple[int, str, str]:
    """``edgebroker ARGS`` with standard error on a pseudo-terminal: (exit status, standard
    output, what the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*broker_command(), *args], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:   # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    stdout, _ = proc.communicate(timeout=timeout)
    return proc.returncode, stdout, shown.decode(errors="replace")


def test_run_once_ships_what_is_sealed_and_refuses_while_a_broker_runs(broker, store,
                                                                          tmp_path):
    data = tmp_path / "data"
    b = broker(data_dir=str(data), log={"segment_bytes": 8192})   # no uploading
    publish(b, 0, 300)
    config = tmp_path / "upload.toml"
    up = s3_config(store, batch_bytes=4096)
    config.write_text(f'data_dir = "{data}"\n[log]\nsegment_bytes = 8192\n[upload]\n' + "".join(
        f'{k} = "{v}"\n' if isinstance(v, str) else f"{k} = {v}\n" for k, v in up.items()))
    off = run_cli("upload", "pause", "--data-dir", str(data))
    assert off.returncode != 0 and "uploading is off" in off.stderr, off.stderr
    busy = run_cli("upload", "run", "--once", "-c", str(config))
    assert busy.returncode != 0 and "a running broker owns the log" in busy.stderr, busy.stderr
    assert not store.objects()
    b.stop()
    segs = sorted(int(p.stem) for p in (data / "log").glob("*.seg"))
    sealed_end = segs[-1]
    assert len(segs) >= 3
    rc, stdout, terminal = run_on_terminal("upload", "run", "--once", "-c", str(config))
    assert rc == 0, terminal
    assert f"uploaded up to offset {sealed_end}" in stdout, stdout
    batches = landed_s3(store, tmp_path)
    progress = [line for line in terminal.split("\r") if line.startswith("shipped ")]
    assert [int(line.split()[1]) for line in progress] == list(range(1, len(batches) + 1)), \
        "a progress line on the terminal, rewritten after each batch"
    assert sorted(r.offset for _, rs in batches.values() for r in rs) == list(range(sealed_end))
    status = run_cli("upload", "status", "--data-dir", str(data))
    assert f"uploaded up to offset {sealed_end}" in status.stdout
    again = run_cli("upload", "run", "--once", "-c", str(config), timeout=60)
    assert again.returncode == 0 and again.stdout.startswith("shipped 0 batches")
    assert "\r" not in again.stderr, "no progress line when stderr is not a terminal"
    again = json.loads(run_cli("upload", "run", "--once", "-c", str(config), "--format", "json",
                               timeout=60).stdout)
    assert (again["shipped_batches"], again["uploaded_offset"]) == (0, sealed_end)
    assert len(store.objects()) == len(batches)
