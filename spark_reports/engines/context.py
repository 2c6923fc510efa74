"""What a check knows before the big pass: the scenario's values, the fault windows, the drain and the run's span."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.spec.history import DEPTH
from harness.spec.results import (
    SCHEMA_VERSION,
    Drain,
    FaultWindow,
    NodeDown,
    StuckQueue,
)
from spark_reports.engines.common import NEMESIS, bucket_width_s
from spark_reports.engines.drain import (
    DrainRange,
    DrainSpan,
    drain_ops,
    drain_ranges,
    drain_status,
    stuck_queues,
)
from spark_reports.engines.final_heal import nodes_down
from spark_reports.engines.params import Params, scenario_params
from spark_reports.engines.windows import fault_windows


@dataclass
class Context:
    """What an engine needs to know before its big pass: windows, drain, buckets, the model."""

    end_ns: int
    ops: int
    windows: list[FaultWindow]
    drain: Drain
    bucket_s: int
    history_schema: int
    params: Params
    spans: list[DrainSpan]
    notes: list[str]
    stuck: list[StuckQueue] = field(default_factory=list)
    stuck_drain: bool = False  # every unfinished drain was held up only by nodes in ``stuck``
    #: The broker declared disjoint nodes (``BrokerPlugin.disjoint_nodes``) and the workload had
    #: consumers: the drain ops, whose reads of a message are its stranding (``StrandedGroup``);
    #: ``spans`` is then empty (a message on one node is no copy of one another node gave up).
    drain_reads: list[DrainRange] = field(default_factory=list)
    #: The nodes the final heal could not bring back, and the client nodes that did (None: every
    #: node came back; ``final_heal.nodes_down``).
    down: list[NodeDown] = field(default_factory=list)
    serving: list[str] | None = None
    #: A node that did not come back may hold messages no other node has (its broker declared
    #: disjoint nodes): what the drain did not read is unreachable, not lost.
    down_holds: bool = False

    @property
    def drain_end_ns(self) -> int:
        """Where a lost message's exposure ends: the completed drain, else the history's end."""
        if self.drain["completed"] and self.drain["end_ns"] is not None:
            return self.drain["end_ns"]
        return self.end_ns

    @property
    def acks(self) -> bool:
        """Schema 2: consumption is an ack that completed ok; schema 1: a delivery."""
        return self.history_schema >= 2

    @property
    def check_bodies(self) -> bool:
        return self.acks and self.params.bodies_known


def make_context(
    ops: int,
    end_ns: int | None,
    small_rows: list[dict],
    scenario: dict | None,
    history_schema: int | None,
    *,
    disjoint: bool = False,
) -> Context:
    """small_rows: every nemesis op and every drain op of the history.

    history_schema: the lowest ``schema`` of the history's records (None when it has none).
    disjoint: the run's broker declared that its nodes hold disjoint messages
    (``harness.spec.rundir.disjoint_nodes``).
    """
    end = end_ns or 0
    version = SCHEMA_VERSION if history_schema is None else history_schema
    params = scenario_params(scenario)
    nem = [r for r in small_rows if r.get("process") == NEMESIS]
    drains = [r for r in small_rows if r.get("f") == "drain" and r.get("process") != NEMESIS]
    depths = [r for r in small_rows if r.get("f") == DEPTH and r.get("process") != NEMESIS]
    _, spans = drain_ops(drains)
    stuck, stuck_drain = stuck_queues(drains, depths)
    notes = []
    if version < 2:
        notes.append(
            f"schema-{version} history: acks were recorded ok when written, not once the broker had "
            "them, so a delivery counts as consumed; ack outcomes, abandons, resurrections, bodies and "
            "split-brain copies are not checked"
        )
        spans = []
    elif not params.bodies_known:
        notes.append("bodies not verified: the scenario gives no seed and workload.message_size")
    reads = drain_ranges(drains) if disjoint and version >= 2 and params.consumers else []
    if disjoint:
        spans = []
    down, serving = nodes_down(nem)
    return Context(
        end_ns=end,
        ops=ops,
        windows=fault_windows(nem, end),
        drain=drain_status(drains),
        bucket_s=bucket_width_s(end),
        history_schema=version,
        params=params,
        spans=spans,
        notes=notes,
        stuck=stuck,
        stuck_drain=stuck_drain,
        drain_reads=reads,
        down=down,
        serving=serving,
        down_holds=disjoint and bool(down),
    )
