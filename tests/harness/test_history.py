"""The history recorder: the schema, one completion per invoke, thread safety, Parquet."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness.history import FIELDS, SCHEMA_VERSION, Recorder, arrow_schema, read_jsonl, to_parquet


@pytest.fixture
def rec(tmp_path: Path) -> Iterator[Recorder]:
    r = Recorder(tmp_path / "history.jsonl")
    yield r
    r.close()


def _lines(path: Path) -> list[dict[str, Any]]:
    return list(read_jsonl(path))


def test_invoke_and_each_completion_carry_every_field(rec: Recorder) -> None:
    a = rec.invoke("p1", "publish", node="n1", queue="chaos-1", value="p1:1")
    a.ok()
    b = rec.invoke("p1", "publish", node="n2", queue="chaos-1", value="p1:2")
    b.fail("nack")
    c = rec.invoke("c1", "consume", node="n3", queue="chaos-1")
    c.ok("p1:1", redelivered=True, node="n1")
    d = rec.invoke("nemesis", "partition", value={"shape": "isolate", "cuts": [["n1", "n2"]]})
    d.info("timeout", {"shape": "isolate", "error": "timeout"})
    rec.close()
    lines = _lines(rec.path)
    assert [(r["process"], r["type"], r["f"]) for r in lines] == [
        ("p1", "invoke", "publish"),
        ("p1", "ok", "publish"),
        ("p1", "invoke", "publish"),
        ("p1", "fail", "publish"),
        ("c1", "invoke", "consume"),
        ("c1", "ok", "consume"),
        ("nemesis", "invoke", "partition"),
        ("nemesis", "info", "partition"),
    ]
    for r in lines:
        assert tuple(r) == FIELDS
        assert r["schema"] == SCHEMA_VERSION
        assert isinstance(r["time_ns"], int) and r["time_ns"] >= 0
        assert dt.datetime.fromisoformat(r["wall_time"]).tzinfo is not None
    ok, fail, consumed, info = lines[1], lines[3], lines[5], lines[7]
    assert (ok["value"], ok["node"], ok["queue"], ok["error"], ok["redelivered"]) == (
        "p1:1",
        "n1",
        "chaos-1",
        None,
        None,
    )
    assert (fail["value"], fail["error"], fail["node"]) == ("p1:2", "nack", "n2")
    assert (consumed["value"], consumed["redelivered"], consumed["node"]) == ("p1:1", True, "n1")
    assert lines[4]["value"] is None and lines[4]["node"] == "n3"
    # Structured values are stored as canonical JSON text (sorted keys).
    assert lines[6]["value"] == '{"cuts":[["n1","n2"]],"shape":"isolate"}'
    assert json.loads(info["value"]) == {"shape": "isolate", "error": "timeout"}
    assert info["error"] == "timeout"
    assert rec.counts[("publish", "ok")] == 1 and rec.counts[("publish", "invoke")] == 2


def test_indexes_and_times_strictly_increase(rec: Recorder) -> None:
    for i in range(50):
        rec.invoke("p1", "publish", value=f"p1:{i}").ok()
    rec.close()
    lines = _lines(rec.path)
    assert [r["index"] for r in lines] == list(range(100))
    times = [r["time_ns"] for r in lines]
    assert times == sorted(times)


def test_completing_twice_raises(rec: Recorder) -> None:
    op = rec.invoke("p1", "publish", value="p1:1")
    op.ok()
    for complete in (op.ok, lambda: op.fail("x"), lambda: op.info("x")):
        with pytest.raises(RuntimeError, match="completed twice"):
            complete()
    assert rec.open_count() == 0


def test_close_completes_open_invocations_as_info(rec: Recorder) -> None:
    done = rec.invoke("p1", "publish", value="p1:1")
    done.ok()
    open1 = rec.invoke("p1", "publish", node="n1", queue="q", value="p1:2")
    open2 = rec.invoke("c1", "consume", node="n2", queue="q")
    assert rec.open_count() == 2
    rec.close()
    rec.close()  # idempotent
    lines = _lines(rec.path)
    tail = lines[-2:]
    assert [(r["process"], r["type"], r["f"], r["node"], r["queue"], r["value"]) for r in tail] == [
        ("p1", "info", "publish", "n1", "q", "p1:2"),
        ("c1", "info", "consume", "n2", "q", None),
    ]
    assert all(r["error"] and "no completion" in r["error"] for r in tail)
    with pytest.raises(RuntimeError):
        open1.ok()  # already completed by close()
    with pytest.raises(RuntimeError, match="closed"):
        rec.invoke("p1", "publish")
    assert open2.done


def test_every_invoke_has_exactly_one_completion_by_the_same_process(rec: Recorder) -> None:
    ops = [rec.invoke(f"p{i % 3}", "publish", value=f"p{i % 3}:{i}") for i in range(30)]
    for i, op in enumerate(ops):
        if i % 4 == 0:
            op.ok()
        elif i % 4 == 1:
            op.fail("nack")
        # the rest stay open until close()
    rec.close()
    invokes: dict[tuple[str, str], int] = {}
    completions: dict[tuple[str, str], int] = {}
    for r in _lines(rec.path):
        key = (r["process"], r["value"])
        target = invokes if r["type"] == "invoke" else completions
        target[key] = target.get(key, 0) + 1
    assert invokes == completions and set(invokes.values()) == {1}


def test_concurrent_writers_keep_indexes_unique_and_lines_whole(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl", flush_every=7)
    n_threads, per = 8, 300
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(per):
            op = rec.invoke(f"p{t}", "publish", queue="q", value=f"p{t}:{i}" + "x" * (i % 50))
            if i % 2:
                op.ok()
            else:
                op.info("connection lost")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rec.close()
    raw = (tmp_path / "h.jsonl").read_text().splitlines()
    assert len(raw) == 2 * n_threads * per
    lines = [json.loads(line) for line in raw]  # every line is one whole JSON object
    assert [r["index"] for r in lines] == list(range(len(lines)))
    for t in range(n_threads):
        mine = [r for r in lines if r["process"] == f"p{t}"]
        assert [r["type"] for r in mine[:2]] == ["invoke", "info"]
        assert len(mine) == 2 * per


def test_to_parquet_round_trips_values_and_types(rec: Recorder, tmp_path: Path) -> None:
    rec.invoke("p1", "publish", node="n1", queue="q", value="p1:1").ok()
    rec.invoke("c1", "consume", node="n2", queue="q").ok("p1:1", redelivered=False)
    rec.invoke("c1", "consume", node="n2", queue="q").ok("p1:1", redelivered=True)
    rec.invoke("nemesis", "kill", node="n3", value={"node": "n3"}).info("exec failed")
    rec.close()
    jsonl = _lines(rec.path)
    out = tmp_path / "history.parquet"
    assert to_parquet(rec.path, out, batch_rows=3) == len(jsonl)  # several batches
    table = pq.read_table(out)
    assert table.schema.equals(arrow_schema())
    assert table.to_pylist() == jsonl
    assert not (tmp_path / "history.parquet.tmp").exists()


def test_to_parquet_of_an_empty_history(tmp_path: Path) -> None:
    Recorder(tmp_path / "h.jsonl").close()
    assert to_parquet(tmp_path / "h.jsonl", tmp_path / "h.parquet") == 0
    table = pq.read_table(tmp_path / "h.parquet")
    assert table.num_rows == 0
    assert table.schema.equals(arrow_schema())


def test_to_parquet_with_an_exact_multiple_of_the_batch(rec: Recorder, tmp_path: Path) -> None:
    for i in range(3):
        rec.invoke("p1", "publish", value=f"p1:{i}").ok()
    rec.close()
    assert to_parquet(rec.path, tmp_path / "h.parquet", batch_rows=2) == 6
    assert pq.read_table(tmp_path / "h.parquet").column("index").to_pylist() == list(range(6))


@pytest.mark.parametrize("ops", [0, 3, 4, 7])
def test_the_recorder_writes_the_parquet_history_as_the_run_goes(tmp_path: Path, ops: int) -> None:
    """Row groups are written during the run (no conversion after it); the file appears whole at
    close and holds exactly what the JSONL holds, open operations completed as info included."""
    out = tmp_path / "history.parquet"
    rec = Recorder(tmp_path / "history.jsonl", parquet=out, row_group=2)
    for i in range(ops):
        rec.invoke("p1", "publish", node="n1", queue="q", value=f"p1:{i}").ok()
    left_open = rec.invoke("c1", "ack", value="p1:0", detail={"why": "open at the end"})
    assert left_open.index == 2 * ops
    assert not out.exists(), "the file appears only once it is complete"
    rec.close()
    table = pq.read_table(out)
    assert table.schema.equals(arrow_schema())
    assert table.to_pylist() == _lines(rec.path)
    assert table.num_rows == 2 * ops + 2
    assert pq.ParquetFile(out).metadata.num_row_groups == max(1, -(-(2 * ops + 2) // 2))
    assert not (tmp_path / "history.parquet.tmp").exists()


def test_sparse_offsets_are_ordered_int64_keys_of_entry_ids() -> None:
    """A Redis entry id ``ms-seq`` and its offset: the same order, one BIGINT, and back again."""
    from harness.spec import entry_id, entry_offset

    ids = ["0-1", "1700000000000-0", "1700000000000-3", "1700000000000-999999", "1700000000001-0"]
    offsets = [entry_offset(i) for i in ids]
    assert offsets == sorted(offsets) and offsets[2] == 1_700_000_000_000_000_003
    assert [entry_id(o) for o in offsets] == ids
    assert entry_offset("9223372036853-999999") < 2**63  # an int64 until the year 2262
    with pytest.raises(ValueError, match="no offset"):
        entry_offset("1700000000000-1000000")
