"""What tests build alike: a fixture's factory of things it ends afterwards (nodes, servers),
scenarios, and the settings of a property test that takes a fixture."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from harness.scenario import Scenario

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


def reference_scenario(
    nemesis: dict[str, Any], *, seed: int = 1, duration: float = 120, nodes: int = 3
) -> Scenario:
    """A scenario on the reference broker with this ``nemesis`` section: what planning tests plan from."""
    from harness.scenario import from_dict

    return from_dict(
        {
            "seed": seed,
            "broker": {"plugin": "reference", "nodes": nodes},
            "workload": {"duration": duration},
            "nemesis": nemesis,
        }
    )


def fixture_settings(max_examples: int, **more: Any) -> settings:
    """Hypothesis settings for a property test that takes a function-scoped fixture (a Spark
    engine, a node): the examples share one fixture, which these tests mean (it holds no state
    between examples), so hypothesis's health check against it is off."""
    return settings(
        max_examples=max_examples,
        suppress_health_check=[*settings().suppress_health_check, HealthCheck.function_scoped_fixture],
        **more,
    )
