#!/usr/bin/env bash
# Installs everything brokerchaos needs on a fresh Debian/Ubuntu machine with Docker,
# Python 3.11, Java 17 and Rust: system packages, the Python package, the Toxiproxy-API
# server, and every image (built locally; no container registry is needed).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }

if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
need_apt=""
for pkg in debootstrap fuse3 libfuse3-3 chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt="$need_apt $pkg"
done
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

step "Python package (editable) and test tools"
python3 -m pip install -q --disable-pip-version-check -e '.[dev,fast]'

step "Toxiproxy-API server (cargo build --release --locked)"
cargo build -q --release --locked --manifest-path tools/toxiproxy-server/Cargo.toml

step "images (base, Toxiproxy, every broker plugin)"
brokerchaos images build
