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

from hypothesis import HealthCheck, settings

SLOW_MACHINE_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("brokerchaos", deadline=None, suppress_health_check=SLOW_MACHINE_CHECKS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "brokerchaos"))
