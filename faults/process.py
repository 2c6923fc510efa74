"""Process faults: crash (SIGKILL), pause (SIGSTOP/SIGCONT), graceful stop, rolling restart,
and power loss. Each talks to the node's init (``faults.nodeinit``) through
``python3 -m faults.nodectl`` inside the broker container, so the broker dies
while the container, its network namespace and the lazy filesystem's memory
(the node's "page cache") live on -- except under power loss, which drops it.

``docker kill`` alone is a crash, not a power loss: written but unsynced data
sits in the host's page cache and survives. Power loss needs the data directory
on the lazy filesystem (``broker.lazyfs: true``, implied by a power-loss fault).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from faults import evidence as ev
from faults.exposure import Pending, with_exposure
from faults.targets import on_each
from harness import FaultError, NodesDown, ScenarioError
from harness.spec import ConformanceProbe, Evidence, Fault, FaultContext, combine_evidence


def nodectl(node: Any, *args: str, timeout: float = 60.0) -> dict[str, Any]:
    rc, out = node.exec(["python3", "-m", "faults.nodectl", *args], timeout=timeout)
    for _ in range(3):
        # An exec on a loaded engine was seen to end with exit 0 and no output at all; a read-only
        # query is asked again, a command that acts is never repeated.
        if out.strip() or args[:1] != ("status",):
            break
        rc, out = node.exec(["python3", "-m", "faults.nodectl", *args], timeout=timeout)
    line = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        reply = json.loads(line)
    except json.JSONDecodeError:
        raise FaultError(
            f"{node.name}: nodectl {' '.join(args)} failed (exit {rc}): {out.strip()[-300:]}"
        ) from None
    if rc != 0 or reply.get("ok") is False:
        raise FaultError(f"{node.name}: nodectl {' '.join(args)}: {reply.get('error', reply)}")
    return reply


class _ProcessFault(Fault):
    """Every kind that stops, pauses or kills broker processes shares one final heal."""

    touches = frozenset({"process"})

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        return heal_processes(ctx.cluster) or None


class _NodeFault(_ProcessFault):
    params_schema = {"node": str}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        node = params.get("node") or rng.choice(list(nodes))
        if node not in nodes:
            raise ScenarioError(f"fault {cls.name}: node {node!r} is not one of {list(nodes)}")
        return {**params, "node": node}

    @property
    def node(self) -> Any:
        return self.ctx.cluster.nodes[self.params["node"]]

    def _start_and_wait(self) -> dict[str, Any]:
        reply = nodectl(self.node, "start")
        self.ctx.cluster.wait_ready([self.params["node"]])
        return {"nodectl": reply, "ready": True}

    def _status(self) -> dict[str, Any]:
        return nodectl(self.node, "status")


class _DownFault(_NodeFault):
    """A kind that takes the broker down (kill, stop, power cut): its evidence is the process tree
    gone, with its exit, and after the heal the time it came back."""

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """The node init's reply lists every pid it signalled and whether the broker's whole process
        tree was gone after (``/proc``); its ``status`` then gives the live processes left and the
        leader's exit (signal or code). No effect: the broker was not running."""
        return ev.gone(done["nodectl"], self._status())

    def heal(self) -> dict[str, Any]:
        return self._start_and_wait()

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """When the broker started again (the start reply), and that ``status`` shows it running."""
        return ev.back(applied, done.get("nodectl") or {}, self._status())


class Kill(_DownFault):
    """SIGKILL the broker; it stays down for the hold, then starts on the same data."""

    name = "kill"
    requires = frozenset({"kill"})
    conformance = ConformanceProbe()

    def apply(self) -> dict[str, Any]:
        return {"nodectl": nodectl(self.node, "crash")}


class Pause(_NodeFault):
    """SIGSTOP the broker's process group: peers see it vanish, then it resumes with stale state."""

    name = "pause"
    requires = frozenset({"pause"})
    conformance = ConformanceProbe()

    def apply(self) -> dict[str, Any]:
        return {"nodectl": nodectl(self.node, "pause")}

    def heal(self) -> dict[str, Any]:
        return {"nodectl": nodectl(self.node, "resume")}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """Every process of the broker in the stopped state (``T`` in ``/proc/PID/stat``, as the
        node init's ``status`` lists them); a process still running is named."""
        return ev.stopped(done["nodectl"], self._status())

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """No process of the broker left in the stopped state."""
        return ev.resumed(applied, self._status())


class Stop(_DownFault):
    """Graceful stop (SIGTERM, then SIGKILL after a timeout), started again at heal."""

    name = "stop"
    requires = frozenset({"stop"})
    conformance = ConformanceProbe()

    def apply(self) -> dict[str, Any]:
        return {"nodectl": nodectl(self.node, "stop", timeout=90)}


#: Seconds between sending the kills of a shared disk's nodes and the kills themselves (each
#: node's init sleeps until the same instant, so none sees the others die first).
SHARED_LEAD = 1.5


def shared_disks(cluster: Any, names: Sequence[str]) -> dict[str, Any]:
    """The shared disks (``harness.cluster.SharedDisk``) the nodes ``names`` mount, by name."""
    topology = getattr(cluster, "topology", None)
    disks_of = getattr(topology, "disks_of", None)
    return {d.name: d for n in names for d in (disks_of(n) if disks_of else ())}


def cut_shared(
    cluster: Any, disks: Mapping[str, Any], torn_seed: int | None = None, at: float | None = None
) -> dict[str, Any]:
    """Cut the power of shared disks: every node that mounts one is killed at the same instant
    (``at``, or SHARED_LEAD seconds from now), then each disk drops what it held unsynced (torn:
    keeps a seeded prefix). One page cache serves every node of a disk, so none of them outlives
    the cut: a node still running would have read writes the disk then forgets."""
    at = time.time() + SHARED_LEAD if at is None else at
    victims = sorted({n for d in disks.values() for n in d.nodes})
    nodes = cluster.nodes
    wait = 60 + max(0.0, at - time.time())
    kills, errors = on_each(victims, lambda n: nodectl(nodes[n], "crash", "--at", f"{at:.6f}", timeout=wait))
    if errors:
        raise FaultError(
            "power cut of a shared disk failed: " + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
        )

    def cut(name: str) -> dict[str, Any]:
        torn = ["--torn", f"{torn_seed}-shared-{name}"] if torn_seed is not None else []
        return nodectl(cluster.disks[name], "disk-cut", *torn)

    cuts, errors = on_each(list(disks), cut)
    if errors:
        raise FaultError(
            "brokers killed but a shared disk's cut failed: "
            + "; ".join(f"{d}: {e}" for d, e in sorted(errors.items()))
        )
    return {
        "disks": {d: {"nodectl": r, "nodes": list(disks[d].nodes)} for d, r in cuts.items()},
        "nodes": {n: {"nodectl": r} for n, r in kills.items()},
    }


def shared_cut_evidence(shared: Mapping[str, Any], status: Callable[[str], Any]) -> Evidence:
    """What each shared disk's cut dropped (``power_cut``: no effect when nothing unsynced was
    dropped, as on a node of its own), with every node it took down: its broker gone (its facts
    under ``process``, its flags beside the cut's)."""
    cut = combine_evidence(
        {f"shared-{d}": ev.power_cut(r.get("nodectl") or {}) for d, r in (shared.get("disks") or {}).items()}
    )
    killed = {n: ev.gone(r.get("nodectl") or {}, status(n)) for n, r in (shared.get("nodes") or {}).items()}
    flags = tuple(f for k in killed.values() for f in k.flags)
    facts = {**cut.facts, "process": {n: k.as_dict() for n, k in killed.items()}}
    return replace(cut, facts=facts, flags=cut.flags + flags)


class PowerLoss(_DownFault):
    """The node and its disk cache die together: every write not yet fsync'ed is lost.

    ``torn: true`` keeps a random prefix (by the run's seed) of each file's unsynced bytes. A node
    whose data is on a shared volume (``SharedVolume``) under the lazy filesystem shares one disk
    with every node that mounts it: the cut kills all of them together and drops that disk's
    unsynced writes once (``cut_shared``); the heal starts them all.
    """

    name = "power-loss"
    requires = frozenset({"power-loss"})
    conformance = ConformanceProbe(may_lose=True)
    touches = frozenset({"process", "disk"})
    needs = frozenset({"lazyfs"})
    params_schema = {"node": str, "torn": bool, "torn_seed": int}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        out = super().resolve(params, nodes, rng)
        if out.get("torn"):
            out["torn_seed"] = int(out.get("torn_seed", rng.randrange(1 << 31)))
        return out

    def apply(self) -> dict[str, Any]:
        disks = shared_disks(self.ctx.cluster, [self.params["node"]])
        if disks:
            torn = self.params["torn_seed"] if self.params.get("torn") else None
            shared = cut_shared(self.ctx.cluster, disks, torn)
            return {"nodectl": shared["nodes"][self.params["node"]]["nodectl"], "shared": shared}
        args = ["power-loss"]
        if self.params.get("torn"):
            args += ["--torn", str(self.params["torn_seed"])]
        return {"nodectl": nodectl(self.node, *args)}

    def heal(self) -> dict[str, Any]:
        shared = sorted((self._shared_nodes()) - {self.params["node"]})
        if not shared:
            return self._start_and_wait()
        nodes = self.ctx.cluster.nodes
        replies, errors = on_each([self.params["node"], *shared], lambda n: nodectl(nodes[n], "start"))
        if errors:
            raise FaultError(
                "restart after power-loss failed: "
                + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
            )
        self.ctx.cluster.wait_ready([self.params["node"], *shared])
        return {"nodectl": replies[self.params["node"]], "ready": True, "shared_nodes": replies}

    def _shared_nodes(self) -> set[str]:
        return {n for d in shared_disks(self.ctx.cluster, [self.params["node"]]).values() for n in d.nodes}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """The lazy filesystem's own account of the cut: per file the unsynced bytes it dropped
        and the ranges, the files it left shorter, the names it lost; the kill's evidence beside it.
        No effect: nothing unsynced was dropped (no more than a crash). With a broker plugin that
        declares ``unsynced-messages``, the ids of the messages the dropped writes held. On a
        shared disk: the disk's cut and every node it took down."""
        if "shared" in done:
            nodes = self.ctx.cluster.nodes
            return shared_cut_evidence(done["shared"], lambda n: nodectl(nodes[n], "status"))
        cut = ev.power_cut(done["nodectl"])
        self.pending = Pending(self.ctx.cluster, {self.params["node"]: cut})
        killed = super().evidence(done)
        return replace(cut, facts={**cut.facts, "process": killed.as_dict()}, flags=cut.flags + killed.flags)

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """When the broker came back; and the messages the dropped writes held, mapped while it was down."""
        healed = super().heal_evidence(done, applied)
        pending = getattr(self, "pending", None)
        return with_exposure(healed, pending.result()) if pending is not None else healed


class RollingRestart(_ProcessFault):
    """Stop and start every node in turn, waiting for each to be ready (a routine upgrade)."""

    name = "rolling-restart"
    requires = frozenset({"stop"})
    params_schema = {"order": list}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        order = list(params.get("order") or rng.sample(list(nodes), len(nodes)))
        unknown = [n for n in order if n not in nodes]
        if unknown:
            raise ScenarioError(f"fault {cls.name}: order names {unknown}, not among {list(nodes)}")
        return {"order": order}

    def apply(self) -> dict[str, Any]:
        done = []
        for name in self.params["order"]:
            node = self.ctx.cluster.nodes[name]
            stop = nodectl(node, "stop", timeout=90)
            start = nodectl(node, "start")
            self.ctx.cluster.wait_ready([name])
            done.append({"node": name, "stop": stop, "start": start})
        return {"restarted": done}

    def heal(self) -> dict[str, Any]:
        return {}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """Per node: its processes gone at the stop, and the pid it started again with."""
        parts = {}
        for step in done.get("restarted") or []:
            gone = ev.gone(step["stop"], None)
            start = step.get("start") or {}
            facts = {**gone.facts, "back_at": start.get("at"), "pid_after": start.get("pid")}
            summary = f"{gone.summary}; started again at {start.get('at')} and ready"
            parts[step["node"]] = Evidence(gone.effect, summary, facts, gone.no_effect_reason, gone.flags)
        return combine_evidence(parts)


def heal_processes(cluster: Any) -> dict[str, Any]:
    """Every broker running and not paused (final heal), every node at once. Idempotent. A node
    whose broker does not get ready within the plugin's ``ready_timeout`` (or whose container
    exited, or whose broker ended again with nothing starting it) is named in ``NodesDown`` with
    why (the wait's reason and the broker's last exit as its node init saw it), once every other
    node is ready; a node the harness could not command at all is a ``FaultError``."""

    def heal(name: str) -> dict[str, Any] | None:
        node = cluster.nodes[name]
        state = nodectl(node, "status").get("state")
        if state == "paused":
            return {"resume": nodectl(node, "resume")}
        if state != "running":
            return {"start": nodectl(node, "start")}
        return None

    replies, errors = on_each(list(cluster.nodes), heal)
    if errors:  # the harness could not command a node: its own failure, not the broker's
        raise FaultError(
            "healing the brokers' processes failed: "
            + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
        )
    done = {n: r for n, r in replies.items() if r is not None}
    if done:
        try:
            cluster.wait_ready(list(done))
        except NodesDown as exc:
            down = {n: _with_exit(cluster.nodes[n], why) for n, why in exc.nodes.items()}
            raise NodesDown(down, {n: r for n, r in done.items() if n not in down}) from exc
    return done


def _with_exit(node: Any, why: str) -> str:
    """A node's reason for not coming back (its first line the summary), with its broker's state
    or last exit as the node init saw it."""
    try:
        status = nodectl(node, "status")
    except FaultError as exc:
        said = f"its node init did not answer: {exc}"
    else:
        last = status.get("last_exit")
        if status.get("state") == "running" or not last:
            said = f"its broker is {status.get('state')}"
        else:
            said = f"its broker exited with code {last.get('code')} at {last.get('at')}"
    head, _, rest = why.partition("\n")
    return f"{head} ({said})" + (f"\n{rest}" if rest else "")
