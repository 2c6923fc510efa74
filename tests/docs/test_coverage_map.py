"""The coverage map (docs/explanation/coverage.md) is what the records say, every scenario has a
record, and the reference broker's holes are the ones listed below, by name.

A hole is a (feature, fault kind) cell the reference broker's plugin wants exercised, for a
feature the workload can drive, that no run of a shipped scenario reached. ``OPEN_HOLES`` is a
ratchet: a new feature or a new wanted cell without a run record fails here as a new hole, and a
run record that fills a hole fails here until the hole is taken off the list.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from harness.coverage_map import PAGE, RECORDS, holes, load_records, render
from harness.host import Host

REPO = Path(__file__).resolve().parents[2]

#: Holes of the reference broker's drivable features: scenarios not run yet (their records are
#: computed from the plan: ``source: plan``), or wanted cells no scenario reaches.
OPEN_HOLES: set[str] = set()


@pytest.fixture(scope="module")
def host() -> Host:
    return Host.load()


def test_the_page_is_what_the_records_and_plugins_say(host: Host) -> None:
    plugins = [host.broker(n) for n in sorted(host.registry.brokers)]
    want = render(plugins, host.registry.faults, load_records()) + "\n"
    assert PAGE.exists(), "docs/explanation/coverage.md is missing: run python3 scripts/gen_coverage.py"
    assert PAGE.read_text() == want, (
        "docs/explanation/coverage.md is stale: run python3 scripts/gen_coverage.py"
    )


def test_every_shipped_scenario_has_a_record() -> None:
    have = {p.stem for p in RECORDS.glob("*.json")}
    missing = sorted(p.stem for p in (REPO / "scenarios").glob("*.yaml") if p.stem not in have)
    assert not missing, f"no coverage record for {missing}: run python3 scripts/gen_coverage.py --plan"


def test_records_from_runs_say_how_they_ran() -> None:
    for r in load_records():
        assert r["source"] in ("run", "plan"), r["scenario"]
        if r["source"] == "run":
            assert r["run"].get("command") and r["run"].get("load"), f"{r['scenario']}: command and load"
            assert isinstance(r["coverage"].get("cells"), list)
            json.dumps(r)


def test_the_reference_brokers_holes_are_the_listed_ones(host: Host) -> None:
    found = set(holes(host.broker("reference"), host.registry.faults, load_records()))
    new = sorted(found - OPEN_HOLES)
    filled = sorted(OPEN_HOLES - found)
    assert not new, "holes in the reference broker's coverage (no run reached them):\n  " + "\n  ".join(new)
    assert not filled, "filled, take them off OPEN_HOLES:\n  " + "\n  ".join(filled)


def test_plan_records_are_what_the_plans_say_now(host: Host) -> None:
    """Every shipped scenario plans against its cluster's nodes and roles as ``brokerchaos run``
    plans it (the ActiveMQ JDBC pair's database node is ``n3``, of role ``storage``), and each
    plan record (``source: plan``) is what ``gen_coverage.py --plan`` computes from it today."""
    spec = importlib.util.spec_from_file_location("gen_coverage", REPO / "scripts" / "gen_coverage.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    planned = gen.plan_records(host)
    for path in sorted(RECORDS.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("source") == "plan":
            assert record["coverage"] == planned[path.stem]["coverage"], (
                f"{path.name} is stale: run python3 scripts/gen_coverage.py --plan"
            )
