"""The brokers people run today, each in a smoke-sized run from Debian sid (one extra root
filesystem for all of them): the run ends with a verdict, and records the version the running
broker reported, not the one the scenario asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def _short(tmp_path: Path, scenario: str, **workload: Any) -> Path:
    data = yaml.safe_load(open(scenario))
    data["workload"].update(duration=8, **workload)
    data["checkers"] = ["python"]  # the point is the broker version, not the engine
    out = tmp_path / Path(scenario).name
    out.write_text(yaml.safe_dump(data))
    return out


def _durable_on(brokerchaos, tmp_path: Path, scenario: str, running: str) -> Any:
    r = brokerchaos("run", str(_short(tmp_path, scenario)))
    assert r.code == 0, r.explain()
    res: dict[str, Any] = r.results
    assert res["verdict"] == "durable" and res["counts"]["confirmed"] > 0
    assert res["broker"]["running"].startswith(running), res["broker"]
    assert f"broker                  {running}" in r.proc.stdout  # the terminal says it too
    return r


def test_nats_2_15(brokerchaos, tmp_path: Path) -> None:
    res = _durable_on(brokerchaos, tmp_path, "scenarios/nats-2.15-smoke.yaml", "nats-server 2.15.").results
    assert res["broker"]["version"] == "2.15" and res["broker"]["suite"] == "sid"


def test_valkey_9_1(brokerchaos, tmp_path: Path) -> None:
    r = _durable_on(brokerchaos, tmp_path, "scenarios/valkey-9.1-smoke.yaml", "valkey 9.1.")
    again = brokerchaos("analyze", str(r.run_dir), "--checker", "python")  # re-checked, it keeps the version
    assert again.code == 0 and "broker                  valkey 9.1." in again.proc.stdout, again.explain()


def test_rabbitmq_4_3_quorum_on_khepri(brokerchaos, tmp_path: Path) -> None:
    _durable_on(brokerchaos, tmp_path, "scenarios/rabbitmq-4.3-quorum-smoke.yaml", "rabbitmq 4.3.")
