"""The package's layers (the architecture page's "Layers"): each imports only the ones above it,
and no module imports itself back through others (no import cycle), lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "edgebroker"

# Top to bottom: a module may import its own layer's modules and those of the layers above.
LAYERS = [
    {"edgebroker", "edgebroker.errors", "edgebroker.config", "edgebroker.config_fields",
     "edgebroker.toml_file",
     "edgebroker.upload_config", "edgebroker.listener_config", "edgebroker.bridge_config",
     "edgebroker.limits_config",
     "edgebroker.logs", "edgebroker.records", "edgebroker.files", "edgebroker.rates"},
    {"edgebroker.mqtt"},
    {"edgebroker.client"},    # the client library: imports errors, config and mqt/ only
    {"edgebroker._native"},
    {"edgebroker.commitlog"},
    {"edgebroker.uploader"},
    {"edgebroker.spark"},     # the central side: below the uploader, and nothing else imports it
    {"edgebroker.security"},
    {"edgebroker.core"},
    {"edgebroker.bridge"},    # upstream MQTT: log consumers over the client library
    {"edgebroker.server"},
    {"edgebroker.cli", "edgebroker.__main__"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its text (functions too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _layer(name: str) -> int:
    best = None
    for i, members in enumerate(LAYERS):
        for m in members:
            if name == m or name.startswith(m + ".") and m != "edgebroker":
                best = i
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best


def test_every_module_imports_only_its_layer_and_those_above():
    wrong = []
    for name, targets in sorted(_graph().items()):
        if name == "edgebroker":
            continue  # the package's own __init__ (__version__, __native_backend__) is no layer
        for t in sorted(targets):
            if t == "edgebroker":
                continue
            if _layer(t) > _layer(name):
                wrong.append(f"{name} imports {t}")
    assert not wrong, "imports from a lower layer:\n" + "\n".join(wrong)


def test_nothing_of_the_gateway_imports_the_spark_package():
    wrong = [f"{name} imports {t}" for name, targets in sorted(_graph().items())
             if not name.startswith("edgebroker.spark")
             for t in sorted(targets) if t.startswith("edgebroker.spark")]
    assert not wrong, "the gateway must run without pyspark:\n" + "\n".join(wrong)


def test_no_import_cycle():
    graph = _graph()
    # Packages import their modules from __init__ (re-exports); a module importing its own
    # package's __init__ is then no cycle of concepts, so package -> own member edges are left out.
    edges = {n: {t for t in ts if not (t.startswith(n + "."))} for n, ts in graph.items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for t in sorted(edges.get(n, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_brokers_parts_define_no_name_twice():
    """``Broker`` is made of parts (mixins over its state, one concept per file): a method or
    attribute two parts define would make one of them call the other's, silently."""
    from edgebroker.core.broker import Broker
    owners: dict[str, list[str]] = {}
    for part in Broker.__mro__[:-1]:
        for name in vars(part):
            if not name.startswith("__"):
                owners.setdefault(name, []).append(part.__name__)
    twice = {name: parts for name, parts in owners.items() if len(parts) > 1}
    assert not twice, f"defined by more than one part of Broker: {twice}"
