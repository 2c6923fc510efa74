"""Clock and packet faults without Docker: seeded concrete parameters, refusals of what cannot
work, the host feature a clock fault brings, and where the fake clock is preloaded."""

from __future__ import annotations

import random

import pytest

from faults.clock import ClockBump, ClockReset, ClockSkew, ClockStrobe, offset_text
from faults.packets import Netem, PacketLoss
from harness import ScenarioError
from harness.cluster import FAKETIME_ENV, build_topology
from harness.host import Host
from harness.spec.fault import FAKETIME_FILE, HOST_FEATURES
from tests.factories import reference_scenario

NODES = ["n1", "n2", "n3"]
KINDS = [ClockSkew, ClockBump, ClockStrobe, ClockReset, Netem, PacketLoss]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_resolve_is_concrete_and_seeded(kind) -> None:
    a = kind.resolve({}, NODES, random.Random("s:fault:1"))
    assert a == kind.resolve({}, NODES, random.Random("s:fault:1"))
    # what a replay re-resolves from the recorded params is the same application
    assert kind.resolve(a, NODES, random.Random("other")) == a
    if kind is not ClockReset:  # a bare reset sets every clock right: nothing to draw
        assert any(kind.resolve({}, NODES, random.Random(f"s:fault:{i}")) != a for i in range(2, 12))


def test_offsets_as_libfaketime_reads_them() -> None:
    assert [offset_text(x) for x in (0, -0.0, 3600, -150.5, 0.0004, 12.3456)] == [
        "+0",
        "+0",
        "+3600",
        "-150.5",
        "+0",
        "+12.346",
    ]


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        (ClockSkew, {"node": "n9"}, "not one of"),
        (ClockSkew, {"offset": "soon"}, "expects float"),
        (ClockStrobe, {"period": 0.1}, "below 1.0s"),
        (ClockStrobe, {"duration": 0}, "duration must be > 0"),
        (ClockReset, {"nodes": ["n1", "x"]}, "not one of"),
        (Netem, {"loss": 120}, "percentage from 0 to 100"),
        (Netem, {"jitter": 5}, "jitter needs a delay"),
        (Netem, {"reorder": 25, "loss": 1}, "reorder needs a delay"),
        (PacketLoss, {"direction": "sideways"}, "not allowed"),
    ],
)
def test_refused_before_the_run(kind, params, message) -> None:
    with pytest.raises(ScenarioError, match=message):
        kind.resolve(params, NODES, random.Random(0))


def test_netem_options_in_tc_order() -> None:
    params = Netem.resolve(
        {
            "node": "n2",
            "delay": 100,
            "jitter": 20,
            "loss": 2.5,
            "reorder": 25,
            "duplicate": 1,
            "corrupt": 0.1,
            "correlation": 25,
        },
        NODES,
        random.Random(0),
    )
    assert Netem(None, params).tc_args() == [  # type: ignore[arg-type]
        "delay",
        "100ms",
        "20ms",
        "25%",
        "loss",
        "2.5%",
        "25%",
        "duplicate",
        "1%",
        "25%",
        "corrupt",
        "0.1%",
        "25%",
        "reorder",
        "25%",
        "25%",
    ]


def test_clock_kinds_need_the_fake_clock_and_a_runtime_that_honours_it() -> None:
    host = Host.load()
    assert HOST_FEATURES["faketime"].capability == "clock"
    for name in ("clock-skew", "clock-bump", "clock-strobe", "clock-reset"):
        assert host.registry.faults[name].needs == {"faketime"}
        assert host.registry.faults[name].requires == {"clock"}
    assert "clock" in host.registry.capabilities
    assert "clock" in host.broker("reference").capabilities
    assert "clock" in host.broker("rabbitmq").capabilities


def test_the_fake_clock_is_preloaded_into_the_broker_only() -> None:
    host = Host.load()
    plugin = host.broker("reference")
    settings = plugin.validate_settings({})
    kw = dict(run_id="bc-t", nodes=2, settings=settings, broker_image="b", proxy_image="p")
    plain = build_topology(plugin, **kw)
    faked = build_topology(plugin, faketime=True, **kw)
    broker = faked.container("n1", "broker")
    env = list(broker.command[broker.command.index("--") + 1 :])
    assert env[0] == "/usr/bin/env" and f"FAKETIME_TIMESTAMP_FILE={FAKETIME_FILE}" in env
    assert (
        env[1 + len(FAKETIME_ENV) :]
        == list(plain.container("n1", "broker").command)[
            list(plain.container("n1", "broker").command).index("--") + 1 :
        ]
    )
    assert "LD_PRELOAD" not in broker.env, "nodeinit and docker exec keep the real clock"
    assert faked.faketime and not plain.faketime
    assert faked.container("n1", "proxy").cap_add == ("NET_ADMIN",)


def test_a_planned_clock_fault_brings_the_fake_clock_and_only_where_the_runtime_honours_it() -> None:
    from harness.nemesis import Plan, PlannedFault, check_capabilities, plan
    from harness.runner import host_features

    host = Host.load()
    faults = host.registry.faults
    sc = reference_scenario(
        {
            "random": {
                "faults": ["clock-skew", "clock-strobe", "kill", "packet-loss"],
                "every": [2, 4],
                "hold": [1, 3],
            }
        },
        seed=4,
        duration=60,
    )
    planned = plan(sc, faults, NODES)
    kinds = {s.kind for s in planned.steps}
    assert {"clock-skew", "clock-strobe", "packet-loss"} <= kinds
    assert host_features(sc, planned, faults) == {"faketime"}
    # a replayed plan (read back from a history) brings it too
    replay = Plan([PlannedFault("f1", 1.0, 2.0, "clock-bump", {"node": "n2", "delta": -5.0})])
    assert host_features(sc, replay, faults) == {"faketime"}
    plain = reference_scenario(
        {"random": {"faults": ["kill"], "every": [2, 4], "hold": [1, 3]}}, seed=4, duration=60
    )
    assert host_features(plain, plan(plain, faults, NODES), faults) == set()
    # nats-server is a Go binary: it reads the clock without libc, so clock kinds are refused for it
    if "nats" in host.registry.brokers:
        with pytest.raises(ScenarioError, match="clock"):
            check_capabilities(sc, faults, frozenset(host.broker("nats").capabilities), "nats")
