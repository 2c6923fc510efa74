#!/usr/bin/env bash
# Lint, format and type checks over the packages, the tests and the benchmarks: seconds, so CI runs
# them before the long suite. Fix what ruff can with `ruff check --fix` and `ruff format`.
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(harness plugins faults spark_reports broker_impl tests bench)
python3 -m ruff check "${paths[@]}"
python3 -m ruff format --check "${paths[@]}"
python3 -m mypy "${paths[@]}"
