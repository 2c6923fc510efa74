"""Helpers for end-to-end runs: the real CLI, real Docker, a private run store."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.history import read_jsonl
from harness.spec.rundir import HISTORY_JSONL
from spark_reports.service.session import REMOTE_ENV

REPO = Path(__file__).resolve().parents[2]


class CliRun:
    def __init__(self, proc: subprocess.CompletedProcess[str], store: Path) -> None:
        self.proc = proc
        self.store = store
        latest = store / "latest"
        self._run_dir = latest.resolve() if latest.exists() else None

    @property
    def code(self) -> int:
        return self.proc.returncode

    @property
    def run_dir(self) -> Path:
        """This invocation's run (``store/latest`` right after it finished)."""
        assert self._run_dir is not None, "the command created no run"
        return self._run_dir

    @property
    def results(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "results.json").read_text())

    def explain(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.proc.stdout[-3000:]}\n--- stderr\n{self.proc.stderr[-5000:]}"

    def assert_every_producer_confirmed(self) -> None:
        """The workload ran: every producer that published had some of its publishes confirmed
        (how many depends on the machine's load, not on the broker, so no count is asked)."""
        published: set[str] = set()
        confirmed: set[str] = set()
        for op in read_jsonl(self.run_dir / HISTORY_JSONL):
            if op["f"] == "publish":
                (confirmed if op["type"] == "ok" else published).add(op["process"])
        assert published and published <= confirmed, (
            f"no publish confirmed for {sorted(published - confirmed)}"
        )

    def assert_lost_nothing(self) -> None:
        """The run passed, with nothing confirmed lost, and every producer had publishes confirmed."""
        assert self.code == 0, self.explain()
        assert self.results["counts"]["lost"] == 0
        self.assert_every_producer_confirmed()

    def assert_lost_some(self) -> dict[str, Any]:
        """The run failed (exit 1) and lost confirmed messages; its results, for what else the test asks."""
        assert self.code == 1, self.explain()
        res = self.results
        assert res["counts"]["lost"] > 0, self.explain()
        return res


def _env(store: Path, spark_remote: str | None) -> dict[str, str]:
    remote = {REMOTE_ENV: spark_remote} if spark_remote else {}
    return {**os.environ, "BROKERCHAOS_STORE": str(store), **remote}


def cli(store: Path, *args: str, timeout: float = 900, spark_remote: str | None = None) -> CliRun:
    """``brokerchaos ARGS`` as a user types it, its runs kept in ``store``; ``spark_remote``: the
    Spark Connect server its Spark checks go to (as ``$BROKERCHAOS_SPARK_REMOTE`` says)."""
    proc = subprocess.run(
        ["brokerchaos", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(store, spark_remote),
        cwd=REPO,
    )
    return CliRun(proc, store)


def start_cli(
    store: Path, *args: str, stdout: int = subprocess.PIPE, spark_remote: str | None = None
) -> subprocess.Popen[str]:
    """``brokerchaos ARGS`` started and left running (to be interrupted), its runs kept in ``store``."""
    return subprocess.Popen(
        ["brokerchaos", *args],
        cwd=REPO,
        env=_env(store, spark_remote),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def _runner(store: Path, spark_remote: str | None = None):
    def run(*args: str, timeout: float = 900) -> CliRun:
        return cli(store, *args, timeout=timeout, spark_remote=spark_remote)

    return run


@pytest.fixture
def brokerchaos(tmp_path: Path):
    return _runner(tmp_path / "store")


@pytest.fixture
def spark_checked(tmp_path: Path, connect_server: str):
    """``brokerchaos`` for runs checked by Spark (the default checker): their checks go to the test
    process's one Spark Connect server (tests/conftest.py's ``connect_server``), the same engine
    through Connect, instead of a JVM started and warmed up by each run on the busy machine. The
    run whose check starts its own JVM, as a user's first run does, is test_runs.py's ``smoke``;
    that the two ways give the same results is tests/spark_reports/'s ``spark_engine``'s."""
    return _runner(tmp_path / "store", connect_server)


@pytest.fixture
def shipped(brokerchaos):
    """``shipped(NAME)``: a shipped scenario as it is (``scenarios/NAME.yaml``), checked by the Python engine."""

    def run(name: str) -> CliRun:
        return brokerchaos("run", f"scenarios/{name}.yaml", "--checker", "python")

    return run


def labelled(run_id: str | None = None, *, owner_pid: int | None = None) -> dict[str, list[str]]:
    """What the engine holds of the project: of one run, or of the runs of one harness process
    (other tests' runs may be under way on the same engine)."""
    import docker

    from harness.cluster import OWNER_PID_LABEL

    client = docker.from_env()
    flt = (
        ["brokerchaos.project=brokerchaos"]
        + ([f"brokerchaos.run={run_id}"] if run_id else [])
        + ([f"{OWNER_PID_LABEL}={owner_pid}"] if owner_pid is not None else [])
    )
    # Sorted: the engine lists in no fixed order.
    return {
        "containers": sorted(c.name for c in client.containers.list(all=True, filters={"label": flt})),
        "networks": sorted(n.name for n in client.networks.list(filters={"label": flt})),
        "volumes": sorted(v.name for v in client.volumes.list(filters={"label": flt})),
    }
