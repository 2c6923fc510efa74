"""The harness must catch what it claims to catch (reference/faults.md, "Validating the faults").

A broker configured with async flush must lose confirmed messages under power
loss and must not under a plain crash; with sync flush it must lose none under
either. If these fail, the fault or the checker is wrong. RabbitMQ's mirrored queues, the same
check on a broker nobody here wrote, are in test_self_validation_rabbitmq.py: a file of their own,
so that their runs and this file's go to the two test workers at once.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_async_flush_loses_confirmed_messages_under_power_loss(shipped) -> None:
    res = shipped("power-loss-async").assert_lost_some()
    assert res["valid"] is False
    kinds = {row["fault_kind"] for row in res["attribution"]["rows"]}
    assert kinds == {"power-loss"}, res["attribution"]["rows"]


def test_sync_flush_loses_nothing_under_power_loss(shipped) -> None:
    shipped("power-loss").assert_lost_nothing()


def test_async_flush_loses_nothing_under_crash(shipped) -> None:
    shipped("crash-async").assert_lost_nothing()
