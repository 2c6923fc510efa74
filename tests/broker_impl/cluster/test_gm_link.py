"""GM on the wire: ring messages and group operations survive encoding, and record merges agree everywhere."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_impl.cluster.gm import (
    Activity,
    ActivityEntry,
    AddOnRight,
    Catchup,
    CreateGroup,
    Erase,
    GroupOp,
    GroupRecord,
    JoinRequest,
    MarkDead,
    MemberSnapshot,
    Probe,
    apply_op,
)
from broker_impl.cluster.gm_link import (
    decode_message,
    decode_op,
    decode_record,
    encode_message,
    encode_op,
    encode_record,
    newer,
    node_of,
)
from broker_impl.cluster.wire import DATA, Decoder, Frame, encode

members = st.sampled_from(["n1/a/1", "n2/b/1", "n3/c/2", "n4/d/7"])
payloads = st.tuples(
    st.dictionaries(
        st.sampled_from(["op", "n", "depth", "seqs"]),
        st.one_of(st.integers(-5, 10**6), st.text(max_size=8), st.lists(st.integers(0, 100), max_size=4)),
        max_size=4,
    ),
    st.binary(max_size=64),
)
pubs = st.lists(st.tuples(st.integers(0, 10**9), payloads), max_size=5).map(tuple)
activities = st.builds(
    Activity,
    st.integers(0, 50),
    st.lists(
        st.builds(ActivityEntry, members, pubs, st.lists(st.integers(0, 10**9), max_size=4).map(tuple)),
        max_size=4,
    ).map(tuple),
)
catchups = st.builds(
    Catchup,
    st.integers(0, 50),
    st.dictionaries(
        members, st.builds(MemberSnapshot, pubs, st.integers(-1, 10**9), st.integers(-1, 10**9)), max_size=4
    ),
)
messages = st.one_of(
    activities,
    catchups,
    st.builds(JoinRequest, members),
    st.builds(Probe, st.integers(0, 50), members, st.integers(0, 99)),
)


@given(messages)
def test_every_ring_message_survives_a_cluster_frame(msg) -> None:
    h, body = encode_message(msg)
    raw = encode(Frame(DATA, {"t": "gm", "g": "/q/1", "from": "n1/a/1", "to": "n2/b/1", **h}, body))
    (frame,) = list(Decoder().feed(raw))
    assert decode_message(frame.header, frame.blob) == msg


@pytest.mark.parametrize(
    "op",
    [CreateGroup("n1/a/1"), AddOnRight("n1/a/1", "n2/b/1"), MarkDead("n2/b/1"), Erase(("n2/b/1", "n3/c/2"))],
)
def test_group_operations_round_trip(op) -> None:
    assert decode_op(encode_op(op)) == op


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError):
        decode_message({"k": "x"}, b"")
    with pytest.raises(ValueError):
        decode_op({"op": "leave"})


def test_member_ids_name_their_node() -> None:
    assert node_of("n3/5f2a/12") == "n3"


def _records() -> list[GroupRecord]:
    """Every record a short history of operations reaches, on one copy and on diverged copies."""
    out = set()
    ops: list[GroupOp] = [
        CreateGroup("n1/a/1"),
        AddOnRight("n1/a/1", "n2/b/1"),
        AddOnRight("n2/b/1", "n3/c/2"),
        MarkDead("n1/a/1"),
        MarkDead("n3/c/2"),
        Erase(("n1/a/1",)),
        Erase(("n3/c/2",)),
    ]
    for seq in itertools.permutations(ops, 5):
        r = None
        for op in seq:
            r = apply_op("g", r, op)
            if r is not None:
                out.add(r)
    return sorted(out, key=lambda r: (r.version, r.members, sorted(r.dead)))


def test_record_merge_is_a_total_order_so_every_node_keeps_the_same_copy() -> None:
    recs = _records()
    assert len(recs) >= 8
    for a, b in itertools.permutations(recs, 2):
        assert newer(a, b) != newer(b, a), (a, b)  # exactly one wins
        assert not newer(a, a)
    for a, b, c in itertools.permutations(recs[:20], 3):
        if newer(a, b) and newer(b, c):
            assert newer(a, c)
    for r in recs:
        assert decode_record(encode_record(r)) == r
