#!/usr/bin/env bash
# Installs the Debian packages railguard's build and tests need (idempotent; as root).
set -euo pipefail
pkgs=(
  # ibverbs crate (bindgen + vendored rdma-core pieces)
  cmake pkg-config libnl-3-dev libnl-route-3-dev libclang-dev libibverbs-dev clang
  # control plane
  etcd-server openssl
  # real local node (containerd + kubelet) and its images (tests/scripts/build-images.sh:
  # buildah, busybox-static test pods, gcc + libc6-dev for a static pause binary)
  containerd runc containernetworking-plugins iptables conntrack socat ebtables ethtool
  buildah busybox-static gcc libc6-dev
  # the fleet report's browser test (tests/src/chromium.rs: headless --dump-dom, --screenshot)
  chromium fonts-dejavu-core
  # promtool, which checks the Grafana dashboard's PromQL (tests/tests/chart_dashboard.rs)
  prometheus
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install-deps] installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# pip, which downloads the nvidia-nccl-cu12 wheel (tests/scripts/nccl-wheel.sh); a machine
# whose python3 has none gets Debian's (`pip download` needs no virtual environment).
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "[install-deps] installing python3-pip" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3 python3-pip >/dev/null
fi
# The prober's Soft-RoCE VM test (qemu, busybox, rdma-core userspace).
sh "$(dirname "$0")/../../prober/vm/install-deps.sh"
