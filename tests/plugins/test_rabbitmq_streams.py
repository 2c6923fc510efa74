"""The RabbitMQ stream plugin's pure parts: settings, the node's stream listener and replication
ports, and the workload features a stream refuses."""

from __future__ import annotations

from typing import Any

import pytest

from harness.errors import ClusterError, ScenarioError
from harness.spec.broker import NodeInfo
from harness.spec.scenario import ConsumerSection, DelaySection, WorkloadSection
from plugins.rabbitmq import CONF, START_SCRIPT, RabbitMQ
from plugins.rabbitmq.stream_client import entry_id, refuse_unsupported
from plugins.rabbitmq.streams import (
    ADVANCED,
    ENABLED_PLUGINS,
    INETRC,
    RabbitMQStream,
    holdings_expr,
    parse_holdings,
    replication_ports,
)

RS = RabbitMQStream()


def node(index: int) -> NodeInfo:
    names = ("n1", "n2", "n3")
    return NodeInfo(
        name=names[index - 1],
        index=index,
        peers=tuple(n for n in names if n != names[index - 1]),
        cluster="c1",
        settings=RS.validate_settings({}),
    )


def test_a_sibling_of_rabbitmq_4_3_on_its_image() -> None:
    assert RS.protocol == "rabbitmq-stream" and RS.client_port == 5552
    assert [v.name for v in RS.versions] == ["4.3"] and not RS.mirroring
    assert RS.image() == RabbitMQ().at_version("4.3").image()
    assert RS.confirms_after_sync(RS.validate_settings({})) is False  # streams never fsync


def test_settings() -> None:
    assert RS.validate_settings({}) == {
        "partition_handling": "pause_minority",
        "net_ticktime": 10,
        "replicas": 0,
    }
    assert RS.client_settings(RS.validate_settings({"replicas": 2})) == {"replicas": 2}


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"replicas": -1}, "broker.settings.replicas"),
        ({"queue_type": "quorum"}, "broker.settings.queue_type: unknown setting"),
        ({"ha_mode": "all"}, "broker.settings.ha_mode: unknown setting"),
        ({"net_ticktime": 0}, "broker.settings.net_ticktime"),
    ],
)
def test_settings_refused(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        RS.validate_settings(given)


def test_node_spec_enables_the_stream_plugin_and_keeps_replication_on_the_proxies() -> None:
    spec = RS.node_spec(node(2))
    conf = spec.files[CONF]
    assert "stream.listeners.tcp.1 = 5552" in conf and "stream.advertised_host = n2" in conf
    assert "listeners.tcp.default = 5672" in conf  # RabbitMQ's own settings are kept
    assert spec.files[ENABLED_PLUGINS] == "[rabbitmq_stream].\n"
    assert "{port_range, {6020, 6027}}" in spec.files[ADVANCED]  # every port of it proxied
    assert '{host, {127,0,0,12}, ["n2"]}' in spec.files[INETRC]  # n2 as its peers reach it
    assert spec.env["BROKERCHAOS_INETRC"] == INETRC and "ERL_INETRC" not in spec.env  # the server only
    assert 'ERL_INETRC="$BROKERCHAOS_INETRC"' in spec.files[START_SCRIPT]


def test_each_node_replicates_on_ports_of_its_own() -> None:
    ports = [set(RS.peer_ports_for(i)) - {4369} for i in (1, 2, 3)]
    assert not (ports[0] & ports[1]) and not (ports[1] & ports[2]) and not (ports[0] & ports[2])
    assert set(replication_ports(3)) <= set(RS.peer_ports_for(3))


@pytest.mark.parametrize(
    ("workload", "needle"),
    [
        (WorkloadSection(delay=DelaySection()), "workload.delay"),
        (WorkloadSection(ttl_ms=100), "workload.ttl_ms"),
        (WorkloadSection(consumer=ConsumerSection(requeue=0.1)), "workload.consumer.requeue"),
        (WorkloadSection(consumer=ConsumerSection(crash_every=5)), "workload.consumer.crash_every"),
        (WorkloadSection(consumers=2), "workload.consumers: 2 stream consumers would each read every"),
    ],
)
def test_what_a_stream_cannot_do_is_refused(workload: WorkloadSection, needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        refuse_unsupported(workload)


def test_entry_id_is_the_head_of_the_body() -> None:
    assert entry_id(b"p1:7|abc|payload") == "p1:7"


def test_holdings_read_the_local_replica_by_name() -> None:
    expr = holdings_expr("/", "chaos-1")
    assert '<<"chaos-1"/utf8>>' in expr and "rabbit_stream_coordinator:local_pid" in expr
    assert "osiris:init_reader(Pid, first" in expr


def test_holdings_parse_the_json_line() -> None:
    out = '[[0,"p2:1"],[1,"p1:1"],[5,"p2:2"]]\nok\n'
    assert parse_holdings(out, "n1", "chaos-1") == [(0, "p2:1"), (1, "p1:1"), (5, "p2:2")]
    assert parse_holdings("[]\n", "n1", "chaos-1") == []
    with pytest.raises(ClusterError, match="n1: no holdings for stream 'chaos-1'"):
        parse_holdings("Error: {badmatch,{error,not_found}}", "n1", "chaos-1")
