"""The core reaches a connection's transport only through the declared protocol
(core/transport.py): every attribute the core's code names on a transport is one the protocol
lists, the core assigns none of them, and every transport (the server's plain stream, the
WebSocket framing, the core's fake) has them all."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from edgebroker.core.testing import FakeTransport
from edgebroker.core.client import CLOSED
from edgebroker.core.transport import Transport
from edgebroker.server.framing import Framing
from edgebroker.server.tls import TLSTransport
from edgebroker.server.transport import Transport as StreamTransport

CORE = Path(__file__).resolve().parents[2] / "edgebroker" / "core"
MEMBERS = set(typing.get_type_hints(Transport)) | {
    name for name, value in vars(Transport).items() if callable(value) and not name.startswith("_")}


def _uses():
    """(file:line, attribute, stored) for each ``<...>transport.<attribute>`` in core/."""
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            if (isinstance(value, ast.Name) and value.id == "transport"
                    or isinstance(value, ast.Attribute) and value.attr == "transport"):
                yield (f"{path.name}:{node.lineno}", node.attr,
                       isinstance(node.ctx, (ast.Store, ast.Del)))


def test_the_protocol_lists_what_the_core_uses():
    assert {"write", "offer", "write_file", "close", "pause_reading"} <= MEMBERS
    uses = list(_uses())
    assert len(uses) > 20   # the walk finds the core's uses (a rename would make this vacuous)
    unknown = [f"{where} .{attr}" for where, attr, _ in uses if attr not in MEMBERS]
    assert not unknown, "the core uses transport attributes the protocol does not list:\n" + \
        "\n".join(unknown)


def test_the_core_writes_no_transport_field():
    # An assignment, ``+=`` or ``del`` on a transport's attribute is a store.
    stored = [f"{where} .{attr}" for where, attr, store in _uses() if store]
    assert not stored, "the core assigns transport fields:\n" + "\n".join(stored)


def _has(cls_or_obj, name: str) -> bool:
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    slots = {s for klass in cls.__mro__ for s in getattr(klass, "__slots__", ())}
    return name in slots or hasattr(cls_or_obj, name)


def test_every_transport_has_every_member():
    for impl in (StreamTransport, TLSTransport, Framing, FakeTransport(), CLOSED):
        missing = sorted(name for name in MEMBERS if not _has(impl, name))
        assert not missing, f"{impl} lacks {missing}"
