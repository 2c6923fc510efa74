"""The detection bench's general-suite and explore columns, without Docker: the catalogue's
general suite is shipped and valid, and the report puts the three numbers side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.detection import REPO, general_markdown, load_general, markdown, parse_args
from harness.errors import BrokerChaosError
from harness.scenario import load


def test_the_general_suite_is_shipped_reference_scenarios() -> None:
    suite = load_general()
    assert suite and len(set(suite)) == len(suite)
    for path in suite:
        assert path.is_relative_to(REPO / "scenarios")
        assert load(path).broker.plugin == "reference"


def test_a_catalogue_without_a_general_suite_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "catalogue.yaml"
    bad.write_text("bugs: []\n")
    with pytest.raises(BrokerChaosError, match=r"no general scenarios listed"):
        load_general(bad)
    bad.write_text("general: [scenarios/nope.yaml]\n")
    with pytest.raises(BrokerChaosError, match=r"general: scenarios/nope.yaml does not exist"):
        load_general(bad)


def test_explore_minutes_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--explore", "0"])
    assert "--explore must be a positive number of minutes" in capsys.readouterr().err


def data(general: dict | None, explore: dict | None) -> dict:
    bug = {"label": "15-x", "area": "store", "scenario": "scenarios/s.yaml", "expect": "LOST"}
    bug |= {"id": "15", "name": "x", "patch": "p", "description": "d.", "precedent": "p."}
    return {
        "command": "python -m bench.detection --general",
        "facts": {
            "date": "d",
            "nproc": 2,
            "cpu": "c",
            "memory_bytes": 2**30,
            "kernel": "k",
            "docker_server": "20",
            "python": "3.11",
            "client_libraries": {},
            "load_average_at_start": [1.0, 1.0, 1.0],
        },
        "settings": {
            "runs": 1,
            "clean_runs": 0,
            "seed_base": 100,
            "store": "store",
            "general": ["scenarios/crash.yaml", "scenarios/power-loss.yaml"],
            "explore_minutes": 5.0 if explore else None,
        },
        "interrupted": False,
        "wall_seconds": 1.0,
        "summary": {
            "bugs_run": 0,
            "bugs_caught": 0,
            "bugs_caught_as_expected": 0,
            "bugs_waiting": [],
            "bugs_error": [],
            "median_seconds_to_detection": None,
            "max_runs_to_detection": None,
            "clean_runs": 0,
            "clean_durable": 0,
            "false_alarms": 0,
            "clean_inconclusive": 0,
            "general_run": 1 if general else 0,
            "general_caught": 1 if general and general["status"] == "caught" else 0,
            "explore_run": 1 if explore else 0,
            "explore_caught": 1 if explore and explore["status"] == "caught" else 0,
        },
        "bugs": [
            {
                "bug": bug,
                "status": "not run",
                "runs": [],
                "runs_to_detection": None,
                "seconds_to_detection": None,
                "general": general,
                "explore": explore,
            }
        ],
        "clean": [],
    }


def test_the_report_shows_targeted_general_and_explore_side_by_side() -> None:
    run = {
        "scenario": "scenarios/crash.yaml",
        "seed": 100,
        "verdict": "durable",
        "seconds": 60.0,
        "run_dir": "r1",
    }
    lost = {**run, "scenario": "scenarios/power-loss.yaml", "verdict": "LOST", "run_dir": "r2"}
    general = {"status": "caught", "runs": [run, lost], "seconds": 130.0, "by": "scenarios/power-loss.yaml"}
    search = {
        "scenario": "scenarios/crash.yaml",
        "runs": 4,
        "cells": 80,
        "seconds": 300.0,
        "verdict": None,
        "failing_schedule": None,
        "run_dir": None,
    }
    explore = {"status": "missed", "searches": [search], "seconds": None, "by": None}
    text = "\n".join(general_markdown(data(general, explore)))
    assert "caught **1 of 1**" in text and "5 min each" in text and "caught **0 of 1**" in text
    assert (
        "| 15-x | `s.yaml` | not run | caught by `power-loss.yaml` in 130 s (2 runs) | missed (1 searches) |"
        in text
    )
    assert "- 15-x general `power-loss.yaml` seed 100: LOST in 60 s (`r2`)" in text
    assert "- 15-x explore from `crash.yaml`: 4 run(s), 80 cells, 300 s, no failure" in text
    assert "## Beyond the targeted scenario" in markdown(data(general, explore))
    assert general_markdown(data(None, None)) == []
