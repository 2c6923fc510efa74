"""The scenario model: one file format-independent value, every mistake named by its field."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from harness import scenario as S
from harness.cluster import node_roles
from harness.errors import ScenarioError
from harness.host import Host
from harness.nemesis import check_capabilities, check_file_roles, plan
from harness.spec.fault import ClusterNodes

REPO = Path(__file__).resolve().parents[2]

YAML = """\
name: both
seed: 7
broker:
  plugin: reference
  nodes: 5
  settings: {flush: async, heartbeat: 5}
  lazyfs: true
workload:
  producers: 3
  consumers: 1
  queues: 2
  rate: 50.5
  message_size: 1024
  duration: 12
  persistent: false
  queue_prefix: q
nemesis:
  schedule:
    - {at: 8, fault: kill, hold: 2}
    - {at: 3, fault: partition, params: {shape: isolate, node: n2}, hold: 4}
  random:
    faults: [pause, partition]
    every: [1, 2]
    hold: 3
    params: {partition: {shape: bridge}}
  settle: 1.5
checkers: [python, spark]
"""

TOML = """\
name = "both"
seed = 7
checkers = ["python", "spark"]

[broker]
plugin = "reference"
nodes = 5
lazyfs = true
settings = {flush = "async", heartbeat = 5}

[workload]
producers = 3
consumers = 1
queues = 2
rate = 50.5
message_size = 1024
duration = 12
persistent = false
queue_prefix = "q"

[nemesis]
settle = 1.5

[[nemesis.schedule]]
at = 8
fault = "kill"
hold = 2

[[nemesis.schedule]]
at = 3
fault = "partition"
hold = 4
params = {shape = "isolate", node = "n2"}

[nemesis.random]
faults = ["pause", "partition"]
every = [1, 2]
hold = 3
params = {partition = {shape = "bridge"}}
"""

MINIMAL: dict[str, Any] = {"broker": {"plugin": "reference"}}


def _without_source(sc: S.Scenario) -> S.Scenario:
    return dataclasses.replace(sc, source=None)


def test_yaml_and_toml_load_to_equal_scenarios(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(YAML)
    (tmp_path / "b.toml").write_text(TOML)
    a, b = S.load(tmp_path / "a.yaml"), S.load(tmp_path / "b.toml")
    assert a.source == str(tmp_path / "a.yaml")
    assert _without_source(a) == _without_source(b)
    assert a.broker == S.BrokerSection("reference", 5, {"flush": "async", "heartbeat": 5}, True)
    assert a.workload.rate == 50.5 and a.workload.persistent is False and a.workload.duration == 12.0
    assert a.workload.prefetch == S.WorkloadSection().prefetch  # unset fields keep defaults
    assert [s.at for s in a.nemesis.schedule] == [3.0, 8.0]  # sorted by time
    assert a.nemesis.random == S.RandomSchedule(
        ("pause", "partition"), (1.0, 2.0), (3.0, 3.0), {"partition": {"shape": "bridge"}}
    )
    assert a.nemesis.fault_names == {"kill", "partition", "pause"}
    assert a.checkers == ("python", "spark")


def test_defaults_and_name_from_file(tmp_path: Path) -> None:
    (tmp_path / "tiny.yml").write_text("broker: {plugin: reference}\n")
    sc = S.load(tmp_path / "tiny.yml")
    assert sc.name == "tiny"
    assert sc.seed == 0 and sc.checkers == ()  # the registered default checkers run
    assert sc.workload == S.WorkloadSection()
    assert sc.nemesis == S.NemesisSection()


@pytest.mark.parametrize("fixture", ["rabbitmq-smoke.yaml", "rabbitmq-partitions.yaml"])
def test_to_dict_reloads_to_the_same_scenario(fixture: str) -> None:
    """``--replay`` rebuilds the scenario from ``scenario.json``; it must come back identical."""
    path = REPO / "scenarios" / fixture
    assert path.exists(), f"{fixture} is gone from scenarios/ (this test reloads it)"
    sc = S.load(path)
    stored = json.loads(json.dumps(sc.to_dict()))
    assert S.from_dict(stored, source="scenario.json") == dataclasses.replace(sc, source="scenario.json")


def test_to_dict_round_trip_with_random_schedule(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(YAML)
    sc = S.load(tmp_path / "a.yaml")
    assert S.from_dict(json.loads(json.dumps(sc.to_dict())), source=sc.source) == sc


def _with(path: str, value: Any) -> dict[str, Any]:
    """MINIMAL with ``path`` (dotted; ``[i]`` not needed) set to ``value``."""
    data = copy.deepcopy(MINIMAL)
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("workload.rate", "fast", "workload.rate: expected a number >= 0, got 'fast'"),
        ("workload.rate", -1, "workload.rate: -1 is out of range; allowed >= 0"),
        ("workload.rate", True, "workload.rate: expected a number"),
        ("workload.producers", 1.5, "workload.producers: expected an integer from 0 to 256"),
        ("workload.producers", 257, "workload.producers: 257 is out of range; allowed from 0 to 256"),
        ("workload.queues", 0, "workload.queues: 0 is out of range; allowed from 1 to 1000"),
        ("workload.message_size", 15, "workload.message_size: 15 is out of range"),
        ("workload.duration", 0, "workload.duration: 0 is out of range; allowed >= 0.1"),
        ("workload.persistent", "yes", "workload.persistent: expected true or false, got 'yes'"),
        ("workload.prefetch", 65536, "workload.prefetch: 65536 is out of range"),
        ("workload.in_flight", 0, "workload.in_flight: 0 is out of range"),
        ("workload.queue_prefix", "", "workload.queue_prefix: expected a non-empty string"),
        ("workload.drain_timeout", 0.5, "workload.drain_timeout: 0.5 is out of range"),
        ("workload", [1], "workload: expected a mapping, got list"),
        ("broker.nodes", 0, "broker.nodes: 0 is out of range; allowed from 1 to 9"),
        ("broker.nodes", 10, "broker.nodes: 10 is out of range; allowed from 1 to 9"),
        ("broker.nodes", "3", "broker.nodes: expected an integer"),
        ("broker.lazyfs", 1, "broker.lazyfs: expected true or false"),
        ("broker.settings", "x", "broker.settings: expected a mapping, got str"),
        ("broker.plugin", None, "broker.plugin: required"),
        ("broker.plugin", 3, "broker.plugin: expected a non-empty string, got 3"),
        ("seed", -1, "seed: -1 is out of range; allowed >= 0"),
        ("seed", "7", "seed: expected an integer"),
        ("name", "", "name: expected a non-empty string"),
        ("checkers", {"a": 1}, "checkers: expected a list of checker names"),
        ("checkers", [1], "checkers: expected a list of checker names"),
        ("nemesis.schedule", {"at": 1}, "nemesis.schedule: expected a list of steps"),
        ("nemesis.schedule", [{"fault": "kill"}], "nemesis.schedule[0].at: required"),
        ("nemesis.schedule", [{"at": 1}], "nemesis.schedule[0].fault: required"),
        ("nemesis.schedule", [{"at": -1, "fault": "kill"}], "nemesis.schedule[0].at: -1 is out of range"),
        (
            "nemesis.schedule",
            [{"at": 1, "fault": "kill", "hold": "long"}],
            "nemesis.schedule[0].hold: expected a number",
        ),
        (
            "nemesis.schedule",
            [{"at": 1, "fault": "kill", "params": 3}],
            "nemesis.schedule[0].params: expected a mapping",
        ),
        ("nemesis.schedule", [{"at": 1, "fault": "kill"}, "kill"], "nemesis.schedule[1]: expected a mapping"),
        ("nemesis.random", {"faults": []}, "nemesis.random.faults: expected a non-empty list"),
        ("nemesis.random", {"faults": "kill"}, "nemesis.random.faults: expected a non-empty list"),
        (
            "nemesis.random",
            {"faults": ["kill"], "every": [5, 1]},
            "nemesis.random.every: min 5.0 is greater than max 1.0",
        ),
        (
            "nemesis.random",
            {"faults": ["kill"], "every": [1, 2, 3]},
            "nemesis.random.every: expected [min, max]",
        ),
        (
            "nemesis.random",
            {"faults": ["kill"], "every": "often"},
            "nemesis.random.every: expected [min, max]",
        ),
        (
            "nemesis.random",
            {"faults": ["kill"], "hold": [-1, 2]},
            "nemesis.random.hold: -1 is out of range; allowed >= 0",
        ),
        (
            "nemesis.random",
            {"faults": ["kill"], "hold": -1},
            "nemesis.random.hold: -1 is out of range; allowed >= 0",
        ),
        # A zero gap would let the random schedule draw faults forever without time passing.
        (
            "nemesis.random",
            {"faults": ["kill"], "every": 0, "hold": 0},
            "nemesis.random.every: min 0.0 is out of range",
        ),
        (
            "nemesis.random",
            {"faults": ["kill"], "every": [0, 1]},
            "nemesis.random.every: min 0.0 is out of range",
        ),
        ("nemesis.random", {"faults": ["kill"], "every": -3}, "nemesis.random.every"),
        (
            "nemesis.random",
            {"faults": ["kill"], "params": {"kill": 1}},
            "nemesis.random.params.kill: expected a mapping",
        ),
        ("nemesis.settle", -1, "nemesis.settle: -1 is out of range"),
        ("workload.consumer", 3, "workload.consumer: expected a mapping, got int"),
        (
            "workload.consumer",
            {"requeue": 1.5},
            "workload.consumer.requeue: 1.5 is out of range; allowed from 0 to 1",
        ),
        (
            "workload.consumer",
            {"requeue": -0.1},
            "workload.consumer.requeue: -0.1 is out of range; allowed >= 0",
        ),
        ("workload.consumer", {"requeue": "often"}, "workload.consumer.requeue: expected a number"),
        ("workload.consumer", {"recover_every": -1}, "workload.consumer.recover_every: -1 is out of range"),
        (
            "workload.consumer",
            {"close_every": 0.05},
            "workload.consumer.close_every: 0.05 is out of range; allowed 0 (never) or >= 0.1",
        ),
        ("workload.consumer", {"crash_every": True}, "workload.consumer.crash_every: expected a number"),
        ("workload.consumer", {"slow": 3}, "workload.consumer.slow: 3 is more than workload.consumers (2)"),
        ("workload.consumer", {"slow": -1}, "workload.consumer.slow: -1 is out of range"),
        ("workload.consumer", {"slow_ack_ms": 60001}, "workload.consumer.slow_ack_ms: 60001 is out of range"),
        ("workload.consumer", {"slow_ack_ms": 0.5}, "workload.consumer.slow_ack_ms: expected an integer"),
        (
            "workload.consumer",
            {"crash": 1},
            "workload.consumer.crash: unknown field; allowed: close_every, "
            "crash_every, recover_every, requeue, slow, slow_ack_ms",
        ),
        ("budgets", [1], "budgets: expected a mapping, got list"),
        ("budgets", {"duplicated": -1}, "budgets.duplicated: -1 is out of range; allowed >= 0"),
        ("budgets", {"resurrected": 1.5}, "budgets.resurrected: expected an integer"),
        ("budgets", {"lost": 0}, "budgets.lost: unknown field; allowed: duplicated, recovery_s, resurrected"),
        ("budgets", {"recovery_s": 0}, "budgets.recovery_s: 0 is out of range; allowed: seconds > 0"),
        ("budgets", {"recovery_s": "30s"}, "budgets.recovery_s: expected a number"),
        ("budgets", {"recovery_s": {"partition": -1}}, "budgets.recovery_s.partition: -1 is out of range"),
        ("budgets", {"recovery_s": {}}, "budgets.recovery_s: an empty mapping"),
    ],
)
def test_every_invalid_field_is_named(path: str, value: Any, needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        S.from_dict(_with(path, value), source="s.yaml")
    assert str(e.value).startswith("s.yaml: ")
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            {**MINIMAL, "sede": 1},
            "sede: unknown field; allowed: broker, budgets, checkers, name, nemesis, seed, source, workload",
        ),
        (
            _with("broker.node", 3),
            "broker.node: unknown field; allowed: filesystem, lazyfs, nodes, plugin, settings",
        ),
        (_with("workload.rat", 3), "workload.rat: unknown field; allowed: "),
        (_with("nemesis.schedul", []), "nemesis.schedul: unknown field"),
        (
            _with("nemesis.schedule", [{"at": 1, "fault": "kill", "hld": 1}]),
            "nemesis.schedule[0].hld: unknown field",
        ),
        (_with("nemesis.random", {"faults": ["kill"], "evry": 3}), "nemesis.random.evry: unknown field"),
        ({}, "broker: required section is missing"),
        (None, "broker: required section is missing"),
        ([1, 2], "scenario: expected a mapping, got list"),
    ],
)
def test_unknown_keys_and_missing_sections(data: Any, needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        S.from_dict(data)
    assert needle in str(e.value)


def test_unknown_workload_field_lists_every_allowed_one() -> None:
    with pytest.raises(ScenarioError) as e:
        S.from_dict(_with("workload.rat", 3))
    for name in (f.name for f in dataclasses.fields(S.WorkloadSection)):
        assert name in str(e.value)


def test_random_null_means_no_random_schedule() -> None:
    sc = S.from_dict(_with("nemesis.random", None))
    assert sc.nemesis.random is None


def test_scalar_range_is_both_ends() -> None:
    sc = S.from_dict(_with("nemesis.random", {"faults": ["kill"], "every": 4, "hold": 0}))
    assert sc.nemesis.random is not None
    assert sc.nemesis.random.every == (4.0, 4.0) and sc.nemesis.random.hold == (0.0, 0.0)


def test_checkers_as_one_string() -> None:
    assert S.from_dict({**MINIMAL, "checkers": "spark"}).checkers == ("spark",)


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("bad.yaml", "broker: [unclosed\n", "not valid YAML"),
        ("bad.toml", "broker = \n", "not valid TOML"),
        ("bad.ini", "[broker]\n", "scenario files end in .yaml, .yml or .toml"),
    ],
)
def test_unreadable_files(tmp_path: Path, name: str, text: str, needle: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ScenarioError) as e:
        S.load(tmp_path / name)
    assert needle in str(e.value) and str(tmp_path / name) in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file() -> None:
    with pytest.raises(ScenarioError, match="does not exist"):
        S.load("/nonexistent/scenario.yaml")


def test_with_overrides() -> None:
    sc = S.from_dict({**MINIMAL, "seed": 3, "workload": {"duration": 9, "rate": 10}})
    assert S.with_overrides(sc) == sc
    o = S.with_overrides(sc, seed=11, duration=2.5)
    assert (o.seed, o.workload.duration, o.workload.rate) == (11, 2.5, 10.0)
    assert (sc.seed, sc.workload.duration) == (3, 9.0)  # the original is unchanged
    assert S.with_overrides(sc, seed=0).seed == 0  # 0 is an override, not "no override"
    assert S.with_overrides(sc, duration=1).workload.duration == 1.0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"seed": -1}, "seed: -1 is out of range"),
        ({"duration": 0}, "workload.duration: 0 is out of range"),
        ({"duration": -5.0}, "workload.duration: -5.0 is out of range"),
    ],
)
def test_overrides_obey_the_file_rules(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        S.with_overrides(S.from_dict(MINIMAL), **kwargs)


SCENARIO_FILES = sorted((REPO / "scenarios").glob("*.y*ml")) + sorted((REPO / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_every_shipped_scenario_is_valid_for_its_plugin(host: Host, path: Path) -> None:
    sc = S.load(path)
    plugin = host.broker(sc.broker.plugin, sc.broker.version)
    settings = plugin.validate_settings(sc.broker.settings)
    assert set(settings) == set(plugin.settings_schema)
    check_capabilities(sc, host.registry.faults, frozenset(plugin.capabilities), plugin.name)
    check_file_roles(sc, plugin)
    for name in sc.checkers:
        host.checker(name)
    roles = node_roles(plugin, sc.broker.nodes, settings)  # every node of every role, as a run has them
    p = plan(sc, host.registry.faults, ClusterNodes(list(roles), {n: r.name for n, r in roles.items()}))
    assert all(0 <= s.at < sc.workload.duration for s in p.steps), p.steps


def test_there_are_shipped_scenarios() -> None:
    assert SCENARIO_FILES, "scenarios/ holds no scenario files"


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_every_shipped_scenario_is_graded_by_spark(host: Host, path: Path) -> None:
    """Spark is the engine of record: a scenario names no checkers (the defaults) or names it."""
    checkers = S.load(path).checkers or tuple(host.registry.defaults)
    assert "spark" in checkers, checkers


def test_consumer_behaviours_and_budgets_are_off_by_default() -> None:
    sc = S.from_dict(MINIMAL)
    assert sc.workload.consumer == S.ConsumerSection(
        requeue=0.0, recover_every=0.0, close_every=0.0, crash_every=0.0, slow=0, slow_ack_ms=100
    )
    assert sc.budgets == S.Budgets(duplicated=None, resurrected=None)


def test_consumer_behaviours_and_budgets_load_and_round_trip() -> None:
    data = {
        **MINIMAL,
        "workload": {
            "consumers": 3,
            "consumer": {
                "requeue": 0.25,
                "recover_every": 10,
                "close_every": 15.5,
                "crash_every": 0.1,
                "slow": 3,
                "slow_ack_ms": 0,
            },
        },
        "budgets": {"duplicated": 0, "resurrected": None, "recovery_s": {"partition": 30}},
    }
    sc = S.from_dict(data)
    assert sc.workload.consumer == S.ConsumerSection(0.25, 10.0, 15.5, 0.1, 3, 0)
    assert sc.budgets == S.Budgets(duplicated=0, resurrected=None, recovery_s={"partition": 30.0})
    assert S.from_dict(json.loads(json.dumps(sc.to_dict()))) == sc
    assert sc.to_dict()["budgets"] == {
        "duplicated": 0,
        "resurrected": None,
        "recovery_s": {"partition": 30.0},
    }


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (3, "workload.transactions: expected a mapping, got int"),
        ({}, "workload.transactions: set publish_batch (messages per producer transaction) and/or ack_batch"),
        ({"publish_batch": 0, "ack_batch": 0}, "workload.transactions: set publish_batch"),
        (
            {"publish_batch": -1},
            "workload.transactions.publish_batch: -1 is out of range; allowed from 0 to 10000",
        ),
        ({"ack_batch": 2.5}, "workload.transactions.ack_batch: expected an integer"),
        (
            {"publish_batch": 5, "rollback": 1.5},
            "workload.transactions.rollback: 1.5 is out of range; allowed from 0 to 1",
        ),
        (
            {"publish_batch": 5, "batch": 1},
            "workload.transactions.batch: unknown field; allowed: ack_batch, publish_batch, rollback",
        ),
    ],
)
def test_bad_transactions_are_one_line_naming_the_field(value: Any, needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        S.from_dict(_with("workload.transactions", value), source="s.yaml")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_transactions_load_and_round_trip_and_are_absent_by_default() -> None:
    assert S.from_dict(MINIMAL).workload.transactions is None
    assert "transactions" not in S.from_dict(MINIMAL).to_dict()["workload"]  # older readers load such runs
    sc = S.from_dict({**MINIMAL, "workload": {"transactions": {"publish_batch": 5, "rollback": 0.2}}})
    assert sc.workload.transactions == S.TransactionsSection(publish_batch=5, ack_batch=0, rollback=0.2)
    assert S.from_dict(json.loads(json.dumps(sc.to_dict()))) == sc


def test_a_recovery_budget_for_a_fault_kind_nobody_provides_is_refused_in_one_line(host: Host) -> None:
    sc = S.from_dict({**MINIMAL, "budgets": {"recovery_s": {"partiton": 30}}})
    plugin = host.broker(sc.broker.plugin)
    with pytest.raises(ScenarioError) as e:
        check_capabilities(sc, host.registry.faults, frozenset(plugin.capabilities), plugin.name)
    assert str(e.value).startswith("budgets.recovery_s: 'partiton' is not a fault kind; use one of ")
    assert "partition" in str(e.value) and "\n" not in str(e.value)


def test_a_data_file_role_the_plugin_does_not_declare_is_refused_in_one_line(host: Host) -> None:
    def scenario(role: str) -> S.Scenario:
        step = {"at": 1, "fault": "corrupt-file", "params": {"file_role": role}, "hold": 1}
        broker = {"plugin": "rabbitmq", "version": "4.3", "nodes": 3}
        return S.from_dict({**MINIMAL, "broker": broker, "nemesis": {"schedule": [step]}})

    plugin = host.broker("rabbitmq", "4.3")
    with pytest.raises(ScenarioError) as e:
        check_file_roles(scenario("quorum-segmnet"), plugin)
    assert "'quorum-segmnet'" in str(e.value)
    assert "its roles: classic-index, classic-msg-store, quorum-segment, quorum-wal" in str(e.value)
    assert "\n" not in str(e.value)
    check_file_roles(scenario("quorum-segment"), plugin)


def test_ttl_and_dead_lettering_load_round_trip_and_are_absent_by_default() -> None:
    w = S.from_dict(MINIMAL).workload
    assert (w.ttl_ms, w.expiration_ms, w.dead_letter) == (None, None, False)
    assert not {"ttl_ms", "expiration_ms", "dead_letter"} & set(S.from_dict(MINIMAL).to_dict()["workload"])
    sc = S.from_dict({**MINIMAL, "workload": {"ttl_ms": 1500, "expiration_ms": 900, "dead_letter": True}})
    assert (sc.workload.ttl_ms, sc.workload.expiration_ms, sc.workload.dead_letter) == (1500, 900, True)
    assert S.from_dict(json.loads(json.dumps(sc.to_dict()))) == sc


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"ttl_ms": 1000}, "workload.ttl_ms: needs workload.dead_letter: true (an expired message is"),
        ({"expiration_ms": 50}, "workload.expiration_ms: needs workload.dead_letter: true"),
        (
            {"ttl_ms": 0, "dead_letter": True},
            "workload.ttl_ms: 0 is out of range; allowed from 1 to 4294967295",
        ),
        ({"ttl_ms": 1.5, "dead_letter": True}, "workload.ttl_ms: expected an integer"),
        ({"expiration_ms": 2**32, "dead_letter": True}, "workload.expiration_ms: 4294967296 is out of range"),
        ({"dead_letter": "yes"}, "workload.dead_letter: expected true or false, got 'yes'"),
    ],
)
def test_bad_ttl_and_dead_lettering_are_one_line_naming_the_field(value: Any, needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        S.from_dict({**MINIMAL, "workload": value}, source="s.yaml")
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("plugin", "field", "value"),
    [("nats", "ttl_ms", 1000), ("redis", "dead_letter", True), ("nats", "expiration_ms", 10)],
)
def test_ttl_and_dead_lettering_are_refused_for_a_plugin_without_the_feature(
    host: Host, plugin: str, field: str, value: Any
) -> None:
    from harness.coverage import check_workload_features

    sc = S.from_dict({"broker": {"plugin": plugin}, "workload": {field: value, "dead_letter": True}})
    with pytest.raises(ScenarioError) as e:
        check_workload_features(sc.workload, host.broker(plugin))
    assert str(e.value).startswith(f"workload.{field}: broker plugin {plugin!r} has no feature it drives")
    assert "\n" not in str(e.value)
    for ok in ("reference", "rabbitmq"):  # both declare message TTL and dead-lettering
        check_workload_features(sc.workload, host.broker(ok))
