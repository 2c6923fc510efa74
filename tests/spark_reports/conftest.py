from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port


@pytest.fixture(scope="session")
def connect_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A real Spark Connect server (``brokerchaos spark start``'s), on a free port, its state kept
    in a temporary directory (so no check that is not given its address finds it): that directory
    and the state. Stopped at the end."""
    from spark_reports.service import connect as _spark_service

    home: Path = tmp_path_factory.mktemp("spark-connect")
    state = _spark_service.start(free_port(), home=home)
    try:
        yield home, state
    finally:
        _spark_service.stop(home=home)


@pytest.fixture(scope="session")
def connect_server(connect_state: tuple[Path, dict[str, Any]]) -> str:
    """The server's address, ``sc://127.0.0.1:PORT``."""
    return str(connect_state[1]["url"])


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
