"""A TLS listener's certfile, keyfile and cafile must be regular files, as password_file and
acl_file must: a FIFO blocked start (and `config check`) in OpenSSL's open, and on SIGHUP the
loop thread, so no client was served; a device could be read without end."""

import os
import shutil
import signal
import subprocess

import pytest

from conftest import REPO, broker_command, run_cli, toml_dumps, without_root_file_access
from server.conftest import client_context


@pytest.mark.parametrize("key", ["certfile", "keyfile", "cafile"])
def test_a_tls_file_that_is_not_a_regular_file_is_refused(tmp_path, pki, key):
    fifo = tmp_path / "tls.fifo"
    os.mkfifo(fifo)
    for bad in (str(fifo), "/dev/zero"):
        lc = {"host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert),
              "keyfile": str(pki.server.key), "cafile": str(pki.ca.cert), key: bad}
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [lc]}))
        for command in ("serve", "config check"):
            r = run_cli(*command.split(), "-c", str(path), timeout=30)
            assert "Traceback" not in r.stderr, r.stderr
            assert (r.returncode, r.stderr.strip()) == (
                2, f"edgebroker: config error: {path}: listener[0].{key}: {bad}: not a regular "
                   f"file"), (command, r.stderr)


def test_a_certificate_replaced_by_a_fifo_fails_the_reload_and_the_broker_serves_on(
        broker, tmp_path, pki, uid):
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki.server.cert, live / "server.crt")
    shutil.copy(pki.server.key, live / "server.key")
    b = broker(listener=[{"host": "127.0.0.1", "port": 0, "certfile": str(live / "server.crt"),
                          "keyfile": str(live / "server.key")}])
    ctx = client_context(pki)
    os.unlink(live / "server.crt")
    os.mkfifo(live / "server.crt")
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark, timeout=10)
    assert line and f"listener[0].certfile: {live / 'server.crt'}: not a regular file" in line, \
        b.log_text()
    c = b.client(uid, transport={"ssl_context": ctx})
    c.subscribe(f"{uid}/t")
    c.publish(f"{uid}/t", b"served")
    assert c.recv_publish().payload == b"served"


def test_an_unreadable_keyfile_is_named_as_the_keyfile(tmp_path, pki):
    """The usual key: 0600, another user's (root's, with the broker run as the service's
    user). OpenSSL's error names no file, and it was reported as the certificate, which was
    readable."""
    shutil.copy(pki.server.cert, tmp_path / "server.crt")
    shutil.copy(pki.server.key, tmp_path / "server.key")
    os.chmod(tmp_path / "server.crt", 0o644)
    os.chmod(tmp_path / "server.key", 0o600)
    os.chown(tmp_path / "server.key", 65534, 65534)     # not this (root) process's
    lc = {"host": "127.0.0.1", "port": 0, "certfile": str(tmp_path / "server.crt"),
          "keyfile": str(tmp_path / "server.key")}
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "listener": [lc]}))
    for command in ("serve", "config check"):
        r = subprocess.run([*without_root_file_access(), *broker_command(), *command.split(),
                            "-c", str(path)], cwd=REPO, capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
        assert "Traceback" not in r.stderr, r.stderr
        assert (r.returncode, r.stderr.strip()) == (
            2, f"edgebroker: config error: {path}: listener[0].keyfile: {tmp_path / 'server.key'}: "
               f"cannot read: Permission denied"), (command, r.stderr)
