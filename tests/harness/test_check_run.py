"""Composing checker verdicts on a stored run (no Docker), and the exit status they map to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness import hookimpl
from harness.history import Recorder
from harness.host import Host
from harness.runner import check_run
from harness.spec import Evidence
from harness.spec.history import EVIDENCE
from harness.spec.results import EXIT_DURABLE, EXIT_FAILED, EXIT_NO_FAULT_BIT, EXIT_UNKNOWN
from harness.store import RunDir
from harness.verdicts import exit_code, verdict_line

Checker = Callable[..., dict[str, Any]]


class CheckerPlugin:
    """Registers the given checkers through the same hook as spark_reports."""

    def __init__(self, table: dict[str, Checker]) -> None:
        self.table = table

    @hookimpl
    def brokerchaos_register_checkers(self, register: Any) -> None:
        for name, fn in self.table.items():
            register.add_checker(name, fn)


VALID = {"durable": True, "unknown": "unknown"}


def verdict(v: Any, **extra: Any) -> Checker:
    def check(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
        assert (run_dir / "history.parquet").exists(), "checkers read the Parquet history"
        return {"valid": VALID.get(v, False), "verdict": v, "counts": {"attempted": 1}, **extra}

    return check


def boom(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    raise ValueError("column missing")


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    rd = RunDir.create(tmp_path, "s")
    rec = Recorder(rd.history_jsonl)
    rec.invoke("p1", "publish", queue="q", value="p1:1").ok()
    rec.close()
    return rd


def host_with(table: dict[str, Checker]) -> Host:
    h = Host.load(entry_points=False)
    h.register(CheckerPlugin(table), "fake-checkers")
    return h


@pytest.mark.parametrize(
    ("verdicts", "want"),
    [
        (["durable"], "durable"),
        (["LOST"], "LOST"),
        (["unknown"], "unknown"),
        (["durable", "durable"], "durable"),
        (["durable", "INTEGRITY"], "INTEGRITY"),
        (["LOST", "unknown"], "LOST"),
        (["unknown", "DUPLICATED"], "DUPLICATED"),
        (["durable", "unknown"], "unknown"),
        (["durable", None], "unknown"),  # a checker that returned no verdict
        (["durable", "True"], "unknown"),  # nor one this schema names
        (["INTEGRITY", "LOST"], "LOST"),
    ],
)
def test_composition_rules(run_dir: RunDir, verdicts: list[Any], want: Any) -> None:
    table = {f"c{i}": verdict(v) for i, v in enumerate(verdicts)}
    res = check_run(host_with(table), run_dir, {"name": "s"}, list(table))
    assert res["verdict"] == want
    assert res["valid"] == (True if want == "durable" else "unknown" if want == "unknown" else False)
    assert exit_code(res) == {"durable": 0, "unknown": 3}.get(want, 1)
    assert list(res["checkers"]) == list(table)
    for name, v in zip(table, verdicts, strict=True):
        assert res["checkers"][name]["verdict"] == v


def test_a_failing_second_checker_decides_the_run(run_dir: RunDir) -> None:
    """Issue 32: the queue checker says durable, a second one INTEGRITY; the run is INTEGRITY,
    its reason names the second checker, and that checker's findings are kept."""
    example = {"queue": "q", "replicas": {"n1": {"messages": 3}, "n2": {"messages": 2}}}
    table = {
        "queue": verdict("durable", reason="every one of 1 confirmed messages was consumed", timeline={}),
        "stream": verdict(
            "INTEGRITY",
            counts={"diverged_streams": 1},
            anomalies={"diverged_streams": [example], "gaps": []},
            reason="1 stream whose replicas disagree",
        ),
    }
    res = check_run(host_with(table), run_dir, {}, list(table))
    assert (res["verdict"], res["valid"], exit_code(res)) == ("INTEGRITY", False, 1)
    assert res["reason"] == "stream: 1 stream whose replicas disagree (also checked: queue durable)"
    assert res["counts"] == {"attempted": 1}  # the body is the queue checker's
    assert res["checkers"]["queue"]["reason"] == "every one of 1 confirmed messages was consumed"
    assert res["checkers"]["stream"]["anomalies"]["diverged_streams"] == [example]
    assert "anomalies" not in res["checkers"]["queue"]


def test_the_body_is_the_queue_results_whatever_the_order(run_dir: RunDir) -> None:
    table = {"small": verdict("durable", counts={"streams": 1}), "queue": verdict("durable", timeline={})}
    res = check_run(host_with(table), run_dir, {}, list(table))
    assert res["counts"] == {"attempted": 1} and "timeline" in res
    assert res["checkers"]["small"]["counts"] == {"streams": 1}


def test_a_checker_that_raises_is_unknown_with_the_error(run_dir: RunDir) -> None:
    res = check_run(host_with({"ok": verdict("durable"), "boom": boom}), run_dir, {}, ["ok", "boom"])
    assert (res["valid"], res["verdict"]) == ("unknown", "unknown")
    assert res["checkers"]["boom"] == {
        "valid": "unknown",
        "verdict": "unknown",
        "reason": None,
        "counts": None,
        "error": "ValueError: column missing",
        "engine": None,
        "notes": [],
    }
    assert res["reason"] == "boom: checker boom failed: ValueError: column missing (also checked: ok durable)"
    assert res["counts"] == {"attempted": 1}  # the first checker's detail is the combined result's
    res = check_run(host_with({"boom": boom, "bad": verdict("LOST")}), run_dir, {}, ["boom", "bad"])
    assert (res["valid"], res["verdict"]) == (False, "LOST")
    res = check_run(host_with({"boom": boom}), run_dir, {}, ["boom"])
    assert (res["verdict"], res["error"]) == ("unknown", "ValueError: column missing")


def test_the_history_is_converted_and_phases_reported(run_dir: RunDir) -> None:
    phases: list[str] = []

    def phase(name: str, fn: Callable[[], Any]) -> Any:
        phases.append(name)
        return fn()

    check_run(
        host_with({"a": verdict("durable"), "b": verdict("durable")}), run_dir, {}, ["a", "b"], phase=phase
    )
    assert phases == ["history", "check", "check"]
    assert pq.read_table(run_dir.history_parquet).num_rows == 2


def test_a_checker_is_configured_through_the_hook_not_by_name(run_dir: RunDir) -> None:
    """The harness calls every checker alike; a checker's settings (e.g. a Spark master) come
    from ``brokerchaos_configure``, so no harness module names a checker."""
    seen: list[Any] = []

    class Configured(CheckerPlugin):
        master: str | None = None

        @hookimpl
        def brokerchaos_configure(self, config: dict[str, Any]) -> None:
            self.master = config.get("spark_master")

    def spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
        seen.append(plugin.master)
        return {"valid": True, "verdict": "durable", "engine": "spark"}

    plugin = Configured({"spark": spark})
    host = Host()
    host.register(plugin, "configured")
    host.configure({"spark_master": "spark://h:7077", "store": Path("/tmp")})
    res = check_run(host, run_dir, {}, ["spark"])
    assert seen == ["spark://h:7077"]
    assert res["checkers"]["spark"]["engine"] == "spark"


def test_scenario_is_passed_through(run_dir: RunDir) -> None:
    seen: list[Any] = []

    def spy(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
        seen.append(scenario)
        return {"valid": True}

    check_run(host_with({"spy": spy}), run_dir, {"name": "x", "seed": 3}, ["spy"])
    assert seen == [{"name": "x", "seed": 3}]


def test_python_checker_on_a_stored_run(tmp_path: Path, host: Host) -> None:
    """The shipped pure-Python checker through check_run: a confirmed message never consumed is lost."""
    for consumed, want in ((True, True), (False, False)):
        rd = RunDir.create(tmp_path, f"s{consumed}")
        rec = Recorder(rd.history_jsonl)
        rec.invoke("p1", "publish", node="n1", queue="chaos-1", value="p1:1").ok()
        drain = rec.invoke("d1", "drain", node="n1", queue="chaos-1", value={})
        if consumed:
            rec.invoke("d1", "consume", node="n1", queue="chaos-1").ok("p1:1", redelivered=False)
            rec.invoke("d1", "ack", node="n1", queue="chaos-1", value="p1:1").ok()  # consumed = acked ok
        drain.ok({"consumed": int(consumed)})
        rec.close()
        res = check_run(host, rd, {"name": "s", "checkers": ["python"]}, ["python"])
        assert res["valid"] is want, res
        assert res["verdict"] == ("durable" if want else "LOST")


@pytest.mark.parametrize(
    ("results", "code"),
    [
        ({"verdict": "durable", "valid": True}, EXIT_DURABLE),
        ({"verdict": "INTEGRITY", "valid": False}, EXIT_FAILED),
        ({"verdict": "unknown"}, EXIT_UNKNOWN),
        ({"valid": True}, EXIT_UNKNOWN),  # the verdict decides, never valid alone
        ({}, EXIT_UNKNOWN),
    ],
)
def test_exit_code(results: dict[str, Any], code: int) -> None:
    assert exit_code(results) == code


def test_each_checker_line_says_how_long_after_the_drain_it_finished(
    run_dir: RunDir, capsys: pytest.CaptureFixture[str]
) -> None:
    import re
    import time

    drained_at = time.monotonic() - 5.0  # the drain returned five seconds before the check began
    check_run(host_with({"a": verdict("durable")}), run_dir, {}, ["a"], drained_at=drained_at)
    out = capsys.readouterr()
    [line] = [x for x in (out.out + out.err).splitlines() if "checker a: durable" in x]
    m = re.search(r"in ([0-9.]+)s \(([0-9.]+)s after the drain\)", line)
    assert m is not None, line
    assert float(m.group(2)) >= 5.0 and float(m.group(2)) >= float(m.group(1))
    check_run(host_with({"a": verdict("durable")}), run_dir, {}, ["a"])  # analyze: no drain in this process
    assert "after the drain" not in "".join(capsys.readouterr())


@pytest.mark.parametrize(
    ("effects", "checker_verdict", "want"),
    [
        ([False], "durable", EXIT_NO_FAULT_BIT),
        ([False, False], "durable", EXIT_NO_FAULT_BIT),
        ([False, True], "durable", EXIT_DURABLE),  # one fault bit: the run tested something
        ([False, None], "durable", EXIT_NO_FAULT_BIT),
        ([None], "durable", EXIT_DURABLE),  # nothing says it missed
        ([], "durable", EXIT_DURABLE),  # no fault planned
        ([False], "LOST", EXIT_FAILED),
        ([False], "unknown", EXIT_UNKNOWN),
    ],
)
def test_a_durable_run_none_of_whose_faults_bit_exits_4(
    tmp_path: Path, effects: list[bool | None], checker_verdict: str, want: int
) -> None:
    rd = RunDir.create(tmp_path, "s")
    rec = Recorder(rd.history_jsonl)
    rec.invoke("p1", "publish", queue="q", value="p1:1").ok()
    for i, effect in enumerate(effects, start=1):
        ev = Evidence(effect, "measured", no_effect_reason="nothing happened" if effect is False else None)
        value = {"fault_id": f"f{i}", "kind": "some-kind", "params": {}}
        rec.invoke("nemesis", "some-kind", node="n1", value=value).ok({**value, EVIDENCE: ev.as_dict()})
    rec.close()
    res = check_run(host_with({"c": verdict(checker_verdict)}), rd, {"name": "s"}, ["c"])
    assert exit_code(res) == want
    fe = res["fault_evidence"]
    assert fe["faults"] == len(effects) and fe["no_effect"] == effects.count(False)
    if fe["no_fault_bit"]:  # said beside any verdict; only a durable one changes the exit status
        assert verdict_line(res).startswith(f"{checker_verdict} (no fault bit: ")
        assert "f1 some-kind on n1: nothing happened" in fe["lines"]
    else:
        assert verdict_line(res) == checker_verdict
