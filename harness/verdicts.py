"""One verdict for a run, composed from every checker that ran, and the text a terminal shows of it.

The checkers are pure functions that each return a verdict (``harness.spec.results``). A run
has one verdict, the worst of theirs (``compose_verdicts``), and its exit status follows that
verdict alone, so the first line, ``results.json``'s ``verdict`` and the exit status always
agree. Each checker's own verdict, reason, counts and findings stay under ``checkers``.

A leaf module: it imports only the contract, so the runner, the CLI and ``harness.outcome``
all use it without importing one another.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.coverage import coverage_lines
from harness.liveness import liveness_lines
from harness.spec.results import (
    ANOMALY_CLASSES,
    EXIT_DURABLE,
    EXIT_FAILED,
    EXIT_NO_FAULT_BIT,
    EXIT_UNKNOWN,
    CheckerSummary,
    compose_verdicts,
    exit_status,
    valid_of,
)
from harness.spec.rundir import RESULTS_JSON

EXAMPLES_SHOWN = 3
"""Examples of each finding a terminal shows per checker (the report shows more, results.json all kept)."""


def summarize_checker(res: Mapping[str, Any], *, body: bool) -> CheckerSummary:
    """What ``results.json`` keeps under ``checkers.<name>``.

    The checker whose result is the run's body (``body``) keeps its summary keys only, its
    findings being the run's own top-level fields; any other keeps its findings too: every
    scalar field, its ``counts``, ``notes`` and ``anomalies`` (examples per kind, capped by the
    checker).
    """
    out: dict[str, Any] = {k: res.get(k) for k in ("valid", "verdict", "reason", "counts", "error", "engine")}
    out["notes"] = list(res.get("notes") or [])
    if not body:
        for k, v in res.items():
            if k not in out and (v is None or isinstance(v, (str, int, float, bool))):
                out[k] = v
        if isinstance(res.get("anomalies"), Mapping):
            out["anomalies"] = dict(res["anomalies"])
    return out  # type: ignore[return-value]


def _is_body(res: Mapping[str, Any]) -> bool:
    """The queue results schema (``harness.spec.results.Results``): counts and a timeline."""
    return "error" not in res and "counts" in res and "timeline" in res


def combine(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The run's results from every checker's (in the order they ran).

    The body (counts, lists, drain, faults) is the first checker's result in the queue results
    schema, else the first one that did not raise; ``verdict`` is the worst of every checker's
    (a checker that raised counts as ``unknown``), ``valid`` goes with it, and ``reason`` names
    the checker(s) that gave the verdict when more than one ran; ``body_checker`` names the
    checker whose result is the body (None when every checker raised).
    """
    names = list(results)
    body_name = next((n for n in names if _is_body(results[n])), None) or next(
        (n for n in names if "error" not in results[n]), None
    )
    per = {n: summarize_checker(results[n], body=n == body_name) for n in names}
    combined: dict[str, Any] = dict(results[body_name]) if body_name is not None else {}
    if body_name is None and names:
        combined["error"] = per[names[0]]["error"]
    verdict = compose_verdicts(p["verdict"] for p in per.values())
    combined["verdict"] = verdict
    combined["valid"] = valid_of(verdict)
    combined["reason"] = composed_reason(per, verdict)
    combined["checkers"] = per
    combined["body_checker"] = body_name
    return combined


def _reason_of(name: str, p: Mapping[str, Any]) -> str:
    if p.get("error"):
        return f"checker {name} failed: {p['error']}"
    if p.get("verdict") is None:
        return f"checker {name} returned no verdict"
    return str(p.get("reason") or "; ".join(p.get("notes") or []) or p["verdict"])


def composed_reason(per: Mapping[str, Mapping[str, Any]], verdict: str) -> str:
    """Why the run has its verdict: the reason of each checker that gave it (named when more than
    one checker ran), then the other checkers' verdicts."""
    if len(per) == 1:
        [(name, p)] = per.items()
        return _reason_of(name, p)
    gave = [n for n, p in per.items() if compose_verdicts([p.get("verdict")]) == verdict]
    text = "; ".join(f"{n}: {_reason_of(n, per[n])}" for n in gave)
    others = [f"{n} {per[n].get('verdict') or 'no verdict'}" for n in per if n not in gave]
    return text + (f" (also checked: {', '.join(others)})" if others else "")


def judge_unsynced(results: dict[str, Any]) -> None:
    """A power cut that found acknowledged messages unsynced under a broker's promise to sync
    before each confirm (``fault_evidence``'s ``unsynced_lines``) is a finding of the harness's
    own, whatever the checkers say: the run's verdict becomes at least ``UNSYNCED``, and its
    reason says why."""
    lines = (results.get("fault_evidence") or {}).get("unsynced_lines") or []
    if not lines:
        return
    verdict = compose_verdicts([results.get("verdict"), "UNSYNCED"])
    why = f"fault evidence: {len(lines)} power cut(s) found acknowledged messages unsynced under flush-before-confirm settings"
    if verdict == "UNSYNCED":
        results["reason"] = why + (f" (checkers: {results['reason']})" if results.get("reason") else "")
    else:
        results["reason"] = f"{results.get('reason') or verdict}; {why}"
    results["verdict"], results["valid"] = verdict, valid_of(verdict)


def no_fault_bit(results: Mapping[str, Any]) -> bool:
    """Whether the run applied faults and none of them was measured to bite (``fault_evidence``)."""
    return bool((results.get("fault_evidence") or {}).get("no_fault_bit"))


def exit_code(results: Mapping[str, Any]) -> int:
    """The exit status of a checked run: from its composed verdict (0, 1 or 3), except that a
    ``durable`` run none of whose faults bit exits ``EXIT_NO_FAULT_BIT`` (4): it proved nothing."""
    status = exit_status(results.get("verdict"))
    if status == EXIT_DURABLE and no_fault_bit(results):
        return EXIT_NO_FAULT_BIT
    return status


def series_exit(codes: list[int]) -> int:
    """The exit status of several runs: the worst of theirs (a failure, then unknown, then a run
    none of whose faults bit, then durable)."""
    for code in (EXIT_FAILED, EXIT_UNKNOWN, EXIT_NO_FAULT_BIT):
        if code in codes:
            return code
    return EXIT_DURABLE


def verdict_line(results: Mapping[str, Any]) -> str:
    """The verdict as the run's first line shows it: ``durable (no fault bit: ...)`` when it must
    not read as plain ``durable``."""
    verdict = str(results.get("verdict", results.get("valid")))
    ev = results.get("fault_evidence") or {}
    if ev.get("no_fault_bit"):
        n = ev.get("faults", 0)
        return (
            f"{verdict} (no fault bit: {ev.get('no_effect', 0)} of {n} fault{'s' * (n != 1)} had no effect)"
        )
    return verdict


def evidence_lines(results: Mapping[str, Any], width: int) -> list[str]:
    """How many faults bit, and one line per fault that had no effect (or that a heal left on)."""
    ev = results.get("fault_evidence") or {}
    if not ev.get("faults"):
        return []
    parts = [f"{ev['bit']} bit", f"{ev['no_effect']} no effect"]
    if ev.get("unmeasured"):
        parts.append(f"{ev['unmeasured']} not measured")
    if ev.get("not_restored"):
        parts.append(f"{ev['not_restored']} still on after the heal")
    lines = [f"  {'faults':<{width}}  {ev['faults']} applied: " + ", ".join(parts)]
    lines += [f"  {'':<{width}}    {line}" for line in ev.get("lines") or []]
    lines += [f"  {'exposure':<{width}}  {line}" for line in ev.get("exposure_lines") or []]
    lines += [f"  {'UNSYNCED':<{width}}  {line}" for line in ev.get("unsynced_lines") or []]
    return lines


# -- text -------------------------------------------------------------------------------------


def compact(x: Any) -> str:
    """One finding on one line: ``key=value`` pairs, nested mappings in braces, lists in brackets."""
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k}={compact(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(compact(v) for v in x) + "]"
    if isinstance(x, str):
        return x
    return json.dumps(x, default=str)


def findings(p: Mapping[str, Any]) -> list[tuple[str, int, list[Any]]]:
    """(kind, count, examples) of every kind of finding a checker reported, in its order."""
    counts = p.get("counts") or {}
    out = []
    for kind, examples in (p.get("anomalies") or {}).items():
        n = counts.get(kind)
        n = n if isinstance(n, int) else len(examples or [])
        if n or examples:
            out.append((kind, n, list(examples or [])))
    return out


def checker_lines(results: Mapping[str, Any], width: int, *, always: bool = False) -> list[str]:
    """Each checker's verdict and reason, and a few examples of each of its findings (by default
    nothing when one checker ran and kept no findings: the table above is all of it)."""
    per = results.get("checkers") or {}
    lines: list[str] = []
    if not always and len(per) < 2 and not any(findings(p) for p in per.values()):
        return lines
    for name, p in per.items():
        label = f"checker {name}"
        lines.append(f"  {label:<{width}}  {p.get('verdict') or 'no verdict'}: {_reason_of(name, p)}")
        for kind, n, examples in findings(p):
            lines.append(f"  {'':<{width}}    {kind.replace('_', ' ')} ({n:,}):")
            lines += [f"  {'':<{width}}      {compact(e)}" for e in examples[:EXAMPLES_SHOWN]]
            if len(examples) > EXAMPLES_SHOWN:
                lines.append(f"  {'':<{width}}      ... (the report and results.json show more)")
    return lines


def anomaly_rows(results: dict[str, Any]) -> list[tuple[str, int]]:
    """Jepsen's finer classes that occurred (``results.anomalies``), as (name, count)."""
    counts = (results.get("anomalies") or {}).get("counts") or {}
    return [(k.replace("_", " "), int(counts[k])) for k in ANOMALY_CLASSES if counts.get(k)]


#: The counts of what became of the messages, in the order the summary table shows them, each under
#: its name with spaces unless ``OUTCOME_LABELS`` names it otherwise.
OUTCOME_COUNTS = (
    "lost stuck unreachable ack_unknown unexpected corrupted duplicated resurrected recovered split_brain "
    "unflagged_redeliveries order_violations"
).split()
OUTCOME_LABELS = {"split_brain": "split-brain copies"}


def summary_table(results: dict[str, Any]) -> str:
    """The table a terminal shows under a run's first line."""
    c = results.get("counts", {}) or {}
    old_history = (results.get("history_schema") or 2) < 2
    rows = [
        ("verdict", verdict_line(results)),
        ("attempted", c.get("attempted")),
        ("confirmed", c.get("confirmed")),
        ("nacked", c.get("failed")),
        ("unknown", c.get("unknown")),
        ("delivered (unique)", c.get("delivered_unique")),
        ("consumed (delivered)" if old_history else "consumed (acked ok)", c.get("consumed_unique")),
        *((OUTCOME_LABELS.get(k, k.replace("_", " ")), c.get(k)) for k in OUTCOME_COUNTS),
        *anomaly_rows(results),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"  {k:<{width}}  {'-' if v is None else v}" for k, v in rows]
    if results.get("reason"):
        lines.insert(1, f"  {'reason':<{width}}  {results['reason']}")
    lines += checker_lines(results, width)
    lines += evidence_lines(results, width)
    lines += liveness_lines(results, width)
    lines += coverage_lines(results, width)
    budgets = {k: v for k, v in (results.get("budgets") or {}).items() if v is not None}
    if budgets:
        lines.append(f"  {'budgets':<{width}}  " + ", ".join(f"{k} <= {v}" for k, v in budgets.items()))
    if (results.get("broker") or {}).get("running"):
        lines.insert(1, f"  {'broker':<{width}}  {results['broker']['running']}")
    if results.get("filesystem"):
        lines.append(f"  {'filesystem':<{width}}  lazyfs, model {results['filesystem']}")
    for note in results.get("notes") or []:
        lines.append(f"  {'note':<{width}}  {note}")
    if results.get("error"):
        lines.append(f"  {'error':<{width}}  {results['error']}")
    return "\n".join(lines)


def tested_versions(run_dirs: list[Path]) -> list[str]:
    """The broker versions the runs tested, as each running broker reported it (``results.json``'s
    ``broker.running``), with how many runs each: what a grade over them speaks of."""
    seen: dict[str, int] = {}
    for d in run_dirs:
        f = d / RESULTS_JSON
        res = json.loads(f.read_text()) if f.is_file() else {}
        running = (res.get("broker") or {}).get("running") or "not recorded"
        seen[running] = seen.get(running, 0) + 1
    return [f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in seen.items()]
