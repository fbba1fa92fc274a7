"""One local[2] SparkSession for each Spark test module (a JVM costs seconds to start)."""

from __future__ import annotations

import pytest

from sparklocal import local_session


@pytest.fixture(scope="module")
def spark():
    session = local_session("edgebroker-tests")
    yield session
    session.stop()
