"""The run directory: ``store/<scenario>/<timestamp>/`` with everything a run did.

``scenario.json`` (the scenario, seed, planned schedule, plugin versions: enough
to rerun), ``history.jsonl`` + ``history.parquet``, ``nodes/<node>/`` (logs, data
directory listing), ``results.json``, ``report.html`` + ``plots/``.
``store/latest`` points at the newest run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import secrets
from pathlib import Path
from typing import Any

from harness.errors import BrokerChaosError
from harness.spec.rundir import HISTORY_JSONL, HISTORY_PARQUET, SCENARIO_JSON

LATEST = "latest"
"""In the store root: the link to the newest run directory."""


def default_root() -> Path:
    return Path(os.environ.get("BROKERCHAOS_STORE", "store"))


def add_store_option(parser: argparse.ArgumentParser) -> None:
    """``--store``, as every command that keeps runs takes it (``default_root`` when not given)."""
    parser.add_argument(
        "--store", default=None, help="run store root (default ./store or $BROKERCHAOS_STORE)"
    )


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, root: Path, scenario_name: str) -> RunDir:
        """A new directory that no concurrent run can also get, and ``latest`` pointing at it.

        mkdir is the claim (two runs of one scenario in one second both see the name
        free, only one creates it); the link is swapped in by rename from a name of this
        caller's own, so two runs never unlink each other's half-made link.
        """
        stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
        base = root / scenario_name
        base.mkdir(parents=True, exist_ok=True)
        path = base / stamp
        n = 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = base / f"{stamp}-{n}"
        latest = root / LATEST
        tmp = root / f".latest.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        tmp.symlink_to(path.relative_to(root))
        tmp.replace(latest)
        return cls(path)

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        p = Path(path)
        if p.is_symlink():
            p = p.resolve()
        if not (p / SCENARIO_JSON).exists():
            raise BrokerChaosError(
                f"{path} is not a run directory (no scenario.json); runs are under store/<scenario>/"
            )
        if not (p / HISTORY_JSONL).exists() and not (p / HISTORY_PARQUET).exists():
            raise BrokerChaosError(f"{path} has no history (history.jsonl or history.parquet)")
        return cls(p)

    @property
    def history_jsonl(self) -> Path:
        return self.path / HISTORY_JSONL

    @property
    def history_parquet(self) -> Path:
        return self.path / HISTORY_PARQUET

    def write_json(self, name: str, data: Any) -> Path:
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(target)
        return target

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())
