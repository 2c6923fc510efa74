"""The history: the one contract between workload, faults and checkers.

One record per operation; JSONL while a run is being written, Parquet for the
checkers. Schema version 2 (``schema`` column):

========== ====== ===============================================================
field      type   meaning
========== ====== ===============================================================
index      int64  global order of the records
time_ns    int64  monotonic nanoseconds since run start
wall_time  str    ISO time, for people
process    str    ``p1``.. producers, ``c1``.. consumers, ``d1``.. drainers, ``nemesis``
node       str    the node a client talked to, or a fault's target
type       str    ``invoke`` | ``ok`` | ``fail`` | ``info``
f          str    operation (below), or a fault name, or ``heal``
queue      str    queue name (client operations)
value      str    message id ``producer:seq``; JSON text for fault and drain parameters
redelivered bool  on ``consume`` completions: the broker's redelivered flag
error      str    why a completion is ``fail`` or ``info``
digest     str    on ``consume`` ok: ``body_digest`` of the body as delivered
detail     str    JSON text with what else a record needs (an abandon's cause, a body
                  that failed its check, a drain's per-node view)
schema     int32  this version
========== ====== ===============================================================

Every invoke has exactly one completion by the same process. Client operations:

- ``publish``: invoke when sent; ``ok`` = confirmed, ``fail`` = nacked, ``info`` = unknown.
  The AMQP driver publishes ``mandatory`` (but for a delayed publish), so a broker that routes a
  publish to no queue (a node reset out of its cluster has none) returns it (``basic.return``,
  312 ``NO_ROUTE``) before it confirms it: that publish is ``fail``, not a confirmed message lost.
  Publishes inside a transaction are not mandatory yet.
  A delayed publish (``workload.delay``) carries ``{"delay_ms": n}`` in its invoke's
  ``detail``: the delay it asked the broker for. Its due time is judged on the harness's
  own clock: the invoke's ``time_ns`` plus the delay (the broker received it no earlier,
  so a broker that holds it the full delay cannot deliver before that).
- ``consume``: a delivery arrived (invoke and ``ok`` together; ``value`` is the id from
  the message's properties, ``digest`` the body's digest, ``redelivered`` the flag).
  A delivery is not a consumption: only an ack that completes ``ok`` is.
- ``ack``: invoke when the ack is written; ``ok`` only once the broker has certainly
  processed it (a later synchronous round trip on the same channel completed, or the
  channel closed cleanly: AMQP processes a channel's frames in order); ``info`` if the
  channel or connection failed first (the broker may or may not have it).
  A delivery from a dead-letter queue (``workload.dead_letter``: a queue named
  ``dead_letter_queue(q)``, ``q.dead``) carries in its ``ok``'s ``detail``
  ``{"dead_letter": {"reason": r, "queue": q}}``: the newest ``x-death`` entry's reason
  (``expired``, ``rejected``, ``maxlen``) and the queue it died in (null each when the message
  carries no ``x-death``). A message consumed (acked ``ok``) from either queue counts as
  consumed; the checkers count those consumed from a dead-letter queue as ``dead_lettered``.
- ``abandon``: a delivery the consumer gives back unacked (``detail`` =
  ``{"cause": one of ABANDON_CAUSES}``): ``ok`` once the broker certainly knows it
  (nack round trip, recover-ok, close-ok, or the connection cut by the client),
  ``info`` otherwise. Every abandoned delivery must be delivered again.
- ``drain``: one per queue and drainer, ``value`` = JSON of what the drain saw per node;
  ``ok`` only if every node reported the queue empty (ready and unacked) and stayed
  idle, ``info`` if the drain could not finish. A stream's driver adds what it can tell of
  the stream (``DrainReader.extra``): each server's own view under ``replicas``, and
  ``"offsets": "sparse"`` when its offsets are sparse (below). ``no_copy`` (``{node: why}``)
  names the nodes whose last answer was that they hold no copy to drain (left out of the
  rule; ``harness.spec.client.NoCopy``), and ``gone`` those whose last answer was the cluster
  saying the queue does not exist (``NoCopy.gone``); each round lists both by name. A drain
  ``ok`` with ``gone`` ended because every node answered so in one round: complete (what was
  confirmed and never consumed is lost), but no sign the queue came back.
- ``depth``: one per look the drain takes at a node's queue depth (added in schema 2, so
  older histories lack it): invoke by the drainer when it asks the broker plugin
  (``node``, ``queue``); ``ok`` with ``value`` = ``{"ready": n, "unacked": n or null,
  "own_unacked": n, "clients": n}``: the broker's counts, the deliveries the drain itself
  still held (none once its consumer is cancelled and every ack confirmed, which is when it
  asks), and how many client connections the harness still had open on that queue besides
  the drain's own (0 once the workload's consumers are closed). A plugin that can say what
  holds the deliveries adds ``"holders"`` (a list of what its broker lists: channels or
  consumers). ``info`` with the error when the plugin's command failed or could not tell.
  Unacked deliveries with ``clients`` 0 and ``own_unacked`` 0 are held for consumers that
  no longer exist: the checkers call the confirmed messages the drain could not obtain
  there ``stuck``.
- ``read``: one entry an ordered stream reader (``workload.readers``: ``r1``.. ``rN``, each
  reading the whole stream from its start, in order, without acking) got: invoke and ``ok``
  together, ``value`` the message id, ``digest`` its body's digest, ``detail`` =
  ``{"stream_seq": n}`` (the entry's offset). A read takes nothing from the stream.
- ``seek``: a reader restarting on purpose (reconnect, reassignment) from offset n, before
  its next read: invoke and ``ok`` together, ``detail`` = ``{"stream_seq": n}``. A stream
  consumer that its broker activates in a consumer group (RabbitMQ's single active consumer)
  and that resumes after its group's stored offset records one too, before its next
  ``consume``; the stream anomaly classes pair a seek only with reads of the same process.

Stream offsets (``detail.stream_seq`` of a stream's ``publish`` ok, ``consume``, ``read`` and
``seek``, and the ``offset`` of a ``holdings`` entry) are one kind of value for every broker: an
int64 *ordered key*, the entry's position in its stream, compared as integers (Parquet, JSON and
Spark SQL read it as a BIGINT, exactly). Two shapes:

- *dense* (the default): the stream numbers its entries 1, 2, 3.. with no holes (JetStream's
  stream sequence), so every integer between two offsets of a stream was an entry;
- *sparse*: the offsets are ordered but far apart, and only the entries somebody saw are known
  to exist (a Redis Streams entry id ``ms-seq`` is the offset ``ms * 1_000_000 + seq``:
  ``entry_offset``, its inverse ``entry_id``). The drain op of such a stream says so
  (``"offsets": "sparse"`` in its value), and checkers then never walk the integers between
  two offsets: an offset exists when a node's copy (``holdings``), a read, a delivery or a
  confirm shows it.

A reader restarting after the entry at offset n records a ``seek`` to n + 1 in either shape (for
Redis: ``XREAD`` from the last id read returns the entries after it, the first possibly at n + 1).

Per-node holdings, recorded by the harness after the drain (added without changing the
schema version; a history without them is one whose broker plugin cannot tell):

- ``holdings``: what one node's own copy of a queue holds once the drain has ended, from
  the broker plugin's ``node_holdings`` (``harness.spec.broker``), asked of every node for
  every queue: process ``holdings``, ``f`` ``holdings``, ``node``, ``queue``; invoke when
  asked, then ``ok`` with ``value`` = ``{"entries": [[offset, id], ...]}`` (the copy's
  order; ``offset`` the entry's stream position, or null for a queue without offsets), or
  ``info`` with the error (the plugin's command failed, or it could not tell this node). A
  plugin that does not implement the hook (queue brokers: a consumed message is gone from
  every copy) adds no ``holdings`` ops. Meaningful for streams, whose entries stay after
  consumption: an id one node holds and another lacks, or two nodes holding one id at
  different offsets, is what the checkers read here.

Fault actions (process ``nemesis``): the invoke of a fault op carries ``value`` =
``{"fault_id", "kind", "params", "hold", "workload_start_s"}``, its ``ok`` the same plus ``done``
(what was actually done: proxies, toxics, pids, signals, files) and ``evidence`` (added without
changing the schema version; histories without it are ones whose nemesis measured nothing):
``harness.spec.fault.Evidence.as_dict()``, what the fault measured of its own effect while it
was held (``effect`` true, false or null, ``summary``, ``no_effect_reason``, ``flags``, ``facts``).
A ``heal`` op's ``ok`` (``value.fault_ids`` names the faults it undid) carries ``evidence`` too:
the healed fault's evidence completed after the heal (``restored``; it supersedes the one on the
fault's ``ok``). The final heal (``value.final``) carries none. When it cannot bring a node back
(its broker does not start, or is not ready within the broker plugin's ``ready_timeout``:
``harness.spec.errors.NodesDown``) it completes ``info`` (``error`` names the nodes) with
``value.down`` = ``{node: why}`` (the first line the summary with the broker's exit code as the
node's init saw it, then the broker's last log lines) and ``value.serving``, the client nodes that
did come back: that is those nodes' outcome, and the run goes on to drain through ``serving``
(with none, no drain op is recorded). Any other failure of the final heal ends the run (exit 2).

Transactions (AMQP ``tx``; ``workload.transactions``), added without changing the
operations above: a transactional producer's messages are still ``publish`` ops and
a transactional consumer's acks still ``ack`` ops, each completed with the outcome
of the transaction that carried it, so checkers that know nothing of transactions
read them as before. Each transaction adds one op:

- ``commit``: invoke when ``tx.commit`` is sent; ``value`` = the transaction's id
  (``process:txN``), ``queue`` its queue, ``detail`` = ``{"publish": [ids]}`` or
  ``{"ack": [ids]}`` (every operation it covers). ``ok`` = commit-ok arrived: the
  transaction certainly committed (its publishes ``ok``, its acks ``ok``); ``info``
  = unknown (its publishes and acks ``info``). A broker's refusal of a commit
  ("partial tx completion") is ``info`` too: part of it may have been applied.
- ``rollback``: the transaction certainly did not commit: ``tx.rollback`` was sent,
  or the channel ended before ``tx.commit`` was (a broker rolls back an open
  transaction when its channel closes; ``detail.cause`` then says why). Same
  ``value``/``queue``/``detail``; ``ok`` or ``info`` only says whether the
  rollback-ok arrived: either way its publishes and acks complete ``fail``. Acks
  rolled back leave their deliveries unacked on the channel (AMQP), to be acked
  again or abandoned.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol

SCHEMA_VERSION = 2
FIELDS = (
    "index",
    "time_ns",
    "wall_time",
    "process",
    "node",
    "type",
    "f",
    "queue",
    "value",
    "redelivered",
    "error",
    "digest",
    "detail",
    "schema",
)
TYPES = ("invoke", "ok", "fail", "info")
TX_OPS = ("commit", "rollback")
"""The ``f`` of a transaction's own op (the ids it covers are in ``detail``)."""
EVIDENCE = "evidence"
"""The key of a nemesis op's ``ok`` value that holds what the fault measured of its effect (above)."""
DEPTH = "depth"
"""The ``f`` of the drain's look at a node's queue depth (see above)."""
HOLDINGS = "holdings"
"""The ``process`` and ``f`` of the harness's look at what each node's copy holds after the drain."""
READ, SEEK = "read", "seek"
"""The ``f`` of a reader's read and of its seek (see above)."""
STREAM_OPS = frozenset({HOLDINGS, READ, SEEK})
"""The ``f`` of the operations the stream anomaly classes are computed from: a history with none
has every one of them empty."""
DEAD_LETTER_SUFFIX = ".dead"
"""A workload queue's dead-letter queue is its name and this suffix (``chaos-1.dead``)."""


def dead_letter_queue(queue: str) -> str:
    """The dead-letter queue of workload queue ``queue`` (``workload.dead_letter``)."""
    return queue + DEAD_LETTER_SUFFIX


def is_dead_letter_queue(queue: str | None) -> bool:
    """Whether an operation's ``queue`` is a dead-letter queue (what the checkers count apart)."""
    return queue is not None and queue.endswith(DEAD_LETTER_SUFFIX)


OFFSETS, SPARSE = "offsets", "sparse"
"""The key in a drain op's value that says a stream's offsets are sparse, and its value."""
ENTRY_SEQ_LIMIT = 1_000_000
"""A sparse entry id ``ms-seq`` is the offset ``ms * ENTRY_SEQ_LIMIT + seq`` (``entry_offset``)."""
OPTIONAL_FIELDS = ("error", "digest", "detail", "schema")
"""Fields a stored history may lack (written before schema 2, or by hand): readers take them as null."""
ABANDON_CAUSES = (
    "requeue",  # basic.nack / basic.reject with requeue=true
    "recover",  # basic.recover(requeue=true)
    "close",  # channel or connection closed with the delivery unacked
    "crash",  # the consumer's connection cut without a close, as when its process is killed
)


class Invocation(Protocol):
    """An open operation in the history; complete it once with ``ok``, ``fail`` or ``info``.
    Each completion returns the record it wrote."""

    f: str  # the operation
    index: int  # of the invoke record
    time_ns: int
    done: bool  # a completion was written (a second one would break the contract)

    def ok(
        self,
        value: Any = None,
        *,
        redelivered: bool | None = None,
        node: str | None = None,
        digest: str | None = None,
        detail: Any = None,
    ) -> dict[str, Any]: ...

    def fail(self, error: str, value: Any = None, *, detail: Any = None) -> dict[str, Any]: ...

    def info(self, error: str, value: Any = None, *, detail: Any = None) -> dict[str, Any]: ...


class Recorder(Protocol):
    """What a driver writes the history through (the harness's writer is one): an invoke
    returns the ``Invocation`` to complete; ``now_ns`` is the history's clock (since run start)."""

    def invoke(
        self,
        process: str,
        f: str,
        *,
        node: str | None = None,
        queue: str | None = None,
        value: Any = None,
        detail: Any = None,
    ) -> Invocation: ...

    def now_ns(self) -> int: ...


_ARROW_TYPES = {
    "index": "int64",
    "time_ns": "int64",
    "wall_time": "string",
    "process": "string",
    "node": "string",
    "type": "string",
    "f": "string",
    "queue": "string",
    "value": "string",
    "redelivered": "bool_",
    "error": "string",
    "digest": "string",
    "detail": "string",
    "schema": "int32",
}


def arrow_schema() -> Any:
    """The Parquet schema of a history (pyarrow is imported only when asked for)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, _ARROW_TYPES[name])()) for name in FIELDS])


def message_body(msg_id: str, seed: int, size: int) -> bytes:
    """The body a producer sends for ``msg_id``: ``id|check|payload``.

    ``payload`` is seeded filler (repeated hex of sha256("seed:id")) that brings the body
    to ``size`` bytes where the id leaves room; ``check`` is the first 16 hex digits of the
    payload's sha256, so a body can be verified on its own and its id read back. Written
    so that Spark SQL can compute the same bytes (sha2, repeat, substring, concat).
    """
    head = msg_id + "|"
    n = max(0, size - len(head) - 17)
    pad = hashlib.sha256(f"{seed}:{msg_id}".encode()).hexdigest()
    payload = (pad * (n // 64 + 1))[:n]
    check = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return f"{head}{check}|{payload}".encode()


_BODY_HEAD = re.compile(rb"([A-Za-z0-9_.-]+):([0-9]+)\|[0-9a-f]{16}\|")


def body_ids(data: bytes) -> set[str]:
    """Candidate ids of the message bodies (``message_body``) whose head (``id|check|``) lies in
    ``data``, raw bytes of a broker's file: what a plugin whose broker stores bodies verbatim (a
    commit log, a stream's blocks, an append-only file) maps a power cut's dropped writes with.
    The bytes before an id may look like part of it (a length byte that is a letter), so each head
    gives every suffix of its producer part that starts with a letter; the harness keeps those the
    history attempted. A body whose head was not in ``data`` is not counted."""
    out = set()
    for m in _BODY_HEAD.finditer(data):
        producer, seq = m.group(1).decode(), m.group(2).decode()
        out |= {f"{producer[i:]}:{seq}" for i in range(len(producer)) if producer[i].isalpha()}
    return out


def body_digest(body: bytes) -> str:
    """What a consumer records of a delivered body: the first 32 hex digits of its sha256."""
    return hashlib.sha256(body).hexdigest()[:32]


def entry_offset(entry_id: str) -> int:
    """A two-part stream entry id ``ms-seq`` (Redis Streams) as its sparse offset
    ``ms * 1_000_000 + seq``: ordered as the ids are, and an int64 until the year 2262. A ``seq``
    of a million or more (a million entries in one millisecond) has no offset: ``ValueError``."""
    ms, _, seq = entry_id.partition("-")
    m, s = int(ms), int(seq or 0)
    if m < 0 or not 0 <= s < ENTRY_SEQ_LIMIT:
        raise ValueError(
            f"stream entry id {entry_id!r} has no offset (seq must be below {ENTRY_SEQ_LIMIT:,})"
        )
    return m * ENTRY_SEQ_LIMIT + s


def entry_id(offset: int) -> str:
    """The entry id ``ms-seq`` of a sparse offset (``entry_offset``'s inverse)."""
    ms, seq = divmod(offset, ENTRY_SEQ_LIMIT)
    return f"{ms}-{seq}"
