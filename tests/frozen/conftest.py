"""The one-file binary for the tests of this folder: built by ``make dist`` when missing or
older than the sources (``make test`` has already done so; a direct pytest run builds it here,
about 10 s). ``make test-arm64`` names another one in EDGEBROKER_BINARY (dist-arm64/edgebroker,
run through qemu-user with QEMU_LD_PREFIX at a root file system without Python)."""

import os
import signal
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


def assert_stopped_as_orphan(lines: list[str], text: str, parent: int) -> None:
    """The broker's log (``lines``, ``text``) after a SIGKILL of its parent ``parent``: one
    line saying so, then a clean stop (packaging/entry.py, server/app.py)."""
    gone = [ln for ln in lines if "is gone: stopping" in ln]
    assert len(gone) == 1 and gone[0].endswith(
        f"the parent process (pid {parent}, the one-file binary's bootloader) is gone: "
        f"stopping"), text
    assert "Traceback" not in text, text


def kill_quietly(pid: int | None) -> None:
    """SIGKILL to ``pid`` if there is one and it still runs (a test's clean-up)."""
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
