"""Every test in this directory runs twice: on the C helper and on its pure-Python twin.

The autouse fixture switches ``edgebroker._native`` (in this process) and sets
``EDGEBROKER_NATIVE`` (for subprocesses such as the CLI tests). When the C build is missing the
``c`` runs fail with NativeUnavailableError instead of being skipped: CI must build it.
"""

from __future__ import annotations

import pytest

from edgebroker import _native


@pytest.fixture(params=["c", "python"], autouse=True)
def native_backend(request, monkeypatch):
    before = _native.BACKEND
    _native.set_backend(request.param)
    monkeypatch.setenv("EDGEBROKER_NATIVE", request.param)
    yield request.param
    _native.set_backend(before)
