"""The conformance kit: ``brokerchaos validate --plugin NAME`` checks a broker plugin's contract.

A plugin author runs it before any chaos test: does the plugin declare what the
host needs, does its image build, do its nodes start, become ready and reach
each other through the proxies, does the broker write where ``data_dir`` says,
is a short run with no faults durable, and does each registered fault kind the
plugin can suffer (its ``conformance`` probe: kill, pause, stop, power-loss,
partition and whatever fault packages add) complete with the broker recovering.
Every check yields a row (check, result, detail, what to do) so a failure says
what to change, not only that something is wrong.

Checks are ordered and grouped; a group whose prerequisite failed is skipped
with the reason, so one broken image does not produce ten confusing failures.
"""

from __future__ import annotations

import functools
import json
import socket
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import BrokerChaosError, DockerUnavailable
from harness.history import read_jsonl
from harness.host import Host
from harness.proxies import client_proxy_port, peer_address
from harness.spec.broker import CORRUPTION_RESPONSES, BrokerPlugin, ImageRecipe, NodeInfo, NodeSpec
from harness.spec.fault import ConformanceProbe
from harness.spec.rundir import HISTORY_JSONL, NODES

PASS, FAIL, SKIP = "pass", "fail", "skip"

#: Check groups before the fault kinds, in the order they run (``--only`` picks among them).
BASE_GROUPS = ("contract", "image", "cluster", "data-dir", "correctness")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass, fail or skip
    detail: str
    hint: str = ""

    @property
    def group(self) -> str:
        return self.name.split(":")[0]


class Battery:
    """Runs the checks for one broker plugin; ``run()`` returns the rows in order."""

    def __init__(
        self,
        host: Host,
        plugin: str,
        *,
        store: Path | None = None,
        duration: float = 6.0,
        only: Iterable[str] | None = None,
        seed: int = 1,
    ) -> None:
        self.host = host
        self.plugin: BrokerPlugin = host.broker(plugin)
        self.duration = duration
        self.seed = seed
        #: Each registered fault kind with a conformance probe is one group, in name order.
        self.probes: dict[str, tuple[frozenset[str], ConformanceProbe]] = {
            name: (cls.requires, cls.conformance)
            for name, cls in sorted(host.registry.faults.items())
            if cls.conformance is not None
        }
        groups = (*BASE_GROUPS, *self.probes)
        self.only = set(only) if only else set(groups)
        unknown = self.only - set(groups)
        if unknown:
            raise BrokerChaosError(
                f"unknown check group(s) {', '.join(sorted(unknown))}; choose from {', '.join(groups)}"
            )
        self.store = store or Path(tempfile.mkdtemp(prefix="brokerchaos-validate-"))
        self.rows: list[Check] = []
        self._baseline: Any = None
        self._images_ok: bool | None = None

    # -- driver ----------------------------------------------------------------------------

    def run(self) -> list[Check]:
        steps: list[tuple[str, Callable[[], list[Check]]]] = [
            ("contract", self.contract),
            ("image", self.image),
            ("cluster", self.cluster),
            ("data-dir", self.data_dir),
            ("correctness", self.correctness),
        ] + [(f, functools.partial(self.fault, f)) for f in self.probes]
        for group, fn in steps:
            if group not in self.only:
                continue
            blocked = self._blocked(group)
            if blocked:
                self.rows.append(Check(group, SKIP, blocked))
                continue
            try:
                self.rows += fn()
            except DockerUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - a check that throws is a failed check, not a crash
                self.rows.append(
                    Check(
                        group,
                        FAIL,
                        f"{type(exc).__name__}: {exc}",
                        "see the run directory's harness.log and nodes/*/broker.log",
                    )
                )
        return self.rows

    def _blocked(self, group: str) -> str | None:
        if group in ("contract", "image"):
            return None
        if any(r.group == "contract" and r.status == FAIL for r in self.rows):
            return "the plugin's contract is broken (see above)"
        if self._images_ok is None:
            self.rows += self.image() if "image" not in self.only else []
        if self._images_ok is False:
            return "the image did not build (see above)"
        missing = self.probes[group][0] - self.plugin.capabilities if group in self.probes else set()
        if missing:
            return f"the plugin does not declare {', '.join(sorted(missing))}"
        if group in self.probes and any(r.group == "correctness" and r.status == FAIL for r in self.rows):
            return "a run with no faults already fails (see correctness)"
        return None

    # -- contract --------------------------------------------------------------------------

    def contract(self) -> list[Check]:
        p = self.plugin
        rows = []
        problems = _attribute_problems(p)
        rows.append(
            Check(
                "contract: attributes",
                FAIL if problems else PASS,
                "; ".join(problems)
                or f"name {p.name}, client port {p.client_port}, "
                f"peer ports {list(p.peer_ports_for(1))}, protocol {p.protocol}",
                "set the class attributes of harness.BrokerPlugin" if problems else "",
            )
        )
        try:
            self.host.client(p.protocol)
            rows.append(Check("contract: client driver", PASS, f"a workload driver speaks {p.protocol!r}"))
        except BrokerChaosError as exc:
            rows.append(
                Check(
                    "contract: client driver",
                    FAIL,
                    str(exc),
                    "register a client with brokerchaos_register_clients, or use protocol 'amqp091'",
                )
            )
        caps = set(p.capabilities)
        known = self.host.registry.capabilities
        unknown = caps - set(known)
        rows.append(
            Check(
                "contract: capabilities",
                FAIL if unknown else PASS,
                f"unknown {sorted(unknown)}" if unknown else f"declares {', '.join(sorted(caps)) or 'none'}",
                f"use only {', '.join(sorted(known))}, or load the fault package that defines the others"
                if unknown
                else "",
            )
        )
        ok = isinstance(p.data_dir, str) and p.data_dir.startswith("/") and p.data_dir.rstrip("/") != ""
        rows.append(
            Check(
                "contract: data_dir",
                PASS if ok else FAIL,
                f"data_dir {p.data_dir!r}",
                "" if ok else "declare data_dir as the absolute directory the broker writes its data to",
            )
        )
        rows.append(_recipe_check(p))
        return rows

    # -- docker-backed checks -------------------------------------------------------------------

    def image(self) -> list[Check]:
        from harness.cluster import docker_client
        from harness.images import ImageBuilder

        builder = ImageBuilder(docker_client())
        try:
            tag = builder.node_image(self.plugin.image())
            builder.toxiproxy_image()
        except BrokerChaosError as exc:
            self._images_ok = False
            return [
                Check(
                    "image: builds", FAIL, str(exc), "fix the ImageRecipe (packages, copy paths, run steps)"
                )
            ]
        self._images_ok = True
        return [Check("image: builds", PASS, tag)]

    def _nodes_for(self, fault: str | None = None) -> int:
        if fault is not None:
            return self.probes[fault][1].nodes
        return 2 if self.plugin.peer_ports_for(1) and "partition" in self.plugin.capabilities else 1

    def cluster(self) -> list[Check]:
        from harness.runner import running_cluster
        from harness.scenario import build as build_scenario

        n = self._nodes_for()
        sc = build_scenario({"name": "validate-cluster", "broker": {"plugin": self.plugin.name, "nodes": n}})
        rows = []
        try:
            with running_cluster(self.host, sc) as cluster:
                rows.append(
                    Check(
                        "cluster: nodes start and form a cluster",
                        PASS,
                        f"{n} node(s) ready and formed ({', '.join(cluster.nodes)})",
                    )
                )
                rows.append(self._client_reachable(cluster))
                if n > 1:
                    rows.append(self._proxies_used(cluster))
        except BrokerChaosError as exc:
            rows.append(
                Check(
                    "cluster: nodes start and form a cluster",
                    FAIL,
                    str(exc).splitlines()[0],
                    "check is_ready() and form_cluster(); the node's log is in the message above"
                    if "\n" in str(exc)
                    else "check node_spec() and is_ready()",
                )
            )
        return rows

    def _client_reachable(self, cluster: Any) -> Check:
        bad = []
        for node, (host, port) in cluster.client_endpoints().items():
            try:
                with socket.create_connection((host, port), timeout=5):
                    pass
            except OSError as exc:
                bad.append(f"{node} {host}:{port}: {exc}")
        if bad:
            return Check(
                "cluster: client port through the proxy",
                FAIL,
                "; ".join(bad),
                f"the broker must listen on client_port {self.plugin.client_port} inside its container",
            )
        return Check(
            "cluster: client port through the proxy",
            PASS,
            f"{len(cluster.client_endpoints())} endpoint(s) accept connections",
        )

    def _proxies_used(self, cluster: Any) -> Check:
        """Inter-node connections must go to the peers' proxy addresses, never around them."""
        names = list(cluster.nodes)
        via_proxy: dict[str, int] = {}
        direct: dict[str, int] = {}
        for name in names:
            node = cluster.nodes[name]
            rc, out = node.exec(["cat", "/proc/net/tcp"], timeout=10)
            if rc != 0:
                return Check(
                    "cluster: inter-node links cross the proxies",
                    FAIL,
                    f"{name}: cannot read /proc/net/tcp",
                    "the image needs cat(1)",
                )
            proxy_addrs = {
                (peer_address(j), port)
                for j, peer in enumerate(names, start=1)
                if peer != name
                for port in self.plugin.peer_ports_for(j)
            }
            peer_port_set = {port for j in range(1, len(names) + 1) for port in self.plugin.peer_ports_for(j)}
            for local, remote in _established(out):
                if remote in proxy_addrs:
                    via_proxy[name] = via_proxy.get(name, 0) + 1
                elif (
                    remote[1] in peer_port_set
                    and not remote[0].startswith("127.")
                    and local[1] not in peer_port_set
                ):
                    direct[name] = direct.get(name, 0) + 1
        # Each proxied connection has one upstream leg to the peer; more direct legs than that bypass a proxy.
        bypass = {
            n: direct.get(n, 0) - via_proxy.get(n, 0) for n in names if direct.get(n, 0) > via_proxy.get(n, 0)
        }
        if bypass:
            return Check(
                "cluster: inter-node links cross the proxies",
                FAIL,
                f"connections to peers that skip the proxies: {bypass}",
                "peers must be reached by host name (NodeInfo.peers), not by IP or container name",
            )
        if not via_proxy:
            return Check(
                "cluster: inter-node links cross the proxies",
                SKIP,
                "no inter-node connection seen: the nodes do not talk to each other, so a partition "
                "only cuts client links",
                "if the broker clusters, it should dial its peers by host name",
            )
        return Check(
            "cluster: inter-node links cross the proxies",
            PASS,
            "connections through the proxies: " + ", ".join(f"{n}={c}" for n, c in sorted(via_proxy.items())),
        )

    # -- runs --------------------------------------------------------------------------------

    def _scenario(self, name: str, nodes: int, schedule: Sequence[dict[str, Any]]) -> Any:
        from harness.scenario import build as build_scenario

        return build_scenario(
            {
                "name": f"validate-{self.plugin.name}-{name}",
                "seed": self.seed,
                "broker": {"plugin": self.plugin.name, "nodes": nodes},
                "workload": {
                    "producers": 2,
                    "consumers": 1,
                    "rate": 150,
                    "duration": self.duration,
                    "drain_idle": 2.0,
                    "drain_timeout": 60,
                },
                "nemesis": {"schedule": list(schedule), "settle": 2 if schedule else 0},
                "checkers": ["python"],
            }
        )

    def _run(self, name: str, nodes: int, schedule: Sequence[dict[str, Any]] = ()) -> Any:
        from harness.runner import execute

        return execute(self.host, self._scenario(name, nodes, schedule), self.store)

    def baseline(self) -> Any:
        """The no-fault run the data-dir and correctness checks share (its failure too: run once)."""
        if self._baseline is None:
            try:
                self._baseline = self._run("no-faults", 1)
            except Exception as exc:  # noqa: BLE001 - reported by each check that needs the run
                self._baseline = exc
        if isinstance(self._baseline, Exception):
            raise self._baseline
        return self._baseline

    def correctness(self) -> list[Check]:
        r = self.baseline()
        c = r.results.get("counts", {})
        if r.results.get("valid") is True and c.get("confirmed", 0) > 0:
            return [
                Check(
                    "correctness: no faults, durable",
                    PASS,
                    f"{c['confirmed']} confirmed, {c['consumed_unique']} consumed, 0 lost ({r.run_dir.name})",
                )
            ]
        if not c.get("confirmed"):
            return [
                Check(
                    "correctness: no faults, durable",
                    FAIL,
                    f"no publish was confirmed ({r.run_dir})",
                    "check the credentials, vhost and queue_arguments; see the history's errors",
                )
            ]
        return [
            Check(
                "correctness: no faults, durable",
                FAIL,
                f"{r.results.get('verdict')}: {r.results.get('reason', '')} ({r.run_dir})",
                "a broker must return every confirmed message when nothing goes wrong",
            )
        ]

    def data_dir(self) -> list[Check]:
        r = self.baseline()
        d = self.plugin.data_dir.rstrip("/")
        listing = r.run_dir / NODES / "n1" / "data-dir.txt"
        if not listing.exists():
            return [
                Check(
                    "data-dir: the broker writes there",
                    FAIL,
                    f"no listing of {d} ({listing} missing)",
                    "the node must still run after the workload so its data directory can be listed",
                )
            ]
        files = []
        for line in listing.read_text().splitlines():
            parts = line.split(None, 2)
            if len(parts) == 3 and parts[0] == "f" and parts[1].isdigit() and int(parts[1]) > 0:
                files.append(parts[2])
        confirmed = r.results.get("counts", {}).get("confirmed", 0)
        if not files:
            return [
                Check(
                    "data-dir: the broker writes there",
                    FAIL,
                    f"after a {self.duration:g}s run with {confirmed} confirmed persistent messages, "
                    f"the declared data_dir {d} holds no files",
                    f"make data_dir ({d}) the directory the broker's own config stores data in; kill, "
                    "power loss and the lazy filesystem act on data_dir, so elsewhere they test nothing",
                )
            ]
        return [Check("data-dir: the broker writes there", PASS, f"{len(files)} file(s) under {d}")]

    def fault(self, kind: str) -> list[Check]:
        probe = self.probes[kind][1]
        at = round(self.duration * 0.3, 1)
        schedule = [{"at": at, "fault": kind, "hold": 1.5, "params": dict(probe.params)}]
        if probe.corrupts and self.plugin.corruption_response == "refuse":
            return [self._refusal(kind, probe.nodes, schedule)]
        r = self._run(kind, probe.nodes, schedule)
        ops = [op for op in r.history() if op["process"] == "nemesis" and op["type"] != "invoke"]
        name = f"{kind}: applied, healed, broker recovers"
        applied = [op for op in ops if op["f"] == kind]
        heals = [op for op in ops if op["f"] == "heal"]
        bad = [op for op in applied + heals if op["type"] != "ok"]
        if not applied or bad:
            why = "; ".join(f"{op['f']}: {op.get('error')}" for op in bad) or "the fault was never applied"
            return [
                Check(
                    name,
                    FAIL,
                    why,
                    f"the broker must survive {kind} and become ready again after the heal "
                    "(is_ready() within ready_timeout)"
                    + (
                        "; a broker that refuses to start on a damaged file by design declares "
                        "corruption_response = 'refuse'"
                        if probe.corrupts
                        else ""
                    ),
                )
            ]
        scheduled = [op["time_ns"] for op in heals if json.loads(op["value"] or "{}").get("fault_ids")]
        healed_at = max(scheduled) if scheduled else max(op["time_ns"] for op in heals)
        after = sum(
            1
            for op in r.history()
            if op["f"] == "publish" and op["type"] == "ok" and op["time_ns"] > healed_at
        )
        rows = [recovery_check(name, kind, r.results, after, may_lose=probe.may_lose, run_dir=r.run_dir)]
        if "lazyfs" in self.host.registry.faults[kind].needs:
            rows.append(lazyfs_held_data(kind, applied[0], self.plugin.data_dir))
        rows.append(self._bit(kind, r.results))
        return rows

    def _bit(self, kind: str, results: Mapping[str, Any]) -> Check:
        """Whether the fault's own evidence shows it bit: a recovery after a fault that had no
        effect tested nothing (``results.json``'s ``fault_evidence``)."""
        name = f"{kind}: the fault bit (its evidence)"
        actions = (results.get("fault_evidence") or {}).get("actions") or []
        if not actions:
            return Check(name, SKIP, "no evidence recorded")
        a = actions[0]
        if a["effect"] is False and "lazyfs" in self.host.registry.faults[kind].needs:
            # A broker that syncs every write leaves a cut nothing to drop: the held-data row judges
            # whether unsynced data was ever held under data_dir, not the instant of the cut.
            return Check(name, SKIP, f"{a['line']} (the held-data row judges power loss)")
        if a["effect"] is False:
            return Check(
                name,
                FAIL,
                a["line"],
                f"the {kind} had no effect on this broker, so surviving it proves nothing: "
                "make the broker hold what the fault reaches (e.g. unsynced writes under data_dir)",
            )
        if a["effect"] is None:
            return Check(name, SKIP, f"not measured: {a['summary']}")
        return Check(name, PASS, a["summary"])

    def _refusal(self, kind: str, nodes: int, schedule: Sequence[dict[str, Any]]) -> Check:
        """A broker that declares ``corruption_response = "refuse"``: the run is expected to end
        without a drain (the node never comes back, so the heal and the final heal fail); what
        counts is its history and the node's logs, read from the run directory."""
        from harness.runner import Run

        run = Run(self.host, self._scenario(kind, nodes, schedule), self.store)
        ended: BaseException | None = None
        try:
            run.execute()
        except Exception as exc:  # noqa: BLE001 - expected: the final heal cannot bring the node back
            ended = exc
        if run.dir is None:
            raise ended or BrokerChaosError("the run made no directory")
        path = run.dir.path
        ops = list(read_jsonl(path / HISTORY_JSONL)) if (path / HISTORY_JSONL).exists() else []
        logs = {}  # the container's output and the plugin's log files (log_paths), per node
        for d in sorted((path / NODES).glob("*")) if (path / NODES).exists() else []:
            logs[d.name] = "\n".join(
                f.read_text(errors="replace")
                for f in sorted(d.rglob("*"))
                if f.is_file() and (f.name == "broker.log" or "logs" in f.relative_to(d).parts)
            )
        return refusal_check(kind, ops, logs, path)


def recovery_check(
    name: str, kind: str, results: Mapping[str, Any], after: int, *, may_lose: bool, run_dir: object
) -> Check:
    """Whether the broker recovered from a fault probe: its final drain after the heal completed
    (a broker that recovered serves it), and not because every node said the queue does not exist
    (a queue the cluster lost whole did not come back: ``DrainOp.gone``), and lost nothing unless
    the probe may lose (power loss without a sync promise)."""
    drain = results.get("drain", {})
    lost = results.get("counts", {}).get("lost", 0)
    if any(op.get("gone") for op in drain.get("ops") or ()):
        return Check(
            name,
            FAIL,
            f"the final drain after the heal found the queue gone: the cluster says it does not exist ({run_dir})",
            "after the heal the broker must serve the queue again, not lose it whole",
        )
    if not drain.get("completed"):
        # The drain runs after the heal: a broker that recovered serves it.
        return Check(
            name,
            FAIL,
            f"the final drain after the heal did not complete ({run_dir})",
            "after the heal the broker must become ready and serve consumers again",
        )
    if lost and not may_lose:
        return Check(
            name,
            FAIL,
            f"{lost} confirmed messages lost ({run_dir})",
            f"under {kind} the disk keeps every write: the broker confirmed before writing, "
            "or does not restart on its data_dir",
        )
    note = (
        f", {lost} confirmed lost (durability under power loss is for chaos tests to judge)" if lost else ""
    )
    return Check(
        name,
        PASS,
        f"drain after the heal complete, {after} publishes confirmed between the heal and the end of the workload{note}",
    )


def lazyfs_held_data(kind: str, op: dict[str, Any], data_dir: str) -> Check:
    """Whether the broker ever held unsynced data on the lazy filesystem under ``data_dir``: what
    the cut dropped or tore, or else what was written through it before the cut (``written_bytes``).
    A broker that fsyncs every write may hold nothing unsynced at the instant of a cut: that is
    the broker doing its job, not data written elsewhere."""
    value = json.loads(op["value"]) if isinstance(op["value"], str) else op["value"]
    done = value.get("done") or {}
    # One node's reply, or one per node for a kind that hits several at once.
    replies = [done] + [r for r in (done.get("nodes") or {}).values() if isinstance(r, dict)]
    found = [(r.get("nodectl") or {}).get("lazyfs") or {} for r in replies]
    dropped = sum(int(fs.get("dropped_bytes") or 0) for fs in found)
    kept = sum(int(fs.get("kept_bytes") or 0) for fs in found)
    written = sum(int(fs.get("written_bytes") or 0) for fs in found)
    paths = sorted(
        {d["path"] for fs in found for d in fs.get("dropped_data", []) + fs.get("torn", [])}
        | {p for fs in found for p in fs.get("names_lost", [])}
    )
    name = f"{kind}: lazyfs held unsynced broker data"
    if dropped + kept or paths:
        return Check(
            name,
            PASS,
            f"dropped {dropped} unsynced bytes in {len(paths)} path(s) "
            f"({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''})",
        )
    if written:
        return Check(
            name,
            PASS,
            f"the broker wrote {written} bytes under {data_dir} through the lazy filesystem, all of "
            "them synced by the instant of the cut (dropped 0 bytes): it fsyncs what it writes",
        )
    return Check(
        name,
        FAIL,
        f"nothing was ever written under {data_dir} through the lazy filesystem before {kind}",
        "the broker writes its data outside data_dir, so power loss cannot reach it; point its "
        "config at data_dir",
    )


def _peer_port_problems(p: BrokerPlugin) -> list[str]:
    """Peer ports (and further client ports) must be TCP ports; the client port may be among them (a broker whose nodes
    replicate over it), but the client proxy's own port may not: each node's sidecar listens on
    that one for the workload, on every address (``harness.spec.broker.BrokerPlugin.peer_ports``)."""
    problems = []
    cproxy = client_proxy_port(p.client_port) if isinstance(p.client_port, int) else None
    for i in range(1, 4):
        for port in p.peer_ports_for(i):
            if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
                problems.append(f"peer port {port!r} of node {i} is not a TCP port")
            elif port == cproxy:
                problems.append(
                    f"peer port {port} of node {i} is the port each node's client proxy listens on "
                    f"(40000 + client_port % 10000)"
                )
    for port in getattr(p, "extra_client_ports", ()):
        if (
            not isinstance(port, int)
            or isinstance(port, bool)
            or not 0 < port < 65536
            or port == p.client_port
        ):
            problems.append(f"extra client port {port!r} is not a TCP port distinct from client_port")
    return problems


def refusal_check(kind: str, ops: Sequence[dict[str, Any]], logs: dict[str, str], run_dir: Path) -> Check:
    """The corrupt-file probe of a plugin that declares ``corruption_response = "refuse"``: the
    file was corrupted, the node then stayed down (every heal that started it failed: it never
    became ready again) and the node's logs name the damaged file (its base name)."""
    name = f"{kind}: the node refuses to start on the corrupted file"
    nemesis = [op for op in ops if op.get("process") == "nemesis" and op.get("type") != "invoke"]
    applied = [op for op in nemesis if op.get("f") == kind]
    if not applied or applied[0].get("type") != "ok":
        why = applied[0].get("error") if applied else "the fault was never applied"
        return Check(name, FAIL, f"{why} ({run_dir})", "the data directory must hold a file to corrupt")
    value = json.loads(applied[0]["value"]) if isinstance(applied[0]["value"], str) else applied[0]["value"]
    files = {
        node: str((reply.get("corrupted") or {}).get("file", ""))
        for node, reply in ((value.get("done") or {}).get("nodes") or {}).items()
    }
    # Back: the fault's own heal found it ready, or a later start did and the drain completed.
    came_back = [
        op
        for op in ops
        if op.get("type") == "ok"
        and (
            op.get("f") == "drain"
            or (op.get("process") == "nemesis" and op.get("f") == "heal" and _heals_a_fault(op))
        )
    ]
    if came_back:
        return Check(
            name,
            FAIL,
            f"the node became ready again after its file {', '.join(files.values())} was corrupted ({run_dir})",
            "the plugin declares corruption_response = 'refuse' but the broker recovered: declare 'recover'",
        )
    unnamed = {n: f for n, f in files.items() if not f or Path(f).name not in logs.get(n, "")}
    if unnamed:
        return Check(
            name,
            FAIL,
            "the node stayed down, but its log does not name the corrupted file "
            + ", ".join(f"{n}: {Path(f).name or '?'}" for n, f in sorted(unnamed.items()))
            + f" ({run_dir})",
            "a broker that refuses to start must say why: log the damaged file's name (log_paths or stdout)",
        )
    return Check(
        name,
        PASS,
        "stayed down after the heal, its log names "
        + ", ".join(f"{n}: {Path(f).name}" for n, f in sorted(files.items())),
    )


def _heals_a_fault(op: dict[str, Any]) -> bool:
    value = json.loads(op["value"]) if isinstance(op.get("value"), str) else op.get("value") or {}
    return bool(value.get("fault_ids"))


def _established(proc_net_tcp: str) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """(local, remote) of each ESTABLISHED IPv4 connection in /proc/net/tcp."""
    out = []
    for line in proc_net_tcp.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4 or parts[3] != "01":
            continue
        out.append((_addr(parts[1]), _addr(parts[2])))
    return out


def _addr(hex_addr: str) -> tuple[str, int]:
    ip, port = hex_addr.split(":")
    octets = [str(int(ip[i : i + 2], 16)) for i in range(6, -1, -2)]
    return ".".join(octets), int(port, 16)


def failed(rows: Sequence[Check]) -> bool:
    return any(r.status == FAIL for r in rows)


def render(rows: Sequence[Check], plugin: str, width: int = 160) -> str:
    """The table a plugin author acts on: check, result, detail, what to do."""
    cw = max([len("check")] + [len(r.name) for r in rows])
    rest = max(40, width - cw - 10)
    dw, hw = rest * 3 // 5, rest - rest * 3 // 5
    lines = [
        f"conformance of broker plugin {plugin!r}",
        "",
        f"{'check':<{cw}}  {'result':<6}  {'detail':<{dw}}  what to do",
        f"{'-' * cw}  {'-' * 6}  {'-' * dw}  {'-' * hw}",
    ]
    for r in rows:
        detail = textwrap.wrap(r.detail, dw) or [""]
        hint = textwrap.wrap(r.hint, hw) if r.status != PASS else []
        for i in range(max(len(detail), len(hint))):
            first = i == 0
            lines.append(
                f"{r.name if first else '':<{cw}}  {(r.status.upper() if r.status == FAIL else r.status) if first else '':<6}  "
                f"{detail[i] if i < len(detail) else '':<{dw}}  {hint[i] if i < len(hint) else ''}".rstrip()
            )
    counts = {s: sum(1 for r in rows if r.status == s) for s in (PASS, FAIL, SKIP)}
    lines += [
        "",
        f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped: "
        + ("the plugin does not conform" if counts[FAIL] else "the plugin conforms"),
    ]
    return "\n".join(lines)


def _attribute_problems(p: Any) -> list[str]:
    """What is wrong with a broker plugin's class attributes (name, ports, corruption response, logs)."""
    problems = []
    if not isinstance(getattr(p, "name", None), str) or not p.name:
        problems.append("name must be a non-empty string")
    if not isinstance(getattr(p, "client_port", None), int) or not 0 < p.client_port < 65536:
        problems.append(f"client_port must be a TCP port, got {getattr(p, 'client_port', None)!r}")
    problems += _peer_port_problems(p)
    if getattr(p, "corruption_response", None) not in CORRUPTION_RESPONSES:
        problems.append(
            f"corruption_response {getattr(p, 'corruption_response', None)!r} is not one of "
            + ", ".join(map(repr, CORRUPTION_RESPONSES))
        )
    for path in p.log_paths:
        if not path.startswith("/"):
            problems.append(f"log path {path!r} is not absolute")
    return problems


def _recipe_check(p: Any) -> Check:
    """Default settings validate, and the image recipe and a node's spec come back as the contract says."""
    try:
        settings = p.validate_settings({})
        recipe = p.image()
        spec = p.node_spec(
            NodeInfo(name="n1", index=1, peers=("n2",), cluster="bc-validate", settings=settings)
        )
        bad = []
        if not isinstance(recipe, ImageRecipe):
            bad.append(f"image() returned {type(recipe).__name__}, not ImageRecipe")
        if not isinstance(spec, NodeSpec) or not list(spec.command):
            bad.append("node_spec() must return a NodeSpec with a command")
        return Check(
            "contract: recipe and node spec",
            FAIL if bad else PASS,
            "; ".join(bad) or f"image {recipe.name}, command {' '.join(spec.command)[:60]}",
            "return harness.ImageRecipe from image() and harness.NodeSpec from node_spec()" if bad else "",
        )
    except Exception as exc:  # noqa: BLE001
        return Check(
            "contract: recipe and node spec",
            FAIL,
            f"{type(exc).__name__}: {exc}",
            "default settings must validate and node_spec() must work for any node",
        )
