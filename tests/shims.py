"""The fault libraries of tests/faults/ (loaded into a broker or a script with LD_PRELOAD),
built for one test."""

from __future__ import annotations

import subprocess
from pathlib import Path

FAULTS = Path(__file__).parent / "faults"


def build(name: str, directory: Path) -> Path:
    """Compile ``tests/faults/<name>.c`` into ``directory``; the library's path."""
    lib = directory / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(FAULTS / f"{name}.c"),
                    "-ldl"], check=True)
    return lib
