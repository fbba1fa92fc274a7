"""A broker without TLS listeners or password files does not load OpenSSL (`ssl`, `hashlib`):
about 5 MiB of memory a gateway keeps (docs/deploy.md, idle RSS). Seen in the process's
memory map, where each extension module loaded is a file."""

import os


def loaded_extensions(pid: int) -> set[str]:
    """Names of the shared objects mapped into ``pid`` (``_ssl``, ``libcrypto``, ...)."""
    names = set()
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            path = line.split()[-1]
            if ".so" in path:
                names.add(os.path.basename(path).split(".")[0])
    return names


def test_no_openssl_without_tls_or_passwords(broker):
    b = broker()
    c = b.client("lazy")                     # a client served: the whole path ran once
    c.disconnect()
    loaded = loaded_extensions(b.proc.pid)
    assert "_cffi_backend" in loaded, sorted(loaded)        # the map is read right
    assert not {"_ssl", "_hashlib", "libssl", "libcrypto"} & loaded, sorted(loaded)
