"""The final heal's outcome: the nodes it could not bring back, and the client nodes left to serve."""

from __future__ import annotations

from harness.spec.results import NodeDown
from spark_reports.engines.common import load_json


def nodes_down(nemesis_rows: list[dict]) -> tuple[list[NodeDown], list[str] | None]:
    """From the final heal's completion (``value.down`` and ``value.serving``, ``harness.spec.history``):
    each node that did not come back with why, and the client nodes that did (None when every node
    came back, as in a history written before the final heal recorded them)."""
    for r in sorted(nemesis_rows, key=lambda r: r["index"], reverse=True):
        value = load_json(r.get("value"))
        if r.get("f") != "heal" or r.get("type") == "invoke" or not value.get("final"):
            continue
        down = value.get("down") or {}
        if not down:
            return [], None
        out = [
            NodeDown(node=str(n), heal_ns=r["time_ns"], reason=str(why)) for n, why in sorted(down.items())
        ]
        return out, [str(n) for n in value.get("serving") or []]
    return [], None


def describe_down(down: list[NodeDown]) -> str:
    """The one line a verdict gives of the nodes that did not come back."""
    return "; ".join(
        f"{d['node']} did not come back after the final heal at {d['heal_ns'] / 1e9:.1f}s "
        f"({d['reason'].splitlines()[0] if d['reason'] else 'no reason recorded'})"
        for d in down
    )
