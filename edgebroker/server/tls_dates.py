"""The dates of the TLS listeners' certificates and of the bridges' client certificates, checked
by `config check`, at start and at each reload (cli/serve.py): the broker starts with an expired
one (the clock may be wrong), and says so. Apart from server/tls.py, which holds the listeners'
transport."""

from __future__ import annotations

import time

from edgebroker.errors import ConfigError
from edgebroker.files import config_file_mode


def certificate_date_warnings(listeners, now: float | None = None,
                              bridges=()) -> list[str]:
    """A line for each TLS listener whose certificate has expired or is not valid yet
    (``listener[i].certfile``, the file, the date): the broker still starts with it, as the
    clock may be wrong, but clients refuse it (a botched renewal, say); the same for each
    bridge's client certificate (``bridge[i] (NAME).certfile``), which the remote refuses.
    Called by `config check`, at start and at each reload (cli/serve.py)."""
    warnings = []
    now = time.time() if now is None else now
    certificates = [(f"listener[{i}].certfile", lc.certfile, "clients refuse it")
                    for i, lc in enumerate(listeners) if lc.tls]
    certificates += [(f"bridge[{i}] ({bc.name}).certfile", bc.certfile, "the remote refuses it")
                     for i, bc in enumerate(bridges) if bc.cafile and bc.certfile]
    for key, path, refused in certificates:
        import ssl      # (OpenSSL: only with TLS in use, as server/tls.py's load_ssl)
        try:    # (CPython's decoder of a PEM file's first certificate, used by its tests)
            config_file_mode(path, "certfile")   # (a FIFO would block the open)
            cert = ssl._ssl._test_decode_cert(path)
            not_before = ssl.cert_time_to_seconds(cert["notBefore"])
            not_after = ssl.cert_time_to_seconds(cert["notAfter"])
        except (AttributeError, KeyError, OSError, ValueError, ConfigError):
            continue    # what make_context (or the bridge's tls_context) refuses, it names
        if now > not_after:
            warnings.append(f"{key}: {path}: the certificate expired on {utc(not_after)} "
                            f"(notAfter): {refused}")
        elif now < not_before:
            warnings.append(f"{key}: {path}: the certificate is not valid before "
                            f"{utc(not_before)} (notBefore): {refused}")
    return warnings


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
