"""``[cluster]`` parsing, and the reference plugin's cluster settings as the node will read them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from broker_impl.cluster.config import ClusterConfig
from broker_impl.config import ConfigError, parse
from harness import NodeInfo, ScenarioError
from plugins.reference import ReferenceBroker


def test_peer_list_and_peer_map_forms() -> None:
    by_name = ClusterConfig.from_table({"node": "n1", "peers": ["n1", "n2", "n3"], "port": 25672}, "x")
    assert by_name is not None
    assert by_name.peers == {"n2": ("n2", 25672), "n3": ("n3", 25672)}  # itself dropped
    assert by_name.listen == "n1" and by_name.tick == 1.0 and by_name.partition_handling == "ignore"
    by_addr = ClusterConfig.from_table(
        {"node": "a", "peers": {"b": "127.0.0.3:1234"}, "listen": "127.0.0.2"}, "x"
    )
    assert (
        by_addr is not None and by_addr.peers == {"b": ("127.0.0.3", 1234)} and by_addr.listen == "127.0.0.2"
    )
    assert ClusterConfig.from_table({}, "solo") is None


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"peers": {"b": "nohost"}}, 'cluster.peers.b: expected "host:port"'),
        ({"peers": ["b"], "tick": 0}, "cluster.tick: expected seconds > 0"),
        ({"peers": ["b"], "down_after": 0}, "cluster.down_after"),
        (
            {"peers": ["b"], "partition_handling": "pause_majority"},
            "cluster.partition_handling: 'pause_majority' not allowed",
        ),
        ({"peers": "b"}, "cluster.peers: expected a list"),
    ],
)
def test_bad_cluster_settings_are_one_line_errors(table: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        ClusterConfig.from_table(table, "a")
    assert needle in str(e.value)


def test_reference_plugin_passes_cluster_settings_and_policy() -> None:
    ref = ReferenceBroker()
    settings = ref.validate_settings(
        {
            "tick": 0.5,
            "missed_ticks": 4,
            "partition_handling": "pause_minority",
            "ha_mode": "exactly",
            "ha_params": 2,
            "ha_sync_mode": "automatic",
        }
    )
    cfg = parse(
        tomllib.loads(ref.config_toml(NodeInfo("n2", 2, ("n1", "n3"), "c", settings))), base_dir=Path("/")
    )
    cc = ClusterConfig.from_table(cfg.cluster, cfg.name)
    assert cc is not None
    assert (cc.node, cc.tick, cc.down_after, cc.partition_handling) == ("n2", 0.5, 4, "pause_minority")
    assert cc.peers == {"n1": ("n1", 25672), "n3": ("n3", 25672)}
    assert ref.policy(settings) == {
        "ha-mode": "exactly",
        "ha-params": 2,
        "ha-sync-mode": "automatic",
        "ha-promote-on-failure": "always",
        "ha-promote-on-shutdown": "when-synced",
    }
    assert "mirroring" in ref.capabilities
    with pytest.raises(ScenarioError, match="ha_mode 'exactly' needs a node count"):
        ref.validate_settings({"ha_mode": "exactly"})
    with pytest.raises(ScenarioError, match="tick: expected seconds > 0"):
        ref.validate_settings({"tick": True})
