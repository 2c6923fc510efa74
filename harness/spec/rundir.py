"""The run directory: the name of every file a run leaves, and the history's columns a checker reads.

``store/<scenario>/<timestamp>/`` holds what a run did, and a stored run is checked again from
it alone (``brokerchaos analyze``), so its file names are a contract between the harness that
writes them, the checkers and reports that read them, and anyone's scripts: they are spelled
here once.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.spec.history import FIELDS, OPTIONAL_FIELDS

SCENARIO_JSON = "scenario.json"
"""Everything needed to run it again (the scenario, its seed, the plan, the plugins' versions)."""
HISTORY_JSONL = "history.jsonl"
"""The history, one JSON record a line, written while the run goes."""
HISTORY_PARQUET = "history.parquet"
"""The same history as Parquet row groups: what the Spark engine reads."""
RESULTS_JSON = "results.json"
"""What the checkers found (the results schema, ``harness.spec.results``)."""
REPORT_HTML = "report.html"
"""The run's HTML report."""
PLOTS = "plots"
"""The report's figures (``plots/<name>.png``)."""
NODES = "nodes"
"""Per node (``nodes/<node>/``): its logs and the final listing of its data directory."""
GRADE_JSON = "grade.json"
"""A grade over many runs (written into the grade's own output directory)."""
GRADE_HTML = "grade.html"
"""The grade's HTML report."""

HISTORY_COLUMNS = tuple(name for name in FIELDS if name != "wall_time")
"""The columns a checker reads (``wall_time`` is for people)."""
OPTIONAL_COLUMNS = tuple(name for name in HISTORY_COLUMNS if name in OPTIONAL_FIELDS)
"""Columns an older history may lack: a checker reads them as nulls."""


def history_file(run_dir: Path, *, allow_jsonl: bool = True) -> Path | None:
    """The history a checker reads in ``run_dir``: the Parquet file, else (where ``allow_jsonl``) the
    JSONL one; None when there is neither (the caller says what to do)."""
    for name in (HISTORY_PARQUET, HISTORY_JSONL) if allow_jsonl else (HISTORY_PARQUET,):
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


DISJOINT_NODES = "disjoint_nodes"
"""The key of ``scenario.json``'s ``broker`` section that records the plugin's
``BrokerPlugin.disjoint_nodes`` for the run's settings."""


def disjoint_nodes(run_dir: Path) -> bool:
    """Whether a stored run's broker declared that its nodes hold disjoint messages (False for a
    run stored before the declaration existed, or a hand-made run directory without a scenario)."""
    path = Path(run_dir) / SCENARIO_JSON
    if not path.is_file():
        return False
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    broker = stored.get("broker") if isinstance(stored, dict) else None
    return isinstance(broker, dict) and broker.get(DISJOINT_NODES) is True
