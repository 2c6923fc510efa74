#!/usr/bin/env bash
# Installs everything brokerchaos needs on a fresh Debian (bookworm) machine with Docker:
# the system packages it lacks (Java 17 for Spark, a Rust toolchain when cargo is missing
# or too old, Python's pip, debootstrap, FUSE, Chromium, nats-server for the NATS client
# tests on loopback), the Python package, the
# Toxiproxy-API server, and the images the default run uses (built locally; no container
# registry is needed). Other brokers' images are built on their first run, with progress
# (or ahead of time: `brokerchaos images build`, every broker; `--broker NAME`, one).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== [%4ss] %s\n' "$SECONDS" "$*" >&2; }

if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
need_apt=""
for pkg in debootstrap fuse3 libfuse3-3 chromium nats-server; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt="$need_apt $pkg"
done
# Spark needs a Java runtime (17 is what PySpark 4 supports on bookworm).
command -v java >/dev/null 2>&1 || need_apt="$need_apt openjdk-17-jre-headless"
command -v python3 >/dev/null 2>&1 || need_apt="$need_apt python3"
python3 -m pip --version >/dev/null 2>&1 || need_apt="$need_apt python3-pip"
# The Toxiproxy-API server's lock file needs cargo 1.78 or newer: bookworm's own cargo is
# 0.66, its cargo-web/rustc-web packages are current.
cargo_ok() {
  local v
  v=$(cargo --version 2>/dev/null | awk '{print $2}') || return 1
  [ -n "$v" ] && [ "$(printf '%s\n1.78.0\n' "$v" | sort -V | head -n1)" = "1.78.0" ]
}
cargo_ok || need_apt="$need_apt cargo-web rustc-web gcc"
command -v docker >/dev/null 2>&1 || need_apt="$need_apt docker.io"
if [ -n "$need_apt" ]; then
  step "system packages:$need_apt"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq $need_apt >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  step "the Docker daemon is not running: starting it"
  $SUDO service docker start >/dev/null 2>&1 || true
  for _ in $(seq 1 15); do docker info >/dev/null 2>&1 && break; sleep 1; done
  if ! docker info >/dev/null 2>&1 && command -v dockerd >/dev/null; then
    # Where the init script cannot run (e.g. it may not raise ulimits), start dockerd directly.
    $SUDO rm -f /var/run/docker.pid
    $SUDO setsid nohup dockerd >/tmp/brokerchaos-dockerd.log 2>&1 </dev/null &
    for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
  docker info >/dev/null 2>&1 || { echo "Docker is not running and could not be started; start it and rerun" >&2; exit 2; }
fi

# cargo's compile is CPU work, pip's install and the common base's debootstrap are mostly
# downloads: the compile runs beside them.
step "Toxiproxy-API server (cargo build --release --locked, beside the next steps)"
cargo_log=$(mktemp)
cargo build -q --release --locked --manifest-path tools/toxiproxy-server/Cargo.toml >"$cargo_log" 2>&1 &
cargo_pid=$!

step "Python package (editable) and test tools"
pip_flags=""
# Debian's own python3 refuses system-wide pip installs (PEP 668) unless told.
if python3 -c 'import sys, sysconfig, pathlib; sys.exit(0 if (pathlib.Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists() else 1)'; then
  pip_flags="--break-system-packages"
fi
python3 -m pip install -q --disable-pip-version-check $pip_flags -e '.[dev,fast]'
# The checkout's bytecode, compiled once: where PYTHONDONTWRITEBYTECODE is set Python never writes
# it, and every harness process (each run, each matrix cell) compiled the modules it imports again
# (0.2-0.3 s of CPU a process; bench/results/run_fixed_cost.md). A stale cache is ignored.
python3 -m compileall -q -j0 harness plugins faults spark_reports broker_impl >/dev/null

step "images the default run uses (common base, Toxiproxy, reference broker)"
# The sidecar's step waits on cargo's lock for the compile above when it is still going.
brokerchaos images build --broker reference
if ! wait "$cargo_pid"; then
  cat "$cargo_log" >&2
  echo "the Toxiproxy-API server did not build (cargo's output above); fix that and rerun scripts/install.sh" >&2
  exit 1
fi
rm -f "$cargo_log"
