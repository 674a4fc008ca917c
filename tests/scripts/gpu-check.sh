#!/bin/bash
# The GPU layers of railguard's runbook on a machine with an NVIDIA GPU and its driver:
# discovery with NVML, GPU memory allocated, filled, read back and exported as a DMA-BUF
# through the real CUDA driver API, and a one-GPU NCCL all-reduce through the real NCCL
# library (the nvidia-nccl-cu12 wheel from PyPI provides libnccl.so.2) — all through
# `railguard-prober gpu-check`, the same code the prober certifies with. Prints the JSON
# report on stdout.
#
# The all-reduce runs with railguard's NCCL environment plugin loaded (NCCL_ENV_PLUGIN), over
# a node file written from this machine's own discovery (its GPUs, and its RDMA devices as
# healthy rails; `enforce`, the bootstrap on `lo`): on stderr, after the report, the lines
# of NCCL's INFO log that show what NCCL read from the plugin.
#
#   tests/scripts/gpu-check.sh
#
# Environment: RAILGUARD_PROBER_BIN (a built railguard-prober; default: build it in release
# mode), RAILGUARD_NCCL_LIBRARY (a libnccl.so.2; default: the pinned wheel of
# tests/scripts/nccl-wheel.sh), RAILGUARD_CUDA_LIBRARY (default: libcuda.so.1 from the
# loader's path), RAILGUARD_NCCL_ENV_PLUGIN (a built libnccl-env-railguard.so; default: build
# it in release mode; `none` runs without the plugin).
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
  if dir="$(bash tests/scripts/nccl-wheel.sh | tail -1)" && [ -f "$dir/libnccl.so.2" ]; then
    NCCL="$dir/libnccl.so.2"
  else
    echo "gpu-check: cannot get the nvidia-nccl-cu12 wheel; the NCCL layer will fail" >&2
  fi
fi

PLUGIN="${RAILGUARD_NCCL_ENV_PLUGIN:-}"
if [ -z "$PLUGIN" ]; then
  if cargo build --release -q -p railguard-nccl-env-plugin >&2; then
    PLUGIN="$PWD/target/release/librailguard_nccl_env_plugin.so"
  else
    echo "gpu-check: cannot build the NCCL env plugin; running without it" >&2
    PLUGIN=none
  fi
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ "$PLUGIN" != none ]; then
  # The node file from this machine's discovery: what the prober daemon writes from a
  # certificate, here for rails taken as healthy (no certification runs in this check).
  "$BIN" discover --sysfs-root / --json > "$work/discovery.json" 2>"$work/discover.err" || true
  python3 - "$work/discovery.json" "$work/nccl.json" <<'PY' || { echo "gpu-check: cannot write the node file; running without the plugin" >&2; PLUGIN=none; }
import datetime, json, socket, sys
d = json.load(open(sys.argv[1]))
pci = {(n["hca"], n["port"]): n.get("pciBusId") for n in d.get("nics", [])}
rails, gpus = [], []
for r in d.get("rails", []):
    rail = {"hca": r["hca"], "port": r["port"], "health": "healthy"}
    for key, value in (("pciAddress", pci.get((r["hca"], r["port"]))),
                       ("netdev", r.get("netdev")), ("gidIndex", r.get("gidIndex"))):
        if value is not None:
            rail[key] = value
    rails.append(rail)
for g in d.get("gpus", []):
    gpu = {"index": g["index"], "pciBusId": g["pciBusId"]}
    if g.get("uuid"):
        gpu["uuid"] = g["uuid"]
    serving = [r for r in d.get("rails", []) if g["index"] in r.get("gpus", [])]
    if len(serving) == 1:
        gpu["rail"] = "%s:%d" % (serving[0]["hca"], serving[0]["port"])
    gpus.append(gpu)
expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
json.dump({
    "version": 1, "node": socket.gethostname(), "profile": "gpu-check",
    "certificate": {"generation": 1, "verdict": "certified",
                    "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ")},
    "rails": rails, "gpus": gpus,
    "nccl": {"socketIfname": "=lo", "enforce": True, "onUnhealthy": "Warn"},
}, open(sys.argv[2], "w"), indent=1)
PY
fi

args=(gpu-check)
[ -n "$NCCL" ] && args+=(--nccl-library "$NCCL")
[ -n "${RAILGUARD_CUDA_LIBRARY:-}" ] && args+=(--cuda-library "$RAILGUARD_CUDA_LIBRARY")
# A hung driver call must not hold the machine: the whole check fits in a few minutes.
set +e
if [ "$PLUGIN" != none ]; then
  # NCCL's INFO log to a file: stdout carries the JSON report only.
  NCCL_ENV_PLUGIN="$PLUGIN" RAILGUARD_NCCL_CONFIG="$work/nccl.json" NCCL_DEBUG=INFO \
    NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$work/nccl.%p.log" \
    timeout 240 "$BIN" "${args[@]}"
  rc=$?
  {
    echo "gpu-check: the NCCL env plugin ($PLUGIN) and what NCCL read from it:"
    grep -hiE "env plugin|railguard|Bootstrap: Using|NCCL_IB_HCA|NCCL_SOCKET_IFNAME|NCCL_IB_GID_INDEX" \
      "$work"/nccl.*.log 2>/dev/null | sed 's/^/  /' || echo "  (no NCCL log: NCCL did not start)"
    echo "gpu-check: node file:"
    sed 's/^/  /' "$work/nccl.json"
  } >&2
else
  timeout 240 "$BIN" "${args[@]}"
  rc=$?
fi
set -e
[ "$rc" -eq 124 ] && { echo "gpu-check: timed out after 240 s" >&2; exit 2; }
exit "$rc"
