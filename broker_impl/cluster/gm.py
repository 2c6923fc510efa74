"""GM: guaranteed multicast over a ring, as a deterministic sans-IO state machine.

This is the replication core of mirrored queues (RabbitMQ's ``gm.erl``): every
mirror of a queue is a member of one GM group, the master broadcasts each
queue operation, and every member delivers it to its queue process. The member
here does no I/O and owns no clock: the caller feeds it events (method calls)
and executes the actions it returns. A thin asyncio adapter (sockets, timers,
the replicated metadata store) sits on top; ``gm_sim`` drives it in-process.

Guarantee
---------
If member P broadcasts m and then m', every member that was in the group before
m was sent and delivers m' also delivers m (and before m'). Order is per sender.
Every member alive at the end delivers every message of a surviving sender sent
after it joined, exactly once; a message of a dead sender that any survivor
delivered is delivered by every survivor that was in the group when it was
sent. A *confirmed* broadcast has been delivered by every member in the ring.

"In the group" for a joiner starts at the moment its left neighbour took the
snapshot (``Catchup``) the joiner adopted; the ``Joined`` action carries that
snapshot, and it is the point from which a joiner sees everything. GM never
replays older messages to a joiner: that is the job of queue sync.

Group record
------------
One ``GroupRecord`` per group: ``name``, ``version`` (bumped on every change),
``members`` in ring order, and the ``dead`` ones. It lives in a group store
(replicated metadata in a cluster, ``InMemoryGroupStore`` in tests). The member
never touches the store itself: it emits ``ReadGroup`` / ``UpdateGroup`` and the
caller answers each with ``store_reply(request, record)``. All changes are the
pure function ``apply_op`` (``CreateGroup``, ``AddOnRight``, ``MarkDead``,
``Erase``) so every store implementation behaves the same.

A member's *view* is the record seen from itself: the next alive member on
the left and on the right, and its *aliases*: the dead members between its left
neighbour and itself, whose in-flight messages it has inherited.

Per-member state
----------------
For every member it knows (itself included) a member keeps ``pending`` (the
window of ``(pub_num, msg)`` not yet known to be acked), ``last_pub`` and
``last_ack`` (both start at -1), and for itself ``pub_count``. Pub numbers of one
sender are strictly increasing, so a window is always a contiguous run of that
sender's stream, and comparing two members' windows is arithmetic on numbers.

Messages (all travel to the right neighbour, tagged with the sender's view version)
-------------------------------------------------------------------------------------
``Activity(version, entries)``
    Each entry ``(sender, pubs, acks)``. For a sender that is neither this member
    nor one of its aliases: append new pubs to its window and deliver them, drop
    acked entries, forward the entry unchanged. For itself or an alias (the
    *origin role*): pubs coming back have been seen by the whole ring, so they
    leave the window, are forwarded as acks, and (own pubs) release
    ``confirm_token`` waiters; acks coming back are finished and stop here.
``Catchup(version, state)``
    The sender's whole per-member state, sent to a new right neighbour. A member
    without state (a joiner) adopts it silently, emits ``Joined`` and passes it on
    to its own right. A member with state computes what it missed, per sender:
    pubs in the left's window beyond its own ``last_pub``, and one cumulative ack
    up to the start of the left's window (the left dropped those, so they are
    acked), passed on even when it holds none of them, so that acks lost with a
    dead member still reach the origin.
    In the origin role, pubs the left has seen count as come back, and one
    cumulative ack for everything below its own window is sent (again), so that
    acks lost with a dead member still go round. The result is processed exactly
    like an ``Activity``.
``JoinRequest(member)``
    Sent by a joiner to a random alive member, which adds it on its right.
``Probe(version, origin, seq)``
    Passed on unchanged until it is back at ``origin``; since links are FIFO,
    everything that was in flight ahead of it has arrived by then. Used by a
    joiner that inherited dead members before it had state (below).

Rules
-----
* Only messages from the current left neighbour are processed; anything else is
  dropped (its content reaches us through a ``Catchup`` from the new left).
  After the left neighbour changes, everything from it is dropped until its
  ``Catchup``: a left can come back (A, a joiner, A again), and what A sent in
  its first spell must not be taken as following what we saw.
* A message tagged with a newer version than our view makes us re-read the
  group record before processing it.
* While a store request is outstanding the member processes no ring message and
  flushes nothing; its answer and the view change it causes are atomic with
  respect to the traffic, as a Mnesia transaction inside a gen_server call is
  in gm.erl.
* Whenever the right neighbour changes and we have state, we send it a Catchup.
* Own broadcasts are delivered locally at once, buffered, and flushed every
  ``flush_interval`` seconds (on ``tick``) or as soon as ``max_buffer`` are waiting.
* A neighbour death notice starts a ``guard_delay`` timer (against partial
  partitions); then the member records the death (``MarkDead``, version+1).
  ``forgive`` takes back the notices still waiting (a node that finds itself
  in a paused minority records no deaths).
* ``members_left`` (the operator removed a node from the cluster: every member
  on it is gone for good) records those deaths at once, whether or not they
  are neighbours, in every view this member adopts from then on (one that
  still lists them alive, e.g. a join written after the removal), and
  ``forgive`` does not take it back.
* An alias whose window is empty and whose acks have all come back is erased
  from the record (``Erase``). On inheriting an alias a member resets its
  ``last_ack``: as a forwarder it counted acks that passed by, as the origin it
  must count acks that came all the way round, and erasing on the former would
  drop the member while others still hold its messages.
* A member left alone confirms everything pending and drops its windows.
* A joiner whose inviter died before its catchup arrived adopts the catchup of
  its new left, the far end of the dead member's stream, while the messages it
  inherits are still on their way round from its right. It acks what its left
  holds at once, treats the dead member's pubs that come round later as come
  back, and erases nobody it inherited that way until a ``Probe`` (resent every
  ``probe_timeout`` until one returns) has been all the way round.

Invariants
----------
* View versions a member adopts strictly increase.
* For a sender S and two alive neighbours L -> R, with S not R and not one of
  R's aliases, L is upstream of R on S's path: L has seen every pub of S that
  R has seen and dropped every one R dropped. Catchup relies on this.
* A member acks pub n of S only after n went through every member of the
  ring; hence an acked message has been delivered by every member.
* A dead member is erased only when no alive member holds any of its messages
  in a window (``gm_sim`` checks this at every ``Erase``).

Differences from gm.erl, and why
--------------------------------
* Sans-IO: store access is asynchronous (request/reply actions) instead of a
  Mnesia transaction inside the handler; parking ring messages while a request
  is outstanding restores the atomicity gm.erl gets for free.
* Windows are compared by pub number (cumulative acks) instead of matching
  queues element by element (``find_common``, ``find_prefix_common_suffix``);
  same result, and a duplicate pub (number <= ``last_pub``) is dropped instead of
  delivered twice.
* A joiner asks a member by message and retries after ``join_timeout`` instead
  of a blocking ``gen_server`` call; if the member it asked dies, the joiner may
  adopt the catchup of another member, so its join point is the snapshot it
  adopted (``Joined``), not the moment it was written into the record.
* ``Probe`` and the origin's repeated cumulative ack have no gm.erl
  counterpart: they close the two holes above (a joiner adopting state from
  the wrong end of a dead member's stream; acks lost for good), which the
  randomised tests of ``gm_sim`` hit.
* gm.erl erases an inherited member as soon as its ``last_ack`` equals its
  ``last_pub``, counting acks that merely passed by; here only acks that came
  round count (see Rules).
* A member that finds itself dead or gone in a newer record stops
  (``Stopped``) instead of crashing; it must rejoin under a new id, as a
  restarted gm.erl process has a new pid.
* No ``leave`` and no ``txn_executor``: a member leaves by dying, and a node
  removed from the cluster (``members_left``) has its members recorded dead by
  every member that hears of it, not only by their neighbours after the guard
  delay (``rabbitmqctl forget_cluster_node`` removes the node's mirrors from the
  queue records directly; here the group record is the one to change).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MemberId = str


class GmError(Exception):
    """A GM member was used in a way its state does not allow."""


# --------------------------------------------------------------------------- group record


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """One group's membership as the store holds it; ``members`` is the ring order."""

    name: str
    version: int
    members: tuple[MemberId, ...]
    dead: frozenset[MemberId] = frozenset()

    def alive(self) -> tuple[MemberId, ...]:
        return tuple(m for m in self.members if m not in self.dead)


@dataclass(frozen=True, slots=True)
class CreateGroup:
    """Start the group with ``member`` alone, unless it has an alive member already."""

    member: MemberId


@dataclass(frozen=True, slots=True)
class AddOnRight:
    """Insert ``member`` right after ``left``, if ``left`` is alive and ``member`` unknown."""

    left: MemberId
    member: MemberId


@dataclass(frozen=True, slots=True)
class MarkDead:
    """Record ``member`` dead; it stays listed until its messages are acked."""

    member: MemberId


@dataclass(frozen=True, slots=True)
class Erase:
    """Remove dead ``members`` for good."""

    members: tuple[MemberId, ...]


GroupOp = CreateGroup | AddOnRight | MarkDead | Erase


def apply_op(name: str, record: GroupRecord | None, op: GroupOp) -> GroupRecord | None:
    """The one definition of every group change; a store applies it atomically.

    Operations that no longer make sense (adding after a dead member, marking a
    gone member dead) leave the record as it is: the requester learns from the
    returned record that the world moved on.
    """
    if isinstance(op, CreateGroup):
        if record is not None and record.alive():
            return record
        version = record.version + 1 if record is not None else 0
        return GroupRecord(name, version, (op.member,))
    if record is None:
        return None
    if isinstance(op, AddOnRight):
        if op.member in record.members or op.left not in record.members or op.left in record.dead:
            return record
        i = record.members.index(op.left)
        members = record.members[: i + 1] + (op.member,) + record.members[i + 1 :]
        return GroupRecord(name, record.version + 1, members, record.dead)
    if isinstance(op, MarkDead):
        if op.member not in record.members or op.member in record.dead:
            return record
        return GroupRecord(name, record.version + 1, record.members, record.dead | {op.member})
    if isinstance(op, Erase):
        gone = {m for m in op.members if m in record.dead}
        if not gone:
            return record
        members = tuple(m for m in record.members if m not in gone)
        return GroupRecord(name, record.version + 1, members, record.dead - gone)
    raise TypeError(f"not a group operation: {op!r}")


class InMemoryGroupStore:
    """Group records in a dict; every ``update`` is atomic because nothing else runs meanwhile."""

    def __init__(self) -> None:
        self._records: dict[str, GroupRecord | None] = {}

    def read(self, name: str) -> GroupRecord | None:
        return self._records.get(name)

    def update(self, name: str, op: GroupOp) -> GroupRecord | None:
        record = apply_op(name, self._records.get(name), op)
        self._records[name] = record
        return record


# --------------------------------------------------------------------------- view


@dataclass(frozen=True, slots=True)
class View:
    """The record as one member sees it."""

    version: int
    me: MemberId
    left: MemberId
    right: MemberId
    alive: tuple[MemberId, ...]
    aliases: frozenset[MemberId]
    members: frozenset[MemberId]

    @property
    def alone(self) -> bool:
        return self.right == self.me

    @classmethod
    def of(cls, record: GroupRecord, me: MemberId) -> View:
        ring = record.members
        n = len(ring)
        i = ring.index(me)
        right = next(ring[(i + k) % n] for k in range(1, n + 1) if ring[(i + k) % n] not in record.dead)
        aliases: set[MemberId] = set()
        left = me
        for k in range(1, n + 1):
            m = ring[(i - k) % n]
            if m in record.dead:
                aliases.add(m)
            else:
                left = m
                break
        return cls(record.version, me, left, right, record.alive(), frozenset(aliases), frozenset(ring))


# --------------------------------------------------------------------------- wire messages

Pub = tuple[int, Any]


@dataclass(frozen=True, slots=True)
class ActivityEntry:
    sender: MemberId
    pubs: tuple[Pub, ...] = ()
    acks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Activity:
    version: int
    entries: tuple[ActivityEntry, ...]


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    pending: tuple[Pub, ...] = ()
    last_pub: int = -1
    last_ack: int = -1


_BLANK = MemberSnapshot()


@dataclass(frozen=True, slots=True)
class Catchup:
    version: int
    state: Mapping[MemberId, MemberSnapshot]


@dataclass(frozen=True, slots=True)
class JoinRequest:
    member: MemberId


@dataclass(frozen=True, slots=True)
class Probe:
    """Goes once round the ring behind everything in flight, back to ``origin``."""

    version: int
    origin: MemberId
    seq: int


GmMessage = Activity | Catchup | JoinRequest | Probe


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Send:
    """Put ``message`` on the link to member ``to`` (links must be FIFO)."""

    to: MemberId
    message: GmMessage


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand a broadcast to the application, in the sender's order."""

    sender: MemberId
    msg: Any


@dataclass(frozen=True, slots=True)
class Confirm:
    """The broadcast made with ``token`` has been seen by the whole ring."""

    token: Hashable


@dataclass(frozen=True, slots=True)
class ReadGroup:
    """Read the record; answer with ``store_reply(request, record)``.

    A replicated store should wait until its copy has at least ``min_version``.
    """

    request: int
    min_version: int


@dataclass(frozen=True, slots=True)
class UpdateGroup:
    """Apply ``op`` atomically (``apply_op``); answer with ``store_reply(request, record)``."""

    request: int
    op: GroupOp


@dataclass(frozen=True, slots=True)
class Joined:
    """The member now has state; ``snapshot`` is the catchup it started from (None: alone)."""

    version: int
    snapshot: Catchup | None


@dataclass(frozen=True, slots=True)
class Stopped:
    """The member left the group for good (the record says it is dead or gone)."""

    reason: str


Action = Send | Deliver | Confirm | ReadGroup | UpdateGroup | Joined | Stopped


# --------------------------------------------------------------------------- member


class _Window:
    """What a member knows of one sender's stream."""

    __slots__ = ("pending", "last_pub", "last_ack")

    def __init__(self, pending: Iterable[Pub] = (), last_pub: int = -1, last_ack: int = -1) -> None:
        self.pending: deque[Pub] = deque(pending)
        self.last_pub = last_pub
        self.last_ack = last_ack

    def snapshot(self) -> MemberSnapshot:
        return MemberSnapshot(tuple(self.pending), self.last_pub, self.last_ack)

    @property
    def finished(self) -> bool:
        return not self.pending and self.last_ack >= self.last_pub


_IDLE, _JOINING, _MEMBER, _STOPPED = "idle", "joining", "member", "stopped"


class GmMember:
    """One member of one GM group. Every public method returns the actions to execute, in order."""

    def __init__(
        self,
        group: str,
        me: MemberId,
        *,
        flush_interval: float = 0.025,
        max_buffer: int = 64,
        guard_delay: float = 0.1,
        join_timeout: float = 1.0,
        probe_timeout: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.group = group
        self.me = me
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.guard_delay = guard_delay
        self.join_timeout = join_timeout
        self.probe_timeout = probe_timeout
        self._rng = rng if rng is not None else random.Random(me)
        self._phase = _IDLE
        self._view: View | None = None
        self._state: dict[MemberId, _Window] | None = None
        self._pub_count = 0
        self._buffer: list[Pub] = []
        self._buffer_since = 0.0
        self._confirms: dict[int, Hashable] = {}
        self._inbox: deque[tuple[MemberId, GmMessage]] = deque()
        self._awaiting: tuple[int, str] | None = None
        self._requests = 0
        self._refresh_blocked = False
        self._seen_version = -1
        self._suspects: dict[MemberId, float] = {}
        self._gone: set[MemberId] = set()
        self._join_deadline = math.inf
        self._uncertain: set[MemberId] = set()
        self._need_catchup = False
        self._probe_seq = 0
        self._probe_deadline = math.inf
        self._now = 0.0
        self._out: list[Action] = []

    # ------------------------------------------------------------------ observation

    @property
    def view(self) -> View | None:
        return self._view

    @property
    def view_version(self) -> int:
        return self._view.version if self._view is not None else -1

    @property
    def joined(self) -> bool:
        """True once the member has state (adopted a catchup, created the group, or is alone)."""
        return self._state is not None

    @property
    def stopped(self) -> bool:
        return self._phase == _STOPPED

    @property
    def idle(self) -> bool:
        """Nothing buffered, parked, awaited, suspected or timed: the member waits for events only.

        A joiner waiting out its join timeout is not idle: its ``JoinRequest`` may
        have been lost (sent to a node whose link is not up yet, or to a member
        that died), and only a tick past the deadline asks again.
        """
        return not (
            self._buffer
            or self._inbox
            or self._awaiting
            or self._suspects
            or self._uncertain
            or self._join_deadline < math.inf
            or self._gone_alive()
        )

    def windows(self) -> dict[MemberId, MemberSnapshot]:
        """Per-member state (empty before joining), for diagnostics and tests."""
        return self._snapshot() if self._state is not None else {}

    # ------------------------------------------------------------------ events

    def join(self) -> list[Action]:
        """Join the group (creating it if it has no alive member)."""
        if self._phase != _IDLE:
            raise GmError(f"member {self.me} already {self._phase}")
        self._phase = _JOINING
        self._request("join", ReadGroup, -1)
        return self._drain()

    def broadcast(self, msg: Any, confirm_token: Hashable | None = None) -> list[Action]:
        """Send ``msg`` to the group; with a token, ``Confirm(token)`` follows once all members have it."""
        if self._phase in (_IDLE, _STOPPED):
            raise GmError(f"member {self.me} cannot broadcast: {self._phase}")
        n = self._pub_count
        self._pub_count += 1
        self._emit(Deliver(self.me, msg))
        if self._view is not None and self._view.alone and self._state is not None:
            own = self._state[self.me]
            own.last_pub = own.last_ack = n
            if confirm_token is not None:
                self._emit(Confirm(confirm_token))
            return self._drain()
        if confirm_token is not None:
            self._confirms[n] = confirm_token
        if not self._buffer:
            self._buffer_since = self._now
        self._buffer.append((n, msg))
        if len(self._buffer) >= self.max_buffer:
            self._flush()
        return self._drain()

    def receive(self, sender: MemberId, message: GmMessage) -> list[Action]:
        """A message arrived on the link from ``sender``."""
        if self._phase != _STOPPED:
            self._inbox.append((sender, message))
            self._run()
        return self._drain()

    def tick(self, now: float) -> list[Action]:
        """Time passed (seconds, any monotonic origin): flushes, guard delays, join retries."""
        self._now = now
        self._refresh_blocked = False
        if self._phase != _STOPPED:
            if self._buffer and now - self._buffer_since >= self.flush_interval:
                self._flush()
            self._run()
        return self._drain()

    def neighbour_down(self, member: MemberId) -> list[Action]:
        """The failure detector says ``member`` died; recorded after ``guard_delay``."""
        if self._phase != _STOPPED and member != self.me and member not in self._suspects:
            self._suspects[member] = self._now + self.guard_delay
        return self._drain()

    def forgive(self) -> list[Action]:
        """The failure detector takes back the verdicts still in their guard delay: no death is recorded."""
        self._suspects.clear()
        return self._drain()

    def members_left(self, members: Iterable[MemberId]) -> list[Action]:
        """``members`` left for good (their node was removed from the cluster): record them dead now and in
        every later view that lists them alive; ``forgive`` does not take this back."""
        if self._phase != _STOPPED:
            self._gone.update(m for m in members if m != self.me)
            self._run()
        return self._drain()

    def store_reply(self, request: int, record: GroupRecord | None) -> list[Action]:
        """The answer to a ``ReadGroup`` / ``UpdateGroup`` this member emitted."""
        if self._phase == _STOPPED or self._awaiting is None or self._awaiting[0] != request:
            return self._drain()
        purpose = self._awaiting[1]
        self._awaiting = None
        if record is not None:
            self._seen_version = max(self._seen_version, record.version)
        if purpose in ("join", "create"):
            self._on_join_record(record)
        else:
            self._adopt(record)
            if purpose == "refresh" and self._inbox:
                head = self._inbox[0][1]
                if not isinstance(head, JoinRequest) and head.version > self.view_version:
                    self._refresh_blocked = True
        self._run()
        return self._drain()

    def group_changed(self, record: GroupRecord) -> list[Action]:
        """An unsolicited newer record (e.g. pushed by the metadata store)."""
        if self._phase != _STOPPED:
            self._seen_version = max(self._seen_version, record.version)
            self._adopt(record)
            self._run()
        return self._drain()

    # ------------------------------------------------------------------ plumbing

    def _emit(self, action: Action) -> None:
        self._out.append(action)

    def _drain(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _request(self, purpose: str, kind: type[ReadGroup] | type[UpdateGroup], arg: Any) -> None:
        self._requests += 1
        self._awaiting = (self._requests, purpose)
        self._emit(kind(self._requests, arg))

    def _stop(self, reason: str) -> None:
        self._phase = _STOPPED
        self._inbox.clear()
        self._buffer.clear()
        self._emit(Stopped(reason))

    def _snapshot(self) -> dict[MemberId, MemberSnapshot]:
        assert self._state is not None
        return {m: w.snapshot() for m, w in self._state.items()}

    def _run(self) -> None:
        """Do whatever is possible now, until a store request must be awaited."""
        while self._phase != _STOPPED and self._awaiting is None:
            if self._inbox and not self._refresh_blocked:
                self._process_head()
                continue
            if self._fire_suspect() or self._maybe_erase():
                continue
            if self._phase == _JOINING and self._view is None and self._now >= self._join_deadline:
                self._join_deadline = math.inf
                self._request("join", ReadGroup, -1)
            elif self._uncertain and self._now >= self._probe_deadline:
                self._send_probe()
            return

    def _process_head(self) -> None:
        sender, message = self._inbox[0]
        if isinstance(message, JoinRequest):
            self._inbox.popleft()
            view = self._view
            if self._phase == _MEMBER and view is not None and message.member not in view.members:
                self._request("add", UpdateGroup, AddOnRight(self.me, message.member))
            return
        if message.version > self.view_version:
            if self._phase == _IDLE or message.version <= self._seen_version:
                # never joined, or the record is that new and we are not in it
                self._inbox.popleft()
            else:
                self._request("refresh", ReadGroup, message.version)
            return
        self._inbox.popleft()
        view = self._view
        if view is None or sender != view.left or sender == self.me:
            return
        if isinstance(message, Catchup):
            self._need_catchup = False
            if self._state is None:
                self._adopt_snapshot(message)
            else:
                self._process_catchup(message)
        elif self._need_catchup:
            return
        elif isinstance(message, Probe):
            if message.origin == self.me:
                if message.seq == self._probe_seq:
                    self._uncertain.clear()
                    self._probe_deadline = math.inf
            elif message.origin in view.alive and not view.alone:
                self._emit(Send(view.right, Probe(view.version, message.origin, message.seq)))
        elif self._state is not None:
            self._process_activity(message.entries)

    # ------------------------------------------------------------------ membership

    def _on_join_record(self, record: GroupRecord | None) -> None:
        if record is not None and self.me in record.members:
            self._adopt(record)
            return
        alive = record.alive() if record is not None else ()
        if not alive:
            self._request("create", UpdateGroup, CreateGroup(self.me))
            return
        self._emit(Send(self._rng.choice(alive), JoinRequest(self.me)))
        self._join_deadline = self._now + self.join_timeout

    def _adopt(self, record: GroupRecord | None) -> None:
        """Move to a newer view; send a catchup if our right neighbour changed."""
        if record is None or record.version <= self.view_version:
            return
        if self.me not in record.members or self.me in record.dead:
            if self._view is not None:
                self._stop(
                    f"{self.me} is {'dead' if self.me in record.dead else 'gone'} in group {self.group} v{record.version}"
                )
            return
        old = self._view
        view = self._view = View.of(record, self.me)
        if old is None or old.left != view.left:
            # a new link from the left starts with its catchup; whatever it sent
            # us earlier (a left can come back: A, then a joiner, then A again)
            # is behind in FIFO order and is dropped until that catchup
            self._need_catchup = not view.alone
        if self._phase == _JOINING:
            self._phase = _MEMBER
            self._join_deadline = math.inf
        self._suspects = {m: t for m, t in self._suspects.items() if m in view.alive}
        self._uncertain &= view.aliases
        if self._state is not None:
            for m in [m for m in self._state if m not in view.members]:
                del self._state[m]
            # For a sender we pass on, last_ack is the acks we saw go by; as its
            # origin, it must be the acks that came all the way round. Those are
            # unknown until our new left's catchup says, so start from nothing.
            for m in view.aliases - (old.aliases if old is not None else frozenset()):
                if m in self._state:
                    self._state[m].last_ack = -1
        if view.alone:
            self._become_alone()
        elif self._state is not None and (old is None or old.right != view.right):
            self._emit(Send(view.right, Catchup(view.version, self._snapshot())))

    def _become_alone(self) -> None:
        assert self._view is not None
        first = self._state is None
        last = self._pub_count - 1
        self._state = {self.me: _Window((), last, last)}
        for token in self._confirms.values():
            self._emit(Confirm(token))
        self._confirms.clear()
        self._buffer.clear()
        self._uncertain.clear()
        if first:
            self._emit(Joined(self._view.version, None))

    def _adopt_snapshot(self, catchup: Catchup) -> None:
        view = self._view
        assert view is not None
        self._state = {
            m: _Window(s.pending, s.last_pub, s.last_ack)
            for m, s in catchup.state.items()
            if m in view.members
        }
        self._state.setdefault(self.me, _Window())
        self._emit(Joined(view.version, catchup))
        self._emit(Send(view.right, Catchup(view.version, self._snapshot())))
        if view.aliases:
            # We inherited dead members before we had state, so our windows for
            # them come from our left, the far end of their streams: what it
            # holds has been everywhere (ack it now), and what our right still
            # holds is on its way round to us. They may be erased only once a
            # probe sent behind that traffic has come back.
            self._uncertain = set(view.aliases)
            self._process_catchup(catchup)
            self._send_probe()

    def _send_probe(self) -> None:
        assert self._view is not None
        self._probe_seq += 1
        self._probe_deadline = self._now + self.probe_timeout
        if not self._view.alone:
            self._emit(Send(self._view.right, Probe(self._view.version, self.me, self._probe_seq)))

    def _gone_alive(self) -> list[MemberId]:
        view = self._view
        return sorted(m for m in self._gone if m in view.alive) if view is not None else []

    def _fire_suspect(self) -> bool:
        gone = self._gone_alive()
        if gone:
            self._request("dead", UpdateGroup, MarkDead(gone[0]))
            return True
        for member, deadline in self._suspects.items():
            if deadline > self._now:
                continue
            view = self._view
            if view is None:
                return False
            del self._suspects[member]
            if member in view.alive:
                self._request("dead", UpdateGroup, MarkDead(member))
            return True
        return False

    def _maybe_erase(self) -> bool:
        view, state = self._view, self._state
        if view is None or state is None or not view.aliases:
            return False
        done = tuple(
            sorted(
                m for m in view.aliases if m not in self._uncertain and (m not in state or state[m].finished)
            )
        )
        if not done:
            return False
        self._request("erase", UpdateGroup, Erase(done))
        return True

    # ------------------------------------------------------------------ traffic

    def _flush(self) -> None:
        view, state = self._view, self._state
        if not self._buffer or self._awaiting is not None or view is None or state is None or view.alone:
            return
        pubs = tuple(self._buffer)
        self._buffer.clear()
        own = state[self.me]
        own.pending.extend(pubs)
        own.last_pub = pubs[-1][0]
        self._emit(Send(view.right, Activity(view.version, (ActivityEntry(self.me, pubs),))))

    def _confirm(self, sender: MemberId, numbers: Iterable[int]) -> None:
        if sender == self.me:
            for n in numbers:
                token = self._confirms.pop(n, None)
                if token is not None:
                    self._emit(Confirm(token))

    def _process_activity(
        self, entries: Iterable[ActivityEntry], out: list[ActivityEntry] | None = None
    ) -> None:
        view, state = self._view, self._state
        assert view is not None and state is not None
        out = out if out is not None else []
        for entry in entries:
            sender = entry.sender
            if sender not in view.members:
                continue
            window = state.get(sender)
            if window is None:
                window = state[sender] = _Window()
            if sender == self.me or sender in view.aliases:
                acks: tuple[int, ...] = ()
                if entry.pubs:
                    back = {n for n, _ in entry.pubs}
                    acks = tuple(n for n, _ in window.pending if n in back)
                    if acks:
                        window.pending = deque(p for p in window.pending if p[0] not in back)
                        self._confirm(sender, acks)
                    # pubs of an inherited member we never held (see _adopt_snapshot)
                    # have been round everyone else: they are done as well
                    later = tuple(n for n, _ in entry.pubs if n > window.last_pub)
                    if later and sender != self.me:
                        window.last_pub = later[-1]
                        acks += later
                if entry.acks:
                    window.last_ack = max(window.last_ack, max(entry.acks))
                if acks:
                    out.append(ActivityEntry(sender, (), acks))
                continue
            pubs = tuple(p for p in entry.pubs if p[0] > window.last_pub)
            if pubs:
                window.pending.extend(pubs)
                window.last_pub = pubs[-1][0]
            if entry.acks:
                top = max(entry.acks)
                while window.pending and window.pending[0][0] <= top:
                    window.pending.popleft()
                window.last_ack = max(window.last_ack, top)
            if pubs or entry.acks:
                out.append(ActivityEntry(sender, pubs, entry.acks))
            for _, msg in pubs:
                self._emit(Deliver(sender, msg))
        if out and not view.alone:
            self._emit(Send(view.right, Activity(view.version, tuple(out))))

    def _process_catchup(self, catchup: Catchup) -> None:
        view, state = self._view, self._state
        assert view is not None and state is not None
        entries: list[ActivityEntry] = []
        acks_out: list[ActivityEntry] = []
        for sender in sorted(set(state) | set(catchup.state)):
            if sender not in view.members:
                continue
            theirs = catchup.state.get(sender, _BLANK)
            mine = state.get(sender)
            if mine is None:
                mine = state[sender] = _Window()
            if sender == self.me or sender in view.aliases:
                # Origin role: what our left has seen has been round the whole ring.
                back = [n for n, _ in mine.pending if n <= theirs.last_pub]
                if back:
                    while mine.pending and mine.pending[0][0] <= back[-1]:
                        mine.pending.popleft()
                    self._confirm(sender, back)
                mine.last_ack = max(mine.last_ack, theirs.last_ack)
                # Everything below our window has been everywhere too; ack it (again)
                # so that acks lost with a dead member, or never sent because a
                # joiner adopted a window without them, still complete the round.
                upto = mine.pending[0][0] - 1 if mine.pending else mine.last_pub
                if upto > mine.last_ack:
                    acks_out.append(ActivityEntry(sender, (), (upto,)))
                continue
            # What the left no longer holds is acked, whether it saw the ack pass
            # or (as the sender's origin) turned the returning pubs into acks itself.
            # Pass it on as one cumulative ack even if we hold nothing it covers:
            # the origin waits for it to come round before erasing a dead member.
            acked = theirs.pending[0][0] - 1 if theirs.pending else theirs.last_pub
            acks = (acked,) if acked > mine.last_ack else ()
            pubs = tuple(p for p in theirs.pending if p[0] > mine.last_pub)
            if acks or pubs:
                entries.append(ActivityEntry(sender, pubs, acks))
        self._process_activity(entries, acks_out)
