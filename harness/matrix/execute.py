"""Running a matrix: the cell-seeds without a record for their content key, side by side.

Each one is ``brokerchaos run`` on the cell's scenario file in a child process (the very command
a user would type, so a cell is an ordinary run: its run directory, report and history), with its
own store root ``<store>/matrix/<matrix>/<cell>/seed-<seed>/`` and its output in ``run.log``
there. A record is written only when the run has finished and been checked, so a matrix killed
mid-way resumes at the cell-seeds that have none. A cell's stale records (another content key)
stay until the cell has a record for its key: they are removed then, never before, so the page
shows a cell's last result until a new one replaces it. Interrupted, it sends SIGTERM to the runs it
started (a run handles it itself, even where it was started with SIGINT ignored, as a
background job of a shell is), which tear their clusters down, and waits for them.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.matrix import records
from harness.matrix.cells import Cell, ImagesOf, cell_key, seed_key
from harness.progress import say
from harness.spec.results import EXIT_DURABLE, EXIT_FAILED, EXIT_NO_FAULT_BIT, EXIT_UNKNOWN
from harness.spec.rundir import RESULTS_JSON
from harness.store import LATEST
from harness.verdicts import verdict_line

#: Exit statuses of ``brokerchaos run`` that mean a checked run (durable, failed, unknown, and
#: durable with no fault bitten: its record keeps that, see ``records.trim``).
CHECKED = (EXIT_DURABLE, EXIT_FAILED, EXIT_UNKNOWN, EXIT_NO_FAULT_BIT)
#: The first guess of a cell-seed's wall time beyond its workload, until one has finished.
OVERHEAD_GUESS_S = 90.0


def default_jobs() -> int:
    """Cells side by side: one per core. A cell is a cluster, a harness and a checker, but most
    of its time is waits (traffic, fault holds, the settle, the drain), so on two cores two cells
    at a time ran every row of the shipped matrix in 0.29 to 1.02 of its one-at-a-time time
    (docs/how-to/matrix.md, "Every row at `--jobs 2`")."""
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Job:
    cell: Cell
    seed: int
    key: str
    cell_key: str
    images: Mapping[str, str]


@dataclass
class Plan:
    jobs: list[Job] = field(default_factory=list)
    up_to_date: int = 0
    stale: list[Path] = field(default_factory=list)


def plan(
    cells: Sequence[Cell], seeds: Sequence[int], results: Path, images_of: ImagesOf, *, force: bool = False
) -> Plan:
    """What must run: every supported cell at every seed whose record is missing or has another key
    (``force``: every one)."""
    out = Plan()
    for cell in cells:
        if cell.scenario is None:
            continue
        images = images_of(cell)
        ck = cell_key(cell.scenario, images)
        out.stale += records.stale(results, cell.id, ck)
        for seed in seeds:
            key = seed_key(ck, seed)
            if not force and records.done(results, cell.id, seed, key):
                out.up_to_date += 1
            else:
                out.jobs.append(Job(cell, seed, key, ck, images))
    return out


@dataclass
class Outcome:
    job: Job
    record: dict[str, Any] | None  # None: the run did not finish checked
    error: str = ""
    seconds: float = 0.0


class Runner:
    """Runs jobs, ``jobs`` at a time, each through ``brokerchaos run`` in a child process."""

    def __init__(
        self, results: Path, store: Path, *, jobs: int, plugins: Sequence[str] = (), page: Path | None = None
    ) -> None:
        self.results = results
        #: What the matrix itself writes in the checkout: no reason to call a record's commit dirty.
        self.own = (results,) if page is None else (results, page)
        self.store = store
        self.jobs = jobs
        self.plugins = list(plugins)
        self._children: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._stopping = False

    def run(self, jobs: Sequence[Job], on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        outcomes: list[Outcome] = []
        pending = list(jobs)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="cell") as pool:
            running: dict[Future[Outcome], Job] = {}
            try:
                while pending or running:
                    while pending and len(running) < self.jobs:
                        job = pending.pop(0)
                        say("matrix", f"start {job.cell.id} seed {job.seed}")
                        running[pool.submit(self.one, job)] = job
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        running.pop(fut)
                        outcomes.append(fut.result())
                        self._progress(outcomes, len(jobs), pending, running.values(), started)
                        if on_done is not None:
                            on_done(outcomes[-1])
            except BaseException:
                self._interrupt()
                raise
        return outcomes

    def _progress(
        self, outcomes: list[Outcome], total: int, pending: Sequence[Job], running: Any, started: float
    ) -> None:
        o = outcomes[-1]
        what = verdict_line(o.record["results"]) if o.record else f"error: {o.error}"
        said = [x.seconds for x in outcomes if x.record is not None]
        left = [*pending, *running]
        per = statistics.mean(said) if said else None
        eta = (
            sum(per or (j.cell.at_seed(j.seed).workload.duration + OVERHEAD_GUESS_S) for j in left)
            / self.jobs
        )
        say(
            "matrix",
            f"[{len(outcomes)}/{total}] {o.job.cell.id} seed {o.job.seed}: {what} in {o.seconds:.0f} s; "
            f"{len(left)} left, about {eta / 60:.0f} min to go ({time.monotonic() - started:.0f} s so far)",
        )

    def one(self, job: Job) -> Outcome:
        root = self.store / job.cell.id / f"seed-{job.seed}"
        root.mkdir(parents=True, exist_ok=True)
        sc = job.cell.at_seed(job.seed)
        data = sc.to_dict()
        data.pop("source", None)
        scenario_file = root / "scenario.yaml"
        scenario_file.write_text(yaml.safe_dump(data, sort_keys=False))
        cmd = [sys.executable, "-m", "harness.cli", *(f"-p{p}" for p in self.plugins)]
        cmd += ["run", str(scenario_file), "--store", str(root)]
        t = time.monotonic()
        with (root / "run.log").open("wb") as log:
            code = self._call(cmd, log)
        seconds = time.monotonic() - t
        run_dir = (root / LATEST).resolve()
        if code not in CHECKED or not (run_dir / RESULTS_JSON).is_file():
            return Outcome(job, None, _last_line(root / "run.log", code), seconds)
        rec = records.make(
            cell=job.cell.id,
            seed=job.seed,
            key=job.key,
            cell_key=job.cell_key,
            images=job.images,
            scenario=data,
            results=json.loads((run_dir / RESULTS_JSON).read_text()),
            run_dir=run_dir,
            seconds=seconds,
            own=self.own,
        )
        records.write(records.path(self.results, job.cell.id, job.seed), rec)
        for stale in records.stale(self.results, job.cell.id, job.cell_key):
            say("matrix", f"removing stale record {stale} (replaced by the cell's record of seed {job.seed})")
            stale.unlink()
        return Outcome(job, rec, "", seconds)

    def _call(self, cmd: list[str], log: Any) -> int:
        with self._lock:
            if self._stopping:
                return 130
            # Its own process group: a Ctrl-C reaches the matrix only, which passes it on, so every
            # run gets exactly one interrupt and tears down its cluster.
            child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self._children.add(child)
        try:
            return child.wait()
        finally:
            with self._lock:
                self._children.discard(child)

    def _interrupt(self) -> None:
        with self._lock:
            self._stopping = True
            children = list(self._children)
        for child in children:
            say("matrix", f"interrupting run {child.pid}; it tears its cluster down")
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait()


def _last_line(log: Path, code: int) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    return f"exit {code}: {lines[-1] if lines else '(no output)'} (log: {log})"
