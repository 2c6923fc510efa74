"""The results schema both checkers return.

Both engines (Spark and the pure-Python twin) must produce dictionaries of exactly
this shape so the harness, the report renderer and the grader never care which one
ran, and so the property tests can compare the two outputs field by field.

Times in the results are nanoseconds since run start (the history's ``time_ns``)
unless a field name ends in ``_ms`` or ``_s``. Latencies are computed on whole
microseconds (``floor(ns / 1000)``), percentiles by nearest rank, so both engines
can agree exactly without floating-point tie-breaking.
"""

from __future__ import annotations

from typing import Literal, TypedDict

SCHEMA_VERSION = 1
LIST_CAP = 1000
"""Lists of message ids (lost, unexpected, ...) are capped so results stay small."""

Verdict = Literal["durable", "LOST", "INTEGRITY", "unknown"]
Valid = bool | Literal["unknown"]


class Counts(TypedDict):
    """Message-level counts; a message is one id, however many attempts it had."""

    attempted: int  # ids with at least one publish invoke
    confirmed: int  # ids with at least one publish ok
    failed: int  # ids whose every attempt failed definitely
    unknown: int  # ids not confirmed with at least one indeterminate attempt
    publish_attempts: int  # publish invokes (an id retried counts once per attempt)
    consumed_unique: int  # ids with at least one consume ok (attempted or not)
    consumed_total: int  # consume ok records
    lost: int  # confirmed, never consumed
    unexpected: int  # consumed, never attempted
    duplicated: int  # consumed more than once
    recovered: int  # attempted, not confirmed, consumed
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
    consumed: int
    deliveries: list[Delivery]  # first DELIVERY_CAP deliveries by index


class FaultWindow(TypedDict):
    """A fault from its invoke to the ok of the heal that names it (or history end)."""

    fault_id: str
    kind: str
    node: str | None
    start_ns: int
    end_ns: int
    applied: bool  # the fault's own op completed ok
    healed: bool  # a heal naming it completed ok
    params: dict


class LostAttribution(TypedDict):
    id: str
    confirm_node: str | None
    confirm_ns: int
    fault_ids: list[str]  # windows overlapping [confirm_ns, drain_end_ns]
    fault_kinds: list[str]  # distinct kinds of those windows, sorted; ["none"] if there are none


class AttributionRow(TypedDict):
    fault_kind: str
    node: str | None  # the node that confirmed the lost message
    count: int


class ExposureRow(TypedDict):
    """Confirmed messages whose confirm-to-drain interval overlaps a window of this kind.

    This is the denominator the grader uses per fault kind: of the messages a fault
    of this kind could have hit, how many were lost.
    """

    fault_kind: str
    confirmed: int
    lost: int


class Attribution(TypedDict):
    drain_end_ns: int
    rows: list[AttributionRow]  # over every lost message, not only the capped list
    exposure: list[ExposureRow]
    messages: list[LostAttribution]  # for the capped lost list


class Percentiles(TypedDict):
    n: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


class Latency(TypedDict):
    confirm_ms: Percentiles  # publish invoke -> ok, per confirmed attempt
    e2e_ms: Percentiles  # first publish invoke -> first consume ok, per consumed attempted id


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


class Drain(TypedDict):
    invoked: int
    completed: bool  # every drainer's last drain completed ok
    end_ns: int | None  # time of the last drain ok


class Results(TypedDict):
    schema: int
    engine: Literal["spark", "python"]
    valid: Valid
    verdict: Verdict
    reason: str
    counts: Counts
    lost: list[str]
    lost_truncated: bool
    lost_detail: list[MessageDetail]
    unexpected: list[str]
    unexpected_truncated: bool
    unexpected_detail: list[MessageDetail]
    duplicated: list[MessageDetail]
    recovered: list[MessageDetail]
    order_violations: list[OrderViolation]
    attribution: Attribution
    latency: Latency
    availability: list[AvailabilityRow]
    timeline: Timeline
    faults: list[FaultWindow]
    drain: Drain
    end_ns: int


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


class RunGrade(TypedDict):
    run_dir: str
    seed: int | None
    verdict: Verdict
    valid: Valid
    graded: bool  # its loss outcome is known (nothing missing, or missing after a completed drain)
    confirmed: int
    lost: int
    unexpected: int
    reason: str


class Grade(TypedDict):
    """Several seeded runs graded together; a run, not a message, is one trial.

    Runs that are not ``graded`` appear in ``runs`` and ``verdicts`` only. Every bound
    needs at least two graded runs; below that the bound fields are None.
    """

    schema: int
    runs: list[RunGrade]
    verdict: Verdict  # the worst over runs: LOST, then INTEGRITY, then unknown, else durable
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
    statement: str  # the headline sentence (see spark_reports.grade.describe_grade for all of them)
    per_kind: list[KindGrade]
