"""Debian 13's releases (trixie: one more root filesystem for all of them), each in a smoke-sized
run: the run ends with a verdict and records the version the running broker reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_current_versions import _durable_on

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_rabbitmq_4_0_quorum_on_mnesia(brokerchaos: Any, tmp_path: Path) -> None:
    r = _durable_on(brokerchaos, tmp_path, "scenarios/rabbitmq-4.0-quorum-smoke.yaml", "rabbitmq 4.0.")
    assert r.results["broker"]["running"].startswith("rabbitmq 4.0.5 on Mnesia"), r.results["broker"]


def test_nats_2_10(brokerchaos: Any, tmp_path: Path) -> None:
    res = _durable_on(brokerchaos, tmp_path, "scenarios/nats-2.10-smoke.yaml", "nats-server 2.10.").results
    assert res["broker"]["version"] == "2.10" and res["broker"]["suite"] == "trixie"


def test_redis_8_0_2(brokerchaos: Any, tmp_path: Path) -> None:
    _durable_on(brokerchaos, tmp_path, "scenarios/redis-8.0.2-smoke.yaml", "redis 8.0.2")


def test_valkey_8_1(brokerchaos: Any, tmp_path: Path) -> None:
    _durable_on(brokerchaos, tmp_path, "scenarios/valkey-8.1-smoke.yaml", "valkey 8.1.")
