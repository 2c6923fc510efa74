"""Fixtures shared by the fault tests that run real node inits on this machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.local_nodes import local_inits
from tests.faults.test_nodeinit import Init


@pytest.fixture
def one_init() -> Iterator[dict[str, Init]]:
    """One node init (``n1``) over a broker stand-in that ticks, torn down after the test."""
    with local_inits(["n1"]) as inits:
        yield inits
