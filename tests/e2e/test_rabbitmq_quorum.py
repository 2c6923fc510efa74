"""The real RabbitMQ 3.10 with quorum queues under random halves partitions, short
(scenarios/rabbitmq-jepsen-2014-quorum.yaml on 3 nodes; the body is tests/e2e/rabbitmq_halves.py's,
shared with the classic mirrored queues' file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.rabbitmq_halves import random_halves_partitions_short

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_random_halves_partitions_short(spark_checked, tmp_path: Path) -> None:
    random_halves_partitions_short(spark_checked, tmp_path, "scenarios/rabbitmq-jepsen-2014-quorum.yaml")
