"""What a broker plugin declares and does: the contract between the host and a broker.

A plugin is data plus a few small methods (Jepsen's ``db`` protocol): the host
owns Docker, Toxiproxy and the workload; the plugin says how one node runs and
how a set of running nodes becomes a cluster. Optional abilities are declared
in ``capabilities`` and faults check them; nothing in the host names a broker.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypedDict, TypeVar

from harness.spec.coverage import BrokerEvent, Feature, LogEvent, events_from_lines
from harness.spec.errors import ClusterError, ScenarioError, one_line

#: Capabilities the host itself knows, with what declaring one promises. The set is open:
#: a fault package that needs something else registers it (``register.add_capability``)
#: and broker plugins declare it like these.
BASE_CAPABILITIES: dict[str, str] = {
    "kill": "SIGKILL of the broker and a restart keeps its data directory",
    "pause": "SIGSTOP/SIGCONT of the broker's processes",
    "stop": "graceful stop and start",
    "power-loss": "the data directory can sit on the lazy filesystem",
    "membership": "nodes can leave and join the running cluster (members, remove_node, add_node)",
    "clock": "the broker's runtime reads the wall clock through libc (time, gettimeofday, clock_gettime), so "
    "libfaketime preloaded into its processes sets the clock it sees",
    "partition": "inter-node traffic crosses the harness's proxies",
    "mirroring": "queues replicated across nodes (policy settings apply)",
    "unsynced-messages": "the plugin says which messages a power cut's unsynced writes held "
    "(unsynced_messages), so each cut reports how many acknowledged messages were exposed",
}


#: Debian's stable suite here: the one every image was built from before broker versions existed.
STABLE_SUITE = "bookworm"


class UnsyncedWrite(TypedDict):
    """One write a power cut dropped (or, torn, the part of it it dropped): the file as the lazy
    filesystem names it under the data directory (``/commitlog/00000000000000000000``), the
    offset in that file and the bytes."""

    path: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class ImageRecipe:
    """How to build a plugin's image on a machine that reaches no container registry.

    The image is the project's Debian base plus ``debian_packages`` (installed
    when the root filesystem is bootstrapped), ``python_packages`` (wheels fetched
    on the host, installed offline) and ``copy`` (host path -> container path).
    """

    name: str
    debian_packages: tuple[str, ...] = ()
    python_packages: tuple[str, ...] = ()
    copy: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    run: tuple[str, ...] = ()  # shell commands run at build time, offline
    #: The Debian suite whose root filesystem the image starts from (one bootstrap per suite).
    suite: str = STABLE_SUITE
    #: Debian package -> the upstream version it must install (a prefix: ``4.3`` takes 4.3.6-1):
    #: the build fails, naming what the suite serves instead, when the archive moved on.
    pins: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BrokerVersion:
    """One version of a broker that a plugin runs: where Debian's archive serves it and what differs.

    A scenario names it (``broker.version``); the plugin bound to it (``BrokerPlugin.at_version``)
    builds its image from ``suite`` with ``packages`` and fills ``settings`` as this version's
    defaults. ``upstream`` is what the suite served when the plugin was written: a run records
    the version the running broker reports (``BrokerPlugin.broker_version``), never this.
    """

    name: str  # as a scenario writes it: "4.3"
    suite: str  # Debian suite: bookworm, trixie, sid
    packages: tuple[str, ...]  # the Debian packages of the broker at this version
    upstream: str = ""  # e.g. "4.3.6"
    #: Setting defaults that differ from the plugin's ``settings_schema`` at this version.
    settings: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""  # what differs, in a few words (``brokerchaos plugins`` shows it)


@dataclass(frozen=True)
class NodeInfo:
    """One node as the plugin sees it when it writes the node's command and config."""

    name: str  # also the host name peers use to reach it (routed through the proxies)
    index: int  # 1-based
    peers: tuple[str, ...]  # the other nodes' names
    cluster: str  # unique per run; usable as a cookie or cluster id
    settings: Mapping[str, Any]  # the scenario's broker settings, validated by the plugin
    role: str = "broker"  # the node's role (``BrokerPlugin.roles``)


@dataclass(frozen=True)
class NodeSpec:
    """What the host runs for one node."""

    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)  # container path -> text
    user: str | None = None


class NodeHandle(Protocol):
    """A running node, for readiness checks and cluster formation."""

    name: str

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        """Run a command in the node's container; returns (exit code, output). A command still
        running after ``timeout`` seconds is stopped and answers ``EXEC_TIMED_OUT``."""
        ...


#: The exit code ``NodeHandle.exec`` answers for a command it stopped at its ``timeout`` (that of
#: coreutils' ``timeout``, which the host runs every command under).
EXEC_TIMED_OUT = 124


def brief(cmd: Sequence[str], width: int = 40) -> str:
    """``cmd`` as an error names it: an argument longer than ``width`` (an expression to evaluate,
    a JSON policy) is shown as ``…``, so the command stays short and what happened can follow."""
    return " ".join(a if len(a) <= width else "…" for a in cmd)


def run_or_fail(node: NodeHandle, cmd: Sequence[str], timeout: float = 30.0) -> str:
    """Run ``cmd`` on ``node``; its output. A non-zero exit is a ``ClusterError`` that leads with
    what happened, where: ``n1: rabbitmqctl -q eval … timed out after 30 s`` or ``n1: rabbitmqctl
    join_cluster rabbit@n1 exited 69: <its output, on one line>``."""
    rc, out = node.exec(cmd, timeout=timeout)
    if rc == 0:
        return out
    what = f"timed out after {timeout:.0f} s" if rc == EXEC_TIMED_OUT else f"exited {rc}"
    said = one_line(out, 300)
    raise ClusterError(f"{node.name}: {brief(cmd)} {what}" + (f": {said}" if said else ""))


T = TypeVar("T")


@dataclass(frozen=True)
class NotYet:
    """What a ``poll`` attempt returns while the condition does not hold: why not, for the error."""

    reason: str


def poll(attempt: Callable[[], T | NotYet], *, timeout: float, failure: str, interval: float = 1.0) -> T:
    """Call ``attempt`` until it returns a result rather than ``NotYet``; once ``timeout`` has passed,
    ``ClusterError`` with ``failure`` and the last attempt's reason. An error an attempt raises ends
    the poll: an attempt that should retry on it catches it and says ``NotYet``."""
    deadline = time.monotonic() + timeout
    while True:
        got = attempt()
        if not isinstance(got, NotYet):
            return got
        if time.monotonic() > deadline:
            raise ClusterError(f"{failure}: {got.reason}")
        time.sleep(interval)


def wait_until_running(
    node: NodeHandle,
    status_cmd: Sequence[str],
    want: set[str],
    running: Callable[[str], set[str]],
    timeout: float = 60.0,
    interval: float = 0.5,
) -> None:
    """Poll ``status_cmd`` on ``node`` until ``running(output)`` includes every name in ``want``.

    For ``form_cluster``: a status command that fails or lists too few nodes is
    retried until ``timeout``, then a ``ClusterError`` shows its last output.
    """

    def attempt() -> None | NotYet:
        rc, out = node.exec(status_cmd, timeout=30)
        if rc == 0:
            try:
                if want <= running(out):
                    return None
            except ValueError:  # a half-started node may print something else than its status
                pass
        return NotYet(out.strip()[-300:])

    poll(
        attempt,
        timeout=timeout,
        failure=f"cluster did not form in {timeout:.0f}s (want {sorted(want)})",
        interval=interval,
    )


#: The node init's control command in every broker container: the host runs each node's broker
#: command under its own init (``faults.nodeinit``), which the process faults drive.
NODE_CONTROL: tuple[str, ...] = ("python3", "-m", "faults.nodectl")
BROKER_ACTIONS = ("status", "stop", "start")


def control_broker(node: NodeHandle, action: str, timeout: float = 120.0) -> dict[str, Any]:
    """Stop, start or ask the state of ``node``'s broker process through the node's init; the
    init's reply. For a plugin whose membership change must take its broker down and bring it
    back with other settings (a new identity, an empty store) and whose broker has no admin
    command that stays up outside the cluster (RabbitMQ's ``stop_app``): stopping the process
    behind the init's back would read as a crash, and only the init can start it again. ``stop``
    is graceful (SIGTERM, SIGKILL after a grace); both are idempotent. A refusal is a
    ``ClusterError`` naming the node."""
    if action not in BROKER_ACTIONS:
        raise ValueError(f"action {action!r}: use one of {', '.join(BROKER_ACTIONS)}")
    out = run_or_fail(node, [*NODE_CONTROL, action], timeout=timeout)
    try:
        reply = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise ClusterError(f"{node.name}: node init {action} printed {out.strip()[-200:]}") from None
    if not isinstance(reply, dict) or not reply.get("ok", True):
        raise ClusterError(f"{node.name}: node init refused {action}: {reply}")
    return reply


# -- node roles, shared volumes, held totals ---------------------------------------------------

#: The role every node has unless a plugin declares others (``BrokerPlugin.roles``).
BROKER_ROLE = "broker"


@dataclass(frozen=True)
class Role:
    """Nodes of one kind in a cluster: brokers, a master/slave pair's standbys, a database or a
    coordination service beside them (Jepsen's Bufstream analysis aims faults by role: broker,
    coordination, storage). Nodes are numbered ``n1``.. over the roles in declared order, and
    every node has its own sidecar, so partitions, kills and pauses reach each one alike; a
    fault aims at a role with ``params: {role: NAME}``.

    ``nodes``: how many (None: the scenario's ``broker.nodes``). ``image``: another image for
    these nodes (a database's), None for the plugin's own. ``clients``: the workload connects
    to these nodes (False for an auxiliary service: no producer, consumer or drain goes there).
    ``settings``: what the plugin's ``node_spec`` reads for this role beside the broker's
    settings. ``data_dir``: the directory a node of this role keeps its data in (None: the
    plugin's ``data_dir``); it sits on the lazy filesystem under power loss like a broker's.
    """

    name: str
    nodes: int | None = None
    image: ImageRecipe | None = None
    clients: bool = True
    settings: Mapping[str, Any] = field(default_factory=dict)
    data_dir: str | None = None


def node_role(node: NodeHandle) -> str:
    """The role (``Role.name``) of a running node, for the methods the host calls on every node of
    every role (``is_ready``, ``broker_version``, ``queue_depth``): a plugin whose roles run
    different programs (brokers and their database) answers each by its role. The host's node
    handles carry it as ``role``; a handle without one is a broker."""
    return str(getattr(node, "role", BROKER_ROLE))


@dataclass(frozen=True)
class SharedVolume:
    """One directory mounted into several nodes (``roles``: every node of these roles), such as
    the KahaDB directory of a shared-file-system master/slave pair whose slave waits on the
    store's file lock. One volume, mounted at ``path`` in each node; its files, and the locks
    on them, are the same for every node that mounts it.

    Under power loss the volume is one lazy filesystem, mounted once by a disk container of its
    own and seen by every node of those roles (mount propagation): one page cache for all of
    them. A power cut aimed at any of those nodes kills every one of them at the same instant and
    then drops what the volume held unsynced, once (a node still running would have read writes
    the disk then forgets). The host's Docker volume directory must sit on a shared mount
    (``/var/lib/docker`` is one under systemd); Docker refuses the run in one line where not."""

    name: str
    path: str
    roles: tuple[str, ...] = (BROKER_ROLE,)


@dataclass(frozen=True)
class HeldTotal:
    """What ``queue_depth`` returns when the broker can only say how many messages it holds for
    a queue in total, not how many are ready and how many delivered but unacknowledged (a queue
    browser's count; ActiveMQ without JMX). The drain records the look as ``{"ready": null,
    "unacked": null, "held": total}``; a queue is empty when the total is 0. What the checkers
    cannot conclude from it: whether messages a node still holds after the drain are held for
    consumers that no longer exist (``stuck``) or ready and never delivered: such messages stay
    ``lost``/``unreachable`` with the held total as their evidence, never ``stuck``."""

    total: int


def depth_value(got: tuple[int, int] | HeldTotal) -> dict[str, int | None]:
    """A ``queue_depth`` answer as the drain's ``depth`` op records it (``harness.spec.history``)."""
    if isinstance(got, HeldTotal):
        return {"ready": None, "unacked": None, "held": got.total}
    return {"ready": got[0], "unacked": got[1]}


def depth_empty(got: tuple[int, int] | HeldTotal) -> bool:
    """Whether a ``queue_depth`` answer says the node holds nothing of the queue."""
    return got.total == 0 if isinstance(got, HeldTotal) else got[0] == 0 and got[1] == 0


#: What a broker may declare as its ``corruption_response``, with what the conformance kit checks.
CORRUPTION_RESPONSES: dict[str, str] = {
    "recover": "after a corrupted data file the node becomes ready again and the drain completes",
    "refuse": "after a corrupted data file the node stays down (never ready again) and its log names the file",
}


class BrokerPlugin:
    """Base class for broker plugins. Subclasses set the class attributes and override methods."""

    name: ClassVar[str]
    version: ClassVar[str] = "0"  # the plugin's own version; the broker's are ``versions``
    #: The broker versions this plugin runs, the default first. Empty: the plugin runs one
    #: broker it builds itself (the reference broker), and a scenario names no version.
    versions: ClassVar[tuple[BrokerVersion, ...]] = ()
    #: The wire protocol the workload speaks to it: names the client plugin it needs.
    protocol: ClassVar[str] = "amqp091"
    capabilities: ClassVar[frozenset[str]] = frozenset()
    client_port: ClassVar[int]
    #: Ports other nodes connect to. How they are proxied: inside node A's network namespace
    #: every peer's host name B resolves to a loopback address of A's own (127.0.0.10 + B's
    #: index), where A's sidecar listens on each of B's peer ports and forwards to B; so each
    #: directed link is a proxy of its own and a partition cuts it alone. The broker must
    #: therefore bind these ports to its own host name's address (and 127.0.0.1 where it
    #: needs loopback), not the wildcard: a wildcard listener would take the port on the
    #: peers' loopback addresses too, and the sidecar could not listen there.
    #:
    #: The client port may be listed here, for a broker whose nodes talk over it (replicas
    #: that follow a primary on its client port, a sentinel that watches it): the peer proxies
    #: sit at the peers' loopback addresses, while the workload's client proxy listens on
    #: another port (40000 + client_port % 10000, on every address of the namespace) and
    #: forwards to 127.0.0.1:client_port; the two never share a socket. Bind the client port
    #: to the node's own address and 127.0.0.1, not the wildcard. Any peer port but that
    #: client proxy port is allowed (``validate`` checks).
    peer_ports: ClassVar[tuple[int, ...]] = ()
    #: Further ports the workload's clients connect to besides ``client_port``, such as a
    #: discovery service that names the current primary (Redis Sentinel). Each gets a client
    #: proxy in every node's sidecar like ``client_port`` (so client partitions cut it too); the
    #: driver finds them in ``Endpoint.extra`` by container port.
    extra_client_ports: ClassVar[tuple[int, ...]] = ()
    data_dir: ClassVar[str]
    #: The broker's data files by role: a role's name and the globs (relative to ``data_dir``)
    #: of its files, such as ``{"quorum-wal": ("*/quorum/*/*.wal",)}``: the files that hold its
    #: messages. A file fault names a role (``corrupt-file``'s ``file_role``) instead of writing
    #: out where this broker keeps it; one that names no file picks among the files of the roles
    #: ``message_file_roles`` names for the run's settings.
    data_files: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: The lazy filesystem's model (``FILESYSTEM_MODELS``) for runs whose scenario sets no
    #: ``broker.filesystem``: the durability contract the broker claims. ``strict`` for a broker
    #: that fsyncs the directory of every name it makes durable; ``ext4-ordered`` for one that
    #: relies on a journal committing its names with its files' fsyncs, as most Linux software does.
    filesystem: ClassVar[str] = "ext4-ordered"
    log_paths: ClassVar[tuple[str, ...]] = ()
    #: Credentials and virtual host the workload uses (``DriverOptions`` in ``harness.spec.client``).
    #: The defaults are AMQP's (RabbitMQ's stock ``guest`` user and the ``/`` virtual host);
    #: a broker whose clients log in otherwise sets them, and a protocol without virtual
    #: hosts (or without users) leaves them as they are: its client ignores them.
    username: ClassVar[str] = "guest"
    password: ClassVar[str] = "guest"
    vhost: ClassVar[str] = "/"
    ready_timeout: ClassVar[float] = 60.0
    #: How the broker answers a damaged data file when it starts (``CORRUPTION_RESPONSES``):
    #: ``recover``, it comes back serving (its checksums drop or repair the damage, or it never
    #: notices); ``refuse``, it refuses to start and its log names the file. ``validate``'s probe
    #: of a fault kind that corrupts data (``ConformanceProbe.corrupts``) checks the declared one.
    corruption_response: ClassVar[str] = "recover"
    #: Settings the plugin accepts, with defaults and allowed values (for validation messages).
    #: The defaults must give a working broker on a single node: ``brokerchaos validate`` starts
    #: its clusters and runs its probes with default settings, most of them on one node.
    settings_schema: ClassVar[Mapping[str, tuple[Any, Sequence[Any] | type | None]]] = {}

    #: The features a run can exercise on this broker, and how a run shows it used each
    #: (``harness.spec.coverage.Feature``): the rows of the coverage map.
    features: ClassVar[tuple[Feature, ...]] = ()
    #: Events read from the logs by the default ``events``: one ``LogEvent`` per notable line.
    log_events: ClassVar[tuple[LogEvent, ...]] = ()
    #: Which of a node's collected files the default ``events`` reads (globs relative to the
    #: node's directory of the run: ``broker.log`` is the container's output, ``logs/`` holds
    #: the files of ``log_paths``).
    event_logs: ClassVar[tuple[str, ...]] = ("broker.log",)

    _release: BrokerVersion | None = None

    @property
    def release(self) -> BrokerVersion | None:
        """The version this instance runs: the one ``at_version`` bound, else the default."""
        return self._release or (self.versions[0] if self.versions else None)

    def at_version(self, name: str | None) -> BrokerPlugin:
        """This plugin bound to the version a scenario names (None: the default); the registered
        instance stays as it is. An unknown name is a ``ScenarioError`` naming the versions."""
        if name is None:
            return self
        chosen = next((v for v in self.versions if name in (v.name, v.upstream)), None)
        if chosen is None:
            known = ", ".join(v.name for v in self.versions)
            if not known:
                raise ScenarioError(f"broker.version: {self.name} runs one version; remove broker.version")
            raise ScenarioError(
                f"broker.version: {name!r} is not a version of {self.name}; use one of {known}"
            )
        bound = copy.copy(self)
        bound._release = chosen
        return bound

    def broker_version(self, node: NodeHandle) -> str | None:
        """The exact version the running broker reports, as a run records it (``rabbitmq-server
        4.3.6-1``). The default asks the node's package database for the bound version's first
        package; a plugin whose broker tells its own version may ask it instead. None: cannot tell."""
        rel = self.release
        if rel is None or not rel.packages:
            return None
        rc, out = node.exec(["dpkg-query", "-W", "-f", "${Package} ${Version}", rel.packages[0]], timeout=30)
        return out.strip() if rc == 0 and out.strip() else None

    def release_recipe(self, name: str, **fields: Any) -> ImageRecipe:
        """The image recipe at the bound version: its suite and packages (plus ``debian_packages``
        of ``fields``), the first package pinned to the version (but for a default on the stable
        suite, whose recipe stays as it was), the repository named by version except for the
        default (whose images keep the name they had)."""
        rel = self.release
        if rel is None:
            return ImageRecipe(name=name, **fields)
        extra = tuple(fields.pop("debian_packages", ()))
        default = rel == self.versions[0]
        # A default on the stable suite keeps the recipe it had before versions (its image's hash);
        # the stable suite does not move to another upstream version, testing and sid do.
        unpinned = default and rel.suite == STABLE_SUITE
        return ImageRecipe(
            name=name if default else f"{name}-{rel.name}",
            debian_packages=(*rel.packages, *extra),
            suite=rel.suite,
            pins={} if unpinned else {rel.packages[0]: rel.name},
            **fields,
        )

    #: Dead-letter destinations the broker fills on its own initiative, for every queue (ActiveMQ's
    #: ``ActiveMQ.DLQ``: poison acks, redelivery limits, duplicates), besides the workload's own
    #: ``<queue>.dead``. The drain reads each of them on every node after the workload's queues,
    #: and the checkers count what it finds there ``dead_lettered`` with the broker's reason
    #: (still a failure where the scenario expects no dead-lettering), not ``lost``.
    dead_letter_queues: ClassVar[tuple[str, ...]] = ()

    def disjoint_nodes(self, settings: Mapping[str, Any]) -> bool:
        """True when, with these (validated) settings, each message lives on exactly one node at a
        time and no node copies another's (ActiveMQ's network of brokers: store-and-forward, a
        message forwarded to where a consumer is). The run records it in ``scenario.json``
        (``broker.disjoint_nodes``, ``harness.spec.rundir.disjoint_nodes``) and the checkers then
        read a message the drain found on one node after another node reported the queue empty
        as what it is, not a split-brain copy: a message *stranded* on a node no consumer reached
        until the drain, a liveness finding with the node and the wait (``StrandedGroup``).
        False by default: nodes that replicate (mirrors, quorum queues, replicas) must never
        show the drain a copy another node had already given up."""
        return False

    def roles(self, nodes: int, settings: Mapping[str, Any]) -> tuple[Role, ...]:
        """The cluster's node roles for a scenario of ``nodes`` nodes with these (validated)
        settings; by default one role, ``broker``, of every node. ``node_spec`` is called for
        every node of every role with the node's ``role`` in its ``NodeInfo``."""
        return (Role(BROKER_ROLE, nodes),)

    def shared_volumes(self, settings: Mapping[str, Any]) -> tuple[SharedVolume, ...]:
        """Directories several nodes mount (``SharedVolume``); none by default: every node keeps
        its own ``data_dir``."""
        return ()

    def peer_ports_for(self, index: int) -> tuple[int, ...]:
        """Inter-node ports of node ``index`` (1-based). Brokers whose start-up checks bind
        the wildcard (RabbitMQ's distribution port) give each node its own port instead."""
        return tuple(self.peer_ports)

    def image(self) -> ImageRecipe:
        raise NotImplementedError

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        raise NotImplementedError

    def is_ready(self, node: NodeHandle) -> bool:
        """True once the node serves clients. Called repeatedly until ``ready_timeout``."""
        raise NotImplementedError

    def form_cluster(self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any]) -> None:
        """Join the ready nodes into one cluster and apply settings such as policies."""

    def queue_arguments(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """AMQP: the arguments the workload passes when it declares its queues (e.g. a queue
        type); the client receives them as ``queue_arguments``."""
        return {}

    def client_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What else of the broker's (validated) settings the workload's client must act on,
        in the client's terms: a stream's replica count, how many replicas a write waits for,
        where a client asks for the current primary. The client receives it as
        ``client_settings`` (``harness.spec.client.DriverOptions``). The broker and client
        plugins of one protocol agree on its keys; the harness only hands it over."""
        return {}

    def queue_depth(self, node: NodeHandle, queue: str, timeout: float) -> tuple[int, int] | HeldTotal | None:
        """``(ready, unacked)`` of ``queue`` as ``node`` sees it, for the final drain, or
        ``HeldTotal(n)`` when the broker can only tell the total it holds.

        The drain reads every queue through every node until each one reports it empty; a
        passive declare counts only ready messages, so deliveries still held by a connection
        nobody closed would pass for an empty queue. Ask the node itself (``node.exec``,
        the plugin's admin CLI, with ``timeout``: the seconds the drain gives one answer,
        ``harness.workload.depth_timeout``); run after every fault healed, so a failing command
        is a ``ClusterError`` (the drain tries again). None: this plugin cannot tell, and the
        drain falls back to the ready count of a passive declare.
        """
        return None

    def queue_holders(self, node: NodeHandle, queue: str) -> list[dict[str, Any]] | None:
        """What ``node`` lists as holding ``queue``'s deliveries: its consumers, channels or
        connections, as the broker's admin CLI names them (``node.exec``).

        The drain asks when a depth found deliveries unacked with no client connection of the
        harness open on the queue (held for consumers that no longer exist), and records the
        answer in the history beside that depth, for a reader to see what the broker thinks
        holds them. None: this plugin cannot tell.
        """
        return None

    def node_holdings(self, node: NodeHandle, queue: str) -> list[tuple[int | None, str]] | None:
        """What ``node``'s own copy of ``queue`` holds after the drain: (offset, message id)
        pairs in the copy's order (offset = the entry's position in a stream, e.g. the
        JetStream stream sequence; None for a queue without offsets). None: cannot tell."""
        return None

    def message_file_roles(self, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The ``data_files`` roles that hold the messages of a run with these (validated)
        ``settings``: where a corruption that names no file lands. Default: every declared role.
        A broker whose queue types keep their messages apart names its run's type's roles (a
        RabbitMQ node with no quorum queue still writes its quorum log's 5-byte header)."""
        return tuple(sorted(self.data_files))

    def queue_replicas(self, node: NodeHandle, queue: str) -> set[str] | None:
        """The nodes the broker itself names as holding a copy of ``queue`` (its replicas, running
        or not), as ``node`` tells it (``node.exec``, the plugin's admin CLI).

        For a client whose drain reads each node's own copy: a node the broker names no copy on
        (a stream whose replica on that node was removed when the node left the cluster, and
        which got none when it joined again) holds none to drain (``NoCopy``), while a named
        replica that does not answer is still waited for. A failing command is a
        ``ClusterError``. None: every node holds one, or this plugin cannot tell.
        """
        return None

    # -- events (coverage) -----------------------------------------------------------------

    def events(self, node: str, logs: Mapping[str, str]) -> list[BrokerEvent]:
        """Notable internal events of ``node``, from its collected logs (``logs``: each file of
        ``event_logs`` by its path relative to the node's directory, with its text).

        Read after the run, from the run directory, so a stored run gives the same events again
        (no Docker). The default applies ``log_events`` to every line, timed by ``log_time``; a
        plugin whose broker tells its events through an admin call instead overrides this.
        """
        out: list[BrokerEvent] = []
        for _path, text in sorted(logs.items()):
            out += events_from_lines(node, text.splitlines(), self.log_events, self.log_time)
        return out

    def log_time(self, line: str) -> datetime | None:
        """When a log line says it was written (aware, UTC); None if it carries no time."""
        return None

    # -- exposure at a power cut (capability ``unsynced-messages``) -----------------------

    def unsynced_messages(
        self, writes: Sequence[UnsyncedWrite], settings: Mapping[str, Any], nodes: int
    ) -> list[str]:
        """The ids (``producer:seq``) of the messages whose stored records ``writes`` held: what
        a power cut threw away on one node, mapped by the plugin that knows its broker's files
        (a commit log's records, a stream's message blocks, an append-only file). Only files that
        hold messages as the store of record count, not state the broker rebuilds from them;
        which files those are may depend on the run's ``settings`` (validated) and on how many
        ``nodes`` the cluster runs (a replicated stream's Raft log, an unreplicated stream's own
        blocks). Candidates are fine (``harness.spec.body_ids``): the harness keeps the ids the
        history attempted, and compares them with what was confirmed before the cut. A write
        whose messages cannot be read (compressed) raises: the cut's exposure is then unmeasured
        (a flag), never undercounted."""
        raise NotImplementedError

    def confirms_after_sync(self, settings: Mapping[str, Any]) -> bool | None:
        """Whether, under ``settings`` (validated), the broker promises that a publish is
        confirmed only after its write was fsynced: True (a power cut must then find no
        acknowledged message unsynced, and a non-zero count is a finding on its own, verdict
        ``UNSYNCED``), False (confirms may precede the sync: the exposure is measured, not
        judged), None (the plugin does not say; the default)."""
        return None

    # -- membership (capability ``membership``) ------------------------------------------

    def members(self, node: NodeHandle) -> set[str]:
        """Names of the nodes ``node`` counts as members of its cluster, running or not: a node
        that is down, paused, cut off or restarting stays a member until a removal takes it out
        (RabbitMQ: its disc and RAM nodes; a Raft group: its peers). The final heal joins again
        only the nodes no other node counts, since a join starts a node empty; it must not take
        a node that is merely down for one that left."""
        raise NotImplementedError

    def remove_node(
        self, node: NodeHandle, remaining: Sequence[NodeHandle], settings: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Take ``node`` out of the running cluster: it stops serving as a member and the
        ``remaining`` nodes forget it. Return what was done (recorded in the history)."""
        raise NotImplementedError

    def add_node(
        self, node: NodeHandle, members: Sequence[NodeHandle], settings: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Join ``node`` (a former member, or one that never was) to the running cluster of
        ``members``, starting it empty as a fresh member would. Return what was done."""
        raise NotImplementedError

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults (the bound version's where they differ) and check allowed values;
        raise ``ScenarioError`` naming the field."""
        out: dict[str, Any] = {}
        defaults = dict(self.release.settings) if self.release else {}
        for key in settings:
            if key not in self.settings_schema:
                known = ", ".join(sorted(self.settings_schema)) or "(none)"
                raise ScenarioError(
                    f"broker.settings.{key}: unknown setting for {self.name}; allowed: {known}"
                )
        for key, (default, allowed) in self.settings_schema.items():
            value = settings.get(key, defaults.get(key, default))
            if isinstance(allowed, type):
                # bool is an int to Python, never to a scenario author (``heartbeat: true``).
                if not isinstance(value, allowed) or (allowed is not bool and isinstance(value, bool)):
                    raise ScenarioError(f"broker.settings.{key}: expected {allowed.__name__}, got {value!r}")
            elif allowed is not None and value not in allowed:
                raise ScenarioError(
                    f"broker.settings.{key}: {value!r} is not allowed; use one of {', '.join(map(repr, allowed))}"
                )
            out[key] = value
        return out

    def source_root(self) -> Path:
        """Directory of the plugin package (image recipes copy from here)."""
        import inspect

        return Path(inspect.getfile(type(self))).resolve().parent
