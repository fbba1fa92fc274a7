"""The one-file binary for the tests of this folder: built by ``make dist`` when missing or
older than the sources (``make test`` has already done so; a direct pytest run builds it here,
about 10 s). ``make test-arm64`` names another one in EDGEBROKER_BINARY (dist-arm64/edgebroker,
run through qemu-user with QEMU_LD_PREFIX at a root file system without Python)."""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

BINARY = REPO / "dist" / "edgebroker"


@pytest.fixture(scope="module")
def binary():
    given = os.environ.get("EDGEBROKER_BINARY")
    if given:
        path = Path(given).resolve()
        assert path.is_file() and os.access(path, os.X_OK), f"EDGEBROKER_BINARY={given}: not an executable file"
        return path
    r = subprocess.run(["make", "-s", "dist"], cwd=REPO, capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"make dist failed:\n{r.stdout}\n{r.stderr}"
    assert BINARY.is_file() and os.access(BINARY, os.X_OK)
    return BINARY
