from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session", params=["in-process", "connect"])
def spark_engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The Spark checker, once in process (``local[*]``) and once through a Spark Connect server:
    every test that takes it runs both ways and must get the same results either way. The session
    is stopped when the test session ends (a Connect session is closed; its server stops with
    ``connect_server``)."""
    from spark_reports import check_spark, stop_session

    if request.param == "connect":
        url = request.getfixturevalue("connect_server")
        yield functools.partial(check_spark, spark_master=url)
    else:
        yield functools.partial(check_spark, spark_master="local[*]")
    stop_session()
