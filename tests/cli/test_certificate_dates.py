"""A listener's certificate that has expired, or is not valid yet, gets a warning naming the
file and the date from `config check`, at start and at each reload: the broker still starts
(its clock may be the one that is wrong), but clients refuse the certificate. Before, a
botched renewal showed only as failed handshakes."""

import datetime
import shutil
import signal

from certs import CA
from conftest import run_cli, toml_dumps, default_config

NOW = datetime.datetime.now(datetime.timezone.utc)
EXPIRED = (datetime.datetime(2019, 1, 1, tzinfo=datetime.timezone.utc),
           datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
NOT_YET = (NOW + datetime.timedelta(days=3650), NOW + datetime.timedelta(days=3660))


def tls_listener(issued) -> dict:
    return {"host": "127.0.0.1", "port": 0, "certfile": str(issued.cert),
            "keyfile": str(issued.key)}


def test_config_check_warns_of_an_expired_certificate(tmp_path):
    ca = CA(tmp_path, "ca")
    expired = ca.issue("expired", "localhost", server=True, valid=EXPIRED)
    good = ca.issue("good", "localhost", server=True)
    config = dict(default_config(tmp_path), listener=[tls_listener(good), tls_listener(expired)])
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps(config))
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"warning: listener[1].certfile: {expired.cert}: the certificate expired on "
        f"2020-01-01 00:00:00 UTC (notAfter): clients refuse it"]


def test_start_and_reload_warn_of_certificate_dates(broker, tmp_path):
    ca = CA(tmp_path, "ca")
    expired = ca.issue("expired", "localhost", server=True, valid=EXPIRED)
    not_yet = ca.issue("not-yet", "localhost", server=True, valid=NOT_YET)
    good = ca.issue("good", "localhost", server=True)
    b = broker(listener=[tls_listener(expired)])
    assert any(line.endswith(f"WARNING listener[0].certfile: {expired.cert}: the certificate "
                             f"expired on 2020-01-01 00:00:00 UTC (notAfter): clients refuse it")
               for line in b.logs), b.log_text()
    # A renewal that copied in a certificate not valid yet (in place, the same path)
    shutil.copy(not_yet.cert, expired.cert)
    shutil.copy(not_yet.key, expired.key)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=10, start=mark), b.log_text()
    warned = [line for line in b.logs[mark:] if "certfile" in line]
    assert len(warned) == 1 and warned[0].endswith(
        f"WARNING listener[0].certfile: {expired.cert}: the certificate is not valid before "
        f"{NOT_YET[0]:%Y-%m-%d %H:%M:%S} UTC (notBefore): clients refuse it"), b.log_text()
    # ... and a good one: no warning
    shutil.copy(good.cert, expired.cert)
    shutil.copy(good.key, expired.key)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=10, start=mark), b.log_text()
    assert not any("certfile" in line for line in b.logs[mark:]), b.log_text()


def test_config_check_warns_of_a_bridge_client_certificate_out_of_its_dates(tmp_path):
    """The remote refuses it (SSLV3_ALERT_CERTIFICATE_EXPIRED was the first sign)."""
    ca = CA(tmp_path, "ca")
    expired = ca.issue("bridge-expired", "gateway", valid=EXPIRED)
    not_yet = ca.issue("bridge-not-yet", "gateway", valid=NOT_YET)
    good = ca.issue("bridge-good", "gateway")
    bridges = [{"name": name, "address": "127.0.0.1:8883", "cafile": str(ca.cert),
                "certfile": str(issued.cert), "keyfile": str(issued.key),
                "topic": [{"pattern": "s/#", "direction": "out"}]}
               for name, issued in (("good", good), ("old", expired), ("new", not_yet))]
    config = dict(default_config(tmp_path), bridge=bridges)
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps(config))
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"warning: bridge[1] (old).certfile: {expired.cert}: the certificate expired on "
        f"2020-01-01 00:00:00 UTC (notAfter): the remote refuses it",
        f"warning: bridge[2] (new).certfile: {not_yet.cert}: the certificate is not valid "
        f"before {NOT_YET[0]:%Y-%m-%d %H:%M:%S} UTC (notBefore): the remote refuses it"]
