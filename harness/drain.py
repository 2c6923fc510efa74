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

A node whose visit says the cluster answered that the queue does not exist (``NoCopy`` with
``gone``) is named under ``gone`` instead. A round in which every node answered so (and nothing
new was consumed) ends the drain ``ok`` with ``gone`` in its value: the cluster itself says
there is nothing left to read, so what was confirmed and never consumed is lost, not
unreachable; the checkers do not count such a drain as the queue answering (it never came
back). A round in which only some nodes answered so (the others empty, erroring or holding
no copy) is not an empty one, and the rounds go on as for any node that did not report empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.spec.client import DrainReader, DrainUnfinished, NoCopy
from harness.spec.history import Recorder


@dataclass(frozen=True)
class DrainEnd:
    """How a drain's rounds ended: ``empty`` when one full round found every node empty and
    consumed nothing new, or every node answered that the queue does not exist (then ``gone``
    too); otherwise ``unreached`` holds the nodes the last round did not get to before the
    time ran out."""

    empty: bool
    unreached: tuple[str, ...] = ()
    gone: bool = False

    def why(self, queue: str, timeout: float, errors: Mapping[str, str | None]) -> str:
        """The one line an unfinished drain records: every node's error, and every node the
        time ran out before (so a node that was never reached is named, not left out)."""
        parts = [f"{n}: {e}" for n, e in errors.items() if e]
        parts += [
            f"{n}: the time ran out before the drain reached it" for n in self.unreached if not errors.get(n)
        ]
        return f"not every node reported {queue} empty within {timeout:g}s" + (
            ": " + "; ".join(parts) if parts else ""
        )


MAX_ROUNDS = 100
"""A drain op's value records at most this many rounds: the first ones and the last."""


def add_round(
    rounds: list[dict[str, Any]],
    now_ns: int,
    consumed: int,
    empty: list[str],
    errors: Mapping[str, str | None],
) -> None:
    """Append one round as a drain op's value records it (``harness.spec.results.DrainRound``),
    keeping the first MAX_ROUNDS - 1 rounds and the last."""
    rounds[MAX_ROUNDS - 1 :] = []
    rounds.append(
        {
            "end_ns": now_ns,
            "consumed": consumed,
            "empty": list(empty),
            "errors": {n: e for n, e in errors.items() if e and n not in empty},
        }
    )


async def drain_rounds(
    nodes: Sequence[str],
    visit: Callable[[str], Awaitable[bool | NoCopy]],
    consumed: Callable[[], int],
    left: Callable[[], float],
    pause: float,
    on_round: Callable[[list[str]], None] | None = None,
) -> DrainEnd:
    """A drain's rounds: visit every node in turn until one full round finds every node empty
    and consumes nothing new, or the time ``left`` runs out. ``visit`` drains through one node
    and says whether that node reported the queue empty, or that it holds no copy to drain
    (``NoCopy``: left out of the rule, but a round in which no node at all served reads is not
    an empty one); ``on_round`` hears after each round (also one the time cut short) which
    nodes reported empty, so the drain can record every round: a queue that does not answer is
    tried again round after round, and one that comes back late within the time is drained then.
    A round in which every node answered that the queue does not exist (``NoCopy.gone``) and
    nothing new was consumed ends the rounds ``gone``; one in which only some did is not empty."""
    while True:
        before = consumed()
        every_empty = True
        empty: list[str] = []
        gone = 0
        for i, node in enumerate(nodes):
            if left() <= 0:
                if on_round is not None:
                    on_round(empty)
                return DrainEnd(False, tuple(nodes[i:]))
            got = await visit(node)
            if isinstance(got, NoCopy):
                gone += got.gone
                every_empty = every_empty and not got.gone
                continue
            if got:
                empty.append(node)
            else:
                every_empty = False
        if on_round is not None:
            on_round(empty)
        if gone and gone == len(nodes) and consumed() == before:
            return DrainEnd(True, gone=True)
        if every_empty and empty and consumed() == before:
            return DrainEnd(True)
        if left() <= 0:
            return DrainEnd(False)
        if not every_empty or not empty:
            await asyncio.sleep(min(pause, max(0.0, left())))


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
    gone: dict[str, str] = {}  # the nodes whose last answer was that the queue does not exist

    def left() -> float:
        return deadline - loop.time()

    async def visit(node: str) -> bool | NoCopy:
        got = await reader.visit(node, left)
        no_copy.pop(node, None)
        gone.pop(node, None)
        if isinstance(got, NoCopy):
            (gone if got.gone else no_copy)[node] = got.why
        return got

    def on_round(empty: list[str]) -> None:
        add_round(rounds, recorder.now_ns(), reader.consumed, empty, errors())
        for key, named in (("no_copy", no_copy), ("gone", gone)):
            if named:
                rounds[-1][key] = sorted(named)

    def errors() -> dict[str, str | None]:
        return {n: v.get("error") for n, v in reader.views().items()}

    def value() -> dict[str, Any]:
        out = {"consumed": reader.consumed, "nodes": reader.views(), "rounds": rounds}
        for key, named in (("no_copy", no_copy), ("gone", gone)):
            if named:
                out[key] = dict(named)
        return out

    inv = recorder.invoke(process, "drain", queue=queue)
    try:
        end: DrainEnd = await drain_rounds(
            list(nodes), visit, lambda: reader.consumed, left, pause, on_round=on_round
        )
        if end.empty:
            inv.ok({**(await reader.extra()), **value()})
            return reader.consumed
    except asyncio.CancelledError:
        inv.info("drain cancelled", value())
        raise
    seen = errors()
    for node, why in no_copy.items():
        seen[node] = seen.get(node) or f"holds no copy to drain ({why})"
    for node, why in gone.items():
        seen[node] = seen.get(node) or f"the cluster says the queue does not exist ({why})"
    why = end.why(queue, timeout, seen)
    if (no_copy or gone) and len(no_copy) + len(gone) == len(nodes):
        why += "; no node served reads of it"
    inv.info(why, {**(await reader.extra()), **value()})
    raise DrainUnfinished(reader.consumed, why)
