#!/usr/bin/env bash
# The whole test suite, Docker and Spark tests included (they are the point of the project).
# Quick local loop without them: python3 -m pytest -m "not docker and not spark"
set -uo pipefail
cd "$(dirname "$0")/.."
# Two test files at once (pytest-xdist; a file's tests stay on one worker, for module fixtures such
# as the conformance kit's cluster): most of the suite's time is Docker chaos runs waiting on
# fixed-length workloads. BROKERCHAOS_TEST_WORKERS=0 runs them one by one. --no-loadscope-reorder
# keeps the order tests/conftest.py gives the files (Docker, then Spark, then slow, then the rest), so
# the long runs start first and the two workers end together.
python3 -m pytest -p no:cacheprovider --durations=50 --alluredir=allure-results \
  -n "${BROKERCHAOS_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
status=$?
brokerchaos -q down >/dev/null 2>&1 || true
if [ "$status" = 5 ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit "$status"
