"""The Redis broker plugin's settings, configs and the entry-id mapping (no Docker)."""

from __future__ import annotations

from typing import Any

import pytest

from harness import NodeInfo, ScenarioError, entry_offset
from plugins.redis import Redis


def _node(index: int, nodes: int = 3, **settings: Any) -> NodeInfo:
    names = [f"n{i}" for i in range(1, nodes + 1)]
    s = Redis().validate_settings(settings)
    return NodeInfo(f"n{index}", index, tuple(n for n in names if n != f"n{index}"), "c", s)


def test_defaults() -> None:
    s = Redis().validate_settings({})
    assert s["appendonly"] is True and s["appendfsync"] == "everysec"
    assert s["wait_replicas"] == 0 and s["sentinel"] is False


def test_only_appendfsync_always_promises_a_sync_before_the_reply() -> None:
    r = Redis()
    assert r.confirms_after_sync(r.validate_settings({"appendfsync": "always"})) is True
    assert r.confirms_after_sync(r.validate_settings({})) is False  # everysec: measured, not judged
    assert r.confirms_after_sync(r.validate_settings({"appendfsync": "no"})) is False


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"appendfsync": "sometimes"}, "appendfsync"),
        ({"wait_replicas": -1}, "wait_replicas"),
        ({"sentinel": "yes"}, "sentinel"),
        ({"quorum": 2}, "unknown setting"),
    ],
)
def test_invalid_settings(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        Redis().validate_settings(given)


def test_replicas_follow_the_first_node_and_announce_their_names() -> None:
    primary = Redis().server_config(_node(1))
    replica = Redis().server_config(_node(3, appendfsync="always"))
    assert "replicaof" not in primary
    assert "replicaof n1 6379" in replica and "replica-announce-ip n3" in replica
    assert "appendfsync always" in replica and "bind @IP@ 127.0.0.1" in replica


def test_sentinel_quorum_is_a_majority_and_names_hosts() -> None:
    conf = Redis().sentinel_config(_node(2, nodes=5, sentinel=True))
    assert "sentinel monitor brokerchaos n1 6379 3" in conf
    assert "sentinel announce-hostnames yes" in conf and "sentinel announce-ip n2" in conf


def test_a_setting_needs_as_many_replicas_as_it_counts() -> None:
    with pytest.raises(ScenarioError, match="wait_replicas"):
        Redis().node_spec(_node(1, nodes=2, wait_replicas=2))
    assert "/etc/redis/brokerchaos-sentinel.conf.in" in Redis().node_spec(_node(1, sentinel=True)).files


def test_entry_ids_map_to_ordered_offsets() -> None:
    assert entry_offset("1700000000000-0") == 1_700_000_000_000_000_000
    ids = ["1700000000000-0", "1700000000000-7", "1700000000001-0"]
    assert [entry_offset(i) for i in ids] == sorted(entry_offset(i) for i in ids)


def test_the_client_gets_its_settings_through_client_settings() -> None:
    """Where the primary is and the publish rule reach the driver as ``client_settings``, not as
    AMQP's queue arguments."""
    r = Redis()
    s = r.validate_settings({"sentinel": True, "wait_replicas": 1})
    assert r.client_settings(s) == {"sentinel": True, "sentinel_port": 26379, "wait_replicas": 1}
    assert r.queue_arguments(s) == {}
