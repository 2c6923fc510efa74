"""The scenario model: a chaos test as data, the sections a run, a driver, a fault and a checker read.

A checker receives the whole ``Scenario`` (``fn(run_dir, scenario)``); a client plugin
reads the ``WorkloadSection`` (its ``consumer``, ``delay`` and ``transactions`` sections);
a broker plugin the ``BrokerSection``'s settings. The model is loaded from YAML or TOML and
validated by ``harness.scenario`` (``load``, ``from_dict``, ``build``): every field below
is what a scenario file may set, with the ``#:`` comment the scenario reference shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class BrokerSection:
    #: The broker plugin's name, as `brokerchaos plugins` lists it.
    plugin: str
    #: Cluster size: one container (and one Toxiproxy sidecar) per node, n1, n2, ...
    nodes: int = 3
    #: The broker plugin's settings (checked by the plugin; see Broker settings).
    settings: Mapping[str, Any] = field(default_factory=dict)
    lazyfs: bool = False  # data directories on the lazy filesystem (implied by a power-loss fault)
    #: The lazy filesystem's model, when the data directories are on it: `strict` (POSIX: a new name, rename or unlink is durable only once its directory is fsynced), `ext4-ordered` (any fsync commits every name change) or `xfs` (an fsync of an object with an uncommitted change commits every name change; no data written ahead of a rename over a file). Absent: the broker plugin's own (the reference broker: `strict`; others: `ext4-ordered`).
    filesystem: str | None = None
    #: The broker's version, as `brokerchaos plugins` lists the plugin's versions (quote it: "3.10"); absent: the plugin's default (its first).
    version: str | None = None


@dataclass(frozen=True)
class ConsumerSection:
    """How consumers give deliveries back, so redelivery is exercised (all off by default).

    Draws are seeded from the scenario's seed and the consumer's name: a rerun repeats them.
    """

    requeue: float = 0.0  # per delivery: basic.nack(requeue) or, half the time, basic.reject(requeue)
    recover_every: float = 0.0  # seconds between basic.recover(requeue) with deliveries unacked; 0 = never
    close_every: float = 0.0  # seconds between closing the channel with deliveries unacked; 0 = never
    crash_every: float = 0.0  # seconds between cutting the connection holding prefetch; 0 = never
    slow: int = 0  # how many consumers wait ``slow_ack_ms`` before each ack
    #: How long a slow consumer waits before each ack (ms).
    slow_ack_ms: int = 100


@dataclass(frozen=True)
class DelaySection:
    """Delayed publishes (``workload.delay``): a share of publishes goes through a delayed exchange.

    Each such publish asks for a delay drawn uniformly from [min_ms, max_ms] (seeded by the
    scenario's seed and the producer's name). The ``delay`` checker calls a delivery ``early``
    if it came before its due time and reports the lateness of the rest; ``late_ms`` is how
    far past due a delivery must be to be listed as late.
    """

    share: float = 0.3  # probability that a publish is delayed
    #: Shortest delay asked for (ms).
    min_ms: int = 200
    #: Longest delay asked for (ms).
    max_ms: int = 3000
    #: How far past due a first delivery must be to count as late (ms).
    late_ms: int = 5000


@dataclass(frozen=True)
class TransactionsSection:
    """AMQP transactions in the workload (``workload.transactions``): producers and/or consumers use tx.

    ``publish_batch`` messages per producer transaction (0: producers use confirms),
    ``ack_batch`` acks per consumer transaction (0: consumers ack plainly), and the
    probability ``rollback`` that a transaction ends in tx.rollback instead of tx.commit.
    """

    #: Messages per producer transaction (0: producers use confirms).
    publish_batch: int = 0
    #: Acks per consumer transaction (0: consumers ack plainly).
    ack_batch: int = 0
    #: Probability that a transaction ends in tx.rollback instead of tx.commit.
    rollback: float = 0.0


@dataclass(frozen=True)
class WorkloadSection:
    #: Producer processes (p1, p2, ...), each on its own connection.
    producers: int = 2
    #: Consumer processes (c1, c2, ...); 0 leaves every message to the final drain.
    consumers: int = 2
    #: Ordered stream readers (r1, r2, ...): each reads its stream whole from the start, in order, without acking, through the run and past the drain (`read`/`seek` ops; for the poll-skip, nonmonotonic-poll and unseen classes); 0: none. Needs a client plugin with readers (NATS, Redis).
    readers: int = 0
    #: Queues (streams) the producers spread their messages over.
    queues: int = 1
    rate: float = 200.0  # messages per second over all producers; 0 = as fast as confirms allow
    #: Body size in bytes (a seeded payload the checker can verify).
    message_size: int = 256
    #: Seconds of workload; the faults happen inside it.
    duration: float = 30.0
    #: Publish persistent messages to durable queues.
    persistent: bool = True
    #: Consumer prefetch (basic.qos), 0 for no limit.
    prefetch: int = 100
    in_flight: int = 64  # unconfirmed publishes per producer
    #: Seconds a publish waits for its confirm before it is recorded unknown.
    confirm_timeout: float = 10.0
    #: Seconds the final drain may take; what it could not read by then is unreachable, never lost.
    #: One node's depth answer (the broker plugin's ``queue_depth``) may take this over the
    #: number of nodes drained: raise it on a loaded host whose admin commands are slow.
    drain_timeout: float = 120.0
    #: Seconds without a delivery after which a drain visit asks a node for the queue's depth
    #: (a plugin that tells the depth is asked the first time after at most half a second).
    drain_idle: float = 3.0
    #: Queue names are this prefix, a dash and a number (chaos-1).
    queue_prefix: str = "chaos"
    #: How consumers give deliveries back on purpose (all off by default).
    consumer: ConsumerSection = field(default_factory=ConsumerSection)
    #: Delayed publishes through a delayed-message exchange (absent: none).
    delay: DelaySection | None = None  # None: no delayed publishes
    #: AMQP transactions in the workload (absent: none).
    transactions: TransactionsSection | None = None
    #: Message TTL of each workload queue in ms (AMQP `x-message-ttl`; absent: none). Needs `dead_letter`: an expired message is then dead-lettered, not dropped.
    ttl_ms: int | None = None
    #: Per-message TTL in ms on every publish (AMQP's `expiration` property; absent: none). Needs `dead_letter`.
    expiration_ms: int | None = None
    #: Each workload queue dead-letters into its own dead-letter queue (`chaos-1.dead`, through the exchange `brokerchaos.dead-letter`), which consumers and the final drain empty too; a confirmed message must be consumed from one of the two.
    dead_letter: bool = False


@dataclass(frozen=True)
class Budgets:
    """How many duplicated or resurrected messages a run may show and still be valid (None: any),
    and how many seconds after a fault's heal every queue must work again (``recovery_s``: one
    number for every fault kind, or a mapping from fault kind to seconds)."""

    #: Duplicated messages a valid run may show (null: any).
    duplicated: int | None = None
    #: Resurrected messages a valid run may show (null: any).
    resurrected: int | None = None
    #: Seconds after a fault's heal by which every queue must confirm and consume again (one number, or per fault kind; null: no limit).
    recovery_s: float | Mapping[str, float] | None = None


@dataclass(frozen=True)
class Step:
    #: Seconds from the workload's start.
    at: float
    #: A fault kind's name (see Faults).
    fault: str
    #: Seconds until the heal (absent: held until the final heal after the workload).
    hold: float | None = None
    #: The kind's parameters (see Faults).
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RandomSchedule:
    #: Fault kinds to draw from.
    faults: tuple[str, ...]
    #: Seconds between drawn faults: [min, max] or one number.
    every: tuple[float, float] = (10.0, 20.0)
    #: Seconds each is held: [min, max] or one number.
    hold: tuple[float, float] = (5.0, 15.0)
    #: Parameters per fault kind, by name.
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per fault name
    #: How many drawn faults may be held at once (1: each starts after the previous healed).
    overlap: int = 1


@dataclass(frozen=True)
class NemesisSection:
    #: Explicit steps.
    schedule: tuple[Step, ...] = ()
    #: Faults drawn from the seed (absent: none).
    random: RandomSchedule | None = None
    settle: float = 5.0  # seconds after the final heal before the drain

    @property
    def fault_names(self) -> set[str]:
        names = {s.fault for s in self.schedule}
        if self.random:
            names |= set(self.random.faults)
        return names


@dataclass(frozen=True)
class Scenario:
    #: The run store's directory name (default: the file's name).
    name: str
    #: The cluster.
    broker: BrokerSection
    #: Producers and consumers.
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    #: The fault schedule.
    nemesis: NemesisSection = field(default_factory=NemesisSection)
    #: Seeds every draw: the same seed gives the same fault schedule.
    seed: int = 0
    #: Checkers by name; empty: the ones registered as default (Spark).
    checkers: tuple[str, ...] = ()  # empty: the checkers registered as default
    #: Duplicated and resurrected messages a valid run may show.
    budgets: Budgets = field(default_factory=Budgets)
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = json.loads(json.dumps(asdict(self), default=list))
        if out["workload"].get("transactions") is None:
            del out["workload"]["transactions"]  # a run without transactions reads as before they existed
        for key, unset in (("ttl_ms", None), ("expiration_ms", None), ("dead_letter", False)):
            if out["workload"].get(key) == unset:
                del out["workload"][key]  # a run without TTL or dead-lettering reads as before they existed
        if out["broker"].get("version") is None:
            del out["broker"]["version"]  # the default version: the scenario reads as before versions existed
        if out["broker"].get("filesystem") is None:
            del out["broker"]["filesystem"]  # the plugin's model: the scenario reads as before models existed
        return out
