"""The pytest plugin without Docker: scenario overrides, the loss table, options and markers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.allure_report import attribution_text
from harness.errors import ScenarioError
from harness.outcome import ChaosResult, ChaosSeries, loss_table
from harness.scenario import build as build_scenario

REPO = Path(__file__).resolve().parents[2]


def test_overrides_apply_to_a_scenario_file() -> None:
    sc = build_scenario(
        "scenarios/crash.yaml",
        root=REPO,
        seed=9,
        duration=4,
        nodes=2,
        workload={"rate": 50},
        nemesis={"schedule": [{"at": 1, "fault": "kill", "hold": 1}]},
    )
    assert (sc.seed, sc.workload.duration, sc.broker.nodes, sc.workload.rate) == (9, 4.0, 2, 50.0)
    assert sc.workload.producers == 2, "workload overrides merge into the file's section"
    assert [s.fault for s in sc.nemesis.schedule] == ["kill"]
    assert sc.broker.settings == {"flush": "sync"}
    assert sc.source and sc.source.endswith("scenarios/crash.yaml")


def test_another_broker_drops_the_scenarios_broker_settings() -> None:
    sc = build_scenario("scenarios/crash.yaml", root=REPO, broker="rabbitmq")
    assert sc.broker.plugin == "rabbitmq" and sc.broker.settings == {}
    sc = build_scenario("scenarios/crash.yaml", root=REPO, broker="rabbitmq", settings={"ha_mode": "all"})
    assert sc.broker.settings == {"ha_mode": "all"}


def test_bad_overrides_name_the_field() -> None:
    with pytest.raises(ScenarioError, match="workload.rate"):
        build_scenario({"broker": {"plugin": "reference"}}, workload={"rate": "fast"})
    with pytest.raises(ScenarioError, match="workload.duration"):
        build_scenario({"broker": {"plugin": "reference"}}, duration=-1)
    with pytest.raises(ScenarioError, match="does not exist"):
        build_scenario("scenarios/nope.yaml", root=REPO)


def _lossy_results() -> dict:
    return {
        "valid": False,
        "verdict": "LOST",
        "reason": "2 confirmed messages never consumed",
        "counts": {
            "attempted": 10,
            "confirmed": 10,
            "failed": 0,
            "unknown": 0,
            "consumed_unique": 8,
            "lost": 2,
            "unexpected": 0,
            "duplicated": 0,
            "recovered": 0,
            "order_violations": 0,
        },
        "attribution": {
            "rows": [{"fault_kind": "power-loss", "node": "n1", "count": 2}],
            "exposure": [{"fault_kind": "power-loss", "confirmed": 6, "lost": 2}],
            "messages": [
                {
                    "id": "p1:7",
                    "confirm_node": "n1",
                    "confirm_ns": 4_200_000_000,
                    "fault_ids": ["f1"],
                    "fault_kinds": ["power-loss"],
                },
                {
                    "id": "p1:8",
                    "confirm_node": "n1",
                    "confirm_ns": 4_300_000_000,
                    "fault_ids": ["f1"],
                    "fault_kinds": ["power-loss"],
                },
            ],
        },
    }


def test_assert_durable_raises_the_loss_table(tmp_path: Path) -> None:
    sc = build_scenario("scenarios/power-loss-async.yaml", root=REPO, seed=11)
    bad = ChaosResult(sc, _lossy_results(), tmp_path)
    with pytest.raises(AssertionError) as info:
        bad.assert_durable()
    text = str(info.value)
    assert "'power-loss-async' (broker reference, seed 11) is not durable: LOST" in text
    assert "power-loss       n1     lost        2" in text, "the attribution row"
    assert "p1:7" in text and "confirmed by n1 at 4.200s, faults: f1" in text
    assert "--seed 11" in text and str(tmp_path) in text
    assert text == loss_table(sc, _lossy_results(), tmp_path)

    good = ChaosResult(sc, {"valid": True, "verdict": "durable"}, tmp_path)
    assert good.assert_durable() is good
    unknown = ChaosResult(sc, {"valid": "unknown", "verdict": "unknown"}, tmp_path)
    with pytest.raises(AssertionError, match="not durable: unknown"):
        unknown.assert_durable()
    series = ChaosSeries([good, bad])
    with pytest.raises(AssertionError, match="1 of 2 seeded runs are not durable"):
        series.assert_durable()
    assert ChaosSeries([good, good]).assert_durable().durable


def test_attribution_text_lists_rows_and_exposure() -> None:
    text = attribution_text(_lossy_results())
    assert "verdict: LOST  lost: 2" in text
    assert "power-loss        n1      lost          2" in text and "power-loss        6" in text
    empty = attribution_text({"valid": True, "counts": {"lost": 0}, "attribution": {}})
    assert "(no lost, unreachable or stuck messages)" in empty


def _unreachable_results() -> dict:
    """``_lossy_results`` where the final drain did not complete: the two are unreachable."""
    r = _lossy_results()
    r |= {"valid": "unknown", "verdict": "unknown", "reason": "2 confirmed messages unconsumed"}
    r["counts"] = r["counts"] | {"lost": 0, "unreachable": 2, "stuck": 0}
    a = r["attribution"]
    a["rows"] = [{"fault_kind": "power-loss", "node": "n1", "status": "unreachable", "count": 2}]
    a["exposure"] = [{"fault_kind": "power-loss", "confirmed": 6, "lost": 0, "unreachable": 2, "stuck": 0}]
    a["messages"] = [m | {"status": "unreachable"} for m in a["messages"]]
    return r


def test_unreachable_messages_are_not_called_lost(tmp_path: Path) -> None:
    """A run that counts 0 lost and 2 unreachable shows rows of 2 unreachable, not 2 lost, in the
    terminal's loss table and in Allure's attribution text."""
    sc = build_scenario("scenarios/power-loss-async.yaml", root=REPO, seed=11)
    text = loss_table(sc, _unreachable_results(), tmp_path)
    assert "loss attribution (fault kind, node that confirmed, class, messages):" in text
    assert "power-loss       n1     unreachable 2" in text
    assert "exposure (fault kind, confirmed while it could hit, lost, unreachable):" in text
    assert "power-loss       6        0    2" in text
    assert "unreachable messages (first 2 of 2):" in text
    assert "lost messages" not in text
    allure_text = attribution_text(_unreachable_results())
    assert "lost: 0  unreachable: 2  stuck: 0" in allure_text
    assert "power-loss        n1      unreachable   2" in allure_text
    assert f"{'power-loss':<18}{6:<20}{0:<6}2" in allure_text
    old = _lossy_results()  # results made before rows had a class: their counts say which
    old["counts"] = old["counts"] | {"lost": 0, "unreachable": 2}
    assert "power-loss       n1     unreachable 2" in loss_table(sc, old, tmp_path)


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_plugin_registers_options_and_markers() -> None:
    proc = _pytest("--markers")
    assert "@pytest.mark.chaos: a chaos scenario run end to end (brokerchaos)" in proc.stdout
    helptext = _pytest("--help").stdout
    for opt in ("--broker", "--chaos-seed", "--chaos-runs", "--chaos-duration", "--chaos-store"):
        assert opt in helptext
    bad = _pytest("--chaos-runs", "0", "--collect-only", "-q", "tests/harness/test_pytest_plugin.py")
    assert bad.returncode == 4 and "--chaos-runs must be at least 1" in bad.stderr


def test_a_harness_error_fails_the_test_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        "def test_unknown_broker(chaos_run):\n"
        "    chaos_run('scenarios/smoke.yaml', broker='no-such-broker')\n"
    )
    proc = _pytest("-q", str(tmp_path / "test_user.py"))
    assert proc.returncode == 1
    assert "\nbrokerchaos: unknown broker plugin 'no-such-broker'; loaded:" in proc.stdout
    assert "Traceback" not in proc.stdout and "harness/host.py" not in proc.stdout


def test_broker_at_a_version_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        "def test_smoke(chaos_run):\n    chaos_run('scenarios/smoke.yaml')\n"
    )
    proc = _pytest("-q", "--broker", "rabbitmq@5.0", str(tmp_path / "test_user.py"))
    assert proc.returncode == 1
    assert (
        "\nbrokerchaos: broker.version: '5.0' is not a version of rabbitmq; use one of 3.10, 4.0, 4.3"
        in proc.stdout
    )
    assert "Traceback" not in proc.stdout
