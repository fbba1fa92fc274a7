"""docs/security.md's `openssl` recipe for a test CA, a server and a device certificate: the
block is run as the page has it, then the broker serves TLS with what it made, a client checks
the server's name against the CA, and a device logs in with its certificate (mosquitto_pub)."""

from __future__ import annotations

import re
import ssl
import subprocess

from conftest import REPO, run_cli, toml_dumps

HEADING = "### A test CA and certificates with `openssl`"


def recipe() -> str:
    """The first ```sh block after HEADING in docs/security.md."""
    page = (REPO / "docs" / "security.md").read_text()
    assert HEADING in page
    block = re.search(r"```sh\n(.*?)```", page[page.index(HEADING):], re.S)
    assert block, f"no sh block after {HEADING!r}"
    return block.group(1)


def test_the_recipe_makes_certificates_the_broker_and_clients_accept(broker, mosq, tmp_path, uid):
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", recipe()], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["server.crt: OK", "device-1.crt: OK"]
    tls = tmp_path / "tls"
    for key in ("ca.key", "server.key", "device-1.key"):
        assert (tls / key).stat().st_mode & 0o777 == 0o600
    server = {"certfile": str(tls / "server.crt"), "keyfile": str(tls / "server.key")}
    listeners = [
        {"host": "127.0.0.1", "port": 0, **server},
        {"host": "127.0.0.1", "port": 0, **server, "cafile": str(tls / "ca.crt"),
         "require_certificate": True, "use_identity_as_username": True},
    ]
    config = tmp_path / "tls.toml"
    config.write_text(toml_dumps({"data_dir": str(tmp_path / "data"), "listener": listeners}))
    check = run_cli("config", "check", "-c", str(config))
    assert check.returncode == 0, check.stderr
    b = broker(listener=listeners)
    (_, tls_port), (_, device_port) = b.listeners
    # A client that trusts only ca.crt and checks the name it asked for (gateway.local).
    trusting = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    sub = b.client(f"{uid}-sub", port=tls_port,
                   transport={"ssl_context": trusting, "server_hostname": "gateway.local"})
    sub.subscribe("devices/#", qos=1)
    assert sub.sock.getpeercert()["subject"] == ((("commonName", "gateway.local"),),)
    # A device with its certificate, as docs/security.md shows (checking 127.0.0.1 in the SAN);
    # its common name is its user name.
    pub = mosq("pub", device_port, "--cafile", str(tls / "ca.crt"), "--cert",
               str(tls / "device-1.crt"), "--key", str(tls / "device-1.key"),
               "-t", "devices/device-1/temp", "-m", "21.5", "-q", "1")
    assert pub.wait() == 0, pub.out.text()
    msg = sub.recv_publish()
    assert (msg.topic, msg.payload) == ("devices/device-1/temp", b"21.5")
    assert b.wait_log(lambda line: "(user 'device-1')" in line and " connected " in line)
