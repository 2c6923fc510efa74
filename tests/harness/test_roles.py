"""Node roles, shared volumes and faults aimed at a role (``harness.spec.broker.Role``)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from faults.network import Partition
from faults.power import PowerLossCoordinated
from faults.process import Kill, Pause
from harness.cluster import (
    DISK_ROLE,
    LAZYFS_BACKING,
    NODE_ROLE_LABEL,
    SHARED_MOUNT,
    build_topology,
    role_recipes,
)
from harness.errors import ClusterError
from harness.spec import (
    BROKER_ROLE,
    BrokerPlugin,
    ClusterNodes,
    ImageRecipe,
    NodeInfo,
    NodeSpec,
    Role,
    SharedVolume,
    node_role,
)
from harness.spec.errors import ScenarioError

DB = ImageRecipe(name="brokerchaos/db", debian_packages=("sqlite3",))


class Pair(BrokerPlugin):
    """A shared-storage pair and a database beside it."""

    name = "pair"
    client_port = 61613
    peer_ports = (61616,)
    data_dir = "/var/lib/pair"

    def roles(self, nodes: int, settings: Mapping[str, Any]) -> tuple[Role, ...]:
        return (Role(BROKER_ROLE, 2), Role("storage", 1, image=DB, clients=False, data_dir="/var/lib/db"))

    def shared_volumes(self, settings: Mapping[str, Any]) -> tuple[SharedVolume, ...]:
        return (SharedVolume("store", "/var/lib/pair/shared"),)

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        return NodeSpec(command=["run-" + node.role])


def topo(plugin: BrokerPlugin, **kw: Any) -> Any:
    return build_topology(
        plugin,
        run_id="bc-r",
        nodes=5,
        settings={},
        broker_image="brokerchaos/pair:1",
        proxy_image="brokerchaos/toxiproxy:1",
        role_images={"storage": "brokerchaos/db:1"},
        **kw,
    )


def test_nodes_are_numbered_over_the_roles_each_with_its_image_command_and_data_dir() -> None:
    t = topo(Pair())
    assert t.nodes == ("n1", "n2", "n3")
    assert t.roles == {"n1": "broker", "n2": "broker", "n3": "storage"}
    assert t.serving() == ("n1", "n2")  # the database serves no workload client
    db = t.container("n3", "broker")
    assert db.image == "brokerchaos/db:1" and db.command[-1] == "run-storage"
    assert db.command[:2] == ["--data-dir", "/var/lib/db"] and db.labels[NODE_ROLE_LABEL] == "storage"
    assert t.container("n1", "broker").image == "brokerchaos/pair:1"
    assert role_recipes(Pair(), 5, {}) == {"storage": DB}
    # Every node has its sidecar and a proxy to every other node, whatever its role.
    assert {p.dst for p in t.proxies["n3"] if p.src == "n3"} == {"n1", "n2"}


def test_a_shared_volume_is_one_volume_mounted_into_every_node_of_its_roles() -> None:
    t = topo(Pair())
    mounts = {n: dict(t.container(n, "broker").volumes) for n in t.nodes}
    assert mounts["n1"]["bc-r-shared-store"] == mounts["n2"]["bc-r-shared-store"] == "/var/lib/pair/shared"
    assert "bc-r-shared-store" not in mounts["n3"]
    assert mounts["n1"]["bc-r-n1-data"] != mounts["n2"].get("bc-r-n1-data")


class OnShared(Pair):
    """A pair whose data directory is the shared volume (ActiveMQ's shared-file-system pair)."""

    def shared_volumes(self, settings: Mapping[str, Any]) -> tuple[SharedVolume, ...]:
        return (SharedVolume("store", self.data_dir),)


def test_without_power_loss_a_shared_data_directory_is_one_docker_volume_and_no_disk() -> None:
    t = topo(OnShared())
    assert dict(t.container("n1", "broker").volumes) == {"bc-r-shared-store": "/var/lib/pair"}
    assert t.shared_disks == () and not t.container("n1", "broker").binds
    assert [c for c in t.containers if c.role == DISK_ROLE] == []


def test_under_power_loss_a_shared_volume_is_one_lazy_filesystem_every_node_of_it_sees() -> None:
    t = topo(OnShared(), lazyfs=True, filesystem="strict")
    (disk,) = t.shared_disks
    assert disk.nodes == ("n1", "n2") and disk.path == "/var/lib/pair"
    assert t.disks_of("n1") == t.disks_of("n2") == (disk,) and t.disks_of("n3") == ()
    assert t.lazy_nodes == ("n3",)  # the brokers' data is the disk's; the database has its own
    (spec,) = [c for c in t.containers if c.role == DISK_ROLE]
    assert spec.name == disk.container == "bc-r-shared-store"
    # The disk mounts the lazy filesystem on a host directory it shares (rshared) ...
    assert spec.binds == {"bc-r-shared-store-mount": (SHARED_MOUNT, "rshared")}
    assert spec.command[:3] == ["--data-dir", SHARED_MOUNT, "--lazyfs"]
    assert spec.command[-2:] == ["--", "true"]
    assert "--no-start" in spec.command and "SYS_ADMIN" in spec.cap_add
    assert spec.volumes == {"bc-r-shared-store": LAZYFS_BACKING}  # its backing: the shared volume
    for n in ("n1", "n2"):
        # ... and each broker binds the same directory (rslave): one mount, no lazy filesystem of its own.
        broker = t.container(n, "broker")
        assert broker.binds == {"bc-r-shared-store-mount": ("/var/lib/pair", "rslave")}
        assert "--lazyfs" not in broker.command and broker.volumes == {} and not broker.devices
    # The database, a role that does not mount the volume, keeps its own lazy filesystem.
    db = t.container("n3", "broker")
    assert "--lazyfs" in db.command and db.volumes == {"bc-r-n3-data": LAZYFS_BACKING} and not db.binds


def test_under_power_loss_a_shared_volume_beside_the_data_directory_goes_through_its_disk_too() -> None:
    t = topo(Pair(), lazyfs=True, filesystem="strict")
    broker = t.container("n1", "broker")
    assert "--lazyfs" in broker.command and broker.volumes == {"bc-r-n1-data": LAZYFS_BACKING}
    assert broker.binds == {"bc-r-shared-store-mount": ("/var/lib/pair/shared", "rslave")}
    assert [d.nodes for d in t.shared_disks] == [("n1", "n2")]
    assert t.lazy_nodes == ("n1", "n2", "n3")


def test_the_default_is_one_broker_role_of_every_node() -> None:
    class Plain(Pair):
        def roles(self, nodes: int, settings: Mapping[str, Any]) -> tuple[Role, ...]:
            return BrokerPlugin.roles(self, nodes, settings)

        def shared_volumes(self, settings: Mapping[str, Any]) -> tuple[SharedVolume, ...]:
            return ()

    t = topo(Plain())
    assert t.nodes == ("n1", "n2", "n3", "n4", "n5") and set(t.roles.values()) == {"broker"}
    assert NODE_ROLE_LABEL not in t.container("n1", "broker").labels
    assert all(set(t.container(n, "broker").volumes) == {f"bc-r-{n}-data"} for n in t.nodes)


def test_roles_must_be_distinct_and_some_must_serve_clients() -> None:
    class Twice(Pair):
        def roles(self, nodes: int, settings: Mapping[str, Any]) -> tuple[Role, ...]:
            return (Role("a", 1), Role("a", 1))

    class Nobody(Pair):
        def roles(self, nodes: int, settings: Mapping[str, Any]) -> tuple[Role, ...]:
            return (Role("a", 1, clients=False),)

    for bad in (Twice(), Nobody()):
        with pytest.raises(ClusterError):
            topo(bad)


NODES = ClusterNodes(
    ["n1", "n2", "n3", "n4"], {"n1": "broker", "n2": "broker", "n3": "storage", "n4": "storage"}
)


@pytest.mark.parametrize("seed", range(8))
def test_a_fault_aimed_at_a_role_picks_its_targets_among_that_role_only(seed: int) -> None:
    kill = Kill.resolve({"role": "storage"}, NODES, random.Random(seed))
    assert kill["node"] in ("n3", "n4") and kill["role"] == "storage"
    pause = Pause.resolve({"role": "broker"}, NODES, random.Random(seed))
    assert pause["node"] in ("n1", "n2")
    power = PowerLossCoordinated.resolve({"role": "storage", "nodes": "all"}, NODES, random.Random(seed))
    assert power["nodes"] == ["n3", "n4"]
    # A partition among one role's nodes leaves the other roles out of its sides.
    cut = Partition.resolve({"role": "broker"}, NODES, random.Random(seed))
    assert cut["cuts"] and {n for c in cut["cuts"] for n in c} == {"n1", "n2"}


def test_a_role_without_nodes_is_a_scenario_error_naming_the_roles() -> None:
    with pytest.raises(
        ScenarioError, match="role 'database' has no node; this cluster's roles: broker, storage"
    ):
        Kill.resolve({"role": "database"}, NODES, random.Random(1))


def test_a_role_fault_holds_its_resource_on_that_role_only() -> None:
    held = Pause.holds({"role": "storage"}, NODES)
    assert held == {("process", "n3"), ("process", "n4")}


def test_plain_node_lists_are_all_brokers() -> None:
    with pytest.raises(ScenarioError, match="this cluster's roles: broker"):
        Kill.resolve({"role": "storage"}, ["n1", "n2"], random.Random(1))
    assert Kill.resolve({"role": "broker"}, ["n1", "n2"], random.Random(1))["node"] in ("n1", "n2")


class _Handle:
    name = "n3"

    def exec(self, cmd: Any, timeout: float = 30.0) -> tuple[int, str]:
        return 0, ""


def test_node_role_reads_a_handles_role_and_takes_a_handle_without_one_for_a_broker() -> None:
    database = _Handle()
    database.role = "storage"  # type: ignore[attr-defined]
    assert node_role(database) == "storage"
    assert node_role(_Handle()) == BROKER_ROLE
