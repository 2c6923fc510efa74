"""The project's own chaos suite, written as a user writes one: a few lines per test.

Short durations keep it to CI budgets; the scenarios are the shipped ones. Sync flush under power
loss is tests/e2e/test_self_validation.py's (the same scenario, two cuts instead of one, more than a
thousand confirmed); a run of it here proved nothing more.
``--broker``, ``--chaos-seed``, ``--chaos-runs`` and ``--chaos-duration`` apply.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.docker, pytest.mark.slow]


def test_crash_keeps_confirmed_messages(chaos_run) -> None:
    """A shipped scenario (flush: sync) cut short, one kill: durable, and the kill applied."""
    result = chaos_run(
        "scenarios/crash.yaml",
        duration=10,
        nemesis={"schedule": [{"at": 4, "fault": "kill", "hold": 2}], "settle": 2},
    )
    result.assert_durable()
    assert result.results["counts"]["confirmed"] > 0
    kills = [op for op in result.history() if op["f"] == "kill" and op["type"] == "ok"]
    assert kills, "the kill was never applied"


@pytest.mark.chaos(nodes=1)
def test_a_cut_client_link_refuses_clients_until_healed(chaos_cluster) -> None:
    import pika
    import pika.exceptions

    host, port = chaos_cluster.client_endpoints()["n1"]
    params = pika.ConnectionParameters(
        host, port, connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5
    )
    pika.BlockingConnection(params).close()
    proxy = chaos_cluster.nodes["n1"].toxiproxy
    proxy.set_enabled("client_to_n1", False)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params)
    proxy.set_enabled("client_to_n1", True)
    pika.BlockingConnection(params).close()
