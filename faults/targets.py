"""Which nodes a multi-node fault hits: a named share of the cluster or an explicit list, made
concrete with the step's seeded RNG so that the plan (and ``--replay``) names the nodes."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from harness import ScenarioError

#: What ``nodes`` may say besides an explicit list of node names.
SHARES = ("all", "majority", "minority", "random")

T = TypeVar("T")


def share_size(share: str, n: int) -> int:
    """How many of ``n`` nodes a share names: a strict majority, or the largest strict minority
    (at least one node, so that a 1- or 2-node cluster still has a target)."""
    if share == "all":
        return n
    if share == "majority":
        return n // 2 + 1
    if share == "minority":
        return max(1, (n - 1) // 2)
    raise ValueError(share)


def pick_nodes(fault: str, spec: Any, nodes: Sequence[str], rng: random.Random) -> list[str]:
    """The concrete, sorted node list for ``spec`` (a share name or a list of node names)."""
    nodes = list(nodes)
    if isinstance(spec, list | tuple):
        picked = [str(n) for n in spec]
        unknown = [n for n in picked if n not in nodes]
        if unknown or not picked or len(set(picked)) != len(picked):
            raise ScenarioError(f"fault {fault}: nodes {list(spec)!r} must name distinct nodes among {nodes}")
        return sorted(picked, key=nodes.index)
    if spec not in SHARES:
        raise ScenarioError(
            f"fault {fault}: nodes {spec!r} is not allowed; use one of {', '.join(SHARES)} "
            "or a list of node names"
        )
    size = rng.randint(1, len(nodes)) if spec == "random" else share_size(spec, len(nodes))
    return sorted(rng.sample(nodes, size), key=nodes.index)


def on_each(names: Sequence[str], fn: Callable[[str], T]) -> tuple[dict[str, T], dict[str, str]]:
    """``fn(name)`` for every node at once: (results, errors) by node name."""
    done: dict[str, T] = {}
    errors: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = {name: pool.submit(fn, name) for name in names}
        for name, fut in futures.items():
            try:
                done[name] = fut.result()
            except Exception as exc:  # noqa: BLE001 - every node's outcome is reported, not the first failure
                errors[name] = f"{type(exc).__name__}: {exc}"
    return done, errors
