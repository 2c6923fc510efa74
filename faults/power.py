"""Coordinated power loss: several nodes lose power at the same instant, as in a rack or
datacenter power failure, each dropping whatever its lazy filesystem held unsynced.

One ``docker exec`` per node costs tens to hundreds of milliseconds, and more on a loaded host,
so issuing the cuts one after another would let the first victims' peers notice, elect, or
re-replicate before the last one dies. Instead every node is told, concurrently, the same
wall-clock instant a little ahead (``lead``); each node's init sleeps until then and cuts power
itself, so the nodes die within a scheduler tick of each other. Each node's reply says when its
broker was killed, how late its wake-up was and exactly what its filesystem dropped (or kept,
for a torn cut); the fault records the spread between the first and last kill.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from faults import evidence as ev
from faults.exposure import Pending, with_exposure
from faults.process import _ProcessFault, cut_shared, nodectl, shared_cut_evidence, shared_disks
from faults.targets import on_each, pick_nodes
from harness import FaultError, ScenarioError
from harness.spec import ConformanceProbe, Evidence, combine_evidence


class NodesFault(_ProcessFault):
    """A kind that takes several nodes' brokers down at once (``params["nodes"]``) and starts
    them all again together at heal, waiting until each is ready."""

    #: The nodes the apply took down, when more than ``params["nodes"]`` (a shared disk's others).
    down: list[str] | None = None

    def heal(self) -> dict[str, Any]:
        names = list(self.down or self.params["nodes"])
        nodes = self.ctx.cluster.nodes
        replies, errors = on_each(names, lambda n: nodectl(nodes[n], "start"))
        if errors:
            raise FaultError(
                f"restart after {self.name} failed: "
                + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
            )
        self.ctx.cluster.wait_ready(names)
        return {"nodes": {n: {"nodectl": r} for n, r in replies.items()}, "ready": True}

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The nodes' evidence after the restart: when each came back and whether it runs."""
        names = list(self.down or self.params["nodes"])
        nodes = self.ctx.cluster.nodes
        statuses, errors = on_each(names, lambda n: nodectl(nodes[n], "status"))
        started = {n: ((done.get("nodes") or {}).get(n) or {}).get("nodectl") or {} for n in names}
        running = {n: (statuses.get(n) or {}).get("state") == "running" for n in names}
        facts = {
            **applied.facts,
            "back_at": {n: started[n].get("at") for n in names},
            "running_after": running,
            "status_errors": errors,
        }
        down = [n for n in names if not running[n]]
        summary = applied.summary + (
            f"; {', '.join(down)} not running after the heal" if down else "; all back"
        )
        restored = None if errors else not down
        return applied.with_heal(summary, facts, restored)


class PowerLossCoordinated(NodesFault):
    """Power cut on several nodes at once (``nodes``: all, majority, minority, random or a list).

    ``torn: true`` keeps, on each node, a seeded random prefix of every file's unsynced bytes
    (node ``n2`` tears with seed ``"<torn_seed>-n2"``). At heal every node that lost power
    starts again on what its disk kept, all at once (a cluster cold start).
    """

    name = "power-loss-coordinated"
    requires = frozenset({"power-loss"})
    needs = frozenset({"lazyfs"})
    touches = frozenset({"process", "disk"})
    conformance = ConformanceProbe(params={"nodes": "all"}, nodes=1, may_lose=True)
    params_schema = {"nodes": object, "torn": bool, "torn_seed": int, "lead": float}
    #: Seconds between sending the cut and the cut itself: covers a slow ``docker exec`` (on a busy
    #: 2-core host one took 1.5 s; a node that wakes late records by how much).
    DEFAULT_LEAD = 2.0

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        out: dict[str, Any] = {
            "nodes": pick_nodes(cls.name, params.get("nodes", "all"), nodes, rng),
            "torn": bool(params.get("torn", False)),
            "lead": float(params.get("lead", cls.DEFAULT_LEAD)),
        }
        if not 0 < out["lead"] <= 30:
            raise ScenarioError(f"fault {cls.name}: lead {out['lead']!r} must be between 0 and 30 seconds")
        if out["torn"]:
            out["torn_seed"] = int(params.get("torn_seed", rng.randrange(1 << 31)))
        return out

    def _args(self, node: str, at: float) -> list[str]:
        args = ["power-loss", "--at", f"{at:.6f}"]
        if self.params.get("torn"):
            args += ["--torn", f"{self.params['torn_seed']}-{node}"]
        return args

    def apply(self) -> dict[str, Any]:
        names = list(self.params["nodes"])
        lead = float(self.params.get("lead", self.DEFAULT_LEAD))
        at = time.time() + lead
        nodes = self.ctx.cluster.nodes
        # Nodes on a shared disk die at the same instant and their disk is cut once (``cut_shared``);
        # every node of such a disk goes down with it, named or not.
        disks = shared_disks(self.ctx.cluster, names)
        on_disk = {n for d in disks.values() for n in d.nodes}
        own = [n for n in names if n not in on_disk]
        torn = self.params.get("torn_seed") if self.params.get("torn") else None

        def one(part: str) -> dict[str, Any]:
            if part == "shared":
                return cut_shared(self.ctx.cluster, disks, torn, at)
            got, failed = on_each(own, lambda n: nodectl(nodes[n], *self._args(n, at), timeout=60 + lead))
            return {"replies": got, "errors": failed}

        parts, failed = on_each(["own", *(["shared"] if disks else [])], one)
        if "shared" in failed:
            raise FaultError(str(failed["shared"]))
        replies, errors = parts["own"]["replies"], parts["own"]["errors"]
        done = {"cut": summarize(at, replies), "nodes": {n: {"nodectl": r} for n, r in replies.items()}}
        if disks:
            done["shared"] = parts["shared"]
            done["nodes"].update(parts["shared"]["nodes"])
            self.down = sorted({*names, *on_disk})
        if errors:
            raise FaultError(
                f"power cut failed on {', '.join(sorted(errors))}: "
                + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
                + f" (cut on {', '.join(sorted(replies)) or 'no node'}: {done['cut']})"
            )
        return done

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """Per node, what the cut threw away (unsynced bytes dropped, torn writes kept)."""
        parts = {}
        shared = done.get("shared") or {}
        if shared:
            nodes = self.ctx.cluster.nodes
            parts["shared"] = shared_cut_evidence(shared, lambda n: nodectl(nodes[n], "status"))
        for n, r in sorted((done.get("nodes") or {}).items()):
            if n in (shared.get("nodes") or {}):
                continue
            reply = r.get("nodectl") or {}
            cut = ev.power_cut(reply)
            if reply.get("gone") is False:
                cut = replace(cut, flags=(*cut.flags, f"{n}: broker processes outlived the cut"))
            parts[n] = cut
        self.pending = Pending(self.ctx.cluster, parts)
        return combine_evidence(parts)

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The nodes back; and the messages each node's dropped writes held, mapped while they were down."""
        healed = super().heal_evidence(done, applied)
        pending = getattr(self, "pending", None)
        return with_exposure(healed, pending.result()) if pending is not None else healed


def summarize(at: float, replies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """When each node died and what it lost, and how far apart the first and last kill were."""
    killed = {n: r.get("at") for n, r in replies.items()}
    stamps = [datetime.fromisoformat(t).timestamp() for t in killed.values() if t]
    fs = {n: r.get("lazyfs") or {} for n, r in replies.items()}
    return {
        "scheduled_at": round(at, 6),
        "killed_at": killed,
        "late_ms": {n: (r.get("cue") or {}).get("late_ms") for n, r in replies.items()},
        "spread_ms": round((max(stamps) - min(stamps)) * 1000, 3) if stamps else None,
        "dropped_bytes": {n: int(f.get("dropped_bytes") or 0) for n, f in fs.items()},
        "kept_bytes": {n: int(f.get("kept_bytes") or 0) for n, f in fs.items()},
        "dropped_files": {n: sorted({d["path"] for d in f.get("dropped_data", [])}) for n, f in fs.items()},
    }
