"""Settings every test shares.

CI runs on a busy 2-core machine: Hypothesis's timing checks (a per-example
deadline, "input generation is slow", "data too large") fail there on no defect of
the code under test. The profile switches them off for every property test; a test
that needs another setting passes only that one to ``@settings``, and the rest comes
from here. ``filter_too_much`` is off too: a strategy that filters a lot is slow on a
busy machine, not wrong.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

SLOW_MACHINE_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("brokerchaos", deadline=None, suppress_health_check=SLOW_MACHINE_CHECKS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "brokerchaos"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A property test whose own ``@settings`` brings a timing check back fails here, by name.

    ``suppress_health_check=[...]`` replaces the profile's list instead of adding to it,
    so the slip is easy to make and would only show on a slow machine.
    """
    chosen = getattr(getattr(item, "obj", None), "_hypothesis_internal_use_settings", None)
    if chosen is None:
        return
    back = [h.name for h in SLOW_MACHINE_CHECKS if h not in chosen.suppress_health_check]
    if chosen.deadline is not None or back:
        on = ([f"deadline={chosen.deadline}"] if chosen.deadline is not None else []) + back
        pytest.fail(
            f"{item.nodeid}: its @settings turns {', '.join(on)} back on; keep deadline=None and extend "
            "the profile's list: suppress_health_check=[*settings().suppress_health_check, ...]",
            pytrace=False,
        )
