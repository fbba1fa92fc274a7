"""The bridges' TLS files, the uploader's CA file and the client's --cafile must be regular
files, as a TLS listener's must: OpenSSL's open of a FIFO waited for a writer, which blocked
serve's start and `config check`, and on SIGHUP the loop thread (no client was served)."""

import os
import shutil
import signal

import pytest

from certs import make_pki
from conftest import run_cli, toml_dumps

ERROR = "edgebroker: config error: "
S3 = {"url": "s3://bucket-x/p", "endpoint_url": "https://127.0.0.1:1",
      "access_key_id": "a", "secret_access_key": "b"}


def bridge(**tls) -> dict:
    return {"name": "up", "address": "127.0.0.1:1", "reconnect_min": 0.05,
            "reconnect_max": 0.5, "topic": [{"pattern": "a/#"}], **tls}


@pytest.fixture(autouse=True)
def no_aws_variables(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def cases(fifo, pki):
    ca, cert, key = str(pki.ca.cert), str(pki.client.cert), str(pki.client.key)
    return [
        ({"bridge": [bridge(cafile=fifo)]}, f"bridge[0] (up).cafile: {fifo}"),
        ({"bridge": [bridge(cafile=ca, certfile=fifo, keyfile=key)]},
         f"bridge[0] (up).certfile: {fifo}"),
        ({"bridge": [bridge(cafile=ca, certfile=cert, keyfile=fifo)]},
         f"bridge[0] (up).keyfile: {fifo}"),
        ({"upload": dict(S3, ca_file=fifo)}, f"upload.ca_file: {fifo}"),
    ]


@pytest.mark.parametrize("command", ["config check", "serve"])
@pytest.mark.parametrize("case", range(4))
def test_a_link_tls_file_that_is_a_fifo_is_refused(tmp_path, pki, command, case):
    fifo = tmp_path / "tls.fifo"
    os.mkfifo(fifo)
    tables, problem = cases(str(fifo), pki)[case]
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"),
                                "listener": [{"host": "127.0.0.1", "port": 0}], **tables}))
    r = run_cli(*command.split(), "-c", str(path), timeout=20)
    assert (r.returncode, r.stderr) == (2, f"{ERROR}{path}: {problem}: not a regular file\n")


def test_aws_ca_bundle_that_is_a_fifo_is_refused(tmp_path, monkeypatch):
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(fifo))
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "upload": S3}))
    r = run_cli("config", "check", "-c", str(path), timeout=20)
    assert (r.returncode, r.stderr) == (
        2, f"{ERROR}{path}: $AWS_CA_BUNDLE: {fifo}: not a regular file\n")


@pytest.mark.parametrize("table", ["bridge", "upload"])
def test_a_ca_file_replaced_by_a_fifo_fails_the_reload_and_the_broker_serves_on(
        broker, tmp_path, pki, uid, table):
    ca = tmp_path / "ca.pem"
    shutil.copy(pki.ca.cert, ca)
    tables = ({"bridge": [bridge(cafile=str(ca))]} if table == "bridge"
              else {"upload": dict(S3, ca_file=str(ca))})
    b = broker(**tables)
    os.unlink(ca)
    os.mkfifo(ca)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark, timeout=10)
    key = "bridge[0] (up).cafile" if table == "bridge" else "upload.ca_file"
    assert line and f"{key}: {ca}: not a regular file" in line, b.log_text()
    c = b.client(uid)
    c.subscribe(f"{uid}/t")
    c.publish(f"{uid}/t", b"served")
    assert c.recv_publish().payload == b"served"


def test_the_clients_cafile_that_is_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    r = run_cli("pub", "-p", "1", "--cafile", str(fifo), "-t", "a", "-m", "x", timeout=20)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"CA file {fifo}: not a regular file" in r.stderr, r.stderr
