"""The ``brokerchaos`` command.

Exit status: 0 durable, 1 a failure verdict (LOST, UNSYNCED, INTEGRITY, DEAD_LETTERED, RESURRECTED,
DUPLICATED, UNAVAILABLE; a node the final heal could not bring back is UNAVAILABLE, graded on what the
other nodes drained), 2 harness or usage error (one line on stderr), 3 verdict unknown (e.g. the final
drain never finished, or no node that serves clients came back to drain through), 4 durable but no
fault was measured to bite. A run's verdict is the worst of every checker's
(``harness.spec.results.VERDICT_ORDER``), so the status follows what the first line says.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.errors import BrokerChaosError
from harness.runner import EXIT_ERROR
from harness.spec.results import EXIT_FAILED, exit_status
from harness.spec.rundir import REPORT_HTML, RESULTS_JSON, SCENARIO_JSON
from harness.store import add_store_option

USAGE_EXAMPLES = """\
examples:
  brokerchaos run scenarios/partitions.yaml        a chaos run on the default topology
  brokerchaos run scenarios/crash.yaml --runs 5    five seeded runs, graded together
  brokerchaos run scenarios/crash.yaml --until-fail --runs 20   seeded runs until the first failure
  brokerchaos shrink store/latest --budget 30      the smallest schedule that still fails
  brokerchaos explore scenarios/crash.yaml --budget 20   search fault schedules for new coverage, then a failure
  brokerchaos analyze store/latest                 re-check a stored run (no Docker)
  brokerchaos plugins                              what is loaded
  brokerchaos images build                         build every image ahead of first use (offline)
  brokerchaos spark start                          keep a warm Spark Connect server for the checks
  brokerchaos down                                 remove what runs whose harness exited left behind
  brokerchaos validate --plugin reference          check a broker plugin's contract
  brokerchaos matrix matrices/brokers.yaml         the durability matrix: runs what is missing, writes its page
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="brokerchaos",
        description="Chaos testing for message brokers.",
        epilog=USAGE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-p",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE",
        help="load a plugin module by import path (repeatable)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _run_parser(sub)
    _search_parsers(sub)
    _check_parsers(sub)
    _service_parsers(sub)
    _kit_parsers(sub)
    return p


def _run_parser(sub: Any) -> None:
    """``run``: a scenario against a fresh cluster."""
    r = sub.add_parser("run", help="run a scenario against a fresh cluster")
    r.add_argument("scenario", help="scenario file (.yaml or .toml); ready ones are in scenarios/")
    r.add_argument("--seed", type=int, help="override the scenario's seed")
    r.add_argument("--duration", type=float, help="override the workload duration (seconds)")
    r.add_argument("--runs", type=int, default=1, help="seeded runs (seed, seed+1, ...), graded together")
    r.add_argument("--replay", metavar="RUN_DIR", help="repeat the fault schedule a stored run applied")
    r.add_argument(
        "--until-fail",
        action="store_true",
        help="with --runs N: stop at the first failing run and report the runs and wall time it took",
    )
    add_store_option(r)
    _checker_option(r)
    _spark_options(r)
    r.add_argument("--keep", action="store_true", help="leave the cluster running after the run")
    r.add_argument(
        "--ports",
        type=int,
        metavar="BASE",
        help="publish the nodes' client ports at BASE, BASE+1, ... on 127.0.0.1 (default: any free port)",
    )
    r.add_argument("--json", action="store_true", help="print results.json instead of the table")


def _search_parsers(sub: Any) -> None:
    """``shrink`` and ``explore``: searching fault schedules."""
    s = sub.add_parser(
        "shrink", help="search for the smallest schedule that still fails like a stored failing run"
    )
    s.add_argument("run_dir", help="a stored run whose verdict is LOST or INTEGRITY")
    s.add_argument("--budget", type=float, default=30.0, help="minutes of search at most (default 30)")
    s.add_argument(
        "--trials",
        type=int,
        default=2,
        help="runs of each candidate at most; it fails if any of them fails (default 2)",
    )
    s.add_argument(
        "--passes", help="comma-separated, of: faults, holds, nodes, cluster, workload, rate (default all)"
    )
    s.add_argument("--out", help="shrink directory (default <store>/shrink/<scenario>-<time>)")
    add_store_option(s)
    _spark_options(s)

    e = sub.add_parser(
        "explore",
        help="search fault schedules, coverage-guided, until a run fails (then shrink it) or the budget is spent",
    )
    e.add_argument("scenario", help="scenario file whose schedule and fault kinds the search starts from")
    e.add_argument("--budget", type=float, default=30.0, help="minutes of search at most (default 30)")
    e.add_argument("--seed", type=int, help="the search's seed (default the scenario's)")
    e.add_argument("--duration", type=float, help="override the workload duration (seconds)")
    e.add_argument(
        "--faults", help="comma-separated fault kinds the search may add besides the scenario's own"
    )
    e.add_argument(
        "--runs", type=int, help="runs at most in this session (default: as many as the budget allows)"
    )
    e.add_argument(
        "--corpus",
        help="corpus directory; a later search with it continues (default <store>/explore/<scenario>)",
    )
    e.add_argument(
        "--until",
        help="comma-separated failing verdicts that stop the search (default any: LOST, INTEGRITY, "
        "RESURRECTED, DUPLICATED, UNAVAILABLE); runs failing with others are recorded and the search goes on",
    )
    e.add_argument(
        "--until-event",
        metavar="EVENT,...",
        help="comma-separated broker events (as a run's results name them: served-alone, copy-dropped) "
        "that a failing run must also have shown to stop the search; others are recorded and it goes on",
    )
    e.add_argument(
        "--no-shrink", action="store_true", help="stop at the first failing run without shrinking it"
    )
    e.add_argument(
        "--shrink-budget", type=float, default=30.0, help="minutes of shrinking at most (default 30)"
    )
    e.add_argument("--trials", type=int, default=2, help="shrink: runs of each candidate at most (default 2)")
    add_store_option(e)
    _checker_option(e)
    _spark_options(e)


def _check_parsers(sub: Any) -> None:
    """``analyze`` and ``grade``: checking stored runs again."""
    a = sub.add_parser("analyze", help="re-check a stored run without a cluster")
    a.add_argument("run_dir", help="a stored run directory (store/<scenario>/<time>, or store/latest)")
    a.add_argument("--checker", action="append", help="checker(s) (default: the run's)")
    _spark_options(a)
    a.add_argument("--json", action="store_true", help="print results.json instead of the table")

    g = sub.add_parser(
        "grade",
        help="grade stored runs together: share of runs that lost messages (exact "
        "binomial over runs) and a per-message rate (bootstrap over runs)",
    )
    g.add_argument("run_dirs", nargs="+", help="stored run directories, each one trial")
    _spark_options(g, "engine")
    g.add_argument("--out", help="directory for the grade report")
    g.add_argument(
        "--engine",
        choices=("spark", "python", "stored"),
        default="spark",
        help="check each run with Spark (default), the pure-Python checker, or reuse results.json",
    )


def _service_parsers(sub: Any) -> None:
    """``plugins``, ``spark``, ``images`` and ``down``: what is loaded, built and left running."""
    sub.add_parser("plugins", help="list loaded plugins, versions and capabilities")

    sp = sub.add_parser(
        "spark",
        help="a Spark Connect server that run, analyze, grade and shrink check through while it is up",
    )
    spsub = sp.add_subparsers(dest="spark_command", metavar="ACTION")
    sps = spsub.add_parser("start", help="start it on loopback and warm it (until `brokerchaos spark stop`)")
    sps.add_argument("--port", type=int, help="its port (default 15002)")
    sps.add_argument("--driver-memory", help="its heap (default 1g or $BROKERCHAOS_SPARK_DRIVER_MEMORY)")
    sps.add_argument("--no-warm-up", action="store_true", help="skip the warm-up checks after it starts")
    spsub.add_parser("status", help="whether it is up, where, and its log (exit 1 when it is not up)")
    spsub.add_parser("stop", help="stop it")

    i = sub.add_parser("images", help="image management")
    isub = i.add_subparsers(dest="images_command", metavar="ACTION")
    ib = isub.add_parser(
        "build", help="build the base, Toxiproxy and plugin images (skips what is up to date)"
    )
    ib.add_argument(
        "--broker",
        action="append",
        help="only these broker plugins, NAME or NAME@VERSION (default: all, each at its default "
        "version); a run builds what it lacks on first use",
    )
    ib.add_argument("--force", action="store_true", help="build even what is up to date")

    d = sub.add_parser(
        "down",
        help="remove the containers, networks and volumes of runs whose harness has exited "
        "(runs in progress are left alone)",
    )
    which = d.add_mutually_exclusive_group()
    which.add_argument("--run", help="only this run id, whether its harness is still running or not")
    which.add_argument(
        "--all",
        action="store_true",
        help="everything brokerchaos created on this engine, runs in progress included (no prompt)",
    )


def _kit_parsers(sub: Any) -> None:
    """``validate`` and ``compose``: a plugin's conformance, the default topology."""
    v = sub.add_parser(
        "validate", help="check a broker plugin's contract (conformance kit); exit 1 on a failure"
    )
    v.add_argument("--plugin", required=True, help="broker plugin name (load outside ones with -p MODULE)")
    v.add_argument(
        "--only",
        help="comma-separated check groups: contract, image, cluster, data-dir, "
        "correctness, and each fault kind `brokerchaos plugins` lists that the kit probes",
    )
    v.add_argument(
        "--duration", type=float, default=6.0, help="workload seconds of each short run (default 6)"
    )
    v.add_argument("--store", help="where the runs are stored (default: a temporary directory)")

    _matrix_parser(sub)

    c = sub.add_parser("compose", help="write the default topology to docker-compose.yml")
    c.add_argument("--output", default="docker-compose.yml", help="the file to write")
    c.add_argument("--check", action="store_true", help="exit 1 if the file differs from the topology")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_ERROR
    from harness import progress

    progress.quiet = args.quiet
    try:
        return _dispatch(args)
    except BrokerChaosError as exc:
        print(f"brokerchaos: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(
            "brokerchaos: interrupted; the cluster was torn down (run `brokerchaos down` if anything remains)",
            file=sys.stderr,
        )
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from harness.host import Host
    from harness.store import default_root

    host = Host.load(args.plugins)
    host.configure(
        {
            "store": Path(args.store) if getattr(args, "store", None) else default_root(),
            "spark_master": getattr(args, "spark_master", None),
            "spark_remote": getattr(args, "spark_remote", None),
        }
    )
    command = _COMMANDS.get(args.command)
    if command is None:
        raise BrokerChaosError(f"unknown command {args.command!r}")
    return command(host, args)


def _plugins(host: Any) -> int:
    rows = host.describe()
    # Columns as wide as their longest entry: a plugin's module name can be long (``-p a.b.c``).
    pw = max([12, *(len(r["plugin"]) + 1 for r in rows)])
    vw = max([10, *(len(r["version"]) + 1 for r in rows)])
    print(f"{'plugin':<{pw}} {'version':<{vw}} {'provides':<44} capabilities")
    for r in rows:
        print(
            f"{r['plugin']:<{pw}} {r['version']:<{vw}} {', '.join(r['provides']):<44} "
            f"{', '.join(r['capabilities'])}".rstrip()
        )
        print(f"{'':<{pw}} {'':<{vw}} ({r['source']})")
    reg = host.registry
    print("\nbrokers (client they need, capabilities)")
    bw = max([16, *map(len, reg.brokers)])
    for name, b in sorted(reg.brokers.items()):
        client = b.protocol if b.protocol in reg.clients else f"{b.protocol} (no client loaded)"
        print(f"  {name:<{bw}} client {client:<12} {', '.join(sorted(b.capabilities)) or '-'}")
        for line in _versions(b):
            print(f"  {'':<{bw}}   {line}")
        if b.data_files:
            print(f"  {'':<{bw}}   data file roles: {', '.join(sorted(b.data_files))}")
    print("\nfaults (broker capabilities they require; host features they need)")
    width = max([16, *map(len, reg.faults)])
    for name, f in sorted(reg.faults.items()):
        needs = f"; needs {', '.join(sorted(f.needs))}" if f.needs else ""
        print(f"  {name:<{width}} requires {', '.join(sorted(f.requires)) or '-'}{needs}")
    print("\ncapabilities")
    for name, what in sorted(reg.capabilities.items()):
        print(f"  {name:<16} {what}")
    print(f"\ncheckers: {', '.join(sorted(reg.checkers))}; clients: {', '.join(sorted(reg.clients))}")
    return 0


def _versions(broker: Any) -> list[str]:
    """A broker plugin's versions, the default first: what a scenario's ``broker.version`` names."""
    out = []
    for i, v in enumerate(broker.versions):
        what = f"{', '.join(v.packages)} {v.upstream}".strip()
        extra = "; ".join(x for x in ("default" if i == 0 else "", v.note) if x)
        out.append(f"version {v.name:<6} Debian {v.suite:<9} {what}" + (f" ({extra})" if extra else ""))
    return out


def _run(host: Any, args: argparse.Namespace) -> int:
    from harness import scenario as scenario_mod
    from harness.nemesis import plan_from_history
    from harness.runner import Run
    from harness.store import RunDir, default_root
    from harness.verdicts import exit_code, series_exit, summary_table, verdict_line

    sc = scenario_mod.with_overrides(scenario_mod.load(args.scenario), seed=args.seed, duration=args.duration)
    replay = None
    if args.replay:
        rd = RunDir.open(args.replay)
        replay = plan_from_history(rd.history_jsonl)
        stored = rd.read_json(SCENARIO_JSON)
        sc = scenario_mod.from_dict(stored["scenario"], source=str(rd.path / SCENARIO_JSON))
    if args.runs < 1:
        raise BrokerChaosError("--runs must be at least 1")
    store = Path(args.store) if args.store else default_root()
    codes = []
    run_dirs = []
    started = time.monotonic()
    for k in range(args.runs):
        s = scenario_mod.with_overrides(sc, seed=sc.seed + k) if args.runs > 1 else sc
        run = Run(
            host,
            s,
            store,
            replay=replay,
            keep=args.keep,
            checkers=tuple(args.checker) if args.checker else None,
            client_port_base=args.ports,
        )
        results = run.execute()
        assert run.dir is not None
        run_dirs.append(run.dir.path)
        codes.append(exit_code(results))
        if args.json:
            print(json.dumps(results, indent=2, sort_keys=True, default=str))
        else:
            print(f"\n{s.name} (seed {s.seed}): {verdict_line(results)}")
            print(summary_table(results))
            report = run.dir.path / REPORT_HTML
            print(f"  run directory      {run.dir.path}")
            if report.exists():
                print(f"  report             {report}")
        if args.keep:  # the id `down --run` needs, whatever else was printed
            print(kept_cluster_line(run.id))
        if args.until_fail and codes[-1] == EXIT_FAILED:
            break
    if args.until_fail:
        _until_fail_summary(codes, run_dirs, sc.seed, time.monotonic() - started)
    elif args.runs > 1:
        _grade_dirs(host, run_dirs, None, engine="stored")
    return series_exit(codes)  # over runs as over checkers: the worst


def kept_cluster_line(run_id: str) -> str:
    """What ``run --keep`` prints about the cluster it left running."""
    return f"  cluster kept       run id {run_id}: remove it with `brokerchaos down --run {run_id}`"


def _until_fail_summary(codes: list[int], run_dirs: list[Path], seed: int, wall: float) -> None:
    """Time to detection: how many seeded runs and how much wall time until the first failure."""
    if codes[-1] == EXIT_FAILED:
        print(
            f"\nuntil-fail: first failure at run {len(codes)} (seed {seed + len(codes) - 1}) after {wall:.1f} s "
            f"of wall time (time to detection); run directory {run_dirs[-1]}"
        )
    else:
        print(
            f"\nuntil-fail: no failure in {len(codes)} run(s) (seeds {seed}..{seed + len(codes) - 1}), "
            f"{wall:.1f} s of wall time"
        )


def _shrink(host: Any, args: argparse.Namespace) -> int:
    from harness.shrink import PASSES
    from harness.shrink_run import Shrink, default_out, open_failing
    from harness.store import default_root

    passes = tuple(p.strip() for p in args.passes.split(",") if p.strip()) if args.passes else PASSES
    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise BrokerChaosError(f"--passes: unknown {', '.join(unknown)}; use some of {', '.join(PASSES)}")
    _rd, stored, _results = open_failing(args.run_dir)
    store = Path(args.store) if args.store else default_root()
    out = Path(args.out) if args.out else default_out(store, stored["scenario"]["name"])
    job = Shrink(host, args.run_dir, out, trials=args.trials, budget_s=args.budget * 60, passes=passes)
    try:
        best = job.run()
    except KeyboardInterrupt:
        print(
            f"brokerchaos: interrupted; the best schedule so far is in {out / 'shrunk.yaml'}", file=sys.stderr
        )
        return 130
    how = {"complete": "search complete", "budget": "time budget spent", "stopped": "search stopped early"}[
        job.finished or "complete"
    ]
    print(
        f"\n{how}: {len(job.original.steps)} -> {len(best.steps)} fault action(s) in {job.elapsed:.0f} s, "
        f"{len(job.candidates)} candidates, {sum(len(c.trials) for c in job.candidates)} trials"
    )
    print(f"  original   {job.original.describe()}")
    print(f"  minimal    {best.describe()}")
    print(f"  scenario   {out / 'shrunk.yaml'}")
    print(f"  report     {out / 'shrink.html'}")
    if job.best_run:
        print(f"  failing    {job.best_run}")
    if job.stopped:
        print(
            f"brokerchaos: shrink stopped early: {job.stopped}; the best schedule so far is in {out / 'shrunk.yaml'}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return 0


def _explore(host: Any, args: argparse.Namespace) -> int:
    from harness import scenario as scenario_mod
    from harness.explore_run import Explore
    from harness.store import default_root

    if args.runs is not None and args.runs < 1:
        raise BrokerChaosError("--runs must be at least 1")
    sc = scenario_mod.with_overrides(scenario_mod.load(args.scenario), duration=args.duration)
    store = Path(args.store) if args.store else default_root()
    corpus = Path(args.corpus) if args.corpus else store / "explore" / sc.name
    extra = [k.strip() for k in args.faults.split(",") if k.strip()] if args.faults else []
    until = _verdicts(args.until) if args.until else None
    job = Explore(
        host,
        sc,
        corpus,
        budget_s=args.budget * 60,
        seed=args.seed,
        extra_faults=extra,
        max_runs=args.runs,
        checkers=tuple(args.checker) if args.checker else None,
        until=until,
        until_events=frozenset(x.strip() for x in (args.until_event or "").split(",") if x.strip()),
    )
    try:
        out = job.run()
    except KeyboardInterrupt:
        print(f"brokerchaos: interrupted; the corpus so far is in {corpus}", file=sys.stderr)
        return 130
    c = job.corpus
    how = {
        "failure": "a run failed",
        "budget": "time budget spent",
        "runs": "--runs spent",
        "exhausted": "no new schedule to try",
    }
    print(
        f"\nexplore: {how.get(job.search.finished or '', job.search.finished)}; {c.iteration} run(s) in all, "
        f"{len(c.cells)} cells, {len(c.entries)} schedule(s) kept, {c.elapsed_s / 60:.1f} min searched"
    )
    print(f"  corpus     {corpus / 'corpus.json'}")
    if out is None:
        return 0
    print(f"  failure    {out.verdict} at run {c.iteration}: {(c.failure or {}).get('describe')}")
    print(f"  scenario   {corpus / 'failure.yaml'}")
    print(f"  run        {out.run_dir}")
    if not args.no_shrink:
        shrunk = job.shrink(out, args.shrink_budget * 60, args.trials)
        if shrunk is not None:
            print(f"  minimal    {shrunk.best.describe()}")
            print(f"  shrunk     {shrunk.out / 'shrunk.yaml'}")
    return exit_status(out.verdict)


def _verdicts(text: str) -> frozenset[str]:
    """``--until``'s failing verdicts, checked against the ones the results schema names."""
    from harness.spec.results import EXIT_FAILED, VERDICT_ORDER, exit_status

    failing = [v for v in VERDICT_ORDER if exit_status(v) == EXIT_FAILED]
    got = frozenset(v.strip().upper() for v in text.split(",") if v.strip())
    wrong = sorted(got - set(failing))
    if wrong or not got:
        raise BrokerChaosError(
            f"--until: {', '.join(wrong) or 'no verdict given'}: not a failing verdict; give some of "
            f"{', '.join(failing)}"
        )
    return got


def _analyze(host: Any, args: argparse.Namespace) -> int:
    from harness.liveness import scrape_logs
    from harness.runner import annotate_coverage, check_run, render_report
    from harness.store import RunDir
    from harness.verdicts import exit_code, summary_table, verdict_line

    rd = RunDir.open(args.run_dir)
    stored = rd.read_json(SCENARIO_JSON)
    checkers = host.checkers_for(args.checker, stored["scenario"].get("checkers"))
    results = check_run(host, rd, stored["scenario"], checkers)
    scrape_logs(rd.path, results)
    broker = (stored.get("broker") or {}).get("plugin") or (stored["scenario"].get("broker") or {}).get(
        "plugin"
    )
    if broker in host.registry.brokers:  # a stored run names its broker; a hand-made history may not
        annotate_coverage(
            host.broker(broker, (stored.get("broker") or {}).get("broker_version")), rd.path, results
        )
    old = rd.read_json(RESULTS_JSON) if (rd.path / RESULTS_JSON).exists() else {}
    for key in ("workload", "timings", "broker"):  # what the run measured, not the checkers
        if key in old:
            results[key] = old[key]
    rd.write_json(RESULTS_JSON, results)
    report = render_report(host, rd, results)
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True, default=str))
    else:
        print(f"{rd.path}: {verdict_line(results)}")
        print(summary_table(results))
        if report:
            print(f"  report             {report}")
    return exit_code(results)


def _grade(host: Any, args: argparse.Namespace) -> int:
    from harness.store import RunDir

    dirs = [RunDir.open(d).path for d in args.run_dirs]
    return _grade_dirs(host, dirs, Path(args.out) if args.out else None, engine=args.engine)


def _grade_dirs(host: Any, dirs: list[Path], out: Path | None, *, engine: str = "spark") -> int:
    out = out or dirs[-1].parent / "grade"
    out.mkdir(parents=True, exist_ok=True)
    graded = host.grade(dirs, engine, out)
    if graded is None:
        raise BrokerChaosError("no loaded plugin grades runs (brokerchaos_grade); install spark_reports")
    from harness.verdicts import tested_versions

    headline, *details = graded["lines"]
    print(f"\n{headline}")
    print(f"  broker: {'; '.join(tested_versions(dirs))}")
    for line in details:
        print(f"  {line}")
    print(f"  grade report: {graded['report']}")
    return exit_status(graded.get("verdict"))


def _matrix_parser(sub: Any) -> None:
    from harness.matrix.command import add_parser

    add_parser(sub)


def _matrix(host: Any, args: argparse.Namespace) -> int:
    from harness.matrix.command import run
    from harness.store import default_root

    return run(host, args, Path(args.store) if args.store else default_root())


def _checker_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checker", action="append", help="checker(s) to use instead of the scenario's")


def _spark_options(parser: argparse.ArgumentParser, what: str = "checker") -> None:
    """Where the Spark ``what`` runs: a master (``--spark-master``) or a Connect server."""
    parser.add_argument("--spark-master", help=f"Spark master URL for the spark {what} (default local[*])")
    parser.add_argument(
        "--spark-remote",
        metavar="sc://HOST:PORT",
        help="check through this Spark Connect server (default $BROKERCHAOS_SPARK_REMOTE, "
        "else the local one while `brokerchaos spark start` has it up)",
    )


def _spark(host: Any, args: argparse.Namespace) -> int:
    if args.spark_command is None:
        raise BrokerChaosError("usage: brokerchaos spark start|status|stop")
    options = {
        "port": getattr(args, "port", None),
        "driver_memory": getattr(args, "driver_memory", None),
        "no_warm_up": getattr(args, "no_warm_up", False),
    }
    try:
        out = host.service("spark", args.spark_command, options)
    except ValueError as exc:
        raise BrokerChaosError(str(exc)) from exc
    if out is None:
        raise BrokerChaosError("no loaded plugin runs a Spark service: install spark_reports")
    for line in out["lines"]:
        print(line)
    return 1 if args.spark_command == "status" and not out["up"] else 0


def _images(host: Any, args: argparse.Namespace) -> int:
    from harness.cluster import docker_client
    from harness.images import ImageBuilder, broker_image

    if args.images_command != "build":
        raise BrokerChaosError("usage: brokerchaos images build [--broker NAME] [--force]")
    client = docker_client()
    builder = ImageBuilder(client, force=args.force)
    names = args.broker or sorted(host.registry.brokers)
    builder.base()
    print(f"toxiproxy  {builder.toxiproxy_image()}")
    for name in names:
        plugin = host.broker(*name.split("@", 1))  # NAME@VERSION: that version's image
        print(f"{name:<10} {broker_image(builder, plugin)}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from harness.cluster import docker_client, remove_labelled, remove_orphans

    client = docker_client()
    if args.run or args.all:
        counts = remove_labelled(client, args.run)
        print(f"removed {_counts(counts)}")
        return 0
    done = remove_orphans(client)
    runs = ", ".join(done.removed_runs)
    print(
        f"removed {_counts(done.counts)} of {len(done.removed_runs)} run(s) whose harness has exited"
        + (f" ({runs})" if runs else "")
    )
    why = {
        "alive": "harness still running",
        "elsewhere": "started on another host or pid namespace",
        "unowned": "no owner labels (an older brokerchaos or another tool)",
    }
    for run_id, state in sorted(done.left.items()):
        print(f"left alone: {run_id or '(resources without a run id)'}: {why.get(state, state)}")
    if any(state != "alive" for state in done.left.values()):
        print("`brokerchaos down --run ID` removes one of these, `brokerchaos down --all` everything")
    return 0


def _counts(c: dict[str, int]) -> str:
    return f"{c['containers']} containers, {c['networks']} networks, {c['volumes']} volumes"


def _validate(host: Any, args: argparse.Namespace) -> int:
    from harness.conformance import Battery, failed, render

    if args.duration <= 0:
        raise BrokerChaosError("--duration must be a positive number of seconds")
    only = [g.strip() for g in args.only.split(",") if g.strip()] if args.only else None
    battery = Battery(
        host, args.plugin, store=Path(args.store) if args.store else None, duration=args.duration, only=only
    )
    rows = battery.run()
    print(render(rows, args.plugin))
    print(f"runs stored under {battery.store}")
    return 1 if failed(rows) else 0


def _compose(args: argparse.Namespace) -> int:
    from harness.compose import default_compose

    text = default_compose()
    target = Path(args.output)
    if args.check:
        if not target.exists() or target.read_text() != text:
            print(
                f"brokerchaos: {target} differs from the default topology; run `brokerchaos compose`",
                file=sys.stderr,
            )
            return 1
        return 0
    target.write_text(text)
    print(f"wrote {target}")
    return 0


#: Each command's handler, called as ``handler(host, args)``.
_COMMANDS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "plugins": lambda host, args: _plugins(host),
    "run": _run,
    "shrink": _shrink,
    "explore": _explore,
    "analyze": _analyze,
    "grade": _grade,
    "images": _images,
    "spark": _spark,
    "down": lambda host, args: _down(args),
    "compose": lambda host, args: _compose(args),
    "validate": _validate,
    "matrix": _matrix,
}


if __name__ == "__main__":
    raise SystemExit(main())
