"""``brokerchaos matrix MATRIX.yaml``: run what is missing, grade every cell, write the page and outputs."""

from __future__ import annotations

import argparse
import fnmatch
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import BrokerChaosError
from harness.host import Host
from harness.matrix import execute, grading, model, page
from harness.matrix.cells import Cell, ImagesOf, docker_images, expand
from harness.progress import say
from harness.runner import EXIT_ERROR
from harness.store import add_store_option


def add_parser(sub: Any) -> None:
    m = sub.add_parser(
        "matrix",
        help="run a durability matrix (configurations x fault classes), only the cells whose records "
        "are missing or stale, then grade it and write its page",
    )
    m.add_argument("matrix", help="matrix file; the shipped one is matrices/brokers.yaml")
    m.add_argument(
        "--jobs",
        type=int,
        default=execute.default_jobs(),
        help=f"cells run side by side (default {execute.default_jobs()}: one per core)",
    )
    m.add_argument(
        "--seed",
        type=int,
        action="append",
        help="run these seeds (repeatable) instead of the file's; records of other seeds stay",
    )
    m.add_argument("--cell", action="append", help="only cells whose id matches this glob (repeatable)")
    m.add_argument("--force", action="store_true", help="run the chosen cells again even where recorded")
    m.add_argument("--plan", action="store_true", help="say what would run, run nothing")
    m.add_argument(
        "--recheck",
        choices=("spark", "python"),
        metavar="ENGINE",
        help="check every recorded run whose directory is still on local disk again from its history, in one grade "
        "job, and name the runs whose verdict differs from their record (exit 1)",
    )
    add_store_option(m)
    m.add_argument(
        "--out",
        help="directory for matrix.json, matrix.html and grade reports (default <store>/matrix/<name>)",
    )


def run(host: Host, args: argparse.Namespace, store: Path) -> int:
    if args.jobs < 1:
        raise BrokerChaosError("--jobs must be at least 1")
    if args.seed and any(s < 0 for s in args.seed):
        raise BrokerChaosError("--seed must be an integer >= 0")
    mx = model.load(args.matrix)
    cells = expand(mx, host)
    chosen = [c for c in cells if _chosen(c, args.cell)]
    if args.cell and not chosen:
        raise BrokerChaosError(
            f"--cell {' '.join(args.cell)} matches no cell; ids are CONFIGURATION--FAULT_CLASS"
        )
    unsupported = [c for c in chosen if c.unsupported is not None]
    seeds = tuple(args.seed or mx.seeds)
    images = docker_images(host)
    todo = execute.plan(chosen, seeds, mx.results, images, force=args.force)
    say(
        "matrix",
        f"{mx.name}: {len(cells)} cells ({len(unsupported)} chosen not supported), seeds {list(seeds)}: "
        f"{len(todo.jobs)} cell-seed(s) to run, {todo.up_to_date} up to date, "
        f"{len(todo.stale)} stale record(s), {args.jobs} at a time",
    )
    for job in todo.jobs:
        say("matrix", f"to run: {job.cell.id} seed {job.seed} (key {job.key})")
    if args.plan:
        return 0
    out = Path(args.out) if args.out else store / "matrix" / mx.name
    runner = execute.Runner(mx.results, out / "runs", jobs=args.jobs, plugins=args.plugins, page=mx.page)
    finished: list[execute.Outcome] = []
    # Both, explicitly: a matrix started in the background of a shell inherits SIGINT ignored.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        outcomes = runner.run(todo.jobs, on_done=finished.append)
    except KeyboardInterrupt:
        recorded = sum(1 for o in finished if o.record is not None)
        print(
            f"brokerchaos: matrix interrupted; {recorded} cell-seed(s) recorded, the runs in progress "
            "tore their clusters down; the same command resumes with the rest",
            file=sys.stderr,
        )
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return _publish(host, args, mx, cells, images, out, outcomes, todo.up_to_date)


def _publish(
    host: Host,
    args: argparse.Namespace,
    mx: model.Matrix,
    cells: Sequence[Cell],
    images: ImagesOf,
    out: Path,
    outcomes: Sequence[execute.Outcome],
    up_to_date: int,
) -> int:
    """Grade every cell, write the outputs and the page, say what did not finish."""
    data = grading.grade_matrix(host, mx, cells, images, reports=out / "cells")
    if args.recheck:
        data["recheck"] = grading.recheck(host, mx, cells, args.recheck, out / "recheck")
    j, h = page.write_outputs(data, out)
    print(
        f"\nmatrix {mx.name}: {sum(1 for o in outcomes if o.record)} cell-seed(s) run, {up_to_date} up to date"
    )
    print(f"  json   {j}\n  html   {h}")
    if mx.page is not None:
        write_page(mx, data)
        print(f"  page   {_rel(mx.page)}")
    if args.recheck:
        r = data["recheck"]
        print(f"  recheck ({r['engine']}): {r['runs']} run(s) checked again, {r['absent']} not on local disk")
        for d in r["disagree"]:
            print(
                f"brokerchaos: matrix: {d['cell']} seed {d['seed']}: the record says {d['record']}, {r['engine']} says {d[r['engine']]}"
            )
    failed = [o for o in outcomes if o.record is None]
    for o in failed:
        print(f"brokerchaos: matrix: {o.job.cell.id} seed {o.job.seed} did not finish: {o.error}")
    if failed:
        return EXIT_ERROR
    return 1 if args.recheck and data["recheck"]["disagree"] else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def write_page(mx: model.Matrix, data: Any) -> None:
    assert mx.page is not None
    mx.page.parent.mkdir(parents=True, exist_ok=True)
    mx.page.write_text(render_page(mx, data, Path.cwd()))


def render_page(mx: model.Matrix, data: Any, root: Path) -> str:
    """The docs page; paths on it are relative to ``root`` (the checkout's top)."""
    return page.markdown(data, source=_rel(mx.source, root), results=_rel(mx.results, root))


def _rel(p: Path, root: Path | None = None) -> str:
    try:
        return str(p.resolve().relative_to((root or Path.cwd()).resolve()))
    except ValueError:
        return str(p)


def _chosen(cell: Cell, globs: Sequence[str] | None) -> bool:
    return not globs or any(fnmatch.fnmatchcase(cell.id, g) for g in globs)
