"""``broker.filesystem``: the lazy filesystem's model, chosen by a scenario or by the broker plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cluster import build_topology, filesystem_model
from harness.errors import ClusterError
from harness.host import Host
from harness.nemesis import plan
from harness.runner import host_features
from harness.scenario import from_dict, load
from harness.spec.errors import ScenarioError
from harness.spec.fault import FILESYSTEM_MODELS
from harness.verdicts import summary_table

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def _scenario(**broker: object) -> dict:
    return {"name": "t", "broker": {"plugin": "reference", "nodes": 1, **broker}}


@pytest.mark.parametrize("model", FILESYSTEM_MODELS)
def test_a_scenario_names_a_model(model: str) -> None:
    s = from_dict(_scenario(filesystem=model))
    assert s.broker.filesystem == model
    assert s.to_dict()["broker"]["filesystem"] == model


def test_an_unknown_model_is_refused_with_the_known_ones() -> None:
    with pytest.raises(
        ScenarioError, match=r"broker.filesystem: expected one of strict, ext4-ordered, xfs, got 'zfs'"
    ):
        from_dict(_scenario(filesystem="zfs"))


def test_absent_it_is_left_to_the_plugin_and_the_scenario_reads_as_before() -> None:
    s = from_dict(_scenario())
    assert s.broker.filesystem is None
    assert "filesystem" not in s.to_dict()["broker"]


def test_the_plugin_declares_the_default_and_the_scenario_overrides_it(host: Host) -> None:
    reference, rabbitmq = host.broker("reference"), host.broker("rabbitmq")
    assert filesystem_model(reference, None, True) == "strict"
    assert filesystem_model(rabbitmq, None, True) == "ext4-ordered"
    assert filesystem_model(reference, "xfs", True) == "xfs"
    assert filesystem_model(reference, "xfs", False) is None  # no lazy filesystem, no model


def test_a_plugin_declaring_an_unknown_model_is_refused(host: Host) -> None:
    plugin = host.broker("reference")

    class Odd(type(plugin)):  # type: ignore[misc]
        filesystem = "ntfs"

    with pytest.raises(ClusterError, match="ntfs"):
        filesystem_model(Odd(), None, True)


@pytest.mark.parametrize(("requested", "mounted"), [(None, "strict"), ("ext4-ordered", "ext4-ordered")])
def test_the_nodes_mount_the_model(host: Host, requested: str | None, mounted: str) -> None:
    plugin = host.broker("reference")
    kw = {
        "run_id": "bc-fs",
        "nodes": 2,
        "settings": plugin.validate_settings({}),
        "broker_image": "x",
        "proxy_image": "y",
    }
    t = build_topology(plugin, lazyfs=True, filesystem=requested, **kw)
    assert t.filesystem == mounted
    for c in t.containers:
        if c.role == "broker":
            i = c.command.index("--lazyfs-names")
            assert c.command[i + 1] == mounted
    plain = build_topology(plugin, filesystem=requested, **kw)
    assert plain.filesystem is None
    assert all("--lazyfs-names" not in c.command for c in plain.containers)


def _model_of(host: Host, path: Path) -> str | None:
    s = load(path)
    plugin = host.broker(s.broker.plugin)
    faults = host.registry.faults
    nodes = [f"n{i}" for i in range(1, s.broker.nodes + 1)]
    lazyfs = "lazyfs" in host_features(s, plan(s, faults, nodes), faults)
    return filesystem_model(plugin, s.broker.filesystem, lazyfs)


def test_every_reference_power_loss_scenario_runs_on_the_strict_model(host: Host) -> None:
    """The reference broker's power-loss scenarios hold it to POSIX's letter unless they say otherwise."""
    seen = []
    for path in sorted(SCENARIOS.glob("*.yaml")):
        s = load(path)
        if s.broker.plugin != "reference" or "power-loss" not in path.read_text():
            continue
        model = _model_of(host, path)
        assert model == (s.broker.filesystem or "strict"), path.name
        seen.append((path.name, model))
    assert ("power-loss.yaml", "strict") in seen
    assert ("power-loss-ext4-ordered.yaml", "ext4-ordered") in seen
    assert len(seen) >= 10


def test_the_terminal_says_which_model_a_run_used() -> None:
    lines = summary_table({"verdict": "durable", "filesystem": "strict"}).splitlines()
    assert [line.split() for line in lines if "filesystem" in line] == [
        ["filesystem", "lazyfs,", "model", "strict"]
    ]
    assert "filesystem" not in summary_table({"verdict": "durable", "filesystem": None})
