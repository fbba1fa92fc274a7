"""The modules a broker run as the unit runs it (``serve -c systemd/edgebroker.toml``) has
loaded from its start to its stop with no client, against the list below: a change that makes
an idle broker import more fails here, cheaply and without timing anything. The memory itself
is measured by `make dist-measure` (packaging/measure.py, docs/deploy.md: idle RSS ≤ 20 MB).
A module that must be there at idle is added to the list in the same change, with the new
figure of `make dist-measure` in docs/deploy.md; one no longer imported is taken out. (The
standard library's modules count by their top-level name, see ``new_at_idle``.)"""

import os
import site
import sys
from pathlib import Path

from conftest import REPO

MODULES_AT_EXIT = Path(__file__).resolve().parents[1] / "modules_at_exit.py"
UNIT_CONFIG = REPO / "systemd" / "edgebroker.toml"

IDLE = set("""
__future__ _bisect _cffi_backend _collections _functools _heapq _json _locale _operator _socket
_sre _string _struct _weakrefset argparse array atexit binascii bisect collections
collections.abc contextlib copyreg enum errno fcntl functools gc gettext heapq importlib
importlib._bootstrap importlib._bootstrap_external itertools json json.decoder json.encoder
json.scanner keyword linecache logging math mmap operator pwd re re._casefix re._compiler
re._constants re._parser reprlib resource select selectors signal socket string struct textwrap
threading token tokenize traceback types warnings weakref zlib
edgebroker edgebroker._native edgebroker._native._cbackend edgebroker._native._common
edgebroker._native._edgebroker_c edgebroker._native._edgebroker_c.lib edgebroker.cli
edgebroker.cli.main edgebroker.cli.options edgebroker.cli.serve edgebroker.cli.state_owner
edgebroker.commitlog edgebroker.commitlog.appender edgebroker.commitlog.errors
edgebroker.commitlog.file_set edgebroker.commitlog.flusher edgebroker.commitlog.format
edgebroker.commitlog.log edgebroker.commitlog.reader edgebroker.commitlog.recovery
edgebroker.commitlog.retention edgebroker.commitlog.scanner edgebroker.commitlog.segment
edgebroker.commitlog.spare edgebroker.commitlog.sync
edgebroker.config edgebroker.config_fields edgebroker.core edgebroker.core.broker
edgebroker.core.catchup edgebroker.core.catchup_run edgebroker.core.client
edgebroker.core.cursor edgebroker.core.dispatch edgebroker.core.exchange_restore
edgebroker.core.exchanges
edgebroker.core.filter_set edgebroker.core.handlers edgebroker.core.handlers.acks
edgebroker.core.handlers.auth edgebroker.core.handlers.connect edgebroker.core.handlers.publish
edgebroker.core.handlers.subscribe edgebroker.core.journal edgebroker.core.limits
edgebroker.core.memory edgebroker.core.metrics edgebroker.core.mqtt5
edgebroker.core.persistence edgebroker.core.resume edgebroker.core.retained
edgebroker.core.retention_moves
edgebroker.core.router edgebroker.core.router5 edgebroker.core.session edgebroker.core.sessions
edgebroker.core.shared edgebroker.core.shared_backlog edgebroker.core.shared_state
edgebroker.core.snapshot edgebroker.core.snapshot_entries edgebroker.core.snapshot_reserve
edgebroker.core.snapshot_retained edgebroker.core.snapshot_state edgebroker.core.stats
edgebroker.core.throttling
edgebroker.core.timers edgebroker.core.violations edgebroker.core.will_state
edgebroker.core.wills edgebroker.errors edgebroker.files edgebroker.limits_config
edgebroker.listener_config edgebroker.logs edgebroker.mqtt edgebroker.mqtt.connect
edgebroker.mqtt.decode edgebroker.mqtt.decode5 edgebroker.mqtt.encode edgebroker.mqtt.encode5
edgebroker.mqtt.fields edgebroker.mqtt.packets edgebroker.mqtt.properties
edgebroker.mqtt.repeat edgebroker.mqtt.stream edgebroker.mqtt.topics edgebroker.mqtt.trie
edgebroker.rates edgebroker.records edgebroker.security edgebroker.security.authenticator
edgebroker.security.policy edgebroker.server edgebroker.server.activation
edgebroker.server.admin edgebroker.server.app edgebroker.server.contention
edgebroker.server.descriptors edgebroker.server.filechunk edgebroker.server.framing
edgebroker.server.handshakes edgebroker.server.listeners edgebroker.server.loop
edgebroker.server.peers edgebroker.server.poller edgebroker.server.sdnotify
edgebroker.server.sniff edgebroker.server.transport edgebroker.toml_file edgebroker.upload_config
""".split())


def test_an_idle_broker_under_the_units_config_loads_only_the_listed_modules(
        broker, monkeypatch, tmp_path):
    out = tmp_path / "modules"
    monkeypatch.setenv("EDGEBROKER_TEST_BROKER", f"{sys.executable} -S {MODULES_AT_EXIT} {out}")
    monkeypatch.setenv("EDGEBROKER_TEST_SITE", os.pathsep.join(site.getsitepackages()))
    monkeypatch.setenv("LANG", "C.UTF-8")      # as systemd gives it (gettext imports locale)
    b = broker(raw_config=UNIT_CONFIG.read_text(),
               args=["--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")])
    assert b.stop() == 0
    loaded = set(out.read_text().split())
    assert "edgebroker.server.app" in loaded           # the list is the broker's
    assert sorted(new_at_idle(loaded)) == [], "new at idle: see the docstring"


def new_at_idle(loaded: set[str]) -> set[str]:
    """The loaded modules not on the list. The standard library's are compared by their
    top-level name (``re`` for ``re._parser``): how a package splits into submodules, and
    which private C parts it uses, changes between Python versions; the project's modules
    and every other one exactly."""
    stdlib = sys.stdlib_module_names
    listed_top = {name.split(".")[0] for name in IDLE}
    return {name for name in loaded - IDLE
            if name.split(".")[0] not in stdlib or name.split(".")[0] not in listed_top}


def test_the_comparison_names_a_new_module_and_ignores_a_standard_packages_parts():
    assert new_at_idle(IDLE | {"re._newpart", "edgebroker.cli.inspect"}) == {
        "edgebroker.cli.inspect"}
    assert new_at_idle(IDLE | {"ssl", "_ssl", "zstandard"}) == {"ssl", "_ssl", "zstandard"}
