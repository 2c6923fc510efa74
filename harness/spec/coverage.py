"""Coverage: the features a broker plugin declares, the events it reports, and the cells a run reaches.

A broker plugin declares its ``features`` (queue types, mirroring, transactions, delayed
messages, replication modes, membership, consumer behaviours) and says how a run shows it used
each one: broker settings, what the workload did (``WORKLOAD_USES``, read from the history),
the fault kinds that are themselves the feature (membership changes), or events the broker
reported. It reports notable internal events (``BrokerEvent``) from its collected logs: states
worth reaching (a promotion of an unsynced mirror, a flush timeout), not failures; Antithesis
calls them "sometimes" assertions.

A run's coverage is a set of cells ``(feature, fault kind, event)``: a feature in use while a
fault of that kind was held (or in the recovery after its heal, ``RECOVERY_NS``), with each
event the broker reported in that time as a cell of its own (``event`` None: the feature and the
fault alone). ``harness.coverage`` computes them; ``results.json`` keeps them under ``coverage``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

#: What a run's history can show the workload used, by name (a feature's ``workload``):
WORKLOAD_USES: dict[str, str] = {
    "publish": "a publish was sent",
    "transactions": "a transaction ended (a ``commit`` or ``rollback`` op)",
    "delay": "a delayed publish (``detail.delay_ms`` on a publish invoke)",
    "requeue": "a delivery given back with basic.nack/reject(requeue) (an ``abandon`` op)",
    "recover": "a delivery given back by basic.recover(requeue)",
    "close": "a channel closed with deliveries unacked",
    "crash": "a consumer's connection cut with deliveries unacked",
    "slow-ack": "a consumer that waits before each ack (``workload.consumer.slow``)",
    "ttl": "a message that expired: delivered from a dead-letter queue with reason ``expired``",
    "dead-letter": "a delivery from a dead-letter queue (``detail.dead_letter`` on a ``consume`` ok)",
}

#: The workload fields that drive a use: a broker plugin that declares no feature with that use
#: cannot run a scenario that sets the field (``harness.coverage.check_workload_features``).
WORKLOAD_FIELDS: dict[str, str] = {"ttl_ms": "ttl", "expiration_ms": "ttl", "dead_letter": "dead-letter"}

RECOVERY_NS = 5_000_000_000
"""How long after a fault's heal its cell still counts what happens: a restart's recovery (a
transaction log replayed, a mirror promoted) comes after the heal that restarted the node."""


@dataclass(frozen=True)
class Feature:
    """A broker feature a run can exercise, and how a run shows it was in use.

    In use for the whole run when every ``settings`` key has one of its values (a value of
    None matches an unset setting) and nothing else is asked; with ``workload`` uses, at the
    times the history shows one of them; with ``faults``, during the windows of those fault
    kinds (a membership change is a fault kind and a feature); with ``events``, at the times the
    broker reported one of them. Settings always gate the rest.
    """

    name: str
    description: str
    settings: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    workload: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    #: The broker's cluster size this feature needs: ``(min, max)`` nodes, max None for any.
    nodes: tuple[int, int | None] = (1, None)
    #: The fault kinds it must be exercised under (the holes check): a cell for each.
    wanted: tuple[str, ...] = ()
    #: The workload can drive it. False: the broker has it, no workload field exercises it
    #: yet (its wanted cells are holes nobody can fill by writing a scenario).
    drivable: bool = True

    def settings_match(self, settings: Mapping[str, Any], nodes: int) -> bool:
        lo, hi = self.nodes
        if nodes < lo or (hi is not None and nodes > hi):
            return False
        return all(settings.get(k) in allowed for k, allowed in self.settings.items())


#: The workload uses that give a delivery back, for the broker to deliver it again.
GIVING_BACK: tuple[str, ...] = ("requeue", "recover", "close", "crash")


def consumers_giving_back(
    description: str, *, wanted: tuple[str, ...], workload: tuple[str, ...] = GIVING_BACK
) -> Feature:
    """Deliveries given back (``workload``: the uses the broker's client can drive) must come again.

    Every broker family with consumers has it: declared here so that each one's coverage shows it
    on the same row, under the same name; ``description`` says how this broker does it.
    """
    return Feature("consumers giving deliveries back", description, workload=workload, wanted=wanted)


def membership_change(
    description: str,
    settings: Mapping[str, tuple[Any, ...]] | None = None,
    *,
    wanted: tuple[str, ...] = ("member-remove",),
) -> Feature:
    """A node leaves the running cluster and joins again empty (the ``member-remove`` fault kind).

    Declared once for every broker family with membership, on three nodes or more (two would
    leave one copy behind): ``description`` says how this broker does it.
    """
    return Feature(
        "membership change",
        description,
        settings or {},
        faults=("member-remove",),
        nodes=(3, None),
        wanted=wanted,
    )


@dataclass(frozen=True)
class BrokerEvent:
    """A notable internal event a broker reported (from its logs or an admin call).

    ``wall_time``: when the broker said it happened (aware, UTC), None if the line carries no
    time; the harness places it on the history's clock and in the fault windows it fell in.
    """

    node: str
    name: str
    wall_time: datetime | None
    detail: Mapping[str, Any] = field(default_factory=dict)
    line: str = ""  # the log line it was read from (trimmed)


class Cell(NamedTuple):
    """One coverage cell: a feature in use under a fault kind, with an event seen there (or None)."""

    feature: str
    fault: str
    event: str | None = None


@dataclass(frozen=True)
class LogEvent:
    """One event a plugin reads from its log lines: ``pattern`` (a regular expression, searched
    in each line; its named groups become the event's ``detail``), and ``when`` (an optional
    test of that detail, for events that are one case of a line, e.g. a promotion NOT in sync)."""

    name: str
    pattern: str
    when: Callable[[Mapping[str, str]], bool] | None = None

    def match(self, line: str) -> dict[str, str] | None:
        m = re.search(self.pattern, line)
        if m is None:
            return None
        detail = {k: v for k, v in m.groupdict().items() if v is not None}
        if self.when is not None and not self.when(detail):
            return None
        return detail


def events_from_lines(
    node: str,
    lines: Iterable[str],
    patterns: Iterable[LogEvent],
    log_time: Callable[[str], datetime | None],
) -> list[BrokerEvent]:
    """The events ``patterns`` find in a node's log ``lines``, each timed by ``log_time``."""
    pats = list(patterns)
    out: list[BrokerEvent] = []
    for line in lines:
        for p in pats:
            detail = p.match(line)
            if detail is not None:
                out.append(BrokerEvent(node, p.name, log_time(line), detail, line.strip()[:300]))
    return out
