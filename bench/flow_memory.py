"""Broker memory under a publisher far faster than the broker, flow control on and off.

    python -m bench.flow_memory                   # ~2 minutes

The reference broker runs twice with the same load: ``[flow] enabled = true``
(credit flow from the socket reader to the store, RabbitMQ's scheme) and
``false``. Publishers send persistent messages without confirms, as fast as the
socket accepts them; one consumer holds each delivery ``--consume-delay``
seconds (prefetch ``--prefetch``), so the queue can never keep up. With flow
control the reader stops reading when its credit runs out, TCP pushes back on
the publishers, and the broker's memory levels off; without it the broker keeps
reading and its memory grows for as long as the load lasts. The broker's
resident memory (its cgroup's RSS, page cache excluded) is sampled twice a
second and plotted: bench/results/flow_memory.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.amqp_load import Load, declare, run_load
from bench.broker_container import BrokerContainer, Usage
from bench.facts import command_line, facts_markdown, machine_facts, run_cli, write_json, write_text

QUEUE = "bench-flow"


def run_one(flow: bool, args: argparse.Namespace) -> dict[str, Any]:
    cap = args.max_mb * 2**20
    capped = False
    with BrokerContainer("reference", settings={"flush": "sync", "flow": flow}) as b:
        asyncio.run(declare(b.url, QUEUE, durable=True))
        load = Load(
            url=b.url,
            queue=QUEUE,
            persistent=True,
            size=args.size,
            publishers=args.publishers,
            consumers=1,
            prefetch=args.prefetch,
            consume_delay=args.consume_delay,
            confirms=False,
            warmup=0.0,
            duration=args.duration,
        )

        def over(u: Usage) -> bool:
            nonlocal capped
            if u.rss_bytes > cap:
                # Safety stop: the point is made, and the machine is shared.
                capped = True
                b.container.kill()
            return capped

        t0 = time.monotonic()
        res, samples = run_load(
            load, lambda t_from, t_stop, finished: b.sample(t_from, t_stop, finished, every=0.5, stop_if=over)
        )
        facts = {**b.image_facts(), "version": b.version()}
    start = samples[0].t
    series = [
        {
            "t": round(s.t - start, 2),
            "rss_mb": round(s.rss_bytes / 2**20, 1),
            "cgroup_usage_mb": round(s.usage_bytes / 2**20, 1),
        }
        for s in samples
    ]
    half = [s for s in series if s["t"] >= series[-1]["t"] / 2]
    growth = (
        (half[-1]["rss_mb"] - half[0]["rss_mb"]) / (half[-1]["t"] - half[0]["t"])
        if len(half) > 1 and half[-1]["t"] > half[0]["t"]
        else 0.0
    )
    return {
        "flow_enabled": flow,
        "broker": facts,
        "published_per_second": round(res.publish_rate, 1),
        "consumed_per_second": round(res.consume_rate, 1),
        "client_cpu_cores": round(res.client_cpu_seconds / res.window_seconds, 3),
        "peak_rss_mb": max(s["rss_mb"] for s in series),
        "final_rss_mb": series[-1]["rss_mb"],
        "rss_growth_mb_per_s_second_half": round(growth, 2),
        "stopped_at_cap": capped,
        "elapsed_seconds": round(time.monotonic() - t0, 1),
        "errors": res.errors[:3],
        "series": series,
    }


def plot(runs: list[dict[str, Any]], path: str, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        label = (
            f"flow control {'on' if r['flow_enabled'] else 'off'} "
            f"(peak {r['peak_rss_mb']:.0f} MB, publish {r['published_per_second']:.0f}/s)"
        )
        ax.plot([s["t"] for s in r["series"]], [s["rss_mb"] for s in r["series"]], label=label)
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("broker RSS (MB)")
    ax.set_title(
        f"Reference broker memory: {args.publishers} unconfirmed publishers of {args.size} B persistent "
        f"messages,\none slow consumer (prefetch {args.prefetch}, {args.consume_delay} s per delivery)",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=45.0, help="seconds of load per setting")
    ap.add_argument("--publishers", type=int, default=2, help="publisher processes (no confirms)")
    ap.add_argument("--size", type=int, default=1024, help="message size in bytes")
    ap.add_argument("--prefetch", type=int, default=10, help="the slow consumer's prefetch")
    ap.add_argument(
        "--consume-delay", type=float, default=0.1, help="seconds the consumer holds each delivery"
    )
    ap.add_argument("--max-mb", type=int, default=3072, help="stop a run when the broker's RSS passes this")
    args = ap.parse_args(argv)
    facts = machine_facts()
    command = command_line()
    runs = []
    for flow in (True, False):
        r = run_one(flow, args)
        runs.append(r)
        print(
            f"flow control {'on ' if flow else 'off'}: peak RSS {r['peak_rss_mb']:7.1f} MB, final "
            f"{r['final_rss_mb']:7.1f} MB, growth in 2nd half {r['rss_growth_mb_per_s_second_half']:6.2f} MB/s, "
            f"published {r['published_per_second']:7.0f}/s, consumed {r['consumed_per_second']:5.0f}/s"
            + (" (stopped at the memory cap)" if r["stopped_at_cap"] else "")
            + (f" errors {r['errors']}" if r["errors"] else ""),
            flush=True,
        )
    import os

    facts["load_average_at_end"] = os.getloadavg()
    on, off = runs
    ratio = round(off["peak_rss_mb"] / on["peak_rss_mb"], 2) if on["peak_rss_mb"] else None
    summary = (
        f"peak RSS without flow control / with: {ratio} "
        f"({off['peak_rss_mb']:.0f} MB vs {on['peak_rss_mb']:.0f} MB)"
    )
    print(summary)
    data = {
        "benchmark": "flow_memory",
        "command": command,
        "machine": facts,
        "load": {
            k: getattr(args, k)
            for k in ("duration", "publishers", "size", "prefetch", "consume_delay", "max_mb")
        },
        "peak_ratio_off_over_on": ratio,
        "runs": runs,
    }
    png = "flow_memory.png"
    from bench.facts import RESULTS

    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(runs, str(RESULTS / png), args)
    write_json("flow_memory.json", data)
    rows = [
        "| flow control | peak RSS MB | final RSS MB | RSS growth, 2nd half (MB/s) | published/s | consumed/s "
        "| stopped at cap |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rows.append(
            f"| {'on' if r['flow_enabled'] else 'off'} | {r['peak_rss_mb']:.0f} | {r['final_rss_mb']:.0f} "
            f"| {r['rss_growth_mb_per_s_second_half']:.2f} | {r['published_per_second']:.0f} "
            f"| {r['consumed_per_second']:.0f} | {r['stopped_at_cap']} |"
        )
    write_text(
        "flow_memory.md",
        "# Flow control and broker memory\n\n"
        + facts_markdown(facts, command)
        + f"- broker: {on['broker']['version']}, image {on['broker']['image']} ({on['broker']['image_id']})\n"
        + f"- load: {args.publishers} publisher processes without confirms, {args.size} B persistent "
        f"messages to one durable queue; one consumer, prefetch {args.prefetch}, holding each delivery "
        f"{args.consume_delay} s; {args.duration:.0f} s per setting; safety cap {args.max_mb} MB\n\n"
        + "\n".join(rows)
        + f"\n\n{summary}\n\n![broker memory](flow_memory.png)\n",
    )
    print("wrote bench/results/flow_memory.{json,md,png}")
    return 0


if __name__ == "__main__":
    run_cli(main)
