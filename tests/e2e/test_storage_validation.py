"""Storage faults validated on the reference broker (reference/faults.md, "Validating the faults").

Coordinated power cuts must cost nothing confirmed when the broker fsyncs before it confirms
(flush: sync) and must lose confirmed messages when it does not (flush: async); a disk that lies
about fsync must make the harness find the loss, tied to the lie's window. One node each, to keep
them short; the cluster's cold start is tested on loopback (tests/broker_impl/cluster/test_cold_start.py).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_coordinated_power_loss_costs_nothing_with_sync_flush(shipped) -> None:
    shipped("reference-power-loss-coordinated").assert_lost_nothing()


def test_coordinated_power_loss_loses_confirmed_messages_with_async_flush(shipped) -> None:
    res = shipped("reference-power-loss-coordinated-async").assert_lost_some()
    assert {row["fault_kind"] for row in res["attribution"]["rows"]} == {"power-loss-coordinated"}


def test_a_lying_fsync_then_a_power_cut_loses_what_was_confirmed(shipped) -> None:
    res = shipped("reference-fsync-lie").assert_lost_some()
    assert "fsync-lie" in {row["fault_kind"] for row in res["attribution"]["rows"]}
