"""A finished chaos run as code sees it: results, run directory, scenario, and the loss table
a failing check shows. The CLI's conformance kit and the pytest plugin share it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.scenario import Scenario
from harness.spec.results import MISSING_CLASSES, exposure_classes, row_class, shown_classes
from harness.spec.rundir import HISTORY_JSONL
from harness.verdicts import no_fault_bit, summary_table, verdict_line


@dataclass
class ChaosResult:
    """One finished run: its results (``results.json``), run directory and scenario."""

    scenario: Scenario
    results: dict[str, Any]
    run_dir: Path

    @property
    def seed(self) -> int:
        return self.scenario.seed

    @property
    def durable(self) -> bool:
        return self.results.get("valid") is True

    def history(self) -> Iterator[dict[str, Any]]:
        """The recorded operations in order (the schema of ``harness.history``)."""
        from harness.history import read_jsonl

        yield from read_jsonl(self.run_dir / HISTORY_JSONL)

    @property
    def no_fault_bit(self) -> bool:
        """Faults were applied and none was measured to bite (``results.json``'s ``fault_evidence``)."""
        return no_fault_bit(self.results)

    def loss_table(self) -> str:
        return loss_table(self.scenario, self.results, self.run_dir)

    def assert_durable(self, *, allow_no_fault_bit: bool = False) -> ChaosResult:
        """Raise ``AssertionError`` with the loss table unless every confirmed message came back,
        and unless a fault bit (a durable run none of whose faults had an effect proved nothing;
        ``allow_no_fault_bit`` accepts it)."""
        if not self.durable or (self.no_fault_bit and not allow_no_fault_bit):
            raise AssertionError(self.loss_table())
        return self


class ChaosSeries(list[ChaosResult]):
    """Several seeded runs of one scenario (``--chaos-runs``); durable only if each run is."""

    @property
    def results(self) -> list[dict[str, Any]]:
        return [r.results for r in self]

    @property
    def durable(self) -> bool:
        return all(r.durable for r in self)

    def assert_durable(self, *, allow_no_fault_bit: bool = False) -> ChaosSeries:
        bad = [r for r in self if not r.durable or (r.no_fault_bit and not allow_no_fault_bit)]
        if bad:
            head = f"{len(bad)} of {len(self)} seeded runs are not durable or had no fault bite"
            raise AssertionError(head + "\n\n" + "\n\n".join(r.loss_table() for r in bad))
        return self


def loss_table(scenario: Scenario, results: Mapping[str, Any], run_dir: Path, limit: int = 20) -> str:
    """The text a failing chaos test shows: verdict, counts, attribution, lost ids, how to rerun."""
    broker = scenario.broker.plugin
    what = "proved nothing" if results.get("valid") is True else "is not durable"
    lines = [
        f"chaos run {scenario.name!r} (broker {broker}, seed {scenario.seed}) {what}: "
        f"{verdict_line(results)}" + (f" ({results['reason']})" if results.get("reason") else ""),
        summary_table(dict(results)),
    ]
    lines += attribution_lines(results, limit)
    lines += [
        f"  run directory: {run_dir}",
        f"  rerun: brokerchaos run {scenario.source or '<scenario>'} --seed {scenario.seed}   "
        f"or replay its faults: brokerchaos run {scenario.source or '<scenario>'} --replay {run_dir}",
    ]
    return "\n".join(lines)


def attribution_lines(results: Mapping[str, Any], limit: int = 20) -> list[str]:
    """The attribution rows, the exposure per fault kind and the first missing messages, each
    under its class (lost, unreachable, stuck: a drain that did not complete loses nothing)."""
    counts = results.get("counts") or {}
    attribution = results.get("attribution") or {}
    lines = []
    rows = attribution.get("rows") or []
    if rows:
        lines.append("  loss attribution (fault kind, node that confirmed, class, messages):")
        lines += [
            f"    {r['fault_kind']:<16} {str(r['node']):<6} {row_class(r, counts):<11} {r['count']}"
            for r in rows
        ]
    exposure = attribution.get("exposure") or []
    if exposure:
        shown = shown_classes(results)
        lines.append(f"  exposure (fault kind, confirmed while it could hit, {', '.join(shown)}):")
        for r in exposure:
            by = exposure_classes(r, counts)
            cells = [f"{by[c]:<{len(c)}}" for c in shown[:-1]] + [str(by[shown[-1]])]
            lines.append(f"    {r['fault_kind']:<16} {r['confirmed']:<8} " + " ".join(cells))
    messages = attribution.get("messages") or []
    if messages:
        classes = [c for c in MISSING_CLASSES if c in {row_class(m, counts) for m in messages}]
        missing = sum(int(counts.get(c) or 0) for c in classes)
        lines.append(f"  {' and '.join(classes)} messages (first {min(limit, len(messages))} of {missing}):")
        lines += [
            f"    {m['id']:<16} confirmed by {m['confirm_node']} at {m['confirm_ns'] / 1e9:.3f}s, "
            f"faults: {', '.join(m['fault_ids']) or 'none'}"
            for m in messages[:limit]
        ]
    return lines
