"""The nemesis keeps to its schedule. Heals due close together: a heal that waits for what another
held fault prevents (a node joining a cluster whose members a partition keeps paused) must not hold
that fault's heal back. A fault's evidence, measured while the next fault is due, must not hold
that fault back either (on a loaded machine a measurement takes seconds). The nemesis runs for
real; the fault kinds are in-process stand-ins that talk through shared lists."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

from harness.history import Recorder, read_jsonl
from harness.nemesis import Nemesis, Plan, PlannedFault
from harness.spec.fault import Evidence, Fault, FaultContext
from harness.spec.rundir import HISTORY_JSONL
from tests.polling import until


def _run_plan(tmp_path: Path, plan: Plan, *kinds: type[Fault]) -> None:
    """The nemesis run for real over ``plan`` (0.3 s), its history in ``tmp_path``."""
    rec = Recorder(tmp_path / HISTORY_JSONL)
    nemesis = Nemesis(
        plan, {k.name: k for k in kinds}, FaultContext(None), rec, settle=0.0, final_heal=lambda: None
    )
    asyncio.run(nemesis(0.3))
    rec.close()


class Joins(Fault):
    """Its heal waits until the ``cuts`` fault is healed (as a join waits for its members to run)."""

    name = "joins"
    healed: ClassVar[list[str]] = []

    def apply(self) -> dict[str, Any]:
        return {}

    def heal(self) -> dict[str, Any]:
        until(lambda: "cuts" in Joins.healed, "the partition's heal while the join waits")
        Joins.healed.append("joins")
        return {}


class Cuts(Fault):
    name = "cuts"

    def apply(self) -> dict[str, Any]:
        return {}

    def heal(self) -> dict[str, Any]:
        Joins.healed.append("cuts")
        return {}


def test_a_heal_due_while_an_earlier_heal_waits_runs_at_its_time(tmp_path: Path) -> None:
    Joins.healed = []
    plan = Plan([PlannedFault("f1", 0.0, 0.1, "joins", {}), PlannedFault("f2", 0.05, 0.1, "cuts", {})])
    _run_plan(tmp_path, plan, Joins, Cuts)
    assert Joins.healed == ["cuts", "joins"]
    heals = [r for r in read_jsonl(tmp_path / HISTORY_JSONL) if r["f"] == "heal" and r["type"] == "ok"]
    assert len(heals) == 3  # f2's, f1's and the final heal, each completed


class Measures(Fault):
    """Its evidence is measured only once the ``applies`` fault is applied (as a slow measurement
    overlaps the next fault's start): the nemesis must apply that one without waiting for it."""

    name = "measures"
    events: ClassVar[list[str]] = []

    def apply(self) -> dict[str, Any]:
        return {}

    def evidence(self, done: Any) -> Evidence:
        until(lambda: "applied" in Measures.events, "the next fault's apply while this one measures")
        Measures.events.append("measured")
        return Evidence.unmeasured("a stand-in")

    def heal(self) -> dict[str, Any]:
        Measures.events.append("healed")
        return {}


class Applies(Fault):
    name = "applies"

    def apply(self) -> dict[str, Any]:
        Measures.events.append("applied")
        return {}


def test_a_fault_due_while_the_last_one_measures_its_evidence_is_applied_at_its_time(tmp_path: Path) -> None:
    Measures.events = []
    plan = Plan([PlannedFault("f1", 0.0, 0.2, "measures", {}), PlannedFault("f2", 0.05, None, "applies", {})])
    _run_plan(tmp_path, plan, Measures, Applies)
    assert Measures.events == ["applied", "measured", "healed"]  # the heal waits for the measurement
    nemesis_ops = [r for r in read_jsonl(tmp_path / HISTORY_JSONL) if r["process"] == "nemesis"]
    seen = [(r["type"], json.loads(r["value"]).get("fault_id")) for r in nemesis_ops]
    assert seen.index(("invoke", "f2")) < seen.index(("ok", "f1"))  # f2 began before f1's measurement ended
