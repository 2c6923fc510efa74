"""The final drain's rounds, run by the harness over a driver's ``DrainReader``.

The driver knows how to read one queue through one node (a visit); the harness visits
every node in turn, round after round, until one full round finds every node that serves
reads empty with nothing new consumed (``harness.spec.client.drain_rounds``), or
``workload.drain_timeout`` runs out. It records the ``drain`` op (``harness.spec.history``):
``ok`` with the reader's per-node views, what it consumed and every round
(``harness.spec.results.DrainRound``), or ``info`` saying which node did not report empty and
why. A node whose visit says it holds no copy to drain (``NoCopy``: a replica that refuses
consumes) is named under ``no_copy`` in the value and in each round, and is never counted as
empty: a round in which no node served reads is not an empty one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from harness.spec.client import DrainEnd, DrainReader, DrainUnfinished, NoCopy, add_round, drain_rounds
from harness.spec.history import Recorder

#: Seconds between two rounds that did not find every node empty (a node that is still coming back).
ROUND_PAUSE = 0.5


async def run_drain(
    reader: DrainReader,
    recorder: Recorder,
    process: str,
    queue: str,
    nodes: Sequence[str],
    *,
    timeout: float,
    pause: float = ROUND_PAUSE,
) -> int:
    """Drain ``queue`` through every node of ``nodes`` (in that order each round); returns what
    was consumed, or raises ``DrainUnfinished`` after recording the drain ``info``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    rounds: list[dict[str, Any]] = []
    no_copy: dict[str, str] = {}

    def left() -> float:
        return deadline - loop.time()

    async def visit(node: str) -> bool | NoCopy:
        got = await reader.visit(node, left)
        if isinstance(got, NoCopy):
            no_copy[node] = got.why
        else:
            no_copy.pop(node, None)
        return got

    def on_round(empty: list[str]) -> None:
        add_round(rounds, recorder.now_ns(), reader.consumed, empty, reader.errors())
        if no_copy:
            rounds[-1]["no_copy"] = sorted(no_copy)

    async def value() -> dict[str, Any]:
        out = {**(await reader.value()), "consumed": reader.consumed, "rounds": rounds}
        if no_copy:
            out["no_copy"] = dict(no_copy)
        return out

    inv = recorder.invoke(process, "drain", queue=queue)
    try:
        end: DrainEnd = await drain_rounds(
            list(nodes), visit, lambda: reader.consumed, left, pause, on_round=on_round
        )
        if end.empty:
            inv.ok(await value())
            return reader.consumed
    except asyncio.CancelledError:
        inv.info("drain cancelled", {"consumed": reader.consumed, "rounds": rounds})
        raise
    errors = dict(reader.errors())
    for node, why in no_copy.items():
        errors[node] = errors.get(node) or f"holds no copy to drain ({why})"
    why = end.why(queue, timeout, errors)
    if no_copy and len(no_copy) == len(nodes):
        why += "; no node served reads of it"
    inv.info(why, await value())
    raise DrainUnfinished(reader.consumed, why)
