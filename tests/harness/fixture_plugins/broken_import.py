"""Fails to import, as a plugin with a missing dependency does."""

from __future__ import annotations

import brokerchaos_fixture_missing_dependency  # noqa: F401
