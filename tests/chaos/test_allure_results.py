"""Runs a small chaos session with ``--alluredir`` in a subprocess and checks the written
result files against Allure's result format (allure-results/*-result.json)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spark_reports.service.session import REMOTE_ENV
from tests.harness.allure_user import REPO, user_pytest

STATUSES = {"passed", "failed", "broken", "skipped", "unknown"}

USER_TESTS = """
import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.docker]


def test_smoke(chaos_run):
    chaos_run("scenarios/smoke.yaml", duration=3).assert_durable()


def test_power_loss_with_async_flush(chaos_run):
    chaos_run("scenarios/power-loss-async.yaml", duration=8,
              nemesis={"schedule": [{"at": 4, "fault": "power-loss", "hold": 1}], "settle": 1}).assert_durable()


def test_unknown_broker(chaos_run):
    chaos_run("scenarios/smoke.yaml", broker="no-such-broker")
"""


def _check_attachments(item: dict[str, Any], where: str, out: Path) -> list[str]:
    names = []
    for a in item.get("attachments", []):
        assert {"name", "source", "type"} <= set(a), f"{where}: attachment {a} lacks name/source/type"
        assert (out / a["source"]).is_file(), (
            f"{where}: attachment {a['name']!r} names {a['source']}, which is missing"
        )
        names.append(a["name"])
    return names


def _check_steps(steps: list[dict[str, Any]], where: str, out: Path) -> list[dict[str, Any]]:
    """Every step well formed; returns all steps, depth first."""
    flat = []
    for s in steps:
        assert s.get("name"), f"{where}: a step has no name"
        assert s.get("status") in STATUSES, f"{where}: step {s.get('name')!r} status {s.get('status')!r}"
        assert isinstance(s.get("start"), int) and isinstance(s.get("stop"), int), (
            f"{where}: {s['name']} times"
        )
        assert s["start"] <= s["stop"], f"{where}: step {s['name']!r} stops before it starts"
        for p in s.get("parameters", []):
            assert {"name", "value"} <= set(p), f"{where}: step {s['name']!r} parameter {p}"
        s["_attachments"] = _check_attachments(s, f"{where} / {s['name']}", out)
        flat.append(s)
        flat += _check_steps(s.get("steps", []), f"{where} / {s['name']}", out)
    return flat


def _run_step(result: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in result["steps"] if s["name"].startswith("run "))


@pytest.fixture(scope="module")
def allure_session(
    tmp_path_factory: pytest.TempPathFactory, connect_server: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The user's session, its Spark checks through this test process's Spark Connect server
    (``$BROKERCHAOS_SPARK_REMOTE``): the same steps and results, without a JVM of its own."""
    base = tmp_path_factory.mktemp("allure-session")
    (base / "test_user_chaos.py").write_text(USER_TESTS)
    out = base / "allure-results"
    proc = user_pytest(
        str(base / "test_user_chaos.py"),
        *("--alluredir", str(out), "--chaos-store", str(base / "store")),
        cwd=REPO,
        env={**os.environ, "CI": "true", REMOTE_ENV: connect_server},
        timeout=600,
    )
    return proc, out


@pytest.mark.docker
@pytest.mark.chaos
@pytest.mark.slow
def test_allure_results_follow_the_format(
    allure_session: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, out = allure_session
    assert proc.returncode == 1, (
        f"one test must fail, one error: exit {proc.returncode}\n{proc.stdout[-4000:]}"
    )
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*-result.json"))]
    by_name = {r["name"]: r for r in results}
    assert set(by_name) == {"test_smoke", "test_power_loss_with_async_flush", "test_unknown_broker"}, (
        proc.stdout
    )
    for r in results:
        for key in ("uuid", "name", "status", "labels", "steps", "start", "stop", "historyId", "fullName"):
            assert key in r, f"{r.get('name')}: no {key!r}"
        assert r["status"] in STATUSES
        assert all({"name", "value"} <= set(lb) for lb in r["labels"] if lb["name"] != "package")
        _check_attachments(r, r["name"], out)
        _check_steps(r["steps"], r["name"], out)
    for c in out.glob("*-container.json"):
        container = json.loads(c.read_text())
        for fx in container.get("befores", []) + container.get("afters", []):
            _check_attachments(fx, f"fixture {fx.get('name')}", out)
            _check_steps(fx.get("steps", []), f"fixture {fx.get('name')}", out)

    smoke = by_name["test_smoke"]
    assert smoke["status"] == "passed"
    labels = {(lb["name"], lb.get("value")) for lb in smoke["labels"]}
    assert {("epic", "reference"), ("feature", "no faults"), ("story", "smoke")} <= labels
    params = {p["name"]: p["value"] for p in smoke["parameters"]}
    assert params["seed"] == "1" and "broker" in params and "run_dir" in params
    steps = _check_steps(smoke["steps"], "smoke", out)
    names = [s["name"] for s in steps]
    for wanted in (
        "build images",
        "start cluster (1 node)",
        "workload and faults",
        "drain",
        "reconciliation",
    ):
        assert wanted in names, f"no step {wanted!r} in {names}"
    assert smoke["steps"][0]["name"] == "load scenario scenarios/smoke.yaml"
    run_step = _run_step(smoke)
    assert {"scenario", "results", "timeline plot", "loss attribution"} <= set(run_step["_attachments"])
    assert not any(a.endswith("broker.log") for a in run_step["_attachments"]), "logs only when a run fails"

    lossy = by_name["test_power_loss_with_async_flush"]
    assert lossy["status"] == "failed"
    message = lossy["statusDetails"]["message"]
    assert "not durable" in message and "loss attribution" in message and "power-loss" in message
    assert ("feature", "power-loss") in {(lb["name"], lb.get("value")) for lb in lossy["labels"]}
    assert {p["name"]: p["value"] for p in lossy["parameters"]}["seed"] == "5"
    steps = _check_steps(lossy["steps"], "lossy", out)
    fault_steps = [s for s in steps if "power-loss on n1" in s["name"]]
    assert fault_steps, [s["name"] for s in steps]
    fparams = {p["name"]: p["value"] for p in fault_steps[0]["parameters"]}
    assert {"time_s", "wall_time", "params", "done"} <= set(fparams) and "dropped_bytes" in fparams["done"]
    assert any(s["name"].startswith("heal f1") for s in steps)
    attached = _run_step(lossy)["_attachments"]
    assert "n1/broker.log" in attached and "harness.log" in attached, attached
    attribution = next(a for a in _run_step(lossy)["attachments"] if a["name"] == "loss attribution")
    assert "power-loss" in (out / attribution["source"]).read_text()

    broken = by_name["test_unknown_broker"]
    assert broken["status"] == "broken"
    assert "unknown broker plugin 'no-such-broker'" in broken["statusDetails"]["message"]
    assert "brokerchaos: unknown broker plugin" in proc.stdout, "a harness error is one line"
