#!/usr/bin/env bash
# Runs every railguard test: installs prerequisites, prepares the real local control plane
# (built once and cached in ${XDG_CACHE_HOME:-$HOME/.cache}/railguard), then the whole
# workspace's tests, end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tests/scripts/install-deps.sh
export RAILGUARD_KUBE_BIN_DIR="$(bash tests/scripts/control-plane.sh)"
# Build every binary once; end-to-end tests run them as real child processes.
cargo build --workspace --bins
target="${CARGO_TARGET_DIR:-$PWD/target}"
export RAILGUARD_BIN_DIR="$target/debug" RAILGUARD_PROBER_BIN="$target/debug/railguard-prober"
cargo test --workspace "$@"
