"""The reference broker against RabbitMQ 3.10 (Debian's package), measured in the same run.

    python -m bench.broker_vs_rabbitmq            # ~10 minutes on 2 cores

Both brokers run as one container each (the project's images, started as a chaos
run starts a node, but reached on a published port with no proxy in between),
with the same client processes, the same cases and the same durations. They
never carry load at the same time: the broker not being measured is paused
(cgroup freezer), and repeats alternate between the two so that background load
on a shared machine falls on both alike. Each case reports the median over the
repeats of: throughput, confirm latency p50/p99, the broker's CPU (cores, from
its cgroup), the client processes' CPU, and messages per broker CPU-second (the
figure least disturbed by other work on the machine). Ratios are
reference / RabbitMQ. Results: bench/results/broker_vs_rabbitmq.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import docker.errors

from bench.amqp_load import Load, declare, delete, run_load
from bench.broker_container import BrokerContainer
from bench.facts import command_line, facts_markdown, machine_facts, run_cli, write_json, write_text

BROKERS = ("reference", "rabbitmq")


@dataclass(frozen=True)
class Case:
    name: str
    persistent: bool
    size: int
    publish: bool
    consume: bool
    #: consume what the previous case left in its queue instead of a fresh queue
    uses_backlog: bool = False

    @property
    def headline(self) -> str:
        """The rate the case is judged by: confirmed publishes, or deliveries when it only consumes."""
        return "publish_rate" if self.publish else "consume_rate"


def cases(sizes: list[int]) -> list[Case]:
    """Every case at the first size; persistent publish and publish+consume at the others
    (the aim is about persistent confirmed messages, and the run must stay near ten minutes)."""
    out: list[Case] = []
    for n, size in enumerate(sizes):
        for persistent in (True, False) if n == 0 else (True,):
            label = f"{'persistent' if persistent else 'transient'} {size // 1024} KiB"
            out.append(Case(f"{label} publish", persistent, size, True, False))
            if n == 0:
                out.append(Case(f"{label} consume backlog", persistent, size, False, True, uses_backlog=True))
            out.append(Case(f"{label} publish+consume", persistent, size, True, True))
    return out


def broker_cpu(samples: list[Any], seconds: float) -> float:
    """CPU cores the broker used over the first ``seconds`` of the window."""
    first = samples[0]
    last = next((s for s in samples if s.t - first.t >= seconds - 0.125), samples[-1])
    span = last.t - first.t
    return (last.cpu_seconds - first.cpu_seconds) / span if span > 0 else 0.0


def run_case(b: BrokerContainer, case: Case, args: argparse.Namespace, queue: str) -> dict[str, Any]:
    if not case.uses_backlog:
        asyncio.run(declare(b.url, queue, durable=case.persistent))
    load = Load(
        url=b.url,
        queue=queue,
        persistent=case.persistent,
        size=case.size,
        publishers=args.publishers if case.publish else 0,
        consumers=args.consumers if case.consume else 0,
        in_flight=args.in_flight,
        prefetch=args.prefetch,
        ack_every=args.ack_every,
        warmup=0.5 if case.uses_backlog else args.warmup,
        duration=args.duration,
        stop_when_idle=1.0 if case.uses_backlog else 0.0,
    )
    res, samples = run_load(load, b.sample)
    cpu = broker_cpu(samples, res.window_seconds)
    rate = res.publish_rate if case.publish else res.consume_rate
    out = {
        "publish_rate": round(res.publish_rate, 1),
        "consume_rate": round(res.consume_rate, 1),
        "confirm_p50_ms": _r(res.percentile(0.50)),
        "confirm_p99_ms": _r(res.percentile(0.99)),
        "broker_cpu_cores": round(cpu, 3),
        "client_cpu_cores": round(res.client_cpu_seconds / res.window_seconds, 3),
        "msgs_per_broker_cpu_second": round(rate / cpu, 1) if cpu > 0 else None,
        "broker_rss_peak_mb": round(max(s.rss_bytes for s in samples) / 2**20, 1),
        "window_seconds": round(res.window_seconds, 2),
        "nacked": res.nacked,
        "errors": res.errors,
    }
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]:
        vals = [r[key] for r in runs if isinstance(r[key], int | float) and not isinstance(r[key], bool)]
        if vals and key not in ("nacked",):
            out[key] = round(statistics.median(vals), 2)
    out["nacked"] = sum(r["nacked"] for r in runs)
    out["errors"] = sorted({e for r in runs for e in r["errors"]})
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def measure(
    chosen: list[Case],
    args: argparse.Namespace,
    runs: dict[str, dict[str, list[dict[str, Any]]]],
    brokers: dict[str, dict[str, Any]],
) -> None:
    """Both brokers up, each measured in turn while the other is paused."""
    with BrokerContainer("reference", settings={"flush": "sync"}) as ref, BrokerContainer("rabbitmq") as rmq:
        containers = {"reference": ref, "rabbitmq": rmq}
        for name, b in containers.items():
            brokers[name] = {**b.image_facts(), "version": b.version(), "settings": b.settings}
        for rep in range(args.repeats):
            order = BROKERS if rep % 2 == 0 else BROKERS[::-1]
            for name in order:
                b = containers[name]
                other = containers[BROKERS[1] if name == BROKERS[0] else BROKERS[0]]
                other.container.pause()
                try:
                    for i, case in enumerate(chosen):
                        queue = f"bench-{i - 1 if case.uses_backlog else i}"
                        r = run_case(b, case, args, queue)
                        if i + 1 == len(chosen) or not chosen[i + 1].uses_backlog:
                            # Nothing reads this queue's leftovers: drop them before the next case.
                            asyncio.run(delete(b.url, queue))
                        runs[name][case.name].append(r)
                        print(
                            f"  [{rep + 1}/{args.repeats}] {name:9} {case.name:34} "
                            f"{r[case.headline]:9.0f} msg/s  p50 {r['confirm_p50_ms'] or 0:7.1f} ms  "
                            f"p99 {r['confirm_p99_ms'] or 0:7.1f} ms  broker {r['broker_cpu_cores']:.2f} "
                            f"client {r['client_cpu_cores']:.2f} cores"
                            + (f"  errors {r['errors']}" if r["errors"] else ""),
                            flush=True,
                        )
                finally:
                    try:
                        other.container.unpause()
                    except docker.errors.APIError:
                        pass  # gone or not paused; the error that matters is already propagating


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per case (default 10)")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each window")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case and broker; the median is reported")
    ap.add_argument("--publishers", type=int, default=2, help="publisher processes")
    ap.add_argument("--consumers", type=int, default=2, help="consumer processes")
    ap.add_argument("--in-flight", type=int, default=100, help="unconfirmed messages per publisher")
    ap.add_argument("--prefetch", type=int, default=500)
    ap.add_argument("--ack-every", type=int, default=1, help="1 = ack each delivery; n = multiple-ack per n")
    ap.add_argument("--sizes", default="1024,16384", help="message sizes in bytes, comma-separated")
    ap.add_argument("--only", default="", help="run only cases whose name contains this text")
    ap.add_argument("--out", default="broker_vs_rabbitmq", help="result file stem under bench/results/")
    return ap.parse_args(argv)


def choose_cases(sizes: list[int], only: str) -> list[Case]:
    """The cases whose name contains ``only``, with the publish case each chosen backlog case needs."""
    chosen = [c for c in cases(sizes) if only in c.name]
    if only:
        # A backlog case needs the publish case before it.
        names = {c.name for c in chosen}
        chosen = [
            c
            for c in cases(sizes)
            if c.name in names
            or (c.publish and not c.consume and c.name.replace("publish", "consume backlog") in names)
        ]
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    chosen = choose_cases(sizes, args.only)
    if not chosen:
        print(f"no case matches --only {args.only!r}", file=sys.stderr)
        return 2
    facts = machine_facts()
    command = command_line()
    print(
        f"# {len(chosen)} cases x {args.repeats} repeats x {len(BROKERS)} brokers, "
        f"{args.warmup:.0f}+{args.duration:.0f} s each; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {b: {c.name: [] for c in chosen} for b in BROKERS}
    brokers: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    measure(chosen, args, runs, brokers)
    facts["load_average_at_end"] = os.getloadavg()
    results = [case_result(case, runs) for case in chosen]
    data = {
        "benchmark": "broker_vs_rabbitmq",
        "command": command,
        "machine": facts,
        "brokers": brokers,
        "client": {
            k: getattr(args, k)
            for k in (
                "publishers",
                "consumers",
                "in_flight",
                "prefetch",
                "ack_every",
                "duration",
                "warmup",
                "repeats",
            )
        },
        "elapsed_seconds": round(time.monotonic() - started, 1),
        "results": results,
    }
    table = render_table(results)
    verdict = aim_verdict(results)
    print()
    print(table)
    print(verdict)
    write_json(f"{args.out}.json", data)
    write_text(f"{args.out}.md", render_markdown(data, table, verdict))
    print(f"wrote bench/results/{args.out}.json and .md ({data['elapsed_seconds']:.0f} s)")
    return 0


def case_result(case: Case, runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """One case's medians per broker and the reference / RabbitMQ ratios, with every repeat kept."""
    med = {b: median_of(runs[b][case.name]) for b in BROKERS}
    h = case.headline
    return {
        "case": case.name,
        "persistent": case.persistent,
        "size": case.size,
        "headline": h,
        "reference": med["reference"],
        "rabbitmq": med["rabbitmq"],
        "ratio_throughput": ratio(med["reference"].get(h), med["rabbitmq"].get(h)),
        "ratio_p50": ratio(med["reference"].get("confirm_p50_ms"), med["rabbitmq"].get("confirm_p50_ms")),
        "ratio_p99": ratio(med["reference"].get("confirm_p99_ms"), med["rabbitmq"].get("confirm_p99_ms")),
        "ratio_msgs_per_broker_cpu_second": ratio(
            med["reference"].get("msgs_per_broker_cpu_second"),
            med["rabbitmq"].get("msgs_per_broker_cpu_second"),
        ),
        "runs": {b: runs[b][case.name] for b in BROKERS},
    }


def aim_verdict(results: list[dict[str, Any]]) -> str:
    """The project's aim: at least RabbitMQ's throughput for persistent confirmed messages."""
    lines = []
    for r in results:
        if r["persistent"] and r["headline"] == "publish_rate":
            ratio_ = r["ratio_throughput"]
            met = ratio_ is not None and ratio_ >= 1.0
            lines.append(
                f"aim (>= RabbitMQ, persistent confirmed) {r['case']}: "
                f"{r['reference'].get('publish_rate', 0):.0f} vs {r['rabbitmq'].get('publish_rate', 0):.0f} "
                f"msg/s, ratio {ratio_} -> {'met' if met else 'NOT met'}"
            )
    return "\n".join(lines)


def _fmt(x: Any, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def render_table(results: list[dict[str, Any]]) -> str:
    head = (
        "| case | ref msg/s | rmq msg/s | ratio | ref p50/p99 ms | rmq p50/p99 ms | p99 ratio "
        "| ref broker/client CPU | rmq broker/client CPU | ref msg/CPU-s | rmq msg/CPU-s | ratio |"
    )
    rows = [head, "|" + "---|" * 12]
    for r in results:
        a, b, h = r["reference"], r["rabbitmq"], r["headline"]
        if r["headline"] == "publish_rate" and r["case"].endswith("publish+consume"):
            ra = f"{_fmt(a.get(h))} (c {_fmt(a.get('consume_rate'))})"
            rb = f"{_fmt(b.get(h))} (c {_fmt(b.get('consume_rate'))})"
        else:
            ra, rb = _fmt(a.get(h)), _fmt(b.get(h))
        rows.append(
            f"| {r['case']} | {ra} | {rb} | {_fmt(r['ratio_throughput'], '.2f')} "
            f"| {_fmt(a.get('confirm_p50_ms'), '.1f')}/{_fmt(a.get('confirm_p99_ms'), '.1f')} "
            f"| {_fmt(b.get('confirm_p50_ms'), '.1f')}/{_fmt(b.get('confirm_p99_ms'), '.1f')} "
            f"| {_fmt(r['ratio_p99'], '.2f')} "
            f"| {_fmt(a.get('broker_cpu_cores'), '.2f')}/{_fmt(a.get('client_cpu_cores'), '.2f')} "
            f"| {_fmt(b.get('broker_cpu_cores'), '.2f')}/{_fmt(b.get('client_cpu_cores'), '.2f')} "
            f"| {_fmt(a.get('msgs_per_broker_cpu_second'))} | {_fmt(b.get('msgs_per_broker_cpu_second'))} "
            f"| {_fmt(r['ratio_msgs_per_broker_cpu_second'], '.2f')} |"
        )
    return "\n".join(rows)


def render_markdown(data: dict[str, Any], table: str, verdict: str) -> str:
    c = data["client"]
    brokers = "\n".join(
        f"- {name}: {b['version']}, image {b['image']} ({b['image_id']}, built {b['created']}), "
        f"settings {b['settings']}"
        for name, b in data["brokers"].items()
    )
    return (
        "# Reference broker vs RabbitMQ 3.10\n\n"
        + facts_markdown(data["machine"], data["command"])
        + f"- elapsed: {data['elapsed_seconds']:.0f} s\n\n"
        + brokers
        + "\n\n"
        + f"Client: {c['publishers']} publisher and {c['consumers']} consumer processes (aiormq on uvloop), "
        f"{c['in_flight']} unconfirmed messages per publisher, prefetch {c['prefetch']}, "
        f"ack every {c['ack_every']}; {c['warmup']:.0f} s warm-up then {c['duration']:.0f} s measured; "
        f"median of {c['repeats']} repeats, brokers alternating (the idle one paused).\n\n"
        + "msg/s is confirmed publishes per second (deliveries per second for `consume backlog`; "
        "`c` = deliveries during publish+consume). CPU is in cores (1.00 = one core busy). "
        "msg/CPU-s = headline messages per broker CPU-second. Ratios are reference / RabbitMQ "
        "(throughput: > 1 means the reference broker is faster; p99: < 1 means it confirms sooner).\n\n"
        + table
        + "\n\n"
        + verdict.replace("\n", "\n\n")
        + "\n\n"
        + "Each repeat's headline rate (msg/s), to show the spread behind the medians:\n\n"
        + render_repeats(data["results"])
        + "\n"
    )


def render_repeats(results: list[dict[str, Any]]) -> str:
    rows = ["| case | reference | RabbitMQ |", "|---|---|---|"]
    for r in results:
        h = r["headline"]
        cells = [", ".join(_fmt(run.get(h)) for run in r["runs"][b]) for b in BROKERS]
        rows.append(f"| {r['case']} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    run_cli(main)
