"""The Spark checker on a real Spark standalone cluster: a master and a worker started from the
installed pyspark on loopback, ``brokerchaos analyze --spark-master spark://...`` against a
stored run. The result must equal the local[*] one (checked on a copy of the run while the
cluster starts), and the work must have run in an executor on the worker (its status lists the
application's executor)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_reports.synth import HistoryBuilder, write_history
from tests.polling import until
from tests.ports import free_port

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return dict(json.loads(r.read()))


def _wait(what: str, probe: Any, proc: subprocess.Popen[bytes], log: Path) -> Any:
    """Poll until probe() returns something true (no deadline: tests/polling.py); a process that
    exits first fails the test with its log."""
    return until(
        probe,
        what,
        every=0.5,
        ignore=(OSError,),
        gone=lambda: (
            None
            if proc.poll() is None
            else f"the process exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        ),
    )


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(master URL, master status URL, worker status URL); both stopped at the end."""
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
    }
    port, ui, wport, wui = (free_port() for _ in range(4))
    master_url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mlog = tmp_path / "master.log"
        procs.append(_daemon(mlog, env, "master.Master", port, ui))
        master_json = f"http://127.0.0.1:{ui}/json/"
        _wait("master", lambda: _json(master_json).get("status") == "ALIVE", procs[0], mlog)
        wlog = tmp_path / "worker.log"
        procs.append(
            _daemon(wlog, env, "worker.Worker", wport, wui, master_url, "--cores", "1", "--memory", "2g")
        )
        _wait(
            "worker registered",
            lambda: any(w.get("state") == "ALIVE" for w in _json(master_json)["workers"]),
            procs[1],
            wlog,
        )
        yield master_url, master_json, f"http://127.0.0.1:{wui}/json/"
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _daemon(
    log: Path, env: dict[str, str], cls: str, port: int, ui: int, *args: str
) -> subprocess.Popen[bytes]:
    """A Spark standalone daemon (``org.apache.spark.deploy.`` ``cls``) on 127.0.0.1 at ``port``, its
    web UI at ``ui``, writing to ``log``."""
    host = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(_spark_class()), f"org.apache.spark.deploy.{cls}", *args, *host],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _stored_run(root: Path) -> Path:
    """A run with a loss, a duplicate, an unexpected id and a fault window: every table has rows."""
    d = root / "store" / "cluster" / "20240101T000000"
    d.mkdir(parents=True)
    h = HistoryBuilder()
    h.fault("f1", "kill", node="n2")
    for i in range(1, 41):
        h.publish(f"p1:{i}", "ok" if i % 7 else "info", node=f"n{1 + i % 3}")
    h.heal("f1")
    for i in range(3, 41):
        h.consume(f"p1:{i}", node=f"n{1 + i % 2}")
    h.consume("p1:5", node="n3")
    h.consume("x9:1")
    h.drain(consumed=39)
    write_history(d, h.rows, jsonl=False)
    (d / "scenario.json").write_text(json.dumps({"scenario": {"name": "cluster"}, "seed": 1}))
    return d


def _start_analyze(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "analyze",
            str(run_dir),
            "--checker",
            "spark",
            "--json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def _analysis(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate()
    assert proc.returncode in (0, 1), err[-3000:]
    return dict(json.loads(out))


def test_analyze_on_a_standalone_cluster_equals_local_and_runs_on_the_worker(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_dir = _stored_run(tmp_path)
    # The local[*] check needs no cluster: it runs while the master and the worker start, on a copy
    # of the run (analyze writes its results and report into the run directory).
    local_dir = tmp_path / "local" / run_dir.relative_to(tmp_path)
    shutil.copytree(run_dir, local_dir)
    local_proc = _start_analyze(local_dir)
    try:
        master_url, master_json, worker_json = request.getfixturevalue("standalone")
        remote = _analysis(_start_analyze(run_dir, "--spark-master", master_url))
    except BaseException:
        local_proc.kill()
        local_proc.communicate()
        raise
    local = _analysis(local_proc)
    assert local["verdict"] == "LOST" and local["counts"]["lost"] == 2 and local["counts"]["unexpected"] == 1
    assert remote == local
    apps = [
        a
        for a in _json(master_json).get("completedapps", []) + _json(master_json).get("activeapps", [])
        if a.get("name") == "brokerchaos-reconcile"
    ]
    assert apps, "the master saw no brokerchaos application"
    worker = _json(worker_json)
    ran_here = [
        e
        for e in worker.get("finishedexecutors", []) + worker.get("executors", [])
        if e.get("appid") in {a["id"] for a in apps}
    ]
    assert ran_here, f"no executor of {[a['id'] for a in apps]} on the worker: {worker}"
