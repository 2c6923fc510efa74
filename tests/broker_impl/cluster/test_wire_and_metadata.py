"""Inter-node frames from literal bytes, and the last-writer-wins metadata table."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from broker_impl.cluster.metadata import Entry, Table, key
from broker_impl.cluster.wire import DATA, HEARTBEAT, HELLO, Decoder, Frame, WireError, encode


def test_frame_layout_is_length_type_header_blob() -> None:
    raw = encode(Frame(DATA, {"t": "pub"}, b"\x00body"))
    assert raw == b"\x00\x00\x00\x15" + b"\x03" + b"\x00\x00\x00\x0b" + b'{"t":"pub"}' + b"\x00body"
    assert list(Decoder().feed(raw)) == [Frame(DATA, {"t": "pub"}, b"\x00body")]


def test_frames_split_at_every_byte_boundary_decode_the_same() -> None:
    frames = [
        Frame(HELLO, {"node": "n1", "inc": "ab"}),
        Frame(HEARTBEAT, {}),
        Frame(DATA, {"t": "x"}, b"\xff" * 300),
    ]
    raw = b"".join(encode(f) for f in frames)
    for cut in range(len(raw) + 1):
        d = Decoder()
        assert [*d.feed(raw[:cut]), *d.feed(raw[cut:])] == frames


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"\x00\x00\x00\x01\x03", "bad frame length 1"),
        (b"\x00\x00\x00\x05\x09\x00\x00\x00\x00", "unknown frame type 9"),
        (b"\x00\x00\x00\x06\x03\x00\x00\x00\x09{", "header length 9 beyond frame length 6"),
        (b"\x00\x00\x00\x06\x03\x00\x00\x00\x01{", "frame header is not JSON"),
        (b"\x00\x00\x00\x07\x03\x00\x00\x00\x02[]", "not a JSON object"),
    ],
)
def test_garbage_is_a_wire_error(raw: bytes, needle: str) -> None:
    with pytest.raises(WireError, match=needle):
        list(Decoder().feed(raw))


def test_diff_stamps_changes_and_tombstones() -> None:
    t = Table("n1")
    first = t.diff({key("queue", "/", "a"): {"master": "n1"}})
    assert [(k, e.stamp, e.data) for k, e in first.items()] == [
        (key("queue", "/", "a"), (1, "n1"), {"master": "n1"})
    ]
    assert t.diff({key("queue", "/", "a"): {"master": "n1"}}) == {}
    gone = t.diff({})
    assert gone[key("queue", "/", "a")].data is None and gone[key("queue", "/", "a")].stamp == (2, "n1")
    assert t.live() == {}


def test_merge_converges_whatever_the_order_and_repetition() -> None:
    """Every node that has seen the same entries holds the same table (by generation, then (lamport, node))."""
    rng = random.Random(5)
    writes = []
    for node in ("n1", "n2", "n3"):
        t = Table(node)
        for i in range(20):
            k = key("queue", "/", f"q{rng.randrange(4)}")
            data = None if rng.random() < 0.2 else {"master": rng.choice(["n1", "n2", "n3"]), "v": i}
            writes.append((k, t.set(k, data)))
            if rng.random() < 0.3:
                t.merge(writes)  # some writes follow others' (their generations build on them)
    results = []
    for order in itertools.islice(itertools.permutations(range(3)), 6):
        t = Table("x")
        shuffled = writes[:]
        rng.shuffle(shuffled)
        for _ in order:
            t.merge(shuffled)
        results.append({k: (e.rank, e.data) for k, e in t.entries.items()})
    assert all(r == results[0] for r in results)
    newest: dict[str, Any] = {}
    for k, e in writes:
        if k not in newest or e.rank > newest[k].rank:
            newest[k] = e
    assert results[0] == {k: (e.rank, e.data) for k, e in newest.items()}
    assert any(e.generation > 0 for _, e in writes)


def test_merge_reports_only_real_changes_and_advances_the_clock() -> None:
    t = Table("n1")
    e = Entry((7, "n2"), {"master": "n2"})
    assert t.merge([("k", e)]) == {"k": e}
    assert t.merge([("k", e)]) == {}
    assert t.clock == 7 and t.set("k2", {}).stamp == (8, "n1")


def test_a_promotion_wins_over_later_stamps_of_the_master_it_replaced() -> None:
    """The old master, cut off from the promoter (or restarted from its own table), stamps its record later
    by the Lamport clock; the promotion changed the owner of the record it saw, so it ranks above them."""
    k = key("queue", "/", "q")
    n1, n2 = Table("n1"), Table("n2")
    n2.merge(n1.diff({k: {"master": "n1", "mirrors": ["n2"]}}).items())
    promoted = n2.diff({k: {"master": "n2", "mirrors": []}})[k]
    here: dict[str, dict[str, Any]] = {k: {"master": "n1", "mirrors": ["n2"]}}
    for i in range(50):  # n1 goes on stamping without hearing of the promotion
        here[key("exchange", "/", f"x{i}")] = {}
        n1.diff(here)
    stale = n1.diff({**here, k: {"master": "n1", "mirrors": []}})[k]
    assert stale.stamp > promoted.stamp and (stale.generation, promoted.generation) == (0, 1)
    for table in (n1, n2, Table("n3")):
        table.merge([(k, stale), (k, promoted)])
        table.merge([(k, stale)])
        assert table.entries[k] is promoted
    # created and deleted count as owner changes too: a redeclare ranks above the tombstone it replaces
    gone = n2.diff({})[k]
    back = n2.diff({k: {"master": "n2"}})[k]
    assert (promoted.generation, gone.generation, back.generation) == (1, 2, 3)


def test_entries_persisted_without_a_generation_read_as_generation_0() -> None:
    t = Table.load("n1", b'{"clock": 3, "entries": {"k": [3, "n2", {"master": "n2"}]}}')
    assert t.entries["k"] == Entry((3, "n2"), {"master": "n2"}, 0)
    assert Table.load("n1", t.dump()).entries == t.entries
