"""The report's fault-evidence parts: whether each fault action was measured to bite
(``results.json``'s ``fault_evidence``, which the harness writes beside the checkers' results)."""

from __future__ import annotations

from typing import Any

from harness.spec.results import Results
from spark_reports.reports.html import esc, table

EFFECT = {True: "bit", False: "no effect", None: "not measured"}
UNDONE = {True: "yes", False: "NO", None: "-"}


def _evidence(results: Results) -> dict[str, Any]:
    ev = dict(results).get("fault_evidence")
    return dict(ev) if isinstance(ev, dict) else {}


def no_fault_bit_notes(results: Results) -> list[str]:
    """The note under the verdict of a run none of whose faults bit."""
    ev = _evidence(results)
    if not ev.get("no_fault_bit"):
        return []
    note = f"no fault bit: {ev['no_effect']} of {ev['faults']} faults had no effect (exit status 4)"
    return [f"<div class='note'>{esc(note)}</div>"]


def evidence_parts(results: Results) -> list[str]:
    """Each fault action's evidence, one row an action."""
    ev = _evidence(results)
    if not ev.get("actions"):
        return []
    rows = [
        [a["fault_id"], a["kind"], a["node"] or "-", EFFECT[a["effect"]], UNDONE[a["restored"]], a["summary"]]
        for a in ev["actions"]
    ]
    intro = (
        f"{ev['bit']} of {ev['faults']} faults were measured to bite. What each kind measures: the faults "
        "reference. " + " ".join(esc(line) for line in [*ev.get("lines", []), *ev.get("exposure_lines", [])])
    )
    return [
        "<h2>Fault evidence</h2>",
        f"<p>{intro}</p>",
        table(["fault", "kind", "node", "effect", "undone", "evidence"], rows, left=6),
    ]
