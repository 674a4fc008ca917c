#!/usr/bin/env bash
# Runs every railguard test: installs prerequisites, prepares the real local control planes
# (Kubernetes 1.20 and 1.37, built once and cached in ${XDG_CACHE_HOME:-$HOME/.cache}/railguard),
# then the whole workspace's tests, end-to-end tests included, and the control-plane
# end-to-end tests a second time against 1.37; last, rustfmt and clippy (warnings as errors).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tests/scripts/install-deps.sh
export RAILGUARD_KUBE_BIN_DIR="$(bash tests/scripts/control-plane.sh)"
# A modern control plane beside the 1.20 floor (Kubernetes 1.37 and its etcd, built from
# the Go module proxy and cached the same way).
export RAILGUARD_KUBE_MODERN_BIN_DIR="$(bash tests/scripts/control-plane-modern.sh)"
# The real Helm (v4) and kubectl (from the 1.37 module graph), built from the Go module proxy
# and cached the same way: the chart tests (tests/tests/chart_e2e.rs) lint, render and
# server-side dry-run the chart with them, and fail without them.
RAILGUARD_HELM_BIN_DIR="$(bash tests/scripts/helm.sh | tail -1)"
export RAILGUARD_HELM_BIN_DIR
# The real Kueue controller manager (v0.17.0, from the Go module proxy, cached the same way)
# that tests/tests/kueue_e2e.rs runs on the 1.37 control plane.
RAILGUARD_KUEUE_DIR="$(bash tests/scripts/kueue.sh | tail -1)"
export RAILGUARD_KUEUE_DIR
# The real NCCL (the PyPI wheel nvidia-nccl-cu12, pinned and sha256-checked, cached the same
# way) that the NCCL environment plugin is tested inside (nccl-env/tests/real_nccl.rs).
export RAILGUARD_NCCL_LIB_DIR="$(bash tests/scripts/nccl-wheel.sh | tail -1)"
# A one-off build gains nothing from incremental state, which would double the disk it needs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Build every library (the NCCL env plugin is a cdylib the prober image carries), binary and
# test once, in one invocation so that all share one feature set (binaries built apart from
# the tests would be compiled twice); end-to-end tests run the binaries as real child
# processes.
cargo build --workspace --lib --bins --tests
target="${CARGO_TARGET_DIR:-$PWD/target}"
export RAILGUARD_BIN_DIR="$target/debug" RAILGUARD_PROBER_BIN="$target/debug/railguard-prober"
cargo test --workspace "$@"

# The control-plane end-to-end tests again against the modern version. The real node
# stays on 1.20 (its kubelet and kube-proxy are built for 1.20 only). `--workspace` keeps the
# feature set of the build above (`-p railguard-tests` alone would compile the tree again).
RAILGUARD_KUBE_VERSION=1.37 cargo test --workspace \
  --test control_plane_e2e --test webhook_e2e --test webhook_certs_e2e --test extender_e2e \
  --test admission_to_placement_e2e --test prober_e2e --test prober_faults_e2e --test campaign_e2e \
  --test chart_e2e --test node_guard_e2e --test invalid_profile_e2e --test campaign_identity_e2e \
  --test fleet_e2e --test chart_fleet_rbac_e2e --test helm_lifecycle_e2e --test pod_security_e2e \
  --test prober_node_policy_e2e "$@"

# Formatting and lints over every target (tests and benches included), warnings as errors.
if command -v rustup >/dev/null 2>&1; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
