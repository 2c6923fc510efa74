"""The RabbitMQ plugin's pure parts: settings, the mirroring policy, queue arguments, node specs,
the queue holders' ``eval`` expression and the parsing of its output; and its commands as a node
sees them (faked at ``NodeHandle.exec``): the time each may take and the errors they end in."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

import plugins.rabbitmq as rabbitmq
from harness.errors import ClusterError, ScenarioError
from harness.spec.broker import BASE_CAPABILITIES, EXEC_TIMED_OUT, NodeInfo
from harness.spec.client import reason
from plugins.rabbitmq import CONF, START_SCRIPT, RabbitMQ, erlang_binary, holders_expr, parse_holders

RMQ = RabbitMQ()


def settings(**kw: Any) -> dict[str, Any]:
    return RMQ.validate_settings(kw)


def test_defaults() -> None:
    s = settings()
    assert s == {
        "queue_type": "classic",
        "ha_mode": None,
        "ha_params": None,
        "ha_sync_mode": "manual",
        "ha_promote_on_failure": "always",
        "ha_promote_on_shutdown": "when-synced",
        "partition_handling": "pause_minority",
        "net_ticktime": 10,
        "policy_pattern": "^chaos",
        "metadata_store": "mnesia",
    }


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        (
            {"queue_type": "stream"},
            "broker.settings.queue_type: 'stream' is not allowed; use one of 'classic', 'quorum'",
        ),
        ({"ha_mode": "some"}, "broker.settings.ha_mode: 'some' is not allowed"),
        ({"ha_sync_mode": "auto"}, "broker.settings.ha_sync_mode: 'auto' is not allowed"),
        (
            {"partition_handling": "pause_if_all_down"},
            "broker.settings.partition_handling: 'pause_if_all_down'",
        ),
        ({"net_ticktime": "10"}, "broker.settings.net_ticktime: expected int, got '10'"),
        ({"net_ticktime": True}, "broker.settings.net_ticktime: expected int, got True"),
        ({"net_ticktime": 0}, "broker.settings.net_ticktime: 0 is out of range; allowed >= 1"),
        ({"policy_pattern": 3}, "broker.settings.policy_pattern: expected str"),
        ({"mirror": "all"}, "broker.settings.mirror: unknown setting for rabbitmq; allowed: ha_mode, "),
        (
            {"ha_mode": "exactly"},
            "broker.settings.ha_params: ha_mode 'exactly' needs a node count >= 1, got None",
        ),
        ({"ha_mode": "exactly", "ha_params": 0}, "ha_mode 'exactly' needs a node count >= 1, got 0"),
        ({"ha_mode": "exactly", "ha_params": "2"}, "ha_mode 'exactly' needs a node count"),
        ({"ha_mode": "nodes"}, "broker.settings.ha_params: ha_mode 'nodes' needs a list of node names"),
        ({"ha_mode": "nodes", "ha_params": [1]}, "ha_mode 'nodes' needs a list of node names"),
        (
            {"ha_mode": "all", "ha_params": 2},
            "broker.settings.ha_params: not used with ha_mode 'all'; remove it",
        ),
        ({"ha_params": 2}, "broker.settings.ha_params: not used with ha_mode None"),
        (
            {"queue_type": "quorum", "ha_mode": "all"},
            "broker.settings.ha_mode: quorum queues are not mirrored by policy",
        ),
    ],
)
def test_validate_settings_errors(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        RMQ.validate_settings(given)
    assert needle in str(e.value)


def test_policy_for_classic_mirrored_queues() -> None:
    assert RMQ.policy(settings(ha_mode="all", ha_sync_mode="automatic")) == {
        "ha-mode": "all",
        "ha-sync-mode": "automatic",
        "ha-promote-on-failure": "always",
        "ha-promote-on-shutdown": "when-synced",
    }
    exactly = RMQ.policy(settings(ha_mode="exactly", ha_params=2))
    assert exactly is not None and exactly["ha-params"] == 2
    nodes = RMQ.policy(settings(ha_mode="nodes", ha_params=["rabbit@n1", "rabbit@n2"]))
    assert nodes is not None and nodes["ha-params"] == ["rabbit@n1", "rabbit@n2"]
    p = RMQ.policy(
        settings(ha_mode="all", ha_promote_on_failure="when-synced", ha_promote_on_shutdown="always")
    )
    assert p is not None
    assert (p["ha-promote-on-failure"], p["ha-promote-on-shutdown"]) == ("when-synced", "always")


def test_no_policy_without_mirroring() -> None:
    assert RMQ.policy(settings()) is None
    assert RMQ.policy(settings(queue_type="quorum")) is None


def test_queue_arguments() -> None:
    assert RMQ.queue_arguments(settings()) == {}
    assert RMQ.queue_arguments(settings(ha_mode="all")) == {}
    assert RMQ.queue_arguments(settings(queue_type="quorum")) == {"x-queue-type": "quorum"}


def test_declaration() -> None:
    assert RMQ.capabilities <= set(BASE_CAPABILITIES) and "mirroring" in RMQ.capabilities
    assert RMQ.data_dir.startswith("/")
    assert [RMQ.peer_ports_for(i) for i in (1, 2, 3)] == [(4369, 25671), (4369, 25672), (4369, 25673)]
    assert RMQ.image().debian_packages == ("rabbitmq-server",)


def test_node_spec() -> None:
    info = NodeInfo(
        name="n2",
        index=2,
        peers=("n1", "n3"),
        cluster="bc-1a2b3c",
        settings=settings(partition_handling="autoheal", net_ticktime=7),
    )
    spec = RMQ.node_spec(info)
    assert list(spec.command) == ["/bin/sh", START_SCRIPT]
    assert spec.env["RABBITMQ_NODENAME"] == "rabbit@n2"
    assert spec.env["RABBITMQ_DIST_PORT"] == "25672"
    assert spec.env["BROKERCHAOS_NET_TICKTIME"] == "7"
    assert spec.env["BROKERCHAOS_COOKIE"] == "BCBC-1A2B3C"
    conf = dict(line.split(" = ", 1) for line in spec.files[CONF].splitlines() if line)
    assert conf["cluster_partition_handling"] == "autoheal"
    assert conf["listeners.tcp.default"] == str(RMQ.client_port)
    assert spec.files[START_SCRIPT].startswith("#!/bin/sh")


# ``rabbitmqctl -q eval holders_expr("/", "chaos-1")`` on a RabbitMQ 3.10.8 node, one consumer holding
# four deliveries unacked (prefetch 4) on a channel of that node; then after its connection closed.
HELD = (
    '{"channels":[{"consumer_count":1,"messages_unacknowledged":4,'
    '"name":"127.0.0.1:45546 -> 127.0.0.1:5672 (1)","pid":"<rabbit@n1.1795785091.730.0>",'
    '"prefetch_count":4,"user":"guest","vhost":"/"}],"consumers":[{"ack_required":true,"active":true,'
    '"channel_pid":"<rabbit@n1.1795785091.730.0>","consumer_tag":"ctag1.6dd24e5c2efc4640b22681d78b71e2db",'
    '"prefetch_count":4}]}\nok\n'
)
RELEASED = '{"channels":[],"consumers":[]}\nok\n'


def test_holders_list_the_consumer_and_its_channel() -> None:
    rows = parse_holders(HELD, "chaos-1", "/", "n1")
    pid = "<rabbit@n1.1795785091.730.0>"
    assert rows == [
        {"queue": "chaos-1", "consumers": 1},
        {
            "queue_name": "chaos-1",
            "channel_pid": pid,
            "consumer_tag": "ctag1.6dd24e5c2efc4640b22681d78b71e2db",
            "ack_required": True,
            "prefetch_count": 4,
            "active": True,
        },
        {
            "channel": "127.0.0.1:45546 -> 127.0.0.1:5672 (1)",
            "pid": pid,
            "name": "127.0.0.1:45546 -> 127.0.0.1:5672 (1)",
            "user": "guest",
            "vhost": "/",
            "consumer_count": 1,
            "messages_unacknowledged": 4,
            "prefetch_count": 4,
        },
    ]


def test_holders_after_the_connection_closed() -> None:
    assert parse_holders(RELEASED, "chaos-1", "/", "n1") == [{"queue": "chaos-1", "consumers": 0}]


def test_holders_of_a_queue_the_node_does_not_find_and_other_vhosts() -> None:
    out = '{"channels":[{"name":"c","vhost":"other","messages_unacknowledged":3}],"consumers":null}\nok\n'
    assert parse_holders(out, "chaos-1", "/", "n2") == [{"queue": "chaos-1", "consumers": None}]


@pytest.mark.parametrize(
    "out",
    [
        "",
        "Error: unable to perform an operation on node 'rabbit@n1'\n",
        '{"consumers":[]}\nok\n',  # no channels list
        '{"channels":[\nok\n',  # cut short
    ],
)
def test_holders_without_an_answer_are_a_cluster_error(out: str) -> None:
    with pytest.raises(ClusterError, match="n1: no consumers and channels for queue 'chaos-1'"):
        parse_holders(out, "chaos-1", "/", "n1")


def test_holders_expr_names_the_queue_and_vhost_as_binaries() -> None:
    expr = holders_expr("/", 'q"1')
    assert 'rabbit_misc:r(<<"/"/utf8>>, queue, <<"q\\"1"/utf8>>)' in expr
    assert "rabbit_amqqueue:consumers(Q)" in expr
    assert (
        "rabbit_channel:info_local([pid, name, user, vhost, consumer_count, messages_unacknowledged" in expr
    )
    assert erlang_binary("a\\b") == '<<"a\\\\b"/utf8>>'


def test_quorum_leader_changes_are_events() -> None:
    log = (
        "2026-11-28 20:37:19.249516+00:00 [notice] <0.903.0> queue 'chaos-1' in vhost '/': "
        "candidate -> leader in term: 1 machine version: 8, last applied 0\n"
        "2026-11-28 20:38:11.340616+00:00 [notice] <0.903.0> queue 'chaos-1' in vhost '/': "
        "leader -> follower in term: 2 machine version: 8, last applied 1343\n"
    )
    events = RMQ.events("n1", {"logs/rabbit.log": log})
    assert [(e.name, e.detail["queue"], e.detail["term"]) for e in events] == [
        ("quorum-leader-elected", "chaos-1", "1"),
        ("quorum-leader-abdicated", "chaos-1", "2"),
    ]
    assert events[0].wall_time is not None and events[0].wall_time.second == 19


class ScriptedNode:
    """A node that answers the CLI the way a running RabbitMQ 4.0 cluster would, recording what it
    was asked; ``on_khepri`` is what ``rabbit_khepri:is_enabled()`` answers."""

    def __init__(self, name: str, log: list[tuple[str, str]], on_khepri: str = "true") -> None:
        self.name, self.log, self.on_khepri = name, log, on_khepri

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        self.log.append((self.name, " ".join(cmd)))
        if "cluster_status" in cmd:
            return 0, json.dumps({"running_nodes": ["rabbit@n1", "rabbit@n2", "rabbit@n3"]})
        if "rabbit_khepri:is_enabled()." in cmd:
            return 0, self.on_khepri + "\n"
        return 0, ""


def formed(version: str, on_khepri: str = "true", **given: Any) -> list[tuple[str, str]]:
    plugin = RabbitMQ().at_version(version)
    log: list[tuple[str, str]] = []
    nodes = [ScriptedNode(f"n{i}", log, on_khepri if i == 3 else "true") for i in (1, 2, 3)]
    plugin.form_cluster(nodes, plugin.validate_settings({"queue_type": "quorum", **given}))
    return log


def test_khepri_on_4_0_is_the_feature_flag_enabled_once_the_cluster_formed() -> None:
    log = formed("4.0", metadata_store="khepri")
    enable = ("n1", "rabbitmqctl enable_feature_flag --experimental khepri_db")
    assert log.count(enable) == 1
    joins = [i for i, (_, cmd) in enumerate(log) if cmd.startswith("rabbitmqctl join_cluster")]
    assert len(joins) == 2 and max(joins) < log.index(enable)
    asked = [n for n, cmd in log[log.index(enable) :] if cmd.endswith("rabbit_khepri:is_enabled().")]
    assert asked == ["n1", "n2", "n3"]  # every node says it runs on Khepri


def test_khepri_on_4_0_that_a_node_does_not_report_is_a_cluster_error() -> None:
    with pytest.raises(ClusterError, match="n3: not on Khepri after enabling khepri_db: false"):
        formed("4.0", on_khepri="false", metadata_store="khepri")


@pytest.mark.parametrize(
    ("version", "given"), [("4.0", {}), ("4.3", {}), ("4.3", {"metadata_store": "khepri"})]
)
def test_no_feature_flag_where_the_store_is_the_version_s_own(version: str, given: dict[str, Any]) -> None:
    assert not [cmd for _, cmd in formed(version, **given) if "feature_flag" in cmd or "rabbit_khepri" in cmd]


class Node:
    """A node at the process boundary: each command answers from ``answers`` (first word that
    matches, default rc 0 and no output) and moves ``clock`` on by ``takes`` seconds."""

    def __init__(
        self, name: str, clock: list[float], answers: dict[str, tuple[int, str]], takes: float = 0.0
    ):
        self.name, self.clock, self.answers, self.takes = name, clock, answers, takes
        self.ran: list[tuple[str, float]] = []

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        self.ran.append((" ".join(cmd[:2] if cmd[1] != "-q" else cmd[:3]), timeout))
        self.clock[0] += self.takes
        return next((a for k, a in self.answers.items() if k in cmd), (0, ""))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(rabbitmq.time, "monotonic", lambda: now[0])
    return now


def running(*names: str) -> dict[str, tuple[int, str]]:
    return {"cluster_status": (0, json.dumps({"running_nodes": [f"rabbit@{n}" for n in names]}))}


def test_joining_commands_share_the_ready_timeout_not_a_limit_each(clock: list[float]) -> None:
    """Each command may take what the ones before it left of ``ready_timeout``; ``start_app`` is
    waited for ``START_APP_WAIT_S`` at most (the node's boot is watched after that)."""
    n1 = Node("n1", clock, running("n1", "n2"))
    n2 = Node("n2", clock, {}, takes=40.0)
    RMQ.form_cluster([n1, n2], settings(queue_type="quorum"))
    assert n2.ran == [
        ("rabbitmqctl stop_app", RMQ.ready_timeout),
        ("rabbitmqctl join_cluster", RMQ.ready_timeout - 40),
        ("rabbitmqctl start_app", rabbitmq.START_APP_WAIT_S),
    ]


class Booting(Node):
    """A node whose ``start_app`` outlasts its wait (the CLI is killed, the node boots on) and whose
    ``await_startup`` fails ``fails`` times (each taking ``takes``) before the node has booted."""

    def __init__(self, name: str, clock: list[float], fails: int, takes: float = 0.0):
        super().__init__(name, clock, {"start_app": (EXEC_TIMED_OUT, "Starting node rabbit@n4 ...")}, takes)
        self.fails = fails

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        if "await_startup" not in cmd:
            return super().exec(cmd, timeout)
        self.ran.append((" ".join(cmd), timeout))
        self.clock[0] += self.takes
        if self.fails:
            self.fails -= 1
            return (EXEC_TIMED_OUT, "Waiting for node rabbit@n4 to start ...")
        return (0, "")


@pytest.fixture
def sleeping(clock: list[float], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``poll``'s pauses move the fake clock on instead of waiting."""
    monkeypatch.setattr(rabbitmq.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    return clock


def test_a_start_app_that_outlasts_its_wait_is_followed_by_the_node_s_boot(sleeping: list[float]) -> None:
    """The 22f7fc6 failure: n4's ``start_app`` cut short while n4 was still booting. The join now
    waits for the node to say it booted, ``await_startup`` given the time left of the join."""
    n4 = Booting("n4", sleeping, fails=2, takes=50.0)
    RMQ.form_cluster([Node("n1", sleeping, running("n1", "n4")), n4], settings())
    budget = RMQ.ready_timeout
    cli = rabbitmq.CLI_START_S
    assert n4.ran == [
        ("rabbitmqctl stop_app", budget),
        ("rabbitmqctl join_cluster", budget - 50),
        ("rabbitmqctl start_app", rabbitmq.START_APP_WAIT_S),
        ("rabbitmqctl -q await_startup --timeout 150", 150 + cli),
        ("rabbitmqctl -q await_startup --timeout 95", 95 + cli),
        ("rabbitmqctl -q await_startup --timeout 40", 40 + cli),
    ]


def test_a_node_that_never_boots_fails_its_join_by_name(sleeping: list[float]) -> None:
    n4 = Booting("n4", sleeping, fails=1000, takes=50.0)
    with pytest.raises(
        ClusterError,
        match=r"^n4: did not finish booting within ready_timeout \(300 s\) of its join \(start_app gave up "
        r"after 60 s, then await_startup\): Waiting for node rabbit@n4 to start \.\.\.$",
    ):
        RMQ.form_cluster([Node("n1", sleeping, running("n1", "n4")), n4], settings())
    awaited = [c for c, _ in n4.ran if "await_startup" in c]
    assert 1 <= len(awaited) < 10  # asked until the join's deadline, then no more


def test_a_start_app_that_fails_outright_fails_the_join_at_once(clock: list[float]) -> None:
    n2 = Node("n2", clock, {"start_app": (69, "Error: unable to perform an operation on node 'rabbit@n2'.")})
    with pytest.raises(ClusterError, match=r"^n2: rabbitmqctl start_app exited 69: Error: unable to perform"):
        RMQ.form_cluster([Node("n1", clock, running("n1", "n2")), n2], settings())
    assert [c for c, _ in n2.ran][-1] == "rabbitmqctl start_app"


def test_a_join_that_outlasts_the_budget_says_which_command_and_how_long(clock: list[float]) -> None:
    n2 = Node(
        "n2",
        clock,
        {"join_cluster": (EXEC_TIMED_OUT, "Clustering node rabbit@n2 with rabbit@n1")},
        takes=75.0,
    )
    with pytest.raises(
        ClusterError, match=r"^n2: rabbitmqctl join_cluster rabbit@n1 timed out after 150 s: Clustering node"
    ):
        RMQ.add_node(n2, [Node("n1", clock, running("n1", "n2"))], settings())
    assert [c for c, _ in n2.ran] == ["rabbitmqctl stop_app", "rabbitmqctl reset", "rabbitmqctl join_cluster"]


DEPTH_OUT = "[{messages_ready,0},{messages_unacknowledged,2}]\n"


def test_queue_depth_asks_within_the_time_the_drain_gives(clock: list[float]) -> None:
    n1 = Node("n1", clock, {"eval": (0, DEPTH_OUT)})
    assert RMQ.queue_depth(n1, "chaos-1", timeout=40.0) == (0, 2)
    assert n1.ran == [("rabbitmqctl -q eval", 40.0)]


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        ((EXEC_TIMED_OUT, ""), "timed out after 40 s"),
        (
            (69, "Error: unable to perform an operation on node 'rabbit@n1'.\n" + "DIAGNOSTICS " * 40),
            "exited 69: Error",
        ),
    ],
)
def test_a_failed_depth_is_recorded_with_its_cause(
    clock: list[float], answer: tuple[int, str], cause: str
) -> None:
    """The drain records ``queue depth: reason(exc)``: it used to end inside the eval expression."""
    with pytest.raises(ClusterError) as info:
        RMQ.queue_depth(Node("n1", clock, {"eval": answer}), "chaos-1", timeout=40.0)
    recorded = reason(info.value)
    assert recorded.startswith(f"ClusterError: n1: rabbitmqctl -q eval … {cause}")
    assert "rabbit_amqqueue" not in recorded


def test_a_command_the_budget_has_no_time_left_for_is_not_run(clock: list[float]) -> None:
    n2 = Node("n2", clock, {}, takes=RMQ.ready_timeout / 2)
    with pytest.raises(
        ClusterError, match=r"^n2: rabbitmqctl join_cluster rabbit@n1 not run: .* ready_timeout \(300 s\)"
    ):
        RMQ.add_node(n2, [Node("n1", clock, running("n1", "n2"))], settings())
    assert [c for c, _ in n2.ran] == ["rabbitmqctl stop_app", "rabbitmqctl reset"]


#: Lines of a node's ``/proc/net/tcp`` and ``tcp6``: the client proxy on 45672 (0xB1E8), a peer
#: proxy on 25672 (0x6468), a client's connection to 5672 (0x1628, ESTABLISHED) and, last, the
#: AMQP listener on 0.0.0.0 and on ::.
PROXIES = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000:B1E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
    "   1: 0C00007F:6468 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n"
    "   2: 0100007F:1628 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3 1\n"
)
AMQP4 = "   3: 00000000:1628 00000000:0000 0A 00000000:00000000 00:00000000 00000000   106        0 4 1\n"
AMQP6 = (
    "   0: 00000000000000000000000000000000:1628 00000000000000000000000000000000:0000 0A "
    "00000000:00000000 00:00000000 00000000   106        0 5 1\n"
)


@pytest.mark.parametrize(
    ("tcp", "tcp6", "listens"),
    [(PROXIES, None, False), (PROXIES + AMQP4, None, True), (PROXIES, AMQP6, True), ("", "", False)],
)
def test_the_listener_check_sees_the_amqp_listener_only(
    tmp_path: Any, tcp: str, tcp6: str | None, listens: bool
) -> None:
    """``listening`` run by the host's grep over literal socket tables (a missing ``tcp6``, as in a
    namespace without IPv6, included): the proxies' listeners and a client's connection are not it."""
    import subprocess

    (tmp_path / "tcp").write_text(tcp)
    if tcp6 is not None:
        (tmp_path / "tcp6").write_text(tcp6)
    tables = (str(tmp_path / "tcp"), str(tmp_path / "tcp6"))
    assert subprocess.run(rabbitmq.listening(rabbitmq.AMQP_PORT, 0, tables)).returncode == (
        0 if listens else 1
    )


def test_the_listener_is_looked_for_inside_the_node_until_it_opens(tmp_path: Any) -> None:
    """One command waits: a listener that opens while it looks is seen (the table written after
    the command started), and one that never does ends it with exit 1 once its wait is over."""
    import subprocess

    tcp = tmp_path / "tcp"
    tcp.write_text(PROXIES)
    cmd = rabbitmq.listening(rabbitmq.AMQP_PORT, 3600, (str(tcp),))
    waiting = subprocess.Popen(cmd)
    tcp.write_text(PROXIES + AMQP4)
    assert waiting.wait(timeout=120) == 0
    tcp.write_text(PROXIES)
    assert subprocess.run(rabbitmq.listening(rabbitmq.AMQP_PORT, 0.4, (str(tcp),))).returncode == 1
    assert rabbitmq.listening(rabbitmq.AMQP_PORT)[-1].count(" ".join(rabbitmq.SOCKET_TABLES)) == 1


class Starting(Node):
    """A node whose AMQP listener is open once ``listens`` is set; every ``rabbitmqctl`` call counted."""

    def __init__(self, clock: list[float], listens: bool, awaited: int = 0) -> None:
        super().__init__("n1", clock, {"await_startup": (awaited, "")})
        self.listens = listens

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        if cmd[0] == "sh":
            self.ran.append(("sh", timeout))
            return (0 if self.listens else 1), ""
        return super().exec(cmd, timeout)


def test_readiness_boots_no_erlang_vm_before_the_listener_opens(clock: list[float]) -> None:
    node = Starting(clock, listens=False)
    assert not any(RMQ.is_ready(node) for _ in range(50))
    assert {c for c, _ in node.ran} == {"sh"}


@pytest.mark.parametrize(("awaited", "ready"), [(0, True), (EXEC_TIMED_OUT, False), (69, False)])
def test_readiness_once_the_listener_is_open_is_one_await_startup(
    clock: list[float], awaited: int, ready: bool
) -> None:
    node = Starting(clock, listens=True, awaited=awaited)
    assert RMQ.is_ready(node) is ready
    wait = rabbitmq.READY_AWAIT_S
    looked = rabbitmq.LISTEN_WAIT_S + 30
    assert node.ran == [("sh", looked), ("rabbitmqctl -q await_startup", wait + rabbitmq.CLI_START_S)]


@pytest.mark.parametrize(
    ("version", "said", "running"),
    [
        ("3.10", "brokerchaos-running 3.10.8 unknown", "rabbitmq 3.10.8 (Debian rabbitmq-server 9.9)"),
        ("4.0", "brokerchaos-running 4.0.5 false", "rabbitmq 4.0.5 on Mnesia (Debian rabbitmq-server 9.9)"),
        ("4.3", "brokerchaos-running 4.3.6 true", "rabbitmq 4.3.6 on Khepri (Debian rabbitmq-server 9.9)"),
    ],
)
def test_the_running_version_is_one_eval_on_the_node(
    clock: list[float], version: str, said: str, running: str
) -> None:
    """The node's own version and (4.x) metadata store, from one Erlang VM, as the results name them."""
    node = Node("n1", clock, {"dpkg-query": (0, "rabbitmq-server 9.9"), "eval": (0, f"{said}\nok\n")})
    assert RabbitMQ().at_version(version).broker_version(node) == running
    assert [c for c, _ in node.ran if c.startswith("rabbitmqctl")] == ["rabbitmqctl -q eval"]


def test_a_node_that_cannot_say_its_version_is_named_by_its_package(clock: list[float]) -> None:
    node = Node("n1", clock, {"dpkg-query": (0, "rabbitmq-server 9.9"), "eval": (69, "Error: unable to")})
    assert RMQ.broker_version(node) == "rabbitmq-server 9.9"
