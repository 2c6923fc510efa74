"""The Spark Connect service: where checks run, the server's state, and the command line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from spark_reports.service import connect as _spark_service
from spark_reports.service.session import REMOTE_ENV, check_master, check_remote, where
from tests.ports import free_port


@pytest.fixture
def no_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache directory with no server's state in it, and no Spark address in the environment."""
    monkeypatch.setenv("BROKERCHAOS_CACHE", str(tmp_path))
    monkeypatch.delenv(REMOTE_ENV, raising=False)
    monkeypatch.delenv("BROKERCHAOS_SPARK_MASTER", raising=False)
    return tmp_path


def test_without_a_service_checks_run_in_process(no_service: Path) -> None:
    assert where() == "local[*]"


def test_an_address_given_beats_the_environment_which_beats_the_default(
    no_service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROKERCHAOS_SPARK_MASTER", "local[1]")
    assert where() == "local[1]"
    monkeypatch.setenv(REMOTE_ENV, "sc://spark.example:15002")
    assert where() == "sc://spark.example:15002"  # a Connect server before a master
    assert where("local[2]") == "local[2]"
    assert where("sc://other:1") == "sc://other:1"


@pytest.mark.parametrize("bad", ["http://host:15002", "sc://", "sc://:15002", "host:15002"])
def test_a_malformed_connect_address_is_refused_with_what_to_give(bad: str) -> None:
    with pytest.raises(ValueError, match=r"give sc://HOST:PORT"):
        check_remote(bad)


def test_a_connect_address_is_a_master_the_checks_accept() -> None:
    check_master("sc://127.0.0.1:15002")
    check_remote("sc://127.0.0.1:15002")
    check_remote(None)


def test_the_state_of_a_server_that_is_gone_is_forgotten(no_service: Path) -> None:
    # This test's own process: alive, but no Spark Connect server.
    state = {"url": "sc://127.0.0.1:1", "pid": os.getpid(), "port": 1, "started": 0, "log": "x"}
    _spark_service.state_file().write_text(json.dumps(state))
    assert _spark_service.status() is None
    assert not _spark_service.state_file().exists()
    assert _spark_service.local_url() is None
    assert _spark_service.stop() is None


def test_spark_status_without_a_server_says_so_and_exits_1(
    no_service: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-q", "spark", "status"]) == 1
    assert "no Spark Connect server is up" in capsys.readouterr().out


def test_spark_stop_without_a_server_says_so(no_service: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "spark", "stop"]) == 0
    assert capsys.readouterr().out.strip() == "no Spark Connect server was up"


def test_a_bad_spark_remote_is_one_line_and_exit_2(
    no_service: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(tmp_path), "--spark-remote", "http://h:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sc://HOST:PORT" in err[0], err


def test_a_spark_remote_nobody_listens_on_is_one_line_and_exit_2_before_anything_starts(
    no_service: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PySpark's client would retry such an address for minutes; a run would find out at its check."""
    port = free_port()  # nobody listens on it
    url = f"sc://127.0.0.1:{port}"
    for command in (["analyze", str(tmp_path)], ["run", "scenarios/partitions.yaml"]):
        assert main([*command, "--spark-remote", url]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"brokerchaos: no Spark Connect server answers at {url}: start one with `brokerchaos spark "
            f"start`, or give another address (--spark-remote or {REMOTE_ENV})"
        ], err


def test_spark_without_an_action_is_a_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark"]) == 2
    assert "brokerchaos spark start|status|stop" in capsys.readouterr().err


@pytest.mark.spark
def test_default_parallelism_read_with_a_dataframe_is_spark_contexts() -> None:
    from spark_reports import spark_session
    from spark_reports.service.session import default_parallelism

    spark = spark_session("local[*]")
    assert default_parallelism(spark) == spark.sparkContext.defaultParallelism


@pytest.mark.spark
@pytest.mark.slow
def test_checks_find_the_local_server_while_it_is_up(
    connect_state: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no address given, the server whose state is in the cache directory is where checks
    run, and its default parallelism (read over Connect, where there is no SparkContext) is its
    local[*]'s: one per core."""
    from spark_reports import spark_session
    from spark_reports.service.session import default_parallelism

    home, state = connect_state
    monkeypatch.setenv("BROKERCHAOS_CACHE", str(home))
    monkeypatch.delenv(REMOTE_ENV, raising=False)
    monkeypatch.delenv("BROKERCHAOS_SPARK_MASTER", raising=False)
    up = _spark_service.status()
    assert up is not None and up["pid"] == state["pid"]
    assert where() == state["url"]
    spark = spark_session()
    assert type(spark).__module__ == "pyspark.sql.connect.session"
    assert default_parallelism(spark) == os.cpu_count()
