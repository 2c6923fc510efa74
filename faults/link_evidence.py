"""Evidence that a cut stopped its links: probes across each cut link while held and after the heal,
and the Toxiproxy servers' own account of their proxies (toxics present, proxies disabled).

A link is one proxy in one sidecar (``faults.network``): the probe runs in that sidecar's network
namespace against the proxy's listen address, the address the broker itself dials
(``faults.node.probe``). A cut link must stall or refuse while held and pass again after the heal;
a link that passes while held is a cut that did not happen, whatever the API says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from faults.targets import on_each
from harness import FaultError
from harness.spec import Evidence

#: Seconds a probe waits for the far end (a stalled link costs this once per sidecar).
PROBE_WAIT = 1.5
STOPPED = ("stalled", "refused")


def link_key(link: Mapping[str, Any]) -> str:
    return f"{link['sidecar']}/{link['proxy']}"


def probe_links(cluster: Any, links: Sequence[Mapping[str, Any]], wait: float = PROBE_WAIT) -> dict[str, Any]:
    """Each link's probe result by ``sidecar/proxy`` (one exec per sidecar, its probes at once)."""
    listen = {
        (sidecar, p.name): p.listen
        for sidecar in {lk["sidecar"] for lk in links}
        for p in cluster.topology.proxies[sidecar]
    }
    by_sidecar: dict[str, list[str]] = {}
    for lk in links:
        address = listen.get((lk["sidecar"], lk["proxy"]))
        if address is not None and address not in by_sidecar.setdefault(lk["sidecar"], []):
            by_sidecar[lk["sidecar"]].append(address)

    def run(sidecar: str) -> dict[str, Any]:
        cmd = ["python3", "-m", "faults.node.probe", "--wait", str(wait), *by_sidecar[sidecar]]
        rc, out = cluster.nodes[sidecar].exec(cmd, timeout=60 + wait)
        try:
            return dict(json.loads(out.strip().splitlines()[-1])["probes"])
        except (ValueError, IndexError, KeyError):
            raise FaultError(
                f"{sidecar}: probing its proxies failed (exit {rc}): {out.strip()[-300:]}"
            ) from None

    replies, errors = on_each(sorted(by_sidecar), run)
    if errors:
        raise FaultError("; ".join(f"{n}: {e}" for n, e in sorted(errors.items())))
    out: dict[str, Any] = {}
    for lk in links:
        address = listen.get((lk["sidecar"], lk["proxy"]))
        found = replies.get(lk["sidecar"], {}).get(address) if address else None
        out[link_key(lk)] = {"address": address, **(found or {"result": "unknown", "error": "no such proxy"})}
    return out


def readback(cluster: Any, links: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What each link's Toxiproxy server says of its proxy: enabled, and its toxics."""
    sidecars = sorted({lk["sidecar"] for lk in links})
    proxies, errors = on_each(sidecars, lambda n: cluster.nodes[n].toxiproxy.proxies())
    out: dict[str, Any] = {}
    for lk in links:
        p = (proxies.get(lk["sidecar"]) or {}).get(lk["proxy"])
        out[link_key(lk)] = (
            {"enabled": p["enabled"], "toxics": p["toxics"]}
            if p
            else {"missing": errors.get(lk["sidecar"], "no such proxy")}
        )
    return out


def _in_place(link: Mapping[str, Any], api: Mapping[str, Any]) -> bool:
    if "toxic" in link:
        return link["toxic"] in (api.get("toxics") or [])
    return api.get("enabled") is False


def held_evidence(
    links: Sequence[Mapping[str, Any]], probes: Mapping[str, Any], api: Mapping[str, Any]
) -> Evidence:
    """Right after the cut: which links stopped, which still carried bytes, which lack their toxic."""
    rows = [
        {
            **lk,
            "held": probes[link_key(lk)],
            "api": api[link_key(lk)],
            "in_place": _in_place(lk, api[link_key(lk)]),
        }
        for lk in links
    ]
    stopped = [r for r in rows if r["held"].get("result") in STOPPED]
    flags = tuple(
        f"{r['cut']} still carried bytes through {r['sidecar']}'s proxy {r['proxy']} while cut"
        for r in rows
        if r["held"].get("result") == "passes"
    ) + tuple(
        f"{r['cut']}: {r['sidecar']}'s proxy {r['proxy']} does not show the cut ({r['api']})"
        for r in rows
        if not r["in_place"]
    )
    facts = {"links": rows}
    if not rows:
        return Evidence.unmeasured("no link to probe", facts)
    if not stopped:
        return Evidence.none(
            f"no connection across the cut was stopped: all {len(rows)} probe(s) passed", facts, flags=flags
        )
    return Evidence.bit(f"{len(stopped)} of {len(rows)} cut link(s) stopped while held", facts, flags=flags)


def healed_evidence(applied: Evidence, after: Mapping[str, Any]) -> Evidence:
    """After the heal: a link that stalled while held and passes now was cut; one that stalls both
    times cannot be told from a peer that answers a probe with silence."""
    rows = [dict(r, after=after.get(link_key(r), {})) for r in applied.facts.get("links") or []]
    confirmed = [
        r for r in rows if r["held"].get("result") in STOPPED and r["after"].get("result") == "passes"
    ]
    silent = [
        r for r in rows if r["held"].get("result") == "stalled" and r["after"].get("result") == "stalled"
    ]
    results_after = [r["after"].get("result") for r in rows]
    restored = (
        True if all(x == "passes" for x in results_after) else False if "refused" in results_after else None
    )
    facts = {**applied.facts, "links": rows}
    summary = f"{applied.summary}; {len(confirmed)} confirmed by a probe that passes after the heal"
    if applied.effect is True and not confirmed and silent:
        return Evidence.unmeasured(
            f"probes inconclusive: {len(silent)} link(s) stalled while cut and after the heal too "
            "(the far end answers a probe with silence)",
            facts,
            flags=applied.flags,
            restored=restored,
        )
    return applied.with_heal(summary, facts, restored)
