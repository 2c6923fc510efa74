"""The ``brokerchaos`` command: every mistake a user can make ends in one line and exit status 2."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.history import Recorder
from harness.scenario import load
from harness.store import RunDir

HERE = Path(__file__).resolve().parent
EXE = shutil.which("brokerchaos")

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the brokerchaos command is not installed (pip install -e .)"
)


def brokerchaos(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(HERE), **(env or {})}
    assert EXE is not None
    return subprocess.run([EXE, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=60)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("brokerchaos: "), lines[0]
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_missing_scenario_file(tmp_path: Path) -> None:
    line = one_line_error(brokerchaos("run", "nope.yaml", cwd=tmp_path))
    assert "'nope.yaml' does not exist" in line


def test_invalid_field_names_the_field_and_what_is_allowed(tmp_path: Path) -> None:
    write(tmp_path / "s.yaml", "broker: {plugin: reference}\nworkload: {rate: fast}\n")
    line = one_line_error(brokerchaos("run", "s.yaml", cwd=tmp_path))
    assert "s.yaml: workload.rate: expected a number >= 0, got 'fast'" in line


def test_invalid_setting_names_the_setting(tmp_path: Path) -> None:
    write(tmp_path / "s.yaml", "broker: {plugin: reference, settings: {flush: sometimes}}\n")
    line = one_line_error(brokerchaos("run", "s.yaml", cwd=tmp_path))
    assert "broker.settings.flush: 'sometimes' is not allowed; use one of 'sync', 'async'" in line


def test_unknown_broker_plugin(tmp_path: Path) -> None:
    write(tmp_path / "s.yaml", "broker: {plugin: kafka}\n")
    line = one_line_error(brokerchaos("run", "s.yaml", cwd=tmp_path))
    assert "unknown broker plugin 'kafka'" in line and "rabbitmq" in line and "reference" in line


def test_fault_the_broker_cannot_take(tmp_path: Path) -> None:
    write(tmp_path / "s.yaml", "broker: {plugin: fixture}\nnemesis: {schedule: [{at: 1, fault: pause}]}\n")
    line = one_line_error(brokerchaos("-p", "fixture_plugins.good", "run", "s.yaml", cwd=tmp_path))
    assert "fault 'pause' needs broker capabilities ['pause']" in line and "'fixture'" in line


def test_explore_until_an_event_the_plugin_does_not_read(tmp_path: Path) -> None:
    write(
        tmp_path / "s.yaml",
        "broker: {plugin: reference}\nnemesis: {schedule: [{at: 1, fault: kill, hold: 1}]}\n",
    )
    line = one_line_error(brokerchaos("explore", "s.yaml", "--until-event", "no-such-event", cwd=tmp_path))
    assert (
        "--until-event: plugin 'reference' reads no event ['no-such-event']" in line
        and "served-alone" in line
    )


def test_unknown_plugin_module(tmp_path: Path) -> None:
    line = one_line_error(brokerchaos("-p", "does.not.exist", "plugins", cwd=tmp_path))
    assert (
        line
        == "brokerchaos: plugin 'does.not.exist': failed to import: ModuleNotFoundError: No module named 'does'"
    )


def test_broken_plugin_module(tmp_path: Path) -> None:
    line = one_line_error(brokerchaos("-p", "fixture_plugins.misspelled_hook", "plugins", cwd=tmp_path))
    assert "plugin 'fixture_plugins.misspelled_hook'" in line and "brokerchaos_register_brokerz" in line


def test_analyze_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    line = one_line_error(brokerchaos("analyze", str(tmp_path), cwd=tmp_path))
    assert f"{tmp_path} is not a run directory" in line


def test_bad_override(tmp_path: Path) -> None:
    write(tmp_path / "s.yaml", "broker: {plugin: reference}\n")
    line = one_line_error(brokerchaos("run", "s.yaml", "--duration", "0", cwd=tmp_path))
    assert "workload.duration: 0.0 is out of range" in line


def test_docker_unreachable(tmp_path: Path) -> None:
    r = brokerchaos("down", cwd=tmp_path, env={"DOCKER_HOST": "tcp://127.0.0.1:1"})
    line = one_line_error(r)
    assert "cannot reach the Docker engine at tcp://127.0.0.1:1" in line
    assert "start Docker or set DOCKER_HOST" in line


def test_plugins_lists_plugins_with_capabilities(tmp_path: Path) -> None:
    r = brokerchaos("plugins", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("\n\n")[0]
    rows = {line.split()[0]: line for line in table.splitlines() if line and not line.startswith(" ")}
    assert {"reference", "rabbitmq", "faults", "checkers", "amqp091"} <= set(rows)
    assert "broker:rabbitmq" in rows["rabbitmq"]
    from plugins.rabbitmq import RabbitMQ
    from plugins.reference import ReferenceBroker

    assert ", ".join(sorted(RabbitMQ.capabilities)) in rows["rabbitmq"]
    assert ", ".join(sorted(ReferenceBroker.capabilities)) in rows["reference"]
    assert "fault:partition" in rows["faults"]
    assert "(entry point plugins.reference)" in r.stdout
    # Each broker names the client it needs, each fault what it requires and needs.
    assert re.search(r"^  rabbitmq +client amqp091 ", r.stdout, re.M)
    assert re.search(r"^  power-loss +requires power-loss; needs lazyfs$", r.stdout, re.M)
    assert re.search(r"^  partition +requires partition$", r.stdout, re.M)


def test_plugins_with_an_extra_module(tmp_path: Path) -> None:
    r = brokerchaos("-p", "fixture_plugins.good", "plugins", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(-p fixture_plugins.good)" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("fixture_plugins.good"))
    assert "broker:fixture" in line and "kill, partition" in line


def test_a_long_plugin_module_name_keeps_the_table_in_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main  # in this process: this tree's table, whatever is installed

    monkeypatch.syspath_prepend(str(HERE))
    assert main(["-p", "fixture_plugins.good", "plugins"]) == 0
    out = capsys.readouterr().out
    lines = out.split("\n\n")[0].splitlines()
    version, provides = lines[0].index("version"), lines[0].index("provides")
    rows = [x for x in lines[1:] if x and not x.startswith(" ")]
    assert any(len(x.split()[0]) >= 12 for x in rows)
    for row in rows:
        assert row[:version].rstrip() == row.split()[0], row  # the name ends before the version column
        assert row[version - 1] == " " and row[version] != " ", row
        assert row[provides - 1] == " " and row[provides] != " ", row
    brokers = out.split("brokers (client they need, capabilities)\n")[1].split("\n\n")[0].splitlines()
    rows = [
        line for line in brokers if not line.startswith("   ")
    ]  # a plugin's versions and file roles go deeper
    assert len({line.index(" client ") for line in rows}) == 1, brokers


def test_no_command_prints_help(tmp_path: Path) -> None:
    r = brokerchaos(cwd=tmp_path)
    assert r.returncode == 2 and "usage: brokerchaos" in r.stdout


def test_replay_rebuilds_the_stored_scenario_and_plan(tmp_path: Path) -> None:
    """``--replay`` reloads scenario.json and the applied faults; it gets as far as Docker."""
    sc = load(write(tmp_path / "s.yaml", "broker: {plugin: reference}\nseed: 4\n"))
    rd = RunDir.create(tmp_path / "store", sc.name)
    rd.write_json("scenario.json", {"scenario": sc.to_dict(), "seed": sc.seed})
    rec = Recorder(rd.history_jsonl)
    value = {"fault_id": "f1", "kind": "kill", "params": {"node": "n2"}, "workload_start_s": 0.0, "hold": 1}
    rec.invoke("nemesis", "kill", node="n2", value=value).ok({**value, "done": {}})
    rec.close()
    r = brokerchaos(
        "-q",
        "run",
        "s.yaml",
        "--replay",
        str(rd.path),
        "--store",
        str(tmp_path / "again"),
        cwd=tmp_path,
        env={"DOCKER_HOST": "tcp://127.0.0.1:1"},
    )
    assert "cannot reach the Docker engine" in one_line_error(r)


@pytest.mark.parametrize("command", [["analyze", "store/x/1"], ["grade", "store/x/1"]])
def test_a_spark_master_spark_cannot_start_with_is_one_line(tmp_path: Path, command: list[str]) -> None:
    """The checker plugin refuses it when it is configured, before any JVM (whose spark-submit
    would print a Java stack trace), and the harness prints its message as one line."""
    line = one_line_error(brokerchaos(*command, "--spark-master", "bogus://x", cwd=tmp_path))
    assert "'bogus://x'" in line and "spark://HOST:PORT" in line


def test_run_keep_names_the_run_id_that_down_run_takes() -> None:
    from harness.cli import build_parser, kept_cluster_line

    line = kept_cluster_line("bc-1a2b3c")
    command = re.search(r"`brokerchaos (down --run \S+)`", line)
    assert command is not None and "run id bc-1a2b3c" in line
    args = build_parser().parse_args(command.group(1).split())
    assert args.run == "bc-1a2b3c"
