"""Small Spark SQL building blocks of the reconciliation job: the message body rules, exact
bucket arithmetic, and the tagged parts that let results of any shape share one job."""

from __future__ import annotations

import json
from typing import Any

from spark_reports.engines.common import NS_PER_S


def producer_and_seq(mid: str) -> tuple[Any, Any]:
    """``_common.ID_RE`` (``producer:seq``, seq 1-18 ASCII digits) in plain string functions: the
    producer, and the seq's digits or "" where the id does not match. The greedy ``(.*)`` puts
    the split at the last colon, and only there can the rest be all digits; a regular
    expression per delivery cost seconds at ten million records."""
    from pyspark.sql import functions as F

    seqs = f"substring_index({mid}, ':', -1)"
    match = (
        F.col(mid).contains(":")
        & F.expr(f"char_length({seqs}) between 1 and 18")
        & (F.expr(f"translate({seqs}, '0123456789', '')") == "")
    )
    producer = F.expr(f"substring({mid}, 1, char_length({mid}) - char_length({seqs}) - 1)")
    return F.when(match, producer).otherwise(""), F.when(match, F.expr(seqs)).otherwise("")


def payload_sql(mid: str, seed: int | str, size: str) -> str:
    """The seeded filler of ``harness.spec.message_body`` in Spark SQL (mid, seed, size: SQL expressions)."""
    head = f"concat({mid}, '|')"
    n = f"greatest(0, ({size}) - char_length({head}) - 17)"
    return (
        f"substring(repeat(sha2(concat(cast({seed} as string), ':', {mid}), 256), ({n}) div 64 + 1), 1, {n})"
    )


def body_from_payload_sql(mid: str, payload: str) -> str:
    """``id|check|payload``, check being the first 16 hex digits of the payload's sha256."""
    return f"concat({mid}, '|', substring(sha2({payload}, 256), 1, 16), '|', {payload})"


def digest_sql(body: str) -> str:
    """``harness.spec.body_digest`` in Spark SQL."""
    return f"substring(sha2({body}, 256), 1, 32)"


def bucket(name: str, width_s: str) -> Any:
    """Exact floor division on longs (Spark's div truncates toward zero): the timeline bucket
    (width_s: an SQL expression)."""
    from pyspark.sql import functions as F

    def floordiv(x: str, d: int | str) -> str:
        return f"((({x}) - pmod(({x}), {d})) div {d})"

    return F.expr(f"{floordiv(floordiv(name, NS_PER_S), width_s)} * {width_s}")


def tagged(df: Any, part: str) -> Any:
    """One part of a combined job: its rows as JSON text under a tag, so parts of any shape share a union."""
    from pyspark.sql import functions as F

    row = F.to_json(F.struct(*[F.col(c) for c in df.columns]), {"ignoreNullFields": "false"})
    return df.select(F.lit(part).alias("part"), row.alias("js"))


def collect_parts(parts: list[Any]) -> dict[str, list[dict]]:
    """Run the tagged parts as one job; their rows by tag."""
    df = parts[0]
    for p in parts[1:]:
        df = df.unionByName(p)
    out: dict[str, list[dict]] = {}
    for r in df.collect():
        out.setdefault(r["part"], []).append(json.loads(r["js"]))
    return out


def expected_digest_sql(mid: str, seed: str, size: str) -> str:
    """The digest of the body the workload sent for message id ``mid`` (SQL expressions all)."""
    return digest_sql(body_from_payload_sql(mid, payload_sql(mid, seed, size)))
