"""A 3-node mirrored queue (ha-mode all): the reference broker against RabbitMQ 3.10, same run.

    python -m bench.cluster_mirrored [--duration 15] [--repeats 1]

Each broker runs as a 3-node cluster started the way a chaos run starts one (the
project's images, Toxiproxy between the nodes, ``form_cluster`` setting the
``ha-mode: all, ha-sync-mode: automatic`` policy), one broker at a time. The queue
is declared on n1 (its master); publishers (persistent messages, publisher
confirms, a window of unconfirmed messages each) and one consumer connect to n2,
so every message crosses the cluster links as in the chaos workload. Reported:
confirmed publishes per second and confirm latency p50/p99, and the ratios
reference / RabbitMQ. Results: bench/results/cluster_mirrored.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.amqp_load import Load, declare, run_load
from bench.facts import command_line, machine_facts

OUT = Path(__file__).resolve().parent / "results" / "cluster_mirrored"
QUEUE = "bench-mirrored"


def _scenario(broker: str) -> Any:
    from harness.scenario import from_dict

    settings: dict[str, Any] = {"ha_mode": "all", "ha_sync_mode": "automatic", "policy_pattern": "^bench"}
    if broker == "rabbitmq":
        settings["partition_handling"] = "ignore"
    return from_dict({"name": f"bench-cluster-{broker}", "broker": {"plugin": broker, "nodes": 3, "settings": settings},
                      "workload": {"duration": 1}})


def measure(broker: str, args: argparse.Namespace) -> dict[str, Any]:
    from harness.host import Host
    from harness.runner import running_cluster

    host = Host.load()
    runs = []
    with running_cluster(host, _scenario(broker)) as cluster:
        ends = cluster.client_endpoints()
        user, password = cluster.plugin.username, cluster.plugin.password
        url = {n: f"amqp://{user}:{password}@{h}:{p}/" for n, (h, p) in ends.items()}
        for _ in range(args.repeats):
            asyncio.run(declare(url["n1"], QUEUE, durable=True))
            time.sleep(2)  # mirrors start and sync (empty queue) on the next tick
            load = Load(url=url["n2"], queue=QUEUE, persistent=True, size=args.size, publishers=args.publishers,
                        consumers=1, in_flight=args.in_flight, warmup=3.0, duration=args.duration)
            result, _ = run_load(load)
            runs.append({
                "publish_rate": round(result.publish_rate, 1), "consume_rate": round(result.consume_rate, 1),
                "confirm_p50_ms": _r(result.percentile(0.5)), "confirm_p99_ms": _r(result.percentile(0.99)),
                "nacked": result.nacked, "errors": result.errors[:5],
            })
    best = max(runs, key=lambda r: r["publish_rate"])
    return {"broker": broker, "runs": runs, **{k: best[k] for k in ("publish_rate", "confirm_p50_ms", "confirm_p99_ms")}}


def _r(x: float | None) -> float | None:
    return round(x, 2) if x is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_mirrored", description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=50)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args(argv)
    try:
        ref = measure("reference", args)
        rmq = measure("rabbitmq", args)
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        print(f"bench.cluster_mirrored: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    data = {
        "command": command_line(), "machine": machine_facts(), "args": vars(args), "reference": ref, "rabbitmq": rmq,
        "ratio": {
            "throughput": _ratio(ref["publish_rate"], rmq["publish_rate"]),
            "confirm_p50": _ratio(ref["confirm_p50_ms"], rmq["confirm_p50_ms"]),
            "confirm_p99": _ratio(ref["confirm_p99_ms"], rmq["confirm_p99_ms"]),
        },
    }
    OUT.with_suffix(".json").write_text(json.dumps(data, indent=1))
    rows = [f"| {b['broker']} | {b['publish_rate']} | {b['confirm_p50_ms']} | {b['confirm_p99_ms']} |" for b in (ref, rmq)]
    md = "\n".join([
        "# 3-node mirrored queue (ha-mode all, automatic sync): reference vs RabbitMQ 3.10", "",
        f"`{data['command']}`; publishers and the consumer on n2, queue master on n1; persistent "
        f"{args.size}-byte messages, {args.publishers} publishers x {args.in_flight} unconfirmed; each broker's "
        f"best of {args.repeats} run(s) of {args.duration:g} s (every run is in the json).", "",
        "| broker | confirmed msg/s | confirm p50 ms | confirm p99 ms |", "| --- | --- | --- | --- |", *rows, "",
        f"Ratios reference / RabbitMQ: throughput {data['ratio']['throughput']}, confirm p50 "
        f"{data['ratio']['confirm_p50']}, p99 {data['ratio']['confirm_p99']}.", "",
    ])
    OUT.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
