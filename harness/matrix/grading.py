"""Each cell's records graded together through the ``brokerchaos_grade`` hook (the stored engine).

A record holds what grading reads of a run's results, so the grade of a cell needs neither its
run directories nor a cluster: each record is laid out as the run directory the stored engine
reads (``scenario.json``, ``results.json``) and the cell's seeds are graded as one set of runs:
the composed verdict, the share of runs that lost acknowledged messages with its exact
(Clopper-Pearson) bound, the per-message loss rate, recovery per fault kind, anomaly classes,
and the seeds none of whose faults bit (a durable run that proved nothing: exit status 4).
A cell none of whose records has this tree's content key is graded over its last stale records
and marked stale (their commit and date): shown until the cell runs again, never blank.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import BrokerChaosError
from harness.host import Host
from harness.matrix import records
from harness.matrix.cells import Cell, ImagesOf, cell_key
from harness.matrix.model import Matrix
from harness.spec.results import EXIT_NO_FAULT_BIT
from harness.spec.rundir import RESULTS_JSON, SCENARIO_JSON
from harness.verdicts import exit_code

PER_MILLION = 1_000_000


def grade_matrix(
    host: Host, matrix: Matrix, cells: Sequence[Cell], images_of: ImagesOf, reports: Path | None = None
) -> dict[str, Any]:
    """The matrix as data: its rows, columns and every cell's summary (``images_of``: the images'
    content tags, which with the scenario make the key a current record has; ``reports``: where
    each cell's grade report goes; None: a temporary directory, discarded)."""
    with tempfile.TemporaryDirectory(prefix="brokerchaos-matrix-") as tmp:
        out = []
        for cell in cells:
            where = (reports or Path(tmp)) / cell.id
            key = cell_key(cell.scenario, images_of(cell)) if cell.scenario is not None else None
            graded = grade_cell(host, cell, list(records.of_cell(matrix.results, cell.id)), where, key)
            out.append(graded | {"note": matrix.notes.get(cell.id)})
    return {
        "matrix": matrix.name,
        "description": matrix.description,
        "records": list(matrix.records),
        "seeds": list(matrix.seeds),
        "workload": dict(matrix.workload),
        "nodes": matrix.nodes,
        "checkers": list(matrix.checkers),
        "configurations": [
            {
                "id": c.id,
                "label": c.label,
                "broker": c.broker,
                "version": c.version,
                "settings": dict(c.settings),
                "nodes": c.nodes or matrix.nodes,
            }
            for c in matrix.configurations
        ],
        "faults": [
            {"name": f.name, "description": f.description, "schedule": [dict(s) for s in f.schedule]}
            for f in matrix.faults
        ],
        "cells": out,
        "counts": {
            state: sum(1 for c in out if _state(c) == state)
            for state in ("current", "stale", "not run", "unsupported")
        },
    }


def _state(c: Mapping[str, Any]) -> str:
    return "stale" if c.get("stale") else "current" if c["state"] == "graded" else str(c["state"])


def shown_records(
    recs: Sequence[Mapping[str, Any]], key: str | None
) -> tuple[list[Mapping[str, Any]], dict[str, Any] | None]:
    """The records a cell shows: those made under ``key`` (its current content key); where there
    are none, those of the last stale record's key (a cell never mixes two keys), with what makes
    them stale: the last one's commit and date."""
    current = [r for r in recs if r.get("cell_key") == key]
    if current or not recs:
        return current, None
    last = max(recs, key=lambda r: str(r.get("date") or ""))
    shown = [r for r in recs if r.get("cell_key") == last.get("cell_key")]
    return shown, {"commit": last.get("commit"), "date": last.get("date"), "records": len(shown)}


def grade_cell(
    host: Host, cell: Cell, recs: Sequence[Mapping[str, Any]], where: Path, key: str | None
) -> dict[str, Any]:
    """A cell's grade over its current records, or over its last stale ones (``stale`` says so)."""
    base: dict[str, Any] = {
        "cell": cell.id,
        "configuration": cell.configuration.id,
        "fault": cell.fault.name,
        "stale": None,
    }
    if cell.unsupported is not None:
        return base | {"state": "unsupported", "reason": cell.unsupported}
    recs, stale = shown_records(recs, key)
    if not recs:
        return base | {"state": "not run"}
    dirs = []
    for rec in recs:
        d = where / "runs" / f"seed-{rec['seed']}"
        d.mkdir(parents=True, exist_ok=True)
        (d / SCENARIO_JSON).write_text(json.dumps({"scenario": rec["scenario"], "seed": rec["seed"]}))
        (d / RESULTS_JSON).write_text(json.dumps(rec["results"]))
        dirs.append(d)
    (where / "grade").mkdir(parents=True, exist_ok=True)
    graded = host.grade(dirs, "stored", where / "grade")
    if graded is None:
        raise BrokerChaosError("no loaded plugin grades runs (brokerchaos_grade); install spark_reports")
    return (
        base
        | {"state": "graded", "stale": stale, "report": graded.get("report")}
        | summary(graded["grade"], recs)
    )


def summary(g: Mapping[str, Any], recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the page shows of a cell's grade."""
    confirmed, lost = g["confirmed"], g["lost"]

    def ppm(x: float | None) -> float | None:
        return None if x is None else round(x * PER_MILLION, 3)

    recovery = [
        {k: r[k] for k in ("fault_kind", "runs", "samples", "recovered", "median_s", "max_s", "runs_never")}
        for r in g.get("recovery") or []
    ]
    return {
        "verdict": g["verdict"],
        "verdicts": dict(g["verdicts"]),
        "runs": len(g["runs"]),
        "graded_runs": g["graded_runs"],
        "runs_lost": g["runs_lost"],
        "runs_lost_interval": g["runs_lost_interval"],
        "runs_lost_low": g["runs_lost_low"],
        "runs_lost_high": g["runs_lost_high"],
        "confidence": g["confidence"],
        "confirmed": confirmed,
        "lost": lost,
        "lost_per_million": ppm(lost / confirmed) if confirmed else None,
        "loss_low_per_million": ppm(g.get("loss_low")),
        "loss_high_per_million": ppm(g.get("loss_high")),
        "recovery": recovery,
        "anomalies": sorted(g.get("anomalies") or {}),
        "no_fault_bit": sum(_no_bite(rec) for rec in recs),
        "longest_outage_s": _longest_outage(recs),
        "statement": g.get("statement", ""),
        "scenario": dict(recs[0]["scenario"]) if recs else {},
        "seeds": [
            {
                "seed": rec["seed"],
                "verdict": rec["results"].get("verdict"),
                "no_fault_bit": _no_bite(rec),
                "confirmed": (rec["results"].get("counts") or {}).get("confirmed"),
                "lost": (rec["results"].get("counts") or {}).get("lost"),
                "commit": rec.get("commit"),
                "date": rec.get("date"),
                "seconds": rec.get("seconds"),
                "run_dir": rec.get("run_dir"),
                "timeline": rec["results"].get("timeline") or {},
            }
            for rec in recs
        ],
    }


def _no_bite(rec: Mapping[str, Any]) -> bool:
    """The run was durable and none of its faults bit: what its exit status 4 said (a record made
    before records kept ``fault_evidence`` has none, and is not one)."""
    return exit_code(rec["results"]) == EXIT_NO_FAULT_BIT


def _longest_outage(recs: Sequence[Mapping[str, Any]]) -> float | None:
    """The longest stretch, over the cell's seeds, in which a queue completed no publish or no
    consume (``liveness.longest_outage_ns``): how long the fault was felt, not only how soon
    after its heal the queue worked again."""
    seen = [r["results"].get("liveness", {}).get("longest_outage_ns") for r in recs]
    known = [x for x in seen if isinstance(x, int | float)]
    return round(max(known) / 1e9, 2) if known else None


def recheck(host: Host, matrix: Matrix, cells: Sequence[Cell], engine: str, out: Path) -> dict[str, Any]:
    """Every recorded run whose directory is on local disk, checked again from its history by
    ``engine`` (``spark``: one Spark job for the whole matrix; ``python``), and the runs whose
    verdict differs from their record's (a record is then not what its history says)."""
    recs = [rec for cell in cells for rec in records.of_cell(matrix.results, cell.id)]
    present = [r for r in recs if (Path(r["run_dir"]) / SCENARIO_JSON).is_file()]
    found: dict[str, Any] = {"engine": engine, "runs": len(present), "absent": len(recs) - len(present)}
    if not present:
        return found | {"disagree": []}
    out.mkdir(parents=True, exist_ok=True)
    graded = host.grade([Path(r["run_dir"]) for r in present], engine, out)
    if graded is None:
        raise BrokerChaosError("no loaded plugin grades runs (brokerchaos_grade); install spark_reports")
    verdicts = {g["run_dir"]: g["verdict"] for g in graded["grade"]["runs"]}
    disagree = [
        {
            "cell": r["cell"],
            "seed": r["seed"],
            "record": r["results"].get("verdict"),
            engine: verdicts[r["run_dir"]],
        }
        for r in present
        if verdicts.get(r["run_dir"]) != r["results"].get("verdict")
    ]
    return found | {"report": graded.get("report"), "disagree": disagree}
