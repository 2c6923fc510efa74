"""The ActiveMQ plugin's topologies as data (no Docker): the config each node gets, its roles and
shared volume, and what the scenario may not ask of the STOMP client."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from harness.cluster import build_topology
from harness.scenario import ConsumerSection, WorkloadSection
from harness.spec import NodeInfo
from harness.spec.errors import ScenarioError
from plugins.activemq import DATA_DIR, PG_DATA, PG_IMAGE, PG_START, SHARED_DIR, START_SCRIPT, ActiveMQ
from plugins.activemq.client import DLQ, refuse_unsupported


def topology(settings: dict[str, object], nodes: int = 2, lazyfs: bool = False, role_images=None):
    plugin = ActiveMQ()
    return build_topology(
        plugin,
        run_id="bc-amq",
        nodes=nodes,
        settings=plugin.validate_settings(settings),
        broker_image="brokerchaos/activemq:1",
        proxy_image="brokerchaos/toxiproxy:1",
        lazyfs=lazyfs,
        role_images=role_images,
    )


def xml(settings: dict[str, object], index: int = 1) -> str:
    plugin = ActiveMQ()
    s = plugin.validate_settings(settings)
    return plugin.broker_xml(
        NodeInfo(
            name=f"n{index}", index=index, peers=("n2",) if index == 1 else ("n1",), cluster="c", settings=s
        )
    )


def test_the_shared_storage_pair_mounts_one_kahadb_volume_as_both_nodes_data_directory() -> None:
    t = topology({"topology": "shared-storage"})
    for n in ("n1", "n2"):
        c = t.container(n, "broker")
        assert dict(c.volumes) == {"bc-amq-shared-kahadb": SHARED_DIR}
        assert c.command[:2] == ["--data-dir", SHARED_DIR]
    assert f'<kahaDB directory="{SHARED_DIR}/kahadb"' in xml({"topology": "shared-storage"})
    # Under power loss: one lazy filesystem for both brokers, mounted by the volume's disk container.
    lazy = topology({"topology": "shared-storage"}, lazyfs=True)
    (disk,) = lazy.shared_disks
    assert disk.nodes == ("n1", "n2") and disk.path == SHARED_DIR and lazy.lazy_nodes == ()
    for n in ("n1", "n2"):
        c = lazy.container(n, "broker")
        assert dict(c.binds) == {"bc-amq-shared-kahadb-mount": (SHARED_DIR, "rslave")}
        assert "--lazyfs" not in c.command and not c.volumes


def test_each_other_topology_keeps_its_own_store_and_only_the_network_dials_its_peers() -> None:
    t = topology({"topology": "network"})
    assert dict(t.container("n1", "broker").volumes) == {"bc-amq-n1-data": DATA_DIR}
    network = xml({"topology": "network"})
    assert 'uri="static:(tcp://n2:61616)"' in network and 'uri="tcp://@IP@:61616"' in network
    single = xml({})
    assert "networkConnector" not in single and "61616" not in single
    assert 'uri="stomp://127.0.0.1:61613"' in single and 'uri="stomp://@IP@:61613"' in single


@pytest.mark.parametrize("sync", ["always", "periodic", "never"])
def test_the_journal_sync_setting_reaches_kahadb(sync: str) -> None:
    got = xml({"journal_sync": sync, "journal_sync_interval_ms": 250})
    assert f'journalDiskSyncStrategy="{sync}"' in got and 'journalDiskSyncInterval="250"' in got


def test_bad_settings_are_one_scenario_error_naming_the_field() -> None:
    with pytest.raises(ScenarioError, match="broker.settings.topology"):
        ActiveMQ().validate_settings({"topology": "replicated"})
    with pytest.raises(ScenarioError, match="broker.settings.lease_ms"):
        ActiveMQ().validate_settings({"topology": "jdbc", "lease_ms": 10})
    with pytest.raises(ScenarioError, match="broker.settings.heap_mb"):
        ActiveMQ().validate_settings({"heap_mb": 8})


def test_what_stomp_cannot_do_is_refused_by_name() -> None:
    refuse_unsupported(WorkloadSection(consumer=ConsumerSection(close_every=5, crash_every=7)))
    with pytest.raises(ScenarioError, match="requeue and recover_every"):
        refuse_unsupported(WorkloadSection(consumer=ConsumerSection(requeue=0.1)))
    with pytest.raises(ScenarioError, match="workload.dead_letter"):
        refuse_unsupported(WorkloadSection(dead_letter=True))


def test_the_brokers_own_dead_letter_queue_and_log_times() -> None:
    plugin = ActiveMQ()
    assert plugin.dead_letter_queues == (DLQ,) == ("ActiveMQ.DLQ",)
    line = "2026-11-28 21:29:09,651 | WARN  | Corrupt journal records found in 'db-1.log' | x | main"
    assert plugin.log_time(line) == datetime(2026, 11, 28, 21, 29, 9, 651000, tzinfo=UTC)
    assert [e.name for e in plugin.events("n1", {"logs/activemq.log": line})] == ["kahadb-corrupt"]


def test_the_jdbc_pair_runs_its_database_on_a_storage_node_of_its_own_after_the_brokers() -> None:
    plugin = ActiveMQ()
    roles = plugin.roles(2, plugin.validate_settings({"topology": "jdbc"}))
    assert [(r.name, r.nodes, r.clients, r.data_dir) for r in roles] == [
        ("broker", 2, True, None),
        ("storage", 1, False, PG_DATA),
    ]
    assert roles[1].image == PG_IMAGE and PG_IMAGE.debian_packages == ("postgresql",)
    t = topology({"topology": "jdbc"}, lazyfs=True, role_images={"storage": "brokerchaos/pg:1"})
    assert t.nodes == ("n1", "n2", "n3") and t.client_nodes == ("n1", "n2")
    db = t.container("n3", "broker")
    assert db.image == "brokerchaos/pg:1" and db.command[:2] == ["--data-dir", PG_DATA]
    assert "--lazyfs" in db.command  # power loss cuts the database's data directory, every broker's store
    assert db.command[-2:] == ["/bin/sh", PG_START]
    # Each broker reaches the database through its own sidecar (a partition cuts that link alone).
    assert [p.name for p in t.proxies["n1"] if p.dst == "n3"] == ["n1_to_n3_61616", "n1_to_n3_5432"]


@pytest.mark.parametrize(("sync", "fsync"), [("on", True), ("off", False)])
def test_the_jdbc_brokers_share_one_lease_and_the_database_takes_its_durability_settings(
    sync: str, fsync: bool
) -> None:
    plugin = ActiveMQ()
    s = plugin.validate_settings(
        {"topology": "jdbc", "db_synchronous_commit": sync, "db_fsync": fsync, "lease_ms": 6000}
    )
    broker = NodeInfo(name="n2", index=2, peers=("n1", "n3"), cluster="c", settings=s)
    got = plugin.broker_xml(broker)
    assert '<jdbcPersistenceAdapter dataSource="#postgres-ds"' in got and 'lockKeepAlivePeriod="3000"' in got
    assert '<lease-database-locker lockAcquireSleepInterval="6000"/>' in got
    assert 'class="org.postgresql.ds.PGSimpleDataSource"' in got and '"serverNames" value="n3"' in got
    assert "kahaDB" not in got and 'brokerName="n2"' in got  # the lease holder is the broker's name
    assert 'pg_isready -q -h "$db"' in plugin.node_spec(broker).files[START_SCRIPT]
    db = plugin.node_spec(
        NodeInfo(name="n3", index=3, peers=("n1", "n2"), cluster="c", settings=s, role="storage")
    )
    script = db.files[PG_START]
    assert f"-c fsync={'on' if fsync else 'off'} -c synchronous_commit={sync}" in script
    assert "listen_addresses=$ip,127.0.0.1" in script  # never the wildcard: the sidecar listens on the peers'


def test_the_databases_log_lines_are_timed_and_read_as_events() -> None:
    plugin = ActiveMQ()
    line = "2026-11-29 02:50:01.250 UTC [31] LOG:  database system is ready to accept connections"
    assert plugin.log_time(line) == datetime(2026, 11, 29, 2, 50, 1, 250000, tzinfo=UTC)
    assert [e.name for e in plugin.events("n3", {"broker.log": line})] == ["db-ready"]
    lease = "2026-11-29 02:50:03,000 | INFO  | n1, becoming master with lease expiry Sun Nov 29 | x | main"
    # A broker's output repeats its activemq.log: only the file counts.
    assert [e.name for e in plugin.events("n1", {"logs/activemq.log": lease, "broker.log": lease})] == [
        "lease-master"
    ]
