"""The results schema both checkers return.

Both engines (Spark and the pure-Python twin) must produce dictionaries of exactly
this shape so the harness, the report renderer and the grader never care which one
ran, and so the property tests can compare the two outputs field by field.

Times in the results are nanoseconds since run start (the history's ``time_ns``)
unless a field name ends in ``_ms`` or ``_s``. Latencies are computed on whole
microseconds (``floor(ns / 1000)``), percentiles by nearest rank, so both engines
can agree exactly without floating-point tie-breaking.

Version 2 (history schema 2): a delivery (``consume`` ok) is not a consumption; a
message is consumed once an ``ack`` of it completed ``ok``. Histories of schema 1
recorded acks as ok when they were written, so for them a delivery still counts as
consumed and ``notes`` says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypedDict, get_args

SCHEMA_VERSION = 2
LIST_CAP = 1000
"""Lists of message ids (lost, unexpected, ...) are capped so results stay small."""
UNAVAILABLE_S = 5
"""Liveness: a gap longer than this (seconds) with no ``ok`` operation of a kind on a queue is an
unavailable window (``UnavailableWindow``)."""

Verdict = Literal[
    "LOST",
    "UNSYNCED",
    "INTEGRITY",
    "DEAD_LETTERED",
    "RESURRECTED",
    "DUPLICATED",
    "UNAVAILABLE",
    "unknown",
    "durable",
]
Valid = bool | Literal["unknown"]

VERDICT_ORDER: tuple[Verdict, ...] = get_args(Verdict)
"""Every verdict, worst first; a run's verdict is the worst of its checkers' verdicts.

- ``LOST``: confirmed messages the application can never get back (a finished drain did not
  find them, or a node holds them unacked for consumers that no longer exist);
- ``UNSYNCED``: a power cut found acknowledged messages unsynced although the broker's settings
  promise a sync before each confirm (``BrokerPlugin.confirms_after_sync``): a broken promise
  whether or not a replica then kept them; the harness's finding (``FaultEvidence``), no checker's;
- ``INTEGRITY``: something was delivered that should not have been (never published, a body
  other than the one sent, a stream's replicas or sequences that disagree, a delayed message
  early, half a transaction);
- ``DEAD_LETTERED``: confirmed messages the broker moved to a dead-letter queue (its own, such
  as ActiveMQ's ``ActiveMQ.DLQ``: ``BrokerPlugin.dead_letter_queues``, or the workload's) where the
  scenario expects no dead-lettering (``workload.dead_letter`` off): kept, but out of the
  application's queue;
- ``RESURRECTED``, ``DUPLICATED``: deliveries again after a completed ack, or consumptions
  twice, over the scenario's budget;
- ``UNAVAILABLE``: the broker never recovered (a queue that never answered again);
- ``unknown``: what the harness could not establish (a drain it could not complete, a checker
  that raised, a checker with nothing to judge);
- ``durable``: every checker that ran found nothing wrong.

A definite failure outranks ``unknown`` (a run that certainly lost messages lost them, whatever
another checker could not establish), and ``unknown`` outranks ``durable`` (a run is durable only
when every checker says so).
"""

EXIT_DURABLE, EXIT_FAILED, EXIT_UNKNOWN = 0, 1, 3
"""Exit statuses of a checked run (``exit_status``); 2 is the harness's own for an error before a verdict."""
EXIT_NO_FAULT_BIT = 4
"""Exit status of a run whose verdict is ``durable`` but none of whose faults was measured to bite
(``FaultEvidence.no_fault_bit``): it proved nothing about the faults it planned. Apart from 0 so
that CI does not pass on a hollow run, apart from 1 so that it is never mistaken for a loss."""


def compose_verdicts(verdicts: Iterable[str | None]) -> Verdict:
    """The run's one verdict: the worst (``VERDICT_ORDER``) of every checker's.

    A verdict this schema does not name (a checker's own, or None from a checker that
    returned none) counts as ``unknown``; no verdict at all is ``unknown`` too.
    """
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    known = [v if v in rank else "unknown" for v in verdicts]
    if not known:
        return "unknown"
    return VERDICT_ORDER[min(rank[v] for v in known)]


def exit_status(verdict: str | None) -> int:
    """0 for ``durable``, 3 for ``unknown`` (or a verdict this schema does not name), 1 for any failure."""
    if verdict == "durable":
        return EXIT_DURABLE
    if verdict in VERDICT_ORDER and verdict != "unknown":
        return EXIT_FAILED
    return EXIT_UNKNOWN


def valid_of(verdict: str | None) -> Valid:
    """The ``valid`` field that goes with a verdict: True durable, False a failure, else "unknown"."""
    status = exit_status(verdict)
    return True if status == EXIT_DURABLE else False if status == EXIT_FAILED else "unknown"


LostCause = Literal[
    "never delivered",
    "abandoned delivery never redelivered",
    "delivered, never acked",
    "held unacked by no consumer",
]
STUCK_CAUSE: LostCause = "held unacked by no consumer"
"""The cause of a stuck message (``StuckQueue``): a loss to the application, counted apart from lost."""


class Counts(TypedDict):
    """Message-level counts; a message is one id, however many attempts it had."""

    attempted: int  # ids with at least one publish invoke
    confirmed: int  # ids with at least one publish ok
    failed: int  # ids whose every attempt failed definitely
    unknown: int  # ids not confirmed with at least one indeterminate attempt
    publish_attempts: int  # publish invokes (an id retried counts once per attempt)
    delivered_unique: int  # ids with at least one delivery (consume ok), attempted or not
    delivered_total: int  # consume ok records
    consumed_unique: int  # ids consumed at least once: an ack ok (schema 1: a delivery)
    consumed_total: int  # ack ok records (schema 1: consume ok records)
    dead_lettered: int  # ids consumed from a dead-letter queue: consumed, not lost; DEAD_LETTERED unless ``workload.dead_letter``
    abandoned: int  # abandon ops: deliveries a consumer gave back unacked
    lost: int  # confirmed, never consumed, not ack_unknown (nor stuck), and the final drain completed
    unreachable: int  # the same, but the final drain did not complete: behind a queue that did not answer, not known lost
    stuck: (
        int  # confirmed, never consumed, while the drain ended on nodes holding them unacked for no consumer
    )
    ack_unknown: int  # confirmed, never acked ok, but an ack of it ended info and no delivery followed it
    unexpected: int  # consumed, never attempted
    corrupted: int  # attempted ids with a delivery whose body digest is not the one sent
    duplicated: int  # consumed more than once (acked ok twice or more; redeliveries a consumer asked for are not duplicates)
    resurrected: int  # delivered again after an ack of it had completed ok
    recovered: int  # attempted, not confirmed, consumed
    split_brain: int  # see SplitBrainCopy
    unflagged_redeliveries: int  # deliveries after an abandon of the id without the redelivered flag
    order_violations: int  # see OrderViolation
    history_ops: int  # rows in the history


class Delivery(TypedDict):
    index: int
    time_ns: int
    node: str | None
    queue: str | None
    process: str
    redelivered: bool | None


class MessageDetail(TypedDict):
    """One message in a capped list, with what happened to it."""

    id: str
    attempts: int
    outcome: Literal["ok", "fail", "info", "none"]  # best outcome over attempts; none = never attempted
    first_invoke_ns: int | None
    confirm_ns: int | None
    confirm_node: str | None
    delivered: int  # consume ok records
    consumed: int  # ack ok records (schema 1: deliveries)
    deliveries: list[Delivery]  # first DELIVERY_CAP deliveries by index
    cause: LostCause | None  # lost messages only: why nothing consumed it
    abandon_cause: str | None  # with "abandoned delivery never redelivered": the last abandon's cause


class LostCauseRow(TypedDict):
    """Lost messages per cause, over every lost message, not only the capped list."""

    cause: LostCause
    abandon_cause: str | None
    count: int


class Resurrection(TypedDict):
    """A message delivered again after the broker had certainly processed an ack of it."""

    id: str
    ack_index: int  # the first ack of it that completed ok
    ack_ns: int
    ack_node: str | None
    ack_process: str
    deliveries_after: int  # deliveries with an index above ack_index
    delivery: Delivery  # the first of them


class Corruption(TypedDict):
    """An attempted message delivered with a body other than the one its producer sent.

    The expected body is recomputed from the id, the scenario's seed and
    workload.message_size (``harness.spec.message_body``), never taken from the client.
    """

    id: str
    deliveries: int  # deliveries of this id whose digest differs
    delivery: Delivery  # the first of them
    expected_digest: str
    digest: str  # as recorded on that delivery
    expected: str  # the first 200 characters of the body that was sent
    received: str | None  # the consumer's excerpt of what arrived (detail.body), when recorded
    received_length: int | None


class EmptyNode(TypedDict):
    node: str
    empty_at_ns: int


class SplitBrainCopy(TypedDict):
    """A message first acked ok by a drainer through one node after another node of the same
    drain op had reported the queue empty: a copy only that node still held."""

    id: str
    drainer: str
    queue: str | None
    node: str | None  # where the drainer found it
    ack_index: int
    ack_ns: int
    empty: list[EmptyNode]  # the other nodes that had reported empty before ack_ns, by time


class UnflaggedRedelivery(TypedDict):
    """A delivery after an abandon of the same id whose redelivered flag is not set.

    Reported, not a failure: a publish retried under the same id can legitimately
    arrive unflagged after the first copy was given back.
    """

    id: str
    delivery: Delivery
    abandon_index: int  # the latest abandon of the id before this delivery
    abandon_cause: str | None


class FaultWindow(TypedDict):
    """A fault from its invoke to the ok of the heal that names it (or history end)."""

    fault_id: str
    kind: str
    node: str | None
    start_ns: int
    end_ns: int
    heal_start_ns: int | None  # the invoke of that heal (a restart begins there); None: never healed
    applied: bool  # the fault's own op completed ok
    healed: bool  # a heal naming it completed ok
    params: dict


MissingClass = Literal["lost", "unreachable", "stuck"]
"""The class ``counts`` puts a confirmed message the final drain did not consume in: ``lost`` after a
completed drain, ``stuck`` when the drain was held up only by nodes holding it for no consumer,
``unreachable`` otherwise (every such message of a run falls in one class)."""
MISSING_CLASSES: tuple[MissingClass, ...] = get_args(MissingClass)


class LostAttribution(TypedDict):
    """A message of the capped ``lost`` list (or ``stuck_detail``) and the faults around it."""

    id: str
    confirm_node: str | None
    confirm_ns: int
    fault_ids: list[str]  # windows overlapping [confirm_ns, drain_end_ns]
    fault_kinds: list[str]  # distinct kinds of those windows, sorted; ["none"] if there are none
    #: its class (absent from results made before the classes were attributed apart: ``row_class``)
    status: MissingClass


class AttributionRow(TypedDict):
    """The confirmed messages of one class the final drain did not consume, by fault kind and the
    node that confirmed them."""

    fault_kind: str
    node: str | None  # the node that confirmed them
    #: lost, unreachable or stuck (absent from results made before it: every row counted as lost
    #: whatever the class; ``row_class`` reads those from the counts)
    status: MissingClass
    count: int  # messages of that class


class ExposureRow(TypedDict):
    """Confirmed messages whose confirm-to-drain interval overlaps a window of this kind.

    This is the denominator the grader uses per fault kind: of the messages a fault
    of this kind could have hit, how many were lost (``lost`` and ``stuck``, as a run's loss
    counts them). Rows made before ``unreachable`` and ``stuck`` were counted apart hold every
    missing message in ``lost``: ``exposure_classes`` reads both.
    """

    fault_kind: str
    confirmed: int
    lost: int  # of those, lost after a completed drain
    unreachable: int  # of those, unreachable (not known lost: the drain did not reach them)
    stuck: int  # of those, stuck (held unacked by no consumer: a loss to the application)


class Attribution(TypedDict):
    drain_end_ns: int
    rows: list[AttributionRow]  # over every missing message, not only the capped list
    exposure: list[ExposureRow]
    messages: list[LostAttribution]  # for the capped list of missing messages


def missing_class(counts: Mapping[str, Any]) -> MissingClass:
    """The class of a run's missing messages, from its ``counts`` (only one class is counted)."""
    for name in ("stuck", "unreachable"):
        if counts.get(name) and not counts.get("lost"):
            return name
    return "lost"


def row_class(row: Mapping[str, Any], counts: Mapping[str, Any]) -> MissingClass:
    """An attribution row's or message's class; for results made before it was kept, the run's."""
    return row.get("status") or missing_class(counts)


def exposure_classes(row: Mapping[str, Any], counts: Mapping[str, Any]) -> dict[MissingClass, int]:
    """An exposure row's missing messages per class; in a row made before the classes were apart,
    its ``lost`` is all of them, in the run's class."""
    if "unreachable" in row:
        return {c: int(row.get(c) or 0) for c in MISSING_CLASSES}
    old = missing_class(counts)
    return {c: int(row.get("lost") or 0) if c == old else 0 for c in MISSING_CLASSES}


def shown_classes(results: Mapping[str, Any]) -> list[MissingClass]:
    """The classes a table of missing messages shows: lost always, the others where counted."""
    counts = results.get("counts") or {}
    att = results.get("attribution") or {}
    seen = {row_class(r, counts) for r in att.get("rows") or []}
    seen |= {c for r in att.get("exposure") or [] for c, n in exposure_classes(r, counts).items() if n}
    return [c for c in MISSING_CLASSES if c == "lost" or counts.get(c) or c in seen]


class Percentiles(TypedDict):
    n: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


class Latency(TypedDict):
    confirm_ms: Percentiles  # publish invoke -> ok, per confirmed attempt
    e2e_ms: Percentiles  # first publish invoke -> first delivery, per delivered attempted id


class AvailabilityRow(TypedDict):
    window: str  # a fault_id, or "outside"
    kind: str | None
    attempts: int  # publish attempts invoked inside the window
    confirmed: int
    share: float | None


class TimelineRow(TypedDict):
    t_s: int  # bucket start, seconds since run start
    f: str
    type: str
    count: int


class LatencyTimelineRow(TypedDict):
    t_s: int  # bucket of the ok's time
    n: int
    mean_ms: float
    max_ms: float


class Timeline(TypedDict):
    bucket_s: int
    rows: list[TimelineRow]
    latency: list[LatencyTimelineRow]


class OrderViolation(TypedDict):
    """A delivery of a producer's message after a later one of the same producer.

    Counted per (consumer, queue, producer) over first deliveries (redelivered is not
    true): a delivery whose seq is below the highest seq that consumer already got
    from that producer on that queue.
    """

    consumer: str
    queue: str | None
    producer: str
    id: str
    seq: int
    after_seq: int
    index: int


class DrainRound(TypedDict):
    """One round of a drain op through every node (recorded by the drainer in its value)."""

    end_ns: int  # history time the round ended
    consumed: int  # acked ok by the drain so far
    empty: list[str]  # nodes that reported the queue empty in this round
    errors: dict[str, str]  # nodes that did not, with what they said


class DrainOp(TypedDict):
    """One drain op (per drainer and queue) as its completion reported it."""

    process: str
    queue: str | None
    outcome: Literal["ok", "fail", "info", "open"]  # open: no completion recorded
    error: str | None
    consumed: int | None
    nodes: dict[str, dict]  # node -> {consumed, ready, unacked, empty_at_ns, error} as the drainer saw it
    rounds: list[DrainRound]  # every round it went through, where the drainer recorded them
    end_ns: int | None  # time of its completion
    #: node -> what it answered, when the op ended ok because every node answered that the
    #: queue does not exist (``gone`` in its value, ``harness.spec.client.NoCopy``), else empty:
    #: a complete drain (the confirmed messages it did not consume are lost) that is no answer
    #: of the queue's (liveness does not count it as the queue coming back)
    gone: dict[str, str]


class Drain(TypedDict):
    invoked: int
    completed: bool  # every drain op (drainer, queue) last completed ok
    end_ns: int | None  # time of the last drain ok
    ops: list[DrainOp]


class StuckQueue(TypedDict):
    """A node that still reported unacked deliveries of a queue after the harness had closed every
    client connection it opened on it (``depth`` ops with ``clients`` 0): held for consumers that
    no longer exist. When every drain that did not finish was held up only by such nodes (every
    other node reported the queue empty), the confirmed messages it could not obtain are
    ``stuck``: verdict LOST, cause "held unacked by no consumer"."""

    queue: str | None
    node: str
    drainer: str
    unacked: int  # the count the broker last reported
    ready: int
    since_ns: int  # the first of the consecutive looks, up to the last, that found it so
    last_ns: int
    looks: int  # how many consecutive looks found it so
    holders: list | None  # what the plugin listed as holding them, when it can tell


class Budgets(TypedDict):
    """From the scenario's ``budgets`` section; None means no limit.

    ``recovery_s``: seconds from a fault's heal to the queue's recovery (``Recovery.recovery_ns``),
    one number for every fault kind or a mapping from fault kind to seconds (kinds it does not
    name have no limit).
    """

    duplicated: int | None
    resurrected: int | None
    recovery_s: float | dict[str, float] | None


LiveKind = Literal["publish", "consume"]
"""What liveness measures per queue: ``publish`` ok (confirmed) and ``consume`` (an ack that
completed ok; in a schema-1 history, a delivery)."""


class NodeRecovery(TypedDict):
    """After one heal, through one node (where clients are pinned to nodes, this is that node's
    recovery): nanoseconds from the heal to the first ok op of each kind there, None if none."""

    node: str | None
    publish_ok_ns: int | None
    consume_ok_ns: int | None


class Recovery(TypedDict):
    """One fault step and one queue: how long after the step's heal the queue worked again.

    Times are measured from the heal's invoke (``FaultWindow.heal_start_ns``: where the harness
    began to undo the fault, so a restart's boot counts), not from its completion.

    A kind counts once it was asked for after the heal: ``publish`` when producers kept invoking
    publishes on the queue for longer than ``Liveness.threshold_ns`` after the heal (a heal just
    before the producers stop asks nothing of them); ``consume`` when there was something to
    consume: a publish confirmed at or after the heal, or one confirmed before it later than the
    last consume ok before it (an idle queue asks nothing of its consumers). ``consume_ok_ns`` is the first ack ok through any node, or the queue's drain
    completing ok (every node answered that it is empty), whichever is first.
    """

    fault_id: str
    kind: str  # the fault's kind
    node: str | None  # the fault's target
    queue: str
    healed: bool  # a heal naming the step completed ok (otherwise nothing is measured)
    heal_ns: int | None  # the heal's invoke
    publish_demand: bool  # publishes were invoked on the queue more than the threshold after the heal
    consume_demand: bool  # something to consume: a publish confirmed after the heal, or one before it later than the last consume
    publish_ok_ns: int | None  # heal -> first publish ok on the queue, any node
    consume_ok_ns: int | None  # heal -> first consume ok (or drain ok) on the queue, any node
    # heal -> the later of the kinds asked for; None: not recovered, or nothing was asked of it
    recovery_ns: int | None
    recovered: bool
    budget_s: float | None  # budgets.recovery_s for this fault kind
    over_budget: bool  # not recovered, or recovered later than the budget
    nodes: list[NodeRecovery]  # every node a client op of the queue went through, by name


class UnavailableWindow(TypedDict):
    """A stretch longer than ``Liveness.threshold_ns`` in which no op of ``kind`` on ``queue``
    completed ok, between two oks or an end of the queue's span (``QueueLiveness``)."""

    queue: str
    kind: LiveKind
    start_ns: int
    end_ns: int
    duration_ns: int
    ended_by_ok: bool  # False: it ran to the end of the span (no ok of its kind after it)
    fault_ids: list[str]  # fault windows it overlaps


class QueueLiveness(TypedDict):
    """One queue and kind over the run. The span starts at the first publish invoke on the queue
    and ends at the last publish record (``publish``); for ``consume`` at the later of the last
    publish record and the last consume ok when the queue's last drain op completed ok (nothing
    was left to consume after them), else at the end of its last drain op, else at the history's
    end."""

    queue: str
    kind: LiveKind
    span_start_ns: int
    span_end_ns: int
    ok: int  # ok ops of the kind on the queue
    first_ok_ns: int | None
    last_ok_ns: int | None
    unavailable_ns: int  # summed over its unavailable windows
    available_share: float | None  # 1 - unavailable / span; None for an empty span
    longest_ns: int  # its longest unavailable window, 0 if none


class UnavailableQueue(TypedDict):
    """A queue that did not come back: its recovery after the last heal is incomplete (its
    ``Recovery`` row there is not ``recovered``), or it recovered and went down again and an
    unavailable window of it runs to the end of its span (``ended_by_ok`` false), as when a
    broker restarts nodes on its own after a heal."""

    queue: str
    kinds: list[LiveKind]  # what never came back
    since_ns: int  # the last ok op of those kinds (or the start of the open window)
    fault_id: (
        str | None
    )  # the fault step it follows: the last heal's, or the latest to start before `since_ns`
    fault_kind: str | None
    heal_ns: int | None  # that step's heal (None: never healed, or no step)
    #: what each node said to the last drain op of the queue: its error, or that the queue does not exist
    nodes: dict[str, str | None]
    drain_rounds: int | None  # rounds that drain op went through, where it recorded them
    log: list[str]  # lines of the nodes' logs that name the queue (filled in after teardown)


class StrandedGroup(TypedDict):
    """Messages a broker with disjoint nodes (``BrokerPlugin.disjoint_nodes``) held on one node
    that no consumer reached until the drain: confirmed at least ``Liveness.threshold_ns`` before
    their queue's last publish (while the workload's consumers were reading it), first acked by
    the drain on ``node``. A liveness finding (the verdict stays what safety says): the messages
    were kept, but no consumer was given them while they sat there."""

    queue: str | None
    node: str | None  # the node the drain read them from
    count: int
    confirmed_from_ns: int  # the first of them confirmed
    confirmed_to_ns: int  # the last of them confirmed
    read_to_ns: int  # the drain's last read of them
    wait_max_ns: int  # the longest any of them sat: from its confirm to the drain's read of it


def describe_stranded(g: StrandedGroup) -> str:
    """How a ``StrandedGroup`` reads wherever it is shown (terminal, report): ``497 messages sat
    up to 30.2 s on n2 (q0, confirmed ...), read only by the drain (by 61.0 s)``."""
    n, s = g["count"], 1e9
    return (
        f"{n:,} message{'' if n == 1 else 's'} sat up to {g['wait_max_ns'] / s:.1f} s on {g['node']} "
        f"({g['queue']}, confirmed {g['confirmed_from_ns'] / s:.1f} s to {g['confirmed_to_ns'] / s:.1f} s "
        f"while consumers read the queue elsewhere), read only by the drain (by {g['read_to_ns'] / s:.1f} s)"
    )


class NodeDown(TypedDict):
    """A node the final heal could not bring back (the history's final ``heal``, ``value.down``):
    its broker did not start, or did not get ready within the broker plugin's ``ready_timeout``.
    The run drained through the other nodes; the node is an availability failure (verdict
    ``UNAVAILABLE``) that every verdict's reason names."""

    node: str
    heal_ns: int  # when the final heal gave up on it
    reason: str  # why, its first line the summary (the broker's exit), then its last log lines


class Liveness(TypedDict):
    """Did the broker come back after each fault, and how long did it take."""

    threshold_ns: int  # UNAVAILABLE_S in nanoseconds
    recovery: list[Recovery]  # by fault window, then queue
    windows: list[UnavailableWindow]  # by start, queue, kind
    queues: list[QueueLiveness]
    longest_outage_ns: int  # the longest unavailable window of any queue and kind
    available_share: float | None  # over every queue and kind: 1 - unavailable / span, summed
    unavailable: list[UnavailableQueue]  # did not come back: verdict UNAVAILABLE
    over_budget: list[str]  # "fault_id queue" of each Recovery over its budget
    stranded: list[StrandedGroup]  # by queue, node: read only by the drain (disjoint nodes only)
    nodes_down: list[NodeDown]  # did not come back at the final heal: verdict UNAVAILABLE
    serving: (
        list[str] | None
    )  # with nodes down, the client nodes that came back (none: ``unknown``); else None


ANOMALY_EXAMPLES = 100
"""Each anomaly list (``Anomalies``) keeps this many examples; its count covers all."""

ANOMALY_CLASSES = (
    "lost_prefix",
    "lost_middle",
    "lost_postfix",
    "lost_on_node",
    "inconsistent_offsets",
    "duplicate",
    "poll_skip",
    "nonmonotonic_poll",
    "unseen",
)
"""Jepsen's classes (its NATS queue checker and its Kafka workload), in ``Anomalies.counts``."""

INTEGRITY_ANOMALIES = ("lost_on_node", "inconsistent_offsets", "duplicate", "poll_skip", "nonmonotonic_poll")
"""The classes that make a run INTEGRITY by themselves; the lost-position classes and ``unseen``
refine LOST (they only say where, or that a node still holds it) and decide nothing."""


class LostPosition(TypedDict):
    """One producer's lost messages by their place among its messages that survived (were
    delivered or consumed): before its first survivor (prefix), between its first and last
    (middle), after its last, or all of them when none survived (postfix)."""

    producer: str
    lost: int
    prefix: int
    middle: int
    postfix: int
    first_seen: int | None  # the lowest seq of the producer's survivors
    last_seen: int | None  # the highest


class NodeHolding(TypedDict):
    """What the harness recorded of one node's own copy of a queue after the drain (the last
    ``holdings`` op of that node and queue)."""

    queue: str | None
    node: str | None
    outcome: str  # ok, or the completion's type (info: the plugin could not tell)
    entries: int | None  # entries in the copy (ok only)
    first_offset: int | None  # the lowest and highest offset among them (None: no offsets)
    last_offset: int | None
    error: str | None


class LostOnNode(TypedDict):
    """Confirmed messages present in some node's copy of a stream and missing from this node's."""

    queue: str | None
    node: str | None
    count: int
    ids: list[str]  # the first ANOMALY_EXAMPLES, by offset (where another copy holds it) then id


class InconsistentOffset(TypedDict):
    """One offset of a stream holding different messages in different nodes' copies or reads."""

    queue: str | None
    offset: int
    ids: list[str]
    sources: list[str]  # the nodes (holdings) and readers (reads) that saw the offset


class DuplicateOffsets(TypedDict):
    """One message at more than one offset of a stream (copies and reads)."""

    queue: str | None
    id: str
    offsets: list[int]


class PollStep(TypedDict):
    """Two successive reads of one reader on one stream (or a seek and the read after it):
    ``poll_skip`` when offsets that exist (in a node's copy or another read) lie strictly between
    them; ``nonmonotonic_poll`` when the second is not above the first. After a seek to n,
    ``from_offset`` is n - 1."""

    reader: str
    queue: str | None
    index: int  # the second read
    from_offset: int
    to_offset: int
    skipped: int  # existing offsets strictly between (poll_skip; 0 for nonmonotonic_poll)
    after_seek: bool


class Unseen(TypedDict):
    """A confirmed message a node's copy still holds that no consumer got and no reader read."""

    queue: str | None
    id: str
    offset: int | None  # its lowest offset among the copies
    nodes: list[str]  # the nodes whose copy holds it


class Anomalies(TypedDict):
    """Jepsen's finer classes (see ``ANOMALY_CLASSES``; docs: explanation/anomalies). Lists keep
    ANOMALY_EXAMPLES examples each; counts cover all. The lost-position classes count the run's
    lost messages only (none while the drain is unfinished or the messages are stuck)."""

    counts: dict[str, int]  # every ANOMALY_CLASSES key, plus holdings, readers and reads
    lost_positions: list[LostPosition]  # producers with lost messages, by name
    holdings: list[NodeHolding]  # by queue, node
    lost_on_node: list[LostOnNode]  # by queue, node
    inconsistent_offsets: list[InconsistentOffset]  # by queue, offset
    duplicate: list[DuplicateOffsets]  # by queue, lowest offset, id
    poll_skip: list[PollStep]  # by index
    nonmonotonic_poll: list[PollStep]  # by index
    unseen: list[Unseen]  # by queue, offset, id


class Results(TypedDict):
    schema: int
    engine: Literal["spark", "python"]
    history_schema: int  # the schema of the history checked (1 or 2)
    valid: Valid
    verdict: Verdict
    reason: str
    notes: list[str]  # what this check could not do, said plainly (old history, no seed, ...)
    budgets: Budgets
    counts: Counts
    lost: list[str]  # the missing ids, capped: lost, or unreachable where ``counts`` says so
    lost_truncated: bool
    lost_detail: list[MessageDetail]
    lost_by_cause: list[LostCauseRow]
    stuck: list[StuckQueue]  # nodes holding a queue's deliveries for no consumer (empty: none seen)
    stuck_detail: list[MessageDetail]  # the stuck messages (cause "held unacked by no consumer"), capped
    ack_unknown: list[MessageDetail]  # by confirm index, capped
    unexpected: list[str]
    unexpected_truncated: bool
    unexpected_detail: list[MessageDetail]
    corrupted: list[Corruption]  # by first corrupted delivery, capped
    duplicated: list[MessageDetail]
    resurrected: list[Resurrection]  # by first delivery after the ack, capped
    recovered: list[MessageDetail]
    split_brain: list[SplitBrainCopy]  # by ack index, capped
    unflagged_redeliveries: list[UnflaggedRedelivery]  # by index, capped
    order_violations: list[OrderViolation]
    attribution: Attribution
    latency: Latency
    availability: list[AvailabilityRow]
    timeline: Timeline
    faults: list[FaultWindow]
    drain: Drain
    liveness: Liveness
    anomalies: Anomalies
    end_ns: int


class FaultAction(TypedDict):
    """What one fault action measured of its own effect (``harness.spec.fault.Evidence``), as the
    history's nemesis ops record it (the heal's evidence, when there is one, supersedes the apply's)."""

    fault_id: str
    kind: str
    node: str | None  # the fault's target as the history records it (None: several nodes or links)
    applied: bool  # the fault's own op completed ok
    effect: bool | None  # True: it bit; False: measured, nothing happened; None: not measured
    summary: str
    no_effect_reason: str | None
    flags: list[str]  # further lines an operator must see (a link of a cut that still passed)
    restored: bool | None  # measured after the heal: undone (None: not measured or never healed)
    facts: dict  # what was measured (bytes, files, pids, probes, checksums)
    line: str  # the one line the terminal shows when it had no effect (empty otherwise)
    at_ns: int | None  # when the fault's own op completed (a power cut happened before it)
    exposure: Exposure | None  # a cut whose dropped writes a broker plugin mapped to messages


class Exposure(TypedDict):
    """The acknowledged-but-unsynced window of one power cut (plugin capability ``unsynced-messages``)."""

    in_dropped_writes: int  # messages whose records the cut's dropped writes held
    confirmed_before_cut: int | None  # of those, confirmed to the client before the cut
    lost: int | None  # of those, lost by the checkers' reckoning (a synced replica may have kept them)
    #: of those, unreachable by the checkers' reckoning: the drain did not complete, so not known
    #: lost (absent from results made before it was counted apart from ``lost``)
    unreachable: int | None
    #: ``lost`` and ``unreachable`` are lower bounds: the checkers list only the first LIST_CAP of a
    #: run's missing ids (``lost_truncated``) (absent from results made before it)
    lower_bound: bool
    ids: list[str]  # the first ids in the dropped writes


class FaultEvidence(TypedDict):
    """Proof that the faults bit (``results.json``'s ``fault_evidence``), computed by the harness
    from the nemesis ops of the history (no checker involved): every fault action with its
    evidence, counted. ``no_fault_bit``: at least one fault was applied, none was measured to
    bite and at least one was measured to have no effect; the verdict line says so and the exit
    status is ``EXIT_NO_FAULT_BIT`` when the verdict is ``durable``. ``unsynced_lines``: cuts that
    found acknowledged messages unsynced although the broker promised a sync before each confirm;
    any makes the run's verdict at least ``UNSYNCED``."""

    faults: int  # fault actions applied (ok)
    bit: int
    no_effect: int
    unmeasured: int
    not_restored: int  # measured after their heal and still in effect
    no_fault_bit: bool
    lines: list[str]  # per fault with no effect, flag, not undone by its heal, or after the last publish
    exposure_lines: list[str]  # one per cut with an exposure: acknowledged but unsynced, lost, unreachable
    confirms_after_sync: bool | None  # the broker plugin's word on its settings (None: it does not say)
    unsynced_lines: list[str]  # one per cut with acknowledged messages unsynced under that promise
    actions: list[FaultAction]


class BrokerEventRecord(TypedDict):
    """One event the broker reported (``results.json``'s ``events``; ``harness.coverage``): not a
    checker's finding but a state the run reached, read from the broker's logs after the run."""

    node: str
    name: str  # the plugin's event name (its ``log_events``), e.g. promoted-unsynced
    time_ns: int | None  # on the history's clock; None: the line carried no time
    wall_time: str | None
    fault_ids: list[str]  # the fault windows it fell in: held, or up to 5 s after the heal
    detail: dict  # what the line said (the pattern's named groups)
    line: str


class WindowCoverage(TypedDict):
    fault_id: str
    kind: str
    features: list[str]  # the plugin's features in use while it was held (or just after)
    events: list[str]  # the events that fell in it


class Coverage(TypedDict, total=False):
    """What a run covered (``results.json``'s ``coverage``), computed after the run from the
    broker plugin's declared ``features``, the history and the events."""

    broker: str
    features: list[str]  # the features whose settings this run had
    workload_uses: list[str]  # what the history shows the workload used (WORKLOAD_USES)
    faults: list[str]  # the fault kinds applied
    windows: list[WindowCoverage]
    events: dict[str, int]  # events by name, counted
    cells: list[list[str | None]]  # [feature, fault kind, event or null], sorted
    error: str  # the plugin's events could not be read: why (the rest is then absent)


class CheckerSummary(TypedDict, total=False):
    """One checker's own outcome, kept under ``checkers.<name>`` of a run's ``results.json``.

    The run's ``verdict`` is ``compose_verdicts`` of these; its ``reason`` names the checker(s)
    that gave it. The checker whose result is the run's body (the queue results above) keeps
    its summary only; any other keeps its findings too.
    """

    valid: Valid
    verdict: Verdict | None  # None: the checker returned none (counts as unknown)
    reason: str | None
    engine: str | None
    counts: dict[str, int | None] | None
    notes: list[str]
    error: str | None  # the checker raised: "Type: message" (its verdict is unknown)
    anomalies: dict[str, list[dict]]  # examples per kind of finding (capped by the checker)


class KindGrade(TypedDict):
    """One fault kind over the graded runs that had it.

    The denominator is the confirmed messages whose confirm-to-drain interval overlapped
    a window of this kind (``ExposureRow``); one message can count under several kinds.
    """

    fault_kind: str
    runs: int  # graded runs with messages exposed to this kind
    runs_lost: int  # of those, runs that lost an exposed message
    confirmed: int
    lost: int
    loss_rate: float | None  # pooled: lost / confirmed
    low: float | None  # bootstrap percentile interval over runs; None from one run or with no loss
    high: float | None


class RecoveryGrade(TypedDict):
    """Recovery after the heals of one fault kind over the graded runs that had one.

    A sample is one healed step and queue of a run (``Recovery``); the statistics are over the
    samples that recovered, pooled, by nearest rank; their intervals come from a seeded bootstrap
    that resamples whole runs. ``runs_never`` counts runs where a queue did not come back after a
    step of this kind (a sample not recovered, or a queue of ``Liveness.unavailable`` following
    such a step), bounded by an exact (Clopper-Pearson) interval over runs.
    """

    fault_kind: str
    runs: int
    samples: int
    recovered: int  # samples that recovered
    median_s: float | None
    p90_s: float | None
    max_s: float | None
    median_low: float | None  # bootstrap percentile intervals; None from one run or no recovery
    median_high: float | None
    p90_low: float | None
    p90_high: float | None
    max_low: float | None
    max_high: float | None
    runs_never: int
    never_low: float | None  # exact interval of the share of runs that never recovered; None below 2 runs
    never_high: float | None


class RunGrade(TypedDict):
    run_dir: str
    seed: int | None
    verdict: Verdict
    valid: Valid
    checkers: dict[str, Verdict | None]  # each checker's own verdict (the run's is the worst of them)
    graded: bool  # its loss outcome is known (nothing missing, or missing after a completed drain)
    confirmed: int
    lost: int
    unexpected: int
    reason: str
    anomalies: dict[str, int]  # the anomaly classes that occurred in it (``Anomalies.counts``)


class Grade(TypedDict):
    """Several seeded runs graded together; a run, not a message, is one trial.

    Runs that are not ``graded`` appear in ``runs`` and ``verdicts`` only. Every bound
    needs at least two graded runs; below that the bound fields are None.
    """

    schema: int
    runs: list[RunGrade]
    verdict: Verdict  # the worst over runs (VERDICT_ORDER)
    verdicts: dict[str, int]  # runs per verdict
    confidence: float  # of every interval below
    graded_runs: int
    excluded_runs: int  # loss outcome unknown: neither durable nor lossy
    runs_lost: int  # graded runs that lost at least one message
    runs_lost_interval: Literal["one-sided", "two-sided", "none"]  # exact (Clopper-Pearson) over runs
    runs_lost_low: float | None  # share of runs that lose messages
    runs_lost_high: float | None
    confirmed: int  # summed over graded runs
    lost: int
    loss_rate: float | None  # pooled: lost / confirmed
    loss_low: float | None  # per-message rate, percentile bootstrap resampling whole runs
    loss_high: float | None
    bootstrap_resamples: int
    bootstrap_seed: int
    statement: str  # the headline sentence (see spark_reports.engines.grade.describe_grade for all of them)
    per_kind: list[KindGrade]
    anomalies: dict[str, list[int]]  # per anomaly class that occurred: [runs with it, count over runs]
    recovery: list[RecoveryGrade]  # per fault kind, over every run with liveness results
