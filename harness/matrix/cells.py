"""Cells: a configuration under a fault class, expanded into an ordinary scenario, and its content key.

Whether a configuration can express a fault class is decided by the same checks a run makes
before anything starts (``harness.runner.Run``: the plugin's settings, the capabilities each
planned fault kind requires, the host features it needs, the workload features the client has,
the planner's own resolution of every step): a cell that fails them says why, in the harness's
own words, and is never run. A matrix file's own mistakes (an unknown broker, fault kind or
checker, a workload field) end the command instead: they are not a broker's answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import __version__ as HARNESS_VERSION
from harness import scenario as scenario_mod
from harness.errors import BrokerChaosError, ScenarioError
from harness.host import Host
from harness.matrix.model import Configuration, FaultClass, Matrix
from harness.runner import Run
from harness.scenario import Scenario


@dataclass(frozen=True)
class Cell:
    configuration: Configuration
    fault: FaultClass
    #: The scenario the cell runs at its first seed (None: the configuration cannot express it).
    scenario: Scenario | None
    #: Why the configuration cannot express the fault class (None: it can).
    unsupported: str | None = None
    #: Whether runs of the cell preload libfaketime (the image the run uses differs).
    faketime: bool = False

    @property
    def id(self) -> str:
        return cell_id(self.configuration.id, self.fault.name)

    def at_seed(self, seed: int) -> Scenario:
        assert self.scenario is not None
        return scenario_mod.with_overrides(self.scenario, seed=seed)


def cell_id(configuration: str, fault: str) -> str:
    return f"{configuration}--{fault}"


def scenario_data(matrix: Matrix, conf: Configuration, fault: FaultClass, seed: int) -> dict[str, Any]:
    """The cell's scenario as a scenario file would write it; ``version`` goes to ``broker.version``."""
    broker: dict[str, Any] = {
        "plugin": conf.broker,
        "nodes": conf.nodes or matrix.nodes,
        "settings": dict(conf.settings),
    }
    if conf.version is not None:
        broker["version"] = conf.version
    nemesis: dict[str, Any] = {"schedule": [dict(s) for s in fault.schedule]}
    if fault.settle is not None:
        nemesis["settle"] = fault.settle
    data: dict[str, Any] = {
        "name": f"{matrix.name}-{cell_id(conf.id, fault.name)}",
        "seed": seed,
        "broker": broker,
        "workload": dict(matrix.workload),
        "nemesis": nemesis,
    }
    if matrix.checkers:
        data["checkers"] = list(matrix.checkers)
    if matrix.budgets:
        data["budgets"] = dict(matrix.budgets)
    return data


def expand(matrix: Matrix, host: Host) -> list[Cell]:
    """Every cell, row by row; raises on a mistake of the matrix file itself."""
    _check_names(matrix, host)
    return [_cell(matrix, host, conf, fault) for conf in matrix.configurations for fault in matrix.faults]


def _check_names(matrix: Matrix, host: Host) -> None:
    for conf in matrix.configurations:
        host.broker(conf.broker)  # an unknown plugin is the file's mistake: one line, exit 2
    for fault in matrix.faults:
        for step in fault.schedule:
            kind = step.get("fault")
            if kind not in host.registry.faults:
                raise ScenarioError(
                    f"fault class {fault.name!r}: fault kind {kind!r} is not provided by any loaded "
                    f"plugin; loaded: {', '.join(sorted(host.registry.faults))}"
                )
    for name in matrix.checkers:
        host.checker(name)


def _cell(matrix: Matrix, host: Host, conf: Configuration, fault: FaultClass) -> Cell:
    data = scenario_data(matrix, conf, fault, matrix.seeds[0])
    where = f"cell {cell_id(conf.id, fault.name)}"
    try:
        sc = scenario_mod.from_dict(data, default_name=data["name"])
    except ScenarioError as exc:
        if str(exc).startswith("broker."):  # the configuration's own fields: this tree cannot express them
            return Cell(conf, fault, None, unsupported=str(exc))
        raise ScenarioError(f"{where}: {exc}") from None
    try:
        run = Run(host, sc, Path("."))  # the checks a run makes before anything starts; nothing starts
    except BrokerChaosError as exc:
        return Cell(conf, fault, None, unsupported=str(exc))
    if not run.plan.steps:
        raise ScenarioError(
            f"{where}: every step of fault class {fault.name!r} starts after the workload's "
            f"{sc.workload.duration:g} s: lengthen workload.duration or move the steps"
        )
    return Cell(conf, fault, sc, faketime=run.faketime)


# -- content keys -------------------------------------------------------------------------------


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cell_key(scenario: Scenario, images: Mapping[str, str], harness: str = HARNESS_VERSION) -> str:
    """What a cell's runs depend on besides the seed: the expanded scenario, the images' content tags
    (the image builder's recipe hashes) and the harness's version."""
    sc = scenario.to_dict()
    sc.pop("seed", None)
    sc.pop("source", None)
    return _digest(canonical({"scenario": sc, "images": dict(images), "harness": harness}))


def seed_key(key: str, seed: int) -> str:
    return _digest(f"{key}:{seed}")


ImagesOf = Callable[[Cell], Mapping[str, str]]
"""The images a cell's runs use, by role (``broker``, ``toxiproxy``), as content-hashed tags."""


def docker_images(host: Host) -> ImagesOf:
    """The image builder's content tags of each cell's images, one computation per broker plugin,
    version and libfaketime choice: nothing is built and no Docker is asked. A cell's run builds
    what it needs when it starts (its ``images`` phase), so a matrix starts its first cell at once
    instead of first building every image the whole matrix will need."""
    from harness.runner import build_images

    seen: dict[tuple[str, str | None, bool], Mapping[str, str]] = {}

    def images(cell: Cell) -> Mapping[str, str]:
        k = (cell.configuration.broker, cell.configuration.version, cell.faketime)
        if k not in seen:
            seen[k] = build_images(None, host.broker(k[0], k[1]), faketime=k[2], tags_only=True)
        return seen[k]

    return images
