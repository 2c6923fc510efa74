"""An in-process GM ring under a seeded scheduler, and the checker for its guarantees.

The simulation is the environment ``gm.GmMember`` expects, with every source
of nondeterminism drawn from one ``random.Random(seed)`` so a failing run can be
replayed exactly:

* links are FIFO per (from, to) pair; which non-empty link delivers next is random;
* the group store (``InMemoryGroupStore``) applies requests in a random order and
  its answers reach the requester after a random delay;
* the failure detector tells a member that its left or right neighbour died, once
  per pair, at a random later step;
* killing a member keeps a random prefix of what it had in flight (a TCP link
  that breaks delivers some of its buffer, in order, then nothing), drops what
  was sent to it, and may or may not apply its outstanding store request;
* time (``now``) advances by a random amount on each tick;
* a member that *leaves* (its node removed from the cluster) stops as a killed
  one does, but the failure detector says nothing about it: the survivors hear
  of it only through ``members_left``, as the nodes of a cluster hear of a
  ``forget_cluster_node``; ``forgive`` (a node that paused) takes back the
  detector's pending verdicts, which the detector repeats later.

Broadcast payloads are ``(sender, k)`` with k the sender's count, so the history
alone says what was sent when; ``check`` turns the history into violations.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from broker_impl.cluster.gm import (
    Action,
    Catchup,
    Confirm,
    Deliver,
    Erase,
    GmMember,
    GmMessage,
    InMemoryGroupStore,
    Joined,
    JoinRequest,
    MemberId,
    ReadGroup,
    Send,
    Stopped,
    UpdateGroup,
)

Payload = tuple[MemberId, int]


class SimStuck(Exception):
    """The ring did not settle within the step budget (a liveness failure)."""


@dataclass
class History:
    """Everything a run did that the guarantees talk about; steps are the logical clock."""

    sent_at: dict[Payload, int] = field(default_factory=dict)
    confirm_wanted: set[Payload] = field(default_factory=set)
    confirmed: set[Payload] = field(default_factory=set)
    delivered: dict[MemberId, list[Payload]] = field(default_factory=dict)
    joined_at: dict[MemberId, int] = field(default_factory=dict)
    died_at: dict[MemberId, int] = field(default_factory=dict)
    versions: dict[MemberId, list[int]] = field(default_factory=dict)
    stopped: dict[MemberId, str] = field(default_factory=dict)
    early_erasures: list[str] = field(default_factory=list)


class GmSim:
    """A ring of ``GmMember``s of one group, all in this process."""

    def __init__(
        self,
        seed: int,
        *,
        group: str = "q",
        tick_probability: float = 0.15,
        trace: bool = False,
        **member_options: Any,
    ) -> None:
        self.rng = random.Random(seed)
        self.trace: list[str] | None = [] if trace else None
        self.group = group
        self.tick_probability = tick_probability
        self.member_options: dict[str, Any] = {
            "flush_interval": 0.02,
            "max_buffer": 8,
            "guard_delay": 0.03,
            "join_timeout": 0.3,
            **member_options,
        }
        self.store = InMemoryGroupStore()
        self.members: dict[MemberId, GmMember] = {}
        self.alive: dict[MemberId, None] = {}
        self.links: dict[tuple[MemberId, MemberId], deque[tuple[int, GmMessage]]] = {}
        self.store_requests: list[tuple[MemberId, ReadGroup | UpdateGroup]] = []
        self.store_replies: dict[MemberId, deque[tuple[int, Any]]] = {}
        self.notices: list[tuple[MemberId, MemberId]] = []
        self.notified: set[tuple[MemberId, MemberId]] = set()
        self.now = 0.0
        self.step = 0
        self.history = History()
        self._catchups: dict[int, tuple[Catchup, int]] = {}
        self._counts: dict[MemberId, int] = {}
        self._ask: dict[MemberId, MemberId] = {}
        self.held: set[tuple[MemberId, MemberId]] = set()
        self.departed: set[MemberId] = set()

    # ------------------------------------------------------------------ script operations

    def spawn(self, member: MemberId, ask: MemberId | None = None) -> None:
        """Start a new member and have it join the group (through ``ask``, if given, instead of a random member)."""
        if member in self.members:
            raise ValueError(f"member id {member} already used")
        gm = GmMember(self.group, member, rng=random.Random(self.rng.random()), **self.member_options)
        self._log(f"SPAWN {member}")
        self.members[member] = gm
        self.alive[member] = None
        self.history.delivered[member] = []
        self.history.versions[member] = []
        self.store_replies[member] = deque()
        self._counts[member] = 0
        if ask is not None:
            self._ask[member] = ask
        self.step += 1
        gm.tick(self.now)
        self._apply(member, gm.join())

    def broadcast(self, member: MemberId, confirm: bool = False) -> Payload:
        payload = (member, self._counts[member])
        self._counts[member] += 1
        self.step += 1
        self.history.sent_at[payload] = self.step
        if confirm:
            self.history.confirm_wanted.add(payload)
        self._log(f"BROADCAST {payload} by {member}")
        self._apply(member, self.members[member].broadcast(payload, payload if confirm else None))
        return payload

    def kill(self, member: MemberId, keep: int | None = None) -> None:
        """Crash ``member``: a prefix of its in-flight output survives (``keep`` messages per link, or random)."""
        self.step += 1
        del self.alive[member]
        self.history.died_at[member] = self.step
        self._log(f"KILL {member}")
        for (src, dst), q in self.links.items():
            if dst == member:
                q.clear()
            elif src == member:
                n = self.rng.randint(0, len(q)) if keep is None else min(keep, len(q))
                while len(q) > n:
                    q.pop()
        self.store_requests = [
            (m, r) for m, r in self.store_requests if m != member or self.rng.random() < 0.5
        ]
        self.store_replies[member].clear()
        for m in self.alive:
            self._watch(m)

    def leave(self, member: MemberId) -> None:
        """``member``'s node is removed from the cluster: it stops, and every survivor is told at once."""
        self.departed.add(member)
        self.kill(member)
        self._log(f"LEAVE {member}")
        for m in list(self.alive):
            self._apply(m, self.members[m].members_left([member]))

    def forgive(self) -> None:
        """Every survivor takes back the verdicts in their guard delay; the detector will repeat those."""
        self.step += 1
        self._log("FORGIVE")
        self.notified = {(m, n) for m, n in self.notified if n in self.alive or (m, n) in self.notices}
        for m in list(self.alive):
            self._apply(m, self.members[m].forgive())

    # ------------------------------------------------------------------ scheduler

    def step_once(self) -> None:
        """Run one randomly chosen enabled event."""
        choices: list[tuple[str, Any]] = [
            ("link", k) for k, q in self.links.items() if q and k not in self.held
        ]
        if self.store_requests:
            choices.append(("store", None))
        choices.extend(("reply", m) for m, q in self.store_replies.items() if q)
        if self.notices:
            choices.append(("notice", None))
        self.step += 1
        if not choices or self.rng.random() < self.tick_probability:
            self._tick()
            return
        kind, key = self.rng.choice(choices)
        if kind == "link":
            src, dst = key
            _, message = self.links[key].popleft()
            self._log(f"{dst} <- {src}: {message}" + ("" if dst in self.alive else " (dead)"))
            if dst in self.alive:
                self._apply(dst, self.members[dst].receive(src, message))
        elif kind == "store":
            self._execute_store(self.rng.randrange(len(self.store_requests)))
        elif kind == "reply":
            req, record = self.store_replies[key].popleft()
            self._apply(key, self.members[key].store_reply(req, record))
        else:
            member, dead = self.notices.pop(self.rng.randrange(len(self.notices)))
            self._log(f"{member} notified {dead} is down")
            if member in self.alive:
                self._apply(member, self.members[member].neighbour_down(dead))

    def form(self, members: Iterable[MemberId]) -> tuple[MemberId, ...]:
        """Start members one at a time, each settling before the next; return the ring order."""
        for m in members:
            self.spawn(m)
            self.settle()
        return self.ring()

    def ring(self) -> tuple[MemberId, ...]:
        record = self.store.read(self.group)
        return record.alive() if record is not None else ()

    def in_flight(self, src: MemberId, dst: MemberId) -> list[GmMessage]:
        return [m for _, m in self.links.get((src, dst), ())]

    def deliver(self, src: MemberId, dst: MemberId, count: int = 1) -> None:
        """Hand the next ``count`` messages on the link src -> dst to ``dst``, in order.

        Store requests this causes are served at once (``serve_store``), so a
        scripted scenario controls the links and nothing else.
        """
        q = self.links[(src, dst)]
        for _ in range(count):
            self.step += 1
            _, message = q.popleft()
            self._log(f"{dst} <- {src}: {message}")
            self._apply(dst, self.members[dst].receive(src, message))
            self.serve_store()

    def serve_store(self) -> None:
        """Execute every pending store request and hand out the answers, oldest first."""
        while self.store_requests or any(self.store_replies[m] for m in self.alive):
            if self.store_requests:
                self._execute_store(0)
            for m in list(self.alive):
                while self.store_replies[m]:
                    self.step += 1
                    req, record = self.store_replies[m].popleft()
                    self._apply(m, self.members[m].store_reply(req, record))

    def advance(self, seconds: float) -> None:
        """Let time pass and tick every alive member once (flushes buffers past their interval)."""
        self.step += 1
        self.now += seconds
        for m in list(self.alive):
            self._apply(m, self.members[m].tick(self.now))

    def run_until(self, done: Callable[[], bool], max_steps: int = 20000) -> None:
        """Run random steps until ``done()``; raise ``SimStuck`` if it takes more than ``max_steps``."""
        for _ in range(max_steps):
            if done():
                return
            self.step_once()
        raise SimStuck(self.describe())

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step_once()

    def quiescent(self) -> bool:
        """Nothing in flight, every alive member joined and idle, every window empty, no dead member listed."""
        if self.store_requests or self.notices or any(self.store_replies[m] for m in self.alive):
            return False
        if any(q and dst in self.alive for (_, dst), q in self.links.items()):
            return False
        for m in self.alive:
            gm = self.members[m]
            if not gm.joined or not gm.idle or any(s.pending for s in gm.windows().values()):
                return False
        record = self.store.read(self.group)
        return record is not None and not record.dead

    def settle(self, max_steps: int = 20000) -> None:
        """Release held links and run until quiescent; raise ``SimStuck`` if that takes more than ``max_steps``."""
        self.held.clear()
        self.run_until(self.quiescent, max_steps)

    def describe(self) -> str:
        lines = [f"step {self.step} store {self.store.read(self.group)}"]
        for m, gm in self.members.items():
            state = "alive" if m in self.alive else "dead"
            windows = {k: (len(s.pending), s.last_pub, s.last_ack) for k, s in gm.windows().items()}
            lines.append(f"  {m} {state} v{gm.view_version} view={gm.view} idle={gm.idle} windows={windows}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ plumbing

    def _execute_store(self, index: int) -> None:
        member, request = self.store_requests.pop(index)
        if isinstance(request, ReadGroup):
            record = self.store.read(self.group)
        else:
            if isinstance(request.op, Erase):
                self._check_erase(request.op.members)
            record = self.store.update(self.group, request.op)
        self._log(f"store {member} {request} => {record}")
        if member in self.alive:
            self.store_replies[member].append((request.request, record))

    def _check_erase(self, erased: Iterable[MemberId]) -> None:
        """The spec: a dead member stays listed until its in-flight messages are fully acked."""
        for gone in erased:
            for m in self.alive:
                window = self.members[m].windows().get(gone)
                if window is not None and window.pending:
                    self.history.early_erasures.append(
                        f"{gone} erased at step {self.step} while {m} still holds {[n for n, _ in window.pending]}"
                    )

    def _tick(self) -> None:
        self.now += self.rng.uniform(0.002, 0.01)
        for m in list(self.alive):
            self._apply(m, self.members[m].tick(self.now))

    def _log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.step:6d} {text}")

    def _apply(self, member: MemberId, actions: Iterable[Action]) -> None:
        h = self.history
        for a in actions:
            self._log(f"  {member} -> {a}")
            if isinstance(a, Send):
                if isinstance(a.message, JoinRequest) and member in self._ask:
                    a = Send(self._ask[member], a.message)
                if a.to in self.alive:
                    self.links.setdefault((member, a.to), deque()).append((self.step, a.message))
                    if isinstance(a.message, Catchup):
                        self._catchups[id(a.message)] = (a.message, self.step)
            elif isinstance(a, Deliver):
                h.delivered[member].append(a.msg)
            elif isinstance(a, Confirm):
                h.confirmed.add(a.token)  # type: ignore[arg-type]
            elif isinstance(a, (ReadGroup, UpdateGroup)):
                self.store_requests.append((member, a))
            elif isinstance(a, Joined):
                h.joined_at[member] = self.step if a.snapshot is None else self._catchups[id(a.snapshot)][1]
            elif isinstance(a, Stopped):
                h.stopped[member] = a.reason
        gm = self.members[member]
        versions = h.versions[member]
        if gm.view_version >= 0 and (not versions or versions[-1] != gm.view_version):
            versions.append(gm.view_version)
        self._watch(member)

    def _watch(self, member: MemberId) -> None:
        """The failure detector: tell a member once that a current neighbour is dead."""
        view = self.members[member].view
        if view is None or member not in self.alive:
            return
        for n in (view.left, view.right):
            if (
                n != member
                and n not in self.alive
                and n not in self.departed
                and (member, n) not in self.notified
            ):
                self.notified.add((member, n))
                self.notices.append((member, n))


def check(sim: GmSim) -> list[str]:
    """Every violation of the GM guarantees in a finished run (empty list: all hold)."""
    h = sim.history
    out: list[str] = []
    alive = list(sim.alive)
    by_sender: dict[MemberId, list[int]] = {}
    for s, k in sorted(h.sent_at):
        by_sender.setdefault(s, []).append(k)

    def after_join(r: MemberId, s: MemberId) -> list[int]:
        j = h.joined_at.get(r, math.inf)
        return [k for k in by_sender.get(s, []) if h.sent_at[(s, k)] > j]

    for r, got in h.delivered.items():
        if len(got) != len(set(got)):
            out.append(f"{r} delivered a message twice: {sorted(p for p in got if got.count(p) > 1)}")
        per: dict[MemberId, list[int]] = {}
        for s, k in got:
            per.setdefault(s, []).append(k)
        for s, ks in per.items():
            if ks != sorted(ks):
                out.append(f"{r} delivered {s}'s messages out of order: {ks}")
            if s == r:
                continue
            required = [k for k in after_join(r, s) if k <= max(ks)]
            missing = sorted(set(required) - set(ks))
            if missing:
                out.append(f"{r} delivered {s}#{max(ks)} but not earlier {s}#{missing} sent after it joined")
        versions = h.versions[r]
        if any(b <= a for a, b in zip(versions, versions[1:], strict=False)):
            out.append(f"{r} view versions not increasing: {versions}")
    for r, reason in h.stopped.items():
        out.append(f"{r} stopped: {reason}")
    out.extend(h.early_erasures)
    seen_by_survivors: set[Payload] = set().union(*(h.delivered[x] for x in alive))
    for r in alive:
        have = set(h.delivered[r])
        for s in by_sender:
            owed = set(after_join(r, s))
            if s not in sim.alive:
                owed &= {k for (s2, k) in seen_by_survivors if s2 == s}
            missing = sorted(k for k in owed if (s, k) not in have)
            if missing:
                kind = "surviving" if s in sim.alive else "dead"
                out.append(f"survivor {r} missed {kind} {s}#{missing}")
        for p in sorted(h.confirmed):
            if h.sent_at[p] > h.joined_at.get(r, math.inf) and p not in have:
                out.append(f"confirmed {p} not delivered by survivor {r}")
    for p in sorted(h.confirm_wanted - h.confirmed):
        if p[0] in sim.alive:
            out.append(f"{p} never confirmed though its sender survived")
    return out


Op = tuple[Any, ...]


def play(
    seed: int,
    founders: int,
    ops: Iterable[Op],
    *,
    max_steps: int = 20000,
    trace: bool = False,
    **member_options: Any,
) -> GmSim:
    """Run a script against a fresh ring and let it settle; then every survivor broadcasts once more.

    ``founders`` members join first (one after another, racing with traffic).
    Script operations, applied to the alive members by index modulo their count:
    ``("broadcast", i, confirm)``, ``("kill", i)`` (skipped when it would leave no
    joined member), ``("leave", i)`` (the same, but the survivors hear of it through
    ``members_left`` only), ``("forgive",)``, ``("join",)``, ``("run", n)`` (n scheduler steps). The final
    round makes every survivor adopt the newest view, so ``converged`` can hold.
    """
    sim = GmSim(seed, trace=trace, **member_options)
    for i in range(founders):
        sim.spawn(f"m{i}")
        sim.run(sim.rng.randint(0, 6))
    joiners = 0
    for op in ops:
        alive = list(sim.alive)
        if op[0] == "broadcast":
            sim.broadcast(alive[op[1] % len(alive)], bool(op[2]))
        elif op[0] in ("kill", "leave"):
            victim = alive[op[1] % len(alive)]
            if not any(sim.members[m].joined for m in alive if m != victim):
                continue
            if op[0] == "kill":
                sim.kill(victim)
            else:
                sim.leave(victim)
        elif op[0] == "forgive":
            sim.forgive()
        elif op[0] == "join":
            sim.spawn(f"j{joiners}")
            joiners += 1
        elif op[0] == "run":
            sim.run(op[1])
        else:
            raise ValueError(f"unknown operation {op!r}")
    sim.settle(max_steps)
    for m in list(sim.alive):
        sim.broadcast(m, True)
    sim.settle(max_steps)
    return sim


def converged(sim: GmSim) -> list[str]:
    """Disagreements between the survivors' views and who is really alive."""
    out = []
    views = {m: sim.members[m].view for m in sim.alive}
    versions = {v.version for v in views.values() if v is not None}
    if len(versions) != 1:
        out.append(
            f"survivors on different view versions: { {m: v.version if v else None for m, v in views.items()} }"
        )
    for m, v in views.items():
        if v is None or set(v.alive) != set(sim.alive):
            out.append(f"{m} sees alive {v.alive if v else None}, really alive {sorted(sim.alive)}")
    return out


def random_script(seed: int, kill: float = 0.15, length: int = 60) -> tuple[int, list[Op]]:
    """A founder count and a script for ``play``, drawn from ``seed``: half broadcasts, ``kill`` crashes, 10% joins."""
    rng = random.Random(seed)
    ops: list[Op] = []
    for _ in range(rng.randint(0, length)):
        x = rng.random()
        if x < 0.5:
            ops.append(("broadcast", rng.randrange(10), rng.random() < 0.5))
        elif x < 0.5 + kill:
            ops.append(("kill", rng.randrange(10)))
        elif x < 0.6 + kill:
            ops.append(("join",))
        else:
            ops.append(("run", rng.randint(0, 20)))
    return rng.randint(1, 5), ops
