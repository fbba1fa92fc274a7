"""A broker imports only what its configuration uses: without TLS listeners or password files
it does not load OpenSSL (`ssl`, `hashlib`: about 5 MiB of memory a gateway keeps), without a
WebSocket listener no wsproto, and never the modules of the other commands, psutil (Linux:
/proc), typing or the standard library's heavier helpers (docs/deploy.md, idle RSS; the budget
itself is measured by `make dist-measure`). Seen in the process's memory map, where each
extension module loaded is a file, and in the modules it imported over its life."""

import os
import signal
import site
import subprocess
import sys
from pathlib import Path

from edgebroker import toml_file
from secfiles import write_passwords

# Modules (and their submodules) a plain broker never imports: one MQTT listener, no config
# file, password file or [upload]. What they would cost: docs/deploy.md, "Budgets".
NEVER_PLAIN = {
    "ssl", "_ssl", "hashlib", "hmac",              # TLS listeners, password files
    "edgebroker.server.tls",                       # TLS listeners
    "edgebroker.security.passwords", "queue",      # password files (and their checks)
    "edgebroker.security.acl",                     # ACL files
    "edgebroker.bridge_config",                    # [[bridge]] tables
    "wsproto", "h11",                              # WebSocket listeners
    "concurrent.futures",                          # password checks
    "zstandard", "edgebroker.uploader",            # [upload] url
    "psutil",                                      # /proc on Linux
    "edgebroker.cli.inspect", "edgebroker.cli.inspect_live", "edgebroker.cli.inspect_sessions",
    "edgebroker.cli.inspect_common", "edgebroker.cli.upload",
    "edgebroker.cli.passwd", "edgebroker.cli.config_check", "getpass",
    "typing", "tomllib", "datetime",               # the TOML parser, unloaded once read
    "tempfile", "shutil", "random", "bz2", "lzma", "uuid", "platform", "ipaddress", "base64",
    "difflib",                                     # a config key's "did you mean"
    "edgebroker.security.scram", "secrets",        # SCRAM exchanges, password files
    "stringprep", "unicodedata",
    "subprocess", "multiprocessing", "ctypes", "pickle", "zipfile",
    "dataclasses", "inspect", "ast", "dis",       # edgebroker.records instead
    "edgebroker.cli.state_dir",                    # the other commands' state directory
    "edgebroker.core.snapshot_damage",             # a snapshot that cannot be used
    "edgebroker.core.snapshot_decode",             # a snapshot to read at the start
    "edgebroker.core.retained_side",               # retained messages to write, or read
    "edgebroker.commitlog.verify",                 # a log check (inspect verify, a reader)
    "locale",                                      # argparse's gettext with $LANG set
}
# Imported by the first reload (SIGHUP) only.
UNTIL_RELOADED = {"edgebroker.server.reload"}
MODULES_AT_EXIT = Path(__file__).resolve().parents[1] / "modules_at_exit.py"


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


def test_the_toml_parser_leaves_no_shared_object_mapped(broker):
    """datetime's and typing's C parts, which the TOML parser would load, stay mapped once
    loaded (0.2 MB): their Python fallbacks are used, and unloaded with it."""
    b = broker()
    assert b.config_path is not None
    loaded = loaded_extensions(b.proc.pid)
    assert "_cffi_backend" in loaded, sorted(loaded)
    assert not {"_datetime", "_typing"} & loaded, sorted(loaded)


def among(loaded: set[str], names: set[str]) -> list[str]:
    """The modules of ``loaded`` that are one of ``names`` or inside one of them."""
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in names))


def modules_of_a_life(broker, monkeypatch, out: Path, **start) -> set[str]:
    """The modules a broker started with ``start`` imported from its start to its exit, after
    serving a client (``client``: its CONNECT's login) that connects with an empty client id
    (assigned one) and publishes at QoS 1."""
    monkeypatch.setenv("EDGEBROKER_TEST_BROKER", f"{sys.executable} -S {MODULES_AT_EXIT} {out}")
    monkeypatch.setenv("EDGEBROKER_TEST_SITE", os.pathsep.join(site.getsitepackages()))
    login = start.pop("client", {})
    b = broker(**start)
    c = b.client("", **login)
    c.publish("lazy/t", b"x", qos=1)
    c.disconnect()
    assert b.stop() == 0
    return set(out.read_text().split())


def test_plain_broker_imports_only_what_it_uses(broker, monkeypatch, tmp_path):
    monkeypatch.setenv("LANG", "C.UTF-8")      # (gettext imports locale then)
    loaded = modules_of_a_life(broker, monkeypatch, tmp_path / "modules", config_file=False,
                               args=["--listen", "127.0.0.1:0", "--data-dir",
                                     str(tmp_path / "data")])
    assert {"edgebroker.server.app", "json", "logging"} <= loaded     # the list is the broker's
    assert among(loaded, NEVER_PLAIN | UNTIL_RELOADED) == []


def test_a_config_file_leaves_no_toml_parser_behind(broker, monkeypatch, tmp_path):
    """The TOML parser and what only it imports (typing, datetime) are unloaded once the file
    is read (toml_file); a reload (SIGHUP) keeps them (unloading takes a full garbage
    collection, which in a running broker holds the loop: docs/deploy.md), nothing else."""
    monkeypatch.setenv("EDGEBROKER_TEST_BROKER",
                       f"{sys.executable} -S {MODULES_AT_EXIT} {tmp_path / 'modules'}")
    monkeypatch.setenv("EDGEBROKER_TEST_SITE", os.pathsep.join(site.getsitepackages()))
    b = broker()
    assert b.config_path is not None
    mark = b.mark()
    b.proc.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=10, start=mark), b.log_text()
    c = b.client("")
    c.publish("lazy/t", b"x", qos=1)
    c.disconnect()
    assert b.stop() == 0
    loaded = set((tmp_path / "modules").read_text().split())
    assert "edgebroker.server.app" in loaded
    assert UNTIL_RELOADED <= loaded     # the reload's module, at the SIGHUP
    parser = {"tomllib", "typing", "datetime"}
    assert "tomllib" in loaded
    assert among(loaded, NEVER_PLAIN) == among(loaded, parser)


def test_a_config_file_read_at_the_start_only_leaves_no_toml_parser_behind(
        broker, monkeypatch, tmp_path):
    loaded = modules_of_a_life(broker, monkeypatch, tmp_path / "modules")
    assert "edgebroker.server.app" in loaded
    assert among(loaded, {"tomllib", "typing", "datetime"}) == []


def test_the_toml_parser_is_never_imported_into_the_broker(broker, monkeypatch, tmp_path):
    """At the start of serve the configuration file is parsed in a child process
    (toml_file): the TOML parser, which imported and unloaded again leaves about 0.2 MB of
    the broker's memory behind (docs/deploy.md), is never the broker's; what the file says
    is used (its listener serves)."""
    out = tmp_path / "modules"
    loaded = modules_of_a_life(broker, monkeypatch, out)
    imported = set((tmp_path / "modules.imported").read_text().split())
    assert "edgebroker.server.app" in loaded and "edgebroker.toml_file" in imported
    assert among(imported, {"tomllib", "typing", "datetime"}) == []


def test_retained_messages_and_a_snapshot_to_read_import_the_snapshots_other_modules(
        broker, monkeypatch, tmp_path):
    """The side file's code (core.retained_side) comes with a snapshot holding retained
    messages, the document's reader (core.snapshot_decode) with a snapshot to read: a plain
    broker imports neither (NEVER_PLAIN)."""
    data = tmp_path / "data"
    monkeypatch.setenv("EDGEBROKER_TEST_BROKER",
                       f"{sys.executable} -S {MODULES_AT_EXIT} {tmp_path / 'modules'}")
    monkeypatch.setenv("EDGEBROKER_TEST_SITE", os.pathsep.join(site.getsitepackages()))
    b = broker(data_dir=str(data))
    c = b.client("keeper")
    c.publish("lazy/kept", b"x", qos=1, retain=True)
    c.disconnect()
    assert b.stop() == 0
    first = set((tmp_path / "modules").read_text().split())
    assert "edgebroker.core.retained_side" in first
    assert "edgebroker.core.snapshot_decode" not in first     # (no snapshot at its start)
    again = broker(data_dir=str(data))
    c = again.client("reader")
    c.subscribe("lazy/kept", qos=1)
    assert c.recv_publish().payload == b"x"      # (restored from the side file)
    c.disconnect()
    assert again.stop() == 0
    second = set((tmp_path / "modules").read_text().split())
    assert {"edgebroker.core.snapshot_decode", "edgebroker.core.retained_side"} <= second


def test_what_is_configured_is_imported(broker, monkeypatch, tmp_path):
    """The other side: a WebSocket listener brings wsproto (and with it dataclasses), a password
    file (and a login) hashlib and the password check workers."""
    passwords = write_passwords(tmp_path / "passwd", {"alice": "secret"})
    loaded = modules_of_a_life(
        broker, monkeypatch, tmp_path / "modules", password_file=str(passwords),
        listener=[{"host": "127.0.0.1", "port": 0},
                  {"host": "127.0.0.1", "port": 0, "protocol": "websockets"}],
        client={"username": "alice", "password": "secret"})
    assert {"wsproto", "dataclasses", "hashlib", "concurrent.futures",
            "edgebroker.security.passwords", "queue"} <= loaded
    assert among(loaded, {"ssl", "psutil", "zstandard", "edgebroker.cli.inspect"}) == []


def test_the_toml_parser_blocks_only_c_parts_this_python_can_do_without():
    """toml_file blocks a C part (the Python fallback is loaded and unloaded with the
    parser) only where the module has a fallback: Python 3.12's typing.py needs _typing, and
    blocking it there made every command that reads a configuration file fail."""
    for name, last in toml_file.C_PARTS.items():
        module = {"_datetime": "datetime", "_typing": "typing"}[name]
        code = f"import sys; sys.modules[{name!r}] = None; import {module}"
        run = subprocess.run([sys.executable, "-I", "-c", code], stderr=subprocess.DEVNULL)
        works = run.returncode == 0
        assert works == (sys.version_info[:2] <= last), (name, sys.version_info)
