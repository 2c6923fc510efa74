"""Shared fixtures for the harness unit tests (no Docker, no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.host import Host

HERE = Path(__file__).resolve().parent


@pytest.fixture
def fixture_plugins(monkeypatch: pytest.MonkeyPatch) -> str:
    """Make ``fixture_plugins.<name>`` importable; returns the package name."""
    monkeypatch.syspath_prepend(str(HERE))
    return "fixture_plugins"


@pytest.fixture(scope="session")
def host() -> Host:
    """Every installed plugin, loaded once (loading is pure: imports and registrations)."""
    return Host.load()
