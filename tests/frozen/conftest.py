"""The one-file binary for the tests of this folder: built by ``make dist`` when missing or
older than the sources (``make test`` has already done so; a direct pytest run builds it here,
about 10 s)."""

import os
import subprocess

import pytest

from conftest import REPO

BINARY = REPO / "dist" / "edgebroker"


@pytest.fixture(scope="module")
def binary():
    r = subprocess.run(["make", "-s", "dist"], cwd=REPO, capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"make dist failed:\n{r.stdout}\n{r.stderr}"
    assert BINARY.is_file() and os.access(BINARY, os.X_OK)
    return BINARY
