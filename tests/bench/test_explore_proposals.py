"""``bench.explore_proposals``: the restart-in-minority shape is recognised in a schedule."""

from __future__ import annotations

from pathlib import Path

from bench.explore_proposals import restart_in_minority_room, restart_in_minority_shape
from harness.host import Host
from harness.scenario import load
from harness.shrink import Schedule

REPO = Path(__file__).resolve().parents[2]


def _start(name: str) -> Schedule:
    from harness.nemesis import plan

    sc = load(REPO / "scenarios" / name)
    faults = Host.load([]).registry.faults
    nodes = [f"n{i}" for i in range(1, sc.broker.nodes + 1)]
    p = plan(sc, faults, nodes)
    return Schedule(tuple(p.steps), float(sc.workload.duration), float(sc.workload.rate), sc.broker.nodes)


def test_the_shipped_schedule_has_the_whole_shape_and_its_parts_do_not() -> None:
    full = _start("reference-restart-in-minority.yaml")
    assert restart_in_minority_shape(full) == (True, True)
    no_reset = full.replace(steps=tuple(p for p in full.steps if p.kind != "degrade"))
    assert restart_in_minority_shape(no_reset) == (True, False)
    assert restart_in_minority_shape(_start("reference-isolate-master.yaml")) == (False, False)


def test_the_room_is_from_the_kills_heal_to_the_isolations_end() -> None:
    """The shipped schedule: n1 isolated 6-30 s, killed 10-13 s: 17 s left after the heal (the workload
    runs 36 s, so the isolation's end comes first)."""
    full = _start("reference-restart-in-minority.yaml")
    iso = next(p for p in full.steps if p.kind == "partition")
    kill = next(p for p in full.steps if p.kind == "kill")
    left = min(iso.at + (iso.hold or 0), full.duration) - (kill.at + (kill.hold or 0))
    assert restart_in_minority_room(full) == (left, left)
    assert restart_in_minority_room(_start("reference-isolate-master.yaml")) == (None, None)
