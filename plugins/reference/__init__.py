"""The reference broker (``broker_impl``) as a brokerchaos plugin.

Each node runs ``python3 -m broker_impl --config /etc/brokerchaos/broker.toml``
in the project's Debian image; ``broker_impl`` is copied in as source, its
wheels (pamqp, uvloop) installed offline.

``BROKERCHAOS_REFERENCE_SOURCE=DIR`` builds the image from another copy of the
broker's source (a directory laid out like ``broker_impl/``), e.g. the detection
bench's planted bugs (``bench/detection.py``).

Membership (capability ``membership``) goes through the broker's own ctl, as
RabbitMQ's through ``rabbitmqctl``: a node leaves with ``stop_app`` on it and
``forget_cluster_node`` on a member, and comes back with ``stop_app``, ``reset``,
``join_cluster`` a member, ``start_app`` (``broker_impl.cluster.membership``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import (
    BrokerChaosError,
    BrokerPlugin,
    ClusterError,
    Feature,
    ImageRecipe,
    LogEvent,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    ScenarioError,
    UnsyncedWrite,
    body_ids,
    consumers_giving_back,
    hookimpl,
    membership_change,
    run_or_fail,
    wait_until_running,
)

__version__ = "0.1.0"

REPO = Path(__file__).resolve().parents[2]
CONFIG_PATH = "/etc/brokerchaos/broker.toml"
CONTROL_PORT = 15990
SOURCE_ENV = "BROKERCHAOS_REFERENCE_SOURCE"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


MIRRORED = {"ha_mode": ("all", "exactly", "nodes")}
SINGLE_COPY = {"ha_mode": (None,), "replication": (None,)}
NODE_FAULTS = ("kill", "power-loss")
QUEUE = r"queue '(?P<queue>[^']+)'"

#: The rows of the reference broker's coverage map (``harness.spec.coverage.Feature``).
FEATURES: tuple[Feature, ...] = (
    Feature(
        "queue, single copy",
        "a durable queue held by one node (no mirroring, no replication); corrupting its only copy "
        "loses data by construction, so corruption is wanted on mirrored queues only",
        SINGLE_COPY,
        wanted=(
            "kill",
            "power-loss",
            "power-loss-coordinated",
            "pause",
            "slow-fsync",
            "fsync-lie",
            "disk-error",
            "disk-full",
        ),
    ),
    Feature(
        "group commit (flush: sync)",
        "publishes confirmed after the commit log's fsync, one fsync for every waiter of a batch",
        {"flush": ("sync",)},
        wanted=("kill", "power-loss", "slow-fsync", "fsync-lie"),
    ),
    Feature(
        "flush: async",
        "publishes confirmed before the fsync; the page cache flushed every flush_interval_ms",
        {"flush": ("async",)},
        wanted=NODE_FAULTS,
    ),
    Feature(
        "slow disk",
        "fsyncs that take long (a slow-fsync fault held), so each group commit's window is wide",
        {"flush": ("sync",)},
        faults=("slow-fsync",),
        wanted=("power-loss",),
    ),
    Feature(
        "mirrored queue",
        "a classic queue mirrored over a GM ring (ha-mode all, exactly or nodes)",
        MIRRORED,
        nodes=(2, None),
        wanted=(
            "kill",
            "pause",
            "partition",
            "power-loss",
            "power-loss-coordinated",
            "member-remove",
            "clock-skew",
            "corrupt-file",
        ),
    ),
    Feature(
        "promotion when-synced",
        "ha-promote-on-failure: when-synced (an unsynced mirror is never promoted)",
        {**MIRRORED, "ha_promote_on_failure": ("when-synced",)},
        nodes=(2, None),
        wanted=("kill",),
    ),
    Feature(
        "partition handling: pause_minority",
        "a node that sees itself in a minority pauses",
        {"partition_handling": ("pause_minority",), "replication": (None,)},
        nodes=(3, None),
        wanted=("partition",),
    ),
    Feature(
        "partition handling: autoheal",
        "after a partition, the losing side restarts and takes the winner's state",
        {"partition_handling": ("autoheal",), "replication": (None,)},
        nodes=(3, None),
        wanted=("partition",),
    ),
    Feature(
        "master-slave, sync",
        "n1 a SYNC_MASTER: a confirm waits for the slave to have the message",
        {"replication": ("sync",)},
        nodes=(2, None),
        wanted=("kill", "power-loss", "partition"),
    ),
    Feature(
        "master-slave, async",
        "n1 an ASYNC_MASTER: a confirm does not wait for the slave",
        {"replication": ("async",)},
        nodes=(2, None),
        wanted=("kill", "power-loss", "partition"),
    ),
    Feature(
        "transactions, mirrored",
        "AMQP tx on a mirrored queue",
        MIRRORED,
        workload=("transactions",),
        nodes=(2, None),
        wanted=("kill", "partition", "power-loss"),
    ),
    Feature(
        "transactions, single copy",
        "AMQP tx on a queue held by one node: recovery replays its prepared and commit records",
        SINGLE_COPY,
        workload=("transactions",),
        wanted=("kill", "power-loss"),
    ),
    Feature(
        "delayed messages",
        "publishes through an x-delayed-message exchange",
        workload=("delay",),
        wanted=("kill", "partition", "power-loss"),
    ),
    consumers_giving_back(
        "basic.nack/reject(requeue), basic.recover, channels closed and connections cut with deliveries unacked",
        wanted=("kill", "power-loss"),
    ),
    Feature(
        "slow consumers",
        "consumers that hold each delivery before acking it",
        workload=("slow-ack",),
        wanted=("kill",),
    ),
    membership_change(
        "a node leaves the running cluster (forget_cluster_node) and joins again empty",
        MIRRORED,
        wanted=("member-remove", "partition", "kill"),
    ),
    Feature(
        "membership change moving the queue master",
        "a membership change after which a mirror on another node took the queue over",
        MIRRORED,
        faults=("member-remove",),
        events=("promoted-in-sync", "promoted-unsynced"),
        nodes=(3, None),
        wanted=("member-remove",),
    ),
    Feature(
        "message TTL",
        "x-message-ttl (workload.ttl_ms) / per-message expiration (workload.expiration_ms): messages expired",
        workload=("ttl",),
        wanted=("kill", "partition"),
    ),
    Feature(
        "dead-lettering",
        "x-dead-letter-exchange into a dead-letter queue the workload consumes (workload.dead_letter)",
        workload=("dead-letter",),
        wanted=("kill", "partition"),
    ),
)

#: Notable lines of ``broker_impl``'s log: promotions, group-commit batches, flush timeouts,
#: GM view changes while a mirror syncs, what recovery did with transactions.
LOG_EVENTS: tuple[LogEvent, ...] = (
    LogEvent(
        "promoted-in-sync",
        QUEUE + r": master (?P<old>\S+) (?P<how>died|stopped); promoting the mirror here \(in sync\)",
    ),
    LogEvent(
        "promoted-unsynced",
        QUEUE + r": master (?P<old>\S+) (?P<how>died|stopped); promoting the mirror here \(NOT in sync\)",
    ),
    LogEvent(
        "promotion-refused",
        QUEUE
        + r": master (?P<old>\S+) (?P<how>died|stopped) and (?:no live mirror is|the mirror here is not) in sync; not promoting",
    ),
    LogEvent("mirror-synced", QUEUE + r": mirror on (?P<node>\S+) is in sync"),
    LogEvent(
        "gm-view-during-sync", QUEUE + r": GM view v(?P<version>\d+) .* while mirror\(s\) .* not in sync"
    ),
    LogEvent("group-commit-batch", r"group commit: one fsync released (?P<waiters>\d+) waiter"),
    LogEvent("flush-timeout", r"flush timeout: (?P<waits>\d+) wait\(s\) for the commit log's fsync gave up"),
    LogEvent(
        "tx-recovery",
        r"store recovery: transactions in the scanned log: (?P<prepared>\d+) prepared record\(s\) not applied, (?P<committed>\d+) commit",
    ),
    LogEvent("store-recovery-cut", r"store recovery \(abnormal shutdown\): .* cuts: (?P<cuts>(?!none$).+)$"),
    LogEvent("peer-down", r"cluster: peer (?P<peer>\S+) is down"),
    LogEvent("slave-attached", r"attached to master (?P<master>\S+); the replica ended at (?P<end>\d+)"),
    # a node's partition-handling states: paused in a minority or for a partial partition, serving after a start that no peer
    # answered, and a queue copy dropped for another node's master (what only it held is gone)
    LogEvent("paused-minority", r"cluster: only \d+ of \d+ nodes visible(?: at start)?; pausing"),
    LogEvent(
        "partial-partition",
        r"cluster: partial partition detected: (?P<down>\S+) seen down here, (?P<proxy>\S+) still sees it",
    ),
    LogEvent("served-alone", r"cluster: serving clients \(no peer answered\)"),
    LogEvent(
        "copy-dropped", QUEUE + r" in vhost '[^']*': master is now (?P<master>\S+); dropping the copy here"
    ),
)


class ReferenceBroker(BrokerPlugin):
    name = "reference"
    version = __version__
    protocol = "amqp091"
    capabilities = frozenset(
        {
            "kill",
            "pause",
            "stop",
            "power-loss",
            "partition",
            "mirroring",
            "clock",
            "membership",
            "unsynced-messages",
        }
    )
    client_port = 5672
    peer_ports = (25672,)
    data_dir = "/var/lib/brokerchaos/data"
    # The store fsyncs the directory of every file it creates, renames or removes
    # (broker_impl/store/durable.py), so its power-loss runs hold it to POSIX's letter.
    filesystem = "strict"
    log_paths = ("/var/log/brokerchaos",)
    features = FEATURES
    log_events = LOG_EVENTS
    #: The node's own log file (``log_file`` below), collected under ``logs/``.
    event_logs = ("logs/**/*.log",)
    ready_timeout = 60.0
    settings_schema = {
        "flush": ("sync", ("sync", "async")),
        "flush_interval_ms": (500, int),
        "segment_bytes": (16 << 20, int),
        "flow": (True, bool),
        "heartbeat": (10, int),
        # clustering (broker_impl.cluster): failure detection, partition handling, the mirroring policy
        "tick": (1.0, None),  # seconds, checked in validate_settings (int or float)
        "missed_ticks": (3, int),
        "partition_handling": ("ignore", ("ignore", "pause_minority", "autoheal")),
        "ha_mode": (None, (None, "all", "exactly", "nodes")),
        "ha_params": (None, None),
        "ha_sync_mode": ("manual", ("manual", "automatic")),
        "ha_promote_on_failure": ("always", ("always", "when-synced")),
        "ha_promote_on_shutdown": ("when-synced", ("always", "when-synced")),
        "policy_pattern": ("^chaos", str),
        # master-slave replication (broker_impl.replication) instead of clustering: n1 is the
        # master (SYNC_MASTER or ASYNC_MASTER), every other node its slave
        "replication": (None, (None, "sync", "async")),
    }

    #: Ranges ``broker_impl`` enforces at start-up, checked here before any container starts.
    RANGES = {
        "flush_interval_ms": (1, None),
        "segment_bytes": (4096, None),
        "heartbeat": (0, 65535),
        "missed_ticks": (1, None),
    }

    def log_time(self, line: str) -> datetime | None:
        """``logging``'s asctime (``2026-01-02 10:00:00,123``), written in the container's zone, UTC."""
        try:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
        except ValueError:
            return None

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        for key, (lo, hi) in self.RANGES.items():
            value = out[key]
            if value < lo or (hi is not None and value > hi):
                allowed = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
                raise ScenarioError(f"broker.settings.{key}: {value} is out of range; allowed {allowed}")
        tick = out["tick"]
        if isinstance(tick, bool) or not isinstance(tick, int | float) or tick <= 0:
            raise ScenarioError(f"broker.settings.tick: expected seconds > 0, got {tick!r}")
        mode, params = out["ha_mode"], out["ha_params"]
        wanted = {"exactly": "a node count >= 1", "nodes": "a list of node names such as ['n1', 'n2']"}
        ok = {
            "exactly": isinstance(params, int) and not isinstance(params, bool) and params >= 1,
            "nodes": isinstance(params, list) and bool(params) and all(isinstance(n, str) for n in params),
        }
        if mode in ok and not ok[mode]:
            raise ScenarioError(
                f"broker.settings.ha_params: ha_mode {mode!r} needs {wanted[mode]}, got {params!r}"
            )
        if mode in (None, "all") and params is not None:
            raise ScenarioError(f"broker.settings.ha_params: not used with ha_mode {mode!r}; remove it")
        if out["replication"] is not None and mode is not None:
            raise ScenarioError(
                "broker.settings.replication: master-slave replication and ha_mode mirroring are "
                "two replication modes; choose one"
            )
        return out

    @staticmethod
    def policy(settings: Mapping[str, Any]) -> dict[str, Any] | None:
        """The ``set_policy`` definition the settings ask for (None: queues are not mirrored)."""
        if not settings.get("ha_mode"):
            return None
        keys = ("ha_mode", "ha_params", "ha_sync_mode", "ha_promote_on_failure", "ha_promote_on_shutdown")
        return {k.replace("_", "-"): settings[k] for k in keys if settings.get(k) is not None}

    def image(self) -> ImageRecipe:
        """The checkout's ``broker_impl/``, or the source tree ``$BROKERCHAOS_REFERENCE_SOURCE`` names.

        Another tree's image gets a name of its own: ``brokerchaos/reference:latest``
        (what docker-compose.yml and the benchmarks start) stays the checkout's broker.
        """
        source, name = REPO / "broker_impl", "brokerchaos/reference"
        override = os.environ.get(SOURCE_ENV)
        if override:
            source, name = Path(override).resolve(), "brokerchaos/reference-custom"
            if not (source / "__main__.py").is_file():
                raise BrokerChaosError(
                    f"{SOURCE_ENV}={override}: not a broker_impl source tree (no __main__.py "
                    "there); point it at a copy of broker_impl/ or unset it"
                )
        return ImageRecipe(
            name=name,
            python_packages=("pamqp", "uvloop"),
            copy={str(source): "/opt/brokerchaos/broker_impl"},
        )

    def config_toml(self, node: NodeInfo) -> str:
        s = node.settings
        lines = [
            'vhosts = ["/"]',
            "",
            "[node]",
            f"name = {_toml_value('rabbit@' + node.name)}",
            'host = "0.0.0.0"',
            f"port = {self.client_port}",
            f"data_dir = {_toml_value(self.data_dir)}",
            f"log_file = {_toml_value(f'/var/log/brokerchaos/{node.name}.log')}",
            f"control_port = {CONTROL_PORT}",
            "",
            "[limits]",
            f"heartbeat = {int(s.get('heartbeat', 10))}",
            "",
            "[flow]",
            f"enabled = {_toml_value(bool(s.get('flow', True)))}",
            "",
            "[store]",
            f"flush = {_toml_value(s.get('flush', 'sync'))}",
            f"flush_interval_ms = {int(s.get('flush_interval_ms', 500))}",
            f"segment_bytes = {int(s.get('segment_bytes', 16 << 20))}",
            "",
        ]
        if s.get("replication"):
            return "\n".join(lines + self.replication_toml(node)) + "\n"
        lines += [
            "[cluster]",
            f"node = {_toml_value(node.name)}",
            f"peers = [{', '.join(_toml_value(p) for p in node.peers)}]",
            f"port = {self.peer_ports[0]}",
        ]
        # only what differs from broker_impl's own defaults (tick 1.0 s, 3 missed ticks, ignore)
        if s.get("tick", 1.0) != 1.0:
            lines.append(f"tick = {float(s['tick'])!r}")
        if s.get("missed_ticks", 3) != 3:
            lines.append(f"down_after = {int(s['missed_ticks'])}")
        if s.get("partition_handling", "ignore") != "ignore":
            lines.append(f"partition_handling = {_toml_value(s['partition_handling'])}")
        return "\n".join(lines) + "\n"

    MASTER = "n1"

    def replication_toml(self, node: NodeInfo) -> list[str]:
        """n1 is the master, every other node its slave, pulling over the inter-node port (so
        through the sidecar's proxy: a partition between them is real)."""
        lines = ["[replication]", f"node = {_toml_value(node.name)}", f"port = {self.peer_ports[0]}"]
        if node.name == self.MASTER:
            return lines + [f"role = {_toml_value(node.settings['replication'] + '_master')}"]
        return lines + ['role = "slave"', f"master = {_toml_value(self.MASTER)}"]

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        return NodeSpec(
            command=["python3", "-m", "broker_impl", "--config", CONFIG_PATH],
            files={CONFIG_PATH: self.config_toml(node)},
        )

    def is_ready(self, node: NodeHandle) -> bool:
        """The node answers and its app runs (``stop_app`` leaves the node answering with the app stopped)."""
        rc, out = node.exec(self.ctl("--json", "status"), timeout=10)
        try:
            return rc == 0 and bool(json.loads(out).get("app_running"))
        except (json.JSONDecodeError, AttributeError):
            return False

    def queue_depth(self, node: NodeHandle, queue: str, timeout: float) -> tuple[int, int] | None:
        """From ``ctl list_queues`` on the node. A node that names no unacked count (a node
        that does not hold the queue's master may not know it) answers None: the drain then
        counts the ready messages with a passive declare through that node."""
        out = run_or_fail(node, self.ctl("--json", "list_queues", "-p", self.vhost), timeout=timeout)
        try:
            rows = json.loads(out)
        except json.JSONDecodeError:
            raise ClusterError(f"{node.name}: list_queues printed no JSON: {out.strip()[-200:]}") from None
        for row in rows:
            if row.get("name") == queue:
                ready, unacked = row.get("messages_ready"), row.get("messages_unacknowledged")
                if not isinstance(ready, int) or not isinstance(unacked, int):
                    return None
                return ready, unacked
        raise ClusterError(f"{node.name}: queue {queue!r} is not in list_queues")

    def queue_holders(self, node: NodeHandle, queue: str) -> list[dict[str, Any]] | None:
        """The queue's consumer count and the node's client connections with their open channels,
        from ``ctl list_queues`` and ``ctl list_connections``: deliveries unacked with no consumer
        and no connection left are held by nobody."""
        rows = self._ctl_json(node, "list_queues", "-p", self.vhost)
        consumers = next((r.get("consumers") for r in rows if r.get("name") == queue), None)
        out: list[dict[str, Any]] = [{"queue": queue, "consumers": consumers}]
        for c in self._ctl_json(node, "list_connections"):
            out.append({"connection": c.get("peer"), "user": c.get("user"), "channels": c.get("channels")})
        return out

    def _ctl_json(self, node: NodeHandle, *args: str) -> list[dict[str, Any]]:
        out = run_or_fail(node, self.ctl("--json", *args), timeout=15)
        try:
            rows = json.loads(out)
        except json.JSONDecodeError:
            raise ClusterError(f"{node.name}: {args[0]} printed no JSON: {out.strip()[-200:]}") from None
        return rows if isinstance(rows, list) else []

    @staticmethod
    def ctl(*args: str) -> list[str]:
        return ["python3", "-m", "broker_impl.ctl", "--config", CONFIG_PATH, *args]

    def form_cluster(self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any]) -> None:
        """Nodes find each other from ``[cluster]``; wait until the first sees them all, then set the policy.
        With master-slave replication: wait until every slave is attached to the master."""
        first = nodes[0]
        if settings.get("replication"):
            master = next(n for n in nodes if n.name == self.MASTER)
            wait_until_running(
                master,
                self.ctl("--json", "replication_status"),
                {n.name for n in nodes if n is not master},
                lambda out: {str(s["node"]) for s in json.loads(out).get("slaves", [])},
            )
            return
        # members are the [cluster] node names (n1); accept the [node] form (rabbit@n1) too
        wait_until_running(
            first,
            self.ctl("--json", "cluster_status"),
            {n.name for n in nodes},
            lambda out: {str(m).rpartition("@")[2] for m in json.loads(out).get("running", [])},
        )
        policy = self.policy(settings)
        if policy is not None:
            run_or_fail(
                first,
                self.ctl(
                    "set_policy",
                    "brokerchaos-ha",
                    settings.get("policy_pattern", "^chaos"),
                    json.dumps(policy),
                ),
            )

    def confirms_after_sync(self, settings: Mapping[str, Any]) -> bool | None:
        """``flush: sync`` is a group commit: the store confirms a publish only once the commit
        log was fsynced past its record (``broker_impl/store/store.py``); ``async`` confirms
        after the write."""
        return settings.get("flush", self.settings_schema["flush"][0]) == "sync"

    # -- membership ------------------------------------------------------------------------
    def unsynced_messages(
        self, writes: Sequence[UnsyncedWrite], settings: Mapping[str, Any], nodes: int
    ) -> list[str]:
        """The commit log's segments hold each message's record, body verbatim
        (``broker_impl/store/record.py``); consume queues and progress files hold no message."""
        return sorted(
            {i for w in writes if "/commitlog/" in "/" + w["path"].lstrip("/") for i in body_ids(w["data"])}
        )

    def members(self, node: NodeHandle) -> set[str]:
        """The members ``node`` knows, running or not (``cluster_status``'s ``members``)."""
        return self._cluster_status(node, "members")

    def _running(self, node: NodeHandle) -> set[str]:
        return self._cluster_status(node, "running")

    def _cluster_status(self, node: NodeHandle, key: str) -> set[str]:
        out = run_or_fail(node, self.ctl("--json", "cluster_status"), timeout=30)
        return {str(m).rpartition("@")[2] for m in json.loads(out).get(key, [])}

    def remove_node(
        self, node: NodeHandle, remaining: Sequence[NodeHandle], settings: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``stop_app`` on the node; once a remaining member sees it down, ``forget_cluster_node`` there."""
        member = remaining[0]
        run_or_fail(node, self.ctl("stop_app"), timeout=150)
        self._wait_members(member, lambda running: node.name not in running, f"{node.name} seen down")
        forget = self.ctl("forget_cluster_node", node.name)
        run_or_fail(member, forget, timeout=30)
        return {"on_node": ["ctl stop_app"], "on_" + member.name: [f"ctl forget_cluster_node {node.name}"]}

    def add_node(
        self, node: NodeHandle, members: Sequence[NodeHandle], settings: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A forgotten node drops its data and membership (``reset``) before it asks a member to admit it."""
        cmds = [("stop_app",), ("reset",), ("join_cluster", members[0].name), ("start_app",)]
        for cmd in cmds:
            run_or_fail(node, self.ctl(*cmd), timeout=150)
        want = {m.name for m in members} | {node.name}
        self._wait_members(members[0], lambda running: want <= running, f"{sorted(want)} running")
        return {"on_node": [" ".join(("ctl", *c)) for c in cmds]}

    def _wait_members(self, node: NodeHandle, done: Any, what: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            seen = self._running(node)
            if done(seen):
                return
            time.sleep(0.5)
        raise ClusterError(
            f"{node.name}: waited {timeout:.0f}s for {what}; running members are {sorted(seen)}"
        )


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(ReferenceBroker())
