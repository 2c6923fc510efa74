from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark_engine():
    """One Spark session for every Spark test; stopped when the test session ends."""
    from spark_reports import check_spark, stop_session

    yield check_spark
    stop_session()
