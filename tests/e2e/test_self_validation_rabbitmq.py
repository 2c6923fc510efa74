"""The harness must catch what it claims to catch, on the real RabbitMQ 3.10 (reference/faults.md,
"Validating the faults"; reference/mirrored-queues.md): promoting an unsynced mirror of a classic
mirrored queue loses confirmed messages, and waiting for a synced one loses none. The reference
broker's half is test_self_validation.py (a file of its own so the two halves run at once on the
two test workers). If these fail, the fault or the checker is wrong.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_promoting_an_unsynced_mirror_loses_confirmed_messages(brokerchaos) -> None:  # type: ignore[no-untyped-def]
    """RabbitMQ classic mirrored queue, ha-promote-on-failure=always (reference/mirrored-queues.md)."""
    r = brokerchaos("run", "scenarios/rabbitmq-unsynced-mirror.yaml", "--checker", "python")
    assert r.code == 1, r.explain()
    res = r.results
    assert res["counts"]["lost"] > 0
    assert {row["fault_kind"] for row in res["attribution"]["rows"]} == {"kill"}


def test_when_synced_waits_for_the_master_and_loses_nothing(brokerchaos) -> None:  # type: ignore[no-untyped-def]
    r = brokerchaos("run", "scenarios/rabbitmq-unsynced-mirror-when-synced.yaml", "--checker", "python")
    assert r.code == 0, r.explain()
    c = r.results["counts"]
    assert c["lost"] == 0 and c["confirmed"] > 1000
    # The queue was unavailable while its master was down: publishes went unconfirmed
    # (nacked by the broker, or unknown when no answer came).
    assert c["failed"] + c["unknown"] > 100
