"""Cell records: one small JSON file per cell and seed, the only input of the matrix's page.

``<results>/<cell>/seed-<seed>.json`` holds the content key it was run under, the commit and
date, the run directory it came from (on the machine that ran it), how long it took, and the
run's results cut down to what grading reads (verdict, counts, checkers' verdicts, the drain
(completed, and ``gone`` where a queue's drain ended on the cluster's word that it does not exist),
anomaly counts, recovery rows, the longest outage, loss exposure per fault kind, the fault
evidence's counts and ``no_fault_bit`` (a run none of whose faults bit, exit status 4), and the
operations per second with the fault windows that the cell's figure draws). A cell's records with another key
(the scenario, the images or the harness changed) are stale: the page shows them, marked stale,
until the cell has a record for its key, and they are removed then, so a cell never mixes what two
recipes did. A record re-keyed after a change of the image recipe that left every file its runs'
nodes ran as it was keeps its old key, cell key and images under ``rekeyed_from``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.matrix import figure

SCHEMA = 1


def path(results: Path, cell: str, seed: int) -> Path:
    return results / cell / f"seed-{seed}.json"


def read(p: Path) -> dict[str, Any] | None:
    """A record, or None where the file is not one (a half-written file is never one: see ``write``)."""
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


def of_cell(results: Path, cell: str) -> Iterator[dict[str, Any]]:
    """The cell's records, by seed."""
    d = results / cell
    if not d.is_dir():
        return
    for p in sorted(d.glob("seed-*.json"), key=lambda p: int(p.stem.split("-", 1)[1])):
        rec = read(p)
        if rec is not None:
            yield rec


def done(results: Path, cell: str, seed: int, key: str) -> bool:
    rec = read(path(results, cell, seed))
    return rec is not None and rec.get("key") == key


def stale(results: Path, cell: str, cell_key: str) -> list[Path]:
    """Records of the cell made under another content key."""
    d = results / cell
    return [p for p in sorted(d.glob("seed-*.json")) if (read(p) or {}).get("cell_key") != cell_key]


def write(p: Path, record: Mapping[str, Any]) -> None:
    """Atomically: an interrupted matrix leaves a record whole or absent."""
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, p)


def make(
    *,
    cell: str,
    seed: int,
    key: str,
    cell_key: str,
    images: Mapping[str, str],
    scenario: Mapping[str, Any],
    results: Mapping[str, Any],
    run_dir: Path,
    seconds: float,
    own: Sequence[Path] = (),
) -> dict[str, Any]:
    """``own``: the matrix's own outputs in the checkout (its records' directory, its page), whose
    changes do not make the checkout dirty for the commit a record names."""
    return {
        "schema": SCHEMA,
        "cell": cell,
        "seed": seed,
        "key": key,
        "cell_key": cell_key,
        "images": dict(images),
        "commit": commit(exclude=own),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_dir": str(run_dir),
        "seconds": round(seconds, 1),
        "scenario": dict(scenario),
        "results": trim(results),
    }


def commit(exclude: Sequence[Path] = ()) -> str:
    """The checkout's commit (``+dirty`` when tracked files differ from it, the paths in ``exclude``
    aside), or ``unknown``."""
    pathspec = ["--", ":/", *(f":(exclude){p.resolve()}" for p in exclude)] if exclude else []
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", *pathspec],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def trim(res: Mapping[str, Any]) -> dict[str, Any]:
    """What ``grade`` reads of a run's results, and nothing else (a record stays a few kB)."""
    live = res.get("liveness") or {}
    return {
        "verdict": res.get("verdict"),
        "valid": res.get("valid"),
        "reason": res.get("reason") or res.get("error") or "",
        "counts": dict(res.get("counts") or {}),
        "body_checker": res.get("body_checker"),
        "checkers": {
            n: {"verdict": c.get("verdict"), "reason": c.get("reason") or c.get("error") or ""}
            for n, c in (res.get("checkers") or {}).items()
        },
        "drain": _drain(res.get("drain") or {}),
        "anomalies": {"counts": dict((res.get("anomalies") or {}).get("counts") or {})},
        "liveness": {
            "longest_outage_ns": live.get("longest_outage_ns"),
            "available_share": live.get("available_share"),
            "recovery": [
                {k: r.get(k) for k in ("kind", "fault_id", "queue", "healed", "recovered", "recovery_ns")}
                for r in live.get("recovery") or []
            ],
            "unavailable": [
                {k: u.get(k) for k in ("fault_kind", "queue", "kind")} for u in live.get("unavailable") or []
            ],
        },
        "fault_evidence": _fault_evidence(res.get("fault_evidence") or {}),
        "attribution": {"exposure": list((res.get("attribution") or {}).get("exposure") or [])},
        "timeline": {
            **figure.series(res.get("timeline") or {}),
            "faults": figure.windows(res.get("faults") or []),
        },
    }


def _drain(drain: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the final drain completed, and, where its ops carry ``gone`` (``DrainOp.gone``),
    whether one of them ended because the cluster answered that its queue does not exist: a
    complete drain that is no answer of the queue's. Records made before ``gone`` was kept lack
    it: read as false."""
    out: dict[str, Any] = {"completed": bool(drain.get("completed"))}
    ops = drain.get("ops") or []
    if any("gone" in op for op in ops):
        out["gone"] = any(op.get("gone") for op in ops)
    return out


def _fault_evidence(ev: Mapping[str, Any]) -> dict[str, Any]:
    """The counts of the run's ``fault_evidence`` and its ``no_fault_bit``, as the run decided them
    (``harness.verdicts.exit_code`` reads the same field), with its lines on the faults that did not bite."""
    kept = {k: ev.get(k) for k in ("faults", "bit", "no_effect", "unmeasured", "not_restored")}
    return kept | {"no_fault_bit": bool(ev.get("no_fault_bit")), "lines": list(ev.get("lines") or [])}
