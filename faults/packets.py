"""Packet-level network faults, below the Toxiproxy toxics: in the kernel of each node's
network namespace (the sidecar's, which the broker shares), applied with ``docker exec`` in
the sidecar (which has ``NET_ADMIN``).

``netem``
    ``tc qdisc replace dev <if> root netem ...`` on the node's interface: every packet the
    node sends (to peers and to clients) is delayed (with jitter), lost, duplicated,
    corrupted or reordered at the given rates. Needs the ``sch_netem`` queueing discipline in
    the Docker host's kernel (``CONFIG_NET_SCH_NETEM``, in every distribution kernel); a
    kernel without it refuses with one line that says so.
``packet-loss``
    nftables rules that drop a share of packets silently, as a lossy wire does: ``in``
    drops packets arriving at the node (from peers, or from peers and clients), ``out``
    drops the node's packets when they arrive at each peer. The drop happens at the
    receiver's ``ingress`` hook, before its TCP stack, so the sender learns of a loss only
    by its own retransmission timers (a drop in the sender's own output path would be
    reported to it at once). Needs nf_tables, which kernels without netem still have.

Both record the commands run and what the kernel shows afterwards (``tc -s qdisc``, ``nft
list table`` with its packet counters), and the heal records the counters again: what was
matched and what was dropped. The kernel draws which packets are hit; a replay repeats the
rates, not the packets.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from faults.targets import on_each
from harness import FaultError, ScenarioError, exec_output, short_error
from harness.spec import Evidence, Fault, FaultContext, combine_evidence

NETEM_DEFAULTS = {
    "loss": 0.0,
    "duplicate": 0.0,
    "corrupt": 0.0,
    "reorder": 0.0,
    "delay": 0.0,
    "jitter": 0.0,
    "correlation": 0.0,
}
TABLE_PREFIX = "brokerchaos_loss"
#: The interface a sidecar reaches the run's network by (a shell fragment: Docker names it eth0).
IFACE = "$(ip -o route show default | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p' | head -n1)"


def sidecar_exec(ctx: FaultContext, node: str, script: str) -> tuple[int, str]:
    """Run a shell script in the node's sidecar (its network namespace, with NET_ADMIN)."""
    cluster = ctx.cluster
    try:
        container = cluster.client.containers.get(cluster.nodes[node].sidecar_name)
        code, out = exec_output(container, ["sh", "-c", script])
    except Exception as exc:  # noqa: BLE001 - the Docker SDK raises several kinds
        return 126, short_error(exc)
    return code, out.decode(errors="replace").strip()


def _run(ctx: FaultContext, node: str, script: str, what: str) -> str:
    rc, out = sidecar_exec(ctx, node, script)
    if rc != 0:
        raise FaultError(f"{node}: {what} failed (exit {rc}): {out[-400:]}")
    return out


def _on_every_sidecar(ctx: FaultContext, script: str, what: str) -> dict[str, str] | None:
    """Run a final-heal script on every sidecar, all at once; the nodes where it printed something
    (what it undid)."""
    replies, errors = on_each(list(ctx.cluster.nodes), lambda node: sidecar_exec(ctx, node, script))
    failed = {**errors, **{n: out[-300:] for n, (rc, out) in replies.items() if rc != 0}}
    if failed:
        raise FaultError(f"could not {what}: " + "; ".join(f"{n}: {e}" for n, e in sorted(failed.items())))
    return {n: out for n, (_rc, out) in sorted(replies.items()) if out} or None


def _node(params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random, kind: str) -> str:
    node = params.get("node") or rng.choice(list(nodes))
    if node not in nodes:
        raise ScenarioError(f"{kind}: node {node!r} is not one of {list(nodes)}")
    return str(node)


def _percent(kind: str, key: str, value: Any) -> float:
    v = round(float(value), 3)
    if not 0 <= v <= 100:
        raise ScenarioError(f"{kind}: {key} is a percentage from 0 to 100, got {value!r}")
    return v


class Netem(Fault):
    """``tc qdisc ... netem`` on the node's egress in its sidecar: ``loss``, ``duplicate``, ``corrupt``, ``reorder``, ``correlation`` (%), ``delay``, ``jitter`` (ms).

    Needs ``sch_netem`` in the Docker host's kernel; a kernel without it is refused with one
    line (``packet-loss`` covers loss there). A bare ``netem`` is a seeded lossy link.
    """

    name = "netem"
    requires = frozenset({"partition"})
    touches = frozenset({"qdisc"})
    params_schema = {"node": str, **{k: float for k in NETEM_DEFAULTS}}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        out: dict[str, Any] = {"node": _node(params, nodes, rng, cls.name)}
        given = {k: params.get(k, v) for k, v in NETEM_DEFAULTS.items()}
        if not any(params.get(k) for k in ("loss", "duplicate", "corrupt", "reorder", "delay")):
            given["loss"] = round(rng.uniform(1, 20), 1)  # a bare `netem` is a seeded lossy link
        for key in ("loss", "duplicate", "corrupt", "reorder", "correlation"):
            out[key] = _percent(cls.name, key, given[key])
        for key in ("delay", "jitter"):
            out[key] = round(float(given[key]), 3)
            if out[key] < 0:
                raise ScenarioError(f"{cls.name}: {key} is milliseconds >= 0, got {given[key]!r}")
        if out["jitter"] and not out["delay"]:
            raise ScenarioError(f"{cls.name}: jitter needs a delay (netem varies the delay by the jitter)")
        if out["reorder"] and not out["delay"]:
            raise ScenarioError(
                f"{cls.name}: reorder needs a delay (netem reorders by sending some packets "
                "at once while the others wait the delay)"
            )
        return out

    def tc_args(self) -> list[str]:
        """The netem options, in the order ``tc`` documents them."""
        p = self.params
        corr = [f"{p['correlation']:g}%"] if p["correlation"] else []
        args: list[str] = []
        if p["delay"]:
            args += ["delay", f"{p['delay']:g}ms"] + ([f"{p['jitter']:g}ms"] if p["jitter"] else []) + corr
        for key in ("loss", "duplicate", "corrupt", "reorder"):
            if p[key]:
                args += [key, f"{p[key]:g}%"] + corr
        return args

    def apply(self) -> dict[str, Any]:
        node = self.params["node"]
        command = f"tc qdisc replace dev {IFACE} root netem {' '.join(self.tc_args())}"
        rc, out = sidecar_exec(self.ctx, node, f"{command} && tc -s qdisc show dev {IFACE}")
        if rc != 0:
            if "qdisc kind is unknown" in out:
                raise FaultError(
                    f"{node}: the Docker host's kernel has no netem queueing discipline "
                    "(CONFIG_NET_SCH_NETEM); use a kernel with sch_netem, or fault packet-loss "
                    "(nftables) for loss alone"
                )
            raise FaultError(f"{node}: {command} failed (exit {rc}): {out[-400:]}")
        return {"node": node, "command": command, "qdisc": out}

    def heal(self) -> dict[str, Any]:
        node = self.params["node"]
        shown = _run(self.ctx, node, f"tc -s qdisc show dev {IFACE}", "tc qdisc show")
        if "netem" not in shown:  # the apply did not take (recorded then): nothing to remove
            return {"node": node, "qdisc": shown, "removed": None}
        _run(self.ctx, node, f"tc qdisc del dev {IFACE} root", "tc qdisc del")
        return {"node": node, "command": "tc qdisc del dev <if> root", "qdisc_before_heal": shown}

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        """Remove a netem root qdisc from every sidecar (Docker's default qdisc comes back)."""
        return _on_every_sidecar(
            ctx,
            f"if tc qdisc show dev {IFACE} | grep -q netem; then "
            f"tc qdisc del dev {IFACE} root && echo removed; fi",
            "remove the netem qdisc",
        )


class PacketLoss(Fault):
    """nftables drops ``loss`` % (default: seeded, 5 to 40) of the node's packets at the receiver's ingress; the kernel's counters are recorded."""

    name = "packet-loss"
    requires = frozenset({"partition"})
    params_schema = {
        "node": str,
        "loss": float,
        "direction": ("in", "out", "both"),
        "links": ("peers", "all"),
    }

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        loss = (
            _percent(cls.name, "loss", params["loss"]) if "loss" in params else round(rng.uniform(5, 40), 1)
        )
        return {
            "node": _node(params, nodes, rng, cls.name),
            "loss": loss,
            "direction": params.get("direction", "both"),
            "links": params.get("links", "peers"),
        }

    @classmethod
    def cuts_off(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[str]:
        """Its node, when every one of its packets is dropped; a share leaves the links working."""
        return {params["node"]} if float(params.get("loss", 0)) >= 100 else set()

    def _table(self) -> str:
        return f"{TABLE_PREFIX}_{self.fault_id or 'adhoc'}"

    def _addresses(self) -> dict[str, str]:
        """Each node's address on the run's network (its sidecar's)."""
        cluster = self.ctx.cluster
        out = {}
        for name, node in cluster.nodes.items():
            attrs = cluster.client.containers.get(node.sidecar_name).attrs
            out[name] = attrs["NetworkSettings"]["Networks"][cluster.topology.network]["IPAddress"]
        return out

    def _rules(self) -> dict[str, str]:
        """sidecar -> the nft match of the packets it drops a share of on arrival."""
        node, direction = self.params["node"], self.params["direction"]
        addr = self._addresses()
        peers = [n for n in addr if n != node]
        out = {}
        if direction in ("in", "both"):
            out[node] = (
                ""
                if self.params["links"] == "all"
                else f"ip saddr {{ {', '.join(addr[p] for p in peers)} }} "
            )
        if direction in ("out", "both"):
            for p in peers:
                out[p] = f"ip saddr {addr[node]} "
        return out

    def apply(self) -> dict[str, Any]:
        table = self._table()
        threshold = int(round(self.params["loss"] * 100))  # per 10000
        done = []
        try:
            for sidecar, match in self._rules().items():
                script = "; ".join(
                    [
                        "set -e",
                        f"dev={IFACE}",
                        f"nft add table netdev {table}",
                        f"nft add chain netdev {table} ingress '{{ type filter hook ingress device \"'$dev'\" "
                        "priority -500; }'",
                        # the first rule counts what is eligible, the second drops its share and counts that
                        f"nft add rule netdev {table} ingress {match}counter",
                        f"nft add rule netdev {table} ingress {match}numgen random mod 10000 '<' {threshold} "
                        "counter drop",
                        f"nft list table netdev {table}",
                    ]
                )
                done.append(
                    {
                        "sidecar": sidecar,
                        "table": f"netdev {table}",
                        "drops": f"{match}{threshold}/10000",
                        "shown": _run(self.ctx, sidecar, script, "nft add"),
                    }
                )
        except FaultError:
            self.heal()
            raise
        return {"node": self.params["node"], "loss_percent": self.params["loss"], "rules": done}

    def heal(self) -> dict[str, Any]:
        table = self._table()
        done = {}
        for sidecar in self._rules():
            script = (
                f"if nft list table netdev {table} >/dev/null 2>&1; then nft list table netdev {table}; "
                f"nft delete table netdev {table}; fi"
            )
            done[sidecar] = _run(self.ctx, sidecar, script, "nft delete table")
        return {"counters_before_heal": done}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """While held only the rules' presence is known (``nft list``)."""
        sidecars = [r["sidecar"] for r in done.get("rules") or []]
        return Evidence.unmeasured(
            f"drop rules in place on {', '.join(sidecars)}; the packets they dropped are counted at the heal"
        )

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The kernel's counters, read just before the rules went: packets eligible and dropped.
        No effect: none dropped."""
        parts = {}
        for sidecar, shown in sorted((done.get("counters_before_heal") or {}).items()):
            counts = [int(n) for n in re.findall(r"counter packets (\d+) bytes \d+", shown or "")]
            if len(counts) < 2:
                parts[sidecar] = Evidence.unmeasured(f"no counters in {shown!r}")
                continue
            eligible, dropped = counts[0], counts[1]
            facts = {"eligible_packets": eligible, "dropped_packets": dropped}
            if dropped:
                parts[sidecar] = Evidence.bit(f"dropped {dropped} of {eligible} packets", facts)
            else:
                parts[sidecar] = Evidence.none(f"dropped none of {eligible} packets", facts)
        ev = combine_evidence(parts)
        return Evidence(ev.effect, ev.summary, ev.facts, ev.no_effect_reason, ev.flags, True)

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        """Delete every packet-loss table on every sidecar."""
        done = _on_every_sidecar(
            ctx,
            f"for t in $(nft list tables netdev 2>/dev/null | awk '{{print $3}}' | "
            f"grep '^{TABLE_PREFIX}_'); do nft delete table netdev $t && echo $t; done",
            "delete the packet-loss tables",
        )
        return {node: out.split() for node, out in done.items()} if done else None


PACKET_FAULTS: tuple[type[Fault], ...] = (Netem, PacketLoss)
