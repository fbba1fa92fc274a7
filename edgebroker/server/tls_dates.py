"""The dates of the TLS listeners' certificates, checked by `config check`, at start and at each
reload (cli/serve.py): the broker starts with an expired one (the clock may be wrong), and says
so. Apart from server/tls.py, which holds the listeners' transport."""

from __future__ import annotations

import time

from edgebroker.errors import ConfigError
from edgebroker.files import config_file_mode


def certificate_date_warnings(listeners, now: float | None = None) -> list[str]:
    """A line for each TLS listener whose certificate has expired or is not valid yet
    (``listener[i].certfile``, the file, the date): the broker still starts with it, as the
    clock may be wrong, but clients refuse it (a botched renewal, say). Called by `config
    check`, at start and at each reload (cli/serve.py)."""
    warnings = []
    now = time.time() if now is None else now
    for i, lc in enumerate(listeners):
        if not lc.tls:
            continue
        import ssl      # (OpenSSL: only with a TLS listener, as server/tls.py's load_ssl)
        try:    # (CPython's decoder of a PEM file's first certificate, used by its tests)
            config_file_mode(lc.certfile, "certfile")   # (a FIFO would block the open)
            cert = ssl._ssl._test_decode_cert(lc.certfile)
            not_before = ssl.cert_time_to_seconds(cert["notBefore"])
            not_after = ssl.cert_time_to_seconds(cert["notAfter"])
        except (AttributeError, KeyError, OSError, ValueError, ConfigError):
            continue    # what make_context refuses, it names
        if now > not_after:
            warnings.append(f"listener[{i}].certfile: {lc.certfile}: the certificate expired "
                            f"on {utc(not_after)} (notAfter): clients refuse it")
        elif now < not_before:
            warnings.append(f"listener[{i}].certfile: {lc.certfile}: the certificate is not "
                            f"valid before {utc(not_before)} (notBefore): clients refuse it")
    return warnings


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
