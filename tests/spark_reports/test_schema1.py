"""Runs stored before history schema 2 still check: a delivery counts as consumed, and the results say so.

The history below is literal schema-1 text as the recorder wrote it then: no digest or
detail fields, every ack recorded ok right after it was written.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.history import to_parquet
from spark_reports import check_python

SCHEMA1 = """\
{"index":0,"time_ns":1000,"wall_time":"2024-05-01T10:00:00.000001+00:00","process":"p1","node":"n1","type":"invoke","f":"publish","queue":"chaos-1","value":"p1:1","redelivered":null,"error":null,"schema":1}
{"index":1,"time_ns":2000,"wall_time":"2024-05-01T10:00:00.000002+00:00","process":"p1","node":"n1","type":"ok","f":"publish","queue":"chaos-1","value":"p1:1","redelivered":null,"error":null,"schema":1}
{"index":2,"time_ns":3000,"wall_time":"2024-05-01T10:00:00.000003+00:00","process":"p1","node":"n1","type":"invoke","f":"publish","queue":"chaos-1","value":"p1:2","redelivered":null,"error":null,"schema":1}
{"index":3,"time_ns":4000,"wall_time":"2024-05-01T10:00:00.000004+00:00","process":"p1","node":"n1","type":"ok","f":"publish","queue":"chaos-1","value":"p1:2","redelivered":null,"error":null,"schema":1}
{"index":4,"time_ns":5000,"wall_time":"2024-05-01T10:00:00.000005+00:00","process":"p1","node":"n1","type":"invoke","f":"publish","queue":"chaos-1","value":"p1:3","redelivered":null,"error":null,"schema":1}
{"index":5,"time_ns":6000,"wall_time":"2024-05-01T10:00:00.000006+00:00","process":"p1","node":"n1","type":"ok","f":"publish","queue":"chaos-1","value":"p1:3","redelivered":null,"error":null,"schema":1}
{"index":6,"time_ns":7000,"wall_time":"2024-05-01T10:00:00.000007+00:00","process":"c1","node":"n2","type":"invoke","f":"consume","queue":"chaos-1","value":null,"redelivered":null,"error":null,"schema":1}
{"index":7,"time_ns":7001,"wall_time":"2024-05-01T10:00:00.000007+00:00","process":"c1","node":"n2","type":"ok","f":"consume","queue":"chaos-1","value":"p1:1","redelivered":false,"error":null,"schema":1}
{"index":8,"time_ns":7002,"wall_time":"2024-05-01T10:00:00.000007+00:00","process":"c1","node":"n2","type":"invoke","f":"ack","queue":"chaos-1","value":"p1:1","redelivered":null,"error":null,"schema":1}
{"index":9,"time_ns":7003,"wall_time":"2024-05-01T10:00:00.000007+00:00","process":"c1","node":"n2","type":"ok","f":"ack","queue":"chaos-1","value":"p1:1","redelivered":null,"error":null,"schema":1}
{"index":10,"time_ns":8000,"wall_time":"2024-05-01T10:00:00.000008+00:00","process":"c1","node":"n2","type":"invoke","f":"consume","queue":"chaos-1","value":null,"redelivered":null,"error":null,"schema":1}
{"index":11,"time_ns":8001,"wall_time":"2024-05-01T10:00:00.000008+00:00","process":"c1","node":"n2","type":"ok","f":"consume","queue":"chaos-1","value":"p1:2","redelivered":false,"error":null,"schema":1}
{"index":12,"time_ns":8002,"wall_time":"2024-05-01T10:00:00.000008+00:00","process":"c1","node":"n2","type":"invoke","f":"ack","queue":"chaos-1","value":"p1:2","redelivered":null,"error":null,"schema":1}
{"index":13,"time_ns":8003,"wall_time":"2024-05-01T10:00:00.000008+00:00","process":"c1","node":"n2","type":"info","f":"ack","queue":"chaos-1","value":"p1:2","redelivered":null,"error":"ChannelInvalidStateError: writer is None","schema":1}
{"index":14,"time_ns":9000,"wall_time":"2024-05-01T10:00:00.000009+00:00","process":"c2","node":"n3","type":"invoke","f":"consume","queue":"chaos-1","value":null,"redelivered":null,"error":null,"schema":1}
{"index":15,"time_ns":9001,"wall_time":"2024-05-01T10:00:00.000009+00:00","process":"c2","node":"n3","type":"ok","f":"consume","queue":"chaos-1","value":"p1:1","redelivered":true,"error":null,"schema":1}
{"index":16,"time_ns":9002,"wall_time":"2024-05-01T10:00:00.000009+00:00","process":"c2","node":"n3","type":"invoke","f":"ack","queue":"chaos-1","value":"p1:1","redelivered":null,"error":null,"schema":1}
{"index":17,"time_ns":9003,"wall_time":"2024-05-01T10:00:00.000009+00:00","process":"c2","node":"n3","type":"ok","f":"ack","queue":"chaos-1","value":"p1:1","redelivered":null,"error":null,"schema":1}
{"index":18,"time_ns":10000,"wall_time":"2024-05-01T10:00:00.000010+00:00","process":"d1","node":null,"type":"invoke","f":"drain","queue":"chaos-1","value":"{}","redelivered":null,"error":null,"schema":1}
{"index":19,"time_ns":11000,"wall_time":"2024-05-01T10:00:00.000011+00:00","process":"d1","node":"n1","type":"ok","f":"drain","queue":"chaos-1","value":"{\\"consumed\\":0,\\"node\\":\\"n1\\"}","redelivered":null,"error":null,"schema":1}
"""
SCENARIO = {
    "name": "old",
    "seed": 5,
    "workload": {"message_size": 64},
    "budgets": {"resurrected": 0},
    "checkers": ["python"],
}


def _schema1_arrow(rows: list[dict[str, Any]]) -> pa.Schema:
    """The Parquet schema of that time: the literal's fields in their order, strings but for these."""
    typed = {"index": pa.int64(), "time_ns": pa.int64(), "redelivered": pa.bool_(), "schema": pa.int32()}
    return pa.schema([(name, typed.get(name, pa.string())) for name in rows[0]])


def _run_dir(root: Path, form: str) -> Path:
    """form: jsonl (a run stored unconverted), old-parquet (Parquet of that time), converted (to_parquet now)."""
    d = root / form
    d.mkdir()
    (d / "history.jsonl").write_text(SCHEMA1)
    if form == "old-parquet":
        rows = [json.loads(line) for line in SCHEMA1.splitlines()]
        pq.write_table(pa.Table.from_pylist(rows, schema=_schema1_arrow(rows)), d / "history.parquet")
        (d / "history.jsonl").unlink()
    elif form == "converted":
        to_parquet(d / "history.jsonl", d / "history.parquet")
    (d / "scenario.json").write_text(json.dumps({"scenario": SCENARIO, "seed": 5}))
    return d


def _assert_schema1_model(r: Mapping[str, Any]) -> None:
    assert r["history_schema"] == 1
    assert (r["valid"], r["verdict"]) == (False, "LOST")
    assert r["lost"] == ["p1:3"] and r["lost_detail"][0]["cause"] == "never delivered"
    c = r["counts"]
    # p1:2's ack ended info and p1:1 came back after an ack ok: under schema 2 that would be
    # ack_unknown and a resurrection; a schema-1 history cannot tell, so deliveries are consumption.
    assert (c["consumed_unique"], c["consumed_total"], c["delivered_total"]) == (2, 3, 3)
    assert (c["ack_unknown"], c["resurrected"], c["corrupted"], c["split_brain"]) == (0, 0, 0, 0)
    assert c["duplicated"] == 1
    [note] = r["notes"]
    assert note.startswith("schema-1 history: acks were recorded ok when written")


@pytest.mark.parametrize("form", ["jsonl", "old-parquet", "converted"])
def test_schema1_history_counts_deliveries_as_consumed(tmp_path: Path, form: str) -> None:
    _assert_schema1_model(check_python(_run_dir(tmp_path, form), {"scenario": SCENARIO, "seed": 5}))


def test_brokerchaos_analyze_reads_a_schema1_run(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, "jsonl")
    proc = subprocess.run(
        ["brokerchaos", "analyze", str(d), "--checker", "python"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[0] == f"{d}: LOST"
    r = json.loads((d / "results.json").read_text())
    _assert_schema1_model(r)
    assert (d / "history.parquet").is_file() and (d / "report.html").is_file()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("form", ["old-parquet", "converted"])
def test_spark_reads_schema1_parquet_the_same(tmp_path: Path, form: str, spark_engine) -> None:
    d = _run_dir(tmp_path, form)
    got = dict(spark_engine(d, SCENARIO))
    expected = dict(check_python(d, SCENARIO))
    _assert_schema1_model(got)
    assert got.pop("engine") == "spark" and expected.pop("engine") == "python"
    assert got == expected
