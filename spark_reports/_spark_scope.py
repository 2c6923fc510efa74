"""What the Spark job needs of each run's context, next to the records.

One run: literals. Many runs (``grade``): a scalar is looked up by run number in an array
literal (no join on the records), and the drain spans come from a small broadcast
table joined by run number where the job has one row per message.
"""

from __future__ import annotations

from typing import Any

from ._common import Context

_SPAN = "struct<p:string,q:string,lo:bigint,hi:bigint,n:string,e:bigint>"
_SCALARS = {"x_acks": "boolean", "x_bodies": "boolean", "x_seed": "bigint", "x_size": "bigint",
            "x_bucket": "bigint", "x_spans_lo": "bigint", "x_spans_hi": "bigint"}
_ARRAYS = {"x_spans": f"array<{_SPAN}>"}
_TYPES = {**_SCALARS, **_ARRAYS}
_FIELDS = {"x_spans": ("p", "q", "lo", "hi", "n", "e")}


class Scope:
    """The contexts of the runs a job checks, numbered 0..n-1 as the records' ``run`` column."""

    def __init__(self, spark: Any, ctxs: dict[int, Context]) -> None:
        assert sorted(ctxs) == list(range(len(ctxs))), "runs are numbered 0..n-1"
        self.ctxs = ctxs
        self.values = {i: _scope_values(c) for i, c in ctxs.items()}
        self.table = None
        if len(ctxs) > 1:
            ddl = ", ".join(["run int", *[f"{k} {t}" for k, t in _ARRAYS.items()]])
            self.table = spark.createDataFrame([(i, *[v[k] for k in _ARRAYS]) for i, v in self.values.items()], ddl)

    def scalar(self, name: str) -> Any:
        """A per-run scalar as a column of any row that has ``run``."""
        return self.per_run([self.values[i][name] for i in range(len(self.ctxs))], _SCALARS[name])

    def per_run(self, values: list[Any], sql_type: str) -> Any:
        """A column worth ``values[run]`` on any row that has ``run``."""
        from pyspark.sql import functions as F

        if len(values) == 1:
            return F.lit(values[0]).cast(sql_type)
        return F.element_at(F.array(*[F.lit(v).cast(sql_type) for v in values]), F.col("run") + 1)

    def add(self, df: Any, *names: str) -> Any:
        """``df`` with the named context values as columns (scalars or arrays)."""
        from pyspark.sql import functions as F

        scalars = {n: self.scalar(n) for n in names if n in _SCALARS}
        arrays = [n for n in names if n in _ARRAYS]
        df = df.withColumns(scalars) if scalars else df
        if not arrays:
            return df
        if self.table is None:
            return df.withColumns({n: _literal(n, self.values[0][n]) for n in arrays})
        return df.join(F.broadcast(self.table.select("run", *arrays)), "run")


def _literal(name: str, value: Any) -> Any:
    """An array of structs as a typed literal column, built field by field."""
    from pyspark.sql import functions as F

    if not value:
        return F.expr(f"cast(array() as {_TYPES[name]})")
    return F.array(*[F.struct(*[F.lit(v).alias(f) for f, v in zip(_FIELDS[name], row, strict=True)])
                     for row in value]).cast(_TYPES[name])


def _scope_values(ctx: Context) -> dict[str, Any]:
    p = ctx.params
    return {"x_acks": ctx.acks, "x_bodies": ctx.check_bodies, "x_seed": p.seed, "x_size": p.message_size,
            "x_spans": [(s.process, s.queue, s.lo, s.hi, s.node, s.empty_at_ns) for s in ctx.spans],
            "x_bucket": ctx.bucket_s,
            # Where any drain span lies (index bounds): most records are outside, and need not be
            # compared with each span.
            "x_spans_lo": min((s.lo for s in ctx.spans), default=None),
            "x_spans_hi": max((s.hi for s in ctx.spans), default=None)}
