"""Per message id: what became of it, in Spark.

Most ids have a plain life: one publish invoke and at most one completion after it,
at most one delivery, with the body sent, ok acks that come after it, no abandon, no ack
of unknown outcome. Their classification needs counts, minima and the values at the first index
of a kind (``min_by``), so one hash aggregate over the records does it (no sort of the
history: every aggregation buffer is numeric; node, queue and process names travel
as their position in a small dictionary of the history's names). The remaining ids
(retries, abandons, acks of unknown outcome, several deliveries, a corrupted body) go
through the ordered pass: their records only, sorted by index per id, window passes pairing
each publish completion with its invoke and each ack completion with its invoke, then
aggregates per pairing and per id. The two passes give the same columns
(``_SHAPE``); ``derive`` then reduces them to one row per id with its flags.

Each id's row carries its deliveries (``ds``: a plain id's one, rebuilt from the aggregate;
an ordered-pass id's all, in order) and its first corrupted one with the body's digest and
detail, so the order check and the detail lists read the kept rows, not the history again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

from spark_reports.engines.common import ABANDONED, NEMESIS, NEVER_DELIVERED, UNACKED
from spark_reports.engines.spark.scope import Scope
from spark_reports.engines.spark.sql import expected_digest_sql

DELIVERY = ("index", "time_ns", "node", "queue", "process", "redelivered")
_DELIVERY_FIELDS = "index:bigint,time_ns:bigint,node:string,queue:string,process:string,redelivered:boolean"
_DELIVERY_T = f"struct<{_DELIVERY_FIELDS}>"
_UNFLAGGED_T = f"array<struct<{_DELIVERY_FIELDS},abandon_index:bigint,abandon_cause:string>>"
"""An id's deliveries after an abandon of it that are not flagged redelivered, each with that abandon."""
_SHAPE = {
    "attempts": "bigint",
    "outcome": "string",
    "fi": "struct<ii:bigint,it:bigint>",
    "c": "struct<di:bigint,dt:bigint,dn:string,dtype:string>",
    "ack_info_inv": "bigint",
    "delivered": "bigint",
    "last_d": "bigint",
    "first_d": "struct<index:bigint,time_ns:bigint>",
    "n_bad": "bigint",
    "n_dig": "bigint",
    "undigested": "bigint",
    "acked": "bigint",
    "first_ack": "struct<index:bigint,time_ns:bigint,node:string,process:string,queue:string>",
    "abandons": "bigint",
    "last_ab": "struct<index:bigint,cause:string>",
    "res_n": "bigint",
    "res_first": _DELIVERY_T,
    "unflagged": "bigint",
    "ds": f"array<{_DELIVERY_T}>",
    "bad_first": f"struct<{_DELIVERY_FIELDS},digest:string,detail:string>",
    "delayed": "boolean",
    "uf": _UNFLAGGED_T,
}
"""What either pass says of an id, before ``derive``."""
_ATTEMPT = {"it": "bigint", "o": "string", "dt": "bigint"}
"""One publish attempt: its invoke's time, outcome, and its completion's time (null: none matched)."""


def events(h: Any, scope: Scope) -> Any:
    """Client records that matter per message id, each tagged with its kind ``k``.

    p publish, d delivery; with acks (schema 2) also ai/ao/af/an ack invoke, ok,
    fail, info (anything else that is not invoke, ok or fail is indeterminate), and
    ab abandon invoke.
    """
    from pyspark.sql import functions as F

    f, ty = F.col("f"), F.col("type")
    acks = scope.scalar("x_acks")
    ack = acks & (f == "ack")
    kind = (
        F.when(f == "publish", "p")
        .when((f == "consume") & (ty == "ok"), "d")
        .when(ack & (ty == "invoke"), "ai")
        .when(ack & (ty == "ok"), "ao")
        .when(ack & (ty == "fail"), "af")
        .when(ack, "an")
        .when(acks & (f == "abandon") & (ty == "invoke"), "ab")
    )
    client = ~F.col("process").eqNullSafe(NEMESIS) & F.col("value").isNotNull()
    return (
        h.filter(client)
        .select(
            "run",
            F.col("value").alias("id"),
            "index",
            "type",
            "time_ns",
            "node",
            "queue",
            "process",
            "redelivered",
            "digest",
            "detail",
            kind.alias("k"),
        )
        .filter(F.col("k").isNotNull())
    )


def _delayed(scope: Scope) -> Any:
    """A publish invoke that asked for a delay (looked for only when some run has delays)."""
    from pyspark.sql import functions as F

    if not scope.delays:
        return F.lit(False)
    return (
        (F.col("k") == "p")
        & (F.col("type") == "invoke")
        & F.get_json_object("detail", "$.delay_ms").isNotNull()
    )


def _with_bad(ev: Any, scope: Scope) -> Any:
    """``bad``: a delivery whose body digest is not the one of the body sent (null where not known)."""
    from pyspark.sql import functions as F

    digested = (F.col("k") == "d") & F.col("digest").isNotNull() & scope.scalar("x_bodies")
    expected = F.expr(expected_digest_sql("id", "x_seed", "x_size"))
    return (
        ev.withColumns({"x_seed": scope.scalar("x_seed"), "x_size": scope.scalar("x_size")})
        .withColumn("bad", F.when(digested, F.col("digest") != expected))
        .drop("x_seed", "x_size")
    )


@dataclass(frozen=True)
class Unit:
    """A kept table the counts read once: its rows are ids (``ids``: the columns of ``derive``)
    and/or carry one publish attempt each (``attempt``: the struct column that holds it, "" for
    an attempt's own rows, None for none)."""

    df: Any
    ids: bool
    attempt: str | None


def classify(
    ev: Any, scope: Scope, names: list[str], persist: Any, *, passes: str = "both"
) -> tuple[Any, Any, int, list[Unit]]:
    """(publish attempts, one row per id with its flags (``derive``), how many ids took the
    ordered pass, the kept tables as ``Unit``s), each kept by ``persist``.

    The hash-aggregate pass is kept once, with each plain id's one attempt on its row; the
    ordered pass's few ids are kept apart. ``names``: every node, queue and process name
    of the histories. ``passes``: "both", or "ordered" to send every id through the ordered
    pass (one job instead of three: cheaper for a small history; tests compare the two).
    """
    from pyspark.sql import functions as F

    if passes == "ordered":
        attempts, ids = _ordered_kept(ev, scope, persist)
        return attempts, ids, -1, [Unit(ids, True, None), Unit(attempts, False, "")]

    if len(names) > _CODE_MASK:
        raise ValueError(
            f"{len(names):,} distinct node, queue and process names: the Spark checker codes at most "
            f"{_CODE_MASK:,}; check this history with --checker python"
        )
    agg = _plain_aggregate(_with_bad(ev, scope), names, _delayed(scope))
    attempt = F.when(
        F.col("pi") == 1,
        F.struct(
            F.col("pi_t").alias("it"),
            _plain_outcome().alias("o"),
            F.when(_matched(), F.col("pd_t")).alias("dt"),
        ),
    )
    plain = _shaped(
        _plain_ids(agg, names, F.col("tangled"), attempt.alias("attempt")),
        _SHAPE,
        "run",
        "id",
        "tangled",
        "attempt",
    )
    kept = persist(derive(plain, scope, "tangled", "attempt"))
    simple = ~F.col("tangled")
    ids = kept.filter(simple).drop("tangled", "attempt")
    attempts = kept.filter(simple & F.col("attempt").isNotNull()).select("run", "attempt.*")
    # Kept apart (one read of the big table): counted, then broadcast, each from this small one.
    tangled = persist(kept.filter("tangled").select("run", "id"))
    n_tangled = tangled.count()
    units = [Unit(kept.filter(simple), True, "attempt")]
    if n_tangled:
        # The tangled ids' records, found by a broadcast of their ids when they are few.
        few = n_tangled <= 200_000
        mine = ev.join(F.broadcast(tangled) if few else tangled, ["run", "id"], "left_semi")
        more_attempts, more_ids = _ordered_kept(mine, scope, persist)
        ids = ids.unionByName(more_ids)
        attempts = attempts.unionByName(more_attempts)
        units += [Unit(more_ids, True, None), Unit(more_attempts, False, "")]
    return attempts, ids, n_tangled, units


def _ordered_kept(ev: Any, scope: Scope, persist: Any) -> tuple[Any, Any]:
    """The ordered pass over ``ev``'s ids, kept: (publish attempts, one row per id with its flags)."""
    from pyspark.sql import functions as F

    kept = persist(
        derive(
            _shaped(_ordered(_with_bad(ev, scope), _delayed(scope)), _SHAPE, "run", "id", "attempt_list"),
            scope,
            "attempt_list",
        )
    )
    attempts = kept.select("run", F.explode("attempt_list").alias("a")).select("run", "a.*")
    return _shaped(attempts, _ATTEMPT, "run"), kept.drop("attempt_list")


def _shaped(df: Any, shape: dict[str, str], *keys: str) -> Any:
    """The columns of ``shape`` in its order and types (a union matches columns by type). A column
    already of its type is left as it is: a cast that only widens nullability is dropped by the
    optimiser, and a kept table whose planned and optimised columns differ so draws a warning."""
    from pyspark.sql import functions as F

    have = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    return df.select(
        *keys, *[F.col(c) if have.get(c) == t else F.col(c).cast(t).alias(c) for c, t in shape.items()]
    )


_CODE_BITS = 20
_CODE_MASK = (1 << _CODE_BITS) - 1
"""Up to a million distinct names, three codes and a flag to a long (``_plain_aggregate``)."""


def _codes(names: list[str]) -> Any:
    from pyspark.sql import functions as F

    return F.array(*[F.lit(n) for n in names]).cast("array<string>")


def _plain_aggregate(ev: Any, names: list[str], delayed: Any) -> Any:
    """Counts, minima and first values per id: a hash aggregate (numeric buffers only), and
    ``tangled``: the id needs the ordered pass. ``delayed``: a record that says the id's publish
    was delayed."""
    from pyspark.sql import functions as F

    k, idx, ty, t = F.col("k"), F.col("index"), F.col("type"), F.col("time_ns")
    codes = _codes(names)

    def code(c: str) -> Any:
        return F.array_position(codes, F.col(c))

    def packed(*cols: str) -> Any:
        """Names' codes (and a delivery's redelivered flag: 0 null, 1 false, 2 true) in one long."""
        r = F.col("redelivered")
        parts = [
            F.when(r, 2).when(~r, 1).otherwise(0) if c == "redelivered" else F.coalesce(code(c), F.lit(0))
            for c in cols
        ]
        return reduce(
            lambda a, b: a + b, [F.shiftleft(x.cast("long"), _CODE_BITS * i) for i, x in enumerate(parts)]
        )

    def n(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0))

    def first(cond: Any, value: Any) -> Any:
        """The value at the smallest index among the id's records that meet cond."""
        return F.min_by(F.when(cond, value), F.when(cond, idx))

    p_inv = (k == "p") & (ty == "invoke")
    p_done = (k == "p") & (ty != "invoke")
    d, ao = k == "d", k == "ao"
    done_type = F.when(ty == "ok", 1).when(ty == "fail", 2).otherwise(3)
    agg = ev.groupBy("run", "id").agg(
        n(p_inv).alias("pi"),
        F.min(F.when(p_inv, idx)).alias("pi_i"),
        F.min(F.when(p_inv, t)).alias("pi_t"),
        n(p_done).alias("pd"),
        F.min(F.when(p_done, idx)).alias("pd_i"),
        F.min(F.when(p_done, t)).alias("pd_t"),
        F.min(F.when(p_done, done_type)).alias("pd_ty"),
        F.min(F.when(p_done, code("node"))).alias("pd_n"),
        n(d).alias("nd"),
        F.min(F.when(d, idx)).alias("d_i"),
        F.max(F.when(d, idx)).alias("d_max"),
        # A plain id has one delivery at most (a second makes it tangled): its minima are its values.
        F.min(F.when(d, t)).alias("d_t"),
        F.min(F.when(d, packed("node", "queue", "process", "redelivered"))).alias("d_pk"),
        F.max(F.when(delayed, 1).otherwise(0)).alias("delayed"),
        n(d & F.col("digest").isNotNull()).alias("n_dig"),
        n(d & F.col("digest").isNull()).alias("undigested"),
        n(F.col("bad")).alias("n_bad"),
        n(ao).alias("acked"),
        F.min(F.when(ao, idx)).alias("ao_i"),
        first(ao, t).alias("ao_t"),
        first(ao, packed("node", "process", "queue")).alias("ao_pk"),
        n(k == "an").alias("an"),
        n(k == "ab").alias("ab"),
    )
    pi, pd = F.col("pi"), F.col("pd")
    tangled = (
        (pi > 1)
        | (pd > 1)
        | ((pi == 1) & (pd == 1) & (F.col("pd_i") < F.col("pi_i")))
        | (F.col("an") > 0)
        | (F.col("ab") > 0)
        | (F.col("nd") > 1)
        | (F.col("n_bad") > 0)
        | ((F.col("nd") > 0) & (F.col("acked") > 0) & (F.col("d_max") > F.col("ao_i")))
    )
    return agg.withColumn("tangled", tangled)


def _matched() -> Any:
    """A plain id's one publish completion closes its one invoke."""
    from pyspark.sql import functions as F

    return (F.col("pi") == 1) & (F.col("pd") == 1)


def _plain_outcome() -> Any:
    from pyspark.sql import functions as F

    ty = F.col("pd_ty")
    return (
        F.when(F.col("pi") == 0, "none")
        .when(_matched() & (ty == 1), "ok")
        .when(_matched() & (ty == 2), "fail")
        .otherwise("info")
    )


def _plain_ids(agg: Any, names: list[str], *extra: Any) -> Any:
    """A plain id's ``_SHAPE`` columns from its aggregate (and ``extra``): no retry, abandon, ack
    of unknown outcome, second delivery or corrupted body, so none of what those feed."""
    from pyspark.sql import functions as F

    codes = _codes(names)

    def named(n: Any) -> Any:
        """The name of code n (null for 0: none)."""
        return F.when(n > 0, F.element_at(codes, n.cast("int")))

    def name(c: str, i: int) -> Any:
        """The name of code i in packed column c."""
        return named(F.shiftright(F.col(c), _CODE_BITS * i).bitwiseAND(_CODE_MASK))

    def record(p: str, *packed: str, more: Any = None) -> Any:
        """A record's struct from the aggregate's ``p_i`` (index), ``p_t`` (time) and the names
        packed in ``p_pk`` (in the order of ``packed``), and ``more``."""
        return F.struct(
            F.col(f"{p}_i").alias("index"),
            F.col(f"{p}_t").alias("time_ns"),
            *(name(f"{p}_pk", i).alias(field) for i, field in enumerate(packed)),
            *([] if more is None else [more]),
        )

    r = F.shiftright(F.col("d_pk"), _CODE_BITS * 3)

    outcome = _plain_outcome()
    return agg.select(
        "run",
        "id",
        F.col("pi").alias("attempts"),
        outcome.alias("outcome"),
        F.when(F.col("pi") == 1, F.struct(F.col("pi_i").alias("ii"), F.col("pi_t").alias("it"))).alias("fi"),
        F.when(
            outcome == "ok",
            F.struct(
                F.col("pd_i").alias("di"),
                F.col("pd_t").alias("dt"),
                named(F.col("pd_n")).alias("dn"),
                F.lit("ok").alias("dtype"),
            ),
        ).alias("c"),
        F.lit(None).alias("ack_info_inv"),
        F.col("nd").alias("delivered"),
        F.col("d_max").alias("last_d"),
        F.when(F.col("nd") > 0, record("d")).alias("first_d"),
        "n_bad",
        "n_dig",
        "undigested",
        "acked",
        F.when(F.col("acked") > 0, record("ao", "node", "process", "queue")).alias("first_ack"),
        F.lit(0).alias("abandons"),
        F.lit(None).alias("last_ab"),
        F.lit(0).alias("res_n"),
        F.lit(None).alias("res_first"),
        F.lit(0).alias("unflagged"),
        F.when(
            F.col("nd") == 1,
            F.array(
                record(
                    "d",
                    "node",
                    "queue",
                    "process",
                    more=F.when(r == 2, True).when(r == 1, False).alias("redelivered"),
                )
            ),
        )
        .otherwise(F.array().cast(f"array<{_DELIVERY_T}>"))
        .alias("ds"),
        F.lit(None).alias("bad_first"),
        (F.col("delayed") > 0).alias("delayed"),
        F.array().cast(_UNFLAGGED_T).alias("uf"),
        *extra,
    )


def _ordered(ev: Any, delayed: Any) -> Any:
    """The ordered pass over some ids' records: ``_SHAPE`` rows, each with its publish attempts
    (``attempt_list``).

    The records of an id are sorted by index; window passes over that order number
    the publish attempts and the acks. A publish completion closes the earliest invoke
    of the id still waiting (FIFO); with x the running count of completions minus
    invokes, completions that found nothing waiting number max(0, max x before), so
    the matched ones are those where x does not exceed that, and the m-th matched
    completion closes the m-th invoke. The k-th ack completion of a (process, id)
    closes its k-th ack invoke. Level one groups each attempt (invoke with its
    completion) and each ack pair, the rest of an id's records in one more group;
    level two reduces them to the id.
    """
    return _level_two(_level_one(_grouped(ev), delayed))


def _one(cond: Any) -> Any:
    from pyspark.sql import functions as F

    return F.when(cond, 1).otherwise(0)


def _n(cond: Any) -> Any:
    """How many rows of a group meet ``cond``."""
    from pyspark.sql import functions as F

    return F.sum(_one(cond))


def _publish_conds() -> tuple[Any, Any, Any, Any]:
    """The columns every level of the ordered pass reads: the record's kind, index and type, and
    whether it is a publish invoke or a publish completion."""
    from pyspark.sql import functions as F

    k, idx, ty = F.col("k"), F.col("index"), F.col("type")
    return k, idx, (k == "p") & (ty == "invoke"), (k == "p") & (ty != "invoke")


def _grouped(ev: Any) -> Any:
    """Each record with its group (``grp``): its publish attempt, its ack pair, or the rest."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    k, idx, p_inv, p_done = _publish_conds()
    one = _one
    w = Window.partitionBy("run", "id").orderBy("index")
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    cause = F.get_json_object("detail", "$.cause")
    # Without acks (schema 1) no record has an ack or abandon kind: these columns stay null.
    cols = {
        "v": F.sum(one(p_inv)).over(upto),
        "c": F.sum(one(p_done)).over(upto),
        "ack_before": F.min(F.when(k == "ao", idx)).over(before),
        "ab_before": F.max(F.when(k == "ab", F.struct(idx.alias("index"), cause.alias("cause")))).over(
            before
        ),
    }
    ew = ev.withColumns(cols).withColumn("x", F.col("c") - F.col("v"))
    ew = ew.withColumn("dropped", F.greatest(F.coalesce(F.max("x").over(before), F.lit(0)), F.lit(0)))
    pair = F.when(p_inv, F.col("v")).when(
        p_done & (F.col("x") <= F.col("dropped")), F.col("c") - F.col("dropped")
    )
    wa = (
        Window.partitionBy("run", "id", "process")
        .orderBy("index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    closes = k.isin("ao", "af", "an")
    ack_no = F.when(k == "ai", F.sum(one(k == "ai")).over(wa)).when(closes, F.sum(one(closes)).over(wa))
    group = F.when(
        pair.isNotNull(),
        F.struct(
            F.lit("p").alias("g"), F.lit(None).cast("string").alias("proc"), pair.cast("long").alias("n")
        ),
    ).when(
        ack_no.isNotNull(),
        F.struct(F.lit("a").alias("g"), F.col("process").alias("proc"), ack_no.cast("long").alias("n")),
    )
    return ew.withColumn(
        "grp",
        F.coalesce(
            group,
            F.struct(
                F.lit("o").alias("g"),
                F.lit(None).cast("string").alias("proc"),
                F.lit(0).cast("long").alias("n"),
            ),
        ),
    )


def _level_one(ew: Any, delayed: Any) -> Any:
    """Level one: each attempt, each ack pair and the rest of an id's records reduced to a row."""
    from pyspark.sql import functions as F

    k, idx, p_inv, p_done = _publish_conds()
    n, ty = _n, F.col("type")
    cause = F.get_json_object("detail", "$.cause")
    resurrecting = (k == "d") & F.col("ack_before").isNotNull()
    unflagged = (k == "d") & F.col("ab_before").isNotNull() & ~F.col("redelivered").eqNullSafe(True)
    is_d = k == "d"
    delivery = F.struct(*DELIVERY)
    return (
        ew.groupBy("run", "id", "grp")
        .agg(
            F.max(F.when(p_inv, idx)).alias("ii"),
            F.max(F.when(p_inv, F.col("time_ns"))).alias("it"),
            F.max(
                F.when(
                    p_done & (F.col("grp.g") == "p"),
                    F.struct(
                        idx.alias("di"),
                        F.col("time_ns").alias("dt"),
                        F.col("node").alias("dn"),
                        ty.alias("dtype"),
                    ),
                )
            ).alias("done"),
            F.max(F.when(k == "ai", idx)).alias("a_inv"),
            F.max(F.when(k == "an", idx)).alias("a_info"),
            n(is_d).alias("delivered"),
            F.max(F.when(is_d, idx)).alias("last_d"),
            F.min(F.when(is_d, F.struct("index", "time_ns"))).alias("first_d"),
            n(F.col("bad")).alias("n_bad"),
            n(is_d & F.col("digest").isNotNull()).alias("n_dig"),
            n(is_d & F.col("digest").isNull()).alias("undigested"),
            n(k == "ao").alias("acked"),
            F.min(F.when(k == "ao", F.struct("index", "time_ns", "node", "process", "queue"))).alias(
                "first_ack"
            ),
            n(k == "ab").alias("abandons"),
            F.max(F.when(k == "ab", F.struct(idx.alias("index"), cause.alias("cause")))).alias("last_ab"),
            n(resurrecting).alias("res_n"),
            F.min(F.when(resurrecting, delivery)).alias("res_first"),
            n(unflagged).alias("unflagged"),
            F.collect_list(
                F.when(
                    unflagged,
                    F.struct(
                        *DELIVERY,
                        F.col("ab_before.index").alias("abandon_index"),
                        F.col("ab_before.cause").alias("abandon_cause"),
                    ),
                )
            ).alias("uf"),
            F.collect_list(F.when(is_d, delivery)).alias("ds"),
            F.min(F.when(F.col("bad"), F.struct(*DELIVERY, "digest", "detail"))).alias("bad_first"),
            F.max(delayed).alias("delayed"),
        )
        .withColumn(
            "o",
            F.when(F.col("grp.g") != "p", None)
            .when(F.col("done.dtype").isin("ok", "fail"), F.col("done.dtype"))
            .otherwise("info"),
        )
    )


_CARRIED = {
    "sum": ("delivered", "n_bad", "n_dig", "undigested", "acked", "abandons", "res_n", "unflagged"),
    "min": ("first_d", "first_ack", "res_first", "bad_first"),
    "max": ("last_d", "last_ab"),
}
"""Level one's columns that level two carries to the id under the same name, by the reducer
(``pyspark.sql.functions``) that folds an id's groups: counts summed, first events the least,
last events the greatest."""


def _level_two(l1: Any) -> Any:
    """Level two: an id's groups reduced to the id, with its outcome."""
    from pyspark.sql import functions as F

    n = _n
    is_att = F.col("grp.g") == "p"
    agg = l1.groupBy("run", "id").agg(
        n(is_att).alias("attempts"),
        F.min(F.when(is_att, F.struct(F.col("ii"), F.col("it")))).alias("fi"),
        F.max(F.col("o") == "ok").alias("has_ok"),
        F.max(F.col("o") == "info").alias("has_info"),
        F.min(F.when(F.col("o") == "ok", F.col("done"))).alias("c"),
        F.max(F.when(F.col("a_inv") < F.col("a_info"), F.col("a_inv"))).alias("ack_info_inv"),
        *(getattr(F, how)(c).alias(c) for how, cols in _CARRIED.items() for c in cols),
        F.flatten(F.collect_list("uf")).alias("uf"),
        F.sort_array(F.flatten(F.collect_list("ds"))).alias("ds"),
        F.coalesce(F.max("delayed"), F.lit(False)).alias("delayed"),
        # The id's attempts ride on its row (an ordered-pass id has a few), kept with it.
        F.collect_list(F.when(is_att, F.struct(F.col("it"), F.col("o"), F.col("done.dt").alias("dt")))).alias(
            "attempt_list"
        ),
    )
    outcome = (
        F.when(F.col("attempts") == 0, "none")
        .when(F.col("has_ok"), "ok")
        .when(F.col("has_info"), "info")
        .otherwise("fail")
    )
    return agg.withColumn("outcome", outcome)


def derive(ids: Any, scope: Scope, *keep: str) -> Any:
    """One row per id with its flags (lost, ack of unknown outcome, unexpected, duplicated,
    recovered, resurrected, corrupted, split-brain copy) and what the lists show of it;
    ``keep``: more columns of ``ids`` to carry."""
    from pyspark.sql import functions as F

    base = scope.add(ids, "x_acks", "x_bodies", "x_seed", "x_size")
    consumed = F.when(F.col("x_acks"), F.col("acked")).otherwise(F.col("delivered"))
    unacked = (F.col("outcome") == "ok") & (consumed == 0)
    ack_unknown = (
        unacked
        & F.col("ack_info_inv").isNotNull()
        & (F.col("last_d").isNull() | (F.col("ack_info_inv") > F.col("last_d")))
    )
    lost = unacked & ~ack_unknown
    corrupted = F.col("x_bodies") & (F.col("attempts") > 0) & (F.col("n_bad") > 0)
    fa = F.col("first_ack")
    # First acked by a drainer within its drain, on another node than one that had said the
    # queue was empty, after it said so: a copy the drain should never have found.
    split = fa.isNotNull() & scope.any_span(
        lambda s: (
            (fa["process"] == s.process)
            & fa["queue"].eqNullSafe(F.lit(s.queue))
            & (fa["index"] > s.lo)
            & (fa["index"] < s.hi)
            & ~F.lit(s.node).eqNullSafe(fa["node"])
            & (fa["time_ns"] > s.empty_at_ns)
        )
    )
    return base.select(
        "run",
        "id",
        "attempts",
        "outcome",
        F.col("fi.it").alias("fi_t"),
        F.col("c.di").alias("c_i"),
        F.col("c.dt").alias("c_t"),
        F.col("c.dn").alias("c_n"),
        "delivered",
        consumed.alias("consumed"),
        "first_d",
        "undigested",
        "abandons",
        "unflagged",
        "first_ack",
        "res_n",
        "res_first",
        F.when(F.col("x_acks"), fa["index"]).otherwise(F.col("first_d.index")).alias("first_consumed"),
        # A cause is a lost message's alone (null elsewhere: millions of rows carry no text).
        F.when(lost & (F.col("delivered") == 0), NEVER_DELIVERED)
        .when(lost & (F.col("last_ab.index") > F.col("last_d")), ABANDONED)
        .when(lost, UNACKED)
        .alias("cause"),
        F.when(
            lost & (F.col("delivered") > 0) & (F.col("last_ab.index") > F.col("last_d")),
            F.col("last_ab.cause"),
        ).alias("abandon_cause"),
        lost.alias("is_lost"),
        ack_unknown.alias("is_ack_unknown"),
        ((F.col("attempts") == 0) & (consumed > 0)).alias("is_unexpected"),
        (consumed > 1).alias("is_dup"),
        (F.col("outcome").isin("fail", "info") & (consumed > 0)).alias("is_recovered"),
        (F.col("res_n") > 0).alias("is_resurrected"),
        "n_bad",
        "ds",
        "uf",
        "bad_first",
        "delayed",
        corrupted.alias("is_corrupted"),
        split.alias("is_split"),
        _drain_first(scope).alias("is_drain_first"),
        *keep,
    )


def _drain_first(scope: Scope) -> Any:
    """Confirmed and first acked by a drainer within its drain, where the run's drain reads count
    (disjoint nodes, ``Context.drain_reads``): ``LiveFacts.stranded``."""
    from pyspark.sql import functions as F

    fa = F.col("first_ack")
    return (
        fa.isNotNull()
        & F.col("c.dt").isNotNull()
        & scope.any_drain_read(
            lambda d: (
                (fa["process"] == d.process)
                & fa["queue"].eqNullSafe(F.lit(d.queue))
                & (fa["index"] > d.lo)
                & (fa["index"] < d.hi)
            )
        )
    )
