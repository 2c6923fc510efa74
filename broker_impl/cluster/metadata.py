"""Cluster-wide metadata: a last-writer-wins table of entities, merged by every node.

Every vhost, user, permission, policy, exchange, queue (with its master node)
and binding is one entry ``key -> (generation, stamp, data)``; ``data is None``
is a tombstone. ``stamp`` is ``(lamport, node)``, so two nodes never produce
the same stamp and every node orders any two writes the same way.

``generation`` counts the owners an entry has had: a write that changes who
owns it (a queue's ``master``; for any entry, its creation or deletion) is one
generation past the entry it replaces, any other write keeps the generation.
Entries are ordered by ``(generation, stamp)``. A promotion is written by the
mirror that saw the master's record, so it is a generation past everything
that master writes without knowing of it: the old master cut off from the
promoter, or restarted from its own persisted table, goes on stamping its
record (its mirrors leave, its start-up recovery), and by the Lamport clock
alone those stamps may be the later ones. Its record then won the merge, the
promoted master dropped its copy, and everything that copy had confirmed was
lost (``scenarios/reference-master-restart-after-promotion.yaml``). RabbitMQ
orders the same way: a node that restarts after its queue's master moved
joins as a mirror of the current master, its own contents discarded.

How a change travels: the node where it happens diffs its own topology against
the table (``diff``), stamps what differs and sends the new entries to every
reachable peer; a peer keeps an entry only if its stamp is newer than what it
has (``merge``), so applying the same entries twice, or out of order, ends in
the same table. When a link comes up both sides send their whole table, which
is how a joining or returning node catches up.

Consistency model, honestly: this is eventual consistency, not consensus.
During a partition each side accepts declarations on its own; on heal the
later entry wins key by key. A queue declared on both sides keeps one master
(the later declaration) and the other side's copy, with its messages, is
discarded: the same outcome as RabbitMQ's ``ignore``/``autoheal`` for the
losing side; a queue whose mirror was promoted on one side keeps the promoted
master (a generation later). A delete on one side and a redeclare on the other
resolve by the generation, then the stamp.

Each node persists its table with the stamps (``catalog``, ``cluster.json``,
fsynced on every change), so a whole-cluster cold start resumes the same
order: a queue's master is the node last recorded as master, as RabbitMQ
recovers a durable queue on the node of its recorded master. Rebuilding the
table from each node's ``metadata.json`` alone gave every node a fresh claim to
every durable queue it knew, and the highest node name won.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker_impl.exchange import destination_exchange

if TYPE_CHECKING:
    from broker_impl.cluster.host import ClusterHost

Stamp = tuple[int, str]


@dataclass(slots=True)
class Entry:
    stamp: Stamp
    data: dict[str, Any] | None
    generation: int = 0

    @property
    def rank(self) -> tuple[int, Stamp]:
        """The order of two writes of one key: the later generation, then the later stamp."""
        return (self.generation, self.stamp)

    def to_json(self) -> list[Any]:
        return [self.stamp[0], self.stamp[1], self.data, self.generation]

    @classmethod
    def from_json(cls, raw: list[Any]) -> Entry:
        """A table persisted before generations were recorded reads as generation 0."""
        return cls((int(raw[0]), str(raw[1])), raw[2], int(raw[3]) if len(raw) > 3 else 0)


def _owner(data: dict[str, Any] | None) -> str | None:
    """Who owns an entry: a queue's master; None for a tombstone ("" for a live entry without an owner)."""
    return None if data is None else str(data.get("master", ""))


def _generation(current: Entry | None, data: dict[str, Any] | None) -> int:
    """A write's generation: one past the entry it replaces when it changes the owner, else the same."""
    if current is None:
        return 0
    return current.generation + (_owner(current.data) != _owner(data))


def key(kind: str, *parts: str) -> str:
    """Keys are JSON arrays so names may contain any character."""
    return json.dumps([kind, *parts], separators=(",", ":"))


def split_key(k: str) -> list[str]:
    return json.loads(k)


class Table:
    """The merged view one node holds."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.clock = 0
        self.entries: dict[str, Entry] = {}

    def live(self) -> dict[str, dict[str, Any]]:
        return {k: e.data for k, e in self.entries.items() if e.data is not None}

    def diff(self, current: dict[str, dict[str, Any]]) -> dict[str, Entry]:
        """Stamp every local difference from the table; returns the entries to send."""
        out: dict[str, Entry] = {}
        for k, data in current.items():
            e = self.entries.get(k)
            if e is None or e.data != data:
                out[k] = self._stamp(k, data)
        for k, e in list(self.entries.items()):
            if e.data is not None and k not in current:
                out[k] = self._stamp(k, None)
        return out

    def set(self, k: str, data: dict[str, Any] | None) -> Entry:
        """A change decided here (e.g. a new master) rather than found by diffing."""
        return self._stamp(k, data)

    def _stamp(self, k: str, data: dict[str, Any] | None) -> Entry:
        self.clock += 1
        e = Entry((self.clock, self.me), data, _generation(self.entries.get(k), data))
        self.entries[k] = e
        return e

    def merge(self, incoming: Iterable[tuple[str, Entry]]) -> dict[str, Entry]:
        """Keep the later of each pair (``Entry.rank``); returns the entries that changed here."""
        changed: dict[str, Entry] = {}
        for k, e in incoming:
            self.clock = max(self.clock, e.stamp[0])
            cur = self.entries.get(k)
            if cur is None or e.rank > cur.rank:
                self.entries[k] = e
                if cur is None or cur.data != e.data:
                    changed[k] = e
        return changed

    def encode(self, entries: dict[str, Entry] | None = None) -> dict[str, list[Any]]:
        src = self.entries if entries is None else entries
        return {k: e.to_json() for k, e in src.items()}

    @staticmethod
    def decode(raw: dict[str, list[Any]]) -> list[tuple[str, Entry]]:
        return [(k, Entry.from_json(v)) for k, v in raw.items()]

    def dump(self) -> bytes:
        return json.dumps({"clock": self.clock, "entries": self.encode()}, separators=(",", ":")).encode()

    @classmethod
    def load(cls, me: str, raw: bytes) -> Table:
        """A table as ``dump`` wrote it; raises ``ValueError`` (or ``KeyError``/``TypeError``) on anything else."""
        data = json.loads(raw)
        t = cls(me)
        t.entries = dict(cls.decode(data["entries"]))
        t.clock = max([int(data["clock"]), *(e.stamp[0] for e in t.entries.values())])
        return t


def collect(
    broker: ClusterHost, master_of: dict[tuple[str, str], dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """This node's topology in table form; ``master_of`` supplies each queue's cluster fields."""
    out: dict[str, dict[str, Any]] = {}
    for name in broker.vhosts:
        out[key("vhost", name)] = {}
    for name, u in broker.users.items():
        out[key("user", name)] = {"password_hash": u["password_hash"], "tags": list(u["tags"])}
    for (user, vhost), perm in broker.permissions.items():
        out[key("perm", user, vhost)] = {"configure": perm.configure, "write": perm.write, "read": perm.read}
    for (vhost, name), policy in broker.policies.items():
        out[key("policy", vhost, name)] = dict(policy)
    for vname, vh in broker.vhosts.items():
        shared = set()
        for q in vh.queues.values():
            if q.exclusive_owner is not None or q.deleted:
                continue
            shared.add(q.name)
            extra = master_of.get((vname, q.name), {})
            out[key("queue", vname, q.name)] = {
                "durable": q.durable,
                "auto_delete": q.auto_delete,
                "arguments": _plain(q.arguments),
                **extra,
            }
        for ex in vh.exchanges.values():
            if ex.name == "" or ex.name.startswith("amq."):
                continue
            out[key("exchange", vname, ex.name)] = {
                "type": ex.type,
                "durable": ex.durable,
                "auto_delete": ex.auto_delete,
                "internal": ex.internal,
                "arguments": _plain(ex.arguments),
            }
        for b in vh.bindings():
            to_exchange = destination_exchange(b.destination)
            if b.destination not in shared and (to_exchange is None or to_exchange not in vh.exchanges):
                continue
            args = _plain(b.arguments)
            out[
                key(
                    "binding", vname, b.source, b.destination, b.routing_key, json.dumps(args, sort_keys=True)
                )
            ] = {
                "arguments": args,
            }
    return out


def _plain(value: Any) -> Any:
    """Queue and exchange arguments as JSON gives them back, so a diff after a round trip is empty."""
    return json.loads(json.dumps(value, default=str))


def queue_options(data: dict[str, Any]) -> dict[str, Any]:
    """A queue record's declare options, as ``collect`` writes them: durable, auto_delete, arguments."""
    return {
        "durable": data["durable"],
        "auto_delete": data["auto_delete"],
        "arguments": data.get("arguments") or {},
    }
