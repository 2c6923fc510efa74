"""The ``[replication]`` table: every mistake is one line naming the key."""

from __future__ import annotations

import re
from typing import Any

import pytest

from broker_impl.config import ConfigError
from broker_impl.replication import ReplicationConfig


def test_defaults_follow_rocketmq() -> None:
    cfg = ReplicationConfig.from_table({"role": "sync_master"}, "n1")
    assert cfg is not None
    assert (cfg.port, cfg.sync_timeout_ms, cfg.max_lag_bytes) == (10912, 5000, 256 * 1024 * 1024)
    assert cfg.is_master and cfg.listen == "n1" and cfg.master is None
    slave = ReplicationConfig.from_table({"role": "slave", "master": "n1:7000"}, "n2")
    assert slave is not None and not slave.is_master and slave.master == ("n1", 7000)
    assert ReplicationConfig.from_table({}, "n1") is None


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        (
            {"role": "primary"},
            "replication.role: 'primary' not allowed; allowed sync_master, async_master, slave",
        ),
        ({"role": "slave"}, "replication.master: a slave needs its master's host"),
        ({"role": "slave", "master": "n1:x"}, 'replication.master: expected "host" or "host:port"'),
        ({"role": "sync_master", "master": "n1"}, "replication.master: only a slave names a master"),
        ({"role": "sync_master", "port": 0}, "replication.port: expected a whole number 1..65535, got 0"),
        (
            {"role": "sync_master", "sync_timeout_ms": True},
            "replication.sync_timeout_ms: expected a whole number",
        ),
        (
            {"role": "sync_master", "heartbeat_ms": 5000},
            "replication.dead_after_ms: must be longer than heartbeat_ms",
        ),
        ({"role": "sync_master", "flush": "sync"}, "replication.flush: unknown key"),
    ],
)
def test_errors(table: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        ReplicationConfig.from_table(table, "n1")
    assert needle in str(err.value)


def test_a_node_cannot_have_both_modes(tmp_path) -> None:
    import asyncio

    from broker_impl.broker import Broker, BrokerError
    from broker_impl.config import parse

    cfg = parse(
        {
            "node": {"data_dir": str(tmp_path)},
            "cluster": {"peers": ["n2"]},
            "replication": {"role": "sync_master"},
        }
    )
    with pytest.raises(BrokerError, match="two replication modes"):
        asyncio.run(Broker(cfg).start())


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"replication": {"role": "bogus"}}, "config error: replication.role: 'bogus' not allowed"),
        ({"cluster": {"peers": "n2"}}, "config error: cluster.peers: expected a list"),
    ],
)
def test_a_mistake_in_a_mode_table_stops_the_start_in_one_line(tmp_path, table, says) -> None:
    import asyncio

    from broker_impl.broker import Broker, BrokerError
    from broker_impl.config import parse

    cfg = parse({"node": {"data_dir": str(tmp_path)}, **table})
    with pytest.raises(BrokerError, match=re.escape(says)):
        asyncio.run(Broker(cfg).start())
