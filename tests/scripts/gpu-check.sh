#!/bin/bash
# The GPU layers of railguard's runbook on a machine with an NVIDIA GPU and its driver:
# discovery with NVML, GPU memory allocated, filled, read back and exported as a DMA-BUF
# through the real CUDA driver API, and a one-GPU NCCL all-reduce through the real NCCL
# library (the nvidia-nccl-cu12 wheel from PyPI provides libnccl.so.2) — all through
# `railguard-prober gpu-check`, the same code the prober certifies with. Prints the JSON
# report on stdout.
#
#   tests/scripts/gpu-check.sh
#
# Environment: RAILGUARD_PROBER_BIN (a built railguard-prober; default: build it in release
# mode), RAILGUARD_NCCL_LIBRARY (a libnccl.so.2; default: the wheel, installed once under
# ~/.cache/railguard/nccl-wheel), RAILGUARD_CUDA_LIBRARY (default: libcuda.so.1 from the
# loader's path).
#
# Exit status: 0 pass, or skipped on a machine without an NVIDIA GPU and driver; 1 a layer
# failed; 2 the check could not run.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ ! -e /dev/nvidiactl ] && [ -z "${RAILGUARD_CUDA_LIBRARY:-}" ] \
   && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  echo '{"status": "skip", "reasons": ["no NVIDIA GPU here: no /dev/nvidiactl and no libcuda.so.1"]}'
  exit 0
fi

BIN="${RAILGUARD_PROBER_BIN:-}"
if [ -z "$BIN" ]; then
  cargo build --release -q -p railguard-prober-cli --bin railguard-prober >&2 || exit 2
  BIN=target/release/railguard-prober
fi

NCCL="${RAILGUARD_NCCL_LIBRARY:-}"
if [ -z "$NCCL" ]; then
  WHEEL="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/nccl-wheel"
  LIB="$WHEEL/nvidia/nccl/lib/libnccl.so.2"
  if [ ! -f "$LIB" ]; then
    # --target keeps the wheel out of the system's packages.
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --target "$WHEEL" nvidia-nccl-cu12 >&2 \
      || echo "gpu-check: cannot install the nvidia-nccl-cu12 wheel; the NCCL layer will fail" >&2
  fi
  [ -f "$LIB" ] && NCCL="$LIB"
fi

args=(gpu-check)
[ -n "$NCCL" ] && args+=(--nccl-library "$NCCL")
[ -n "${RAILGUARD_CUDA_LIBRARY:-}" ] && args+=(--cuda-library "$RAILGUARD_CUDA_LIBRARY")
# A hung driver call must not hold the machine: the whole check fits in a few minutes.
set +e
timeout 240 "$BIN" "${args[@]}"
rc=$?
set -e
[ "$rc" -eq 124 ] && { echo "gpu-check: timed out after 240 s" >&2; exit 2; }
exit "$rc"
