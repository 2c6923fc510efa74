"""The reference plugin writes a node config the reference broker itself accepts."""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Any

import pytest

from broker_impl.config import parse
from broker_impl.store import StoreConfig
from harness.errors import ScenarioError
from harness.spec.broker import BASE_CAPABILITIES, NodeInfo
from plugins.reference import CONFIG_PATH, CONTROL_PORT, ReferenceBroker

REF = ReferenceBroker()


def info(
    name: str = "n2", index: int = 2, peers: tuple[str, ...] = ("n1", "n3"), **settings: Any
) -> NodeInfo:
    return NodeInfo(
        name=name, index=index, peers=peers, cluster="bc-1", settings=REF.validate_settings(settings)
    )


def config_of(node: NodeInfo) -> dict[str, Any]:
    return tomllib.loads(REF.node_spec(node).files[CONFIG_PATH])


def test_generated_toml_parses_and_passes_broker_validation() -> None:
    node = info()
    cfg = parse(config_of(node), base_dir=Path("/"))
    assert cfg.name == "rabbit@n2" and cfg.port == REF.client_port
    assert str(cfg.data_dir) == REF.data_dir
    assert cfg.control_port == CONTROL_PORT
    assert cfg.heartbeat == 10 and cfg.flow.enabled is True
    assert cfg.cluster == {"node": "n2", "peers": ["n1", "n3"], "port": REF.peer_ports[0]}
    store = StoreConfig.from_table(cfg.store)
    assert (store.flush, store.flush_interval_ms, store.segment_bytes) == ("sync", 500, 16 << 20)


@pytest.mark.parametrize(
    ("flush", "flow", "heartbeat", "interval", "segment"),
    list(itertools.product(["sync", "async"], [True, False], [0, 1, 65535], [1, 500], [4096, 1 << 30])),
)
def test_every_valid_setting_combination_is_accepted_by_the_broker(
    flush: str, flow: bool, heartbeat: int, interval: int, segment: int
) -> None:
    node = info(
        flush=flush, flow=flow, heartbeat=heartbeat, flush_interval_ms=interval, segment_bytes=segment
    )
    cfg = parse(config_of(node), base_dir=Path("/"))
    assert (cfg.heartbeat, cfg.flow.enabled) == (heartbeat, flow)
    store = StoreConfig.from_table(cfg.store)
    assert (store.flush, store.flush_interval_ms, store.segment_bytes) == (flush, interval, segment)


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"flush": "never"}, "broker.settings.flush: 'never' is not allowed; use one of 'sync', 'async'"),
        ({"flow": "yes"}, "broker.settings.flow: expected bool, got 'yes'"),
        ({"heartbeat": True}, "broker.settings.heartbeat: expected int, got True"),
        ({"heartbeat": -1}, "broker.settings.heartbeat: -1 is out of range; allowed from 0 to 65535"),
        ({"heartbeat": 70000}, "broker.settings.heartbeat: 70000 is out of range"),
        ({"segment_bytes": 100}, "broker.settings.segment_bytes: 100 is out of range; allowed >= 4096"),
        ({"flush_interval_ms": 0}, "broker.settings.flush_interval_ms: 0 is out of range; allowed >= 1"),
        ({"flush_interval_ms": 1.5}, "broker.settings.flush_interval_ms: expected int"),
        ({"fsync": "always"}, "broker.settings.fsync: unknown setting for reference; allowed: flow, flush, "),
    ],
)
def test_validate_settings_errors(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        REF.validate_settings(given)
    assert needle in str(e.value)


def test_node_spec_and_declaration() -> None:
    spec = REF.node_spec(info())
    assert list(spec.command) == ["python3", "-m", "broker_impl", "--config", CONFIG_PATH]
    assert REF.capabilities <= set(BASE_CAPABILITIES)
    assert REF.data_dir.startswith("/")
    recipe = REF.image()
    assert set(recipe.copy.values()) == {"/opt/brokerchaos/broker_impl"}
    assert all(Path(src).is_dir() and (Path(src) / "__main__.py").exists() for src in recipe.copy)


def test_names_with_quotes_stay_valid_toml() -> None:
    node = NodeInfo(name='n"1', index=1, peers=("n\\2",), cluster="c", settings=REF.validate_settings({}))
    data = config_of(node)
    assert data["node"]["name"] == 'rabbit@n"1' and data["cluster"]["peers"] == ["n\\2"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_replication_makes_n1_the_master_and_the_others_its_slaves(mode: str) -> None:
    from broker_impl.replication import ReplicationConfig

    master = parse(config_of(info("n1", 1, ("n2",), replication=mode)), base_dir=Path("/"))
    slave = parse(config_of(info("n2", 2, ("n1",), replication=mode)), base_dir=Path("/"))
    assert master.cluster == {} and slave.cluster == {}  # the other mode is off
    m = ReplicationConfig.from_table(master.replication, master.name)
    s = ReplicationConfig.from_table(slave.replication, slave.name)
    assert m is not None and s is not None
    assert (m.role, m.node, m.port, m.listen) == (f"{mode}_master", "n1", REF.peer_ports[0], "n1")
    # the slave dials the master by name on the inter-node port: through its sidecar's proxy
    assert (s.role, s.node, s.master) == ("slave", "n2", ("n1", REF.peer_ports[0]))


def test_replication_and_mirroring_are_not_combined() -> None:
    with pytest.raises(ScenarioError, match="two replication modes; choose one"):
        REF.validate_settings({"replication": "sync", "ha_mode": "all"})
    with pytest.raises(ScenarioError, match="broker.settings.replication"):
        REF.validate_settings({"replication": "semi"})
