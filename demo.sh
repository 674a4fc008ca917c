#!/usr/bin/env bash
# railguard demo: builds everything, prepares the local control plane (the first time it
# builds kube-apiserver and kube-scheduler from Debian's source package, ~13 min on 2 cores),
# then runs the story on six simulated DGX-H100 nodes. `./demo.sh --down` stops it.
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = "--down" ]; then
  exec target/debug/railguard-demo --down
fi
echo "==> Installing prerequisites (apt, first run only)"
bash tests/scripts/install-deps.sh
echo "==> Preparing the local control plane (cached after the first run)"
export RAILGUARD_KUBE_BIN_DIR="$(bash tests/scripts/control-plane.sh)"
echo "==> Building railguard (cargo build; the first build takes several minutes)"
cargo build --workspace --bins
exec target/debug/railguard-demo "$@"
