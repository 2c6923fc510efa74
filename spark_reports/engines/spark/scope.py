"""What the Spark job needs of each run's context, next to the records.

One run: literals. Many runs (``grade``): a scalar is looked up by run number in an array
literal (no join on the records). The drain spans (a few per run) become a plain
condition on the row, one term per span: an array of spans and a higher-order function
over it would take the whole stage out of generated code (Spark does not compile a
stage that holds one) and cost more than the per-id aggregate itself.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any, TypeVar

from spark_reports.engines.context import Context
from spark_reports.engines.drain import DrainRange, DrainSpan

T = TypeVar("T")

_SCALARS = {
    "x_acks": "boolean",
    "x_bodies": "boolean",
    "x_seed": "bigint",
    "x_size": "bigint",
    "x_bucket": "bigint",
}


class Scope:
    """The contexts of the runs a job checks, numbered 0..n-1 as the records' ``run`` column."""

    def __init__(self, spark: Any, ctxs: dict[int, Context]) -> None:
        assert sorted(ctxs) == list(range(len(ctxs))), "runs are numbered 0..n-1"
        self.ctxs = ctxs
        self.values = {i: _scope_values(c) for i, c in ctxs.items()}

    @property
    def delays(self) -> bool:
        """Some run has delayed publishes: the order check leaves their ids out."""
        return any(c.params.delays for c in self.ctxs.values())

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
        """``df`` with the named per-run scalars as columns."""
        return df.withColumns({n: self.scalar(n) for n in names})

    def any_span(self, term: Callable[[DrainSpan], Any]) -> Any:
        """True on a row where ``term(span)`` holds for some drain span of the row's run: an OR
        of one term per span (and the run's number, with several runs); null where no term is
        true and some is null, as SQL's ``exists`` over an array would say."""
        return self._any(lambda ctx: ctx.spans, term)

    @property
    def drain_reads(self) -> bool:
        """Some run's broker holds disjoint messages: its drain's first reads are counted
        (``Context.drain_reads``)."""
        return any(c.drain_reads for c in self.ctxs.values())

    def any_drain_read(self, term: Callable[[DrainRange], Any]) -> Any:
        """``any_span`` over the runs' drain ops (``Context.drain_reads``)."""
        return self._any(lambda ctx: ctx.drain_reads, term)

    def _any(self, items: Callable[[Context], list[T]], term: Callable[[T], Any]) -> Any:
        from pyspark.sql import functions as F

        several = len(self.ctxs) > 1
        terms = [
            ((F.col("run") == run) & term(x)) if several else term(x)
            for run, ctx in sorted(self.ctxs.items())
            for x in items(ctx)
        ]
        return reduce(lambda a, b: a | b, terms) if terms else F.lit(False)


def _scope_values(ctx: Context) -> dict[str, Any]:
    p = ctx.params
    return {
        "x_acks": ctx.acks,
        "x_bodies": ctx.check_bodies,
        "x_seed": p.seed,
        "x_size": p.message_size,
        "x_bucket": ctx.bucket_s,
    }
