"""Both engines on one stored run: the reconciliation with its anomaly classes (``check_python``
against ``check_spark``) and the ``stream`` checks (``check_stream_python`` against
``check_stream_spark``), each pair compared field for field, with the time each took.

Usage:
  python bench/engines_agree.py RUN_DIR [--spark-master local[2]]

Prints one line per comparison; exits 1 if either pair differs. The load average before and after
is printed too: other work shares this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_reports import check_python, check_spark, stop_session  # noqa: E402
from spark_reports.engines.stream import check_stream_python, check_stream_spark  # noqa: E402
from spark_reports.service.session import spark_session  # noqa: E402


def _same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys whose values differ, the engine's name and timings left out."""
    keys = (set(a) | set(b)) - {"engine", "timings"}
    return sorted(k for k in keys if a.get(k) != b.get(k))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--spark-master", default="local[2]")
    args = ap.parse_args(argv)
    run: Path = args.run_dir
    scenario = json.loads((run / "scenario.json").read_text())["scenario"]
    print("load before:", Path("/proc/loadavg").read_text().strip(), flush=True)
    t = time.monotonic()
    sp_stream = check_stream_spark(run, spark=spark_session(args.spark_master))
    t_stream = time.monotonic() - t
    stream_diff = _same(check_stream_python(run), sp_stream)
    print(
        f"stream: spark {t_stream:.1f}s, differing: {stream_diff or 'none'}", sp_stream["counts"], flush=True
    )
    t = time.monotonic()
    py: dict[str, Any] = dict(check_python(run, scenario))
    t_py = time.monotonic() - t
    t = time.monotonic()
    sp: dict[str, Any] = dict(check_spark(run, scenario, spark_master=args.spark_master))
    t_sp = time.monotonic() - t
    stop_session()
    diff = _same(py, sp)
    occurring = {k: v for k, v in sp["anomalies"]["counts"].items() if v}
    print(f"reconcile: python {t_py:.1f}s, spark {t_sp:.1f}s, differing: {diff or 'none'}", occurring)
    print("load after:", Path("/proc/loadavg").read_text().strip())
    return 1 if diff or stream_diff else 0


if __name__ == "__main__":
    sys.exit(main())
