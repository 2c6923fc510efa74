"""The exposure window at a power cut: which messages the dropped writes held.

The node init keeps a copy of every unsynced write just before a cut drops it
(``faults.nodeinit``: ``unsynced.bin`` and ``index.json`` beside its control socket). A broker
plugin that declares ``unsynced-messages`` maps the dropped part of those writes to message ids
(``BrokerPlugin.unsynced_messages``); the harness then compares them with what the history says
was confirmed before the cut and with what the checkers found lost (``harness.evidence``).
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from harness import FaultError
from harness.spec import Evidence, UnsyncedWrite

CAPABILITY = "unsynced-messages"
READ = (
    "import base64, json, sys, zlib; d = sys.argv[1]; "
    "print(json.dumps({'index': json.load(open(d + '/index.json')), "
    "'data': base64.b64encode(zlib.compress(open(d + '/unsynced.bin', 'rb').read(), 1)).decode()}))"
)
"""Prints the saved index and bytes (compressed: a copy of message bodies compresses well, and
``docker exec`` carries a large output slowly)."""


def read_saved(node: Any, directory: str) -> tuple[list[dict[str, Any]], bytes, bool]:
    """The saved writes of ``node``'s latest cut: index entries, bytes, whether the copy was capped."""
    rc, out = node.exec(["python3", "-c", READ, directory], timeout=120)
    try:
        reply = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise FaultError(
            f"{node.name}: reading the cut's unsynced writes failed (exit {rc}): {out.strip()[-300:]}"
        ) from None
    index = reply["index"]
    return (
        list(index["writes"]),
        zlib.decompress(base64.b64decode(reply["data"])),
        bool(index.get("truncated")),
    )


def dropped_parts(
    index: Sequence[Mapping[str, Any]], data: bytes, files: Sequence[Mapping[str, Any]]
) -> list[UnsyncedWrite]:
    """The parts of the saved writes that the cut dropped (``files``: the cut's per-file ranges)."""
    dropped = {f["path"]: [tuple(r) for r in f.get("dropped_ranges") or []] for f in files}
    out: list[UnsyncedWrite] = []
    for w in index:
        start, end = int(w["offset"]), int(w["offset"]) + int(w["length"])
        for r_off, r_len in dropped.get(w["path"], []):
            lo, hi = max(start, r_off), min(end, r_off + r_len)
            if lo < hi:
                at = int(w["at"]) + lo - start
                out.append({"path": w["path"], "offset": lo, "data": data[at : at + hi - lo]})
    return out


class Pending:
    """The exposure of a cut's nodes, mapped while the fault is held and collected at its heal:
    reading and mapping a node's copy took 17 s on a loaded machine, and the cluster is down
    meanwhile, so it must not lengthen the hold. A node whose copy cannot be read gets a flag."""

    def __init__(self, cluster: Any, cuts: Mapping[str, Evidence]) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(cuts)))
        self._futures = {n: self._pool.submit(exposed, cluster, n, cut) for n, cut in cuts.items()}
        self._cuts = dict(cuts)

    def result(self) -> dict[str, Evidence]:
        out = {}
        for n, fut in self._futures.items():
            try:
                out[n] = fut.result()
            except Exception as exc:  # noqa: BLE001 - the cut happened: only its mapping failed
                out[n] = replace(
                    self._cuts[n],
                    flags=(*self._cuts[n].flags, f"{n}: mapping the dropped writes failed: {exc}"),
                )
        self._pool.shutdown()
        return out


def with_exposure(healed: Evidence, mapped: Mapping[str, Evidence]) -> Evidence:
    """The heal's evidence with what the mapping found: the ids, and per node their count."""
    ids = [e.exposed for e in mapped.values() if e.exposed is not None]
    if not ids and not any(e.flags for e in mapped.values()):
        return healed
    facts = {
        **healed.facts,
        "exposed_candidates": {n: e.facts.get("exposed_candidates") for n, e in mapped.items()},
    }
    flags = healed.flags + tuple(f for e in mapped.values() for f in e.flags if f not in healed.flags)
    exposed_ids = tuple(sorted({i for group in ids for i in group})) if ids else None
    return replace(healed, facts=facts, flags=flags, exposed=exposed_ids)


def exposed(cluster: Any, node: str, cut: Evidence) -> Evidence:
    """``cut`` with the ids of the messages its dropped writes held, when the plugin can tell."""
    plugin = getattr(cluster, "plugin", None)
    if plugin is None or CAPABILITY not in getattr(plugin, "capabilities", ()) or not cut.effect:
        return cut
    saved = cut.facts.get("unsynced_saved") or {}
    if not saved.get("saved"):
        return replace(
            cut, flags=(*cut.flags, f"{node}: no copy of the unsynced writes: {saved.get('error')}")
        )
    index, data, truncated = read_saved(cluster.nodes[node], saved["saved"])
    writes = dropped_parts(index, data, cut.facts.get("files") or [])
    ids = sorted(set(plugin.unsynced_messages(writes, cluster.settings, len(cluster.nodes))))
    facts = {**cut.facts, "exposed_candidates": len(ids), "copy_truncated": truncated}
    flags = cut.flags + (
        (f"{node}: the copy of the unsynced writes was capped: exposure undercounted",) if truncated else ()
    )
    return replace(cut, facts=facts, flags=flags, exposed=tuple(ids))
