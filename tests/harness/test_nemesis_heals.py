"""Heals due close together: a heal that waits for what another held fault prevents (a node joining
a cluster whose members a partition keeps paused) must not hold that fault's heal back. The nemesis
runs for real; the two fault kinds are in-process stand-ins whose heals talk through a shared list."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

from harness.history import Recorder, read_jsonl
from harness.nemesis import Nemesis, Plan, PlannedFault
from harness.spec.fault import Fault, FaultContext
from harness.spec.rundir import HISTORY_JSONL
from tests.polling import until


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
    rec = Recorder(tmp_path / HISTORY_JSONL)
    plan = Plan([PlannedFault("f1", 0.0, 0.1, "joins", {}), PlannedFault("f2", 0.05, 0.1, "cuts", {})])
    nemesis = Nemesis(
        plan, {"joins": Joins, "cuts": Cuts}, FaultContext(None), rec, settle=0.0, final_heal=lambda: None
    )
    asyncio.run(nemesis(0.3))
    rec.close()
    assert Joins.healed == ["cuts", "joins"]
    heals = [r for r in read_jsonl(tmp_path / HISTORY_JSONL) if r["f"] == "heal" and r["type"] == "ok"]
    assert len(heals) == 3  # f2's, f1's and the final heal, each completed
