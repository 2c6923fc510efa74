"""Network faults through the Toxiproxy API: every partition shape of Jepsen's catalogue,
client cuts, and link degradation (latency, bandwidth, slicing, resets).

A partition is a set of directed cuts ``(src, dst)``: ``dst`` stops hearing ``src``.
Two mechanisms, chosen with ``mode``:

``drop`` (default)
    A ``timeout`` toxic with timeout 0 on each stream that carries src's bytes to
    dst: connections stay open and go silent, so peers notice only through their
    own heartbeats and timeouts, as behind a real partition. Toxiproxy discards
    the bytes it holds back (TCP would have retransmitted them), so no connection
    that lost bytes may carry on: removing a timeout toxic closes the proxy's open
    connections before its streams pass again (Toxiproxy's timeout toxic does so on
    removal, and so does the project's server), and the heal only removes toxics.
``refuse``
    The proxies of a cut pair are disabled: open connections are closed at once
    and new ones refused. Symmetric cuts only.

Proxy ``A_to_B_<port>`` lives in A's sidecar and carries connections A opened to
B: its ``upstream`` stream is A->B bytes and ``downstream`` is B->A bytes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from faults.link_evidence import counted_now, healed_evidence, held_evidence, probe_links, readback
from harness import FaultError, ScenarioError, short_error
from harness.spec import ConformanceProbe, Evidence, Fault, FaultContext

SHAPES = (
    "isolate",
    "halves",
    "fixed-halves",
    "majorities-ring",
    "bridge",
    "one-way",
    "clients",
    "custom",
    "random",
)
#: What ``shape: random`` draws from (by the step's seed): the shapes that need no parameters.
RANDOM_SHAPES = ("isolate", "halves", "majorities-ring", "bridge", "one-way")
TOXIC = "brokerchaos_partition"


def _pairs(groups: Sequence[Sequence[str]]) -> list[list[str]]:
    """Symmetric cuts between every pair of nodes in different groups."""
    out = []
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            for x in a:
                for y in b:
                    out += [[x, y], [y, x]]
    return out


def _member(node: Any, nodes: Sequence[str], field: str, fault: str = "partition") -> str:
    """A node a scenario names must exist: a link to an unknown node would fail only mid-run."""
    if node not in nodes:
        raise ScenarioError(f"{fault}: {field} {node!r} is not one of {list(nodes)}")
    return node


def partition_cuts(
    shape: str, nodes: Sequence[str], rng: random.Random, params: Mapping[str, Any]
) -> tuple[list[list[str]], dict[str, Any]]:
    """Directed cuts for a shape, plus a description of the groups (what the history shows)."""
    nodes = list(nodes)
    n = len(nodes)
    if n < 2 and shape != "clients":
        raise ScenarioError(f"partition shape {shape!r} needs at least 2 nodes")
    if shape == "isolate":
        victim = _member(params.get("node") or rng.choice(nodes), nodes, "node")
        rest = [x for x in nodes if x != victim]
        return _pairs([[victim], rest]), {"groups": [[victim], rest]}
    if shape in ("halves", "fixed-halves"):
        order = sorted(nodes) if shape == "fixed-halves" else rng.sample(nodes, n)
        half = n // 2
        groups = [order[:half], order[half:]]
        return _pairs(groups), {"groups": groups}
    if shape == "majorities-ring":
        # Each node hears itself and the next m-1 nodes of a shuffled ring: every node
        # sees a majority, and no two nodes see the same one.
        ring = rng.sample(nodes, n)
        m = n // 2 + 1
        sees = {ring[i]: {ring[(i + k) % n] for k in range(m)} for i in range(n)}
        cuts = [[src, dst] for dst in ring for src in ring if src != dst and src not in sees[dst]]
        return cuts, {"ring": ring, "sees": {k: sorted(v) for k, v in sees.items()}}
    if shape == "bridge":
        if n < 3:
            raise ScenarioError("partition shape 'bridge' needs at least 3 nodes")
        order = rng.sample(nodes, n)
        bridge = order[0]
        rest = order[1:]
        half = len(rest) // 2
        a, b = rest[:half], rest[half:]
        return _pairs([a, b]), {"groups": [a + [bridge], b + [bridge]], "bridge": bridge}
    if shape == "one-way":
        src = _member(params.get("from") or rng.choice(nodes), nodes, "from")
        dst = _member(params.get("to") or rng.choice([x for x in nodes if x != src]), nodes, "to")
        if src == dst:
            raise ScenarioError(
                f"partition shape 'one-way': from and to are both {src!r}; a node always hears itself"
            )
        return [[src, dst]], {"deaf": dst, "unheard": src}
    if shape == "custom":
        given = params.get("cuts")
        if not isinstance(given, list) or not all(isinstance(c, list) and len(c) == 2 for c in given):
            raise ScenarioError("partition shape 'custom' needs cuts: [[src, dst], ...]")
        return [[_member(a, nodes, "cuts"), _member(b, nodes, "cuts")] for a, b in given], {}
    raise ScenarioError(f"partition: unknown shape {shape!r}; use one of {', '.join(SHAPES)}")


def toxic_name(base: str, fault_id: str, stream: str) -> str:
    """One name per fault and stream: overlapping faults each add and remove their own toxics."""
    return f"{base}_{fault_id}_{stream}" if fault_id else f"{base}_{stream}"


class _ProxyFault(Fault):
    """Every kind that works through the Toxiproxy sidecars shares one final heal."""

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        return {"proxies": heal_network(ctx.cluster)}


class Partition(_ProxyFault):
    """Cut links between nodes through the Toxiproxy sidecars.

    ``shape``: the cut (``random`` draws one by the seed; default ``halves``); ``mode``:
    ``drop`` (connections stay open and go silent) or ``refuse`` (proxies disabled: open
    connections close, new ones are refused; symmetric cuts only).

    The heal closes every connection the cut held, in either mode: a proxy never lets a stream
    with a hole through, so clients and peers reconnect after a partition rather than resume the
    connection they had (a broker's own heartbeats may have closed it sooner). A cut that TCP
    survives, every connection resuming where it stopped, is ``packet-loss`` at ``loss: 100``.
    ``role`` (every kind takes it) aims the cut at the nodes of one role only.
    """

    name = "partition"
    requires = frozenset({"partition"})
    #: Each cut link's byte counters as ``heal`` found them, before it removed anything.
    before_heal: dict[str, Any] | None = None
    conformance = ConformanceProbe(params={"shape": "isolate", "node": "n1"}, nodes=2)
    params_schema = {
        "shape": SHAPES,
        "mode": ("drop", "refuse"),
        "node": str,
        "from": str,
        "to": str,
        "cuts": list,
        "nodes": list,
    }

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        shape = params.get("shape", "halves")
        mode = params.get("mode", "drop")  # values were checked against params_schema above
        if shape == "random":
            usable = [
                x
                for x in RANDOM_SHAPES
                if (len(nodes) >= 3 or x != "bridge")
                and (mode == "drop" or x not in ("one-way", "majorities-ring"))
            ]  # refuse: symmetric only
            shape = rng.choice(usable)
        if shape == "clients":
            targets = params.get("nodes") or [params.get("node") or rng.choice(list(nodes))]
            for node in targets:
                _member(node, nodes, "nodes")
            return {"shape": shape, "mode": mode, "clients_cut_from": list(targets), "cuts": []}
        cuts, desc = partition_cuts(shape, nodes, rng, params)
        if mode == "refuse":
            directed = {tuple(c) for c in cuts}
            if any((d, s) not in directed for s, d in directed):
                raise ScenarioError(f"partition shape {shape!r} is asymmetric: use mode 'drop'")
        return {"shape": shape, "mode": mode, "cuts": cuts, **desc}

    # -- apply / heal ------------------------------------------------------------------

    def _links(self, src: str, dst: str) -> list[tuple[str, str, str]]:
        """(sidecar node, proxy, stream) carrying src's bytes to dst."""
        cluster = self.ctx.cluster
        out = []
        for p in cluster.topology.proxies[src]:
            if p.dst == dst:
                out.append((src, p.name, "upstream"))
        for p in cluster.topology.proxies[dst]:
            if p.dst == src:
                out.append((dst, p.name, "downstream"))
        return out

    @classmethod
    def switches_proxies(cls, params: Mapping[str, Any]) -> bool:
        return params.get("shape") == "clients" or params.get("mode") == "refuse"

    @classmethod
    def cuts_off(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[str]:
        """Both ends of every cut (the ``clients`` shape cuts no peer link)."""
        return {n for cut in params.get("cuts", []) for n in cut}

    def _toxic(self, stream: str) -> str:
        return toxic_name(TOXIC, self.fault_id, stream)

    def _switched_proxies(self) -> list[tuple[str, str]]:
        """(sidecar, proxy) pairs that the ``clients`` shape and ``refuse`` mode disable."""
        if self.params["shape"] == "clients":
            topology = self.ctx.cluster.topology
            return [
                (node, p.name)
                for node in self.params["clients_cut_from"]
                for p in topology.proxies[node]
                if p.src == "client"
            ]
        return [
            (src, p.name)
            for src, dst in self.params["cuts"]
            for p in self.ctx.cluster.topology.proxies[src]
            if p.dst == dst
        ]

    def _switch(self, enabled: bool) -> dict[str, Any]:
        done = []
        for sidecar, proxy in self._switched_proxies():
            self.ctx.cluster.nodes[sidecar].toxiproxy.set_enabled(proxy, enabled)
            done.append({"sidecar": sidecar, "proxy": proxy, "action": "enable" if enabled else "disable"})
        return {"actions": done}

    def apply(self) -> dict[str, Any]:
        cluster = self.ctx.cluster
        done: list[dict[str, Any]] = []
        if self.params["shape"] == "clients" or self.params["mode"] == "refuse":
            return self._switch(False)
        for src, dst in self.params["cuts"]:
            for sidecar, proxy, stream in self._links(src, dst):
                toxic = self._toxic(stream)
                cluster.nodes[sidecar].toxiproxy.add_toxic(
                    proxy, name=toxic, type="timeout", stream=stream, attributes={"timeout": 0}
                )
                done.append(
                    {
                        "sidecar": sidecar,
                        "proxy": proxy,
                        "toxic": toxic,
                        "type": "timeout",
                        "stream": stream,
                        "attributes": {"timeout": 0},
                    }
                )
        return {"actions": done}

    def heal(self) -> dict[str, Any]:
        cluster = self.ctx.cluster
        done: list[dict[str, Any]] = []
        self.before_heal = counted_now(cluster, self.cut_links())
        if self.params["shape"] == "clients" or self.params["mode"] == "refuse":
            return self._switch(True)
        cut: dict[tuple[str, str], list[str]] = {}
        for src, dst in self.params["cuts"]:
            for sidecar, proxy, stream in self._links(src, dst):
                cut.setdefault((sidecar, proxy), []).append(self._toxic(stream))
        for (sidecar, proxy), toxics in sorted(cut.items()):
            # Each removal closes the proxy's open connections (they lost bytes to the
            # toxic) before its stream passes again; a proxy's toxics go one after the other.
            for toxic in sorted(set(toxics)):
                cluster.nodes[sidecar].toxiproxy.remove_toxic(proxy, toxic)
            done.append(
                {"sidecar": sidecar, "proxy": proxy, "removed": sorted(set(toxics)), "connections": "closed"}
            )
        return {"actions": done}

    # -- evidence ----------------------------------------------------------------------

    def cut_links(self) -> list[dict[str, Any]]:
        """Every link the plan says is cut, worked out from the parameters and the topology (not
        from what ``apply`` did, so that an ``apply`` that forgets a link is caught)."""
        topology = self.ctx.cluster.topology
        if self.params["shape"] == "clients":
            return [
                {"cut": f"clients->{node}", "sidecar": node, "proxy": p.name, "disabled": True}
                for node in self.params["clients_cut_from"]
                for p in topology.proxies[node]
                if p.src == "client"
            ]
        if self.params["mode"] == "refuse":
            return [
                {"cut": f"{src}->{dst}", "sidecar": src, "proxy": p.name, "disabled": True}
                for src, dst in self.params["cuts"]
                for p in topology.proxies[src]
                if p.dst == dst
            ]
        return [
            {
                "cut": f"{src}->{dst}",
                "sidecar": sidecar,
                "proxy": proxy,
                "stream": stream,
                "toxic": self._toxic(stream),
            }
            for src, dst in self.params["cuts"]
            for sidecar, proxy, stream in self._links(src, dst)
        ]

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """While held: a probe across each cut link stalls or is refused, and each link's proxy shows
        the cut; its byte counters are read first, to be read again before the heal."""
        links = self.cut_links()
        at_cut = counted_now(self.ctx.cluster, links)
        probes = probe_links(self.ctx.cluster, links)
        return held_evidence(links, probes, readback(self.ctx.cluster, links), at_cut)

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """After the heal: every link passes again; nothing crossed a cut link while held (the
        counters read by ``heal`` before it removed anything)."""
        links = self.cut_links()
        after = probe_links(self.ctx.cluster, links)
        return healed_evidence(applied, after, self.before_heal, counted_now(self.ctx.cluster, links))


class LinkToxic(_ProxyFault):
    """Degrade links without cutting them: latency (+jitter), bandwidth, slicer, slow_close, limit_data,
    or reset_peer (each connection reset with a TCP RST ``timeout`` ms after the toxic meets it; every
    reconnection within the window is reset again).

    With the project's Toxiproxy server, a toxic change on a proxy that already
    carries a data-passing toxic (the second stream's toxic on apply, each removal
    on heal) closes that proxy's open connections rather than dropping the bytes
    the old toxic held (``tools/toxiproxy-server/README.md``): clients of a degraded
    link see a reconnect at the start and the end of the fault, never a gap. Removing a
    ``reset_peer`` (which discards the stream it holds until the reset) closes the
    connections it held, as removing a partition's ``timeout`` toxic does.
    """

    name = "degrade"
    requires = frozenset({"partition"})
    TYPES = ("latency", "bandwidth", "slicer", "slow_close", "limit_data", "reset_peer")
    params_schema = {
        "type": TYPES,
        "attributes": dict,
        "node": str,
        "links": ("peers", "clients", "all"),
        "stream": ("upstream", "downstream", "both"),
        "toxicity": float,
    }
    #: Every client connection of the node reset as it meets the toxic: its clients go elsewhere.
    sheds_clients = {"type": "reset_peer", "links": "clients"}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        kind = params.get("type", "latency")  # values were checked against params_schema above
        defaults = {
            "latency": {"latency": 200, "jitter": 50},
            "bandwidth": {"rate": 64},
            "slicer": {"average_size": 64, "size_variation": 32, "delay": 1000},
            "slow_close": {"delay": 1000},
            "limit_data": {"bytes": 4096},
            "reset_peer": {"timeout": 0},
        }
        node = _member(params.get("node", rng.choice(list(nodes))), nodes, "node", cls.name)
        if kind == "reset_peer" and float(params.get("toxicity", 1.0)) != 1.0:
            raise ScenarioError(f"{cls.name}: reset_peer resets every connection; toxicity must be 1")
        return {
            "type": kind,
            "attributes": {**defaults[kind], **params.get("attributes", {})},
            "node": node,
            "links": params.get("links", "peers"),
            "stream": params.get("stream", "both"),
            "toxicity": float(params.get("toxicity", 1.0)),
        }

    @classmethod
    def cuts_off(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[str]:
        """Its node, when its peer links reset every connection; the other types slow links down."""
        return {params["node"]} if params["type"] == "reset_peer" and params["links"] != "clients" else set()

    def _targets(self) -> list[tuple[str, str]]:
        cluster = self.ctx.cluster
        node = self.params["node"]
        out = []
        for p in cluster.topology.proxies[node]:
            is_client = p.src == "client"
            if self.params["links"] == "all" or (self.params["links"] == "clients") == is_client:
                out.append((node, p.name))
        return out

    def _toxic(self, stream: str) -> str:
        return toxic_name(f"brokerchaos_{self.params['type']}", self.fault_id, stream)

    def _streams(self) -> list[str]:
        s = self.params["stream"]
        return ["upstream", "downstream"] if s == "both" else [s]

    def apply(self) -> dict[str, Any]:
        done = []
        for sidecar, proxy in self._targets():
            for stream in self._streams():
                name = self._toxic(stream)
                self.ctx.cluster.nodes[sidecar].toxiproxy.add_toxic(
                    proxy,
                    name=name,
                    type=self.params["type"],
                    stream=stream,
                    toxicity=self.params["toxicity"],
                    attributes=self.params["attributes"],
                )
                done.append(
                    {
                        "sidecar": sidecar,
                        "proxy": proxy,
                        "toxic": name,
                        "type": self.params["type"],
                        "stream": stream,
                        "attributes": self.params["attributes"],
                    }
                )
        return {"actions": done}

    def heal(self) -> dict[str, Any]:
        done = []
        for sidecar, proxy in self._targets():
            for stream in self._streams():
                name = self._toxic(stream)
                self.ctx.cluster.nodes[sidecar].toxiproxy.remove_toxic(proxy, name)
                done.append({"sidecar": sidecar, "proxy": proxy, "removed": name})
        return {"actions": done}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """Each degraded link's proxy carries the toxic (the servers' own account), and a probe's
        round trip while held (compare a latency toxic's with the probe after the heal)."""
        links = [
            {"cut": f"{sidecar}/{proxy}", "sidecar": sidecar, "proxy": proxy, "toxic": self._toxic(stream)}
            for sidecar, proxy in self._targets()
            for stream in self._streams()
        ]
        api = readback(self.ctx.cluster, links)
        rows = [{**lk, "api": api[f"{lk['sidecar']}/{lk['proxy']}"]} for lk in links]
        present = [r for r in rows if r["toxic"] in (r["api"].get("toxics") or [])]
        facts = {"links": rows}
        if not rows:
            return Evidence.unmeasured("no link to degrade", facts)
        if not present:
            return Evidence.none(
                f"none of the {len(rows)} {self.params['type']} toxic(s) is on its proxy", facts
            )
        missing = tuple(
            f"{r['cut']}: toxic {r['toxic']} is not on the proxy" for r in rows if r not in present
        )
        return Evidence.bit(
            f"{self.params['type']} on {len(present)} of {len(rows)} link stream(s) (Toxiproxy's account)",
            facts,
            flags=missing,
        )


def heal_network(cluster: Any) -> dict[str, Any]:
    """Reset every sidecar: all proxies enabled, no toxics. Idempotent; used by the final heal and ``down``."""
    done = {}
    for name, node in cluster.nodes.items():
        if node.toxiproxy is None:
            continue
        try:
            node.toxiproxy.reset()
            done[name] = "reset"
        except Exception as exc:  # noqa: BLE001 - report, keep healing the others
            done[name] = f"failed: {short_error(exc)}"
    failed = {k: v for k, v in done.items() if v != "reset"}
    if failed:
        raise FaultError(f"could not reset the proxies of {failed}")
    return done
