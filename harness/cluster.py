"""Docker orchestration: one network per run, one sidecar (Toxiproxy) and one broker
container per node, named volumes for data, readiness, logs, teardown.

The topology is data (``Topology``) built from a broker plugin and a scenario;
the same object drives the Docker SDK here and renders ``docker-compose.yml``
(``harness.compose``), so there is one description of the cluster, not two.

Each node is two containers. The sidecar ``<run>-<node>`` owns the network
namespace (host name = node name, peers mapped to its loopback addresses) and
runs the Toxiproxy-API server; the broker container ``<run>-<node>-broker`` joins
that namespace. Killing or restarting the broker therefore never touches the
proxies, and each directed link is a proxy of its own.

Several runs may share one Docker engine (engineers on one machine, parallel CI
jobs). Everything a run creates carries its owner: the harness process's pid, that
process's start time (a recycled pid has another), the machine's boot id, host name
and pid namespace. ``remove_orphans`` removes only runs whose owner is gone, so a
clean-up never takes down a run in progress.
"""

from __future__ import annotations

import functools
import io
import os
import socket
import tarfile
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from harness.docker_exec import exec_output
from harness.errors import ClusterError, DockerUnavailable, NodesDown, PortInUse, short_error
from harness.images import FAKETIME_LIB
from harness.progress import say
from harness.proxies import (
    ProxySpec,
    ToxiproxyServer,
    client_proxy_port,
    extra_client_proxy_port,
    peer_address,
)
from harness.spec.broker import (
    BROKER_ROLE,
    NODE_CONTROL,
    BrokerPlugin,
    ImageRecipe,
    NodeInfo,
    NotYet,
    Role,
    SharedVolume,
    control_broker,
    poll,
)
from harness.spec.client import Endpoint
from harness.spec.fault import FAKETIME_FILE, FILESYSTEM_MODELS, ClusterNodes
from harness.spec.rundir import NODES

PROJECT_LABEL = "brokerchaos.project"
RUN_LABEL = "brokerchaos.run"
ROLE_LABEL = "brokerchaos.role"
NODE_LABEL = "brokerchaos.node"
NODE_ROLE_LABEL = "brokerchaos.node-role"  # the node's role (``BrokerPlugin.roles``)
OWNER_PID_LABEL = "brokerchaos.owner.pid"
OWNER_START_LABEL = "brokerchaos.owner.start"  # the pid's start time, clock ticks since boot
OWNER_BOOT_LABEL = "brokerchaos.owner.boot"  # /proc/sys/kernel/random/boot_id
OWNER_HOST_LABEL = "brokerchaos.owner.host"
OWNER_PIDNS_LABEL = "brokerchaos.owner.pidns"  # pids mean something only inside one pid namespace
TOXIPROXY_API_PORT = 8474
LAZYFS_BACKING = "/var/lib/brokerchaos/backing"
#: Where a shared volume's disk container mounts its lazy filesystem: a host directory (a Docker
#: volume's own directory) bound with ``rshared`` propagation, so the FUSE mount made here shows
#: in every node that binds the same directory (``rslave``).
SHARED_MOUNT = "/var/lib/brokerchaos/shared"
#: ``ContainerSpec.role`` of a shared volume's disk: a container that runs the one lazy
#: filesystem of a shared volume and no broker.
DISK_ROLE = "disk"
#: The broker's own environment under the ``faketime`` host feature: libfaketime reads its
#: wall-clock offset from the control file, at most once a second (re-reading it on every
#: call costs about 40 us per ``time.time()``), and leaves CLOCK_MONOTONIC alone.
FAKETIME_ENV = {
    "LD_PRELOAD": FAKETIME_LIB,
    "FAKETIME_TIMESTAMP_FILE": FAKETIME_FILE,
    "FAKETIME_CACHE_DURATION": "1",
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
}


#: Pause between two rounds of readiness polls (each round asks every pending node at once).
READY_POLL_S = 0.2
#: How often a node that is not ready yet has its node init asked whether its broker still runs
#: (a command in the node, so not every round of a plugin that polls every READY_POLL_S).
INIT_ASK_S = 5.0

_T = TypeVar("_T")
_R = TypeVar("_R")


def each(fn: Callable[[_T], _R], items: Sequence[_T], at_most: int | None = None) -> list[_R]:
    """``fn`` of every item, each on a thread of its own (``at_most`` threads at a time where given),
    the results in the items' order; the first item's exception (in order) is raised once all have
    finished. One item: no thread."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    workers = min(len(items), at_most or len(items))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cluster") as pool:
        futures = [pool.submit(fn, x) for x in items]
    return [f.result() for f in futures]


#: At most this many Docker calls of one kind at once (docker-py's connection pool holds 10;
#: ``down --all`` removes every run's containers).
DOCKER_CALLS_AT_ONCE = 8


def docker_client():
    """A Docker client from the environment (``DOCKER_HOST`` works), or one clear error."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "the local socket /var/run/docker.sock")
        raise DockerUnavailable(
            f"cannot reach the Docker engine at {where} ({short_error(exc)}); start Docker or set DOCKER_HOST"
        ) from None


def published_host() -> str:
    """Where published ports are reachable: the Docker host of DOCKER_HOST, else loopback."""
    url = os.environ.get("DOCKER_HOST", "")
    if url.startswith(("tcp://", "http://", "https://")):
        return urllib.parse.urlparse(url).hostname or "127.0.0.1"
    return "127.0.0.1"


# -- who owns a run ------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """The start time of a live process (field 22 of /proc/PID/stat), or None if there is none.

    Where /proc is missing, a live pid gives "": the owner cannot be told from a
    recycled pid there, so such a run counts as alive (never removed by mistake).
    """
    stat = _read(f"/proc/{pid}/stat")
    if stat:
        return stat.rpartition(")")[2].split()[19]  # after the command name, which may hold spaces
    if Path("/proc/self/stat").exists():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


@dataclass(frozen=True)
class Owner:
    """The harness process that created a run, and where it ran."""

    host: str
    boot_id: str
    pidns: str
    pid: int
    start: str

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            boot_id=_read("/proc/sys/kernel/random/boot_id"),
            pidns=_pidns("self"),
            pid=pid,
            start=process_start(pid) or "",
        )

    def labels(self) -> dict[str, str]:
        return {
            OWNER_HOST_LABEL: self.host,
            OWNER_BOOT_LABEL: self.boot_id,
            OWNER_PIDNS_LABEL: self.pidns,
            OWNER_PID_LABEL: str(self.pid),
            OWNER_START_LABEL: self.start,
        }


def _pidns(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


OwnerState = Literal["alive", "gone", "elsewhere", "unowned"]


def owner_state(
    labels: Mapping[str, str], here: Owner, start_of: Callable[[int], str | None] = process_start
) -> OwnerState:
    """Whether the harness that labelled a resource is still running, as far as this process can tell.

    "gone" is the only state that allows removal: the owner ran on this machine in this
    boot and its pid is free or now belongs to a process started at another time; or the
    machine has rebooted since. "elsewhere" (another host or pid namespace: its pids mean
    nothing here) and "unowned" (no owner labels: an older harness or another tool) are
    left alone, like "alive".
    """
    pid = labels.get(OWNER_PID_LABEL, "")
    if not pid.isdigit():
        return "unowned"
    if labels.get(OWNER_HOST_LABEL) != here.host:
        return "elsewhere"
    boot = labels.get(OWNER_BOOT_LABEL, "")
    if boot and here.boot_id and boot != here.boot_id:
        return "gone"
    if labels.get(OWNER_PIDNS_LABEL, "") != here.pidns:
        return "elsewhere"
    start = start_of(int(pid))
    if start is None:
        return "gone"
    recorded = labels.get(OWNER_START_LABEL, "")
    if start and recorded and start != recorded:
        return "gone"
    return "alive"


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    service: str  # compose service name
    role: str  # "proxy" or "broker"
    node: str
    image: str
    command: Sequence[str] = ()
    entrypoint: Sequence[str] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    hostname: str | None = None
    network_of: str | None = None  # join this container's network namespace
    extra_hosts: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[int, int | None] = field(default_factory=dict)  # container port -> host port (None = any)
    volumes: Mapping[str, str] = field(default_factory=dict)  # volume name -> mount point
    #: volume name -> (mount point, propagation): the volume's directory on the host bound with
    #: mount propagation (a FUSE mount made under it in one container shows in the others)
    binds: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    devices: Sequence[str] = ()
    cap_add: Sequence[str] = ()
    security_opt: Sequence[str] = ()
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SharedDisk:
    """The one lazy filesystem of a shared volume under power loss: its container (``container``,
    running nodeinit with the lazy filesystem and no broker) and the nodes that mount it. A power
    cut of any of those nodes cuts this disk, and so every node that mounts it: one page cache
    cannot lose a write for one node and keep it for another."""

    name: str
    path: str
    container: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    run_id: str
    network: str
    nodes: tuple[str, ...]
    containers: tuple[ContainerSpec, ...]
    proxies: Mapping[str, tuple[ProxySpec, ...]]  # sidecar node -> its proxies
    client_port: int
    data_dir: str
    lazyfs: bool
    faketime: bool = False
    #: The lazy filesystem's model the nodes mount (None: the data is on plain volumes).
    filesystem: str | None = None
    #: Each node's role (``BrokerPlugin.roles``; every node ``broker`` unless the plugin declares others).
    roles: Mapping[str, str] = field(default_factory=dict)
    #: The nodes the workload's clients connect to (those of roles with ``clients``); all when empty.
    client_nodes: tuple[str, ...] = ()
    #: The shared volumes on the lazy filesystem (power loss), each served by one disk container.
    shared_disks: tuple[SharedDisk, ...] = ()
    #: Under the lazy filesystem: the nodes with one of their own (their data directory is not a
    #: shared volume's); their node init takes disk rules and ``power-loss`` itself.
    lazy_nodes: tuple[str, ...] = ()

    def disks_of(self, node: str) -> tuple[SharedDisk, ...]:
        """The shared disks ``node`` mounts (a power cut of the node cuts them too)."""
        return tuple(d for d in self.shared_disks if node in d.nodes)

    def role_of(self, node: str) -> str:
        return self.roles.get(node, BROKER_ROLE)

    def serving(self) -> tuple[str, ...]:
        """The nodes the workload connects to."""
        return self.client_nodes or self.nodes

    def container(self, node: str, role: str) -> ContainerSpec:
        for c in self.containers:
            if c.node == node and c.role == role:
                return c
        raise KeyError((node, role))


def filesystem_model(plugin: BrokerPlugin, requested: str | None, lazyfs: bool) -> str | None:
    """The lazy filesystem's model a run uses: the scenario's ``broker.filesystem``, else the
    plugin's own; None when the data directories are not on the lazy filesystem."""
    if not lazyfs:
        return None
    model = requested or plugin.filesystem
    if model not in FILESYSTEM_MODELS:
        raise ClusterError(
            f"broker plugin {plugin.name!r} declares filesystem {model!r}; "
            f"the lazy filesystem models are {', '.join(FILESYSTEM_MODELS)}"
        )
    return model


def node_roles(plugin: BrokerPlugin, nodes: int, settings: Mapping[str, Any]) -> dict[str, Role]:
    """Every node's name (``n1``.. over the roles in declared order) and its ``Role``."""
    roles = plugin.roles(nodes, settings)
    if not roles or len({r.name for r in roles}) != len(roles):
        raise ClusterError(f"broker plugin {plugin.name!r}: roles must be distinct and at least one")
    out: dict[str, Role] = {}
    for role in roles:
        for _ in range(nodes if role.nodes is None else role.nodes):
            out[f"n{len(out) + 1}"] = role
    if not any(r.clients for r in out.values()):
        raise ClusterError(f"broker plugin {plugin.name!r}: no node of any role serves clients")
    return out


def fault_nodes(roles: Mapping[str, Role]) -> ClusterNodes:
    """Every node's name (``node_roles``) with its role's name: what a plan's faults resolve against."""
    return ClusterNodes(list(roles), {n: r.name for n, r in roles.items()})


def role_recipes(plugin: BrokerPlugin, nodes: int, settings: Mapping[str, Any]) -> dict[str, ImageRecipe]:
    """The image recipe of each role that declares its own, by role name."""
    return {r.name: r.image for r in plugin.roles(nodes, settings) if r.image is not None}


def _node_links(
    plugin: BrokerPlugin, run_id: str, name: str, names: Sequence[str], cport: int
) -> tuple[ProxySpec, ...]:
    """One node's proxies: its client port(s) and every directed link to a peer's peer ports."""
    links = [
        ProxySpec(
            f"client_to_{name}",
            f"0.0.0.0:{cport}",
            f"127.0.0.1:{plugin.client_port}",
            "client",
            name,
            plugin.client_port,
        )
    ]
    links += [
        ProxySpec(
            f"client_to_{name}_{port}",
            f"0.0.0.0:{extra_client_proxy_port(port)}",
            f"127.0.0.1:{port}",
            "client",
            name,
            port,
        )
        for port in plugin.extra_client_ports
    ]
    for j, peer in enumerate(names, start=1):
        if peer == name:
            continue
        # The peer's sidecar by container name: its host name would resolve, through
        # this namespace's hosts file, back to this very proxy.
        for port in plugin.peer_ports_for(j):
            links.append(
                ProxySpec(
                    f"{name}_to_{peer}_{port}",
                    f"{peer_address(j)}:{port}",
                    f"{run_id}-{peer}:{port}",
                    name,
                    peer,
                    port,
                )
            )
    return tuple(links)


def _node_volumes(
    run_id: str, name: str, role: Role, data_mount: str, shared: Sequence[SharedVolume]
) -> dict[str, str]:
    """A node's volumes: every shared volume its role mounts (one Docker volume, the same for every
    node that mounts it), and its own data volume unless a shared one is its data directory."""
    out = {f"{run_id}-shared-{v.name}": v.path for v in shared if role.name in v.roles}
    if data_mount not in out.values():
        out[f"{run_id}-{name}-data"] = data_mount
    return out


def shared_mount_volume(run_id: str, volume: SharedVolume) -> str:
    """The Docker volume whose host directory carries a shared volume's lazy filesystem mount."""
    return f"{run_id}-shared-{volume.name}-mount"


def _lazy_node_volumes(
    run_id: str, name: str, role: Role, data_dir: str, shared: Sequence[SharedVolume]
) -> tuple[dict[str, str], dict[str, tuple[str, str]], bool]:
    """Under power loss: a node's own volumes, its binds of the shared disks' mounts (``rslave``:
    it sees the disk container's FUSE mount, made before or after it starts), and whether its data
    directory is on a node-local lazy filesystem (False when it is a shared volume's)."""
    mine = [v for v in shared if role.name in v.roles]
    binds = {shared_mount_volume(run_id, v): (v.path, "rslave") for v in mine}
    local = not any(v.path == data_dir for v in mine)
    volumes = {f"{run_id}-{name}-data": LAZYFS_BACKING} if local else {}
    return volumes, binds, local


def _disk_container(
    v: SharedVolume, nodes: tuple[str, ...], o: _NodeOptions
) -> tuple[ContainerSpec, SharedDisk]:
    """A shared volume's disk: nodeinit with the lazy filesystem at SHARED_MOUNT (bound ``rshared``
    to the host directory every node of the volume binds), its backing on the shared volume's
    Docker volume, and no broker (``true``, never started)."""
    name = f"{o.run_id}-shared-{v.name}"
    init = ["--data-dir", SHARED_MOUNT, "--lazyfs", "--backing", LAZYFS_BACKING]
    init += ["--lazyfs-names", str(o.model)]
    spec = ContainerSpec(
        name=name,
        service=f"shared-{v.name}",
        role=DISK_ROLE,
        node="",
        image=o.broker_image,
        command=[*init, "--no-start", "--", "true"],
        hostname=f"shared-{v.name}",
        volumes={name: LAZYFS_BACKING},
        binds={shared_mount_volume(o.run_id, v): (SHARED_MOUNT, "rshared")},
        devices=("/dev/fuse:/dev/fuse:rwm",),
        cap_add=("SYS_ADMIN",),
        security_opt=("apparmor:unconfined",),
        labels={**o.labels, ROLE_LABEL: DISK_ROLE},
    )
    return spec, SharedDisk(v.name, v.path, name, nodes)


def _shared_disks(o: _NodeOptions, roles: Mapping[str, Role]) -> list[tuple[ContainerSpec, SharedDisk]]:
    """Under power loss, each shared volume some node mounts: its disk container and its nodes."""
    out = []
    for v in o.shared:
        mounting = tuple(n for n, role in roles.items() if role.name in v.roles)
        if mounting:
            out.append(_disk_container(v, mounting, o))
    return out


@dataclass(frozen=True)
class _NodeOptions:
    """What every node container of one topology shares."""

    run_id: str
    labels: Mapping[str, str]
    broker_image: str
    role_images: Mapping[str, str]
    lazyfs: bool
    model: str | None
    faketime: bool
    shared: tuple[SharedVolume, ...]


def _node_container(plugin: BrokerPlugin, info: NodeInfo, role: Role, o: _NodeOptions) -> ContainerSpec:
    spec = plugin.node_spec(info)
    data_dir = role.data_dir or plugin.data_dir
    init = ["--data-dir", data_dir]
    devices: tuple[str, ...] = ()
    caps: tuple[str, ...] = ()
    sec: tuple[str, ...] = ()
    binds: dict[str, tuple[str, str]] = {}
    volumes = _node_volumes(o.run_id, info.name, role, data_dir, o.shared)
    if o.lazyfs:
        volumes, binds, local = _lazy_node_volumes(o.run_id, info.name, role, data_dir, o.shared)
        if local:
            init += ["--lazyfs", "--backing", LAZYFS_BACKING, "--lazyfs-names", str(o.model)]
            devices = ("/dev/fuse:/dev/fuse:rwm",)
            caps = ("SYS_ADMIN",)
            sec = ("apparmor:unconfined",)
    # The fake clock reaches the broker's processes only, not nodeinit or `docker exec`.
    clock = ["/usr/bin/env", *(f"{k}={v}" for k, v in FAKETIME_ENV.items())] if o.faketime else []
    sidecar = f"{o.run_id}-{info.name}"
    return ContainerSpec(
        name=f"{sidecar}-broker",
        service=f"{info.name}-broker",
        role="broker",
        node=info.name,
        image=o.role_images.get(role.name, o.broker_image),
        command=[*init, "--", *clock, *spec.command],
        env=dict(spec.env),
        network_of=sidecar,
        volumes=volumes,
        binds=binds,
        files=dict(spec.files),
        devices=devices,
        cap_add=caps,
        security_opt=sec,
        labels={
            **o.labels,
            ROLE_LABEL: "broker",
            NODE_LABEL: info.name,
            **({NODE_ROLE_LABEL: role.name} if role.name != BROKER_ROLE else {}),
        },
    )


def build_topology(
    plugin: BrokerPlugin,
    *,
    run_id: str,
    nodes: int,
    settings: Mapping[str, Any],
    broker_image: str,
    proxy_image: str,
    lazyfs: bool = False,
    faketime: bool = False,
    filesystem: str | None = None,
    host_ports: Mapping[str, int] | None = None,
    api_host_ports: Mapping[str, int] | None = None,
    role_images: Mapping[str, str] | None = None,
) -> Topology:
    """The containers, volumes and proxies of one cluster (``filesystem``: the scenario's model;
    ``role_images``: the image of each role that declares its own, by role name)."""
    roles = node_roles(plugin, nodes, settings)
    names = tuple(roles)
    labels = {PROJECT_LABEL: "brokerchaos", RUN_LABEL: run_id}
    cport = client_proxy_port(plugin.client_port)
    opts = _NodeOptions(
        run_id,
        labels,
        broker_image,
        dict(role_images or {}),
        lazyfs,
        filesystem_model(plugin, filesystem, lazyfs),
        faketime,
        tuple(plugin.shared_volumes(settings)),
    )
    containers: list[ContainerSpec] = []
    proxies: dict[str, tuple[ProxySpec, ...]] = {}
    for i, name in enumerate(names, start=1):
        peers = tuple(n for n in names if n != name)
        proxies[name] = _node_links(plugin, run_id, name, names, cport)
        containers.append(
            ContainerSpec(
                name=f"{run_id}-{name}",
                service=name,
                role="proxy",
                node=name,
                image=proxy_image,
                hostname=name,
                extra_hosts={peer: peer_address(names.index(peer) + 1) for peer in peers},
                ports={
                    cport: (host_ports or {}).get(name),
                    TOXIPROXY_API_PORT: (api_host_ports or {}).get(name),
                    **{extra_client_proxy_port(p): None for p in plugin.extra_client_ports},
                },
                cap_add=("NET_ADMIN",),  # packet faults: tc and nft in the node's network namespace
                labels={**labels, ROLE_LABEL: "proxy", NODE_LABEL: name},
            )
        )
        role = roles[name]
        info = NodeInfo(name=name, index=i, peers=peers, cluster=run_id, settings=settings, role=role.name)
        containers.append(_node_container(plugin, info, role, opts))
    disks = _shared_disks(opts, roles) if lazyfs else []
    containers += [spec for spec, _ in disks]
    return Topology(
        run_id=run_id,
        network=run_id,
        nodes=names,
        containers=tuple(containers),
        proxies=proxies,
        client_port=plugin.client_port,
        data_dir=plugin.data_dir,
        lazyfs=lazyfs,
        faketime=faketime,
        filesystem=opts.model,
        roles={n: r.name for n, r in roles.items()},
        client_nodes=tuple(n for n, r in roles.items() if r.clients),
        shared_disks=tuple(disk for _, disk in disks),
        lazy_nodes=tuple(c.node for c in containers if c.role == "broker" and "--lazyfs" in c.command),
    )


class Node:
    """A running node: its broker container, its sidecar's Toxiproxy and its client endpoint."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.role = cluster.topology.role_of(name)  # ``BrokerPlugin.roles``: what this node is
        self.container_name = cluster.topology.container(name, "broker").name
        self.sidecar_name = cluster.topology.container(name, "proxy").name
        self.toxiproxy: ToxiproxyServer | None = None
        self.client_endpoint: tuple[str, int] | None = None
        self.extra_endpoints: dict[int, tuple[str, int]] = {}  # extra_client_ports: port -> (host, port)

    @property
    def container(self):
        return self.cluster.client.containers.get(self.container_name)

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        return _exec(self.container, cmd, timeout)

    def running(self) -> bool:
        try:
            return self.container.status == "running"
        except Exception:  # noqa: BLE001
            return False


def _exec(container: Any, cmd: Sequence[str], timeout: float) -> tuple[int, str]:
    import docker.errors

    try:
        # coreutils' ``timeout`` ends the command at the limit and exits EXEC_TIMED_OUT (the contract's).
        code, out = exec_output(container, ["timeout", str(round(max(1, timeout))), *cmd])
    except docker.errors.APIError as exc:
        return 126, short_error(exc)
    return code, out.decode(errors="replace")


def _broker_ended(node: Any) -> bool:
    """Whether ``node``'s node init says its broker process ended (it ran, and exited or was
    stopped) and no restart is pending: only a ``start`` brings it back. An init that does not
    answer (one still starting) says nothing: the node is not counted out on it."""
    try:
        status = control_broker(node, "status", timeout=30)
    except ClusterError:
        return False
    return bool(
        status.get("state") == "stopped" and status.get("last_exit") and not status.get("restart_pending")
    )


class Disk:
    """A running shared disk (``SharedDisk``): its container's node init answers ``nodectl``
    (``disk-cut``, ``sync``, ``status``) like a node's."""

    def __init__(self, cluster: Cluster, disk: SharedDisk) -> None:
        self.cluster = cluster
        self.disk = disk
        self.name = f"shared-{disk.name}"
        self.container_name = disk.container

    @property
    def container(self):
        return self.cluster.client.containers.get(self.container_name)

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        return _exec(self.container, cmd, timeout)


@dataclass(eq=False)
class Cluster:
    """Start, inspect and tear down one topology. Use as a context manager: it always tears down."""

    client: Any
    topology: Topology
    plugin: BrokerPlugin
    settings: Mapping[str, Any]
    _: KW_ONLY
    keep: bool = False

    def __post_init__(self) -> None:
        self.nodes = {name: Node(self, name) for name in self.topology.nodes}
        self.disks = {d.name: Disk(self, d) for d in self.topology.shared_disks}
        self.host = published_host()
        # Added when resources are created, not in the topology: docker-compose.yml renders
        # the topology and must not change with the pid of whoever rendered it.
        self.owner = Owner.current()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.keep:
            self.teardown()

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        import docker.errors

        t = self.topology
        say(
            "cluster",
            f"network {t.network}, {len(t.nodes)} nodes, data on "
            + (f"lazyfs (model {t.filesystem})" if t.lazyfs else "volumes"),
        )
        try:
            self._refuse_taken_names()
            self.client.networks.create(t.network, driver="bridge", labels=self._labels())
            made: set[str] = set()  # a shared volume is mounted by several nodes, created once
            for c in t.containers:
                for vol in (set(c.volumes) | set(c.binds)) - made:
                    self.client.volumes.create(vol, labels={**c.labels, **self.owner.labels()})
                    made.add(vol)
            # Each step for every node at once (the Docker API calls and the sidecars' start are
            # waits, not work of this process), in the same order as before: every proxy is in
            # place before any broker starts.
            each(self._run, [c for c in t.containers if c.role == "proxy"])
            each(self._attach_proxy, list(self.nodes.values()))
            # A shared volume's disk is mounted before any broker writes under its mount point.
            each(self._start_disk, [c for c in t.containers if c.role == DISK_ROLE])
            each(self._start_broker, [c for c in t.containers if c.role == "broker"])
        except docker.errors.APIError as exc:
            text = short_error(exc)
            if "port is already allocated" in text or "address already in use" in text:
                raise PortInUse(f"{text}: free the port or choose other host ports") from None
            raise ClusterError(f"Docker refused to start the cluster: {text}") from None
        self.wait_ready()
        say("cluster", f"forming the cluster ({self.plugin.name})")
        self.plugin.form_cluster(list(self.nodes.values()), self.settings)
        if t.lazyfs:
            self._write_back()
        say("cluster", "ready: " + ", ".join(f"{n}={h}:{p}" for n, (h, p) in self.client_endpoints().items()))

    def _write_back(self) -> None:
        """Put what the brokers wrote while starting on the lazy filesystem's disk (``sync``).

        A broker under test has been up long enough for its OS to write back its setup, so a
        power cut tests the fsyncs the broker makes for its data, not boot files that no real
        machine would still hold only in its page cache seconds after start."""
        targets: list[Node | Disk] = [*self.nodes.values(), *self.disks.values()]
        for node in targets:
            rc, out = node.exec([*NODE_CONTROL, "sync"])
            if rc != 0:
                raise ClusterError(
                    f"{node.name}: writing back the lazy filesystem after start failed: {out.strip()[-300:]}"
                )

    def _labels(self) -> dict[str, str]:
        return {PROJECT_LABEL: "brokerchaos", RUN_LABEL: self.topology.run_id, **self.owner.labels()}

    def _refuse_taken_names(self) -> None:
        """Two runs with one id would share volumes: Docker hands back an existing volume
        of the same name instead of failing, so a second run would start on the first's data."""
        import docker.errors

        t = self.topology
        taken = [n.name for n in self.client.networks.list(names=[t.network]) if n.name == t.network]
        for name, get in [
            *((v, self.client.volumes.get) for v in {v for c in t.containers for v in c.volumes}),
            *((c.name, self.client.containers.get) for c in t.containers),
        ]:
            try:
                get(name)
                taken.append(name)
            except docker.errors.NotFound:
                pass
        if taken:
            raise ClusterError(
                f"run id {t.run_id} is already used on this Docker engine ({', '.join(sorted(taken))}); "
                "start the run again (a new run gets a new id)"
            )

    def _create(self, c: ContainerSpec):
        kwargs: dict[str, Any] = dict(
            image=c.image,
            name=c.name,
            command=list(c.command) or None,
            environment=dict(c.env),
            labels={**c.labels, **self.owner.labels()},
            detach=True,
        )
        if c.entrypoint is not None:
            kwargs["entrypoint"] = list(c.entrypoint)
        if c.network_of:
            kwargs["network_mode"] = f"container:{c.network_of}"
        else:
            kwargs["network"] = self.topology.network
            kwargs["hostname"] = c.hostname
            kwargs["extra_hosts"] = dict(c.extra_hosts)
            kwargs["ports"] = {
                f"{p}/tcp": (self.host if self.host == "127.0.0.1" else "0.0.0.0", hp)
                for p, hp in c.ports.items()
            }
        if c.volumes:
            kwargs["volumes"] = {v: {"bind": m, "mode": "rw"} for v, m in c.volumes.items()}
        if c.binds:
            kwargs["mounts"] = [self._bind(v, m, prop) for v, (m, prop) in c.binds.items()]
        if c.devices:
            kwargs["devices"] = list(c.devices)
        if c.cap_add:
            kwargs["cap_add"] = list(c.cap_add)
        if c.security_opt:
            kwargs["security_opt"] = list(c.security_opt)
        container = self.client.containers.create(**kwargs)
        if c.files:
            container.put_archive("/", _tar_files(c.files))
        return container

    def _bind(self, volume: str, target: str, propagation: str) -> Any:
        """A bind of a volume's host directory with mount propagation (Docker's named volumes take
        none); Docker refuses it where the directory's host mount is not shared."""
        import docker.types

        source = self.client.volumes.get(volume).attrs["Mountpoint"]
        return docker.types.Mount(target, source, type="bind", propagation=propagation)

    def _run(self, c: ContainerSpec) -> None:
        self._create(c).start()

    def _start_disk(self, c: ContainerSpec) -> None:
        """Start a shared volume's disk and wait until its lazy filesystem is mounted (its node
        init answers only once the mount is up)."""
        self._run(c)
        disk = next(d for d in self.disks.values() if d.container_name == c.name)
        say("cluster", f"{disk.name}: mounting the lazy filesystem of shared volume {disk.disk.name}")

        def mounted() -> bool | NotYet:
            if self.client.containers.get(c.name).status == "exited":
                raise ClusterError(
                    f"{disk.name}: the shared volume's disk exited: "
                    + self.client.containers.get(c.name).logs(tail=15).decode(errors="replace")
                )
            rc, out = disk.exec([*NODE_CONTROL, "status"], timeout=10)
            return True if rc == 0 and '"mount"' in out else NotYet(out.strip()[-200:])

        poll(mounted, timeout=60, failure=f"{disk.name}: the lazy filesystem did not mount", interval=0.2)

    def _start_broker(self, c: ContainerSpec) -> None:
        self._create(c)
        say("cluster", f"{c.node}: starting {self.plugin.name} ({c.name})")
        self.client.containers.get(c.name).start()

    def _attach_proxy(self, node: Node) -> None:
        sidecar = self.client.containers.get(node.sidecar_name)
        sidecar.reload()
        ports = sidecar.attrs["NetworkSettings"]["Ports"]
        api = ports.get(f"{TOXIPROXY_API_PORT}/tcp")
        cport = ports.get(f"{client_proxy_port(self.topology.client_port)}/tcp")
        if not api or not cport:
            raise ClusterError(f"{node.name}: the sidecar's ports were not published ({ports})")
        node.toxiproxy = ToxiproxyServer(node.name, self.host, int(api[0]["HostPort"]))
        node.client_endpoint = (self.host, int(cport[0]["HostPort"]))
        for port in self.plugin.extra_client_ports:
            published = ports.get(f"{extra_client_proxy_port(port)}/tcp")
            if not published:
                raise ClusterError(f"{node.name}: the sidecar's port for {port} was not published ({ports})")
            node.extra_endpoints[port] = (self.host, int(published[0]["HostPort"]))
        node.toxiproxy.wait()
        node.toxiproxy.populate(list(self.topology.proxies[node.name]))

    def wait_ready(self, nodes: Sequence[str] | None = None, timeout: float | None = None) -> None:
        """Poll every pending node's ``is_ready`` at once (one thread per node: each poll is a
        command run in the node, so a round takes as long as the slowest, not their sum), every
        READY_POLL_S, until each is ready, will not be (its container exited, or its broker ended
        and its node init is not starting it again: asked every INIT_ASK_S), or ``timeout`` (the
        plugin's ``ready_timeout``) passed; ``NodesDown`` names every node that did not get ready,
        and why."""
        timeout = timeout or self.plugin.ready_timeout
        pending = list(nodes or self.topology.nodes)
        deadline = time.monotonic() + timeout
        asked: dict[str, float] = {}
        down: dict[str, str] = {}
        while pending:
            now = time.monotonic()
            ask = frozenset(n for n in pending if n not in asked or now - asked[n] >= INIT_ASK_S)
            asked.update(dict.fromkeys(ask, now))
            rounds = each(functools.partial(self._ready, ask=ask), list(pending))
            for name, ready in zip(list(pending), rounds, strict=True):
                if ready is True:
                    say("cluster", f"{name}: ready")
                if ready is not False:
                    pending.remove(name)
                if isinstance(ready, str):
                    down[name] = ready
            if pending and time.monotonic() > deadline:
                down.update(
                    {
                        n: f"not ready after {timeout:.0f}s\nlast log lines:\n{self.tail_log(n)}"
                        for n in pending
                    }
                )
                break
            if pending:
                time.sleep(READY_POLL_S)
        if down:
            raise NodesDown(down)

    def _ready(self, name: str, ask: frozenset[str]) -> bool | str:
        """True once ready, False not yet, or why it never will be: its container exited, or (asked
        when it is in ``ask``) its broker process ended and its node init is not starting it again.
        A broker that refuses its damaged data exits at every start and nothing but the harness
        starts it again: waiting for it would only wait out ``ready_timeout``."""
        node = self.nodes[name]
        if not node.running():
            return f"the broker container exited\nits log:\n{self.tail_log(name)}"
        if self.plugin.is_ready(node):
            return True
        if name in ask and _broker_ended(node):
            ended = "its broker process ended and its node init does not start it again"
            return f"{ended}\nits log:\n{self.tail_log(name)}"
        return False

    def tail_log(self, name: str, lines: int = 15) -> str:
        try:
            return self.nodes[name].container.logs(tail=lines).decode(errors="replace")
        except Exception as exc:  # noqa: BLE001
            return f"(no log: {short_error(exc)})"

    def client_endpoints(self) -> dict[str, tuple[str, int]]:
        return {n: node.client_endpoint for n, node in self.nodes.items() if node.client_endpoint}

    def endpoints(self) -> dict[str, Endpoint]:
        """The client endpoints of every node the workload connects to, as drivers get them
        (``harness.spec.Endpoint``): a node of a role without ``clients`` is left out."""
        serving = self.topology.serving()
        return {
            n: Endpoint(n, *node.client_endpoint, extra=dict(node.extra_endpoints))
            for n, node in self.nodes.items()
            if node.client_endpoint and n in serving
        }

    # -- logs and teardown ---------------------------------------------------------------

    def collect(self, out: Path) -> None:
        """Container logs, the plugin's log files and a listing of each data directory: every node
        at once (each is Docker's answers to wait for, into a directory of its own)."""
        each(lambda name: self._collect_node(out / NODES / name, self.nodes[name]), list(self.nodes))

    def _collect_node(self, d: Path, node: Node) -> None:
        import docker.errors

        d.mkdir(parents=True, exist_ok=True)
        for cname, fname in ((node.container_name, "broker.log"), (node.sidecar_name, "toxiproxy.log")):
            try:
                (d / fname).write_bytes(self.client.containers.get(cname).logs())
            except docker.errors.DockerException as exc:
                (d / fname).write_text(f"(unavailable: {short_error(exc)})\n")
        if not node.running():
            return
        rc, listing = node.exec(["find", self.topology.data_dir, "-printf", "%y %10s %p\n"])
        (d / "data-dir.txt").write_text(listing)
        for path in self.plugin.log_paths:
            try:
                bits, _ = node.container.get_archive(path)
                buf = io.BytesIO(b"".join(bits))
                with tarfile.open(fileobj=buf) as tar:
                    tar.extractall(d / "logs", filter="data")
            except docker.errors.DockerException:
                pass

    def teardown(self) -> None:
        remove_labelled(self.client, self.topology.run_id)


@dataclass
class Cleanup:
    """What ``remove_orphans`` did: counts removed, and the runs it left alone with why."""

    removed_runs: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"containers": 0, "networks": 0, "volumes": 0})
    left: dict[str, OwnerState] = field(default_factory=dict)  # run id ("" = no run label) -> state


def remove_orphans(
    client,
    *,
    here: Owner | None = None,
    start_of: Callable[[int], str | None] = process_start,
) -> Cleanup:
    """Remove the runs whose harness process is gone; leave every other run alone.

    A run is judged by the owner labels of its resources: any resource whose owner is
    not gone keeps the whole run (a run still being created may so far have only its
    network).
    """
    here = here or Owner.current()
    flt = {"label": [f"{PROJECT_LABEL}=brokerchaos"]}
    states: dict[str, set[OwnerState]] = {}
    for kind in (
        client.containers.list(all=True, filters=flt),
        client.networks.list(filters=flt),
        client.volumes.list(filters=flt),
    ):
        for r in kind:
            labels = _labels_of(r)
            states.setdefault(labels.get(RUN_LABEL, ""), set()).add(owner_state(labels, here, start_of))
    out = Cleanup()
    for run_id, seen in sorted(states.items()):
        if run_id and seen == {"gone"}:
            for key, n in remove_labelled(client, run_id).items():
                out.counts[key] += n
            out.removed_runs.append(run_id)
        else:
            out.left[run_id] = next(s for s in ("alive", "elsewhere", "unowned", "gone") if s in seen)
    return out


def _labels_of(resource: Any) -> dict[str, str]:
    labels = getattr(resource, "labels", None)
    if labels is None:  # networks and volumes keep theirs in attrs
        labels = resource.attrs.get("Labels")
    return dict(labels or {})


def remove_labelled(client, run_id: str | None = None) -> dict[str, int]:
    """Remove containers, networks and volumes brokerchaos labelled (one run, or all, running or not).

    Each kind in stages, each stage's removals at once (``each``, ``DOCKER_CALLS_AT_ONCE`` at a time: a forced removal is mostly
    Docker's wait for the container's processes to die, one after another it was 2 s of a 3-node
    run's teardown): the brokers first (they live in their sidecars' namespaces), then the shared
    disks, stopped (their node init unmounts the lazy filesystem, which a forced removal would
    leave on the host), then the rest; then the networks, then the volumes."""
    import docker.errors

    flt = [f"{PROJECT_LABEL}=brokerchaos"] + ([f"{RUN_LABEL}={run_id}"] if run_id else [])
    containers = client.containers.list(all=True, filters={"label": flt})
    stages: dict[int, list[Any]] = {}
    for c in containers:
        stages.setdefault({"broker": 0, DISK_ROLE: 1}.get(c.labels.get(ROLE_LABEL, ""), 2), []).append(c)

    def removed(remove: Callable[[], Any]) -> int:
        try:
            remove()
            return 1
        except docker.errors.NotFound:
            return 0

    def container(c: Any) -> int:
        def remove() -> None:
            if c.labels.get(ROLE_LABEL) == DISK_ROLE and c.status == "running":
                c.stop(timeout=30)
            c.remove(force=True, v=True)

        return removed(remove)

    counts = {"containers": 0, "networks": 0, "volumes": 0}
    for stage in sorted(stages):
        counts["containers"] += sum(each(container, stages[stage], DOCKER_CALLS_AT_ONCE))
    networks = client.networks.list(filters={"label": flt})
    counts["networks"] = sum(each(lambda n: removed(n.remove), networks, DOCKER_CALLS_AT_ONCE))
    volumes = client.volumes.list(filters={"label": flt})
    counts["volumes"] = sum(
        each(lambda v: removed(lambda: v.remove(force=True)), volumes, DOCKER_CALLS_AT_ONCE)
    )
    return counts


def _tar_files(files: Mapping[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
