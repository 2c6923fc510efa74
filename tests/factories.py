"""A fixture's factory of things a test starts and the fixture ends afterwards (nodes, servers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

N = TypeVar("N")


def made_and_ended(build: Callable[..., N], end: Callable[[N], object]) -> Iterator[Callable[..., N]]:
    """Yield a factory that ``build``s each thing the test asks for; ``end`` every one afterwards."""
    made: list[N] = []

    def make(*args: Any, **kwargs: Any) -> N:
        made.append(build(*args, **kwargs))
        return made[-1]

    yield make
    for n in made:
        end(n)
