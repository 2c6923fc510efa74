"""Random operation sequences against a plain model of the backing-queue contract."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from broker_impl.backing import PersistentBackingQueue, make_backing_queue, open_store
from broker_impl.message import Message

STORE_CFG = {"flush": "async", "segment_bytes": 4096, "cq_entries_per_file": 8}


@dataclass
class Model:
    """Ready and unacked messages as (seq, body, persistent, redelivered); nothing clever."""

    ready: dict[int, tuple[bytes, bool, bool]] = field(default_factory=dict)
    unacked: dict[int, tuple[bytes, bool, bool]] = field(default_factory=dict)

    def fetch(self) -> tuple[int, bytes, bool] | None:
        if not self.ready:
            return None
        seq = min(self.ready)
        body, persistent, redelivered = self.ready.pop(seq)
        self.unacked[seq] = (body, persistent, redelivered)
        return seq, body, redelivered

    def requeue(self, seqs: list[int]) -> None:
        for s in seqs:
            if s in self.unacked:
                body, persistent, _ = self.unacked.pop(s)
                self.ready[s] = (body, persistent, True)

    def forget(self, seqs: list[int]) -> None:
        for s in seqs:
            self.unacked.pop(s, None)

    def restart(self) -> None:
        """Transient messages vanish; delivered-but-unacked persistent ones come back redelivered."""
        ready = {s: v for s, v in self.ready.items() if v[1]}
        ready.update({s: (b, p, True) for s, (b, p, _) in self.unacked.items() if p})
        self.ready, self.unacked = ready, {}


op = st.one_of(
    st.tuples(st.just("publish"), st.booleans(), st.integers(1, 300)),
    st.tuples(st.just("publish_delivered"), st.booleans(), st.integers(1, 50)),
    st.tuples(st.just("fetch")),
    st.tuples(st.just("ack"), st.lists(st.integers(0, 20), max_size=4)),
    st.tuples(st.just("requeue"), st.lists(st.integers(0, 20), max_size=4)),
    st.tuples(st.just("drop"), st.lists(st.integers(0, 20), max_size=4)),
    st.tuples(st.just("purge")),
    st.tuples(st.just("restart")),
)


async def run_ops(ops: list[tuple], durable: bool, data_dir: Path) -> None:
    store = await open_store(data_dir, STORE_CFG)
    q = make_backing_queue("q", durable, store, ram_budget_bytes=400)
    assert isinstance(q, PersistentBackingQueue) == durable
    model = Model()
    counter = 0
    for o in ops:
        kind = o[0]
        if kind in ("publish", "publish_delivered"):
            if kind == "publish_delivered" and model.ready:
                continue  # the broker only uses it on an empty queue
            counter += 1
            newest = max([*model.ready, *model.unacked, 0])
            body = b"%d:" % counter + b"b" * o[2]
            props = commands.Basic.Properties(delivery_mode=2 if o[1] else 1)
            if kind == "publish":
                seq = await q.publish(Message("", "q", props, body))
                model.ready[seq] = (body, o[1], False)
            else:
                seq = await q.publish_delivered(Message("", "q", props, body))
                model.unacked[seq] = (body, o[1], False)
            assert seq > newest
        elif kind == "fetch":
            got, want = q.fetch(), model.fetch()
            assert (got and (got.seq, got.message.body, got.redelivered)) == want
        elif kind in ("ack", "requeue", "drop"):
            pending = sorted(model.unacked)
            seqs = [pending[i % len(pending)] for i in o[1]] if pending else []
            seqs = list(dict.fromkeys(seqs))
            if kind == "requeue":
                q.requeue(seqs)
                model.requeue(seqs)
            else:
                await (q.ack(seqs) if kind == "ack" else q.drop(seqs))
                model.forget(seqs)
        elif kind == "purge":
            assert await q.purge() == len(model.ready)
            model.ready.clear()
        elif kind == "restart" and durable:
            await q.close()
            await store.close()
            store = await open_store(data_dir, STORE_CFG)
            q = make_backing_queue("q", durable, store, ram_budget_bytes=400)
            model.restart()
        assert (q.len(), q.depth(), q.unacked()) == (
            len(model.ready),
            len(model.ready) + len(model.unacked),
            sorted(model.unacked),
        )
        assert q.ram_bytes() <= 400
    # drain: everything left comes out once, in order, with the right flags
    model.requeue(sorted(model.unacked))
    q.requeue(q.unacked())
    while (want := model.fetch()) is not None:
        got = q.fetch()
        assert got is not None and (got.seq, got.message.body, got.redelivered) == want
    assert q.fetch() is None
    await q.close()
    await store.close()


@settings(max_examples=60)
@given(ops=st.lists(op, max_size=60))
def test_memory_queue_matches_model(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run_ops(ops, False, Path(d)))


@settings(max_examples=60)
@given(ops=st.lists(op, max_size=60))
def test_persistent_queue_matches_model(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run_ops(ops, True, Path(d)))
