"""RabbitMQ from Debian's ``rabbitmq-server`` package, as a brokerchaos plugin.

Versions (``broker.version``): ``3.10`` (bookworm's 3.10.8, the default: classic mirrored and
quorum queues on Mnesia), ``4.0`` (trixie's 4.0.5: quorum queues on Mnesia, still the default
metadata store of a new 4.0 cluster; ``metadata_store: khepri`` enables the ``khepri_db`` feature
flag once the cluster has formed, RabbitMQ 4.0's documented opt-in) and ``4.3`` (sid's 4.3.6: quorum queues on Khepri,
the default metadata store of a new 4.2+ cluster; ``RABBITMQ_FEATURE_FLAGS=-khepri_db`` did not
keep a new 4.3.6 node on Mnesia here, so Mnesia on 4.3 is refused rather than claimed). Classic
mirrored queues were removed in 4.0: a mirroring policy on 4.x is refused when the scenario
is read, never silently ignored by the broker.

Proves the harness on a broker nobody here wrote. Inter-node traffic (epmd on
4369 and Erlang distribution on 25672) is routed through the node's Toxiproxy
sidecar with no help from RabbitMQ: peers are reached by host name, which the
sidecar's hosts file maps to its own loopback addresses. For that, epmd and
each node's distribution listener uses its own port (25670 + node index):
RabbitMQ's start-up check binds that port on the wildcard, so no port number
may be used twice inside one network namespace. epmd binds only the node's own
address (``ERL_EPMD_ADDRESS``), leaving the peers' loopback addresses free for
the proxies.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from harness import (
    EXEC_TIMED_OUT,
    BrokerPlugin,
    BrokerVersion,
    ClusterError,
    Feature,
    ImageRecipe,
    LogEvent,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    NotYet,
    ScenarioError,
    consumers_giving_back,
    hookimpl,
    membership_change,
    poll,
    run_or_fail,
    wait_until_running,
)
from harness.spec.errors import one_line
from plugins.rabbitmq.stream_client import brokerchaos_register_clients

__all__ = ["RabbitMQ", "brokerchaos_register_brokers", "brokerchaos_register_clients"]

__version__ = "0.1.0"

START_SCRIPT = "/usr/local/bin/brokerchaos-rabbitmq"
CONF = "/etc/rabbitmq/rabbitmq.conf"

# Runs as the node's broker command (under faults.nodeinit). Computes the node's
# own address, pins epmd and distribution to it, writes the cookie for the server
# and for root's CLI tools, then becomes rabbitmq-server.
START = r"""#!/bin/sh
set -eu
ip=$(getent hosts "$(hostname)" | awk '{print $1; exit}')
printf %s "$BROKERCHAOS_COOKIE" > /var/lib/rabbitmq/.erlang.cookie
chown rabbitmq:rabbitmq /var/lib/rabbitmq/.erlang.cookie
chmod 400 /var/lib/rabbitmq/.erlang.cookie
printf %s "$BROKERCHAOS_COOKIE" > /root/.erlang.cookie
chmod 400 /root/.erlang.cookie
chown -R rabbitmq:rabbitmq /var/lib/rabbitmq/mnesia /var/log/rabbitmq 2>/dev/null || true
export ERL_EPMD_ADDRESS="$ip${BROKERCHAOS_EPMD_ALSO:+,$BROKERCHAOS_EPMD_ALSO}"
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel net_ticktime $BROKERCHAOS_NET_TICKTIME"
# The server's own resolver file, if the node has one (the CLI tools resolve as before); epmd then
# also listens where that file puts the node's own name (BROKERCHAOS_EPMD_ALSO).
if [ -n "${BROKERCHAOS_INETRC:-}" ]; then export ERL_INETRC="$BROKERCHAOS_INETRC"; fi
exec /usr/sbin/rabbitmq-server
"""


START_APP = ["rabbitmqctl", "start_app"]
#: How long a joining node's ``start_app`` is waited for before its boot is watched instead.
START_APP_WAIT_S = 60.0
#: ``await_startup``'s own limit (seconds) follows: the time left of the join.
AWAIT_STARTUP = ["rabbitmqctl", "-q", "await_startup", "--timeout"]
#: What the CLI's own Erlang VM may take to start on a loaded host, beyond its command's wait.
CLI_START_S = 60.0
#: How long ``is_ready``'s ``await_startup`` waits for a node whose AMQP listener is open to finish booting.
READY_AWAIT_S = 60.0
#: The node's AMQP listener (``listeners.tcp.default``).
AMQP_PORT = 5672
#: How long one ``is_ready`` call looks for the listener inside the node, and how often: one
#: ``docker exec`` per wait rather than one per look (a 3-node start made 110 of them at 0.2 s).
LISTEN_WAIT_S = 10
LISTEN_LOOK_S = 0.2
#: The kernel's TCP socket tables of the node's network namespace.
SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def listening(port: int, wait_s: float = LISTEN_WAIT_S, tables: Sequence[str] = SOCKET_TABLES) -> list[str]:
    """A command that exits 0 once a TCP socket listens on ``port`` in the node's network namespace
    (looked for every LISTEN_LOOK_S for ``wait_s`` at most, then exit 1), read from the kernel's
    tables: no connection is made (RabbitMQ logs one that closes before its AMQP handshake), and
    no Erlang VM is booted. A killed broker's listener is gone with it; the sidecar's proxies
    listen on other ports (the client proxy on 40000 + port % 10000)."""
    look = f"grep -qsE '^ *[0-9]+: [0-9A-F]+:{port:04X} [0-9A-F]+:0000 0A ' {' '.join(tables)}"
    looks = max(1, round(wait_s / LISTEN_LOOK_S))
    return [
        "sh",
        "-c",
        f"i=1; until {look}; do [ $i -ge {looks} ] && exit 1; i=$((i+1)); sleep {LISTEN_LOOK_S}; done",
    ]


MIRRORED = {"queue_type": ("classic",), "ha_mode": ("all", "exactly", "nodes")}
MIRRORED_QUEUE = r"Mirrored queue '(?P<queue>[^']+)' in vhost '(?P<vhost>[^']*)': "
QUORUM_QUEUE = r"queue '(?P<queue>[^']+)' in vhost '(?P<vhost>[^']*)': "

#: The rows of RabbitMQ's coverage map.
FEATURES: tuple[Feature, ...] = (
    Feature(
        "classic queue, single copy",
        "a durable classic queue on its home node, not mirrored",
        {"queue_type": ("classic",), "ha_mode": (None,)},
        wanted=("kill", "power-loss", "partition"),
    ),
    Feature(
        "classic mirrored queue",
        "a classic queue mirrored by policy (ha-mode all, exactly or nodes)",
        MIRRORED,
        nodes=(2, None),
        wanted=("kill", "pause", "partition", "power-loss", "member-remove", "clock-skew"),
    ),
    Feature(
        "promotion when-synced",
        "ha-promote-on-failure: when-synced",
        {**MIRRORED, "ha_promote_on_failure": ("when-synced",)},
        nodes=(2, None),
        wanted=("kill", "partition"),
    ),
    Feature(
        "quorum queue",
        "a Raft-replicated quorum queue",
        {"queue_type": ("quorum",)},
        nodes=(3, None),
        wanted=("kill", "partition", "power-loss", "power-loss-coordinated"),
    ),
    *(
        Feature(
            f"partition handling: {mode}",
            f"cluster_partition_handling = {mode}",
            {"partition_handling": (mode,)},
            nodes=(3, None),
            wanted=("partition",),
        )
        for mode in ("pause_minority", "autoheal")  # the modes that act on a partition (not ignore)
    ),
    Feature(
        "transactions",
        "AMQP tx",
        workload=("transactions",),
        wanted=("kill", "partition"),
    ),
    consumers_giving_back(
        "basic.nack/reject(requeue), basic.recover, channels closed and connections cut with deliveries unacked",
        wanted=("kill", "partition"),
    ),
    membership_change("a node leaves (forget_cluster_node) and joins again empty"),
    # RabbitMQ has both (``workload.ttl_ms``/``expiration_ms``, ``workload.dead_letter``); no shipped
    # scenario asks for them under faults yet, so they name no wanted cell.
    Feature(
        "message TTL",
        "x-message-ttl (workload.ttl_ms) / per-message expiration (workload.expiration_ms)",
        workload=("ttl",),
    ),
    Feature(
        "dead-lettering",
        "x-dead-letter-exchange into a dead-letter queue the workload consumes (workload.dead_letter)",
        workload=("dead-letter",),
    ),
)

#: RabbitMQ's log lines for mirror promotion, autoheal, a master stopping its mirrors (3.10) and a
#: quorum queue's leader changes (3.10 and 4.x).
#: 3.10 says "Promoting mirror ... to leader"; releases before the rename said "slave ... master".
LOG_EVENTS: tuple[LogEvent, ...] = (
    LogEvent("promoted", MIRRORED_QUEUE + r"Promoting (?:slave|mirror) (?P<pid>\S+) to (?:master|leader)"),
    LogEvent("autoheal-restart", r"Autoheal: we were selected to restart; winner is (?P<winner>\S+)"),
    LogEvent(
        "stop-no-synced-mirror",
        MIRRORED_QUEUE + r"Stopping all nodes on master shutdown since no synchronised mirror",
    ),
    # A quorum queue's Raft member (3.10 and 4.x): elected, or stepping down for a newer term.
    LogEvent("quorum-leader-elected", QUORUM_QUEUE + r"candidate -> leader in term: (?P<term>\d+)"),
    LogEvent("quorum-leader-abdicated", QUORUM_QUEUE + r"leader -> follower in term: (?P<term>\d+)"),
)


#: The RabbitMQ releases Debian serves; 3.10 first (the default: nothing new to build).
V3_10 = BrokerVersion(
    "3.10", "bookworm", ("rabbitmq-server",), "3.10.8", note="classic mirrored queues, Mnesia"
)
#: Debian 13's: the first release without classic mirrored queues; a new cluster still runs on
#: Mnesia (Khepri is opt-in through the ``khepri_db`` feature flag until 4.2).
V4_0 = BrokerVersion(
    "4.0",
    "trixie",
    ("rabbitmq-server",),
    "4.0.5",
    settings={"metadata_store": "mnesia"},
    note="quorum queues; no classic mirroring; Mnesia by default, Khepri as an opt-in",
)
#: The versions whose new cluster starts on Mnesia and may be moved to Khepri by enabling the
#: ``khepri_db`` feature flag. 4.0's "How to Enable Khepri" says Khepri is fully supported there;
#: its CLI still calls the flag experimental and wants ``--experimental`` to enable it.
KHEPRI_OPT_IN = ("4.0",)
ENABLE_KHEPRI = ["rabbitmqctl", "enable_feature_flag", "--experimental", "khepri_db"]
KHEPRI_ENABLED = ["rabbitmqctl", "-q", "eval", "rabbit_khepri:is_enabled()."]
#: The running node's version and whether it runs on Khepri (``unknown`` where it cannot say: 3.10
#: has no ``rabbit_khepri``), on one line ``broker_version`` reads.
RUNNING = (
    "{ok, V} = application:get_key(rabbit, vsn), "
    "K = try rabbit_khepri:is_enabled() catch _:_ -> unknown end, "
    'io:format("brokerchaos-running ~s ~p~n", [V, K]).'
)
V4_3 = BrokerVersion(
    "4.3",
    "sid",
    ("rabbitmq-server",),
    "4.3.6",
    settings={"metadata_store": "khepri"},
    note="quorum queues; no classic mirroring; Khepri by default",
)
VERSIONS = (V3_10, V4_0, V4_3)


class RabbitMQ(BrokerPlugin):
    name = "rabbitmq"
    version = __version__
    versions: ClassVar[tuple[BrokerVersion, ...]] = VERSIONS
    protocol = "amqp091"
    capabilities = frozenset(
        {"kill", "pause", "stop", "power-loss", "partition", "mirroring", "clock", "membership"}
    )
    client_port = 5672
    peer_ports = (4369, 25671, 25672, 25673)  # epmd, and each node's distribution port

    def peer_ports_for(self, index: int) -> tuple[int, ...]:
        return (4369, 25670 + index)

    data_dir = "/var/lib/rabbitmq/mnesia"
    #: A quorum queue is a Ra server on each node: the node's quorum Ra system writes every
    #: queue's entries to one write-ahead log (``quorum/<node>/*.wal``), and the segment writer
    #: moves them to each queue's own segment files (``quorum/<node>/<queue uid>/*.segment``)
    #: when the log rolls over and when the node recovers its log at start. A classic queue (3.10)
    #: keeps its index in a journal and segment files (``queues/<queue>/journal.jif``, ``*.idx``),
    #: with messages under 4 KiB embedded in it, and larger ones in the vhost's persistent message
    #: store (``msg_store_persistent/*.rdq``). Not the vhost's ``.config``, ``.vhost`` or
    #: ``recovery.dets``, nor the Ra systems' metadata tables: they hold no message.
    data_files: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "quorum-wal": ("*/quorum/*/*.wal",),
        "quorum-segment": ("*/quorum/*/*/*.segment",),
        "classic-index": (
            "*/msg_stores/vhosts/*/queues/*/journal.jif",
            "*/msg_stores/vhosts/*/queues/*/*.idx",
        ),
        "classic-msg-store": ("*/msg_stores/vhosts/*/msg_store_persistent/*.rdq",),
    }
    log_paths = ("/var/log/rabbitmq",)

    def message_file_roles(self, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """A quorum queue's messages are in the quorum log, a classic queue's in its index and
        message store; the other type's files hold none (a node with no quorum queue writes its
        quorum log's 5-byte header all the same)."""
        if settings.get("queue_type") == "quorum":
            return ("quorum-segment", "quorum-wal")
        return ("classic-index", "classic-msg-store")

    features = FEATURES
    log_events = LOG_EVENTS
    #: The node's log file (info and above; the console gets warnings only), under ``logs/``.
    event_logs = ("logs/**/*.log",)
    #: A 4.3 node on a loaded 2-core host (load average 30 to 45) took 100 s to answer its first
    #: check; 120 s ended runs before their first fault. Also the budget of a node's join, from
    #: its ``stop_app`` to its boot's end (``_join``), and of each side of a removal.
    ready_timeout = 300.0

    def log_time(self, line: str) -> datetime | None:
        """3.10's ``2026-01-02 10:00:00.123456+00:00 [info] <0.1.0> ...``."""
        try:
            return datetime.fromisoformat(line[:32])
        except ValueError:
            return None

    settings_schema = {
        "queue_type": ("classic", ("classic", "quorum")),
        "ha_mode": (None, (None, "all", "exactly", "nodes")),
        "ha_params": (None, None),
        "ha_sync_mode": ("manual", ("manual", "automatic")),
        "ha_promote_on_failure": ("always", ("always", "when-synced")),
        "ha_promote_on_shutdown": ("when-synced", ("always", "when-synced")),
        "partition_handling": ("pause_minority", ("ignore", "pause_minority", "autoheal")),
        "net_ticktime": (10, int),
        "policy_pattern": ("^chaos", str),
        # The metadata store: Mnesia on 3.10, Khepri (Raft; 4.2+'s default) on 4.3, either on 4.0.
        "metadata_store": ("mnesia", ("mnesia", "khepri")),
    }

    def image(self) -> ImageRecipe:
        return self.release_recipe("brokerchaos/rabbitmq")

    @property
    def mirroring(self) -> bool:
        """Whether this version has classic mirrored queues (removed in 4.0)."""
        return self.release is V3_10

    def broker_version(self, node: NodeHandle) -> str | None:
        """What the running node says of itself (its ``rabbit`` application's version; on 4.x also
        its metadata store), with the Debian package: one ``eval``, one Erlang VM (it was
        ``rabbitmqctl version`` and, on 4.x, a second ``eval``)."""
        package = super().broker_version(node)
        rc, out = node.exec(["rabbitmqctl", "-q", "eval", RUNNING], timeout=60)
        said = re.search(r"^brokerchaos-running (\S+) (\w+)$", out, re.M) if rc == 0 else None
        if said is None or package is None:
            return package
        store = {"true": " on Khepri", "false": " on Mnesia"}.get(said[2], "") if not self.mirroring else ""
        return f"rabbitmq {said[1]}{store} (Debian {package})"

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        s = node.settings
        conf = "\n".join(
            [
                f"listeners.tcp.default = {AMQP_PORT}",
                "loopback_users = none",
                f"cluster_partition_handling = {s['partition_handling']}",
                "log.file.level = info",
                "log.console = true",
                "log.console.level = warning",
                "disk_free_limit.absolute = 50MB",
                "",
            ]
        )
        return NodeSpec(
            command=["/bin/sh", START_SCRIPT],
            env={
                "RABBITMQ_NODENAME": f"rabbit@{node.name}",
                "BROKERCHAOS_COOKIE": f"bc{node.cluster}".upper(),
                "BROKERCHAOS_NET_TICKTIME": str(s["net_ticktime"]),
                "RABBITMQ_DIST_PORT": str(25670 + node.index),
            },
            files={START_SCRIPT: START, CONF: conf},
        )

    def is_ready(self, node: NodeHandle) -> bool:
        """The node's AMQP listener in the kernel's socket tables first (``listening``), then ONE
        ``await_startup``: the CLI boots an Erlang VM of its own (over 20 s at load 45 on 2 cores),
        and polled every 0.2 s on every node it took the cores from the brokers it waited for.
        The listener opens near the end of the boot, so the CLI is asked once, to wait out the rest."""
        rc, _ = node.exec(listening(AMQP_PORT), timeout=LISTEN_WAIT_S + 30)
        if rc != 0:
            return False
        rc, _ = node.exec([*AWAIT_STARTUP, str(int(READY_AWAIT_S))], timeout=READY_AWAIT_S + CLI_START_S)
        return rc == 0

    def form_cluster(self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any]) -> None:
        first = nodes[0]
        for node in nodes[1:]:
            self._join(node, first)
        self._wait_running(first, nodes)
        self._opt_in_to_khepri(nodes, settings)
        policy = self.policy(settings)
        if policy is not None:
            run_or_fail(
                first,
                [
                    "rabbitmqctl",
                    "set_policy",
                    "brokerchaos-ha",
                    settings["policy_pattern"],
                    json.dumps(policy),
                    "--apply-to",
                    "queues",
                ],
            )

    def _opt_in_to_khepri(self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any]) -> None:
        """Khepri where the version starts on Mnesia: the feature flag enabled on one member moves
        the whole cluster's metadata (RabbitMQ 4.0's "How to Enable Khepri"); then every node must
        say it runs on Khepri, or the run would claim a store it never had."""
        rel = self.release
        if settings.get("metadata_store") != "khepri" or rel is None or rel.name not in KHEPRI_OPT_IN:
            return
        run_or_fail(nodes[0], ENABLE_KHEPRI, timeout=self.ready_timeout)
        for node in nodes:
            out = run_or_fail(node, KHEPRI_ENABLED, timeout=60)
            if out.strip() != "true":
                raise ClusterError(
                    f"{node.name}: not on Khepri after enabling khepri_db: {out.strip()[-200:]}"
                )

    def _join(self, node: NodeHandle, member: NodeHandle, *, reset: bool = False) -> list[str]:
        """Leave, (reset,) join and boot again, all within one ``ready_timeout`` from the first
        command (``_run_within``, then ``_boot``)."""
        deadline = time.monotonic() + self.ready_timeout
        cmds = [
            ["rabbitmqctl", "stop_app"],
            *([["rabbitmqctl", "reset"]] if reset else []),
            ["rabbitmqctl", "join_cluster", f"rabbit@{member.name}"],
        ]
        self._run_within(node, cmds, deadline)
        self._boot(node, deadline)
        return [" ".join(c) for c in [*cmds, START_APP]]

    def _run_within(
        self, node: NodeHandle, cmds: Sequence[Sequence[str]], deadline: float | None = None
    ) -> None:
        """Run ``cmds`` in turn on ``node`` by ``deadline`` (default: ``ready_timeout`` from now):
        each may take what the ones before it left."""
        deadline = deadline or time.monotonic() + self.ready_timeout
        for cmd in cmds:
            run_or_fail(node, cmd, timeout=self._left(node, cmd, deadline))

    def _left(self, node: NodeHandle, cmd: Sequence[str], deadline: float) -> float:
        """The time left for ``cmd``; with none left it is not run, and the error says so."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClusterError(
                f"{node.name}: {' '.join(cmd)} not run: the commands before it took all of "
                f"ready_timeout ({self.ready_timeout:.0f} s)"
            )
        return left

    def _boot(self, node: NodeHandle, deadline: float) -> None:
        """``start_app``, then the node's own boot state as the condition, until ``deadline``.
        The command is waited for START_APP_WAIT_S at most: its CLI session ending does not stop
        the boot (at ``22f7fc6`` n4 logged "Server startup complete" after a 120 s limit had killed
        its ``start_app``), so a ``start_app`` that times out is followed by ``await_startup``
        until the node says it booted. A node that never does, or a ``start_app`` that fails
        outright, fails the join, named."""
        rc, out = node.exec(START_APP, timeout=min(START_APP_WAIT_S, self._left(node, START_APP, deadline)))
        if rc == 0:
            return
        if rc != EXEC_TIMED_OUT:
            raise ClusterError(f"{node.name}: {' '.join(START_APP)} exited {rc}: {one_line(out, 300)}")

        def booted() -> None | NotYet:
            left = max(deadline - time.monotonic(), 1.0)
            # The CLI's own VM start counts against the command's limit, not against the node's.
            rc, out = node.exec([*AWAIT_STARTUP, str(int(left))], timeout=left + CLI_START_S)
            return None if rc == 0 else NotYet(one_line(out, 300) or f"await_startup exited {rc}")

        poll(
            booted,
            timeout=max(deadline - time.monotonic(), 0.0),
            failure=(
                f"{node.name}: did not finish booting within ready_timeout ({self.ready_timeout:.0f} s) "
                f"of its join (start_app gave up after {START_APP_WAIT_S:.0f} s, then await_startup)"
            ),
            interval=5.0,
        )

    def _wait_running(self, member: NodeHandle, nodes: Sequence[NodeHandle]) -> None:
        wait_until_running(
            member,
            ["rabbitmqctl", "-q", "cluster_status", "--formatter", "json"],
            {f"rabbit@{n.name}" for n in nodes},
            lambda out: set(json.loads(out).get("running_nodes", [])),
            timeout=self.ready_timeout,
            interval=1.0,
        )

    def members(self, node: NodeHandle) -> set[str]:
        """The cluster's disc and RAM nodes as ``node``'s schema lists them, running or not: a node
        paused by ``pause_minority`` or restarting is still one of them, a forgotten one is not."""
        out = run_or_fail(node, ["rabbitmqctl", "-q", "cluster_status", "--formatter", "json"], timeout=60)
        status = json.loads(out)
        return {n.split("@", 1)[1] for n in [*status.get("disk_nodes", []), *status.get("ram_nodes", [])]}

    def remove_node(
        self, node: NodeHandle, remaining: Sequence[NodeHandle], settings: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``stop_app`` on the node, then ``forget_cluster_node`` on a remaining member (RabbitMQ's
        documented way to remove a node that will not come back as it was)."""
        self._run_within(node, [["rabbitmqctl", "stop_app"]])
        forget = ["rabbitmqctl", "forget_cluster_node", f"rabbit@{node.name}"]
        self._run_within(remaining[0], [forget])
        return {"on_node": ["rabbitmqctl stop_app"], "on_" + remaining[0].name: [" ".join(forget)]}

    def add_node(
        self, node: NodeHandle, members: Sequence[NodeHandle], settings: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A forgotten node must ``reset`` (drop its old cluster state and data) before it may join."""
        cmds = self._join(node, members[0], reset=True)
        self._wait_running(members[0], [*members, node])
        return {"on_node": cmds}

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Also the combinations RabbitMQ would refuse only at ``set_policy``, after the cluster started."""
        out = super().validate_settings(settings)
        self._check_version(out)
        mode, params = out["ha_mode"], out["ha_params"]
        if mode == "exactly" and (isinstance(params, bool) or not isinstance(params, int) or params < 1):
            raise ScenarioError(
                f"broker.settings.ha_params: ha_mode 'exactly' needs a node count >= 1, got {params!r}"
            )
        if mode == "nodes" and (
            not isinstance(params, list) or not params or not all(isinstance(n, str) for n in params)
        ):
            raise ScenarioError(
                "broker.settings.ha_params: ha_mode 'nodes' needs a list of node names "
                f"such as ['rabbit@n1', 'rabbit@n2'], got {params!r}"
            )
        if mode in (None, "all") and params is not None:
            raise ScenarioError(f"broker.settings.ha_params: not used with ha_mode {mode!r}; remove it")
        if mode is not None and out["queue_type"] == "quorum":
            raise ScenarioError(
                "broker.settings.ha_mode: quorum queues are not mirrored by policy; "
                "remove ha_mode or use queue_type 'classic'"
            )
        if out["net_ticktime"] < 1:
            raise ScenarioError(
                f"broker.settings.net_ticktime: {out['net_ticktime']} is out of range; allowed >= 1"
            )
        return out

    def _check_version(self, out: Mapping[str, Any]) -> None:
        """What this version does not have: mirroring on 4.x; and its metadata stores."""
        rel = self.release
        assert rel is not None
        if not self.mirroring and out["ha_mode"] is not None:
            raise ScenarioError(
                f"broker.settings.ha_mode: RabbitMQ {rel.name} has no classic mirrored queues (removed in 4.0); "
                "use queue_type 'quorum', or broker.version \"3.10\""
            )
        self._check_store(out)

    def _check_store(self, out: Mapping[str, Any]) -> None:
        """Khepri is refused on 3.10 and Mnesia on 4.3; 4.0 runs either (Khepri as an opt-in)."""
        rel = self.release
        assert rel is not None
        if self.mirroring and out["metadata_store"] != "mnesia":
            raise ScenarioError(
                f"broker.settings.metadata_store: RabbitMQ {rel.name} has Mnesia only; "
                'remove it, or set broker.version: "4.3"'
            )
        store = rel.settings.get("metadata_store", "mnesia")
        if not self.mirroring and out["metadata_store"] != store and rel.name not in KHEPRI_OPT_IN:
            # 4.3: upstream's way, RABBITMQ_FEATURE_FLAGS=-khepri_db on a new node, still started
            # Debian's 4.3.6 on Khepri here (the node said so), so it is not offered.
            other = next(
                v.name for v in reversed(VERSIONS) if v.settings.get("metadata_store", "mnesia") != store
            )
            raise ScenarioError(
                f"broker.settings.metadata_store: RabbitMQ {rel.name} runs on {store.capitalize()} here; "
                f'for {out["metadata_store"].capitalize()} use broker.version "{other}"'
            )

    @staticmethod
    def policy(settings: Mapping[str, Any]) -> dict[str, Any] | None:
        if settings.get("queue_type") == "quorum" or not settings.get("ha_mode"):
            return None
        p: dict[str, Any] = {
            "ha-mode": settings["ha_mode"],
            "ha-sync-mode": settings["ha_sync_mode"],
            "ha-promote-on-failure": settings["ha_promote_on_failure"],
            "ha-promote-on-shutdown": settings["ha_promote_on_shutdown"],
        }
        if settings.get("ha_params") is not None:
            p["ha-params"] = settings["ha_params"]
        return p

    def queue_depth(self, node: NodeHandle, queue: str, timeout: float) -> tuple[int, int] | None:
        """The queue's counts as the node routes to it (its master or leader, wherever that is).

        Not ``rabbitmqctl list_queues``: without ``--local`` every node streams its rows
        straight to the CLI's own Erlang node, which the peers cannot reach through the
        proxies (seen hanging until the exec timed out); with ``--local`` a node lists only
        the queues it masters. ``eval`` runs on the node itself and asks the queue process,
        within ``timeout`` (the drain's share for the node): the CLI's own VM alone took over
        20 s on a loaded host, so a fixed 30 s failed node after node there.
        """
        expr = (
            f"case rabbit_amqqueue:lookup(rabbit_misc:r({erlang_binary(self.vhost)}, queue, {erlang_binary(queue)})) of "
            "{ok, Q} -> rabbit_amqqueue:info(Q, [messages_ready, messages_unacknowledged]); "
            "Other -> Other end."
        )
        out = run_or_fail(node, ["rabbitmqctl", "-q", "eval", expr], timeout=timeout)
        counts = dict(re.findall(r"\{(messages_ready|messages_unacknowledged),(\d+)\}", out))
        if len(counts) != 2:
            raise ClusterError(f"{node.name}: no depth for queue {queue!r}: {out.strip()[-200:]}")
        return int(counts["messages_ready"]), int(counts["messages_unacknowledged"])

    def queue_holders(self, node: NodeHandle, queue: str) -> list[dict[str, Any]] | None:
        """The queue's consumers and the node's channels in the plugin's vhost, with the columns
        of ``rabbitmqctl list_consumers`` and ``rabbitmqctl list_channels``.

        Not those commands themselves: like ``list_queues`` they gather their rows from every
        cluster member straight to the CLI's own Erlang node, which the peers cannot reach
        through the proxies (on a three-node cluster both hang until the exec times out).
        ``eval`` runs on the node and asks what they ask: the queue process for its consumers
        (``rabbit_amqqueue:consumers``, wherever the queue's master or leader runs) and the
        node for its own channels (``rabbit_channel:info_local``). A channel lives on the node
        its client connected to, so each node lists its own share.
        """
        out = run_or_fail(node, ["rabbitmqctl", "-q", "eval", holders_expr(self.vhost, queue)], timeout=30)
        return parse_holders(out, queue, self.vhost, node.name)

    def queue_arguments(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"x-queue-type": "quorum"} if settings.get("queue_type") == "quorum" else {}


def erlang_binary(text: str) -> str:
    """``text`` as an Erlang UTF-8 binary literal."""
    return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"/utf8>>'


CONSUMER_COLUMNS = ("channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active")
CHANNEL_COLUMNS = (
    "pid",
    "name",
    "user",
    "vhost",
    "consumer_count",
    "messages_unacknowledged",
    "prefetch_count",
)


def holders_expr(vhost: str, queue: str) -> str:
    """An ``eval`` expression printing one JSON line: ``consumers`` (the queue's, ``null`` when the
    node finds no such queue) and ``channels`` (the node's own), pids as ``<rabbit@n1.x.y.z>``."""
    consumer = ", ".join(f'<<"{k}">> => P(element({i}, C))' for i, k in enumerate(CONSUMER_COLUMNS, 1))
    return (
        "P = fun(X) when is_pid(X) -> list_to_binary(rabbit_misc:pid_to_string(X)); (X) -> X end, "
        f"Cs = case rabbit_amqqueue:lookup(rabbit_misc:r({erlang_binary(vhost)}, queue, {erlang_binary(queue)})) of "
        f"{{ok, Q}} -> [#{{{consumer}}} || C <- rabbit_amqqueue:consumers(Q)]; _ -> null end, "
        "Chs = [maps:from_list([{atom_to_binary(K, utf8), P(V)} || {K, V} <- I]) "
        f"|| I <- rabbit_channel:info_local([{', '.join(CHANNEL_COLUMNS)}])], "
        'io:format("~ts~n", [rabbit_json:encode(#{<<"consumers">> => Cs, <<"channels">> => Chs})]).'
    )


def parse_holders(out: str, queue: str, vhost: str, node: str) -> list[dict[str, Any]]:
    """``holders_expr``'s output as the drain records it: first the queue and its consumer count
    (None when the node finds no such queue), then each consumer (``list_consumers``' columns),
    then each of the node's channels in ``vhost`` (``list_channels``' columns)."""
    got = None
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                got = json.loads(line)
            except json.JSONDecodeError:
                continue
    if not isinstance(got, dict) or not isinstance(got.get("channels"), list):
        raise ClusterError(f"{node}: no consumers and channels for queue {queue!r}: {out.strip()[-200:]}")
    consumers = got.get("consumers")
    rows: list[dict[str, Any]] = [
        {"queue": queue, "consumers": len(consumers) if isinstance(consumers, list) else None}
    ]
    rows += [{"queue_name": queue, **c} for c in consumers or []]
    rows += [{"channel": ch.get("name"), **ch} for ch in got["channels"] if ch.get("vhost") == vhost]
    return rows


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    from plugins.rabbitmq.streams import RabbitMQStream  # it builds on RabbitMQ, defined above

    register.add_broker(RabbitMQ())
    register.add_broker(RabbitMQStream())
