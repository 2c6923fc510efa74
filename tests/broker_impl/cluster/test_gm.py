"""GM member: the group record operations, the view, single members driven by hand, and literal ring scenarios."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from broker_impl.cluster.gm import (
    Action,
    Activity,
    ActivityEntry,
    AddOnRight,
    Catchup,
    Confirm,
    CreateGroup,
    Deliver,
    Erase,
    GmError,
    GmMember,
    GmMessage,
    GroupRecord,
    InMemoryGroupStore,
    Joined,
    JoinRequest,
    MarkDead,
    MemberSnapshot,
    ReadGroup,
    Send,
    Stopped,
    UpdateGroup,
    View,
    apply_op,
)
from broker_impl.cluster.gm_sim import GmSim, check

# --------------------------------------------------------------------------- group record


def test_group_ops_change_version_only_when_they_change_something() -> None:
    r0 = apply_op("q", None, CreateGroup("a"))
    assert r0 == GroupRecord("q", 0, ("a",))
    assert apply_op("q", r0, CreateGroup("b")) is r0  # already has an alive member
    r1 = apply_op("q", r0, AddOnRight("a", "b"))
    r2 = apply_op("q", r1, AddOnRight("a", "c"))
    assert r2 is not None and r2.members == ("a", "c", "b") and r2.version == 2
    assert apply_op("q", r2, AddOnRight("a", "c")) is r2  # already a member
    r3 = apply_op("q", r2, MarkDead("c"))
    assert r3 is not None and r3.dead == {"c"} and r3.version == 3 and r3.alive() == ("a", "b")
    assert apply_op("q", r3, MarkDead("c")) is r3
    assert apply_op("q", r3, AddOnRight("c", "d")) is r3  # cannot join right of a dead member
    assert apply_op("q", r3, Erase(("b",))) is r3  # only dead members are erased
    r4 = apply_op("q", r3, Erase(("c",)))
    assert r4 == GroupRecord("q", 4, ("a", "b"))
    assert apply_op("q", None, MarkDead("a")) is None


def test_create_restarts_a_group_whose_members_are_all_dead() -> None:
    dead = GroupRecord("q", 7, ("a", "b"), frozenset({"a", "b"}))
    assert apply_op("q", dead, CreateGroup("c")) == GroupRecord("q", 8, ("c",))


def test_in_memory_store_applies_and_keeps() -> None:
    store = InMemoryGroupStore()
    assert store.read("q") is None
    store.update("q", CreateGroup("a"))
    store.update("q", AddOnRight("a", "b"))
    assert store.read("q") == GroupRecord("q", 1, ("a", "b"))
    assert store.read("other") is None


def test_view_neighbours_skip_the_dead_and_dead_become_aliases_of_their_right() -> None:
    record = GroupRecord("q", 5, ("a", "x", "y", "b", "c", "z"), frozenset({"x", "y", "z"}))
    b = View.of(record, "b")
    assert (b.left, b.right, b.aliases) == ("a", "c", {"x", "y"})
    a = View.of(record, "a")
    assert (a.left, a.right, a.aliases) == ("c", "b", {"z"})  # z wraps round to a
    assert View.of(record, "c").aliases == frozenset()
    alone = View.of(GroupRecord("q", 1, ("a", "x"), frozenset({"x"})), "a")
    assert alone.alone and alone.left == "a" and alone.aliases == {"x"}


# --------------------------------------------------------------------------- one member by hand

A = TypeVar("A")


def one(actions: list[Action], kind: type[A]) -> A:
    """The single action of a step, checked to be of ``kind``."""
    assert len(actions) == 1 and isinstance(actions[0], kind), actions
    return actions[0]


def sent(action: Action) -> GmMessage:
    assert isinstance(action, Send), action
    return action.message


def answer(store: InMemoryGroupStore, member: GmMember, actions: list) -> list:
    """Execute the member's store requests synchronously; return its other actions."""
    out = []
    queue = list(actions)
    while queue:
        a = queue.pop(0)
        if isinstance(a, ReadGroup):
            queue.extend(member.store_reply(a.request, store.read(member.group)))
        elif isinstance(a, UpdateGroup):
            queue.extend(member.store_reply(a.request, store.update(member.group, a.op)))
        else:
            out.append(a)
    return out


def test_first_member_creates_the_group_and_is_alone() -> None:
    store = InMemoryGroupStore()
    a = GmMember("q", "a")
    assert answer(store, a, a.join()) == [Joined(0, None)]
    assert store.read("q") == GroupRecord("q", 0, ("a",))
    # alone: delivered and confirmed at once, nothing sent
    assert a.broadcast("m", confirm_token="t") == [Deliver("a", "m"), Confirm("t")]
    assert a.broadcast("n") == [Deliver("a", "n")]
    assert a.idle


def test_second_member_joins_by_asking_an_alive_member() -> None:
    store = InMemoryGroupStore()
    a, b = GmMember("q", "a"), GmMember("q", "b")
    answer(store, a, a.join())
    a.broadcast("before")
    (req,) = answer(store, b, b.join())
    assert req == Send("a", JoinRequest("b"))  # to the only alive member
    catchup = one(answer(store, a, a.receive("b", sent(req))), Send)
    assert store.read("q") == GroupRecord("q", 1, ("a", "b"))
    assert isinstance(catchup.message, Catchup) and catchup.to == "b"
    got = answer(store, b, b.receive("a", catchup.message))
    # b re-read the record (the catchup is of a newer version), adopted a's state and passed it on
    assert isinstance(got[0], Joined) and got[0].snapshot is catchup.message
    assert isinstance(got[1], Send) and got[1].to == "a" and isinstance(got[1].message, Catchup)
    assert not any(isinstance(x, Deliver) for x in got)  # no replay of what was sent before the join
    assert b.joined and b.view is not None and (b.view.left, b.view.right) == ("a", "a")


def test_a_joiner_whose_request_was_lost_keeps_ticking_and_asks_again() -> None:
    """The join request may go to a node whose link is not up yet: only a tick past the timeout retries."""
    store = InMemoryGroupStore()
    a, b = GmMember("q", "a"), GmMember("q", "b", join_timeout=1.0)
    answer(store, a, a.join())
    b.tick(0.0)
    (lost,) = answer(store, b, b.join())
    assert lost == Send("a", JoinRequest("b"))  # never delivered
    assert not b.idle, "a joiner waiting out its timeout must be ticked (GmHub ticks only members not idle)"
    assert answer(store, b, b.tick(0.5)) == []
    (again,) = answer(store, b, b.tick(1.5))
    assert again == Send("a", JoinRequest("b"))
    (to_b,) = answer(store, a, a.receive("b", sent(again)))
    answer(store, b, b.receive("a", sent(to_b)))
    assert b.joined and b.idle


def pair() -> tuple[InMemoryGroupStore, GmMember, GmMember]:
    """Two joined members a <-> b, with every message so far delivered."""
    store = InMemoryGroupStore()
    a, b = GmMember("q", "a", max_buffer=2, flush_interval=0.025), GmMember("q", "b")
    answer(store, a, a.join())
    (req,) = answer(store, b, b.join())
    (to_b,) = answer(store, a, a.receive("b", sent(req)))
    back = [x for x in answer(store, b, b.receive("a", sent(to_b))) if isinstance(x, Send)]
    assert answer(store, a, a.receive("b", back[0].message)) == []
    return store, a, b


def test_broadcast_is_buffered_until_the_interval_or_the_buffer_size() -> None:
    store, a, b = pair()
    assert a.broadcast("m1", confirm_token=1) == [Deliver("a", "m1")]
    assert a.tick(0.01) == []  # not yet: flush_interval is 25 ms
    flushed = one(a.tick(0.03), Send)
    assert flushed == Send("b", Activity(1, (ActivityEntry("a", ((0, "m1"),)),)))
    a.broadcast("m2")
    out = a.broadcast("m3")  # max_buffer=2 reached
    assert out[-1] == Send("b", Activity(1, (ActivityEntry("a", ((1, "m2"), (2, "m3"))),)))
    # b delivers and forwards; the pubs coming back to a turn into acks and release the confirm
    fwd = b.receive("a", flushed.message)
    assert fwd == [Deliver("a", "m1"), Send("a", Activity(1, (ActivityEntry("a", ((0, "m1"),)),)))]
    back = a.receive("b", sent(fwd[-1]))
    assert back == [Confirm(1), Send("b", Activity(1, (ActivityEntry("a", (), (0,)),)))]
    assert b.receive("a", sent(back[-1])) == [Send("a", sent(back[-1]))]
    assert b.windows()["a"].pending == ()


def test_messages_from_anyone_but_the_left_neighbour_are_ignored() -> None:
    store, a, b = pair()
    assert b.receive("stranger", Activity(1, (ActivityEntry("a", ((0, "x"),)),))) == []
    assert b.windows()["a"].last_pub == -1


def test_a_newer_version_makes_the_member_reread_the_record_first_and_park_traffic() -> None:
    store, a, b = pair()
    store.update("q", AddOnRight("b", "c"))  # behind a's back: now a -> b -> c -> a
    state = {"c": MemberSnapshot(((0, "x"),), 0, -1)}
    read = one(a.receive("c", Catchup(2, state)), ReadGroup)
    assert read.min_version == 2
    assert a.receive("c", Activity(2, (ActivityEntry("c", ((1, "y"),)),))) == []  # parked behind the first
    done = a.store_reply(read.request, store.read("q"))
    assert a.view is not None and a.view.version == 2 and a.view.left == "c"
    assert done == [
        Deliver("c", "x"),  # missed, according to c's catchup
        Send("b", Activity(2, (ActivityEntry("c", ((0, "x"),)),))),
        Deliver("c", "y"),
        Send("b", Activity(2, (ActivityEntry("c", ((1, "y"),)),))),
    ]


def test_after_a_left_change_nothing_is_taken_from_the_new_left_before_its_catchup() -> None:
    store, a, b = pair()
    record = store.update("q", AddOnRight("b", "c"))
    assert record is not None
    a.group_changed(record)
    assert a.receive("c", Activity(2, (ActivityEntry("c", ((5, "old"),)),))) == []
    out = a.receive("c", Catchup(2, {"c": MemberSnapshot(((6, "z"),), 6, 4)}))
    assert out == [Deliver("c", "z"), Send("b", Activity(2, (ActivityEntry("c", ((6, "z"),), (5,)),)))]


def test_a_member_recorded_dead_stops() -> None:
    store, a, b = pair()
    record = store.update("q", MarkDead("b"))
    assert record is not None
    assert b.group_changed(record) == [Stopped("b is dead in group q v2")]
    assert b.stopped
    with pytest.raises(GmError):
        b.broadcast("x")


def test_neighbour_death_is_recorded_after_the_guard_delay_and_leaves_the_survivor_alone() -> None:
    store, a, b = pair()
    a.broadcast("unconfirmed", confirm_token="t")
    assert a.neighbour_down("b") == []
    assert a.tick(0.05) == [Send("b", Activity(1, (ActivityEntry("a", ((0, "unconfirmed"),)),)))]
    mark = one(a.tick(0.11), UpdateGroup)  # guard_delay = 0.1
    assert mark == UpdateGroup(mark.request, MarkDead("b"))
    out = answer(store, a, a.store_reply(mark.request, store.update("q", mark.op)))
    # alone: the pending broadcast is confirmed and b is erased from the record
    assert Confirm("t") in out
    assert store.read("q") == GroupRecord("q", 3, ("a",))


def test_a_forgiven_suspicion_records_no_death() -> None:
    """A node that pauses takes back verdicts still in their guard delay: the store is never asked."""
    store, a, b = pair()
    assert a.neighbour_down("b") == []
    assert a.forgive() == []
    assert not any(isinstance(x, UpdateGroup) for x in a.tick(0.5))
    rec = store.read("q")
    assert rec is not None and rec.alive() == ("a", "b")


def test_join_twice_is_an_error() -> None:
    a = GmMember("q", "a")
    a.join()
    with pytest.raises(GmError):
        a.join()


# --------------------------------------------------------------------------- literal ring scenarios


@pytest.fixture
def ring() -> Iterator[Callable[[int, list[str]], tuple[GmSim, tuple[str, ...]]]]:
    """``ring(seed, names)``: a simulation with ``names`` formed into a ring, and the ring's order;
    once the scenario is done, every property the simulation checks holds of each one made."""
    sims: list[GmSim] = []

    def form(seed: int, names: list[str]) -> tuple[GmSim, tuple[str, ...]]:
        sims.append(GmSim(seed))
        return sims[-1], sims[-1].form(names)

    yield form
    for sim in sims:
        assert check(sim) == []


def sent_by(sim: GmSim, member: str, sender: str) -> list[int]:
    return [k for s, k in sim.history.delivered[member] if s == sender]


def test_middle_member_dies_mid_broadcast(ring) -> None:
    sim, (a, b, c) = ring(1, ["x", "y", "z"])
    for _ in range(3):
        sim.broadcast(a, confirm=True)
    sim.advance(0.05)
    sim.deliver(a, b)
    assert sent_by(sim, b, a) == [0, 1, 2] and len(sim.in_flight(b, c)) == 1
    sim.kill(b, keep=0)  # b's forward to c is lost with it
    sim.settle()
    assert sent_by(sim, c, a) == [0, 1, 2]  # from a's catchup to its new right, c
    assert {(a, 0), (a, 1), (a, 2)} <= sim.history.confirmed
    assert sim.ring() == (a, c)


def test_left_neighbour_of_the_broadcaster_dies_before_passing_its_messages_back(ring) -> None:
    sim, (a, b, c) = ring(2, ["x", "y", "z"])  # c is a's left
    sim.broadcast(a, confirm=True)
    sim.broadcast(c, confirm=True)
    sim.advance(0.05)
    sim.deliver(a, b)
    sim.deliver(b, c)
    assert sent_by(sim, c, a) == [0]
    sim.kill(c, keep=0)  # neither a's message coming back nor c's own broadcast reach a
    sim.settle()
    assert (a, 0) in sim.history.confirmed  # b's catchup tells a that the ring has it
    assert sent_by(sim, b, a) == [0] and sent_by(sim, a, c) == []
    assert sim.history.delivered[b].count((a, 0)) == 1


def test_two_neighbours_die_in_a_row(ring) -> None:
    sim, (a, b, c, d) = ring(3, ["p", "q", "r", "s"])
    sim.broadcast(a, confirm=True)
    sim.broadcast(b, confirm=True)
    sim.advance(0.05)
    sim.deliver(a, b)  # b has a#0 (and forwards it with its own b#0, batched separately)
    sim.deliver(b, c, len(sim.in_flight(b, c)))
    sim.deliver(c, d, len(sim.in_flight(c, d)))  # d delivers a#0 and b#0 ...
    assert sent_by(sim, d, a) == [0] and sent_by(sim, d, b) == [0]
    assert sim.in_flight(d, a)  # ... and a has not got b#0 yet
    sim.kill(b, keep=0)
    sim.kill(c, keep=0)
    sim.settle()
    assert sim.ring() == (a, d)
    assert sent_by(sim, a, b) == [0]  # a dead sender's message a survivor saw reaches every survivor
    assert (a, 0) in sim.history.confirmed
    assert sim.history.delivered[d].count((a, 0)) == 1


def test_dead_members_in_flight_messages_reach_the_ring_when_they_are_passed_on(ring) -> None:
    sim, (a, b, c) = ring(4, ["x", "y", "z"])
    sim.broadcast(b)
    sim.advance(0.05)
    sim.kill(b, keep=1)  # b's flush to c survives the crash (the TCP buffer drained)
    sim.deliver(b, c)
    assert sent_by(sim, c, b) == [0]
    sim.settle()
    assert sent_by(sim, a, b) == [0]  # c inherited b's message and took it round
    assert sim.ring() == (a, c)


def test_join_during_traffic(ring) -> None:
    sim, (a, b) = ring(5, ["x", "y"])
    for _ in range(4):
        sim.broadcast(a, confirm=True)
        sim.broadcast(b)
        sim.run(3)
    sim.spawn("j")
    for _ in range(30):
        sim.broadcast(a, confirm=True)
        sim.broadcast(b)
        sim.run(4)
    sim.settle()
    assert "j" in sim.ring() and sim.members["j"].joined
    joined = sim.history.joined_at["j"]
    for sender in (a, b):
        got = sent_by(sim, "j", sender)
        after = [k for (s, k), t in sim.history.sent_at.items() if s == sender and t > joined]
        assert got == list(range(got[0], got[-1] + 1))  # a contiguous run, in order
        assert set(after) <= set(got) and after  # everything sent after its join point
        assert got[0] > 0  # and nothing from before the join was replayed
    assert all((a, k) in sim.history.confirmed for k in range(34))


def test_joiner_inherits_a_member_that_died_before_sending_it_state_and_acks_what_its_left_holds(
    ring,
) -> None:
    sim, (a, x, r) = ring(6, ["a", "x", "r"])
    sim.broadcast(x)
    sim.advance(0.05)
    sim.deliver(x, r)
    sim.deliver(r, a)  # x#0 went round to a; x would turn it into an ack next
    assert sent_by(sim, a, x) == [0]
    sim.spawn("j", ask=x)
    sim.serve_store()
    sim.deliver("j", x)  # x adds j on its right and sends it a catchup ...
    assert sim.ring() == (a, x, "j", r) and len(sim.in_flight(x, "j")) == 1
    sim.kill(x, keep=0)  # ... which is lost
    sim.settle()  # j adopted a's state, inherited x, and acked x#0 that a and r held
    assert sim.ring() == (a, "j", r)
    assert sim.store.read(sim.group) == GroupRecord(sim.group, 5, (a, "j", r))  # added j, x dead, x erased


def test_joiner_that_inherits_a_dead_member_waits_for_its_messages_before_erasing_it(ring) -> None:
    sim, (a, x, r) = ring(7, ["a", "x", "r"])
    sim.broadcast(x)
    sim.broadcast(x)
    sim.advance(0.05)
    sim.deliver(x, r)  # r has x#0, x#1; its forward to a is still in flight
    sim.spawn("j", ask=x)
    sim.serve_store()
    sim.deliver("j", x)
    sim.kill(x, keep=0)
    # j's state comes from a, which has nothing of x yet: x may be erased only
    # after the messages r holds have come round (the sim records any earlier erasure)
    sim.held.add((r, a))
    sim.run_until(lambda: sim.members["j"].joined)
    sim.run(200)
    record = sim.store.read(sim.group)
    assert sent_by(sim, a, x) == [] and record is not None and record.dead == {x}
    sim.settle()
    assert sent_by(sim, a, x) == [0, 1]
    assert sim.history.early_erasures == []
