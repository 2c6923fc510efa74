"""The one verdict order (harness.spec.results): composition, exit status and validity."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from harness.spec.results import (
    EXIT_DURABLE,
    EXIT_FAILED,
    EXIT_UNKNOWN,
    VERDICT_ORDER,
    compose_verdicts,
    exit_status,
    valid_of,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", ["docs/explanation/verdicts.md", "docs/explanation/verdict-meaning.md"])
def test_the_order_is_the_one_the_docs_state(page: str) -> None:
    """Users read the order (worst first; the exit status follows it) on these pages: a reorder of
    ``Verdict`` fails here until they say it too, and so does a page that drifts."""
    [stated] = re.findall(r"LOST(?: > \w+)+", (REPO / page).read_text())
    assert tuple(stated.split(" > ")) == VERDICT_ORDER


@pytest.mark.parametrize(
    ("verdicts", "composed"),
    [
        (["durable"], "durable"),
        (["durable", "durable"], "durable"),
        (["durable", "INTEGRITY"], "INTEGRITY"),  # the case of issue 32: a failing second checker
        (["INTEGRITY", "durable"], "INTEGRITY"),
        (["unknown", "durable"], "unknown"),
        (["unknown", "DUPLICATED"], "DUPLICATED"),  # a definite failure outranks unknown
        (["UNAVAILABLE", "unknown"], "UNAVAILABLE"),
        (["INTEGRITY", "LOST", "unknown"], "LOST"),
        (["durable", "UNSYNCED"], "UNSYNCED"),  # a sync promise broken (the fault evidence)
        (["UNSYNCED", "LOST"], "LOST"),
        (["RESURRECTED", "DUPLICATED"], "RESURRECTED"),
        (["DUPLICATED", "DEAD_LETTERED"], "DEAD_LETTERED"),
        (["DEAD_LETTERED", "INTEGRITY"], "INTEGRITY"),
        ([], "unknown"),  # nothing judged the run
        (["durable", None], "unknown"),  # a checker that returned no verdict
        (["durable", "SOMETHING-NEW"], "unknown"),  # one this schema does not name
    ],
)
def test_compose(verdicts: list[str | None], composed: str) -> None:
    assert compose_verdicts(verdicts) == composed


def test_compose_is_the_worst_whatever_the_order() -> None:
    for a, b, c in itertools.product(VERDICT_ORDER, repeat=3):
        worst = min((a, b, c), key=VERDICT_ORDER.index)
        for perm in itertools.permutations((a, b, c)):
            assert compose_verdicts(perm) == worst


@pytest.mark.parametrize(
    ("verdict", "status", "valid"),
    [
        ("durable", EXIT_DURABLE, True),
        ("LOST", EXIT_FAILED, False),
        ("INTEGRITY", EXIT_FAILED, False),
        ("RESURRECTED", EXIT_FAILED, False),
        ("DUPLICATED", EXIT_FAILED, False),
        ("UNAVAILABLE", EXIT_FAILED, False),
        ("unknown", EXIT_UNKNOWN, "unknown"),
        (None, EXIT_UNKNOWN, "unknown"),
        ("SOMETHING-NEW", EXIT_UNKNOWN, "unknown"),
    ],
)
def test_exit_status_and_validity(verdict: str | None, status: int, valid: object) -> None:
    assert exit_status(verdict) == status
    assert valid_of(verdict) == valid
    assert (EXIT_DURABLE, EXIT_FAILED, EXIT_UNKNOWN) == (0, 1, 3)
