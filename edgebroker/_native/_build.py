"""cffi build script for the C helper (API mode), run by setuptools through
``cffi_modules`` in setup.py: ``pip install -e .`` compiles ``csrc/`` into
``edgebroker/_native/_edgebroker_c*.so``.

The declarations come from ``csrc/edgebroker_native.h``, the one header both
the compiler and cffi read, so they cannot drift apart.
"""

from __future__ import annotations

import os
import pathlib

from cffi import FFI

_CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc"


def _rel(path: pathlib.Path) -> str:
    # setuptools wants source paths relative to the project directory when it can get them.
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


ffibuilder = FFI()
ffibuilder.cdef((_CSRC / "edgebroker_native.h").read_text())
ffibuilder.set_source(
    "edgebroker._native._edgebroker_c",
    "#include <stddef.h>\n#include <stdint.h>\n#include \"edgebroker_native.h\"\n",
    sources=[_rel(_CSRC / "edgebroker_native.c")],
    include_dirs=[_rel(_CSRC)],
    extra_compile_args=["-O3", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
