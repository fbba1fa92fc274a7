"""Every test in this directory runs twice: on the C helper and on its pure-Python twin
(the ``native_backend`` fixture of tests/conftest.py, made autouse here)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _each_backend(native_backend):
    yield native_backend
