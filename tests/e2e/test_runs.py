"""End-to-end runs of the CLI against real clusters (Docker), as a user runs them. The reference
smoke run is made once for the file: one test reads it, another re-checks it with ``analyze``.
The smoke run's check starts its own JVM, as a user's first run does; the other Spark checks here
go to the test process's Spark Connect server (``spark_checked``)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import CliRun, cli, labelled, start_cli

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    """One reference smoke run with the default checker, read by two tests: the run itself, and
    ``analyze`` re-checking it (on a copy, so neither test sees what the other did)."""
    return cli(tmp_path_factory.mktemp("smoke") / "store", "run", "scenarios/smoke.yaml", "--duration", "8")


def test_reference_smoke_is_durable(smoke: CliRun) -> None:
    r = smoke
    assert r.code == 0, r.explain()
    res = r.results
    c = res["counts"]
    assert res["valid"] is True and c["lost"] == 0 and c["unexpected"] == 0
    r.assert_every_producer_confirmed()
    assert c["consumed_unique"] == c["confirmed"] + c["recovered"]
    assert (r.run_dir / "report.html").exists()
    assert (r.run_dir / "history.parquet").exists()
    assert (r.run_dir / "nodes" / "n1" / "broker.log").exists()
    assert "report" in r.proc.stdout and "durable" in r.proc.stdout


def test_rabbitmq_three_node_cluster_smoke(spark_checked) -> None:
    r = spark_checked("run", "scenarios/rabbitmq-smoke.yaml", "--duration", "10")
    assert r.code == 0, r.explain()
    c = r.results["counts"]
    # Messages were confirmed and none lost; how many a 10 s run confirms is the machine's speed
    # (344 of 2,000 offered on a loaded CI host), not a property of the broker or the harness.
    assert c["lost"] == 0 and c["confirmed"] > 0
    # The clients used all three members of the cluster.
    nodes = set()
    with (r.run_dir / "history.jsonl").open() as fh:
        for line in fh:
            op = json.loads(line)
            if op["f"] in ("publish", "consume") and op["type"] == "ok":
                nodes.add(op["node"])
    assert nodes == {"n1", "n2", "n3"}


def test_analyze_rechecks_a_stored_run(smoke: CliRun, tmp_path: Path, connect_server: str) -> None:
    """Through the Spark Connect server: the counts of the run's own check (a JVM of its own)."""
    assert smoke.code == 0, smoke.explain()
    run_dir = tmp_path / "store" / smoke.run_dir.parent.name / smoke.run_dir.name
    shutil.copytree(smoke.run_dir, run_dir, symlinks=True)
    before = json.loads((run_dir / "results.json").read_text())["counts"]
    a = cli(tmp_path / "store", "analyze", str(run_dir), spark_remote=connect_server)
    assert a.code == 0, a.explain()
    assert json.loads((run_dir / "results.json").read_text())["counts"] == before


def test_sigint_during_a_run_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = start_cli(tmp_path / "store", "run", "scenarios/smoke.yaml", "--duration", "120")
    run_id = None
    reached = False
    assert proc.stderr is not None
    for line in proc.stderr:  # ends if the run ends
        m = re.search(r"network (bc-[0-9a-f]+)", line)
        if m:
            run_id = m.group(1)
        if "workload" in line and "producers" in line:
            reached = True
            break
    assert reached, f"the run ended (exit {proc.wait()}) before its workload started"
    assert run_id is not None
    assert labelled(run_id)["containers"], "the run had started containers"
    history = tmp_path / "store" / "latest" / "history.jsonl"  # interrupt once messages are being confirmed
    while not (history.exists() and '"type":"ok","f":"publish"' in history.read_text()):
        assert proc.poll() is None, "the run ended before a publish was confirmed"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait() == 130
    assert labelled(run_id) == {"containers": [], "networks": [], "volumes": []}
