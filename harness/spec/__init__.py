"""The contracts between the parts of brokerchaos, in one place.

``faults/``, ``plugins/``, ``spark_reports/`` and third-party plugins import these
(directly or through ``harness``), never the harness's internals:

- ``hooks``: every hook the host calls (registration, configuration, run lifecycle, reports);
- ``registry``: what the registration hooks receive (brokers, clients, faults, checkers, capabilities);
- ``broker``: the broker plugin (image, node spec, readiness, cluster formation, capabilities);
- ``client``: the workload driver a client plugin provides for one protocol;
- ``fault``: a fault kind (resolve, apply, heal, heal_all, the evidence it measured; the capabilities
  and host features it needs);
- ``coverage``: the features a broker declares, the events it reports, the cells a run reaches;
- ``history``: the history schema every driver writes and every checker reads, and the protocol of its writer;
- ``results``: the results schema every checker returns;
- ``scenario``: the scenario model (every section a run, a driver, a fault and a checker read);
- ``errors``: the errors a user can cause, which plugins raise (``ScenarioError``, ``FaultError``, ...);
- ``validate``: the field checks a file the user writes is held to (each raises ``ScenarioError``).

The package imports nothing of the harness: the harness builds on it.
"""

from __future__ import annotations

from harness.spec.broker import (
    BASE_CAPABILITIES,
    BROKER_ROLE,
    CORRUPTION_RESPONSES,
    BrokerPlugin,
    BrokerVersion,
    HeldTotal,
    ImageRecipe,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    NotYet,
    Role,
    SharedVolume,
    UnsyncedWrite,
    control_broker,
    depth_empty,
    depth_value,
    node_role,
    poll,
    run_or_fail,
    wait_until_running,
)
from harness.spec.client import (
    DEAD_LETTER_EXCHANGE,
    DELAYED_EXCHANGE,
    Delays,
    DrainReader,
    DrainView,
    Driver,
    DriverOptions,
    Endpoint,
    NoCopy,
    NodeDrain,
    NodeHoldings,
    QueueDepth,
    QueueHolders,
    RateLimiter,
    ThreadBridge,
    ThreadQueue,
)
from harness.spec.coverage import (
    RECOVERY_NS,
    WORKLOAD_USES,
    BrokerEvent,
    Cell,
    Feature,
    LogEvent,
    events_from_lines,
)
from harness.spec.fault import (
    HOST_FEATURES,
    ClusterNodes,
    ConformanceProbe,
    Evidence,
    Fault,
    FaultContext,
    combine_evidence,
    role_of,
)
from harness.spec.history import (
    ABANDON_CAUSES,
    FIELDS,
    HOLDINGS,
    OFFSETS,
    READ,
    SCHEMA_VERSION,
    SEEK,
    SPARSE,
    TX_OPS,
    TYPES,
    Invocation,
    Recorder,
    arrow_schema,
    body_digest,
    body_ids,
    dead_letter_queue,
    entry_id,
    entry_offset,
    is_dead_letter_queue,
    message_body,
)
from harness.spec.registry import Registry
from harness.spec.scenario import (
    BrokerSection,
    ConsumerSection,
    DelaySection,
    Scenario,
    TransactionsSection,
    WorkloadSection,
)

__all__ = [
    "ABANDON_CAUSES",
    "BASE_CAPABILITIES",
    "CORRUPTION_RESPONSES",
    "FIELDS",
    "HOLDINGS",
    "HOST_FEATURES",
    "OFFSETS",
    "READ",
    "SCHEMA_VERSION",
    "SEEK",
    "SPARSE",
    "TX_OPS",
    "TYPES",
    "RECOVERY_NS",
    "WORKLOAD_USES",
    "BrokerEvent",
    "BrokerPlugin",
    "Cell",
    "Feature",
    "LogEvent",
    "events_from_lines",
    "combine_evidence",
    "BrokerSection",
    "ClusterNodes",
    "ConformanceProbe",
    "ConsumerSection",
    "DEAD_LETTER_EXCHANGE",
    "DELAYED_EXCHANGE",
    "DelaySection",
    "Delays",
    "Driver",
    "DrainReader",
    "DrainView",
    "DriverOptions",
    "Endpoint",
    "Evidence",
    "Fault",
    "FaultContext",
    "ImageRecipe",
    "BrokerVersion",
    "Invocation",
    "NodeHandle",
    "BROKER_ROLE",
    "HeldTotal",
    "NoCopy",
    "NodeDrain",
    "Role",
    "SharedVolume",
    "ThreadBridge",
    "ThreadQueue",
    "depth_empty",
    "depth_value",
    "NodeHoldings",
    "NodeInfo",
    "NodeSpec",
    "NotYet",
    "QueueDepth",
    "QueueHolders",
    "RateLimiter",
    "Recorder",
    "Registry",
    "Scenario",
    "TransactionsSection",
    "UnsyncedWrite",
    "WorkloadSection",
    "arrow_schema",
    "body_ids",
    "body_digest",
    "dead_letter_queue",
    "is_dead_letter_queue",
    "entry_id",
    "entry_offset",
    "message_body",
    "control_broker",
    "poll",
    "role_of",
    "run_or_fail",
    "node_role",
    "wait_until_running",
]
