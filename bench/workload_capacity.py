"""How many operations per second the harness's own workload driver can drive.

    python -m bench.workload_capacity             # ~1 minute

Runs ``harness.workload.run_workload`` with the shipped AMQP driver
(``plugins.amqp091.client.AmqpDriver``) and a real history ``Recorder`` at an
unlimited rate (``rate = 0``) against one reference-broker container reached
directly, exactly as a chaos run drives a node minus the proxy. The driver is
one process on one event loop, so what it can sustain is bounded by its
operations per CPU-second (``driver_capacity_ops_per_cpu_second``). The ratio
of that capacity to the rate the broker actually achieved says which side is
the bottleneck: above 1 the driver had CPU to spare and the broker set the pace.
Results: bench/results/workload_capacity.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.broker_container import BrokerContainer
from bench.facts import RESULTS, command_line, facts_markdown, machine_facts, run_cli, write_json, write_text
from harness.history import Recorder
from harness.scenario import WorkloadSection
from harness.spec import Endpoint
from harness.workload import run_workload
from plugins.amqp091.client import AmqpDriver


def run_one(broker: str, args: argparse.Namespace) -> dict[str, Any]:
    w = WorkloadSection(
        producers=args.producers,
        consumers=args.consumers,
        queues=args.queues,
        rate=0.0,
        message_size=args.size,
        duration=args.duration,
        persistent=True,
        in_flight=args.in_flight,
        prefetch=args.prefetch,
        drain_idle=1.0,
    )
    settings = {"flush": "sync"} if broker == "reference" else {}
    with BrokerContainer(broker, settings=settings) as b, tempfile.TemporaryDirectory() as d:
        recorder = Recorder(Path(d) / "history.jsonl")
        driver = AmqpDriver(
            {"n1": Endpoint("n1", b.host, b.port)},
            recorder,
            workload=w,
            queue_arguments=b.plugin.queue_arguments(b.settings),
        )
        u0 = b.usage()
        try:
            stats = asyncio.run(run_workload(driver, w, ["n1"], args.seed, recorder))
        finally:
            recorder.close()
        u1 = b.usage()
        records = sum(1 for _ in (Path(d) / "history.jsonl").open())
        version = b.version()
    s = stats.as_dict()
    wall = s["wall_seconds"]
    ops = s["ops_per_second"]
    capacity = s["driver_capacity_ops_per_cpu_second"]
    return {
        "broker": broker,
        "broker_version": version,
        **s,
        "history_records": records,
        "broker_cpu_cores": round((u1.cpu_seconds - u0.cpu_seconds) / (u1.t - u0.t), 3),
        "capacity_over_achieved": round(capacity / ops, 2) if capacity and ops else None,
        "note": f"wall {wall:.1f} s includes the final drain",
    }


def benchmarked_rates() -> dict[str, dict[str, Any]]:
    """Each broker's persistent publish+consume rate (publishes + deliveries per second) from the
    latest broker_vs_rabbitmq results, if present: what the broker can take from several
    client processes, a stiffer test of the single driver process than this run's own rate."""
    import json

    path = RESULTS / "broker_vs_rabbitmq.json"
    if not path.exists():
        return {}
    out = {}
    for case in json.loads(path.read_text()).get("results", []):
        if case["case"] == "persistent 1 KiB publish+consume":
            for broker in ("reference", "rabbitmq"):
                m = case.get(broker, {})
                if m.get("publish_rate") is not None and m.get("consume_rate") is not None:
                    out[broker] = {
                        "case": case["case"],
                        "ops": m["publish_rate"] + m["consume_rate"],
                        "source": "bench/results/broker_vs_rabbitmq.json",
                    }
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of load before the drain")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--queues", type=int, default=2)
    ap.add_argument("--size", type=int, default=256, help="message size (the scenario default)")
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--prefetch", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--brokers", default="reference", help="comma-separated: reference,rabbitmq")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    facts = machine_facts()
    command = command_line()
    runs: list[dict[str, Any]] = []
    for broker in [b for b in args.brokers.split(",") if b]:
        t0 = time.monotonic()
        r = run_one(broker, args)
        r["elapsed_seconds"] = round(time.monotonic() - t0, 1)
        runs.append(r)
        print(
            f"{broker}: {r['ops_per_second']:.0f} ops/s achieved ({r['messages_published_ok']} confirmed, "
            f"{r['messages_consumed']} consumed, {r['messages_published_info']} unknown), driver CPU "
            f"{r['driver_cpu_seconds']:.1f} s = {r['driver_cpu_share']:.2f} cores, capacity "
            f"{r['driver_capacity_ops_per_cpu_second']} ops per CPU-second, capacity/achieved "
            f"{r['capacity_over_achieved']}, broker CPU {r['broker_cpu_cores']:.2f} cores",
            flush=True,
        )
    facts["load_average_at_end"] = os.getloadavg()
    compare_with_benchmark(runs)
    data: dict[str, Any] = {
        "benchmark": "workload_capacity",
        "command": command,
        "machine": facts,
        "workload": {
            k: getattr(args, k)
            for k in ("duration", "producers", "consumers", "queues", "size", "in_flight", "prefetch", "seed")
        },
        "runs": runs,
    }
    write_json("workload_capacity.json", data)
    write_text("workload_capacity.md", render_markdown(data))
    print("wrote bench/results/workload_capacity.{json,md}")
    return 0


def compare_with_benchmark(runs: list[dict[str, Any]]) -> None:
    """Add to each run its driver capacity over the rate broker_vs_rabbitmq measured, where there is one."""
    peer = benchmarked_rates()
    for r in runs:
        best = peer.get(r["broker"])
        if best and r["driver_capacity_ops_per_cpu_second"]:
            r["benchmarked_ops_per_second"] = best
            r["capacity_over_benchmarked"] = round(r["driver_capacity_ops_per_cpu_second"] / best["ops"], 2)
            print(
                f"{r['broker']}: capacity / the rate broker_vs_rabbitmq measured with several client processes "
                f"({best['case']}, {best['ops']:.0f} ops/s) = {r['capacity_over_benchmarked']}"
            )


def render_markdown(data: dict[str, Any]) -> str:
    rows = [
        "| broker | ops/s achieved | driver CPU s (cores) | driver capacity ops/CPU-s | capacity / achieved "
        "| broker CPU cores | confirmed | consumed | unknown | history records |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    extra: list[str] = []
    for r in data["runs"]:
        extra.append(
            f"- {r['broker']}: capacity / the persistent 1 KiB publish+consume rate broker_vs_rabbitmq "
            f"measured with several client processes ({r['benchmarked_ops_per_second']['ops']:.0f} ops/s): "
            f"{r['capacity_over_benchmarked']}"
            if "capacity_over_benchmarked" in r
            else f"- {r['broker']}: no broker_vs_rabbitmq result to compare with"
        )
        rows.append(
            f"| {r['broker_version']} | {r['ops_per_second']:.0f} | {r['driver_cpu_seconds']:.1f} "
            f"({r['driver_cpu_share']:.2f}) | {r['driver_capacity_ops_per_cpu_second']} "
            f"| {r['capacity_over_achieved']} | {r['broker_cpu_cores']:.2f} | {r['messages_published_ok']} "
            f"| {r['messages_consumed']} | {r['messages_published_info']} | {r['history_records']} |"
        )
    w = data["workload"]
    return (
        "# Workload driver capacity\n\n"
        + facts_markdown(data["machine"], data["command"])
        + f"- workload: {w['producers']} producers, {w['consumers']} consumers, {w['queues']} queues, "
        f"rate 0 (unlimited), {w['size']} B persistent, in-flight {w['in_flight']}, prefetch "
        f"{w['prefetch']}, {w['duration']:.0f} s then drain; one driver process (aiormq), history "
        "recorded to JSONL\n\n"
        + "An operation is a confirmed/failed/unknown publish or a consumed message. Capacity is "
        "operations per CPU-second the driver spent; capacity / achieved > 1 means the driver "
        "could have driven more than the broker took.\n\n"
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(extra)
        + "\n"
    )


if __name__ == "__main__":
    run_cli(main)
