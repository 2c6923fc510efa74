"""`brokerchaos matrix` without Docker: the file, the cells and what they can express, content
keys, what a rerun plans (nothing, one seed, stale records), grading records and the page."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.errors import ScenarioError
from harness.host import Host
from harness.matrix import execute, figure, grading, model, page, records
from harness.matrix.cells import Cell, cell_key, docker_images, expand, scenario_data, seed_key
from harness.runner import check_run
from harness.spec.results import EXIT_NO_FAULT_BIT
from harness.store import RunDir
from harness.verdicts import exit_code
from tests.harness.test_cli_grade import _run

REPO = Path(__file__).resolve().parents[2]

CLASSES = {
    "killed": {
        "description": "kill n1",
        "schedule": [{"at": 2, "fault": "kill", "params": {"node": "n1"}, "hold": 1}],
    },
    "isolated": {
        "description": "isolate n1",
        "schedule": [
            {"at": 2, "fault": "partition", "params": {"shape": "isolate", "node": "n1"}, "hold": 1}
        ],
    },
    "clock": {
        "description": "clock",
        "schedule": [{"at": 2, "fault": "clock-bump", "params": {"node": "n1"}}],
    },
}


def _matrix(tmp: Path, **over: Any) -> Path:
    data: dict[str, Any] = {
        "name": "tiny",
        "seeds": [1],
        "nodes": 1,
        "workload": {"duration": 5, "rate": 50},
        "checkers": ["python"],
        "fault_classes": CLASSES,
        "faults": ["killed", "isolated"],
        "configurations": [
            {"id": "sync", "broker": "reference", "settings": {"flush": "sync"}},
            {"id": "async", "broker": "reference", "settings": {"flush": "async"}},
        ],
        "page": "page.md",
    }
    data.update(over)
    p = tmp / "tiny.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _images(tag: str = "brokerchaos/reference:aaaa") -> execute.ImagesOf:
    return lambda cell: {"broker": tag, "toxiproxy": "brokerchaos/toxiproxy:bbbb"}


# -- the file ---------------------------------------------------------------------------------


def test_the_shipped_matrix_loads_and_every_cell_is_run_or_says_why(host: Host) -> None:
    mx = model.load(REPO / "matrices" / "brokers.yaml")
    cells = expand(mx, host)
    assert len(cells) == len(mx.configurations) * len(mx.faults)
    redis_clock = next(c for c in cells if c.id == "redis-7.0-sentinel--clock-jump")
    assert redis_clock.scenario is None
    assert "clock" in (redis_clock.unsupported or "") and "redis" in (redis_clock.unsupported or "")
    assert next(c for c in cells if c.id == "reference-mirrored-sync--leader-killed").unsupported is None
    for version_row in ("rabbitmq-4.3-quorum", "nats-2.15.1-r3", "redis-8-sentinel", "valkey-9-sentinel"):
        cell = next(c for c in cells if c.id == f"{version_row}--leader-killed")
        assert cell.unsupported is None, (version_row, cell.unsupported)
    # The stream row runs the rabbitmq-stream plugin, the shared workload's two consumers as one
    # single-active-consumer group: the cells its plugin can express run.
    stream = {c.fault.name: c for c in cells if c.configuration.id == "rabbitmq-4.3-stream"}
    assert {c.configuration.broker for c in stream.values()} == {"rabbitmq-stream"}
    assert stream["leader-killed"].unsupported is None and stream["power-loss-all"].unsupported is None


def test_a_plan_keys_cells_by_image_tags_without_building_or_asking_docker(host: Host) -> None:
    # No Docker client at all: a plan that tried to build (or look an image up) would fail here.
    mx = model.load(REPO / "matrices" / "brokers.yaml")
    cell = next(c for c in expand(mx, host) if c.id == "reference-mirrored-sync--leader-killed")
    images = docker_images(host)(cell)
    assert images["broker"].startswith("brokerchaos/reference:")
    assert images["toxiproxy"].startswith("brokerchaos/toxiproxy:")
    assert images == docker_images(host)(cell)  # content tags: the same answer twice


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"faults": ["nope"]}, "faults: 'nope' is not a fault class"),
        ({"seeds": []}, "seeds: expected a non-empty list"),
        ({"colour": 1}, "colour: unknown field"),
        (
            {"configurations": [{"id": "a", "broker": "reference"}, {"id": "a", "broker": "reference"}]},
            "used twice",
        ),
        ({"configurations": [{"id": "Bad Id", "broker": "reference"}]}, "configurations[0].id"),
        ({"fault_classes": {"x": {"schedule": [{"at": 1, "fault": "kill"}]}}}, "description: required"),
    ],
)
def test_a_bad_matrix_file_is_one_line_naming_the_field(
    tmp_path: Path, over: dict[str, Any], words: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        model.load(_matrix(tmp_path, **over))
    assert words in str(err.value) and "\n" not in str(err.value)


def _not_yaml(tmp: Path) -> Path:
    (tmp / "bad.yaml").write_text("name: [unclosed\n")
    return tmp / "bad.yaml"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (
            lambda tmp: tmp / "none.yaml",
            "matrix file {p!r} does not exist (the shipped ones are in matrices/)",
        ),
        (_not_yaml, "{p}: not valid YAML: "),
        (
            lambda tmp: _matrix(tmp, fault_classes="gone.yaml"),
            "fault_classes: library file {lib!r} does not exist",
        ),
    ],
    ids=["missing", "not-yaml", "missing-library"],
)
def test_a_matrix_or_library_file_that_is_missing_or_not_yaml_is_one_line(
    tmp_path: Path, make: Callable[[Path], Path], words: str
) -> None:
    p = make(tmp_path)
    with pytest.raises(ScenarioError) as err:
        model.load(p)
    said = words.format(p=str(p), lib=str(tmp_path / "gone.yaml"))
    assert said in str(err.value) and "\n" not in str(err.value)


def test_mistakes_of_the_file_end_the_command_not_a_cell(tmp_path: Path, host: Host) -> None:
    bad_kind = {"odd": {"description": "x", "schedule": [{"at": 1, "fault": "no-such-kind"}]}}
    with pytest.raises(ScenarioError, match="no-such-kind"):
        expand(model.load(_matrix(tmp_path, fault_classes=bad_kind, faults=["odd"])), host)
    with pytest.raises(ScenarioError, match="workload.rat"):
        expand(model.load(_matrix(tmp_path, workload={"rat": 3})), host)
    with pytest.raises(ScenarioError, match="starts after the workload"):
        expand(model.load(_matrix(tmp_path, workload={"duration": 1})), host)


def test_a_note_on_a_cell_that_does_not_exist_is_one_line_naming_it_and_the_cells(tmp_path: Path) -> None:
    # A typo must not drop a note without a word: the id, the nearest cell and what exists.
    with pytest.raises(ScenarioError) as err:
        model.load(_matrix(tmp_path, notes={"sync--kiled": "lost one"}))
    said = str(err.value)
    assert "notes: 'sync--kiled' is not a cell (CONFIGURATION--FAULT)" in said and "\n" not in said
    assert "did you mean 'sync--killed'?" in said
    assert "configurations: sync, async; faults: killed, isolated" in said
    with pytest.raises(ScenarioError, match=r"notes.sync--killed: expected a string"):
        model.load(_matrix(tmp_path, notes={"sync--killed": ["a list"]}))
    with pytest.raises(ScenarioError, match="records: expected a list of paragraphs"):
        model.load(_matrix(tmp_path, records="one string"))


def test_prose_keeps_paragraphs_and_joins_a_paragraph_s_lines(tmp_path: Path) -> None:
    mx = model.load(
        _matrix(
            tmp_path,
            description="What it is,\nin two lines.\n\n  And a second paragraph.\n",
            notes={"async--isolated": "A note on a cell\nnot supported is fine."},
            records=["Made at `abc1234`,\n2026-01-01.", "Re-keyed."],
        )
    )
    assert mx.description == "What it is, in two lines.\n\nAnd a second paragraph."
    assert mx.notes == {"async--isolated": "A note on a cell not supported is fine."}
    assert mx.records == ("Made at `abc1234`, 2026-01-01.", "Re-keyed.")


def test_the_shipped_matrix_s_notes_name_cells_and_its_description_is_short() -> None:
    mx = model.load(REPO / "matrices" / "brokers.yaml")
    assert mx.notes and mx.records
    assert len(mx.description) < 2000, "a cell's story goes in notes:, the records' history in records:"


# -- cells ----------------------------------------------------------------------------------


def test_a_cell_the_configuration_cannot_express_says_why(tmp_path: Path, host: Host) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed", "isolated"]))
    cells = {c.id: c for c in expand(mx, host)}
    assert cells["sync--killed"].unsupported is None
    assert cells["sync--killed"].scenario is not None
    # one node: the planner cannot isolate it from peers it does not have
    assert "at least 2 nodes" in (cells["sync--isolated"].unsupported or "")


def test_a_version_goes_to_broker_version(tmp_path: Path, host: Host) -> None:
    confs = [{"id": "v", "broker": "reference", "version": "9.9"}]
    mx = model.load(_matrix(tmp_path, configurations=confs, faults=["killed"]))
    assert scenario_data(mx, mx.configurations[0], mx.faults[0], 1)["broker"]["version"] == "9.9"
    (cell,) = expand(mx, host)
    if cell.scenario is None:  # a scenario model without broker.version: the cell says so
        assert (cell.unsupported or "").startswith("broker.version")
    else:
        assert cell.scenario.to_dict()["broker"]["version"] == "9.9"


def test_the_content_key_follows_scenario_images_and_harness_not_the_seed(tmp_path: Path, host: Host) -> None:
    a, b = expand(model.load(_matrix(tmp_path, faults=["killed"])), host)
    assert a.scenario is not None and b.scenario is not None
    images = {"broker": "x:1", "toxiproxy": "t:1"}
    k = cell_key(a.scenario, images)
    assert k == cell_key(a.at_seed(7), images)
    assert k != cell_key(b.scenario, images)  # another setting
    assert k != cell_key(a.scenario, {**images, "broker": "x:2"})  # another image recipe
    assert k != cell_key(a.scenario, images, harness="0.0.0")
    assert len({seed_key(k, s) for s in range(5)}) == 5


def test_prose_of_the_matrix_file_never_changes_a_content_key(tmp_path: Path, host: Host) -> None:
    # Editing the description, a note or the records' history must never run a cell again.
    plain = expand(model.load(_matrix(tmp_path, faults=["killed"])), host)
    prose = {
        "description": "Another description.",
        "notes": {"sync--killed": "A note."},
        "records": ["How they were made."],
    }
    noted = expand(model.load(_matrix(tmp_path, faults=["killed"], **prose)), host)
    images = {"broker": "x:1", "toxiproxy": "t:1"}
    for a, b in zip(plain, noted, strict=True):
        assert a.scenario is not None and b.scenario is not None
        assert cell_key(a.scenario, images) == cell_key(b.scenario, images)


# -- planning: resume, rerun, another seed -----------------------------------------------


def _record(cell: Cell, seed: int, key: str, ck: str, res: dict[str, Any] | None = None) -> dict[str, Any]:
    assert cell.scenario is not None
    return {
        "schema": records.SCHEMA,
        "cell": cell.id,
        "seed": seed,
        "key": key,
        "cell_key": ck,
        "images": {},
        "commit": "abc",
        "date": "2026-01-01T00:00:00Z",
        "run_dir": f"/runs/{cell.id}/{seed}",
        "seconds": 30.0,
        "scenario": cell.at_seed(seed).to_dict(),
        "results": records.trim(res or {}),
    }


def _record_all(mx: model.Matrix, cells: list[Cell], plan: execute.Plan) -> None:
    for j in plan.jobs:
        records.write(records.path(mx.results, j.cell.id, j.seed), _record(j.cell, j.seed, j.key, j.cell_key))


def test_recorded_cells_are_not_run_again_and_a_new_seed_runs_only_its_cells(
    tmp_path: Path, host: Host
) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    cells = expand(mx, host)
    first = execute.plan(cells, [1], mx.results, _images())
    assert [(j.cell.id, j.seed) for j in first.jobs] == [("sync--killed", 1), ("async--killed", 1)]
    _record_all(mx, cells, first)
    again = execute.plan(cells, [1], mx.results, _images())
    assert again.jobs == [] and again.up_to_date == 2
    more = execute.plan(cells, [1, 2], mx.results, _images())
    assert [(j.cell.id, j.seed) for j in more.jobs] == [("sync--killed", 2), ("async--killed", 2)]
    assert len(execute.plan(cells, [1], mx.results, _images(), force=True).jobs) == 2


def test_an_interrupted_matrix_resumes_where_records_stop(tmp_path: Path, host: Host) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    cells = expand(mx, host)
    todo = execute.plan(cells, [1, 2], mx.results, _images())
    done, rest = todo.jobs[:1], todo.jobs[1:]
    _record_all(mx, cells, execute.Plan(jobs=done))
    half = records.path(mx.results, rest[0].cell.id, rest[0].seed).with_suffix(".json.tmp")
    half.parent.mkdir(parents=True, exist_ok=True)
    half.write_text('{"schema": 1, "ke')  # killed while writing: the record never replaced a file
    resumed = execute.plan(cells, [1, 2], mx.results, _images())
    assert [(j.cell.id, j.seed) for j in resumed.jobs] == [(j.cell.id, j.seed) for j in rest]


def test_a_changed_recipe_makes_the_records_stale(tmp_path: Path, host: Host) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    cells = expand(mx, host)
    _record_all(mx, cells, execute.plan(cells, [1], mx.results, _images()))
    changed = execute.plan(cells, [1], mx.results, _images("brokerchaos/reference:cccc"))
    assert len(changed.jobs) == 2 and len(changed.stale) == 2


def _finished_run(code: int) -> Callable[..., int]:
    """``Runner._call`` standing in for ``brokerchaos run``: a checked run directory, exit ``code``."""

    def call(self: execute.Runner, cmd: list[str], log: Any) -> int:
        root = Path(cmd[cmd.index("--store") + 1])
        (root / "run").mkdir(parents=True, exist_ok=True)
        (root / "run" / "results.json").write_text(json.dumps({"verdict": "durable", "valid": True}))
        (root / "latest").symlink_to(root / "run")
        return code

    return call


def test_stale_records_stay_until_the_cell_has_a_record_for_its_key(
    tmp_path: Path, host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    cells = expand(mx, host)
    _record_all(mx, cells, execute.plan(cells, [1, 2], mx.results, _images()))
    changed = execute.plan(cells, [1, 2], mx.results, _images("brokerchaos/reference:cccc"))
    assert len(changed.stale) == 4
    monkeypatch.setattr(execute.Runner, "_call", _finished_run(130))  # interrupted: no record
    runner = execute.Runner(mx.results, tmp_path / "store", jobs=1)
    assert runner.one(changed.jobs[0]).record is None
    assert all(p.exists() for p in changed.stale)  # nothing replaced them: they stay
    monkeypatch.setattr(execute.Runner, "_call", _finished_run(0))
    job = changed.jobs[1]  # sync--killed seed 2
    assert runner.one(job).record is not None
    kept = sorted(p.relative_to(mx.results).as_posix() for p in mx.results.rglob("seed-*.json"))
    assert kept == ["async--killed/seed-1.json", "async--killed/seed-2.json", "sync--killed/seed-2.json"]
    assert records.done(mx.results, job.cell.id, 2, job.key)


# -- grading and the page -----------------------------------------------------------------


def _checked(tmp: Path, name: str, lost: int, host: Host) -> dict[str, Any]:
    """A real check (the python checker) of a history that confirms 20 and loses ``lost``."""
    d = _run(tmp, name, lost)
    return check_run(host, RunDir(d), json.loads((d / "scenario.json").read_text())["scenario"], ["python"])


def test_cells_are_graded_over_their_seeds_and_published(tmp_path: Path, host: Host) -> None:
    mx = model.load(_matrix(tmp_path))
    cells = expand(mx, host)
    todo = execute.plan(cells, [1, 2, 3], mx.results, _images())
    for j in todo.jobs:
        lost = 2 if (j.cell.configuration.id, j.seed) == ("async", 2) else 0
        res = _checked(tmp_path / "runs", f"{j.cell.id}-{j.seed}", lost, host)
        records.write(
            records.path(mx.results, j.cell.id, j.seed), _record(j.cell, j.seed, j.key, j.cell_key, res)
        )
    data = grading.grade_matrix(host, mx, cells, _images())
    by = {c["cell"]: c for c in data["cells"]}
    durable, lossy = by["sync--killed"], by["async--killed"]
    assert durable["verdict"] == "durable" and durable["runs_lost"] == 0 and durable["graded_runs"] == 3
    assert durable["runs_lost_interval"] == "one-sided"
    assert durable["runs_lost_high"] == pytest.approx(1 - 0.05 ** (1 / 3))  # exact: 0 of 3
    assert lossy["verdict"] == "LOST" and lossy["runs_lost"] == 1
    assert lossy["lost_per_million"] == pytest.approx(2 / 60 * 1e6, rel=1e-4)
    assert by["sync--isolated"]["state"] == "unsupported"
    text = page.markdown(data, source="tiny.yaml", results="results/tiny")
    assert "1/3 runs lost (1%–91%)" in text
    assert "0/3 runs lost (≤ 63%)" in text
    assert page.COLOURS["LOST"] in text and ">not supported<" in text
    assert "Not supported: partition shape 'isolate'" in text
    assert "What a cell does not prove" in text and "longest outage " in text
    assert "{#cell-async--killed}" in text and "](#cell-async--killed)" in text
    # Every seed's figure, drawn from its record: the 20 confirmed publishes are all in it.
    seed = by["async--killed"]["seeds"][1]
    assert sum(seed["timeline"]["publish_ok"]) == 20 and sum(seed["timeline"]["consume_ok"]) == 18
    assert text.count("<svg") == 6 and "<title>async--killed seed 2</title>" in text
    out = page.write_outputs(data, tmp_path / "out")
    written = {c["cell"]: c for c in json.loads(out[0].read_text())["cells"]}
    assert written["async--killed"]["verdict"] == "LOST"
    assert "<table>" in out[1].read_text()


def test_notes_go_under_their_cells_and_the_records_history_at_the_end(tmp_path: Path, host: Host) -> None:
    notes = {
        "sync--killed": "Not run yet, and its note is still shown.\n\nA second paragraph.",
        "sync--isolated": "A note on a cell that is not supported.",
    }
    mx = model.load(
        _matrix(
            tmp_path, description="One.\n\nTwo.", notes=notes, records=["Made at `abc1234`.", "Re-keyed."]
        )
    )
    data = grading.grade_matrix(host, mx, expand(mx, host), _images())
    by = {c["cell"]: c for c in data["cells"]}
    assert by["sync--killed"]["state"] == "not run" and by["async--killed"]["note"] is None
    assert by["sync--isolated"]["note"] == notes["sync--isolated"]
    text = page.markdown(data, source="tiny.yaml", results="results/tiny")
    assert text.index("One.\n\nTwo.\n") < text.index("## The matrix")
    row = next(line for line in text.splitlines() if line.startswith("| [sync]"))
    assert row.count("[note](#cell-sync--") == 2 and "[note]" not in next(
        line for line in text.splitlines() if line.startswith("| [async]")
    )
    section = text[text.index("{#cell-sync--killed}") :]
    assert (
        section.index("**Note:** Not run yet") < section.index("A second paragraph.") < section.index("###")
    )
    isolated = text[text.index("{#cell-sync--isolated}") :]
    assert isolated.index("**Note:** A note on a cell") < isolated.index("Not supported: ")
    assert "{#cell-async--killed}" not in text  # not run, no note: nothing to show
    end = text.index("## How these records were made")
    assert end > text.index("## Cells") and text[end:].endswith("Made at `abc1234`.\n\nRe-keyed.\n")
    j, h = page.write_outputs(data, tmp_path / "out")
    written = json.loads(j.read_text())
    assert written["records"] == ["Made at `abc1234`.", "Re-keyed."]
    assert {c["cell"]: c["note"] for c in written["cells"] if c["note"]} == notes
    table = h.read_text()
    assert table.count('<a href="#cell-sync--') == 2 and '<h3 id="cell-sync--killed">' in table
    assert "<p>A second paragraph.</p>" in table and "<h2>How these records were made</h2>" in table


def test_a_cell_whose_records_are_all_stale_shows_its_last_result_marked_stale(
    tmp_path: Path, host: Host
) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    cells = expand(mx, host)
    old = execute.plan(cells, [1, 2], mx.results, _images("brokerchaos/reference:old"))
    for j in old.jobs:  # every cell lost in seed 2 under the older recipe
        res = _checked(tmp_path / "runs", f"old-{j.cell.id}-{j.seed}", 2 if j.seed == 2 else 0, host)
        rec = _record(j.cell, j.seed, j.key, j.cell_key, res) | {
            "commit": "0ld",
            "date": f"2026-01-0{j.seed}T00:00:00Z",
        }
        records.write(records.path(mx.results, j.cell.id, j.seed), rec)
    now = execute.plan(cells, [1, 2], mx.results, _images())
    sync_1 = next(j for j in now.jobs if (j.cell.id, j.seed) == ("sync--killed", 1))
    res = _checked(tmp_path / "runs", "now-sync-1", 0, host)
    records.write(
        records.path(mx.results, "sync--killed", 1), _record(sync_1.cell, 1, sync_1.key, sync_1.cell_key, res)
    )
    data = grading.grade_matrix(host, mx, cells, _images())
    by = {c["cell"]: c for c in data["cells"]}
    current, stale = by["sync--killed"], by["async--killed"]
    # A current record: graded alone, never mixed with the stale seed 2 beside it.
    assert current["stale"] is None and current["verdict"] == "durable" and current["runs"] == 1
    # Only stale records: the last result, graded over the records of its key, marked stale.
    assert stale["state"] == "graded" and stale["verdict"] == "LOST" and stale["runs"] == 2
    assert stale["stale"] == {"commit": "0ld", "date": "2026-01-02T00:00:00Z", "records": 2}
    assert data["counts"] == {"current": 1, "stale": 1, "not run": 0, "unsupported": 0}
    assert page.cell_lines(stale)[:2] == ["LOST", "stale: recorded 2026-01-02 at 0ld, under another key"]
    text = page.markdown(data, source="tiny.yaml", results="results/tiny")
    row = next(line for line in text.splitlines() if line.startswith("| [async]"))
    assert ">LOST (stale)</span>" in row and page.STALE_STYLE in row
    assert "**Stale:** 2 record(s), the last made 2026-01-02T00:00:00Z at `0ld`" in text
    assert "Cells: 1 graded from records of this tree's content keys, 1 from stale records" in text
    out = page.write_outputs(data, tmp_path / "out")
    written = {c["cell"]: c for c in json.loads(out[0].read_text())["cells"]}
    assert written["async--killed"]["stale"]["commit"] == "0ld" and written["sync--killed"]["stale"] is None
    assert (
        page.STALE_STYLE in out[1].read_text() and "stale: recorded 2026-01-02 at 0ld" in out[1].read_text()
    )


def test_a_figure_shades_each_fault_window_and_draws_empty_seconds_as_zero() -> None:
    tl = figure.series(
        {
            "bucket_s": 1,
            "rows": [
                {"t_s": 0, "f": "publish", "type": "ok", "count": 50},
                {"t_s": 3, "f": "publish", "type": "ok", "count": 40},
                {"t_s": 3, "f": "consume", "type": "ok", "count": 10},
                {"t_s": 2, "f": "publish", "type": "fail", "count": 7},
            ],
        }
    )
    assert tl == {"bucket_s": 1, "publish_ok": [50, 0, 0, 40], "consume_ok": [0, 0, 0, 10]}
    faults = figure.windows([{"start_ns": 1_040_000_000, "end_ns": 2_960_000_000, "kind": "kill"}])
    assert faults == [[1.0, 3.0, "kill"]]
    drawn = figure.svg({**tl, "faults": faults}, "one run")
    assert drawn.count("fill-opacity") == 1 and "<title>kill 1-3 s</title>" in drawn
    assert "50/s" in drawn and figure.svg({}, "nothing") == ""


def test_a_bad_matrix_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nfaults: 3\n")
    for argv in ([str(bad)], [str(tmp_path / "missing.yaml")], [str(bad), "--jobs", "0"]):
        r = subprocess.run(
            [sys.executable, "-m", "harness.cli", "matrix", *argv], capture_output=True, text=True, cwd=REPO
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("brokerchaos: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_recheck_names_a_record_its_history_contradicts(tmp_path: Path, host: Host) -> None:
    mx = model.load(
        _matrix(tmp_path, faults=["killed"], configurations=[{"id": "sync", "broker": "reference"}])
    )
    cells = expand(mx, host)
    for j in execute.plan(cells, [1, 2], mx.results, _images()).jobs:
        d = _run(tmp_path / "runs", f"seed-{j.seed}", 2 if j.seed == 2 else 0)
        res = check_run(host, RunDir(d), {"name": "x", "checkers": ["python"]}, ["python"])
        rec = _record(j.cell, j.seed, j.key, j.cell_key, res) | {"run_dir": str(d)}
        if j.seed == 2:
            rec["results"]["verdict"] = "durable"  # a record that says otherwise than its history
        records.write(records.path(mx.results, j.cell.id, j.seed), rec)
    found = grading.recheck(host, mx, cells, "python", tmp_path / "recheck")
    assert found["runs"] == 2 and found["absent"] == 0
    assert found["disagree"] == [{"cell": "sync--killed", "seed": 2, "record": "durable", "python": "LOST"}]


def test_a_workload_the_client_refuses_is_not_supported_before_anything_starts(
    tmp_path: Path, host: Host
) -> None:
    # A stream keeps what is read, so a consumer that gives deliveries back has nothing to give:
    # asked before the cluster would start (the client's check_workload), the cell says why and
    # runs nothing.
    def stream_cells(consumer: dict[str, Any]) -> list[Cell]:
        confs = [{"id": "stream", "broker": "rabbitmq-stream", "version": "4.3"}]
        workload = {"duration": 5, "rate": 50, "consumers": 2, "consumer": consumer}
        return expand(
            model.load(_matrix(tmp_path, configurations=confs, faults=["killed"], workload=workload)), host
        )

    (cell,) = stream_cells({"requeue": 0.1})
    assert cell.scenario is None
    assert "workload.consumer.requeue: a stream consumer gives nothing back" in (cell.unsupported or "")
    assert [c.unsupported for c in stream_cells({})] == [None]


# -- runs none of whose faults bit ----------------------------------------------------------

_NO_BITE = {"faults": 1, "bit": 0, "no_effect": 1, "unmeasured": 0, "not_restored": 0, "no_fault_bit": True}


def test_every_exit_status_of_a_checked_run_gets_a_record(tmp_path: Path, host: Host) -> None:
    durable = _checked(tmp_path, "durable", 0, host)
    hollow = {**durable, "fault_evidence": {**_NO_BITE, "lines": ["f1 power-loss on n1: nothing unsynced"]}}
    statuses = {exit_code(r) for r in (durable, _checked(tmp_path, "lossy", 2, host), hollow)}
    assert EXIT_NO_FAULT_BIT in statuses and statuses <= set(execute.CHECKED)


def test_a_cell_whose_faults_did_not_bite_is_not_plain_durable(tmp_path: Path, host: Host) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    cells = expand(mx, host)
    for j in execute.plan(cells, [1, 2, 3], mx.results, _images()).jobs:
        res = _checked(tmp_path / "runs", f"{j.cell.id}-{j.seed}", 0, host)
        if j.cell.configuration.id == "sync" or j.seed == 2:  # sync: no seed bit; async: seed 2 did not
            res["fault_evidence"] = _NO_BITE | {"lines": ["f1 kill on n1: no effect"]}
        rec = _record(j.cell, j.seed, j.key, j.cell_key, res)
        assert rec["results"]["fault_evidence"]["no_fault_bit"] == (
            j.cell.configuration.id == "sync" or j.seed == 2
        )
        records.write(records.path(mx.results, j.cell.id, j.seed), rec)
    data = grading.grade_matrix(host, mx, cells, _images())
    by = {c["cell"]: c for c in data["cells"]}
    hollow, partly = by["sync--killed"], by["async--killed"]
    assert hollow["verdict"] == partly["verdict"] == "durable"
    assert (hollow["no_fault_bit"], partly["no_fault_bit"]) == (3, 1)
    assert [s["no_fault_bit"] for s in partly["seeds"]] == [False, True, False]
    assert page.shown(hollow) == "no fault bit" and page.shown(partly) == "durable"
    assert page.cell_lines(hollow)[:2] == ["durable, no fault bit", "fault did not bite in 3 of 3 seeds"]
    assert page.cell_lines(partly)[:2] == ["durable", "fault did not bite in 1 of 3 seeds"]
    text = page.markdown(data, source="tiny.yaml", results="results/tiny")
    row = next(line for line in text.splitlines() if line.startswith("| [sync]"))
    assert f"background:{page.COLOURS['no fault bit']}" in row and "background:#c8e6c9" not in row
    assert "| 2 | durable (no fault bit) |" in text
    out = page.write_outputs(data, tmp_path / "out")
    written = {c["cell"]: c for c in json.loads(out[0].read_text())["cells"]}
    assert (written["sync--killed"]["no_fault_bit"], written["async--killed"]["no_fault_bit"]) == (3, 1)
    assert (
        f'<td style="background:{page.COLOURS["no fault bit"]}">durable, no fault bit' in out[1].read_text()
    )


def test_a_record_made_before_records_kept_fault_evidence_reads_as_before(tmp_path: Path, host: Host) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    cells = expand(mx, host)
    for j in execute.plan(cells, [1], mx.results, _images()).jobs:
        rec = _record(j.cell, j.seed, j.key, j.cell_key, _checked(tmp_path / "runs", j.cell.id, 0, host))
        del rec["results"]["fault_evidence"]
        records.write(records.path(mx.results, j.cell.id, j.seed), rec)
    cell = grading.grade_matrix(host, mx, cells, _images())["cells"][0]
    assert cell["no_fault_bit"] == 0 and page.shown(cell) == "durable"
    assert page.cell_lines(cell)[:2] == ["durable", "0/1 runs lost (no bound from one run)"]


def test_the_progress_line_names_a_run_none_of_whose_faults_bit(
    tmp_path: Path, host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    job = execute.plan(expand(mx, host), [1], mx.results, _images()).jobs[0]
    res = _checked(tmp_path, "hollow", 0, host) | {"fault_evidence": _NO_BITE | {"lines": []}}
    done = execute.Outcome(job, _record(job.cell, 1, job.key, job.cell_key, res), seconds=30.0)
    execute.Runner(mx.results, tmp_path, jobs=1)._progress([done], 1, [], [], 0.0)
    assert "seed 1: durable (no fault bit: 1 of 1 fault had no effect) in 30 s" in capsys.readouterr().err


def test_the_commit_a_record_names_is_not_dirty_for_the_matrix_s_own_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "seed-1.json").write_text("{}")
    (tmp_path / "code.py").write_text("")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.chdir(tmp_path / "results")
    (tmp_path / "results" / "seed-1.json").write_text('{"seed": 1}')  # a record the matrix wrote
    assert not records.commit(exclude=[tmp_path / "results"]).endswith("+dirty")
    assert records.commit().endswith("+dirty")
    (tmp_path / "code.py").write_text("changed = 1\n")
    assert records.commit(exclude=[tmp_path / "results"]).endswith("+dirty")


def test_a_record_s_commit_is_not_dirty_for_the_page_an_earlier_matrix_wrote(
    tmp_path: Path, host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    mx = model.load(_matrix(tmp_path, faults=["killed"]))
    assert mx.page is not None
    mx.page.write_text("the page as committed\n")
    (tmp_path / "code.py").write_text("")
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"],
    ):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(execute.Runner, "_call", _finished_run(0))
    jobs = execute.plan(expand(mx, host), [1, 2], mx.results, _images()).jobs
    runner = execute.Runner(mx.results, tmp_path / "store", jobs=1, page=mx.page)
    mx.page.write_text("the page an earlier matrix wrote\n")
    rec = runner.one(jobs[0]).record
    assert rec is not None and not rec["commit"].endswith("+dirty")
    (tmp_path / "code.py").write_text("changed = 1\n")
    rec = runner.one(jobs[1]).record
    assert rec is not None and rec["commit"].endswith("+dirty")


def _drain_op(queue: str, gone: dict[str, str] | None) -> dict[str, Any]:
    op: dict[str, Any] = {"process": "drain-0", "queue": queue, "outcome": "ok", "end_ns": 1}
    return op if gone is None else op | {"gone": gone}


@pytest.mark.parametrize(
    ("ops", "want"),
    [
        # the cluster answered that one queue does not exist: a complete drain, no answer of the queue's
        (
            [_drain_op("q1", {}), _drain_op("q2", {"n1": "stream not found"})],
            {"completed": True, "gone": True},
        ),
        ([_drain_op("q1", {}), _drain_op("q2", {})], {"completed": True, "gone": False}),
        # results made before drain ops carried ``gone``: the record does not say
        ([_drain_op("q1", None)], {"completed": True}),
    ],
)
def test_a_record_keeps_whether_the_drain_ended_on_a_queue_the_cluster_says_is_gone(
    ops: list[dict[str, Any]], want: dict[str, Any]
) -> None:
    trimmed = records.trim({"drain": {"invoked": len(ops), "completed": True, "end_ns": 1, "ops": ops}})
    assert trimmed["drain"] == want
