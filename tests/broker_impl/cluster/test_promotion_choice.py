"""Which mirror is promoted: the oldest live in-sync one, whatever the rule; without one, the rule decides.

RabbitMQ's stated promise for ``ha-promote-on-failure: when-synced`` (the change
that added the key): "unsynchronised slaves will not be promoted". Its 3.x code
takes the oldest live mirror and lets when-synced refuse only when no mirror is
in sync at all; that promotes an unsynchronised oldest mirror over an in-sync
younger one and loses what only the master held. Here the promise holds under
both rules.
"""

from __future__ import annotations

import pytest

from broker_impl.cluster.ha import promotion_candidate
from tests.broker_impl.cluster.conftest import drain, publish, queue_info, wait_for
from tests.broker_impl.cluster.test_mirroring import _mirrored_queue


@pytest.mark.parametrize(
    ("alive", "synced", "rule", "chosen"),
    [
        (
            ["n2", "n3"],
            {"n3"},
            "when-synced",
            "n3",
        ),  # an unsynced oldest mirror does not block a synced younger one
        (["n2", "n3"], {"n3"}, "always", "n3"),  # nor is it promoted while a synced one exists
        (["n2", "n3"], {"n2", "n3"}, "always", "n2"),  # both in sync: the oldest
        (
            ["n2", "n3"],
            set(),
            "always",
            "n2",
        ),  # none in sync: always takes the oldest (and loses what it lacks)
        (["n2", "n3"], set(), "when-synced", None),  # none in sync: when-synced waits for the master
        (["n3"], {"n2"}, "when-synced", None),  # the only synced mirror is down
        ([], set(), "always", None),
    ],
)
def test_the_oldest_live_in_sync_mirror_is_chosen(
    alive: list[str], synced: set[str], rule: str, chosen: str | None
) -> None:
    assert promotion_candidate(alive, synced, rule) == chosen


@pytest.mark.parametrize("rule", ["always", "when-synced"])
def test_an_unsynced_oldest_mirror_neither_blocks_nor_replaces_a_synced_younger_one(
    cluster_factory, rule: str
) -> None:
    """n2 mirrors first without the 50 old messages (manual sync); n3 joins later and is synced at once."""
    n1, n2, n3 = cluster_factory(3)
    q = "ha.pick"
    _mirrored_queue(
        [n1, n2, n3],
        q,
        {"ha-mode": "exactly", "ha-params": 2, "ha-promote-on-failure": rule},
        before=50,
        mirrors=1,
    )
    assert queue_info(n1, q)["mirrors"] == ["n2"] and queue_info(n1, q)["synchronised_mirrors"] == []
    n1.ctl(
        "set_policy",
        name="ha",
        pattern="^ha",
        definition={"ha-mode": "all", "ha-sync-mode": "automatic", "ha-promote-on-failure": rule},
    )
    wait_for(lambda: queue_info(n1, q)["synchronised_mirrors"] == ["n3"], what="n3 (only) in sync")
    assert queue_info(n1, q)["mirrors"] == ["n2", "n3"]  # n2 is the oldest
    publish(n2, q, range(50, 60))
    n1.kill()
    wait_for(lambda: queue_info(n3, q).get("node") == "n3", what="n3 promoted")
    assert "promoting the mirror here (in sync)" in n3.log()
    # drained through n2: it must know of the promotion too (a load-dependent lag otherwise)
    wait_for(lambda: queue_info(n2, q).get("node") == "n3", what="n2 sees n3 as the master")
    assert sorted(drain(n2, q)) == list(range(60))
