"""The matrix file: configurations (broker, version, settings) x fault classes, one workload, seeds.

    name: brokers
    seeds: [1]                        # each cell runs once per seed; records accumulate over reruns
    nodes: 3
    workload: {producers: 2, consumers: 2, rate: 100, duration: 30}   # one workload for every cell
    checkers: [python]
    fault_classes: fault-classes.yaml # a library (path beside this file) and/or a mapping
    faults: [leader-isolated, leader-killed]                          # the columns, in order
    configurations:                                                   # the rows, in order
      - {id: reference-sync, label: "reference, mirrored, flush sync", broker: reference,
         settings: {ha_mode: all, flush: sync}}
      - {id: rabbitmq-4.3-quorum, broker: rabbitmq, version: "4.3", settings: {queue_type: quorum}}
    page: ../docs/findings/matrix.md  # the docs page `brokerchaos matrix` writes
    description: |                    # above the table: what the matrix is (blank lines: paragraphs)
      ...
    notes:                            # under a cell's section, marked in the table: CONFIGURATION--FAULT
      rabbitmq-4.3-quorum--leader-killed: what the cell's result was, its evidence, **Backed by:** ...
    records:                          # "How these records were made", near the page's end
      - a paragraph on how (and where, when, at which load) the records were made

Prose only: neither ``description``, ``notes`` nor ``records`` is part of a cell's scenario, so
editing them never changes a content key (``cells.cell_key``) and never runs a cell again.

A fault class is a named schedule template: the steps of ``nemesis.schedule`` (times from the
workload's start), described in words. The matrix knows no fault kind by name: the scenario
loader and the planner judge every step when a cell is expanded.

Every error names the field and what is allowed; the file is never half-loaded.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.scenario import read_file
from harness.spec.errors import ScenarioError
from harness.spec.validate import integer, is_int, mapping, only

ID = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")


@dataclass(frozen=True)
class Configuration:
    """A row: a broker plugin, the broker's version (None: the plugin's default) and its settings."""

    id: str
    broker: str
    label: str
    version: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    nodes: int | None = None  # None: the matrix's


@dataclass(frozen=True)
class FaultClass:
    """A column: a named schedule template (``nemesis.schedule`` steps) and what it stands for."""

    name: str
    description: str
    schedule: tuple[Mapping[str, Any], ...]
    settle: float | None = None  # None: the nemesis default


@dataclass(frozen=True)
class Matrix:
    name: str
    source: Path
    configurations: tuple[Configuration, ...]
    faults: tuple[FaultClass, ...]
    seeds: tuple[int, ...]
    nodes: int = 3
    workload: Mapping[str, Any] = field(default_factory=dict)
    checkers: tuple[str, ...] = ()
    budgets: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    #: Per cell id (``CONFIGURATION--FAULT``): what that cell's result was, with its evidence.
    notes: Mapping[str, str] = field(default_factory=dict)
    #: Paragraphs on how the records were made (re-keying, stale images, run windows, loads).
    records: tuple[str, ...] = ()
    page: Path | None = None
    results: Path = Path()

    def configuration(self, cid: str) -> Configuration:
        return next(c for c in self.configurations if c.id == cid)

    def fault(self, name: str) -> FaultClass:
        return next(f for f in self.faults if f.name == name)


TOP = {
    "name",
    "description",
    "notes",
    "records",
    "seeds",
    "nodes",
    "workload",
    "checkers",
    "budgets",
    "fault_classes",
    "faults",
    "configurations",
    "page",
    "results",
}


def load(path: str | Path) -> Matrix:
    data = read_file(Path(path), "matrix", "the shipped ones are in matrices/")
    try:
        return from_dict(data, Path(path))
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def from_dict(data: Any, source: Path) -> Matrix:
    top = mapping(data, "matrix")
    only(top, "", TOP)
    name = _id(top.get("name", source.stem), "name")
    library = _fault_classes(top.get("fault_classes"), source.parent)
    columns = _names(top.get("faults"), "faults")
    for col in columns:
        if col not in library:
            raise ScenarioError(
                f"faults: {col!r} is not a fault class; defined: {', '.join(sorted(library)) or '(none)'}"
            )
    configurations = _configurations(top.get("configurations"))
    seeds = top.get("seeds", [1])
    if not isinstance(seeds, list) or not seeds or not all(is_int(s) and s >= 0 for s in seeds):
        raise ScenarioError("seeds: expected a non-empty list of integers >= 0, e.g. [1, 2, 3]")
    if len(set(seeds)) != len(seeds):
        raise ScenarioError("seeds: a seed is listed twice")
    checkers = top.get("checkers", [])
    if not isinstance(checkers, list) or not all(isinstance(c, str) for c in checkers):
        raise ScenarioError("checkers: expected a list of checker names, e.g. [python]")
    page = top.get("page")
    if page is not None and not isinstance(page, str):
        raise ScenarioError("page: expected a path (relative to the matrix file) of the docs page to write")
    results = top.get("results", f"results/{name}")
    if not isinstance(results, str) or not results:
        raise ScenarioError(
            "results: expected a directory (relative to the matrix file) for the cell records"
        )
    faults = tuple(library[c] for c in columns)
    return Matrix(
        name=name,
        source=source,
        configurations=configurations,
        faults=faults,
        seeds=tuple(seeds),
        nodes=integer(top.get("nodes", 3), "nodes", lo=1, hi=9),
        workload=dict(mapping(top.get("workload", {}), "workload")),
        checkers=tuple(checkers),
        budgets=dict(mapping(top.get("budgets", {}), "budgets")),
        description=prose(top.get("description", ""), "description"),
        notes=_notes(top.get("notes", {}), configurations, faults),
        records=_records(top.get("records", [])),
        page=(source.parent / page) if page else None,
        results=source.parent / results,
    )


def prose(v: Any, where: str) -> str:
    """Text whose paragraphs are kept: split at blank lines (a literal YAML block, ``|``), each
    paragraph's lines joined by one space, the paragraphs joined by one blank line."""
    if not isinstance(v, str):
        raise ScenarioError(f"{where}: expected a string (paragraphs separated by blank lines)")
    return "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", v.strip()) if p.strip())


def _notes(
    data: Any, configurations: tuple[Configuration, ...], faults: tuple[FaultClass, ...]
) -> dict[str, str]:
    """Each note's cell must exist: a typo would otherwise drop the note without a word."""
    notes = mapping(data, "notes")
    ids = [f"{c.id}--{f.name}" for c in configurations for f in faults]
    out = {}
    for cid, text in notes.items():
        if cid not in ids:
            near = difflib.get_close_matches(str(cid), ids, n=1)
            raise ScenarioError(
                f"notes: {cid!r} is not a cell (CONFIGURATION--FAULT)"
                + (f"; did you mean {near[0]!r}?" if near else "")
                + f"; configurations: {', '.join(c.id for c in configurations)}; "
                f"faults: {', '.join(f.name for f in faults)}"
            )
        out[str(cid)] = prose(text, f"notes.{cid}")
        if not out[str(cid)]:
            raise ScenarioError(f"notes.{cid}: expected the note's text, got nothing")
    return out


def _records(data: Any) -> tuple[str, ...]:
    if not isinstance(data, list):
        raise ScenarioError("records: expected a list of paragraphs on how the records were made")
    return tuple(prose(p, f"records[{i}]") for i, p in enumerate(data))


def _configurations(data: Any) -> tuple[Configuration, ...]:
    if not isinstance(data, list) or not data:
        raise ScenarioError("configurations: expected a non-empty list of {id, broker, version, settings}")
    out: list[Configuration] = []
    for i, raw in enumerate(data):
        where = f"configurations[{i}]"
        c = mapping(raw, where)
        only(c, where, {"id", "label", "broker", "version", "settings", "nodes"})
        cid = _id(c.get("id"), f"{where}.id")
        if any(o.id == cid for o in out):
            raise ScenarioError(f"{where}.id: {cid!r} is used twice")
        broker = c.get("broker")
        if not isinstance(broker, str) or not broker:
            raise ScenarioError(f"{where}.broker: expected a broker plugin's name (`brokerchaos plugins`)")
        version = c.get("version")
        if version is not None and not isinstance(version, str | int | float):
            raise ScenarioError(f'{where}.version: expected a version such as "4.3" (or absent: the default)')
        label = c.get("label", cid)
        if not isinstance(label, str) or not label:
            raise ScenarioError(f"{where}.label: expected a non-empty string")
        nodes = c.get("nodes")
        out.append(
            Configuration(
                id=cid,
                broker=broker,
                label=label,
                version=None if version is None else str(version),
                settings=dict(mapping(c.get("settings", {}), f"{where}.settings")),
                nodes=None if nodes is None else integer(nodes, f"{where}.nodes", lo=1, hi=9),
            )
        )
    return tuple(out)


def _fault_classes(data: Any, base: Path) -> dict[str, FaultClass]:
    """A library file's classes (a path, or a list of paths, beside the matrix file) and/or classes
    given inline; an inline class replaces a library one of the same name."""
    if data is None:
        raise ScenarioError("fault_classes: required: a library file (e.g. fault-classes.yaml) or a mapping")
    items = data if isinstance(data, list) else [data]
    out: dict[str, FaultClass] = {}
    for item in items:
        if isinstance(item, str):
            lib = base / item
            where = f"{lib.name}"
            classes = mapping(
                read_file(lib, "fault_classes: library", "a path beside the matrix file"), where
            )
        else:
            where, classes = "fault_classes", mapping(item, "fault_classes")
        for name, spec in classes.items():
            out[str(name)] = _fault_class(str(name), spec, f"{where}.{name}")
    return out


def _fault_class(name: str, data: Any, where: str) -> FaultClass:
    _id(name, where)
    c = mapping(data, where)
    only(c, where, {"description", "schedule", "settle"})
    description = c.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ScenarioError(f"{where}.description: required: what the class stands for, in words")
    schedule = c.get("schedule")
    if not isinstance(schedule, list) or not schedule:
        raise ScenarioError(
            f"{where}.schedule: expected a non-empty list of steps like {{at: 8, fault: kill}}"
        )
    steps = tuple(dict(mapping(s, f"{where}.schedule[{i}]")) for i, s in enumerate(schedule))
    settle = c.get("settle")
    if settle is not None and (not isinstance(settle, int | float) or isinstance(settle, bool) or settle < 0):
        raise ScenarioError(f"{where}.settle: expected seconds >= 0")
    return FaultClass(
        name=name,
        description=" ".join(description.split()),
        schedule=steps,
        settle=None if settle is None else float(settle),
    )


def _names(v: Any, where: str) -> list[str]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise ScenarioError(f"{where}: expected a non-empty list of fault class names")
    if len(set(v)) != len(v):
        raise ScenarioError(f"{where}: a fault class is listed twice")
    return list(v)


def _id(v: Any, where: str) -> str:
    if not isinstance(v, str) or not ID.match(v):
        raise ScenarioError(f"{where}: expected lower-case letters, digits, dots and dashes, got {v!r}")
    return v
