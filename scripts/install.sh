#!/usr/bin/env bash
# Installs everything brokerchaos needs on a fresh Debian/Ubuntu machine with Docker,
# Python 3.11, Java 17 and Rust: system packages, the Python package, the Toxiproxy-API
# server, and every image (built locally; no container registry is needed).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }

if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
need_apt=""
for pkg in debootstrap fuse3 libfuse3-3; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt="$need_apt $pkg"
done
if [ -n "$need_apt" ]; then
  step "system packages:$need_apt"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq $need_apt >/dev/null
fi

step "Python package (editable) and test tools"
python3 -m pip install -q --disable-pip-version-check -e '.[dev,fast]'

step "Toxiproxy-API server (cargo build --release --locked)"
cargo build -q --release --locked --manifest-path tools/toxiproxy-server/Cargo.toml

step "images (base, Toxiproxy, every broker plugin)"
brokerchaos images build
