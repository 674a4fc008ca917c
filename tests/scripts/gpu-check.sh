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
# Then, on a machine with at least 2 GPUs and an RDMA device, the node's NCCL loopback as
# certification runs it (certification.ncclRunner: Native): `railguard-prober nccl-ranks
# --single-node`, one rank per GPU in one communicator, with NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 and NCCL_IB_HCA set to the active rails discovery
# found, so every ring hop goes GPU -> NIC -> NIC -> GPU; its result (per size: time, algbw,
# busbw, wrong elements) and NCCL's transport lines go to stderr. With fewer than 2 GPUs or
# no RDMA device it is skipped, saying why.
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
# or the loopback failed; 2 the check could not run.
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

# The node's NCCL loopback (prober/src/nccl/native.rs runs the same child for certification,
# with prober/src/certify/run.rs's LOOPBACK_ENV), through every active rail.
"$BIN" discover --sysfs-root / --json > "$work/loopback.json" 2>"$work/loopback-discover.err" || true
read -r gpus hcas < <(python3 - "$work/loopback.json" <<'PY' || echo "0 -"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    d = {}
rails = ["%s:%d" % (r["hca"], r["port"]) for r in d.get("rails", []) if r.get("state") == "ACTIVE"]
print(len(d.get("gpus", [])), "=" + ",".join(rails) if rails else "-")
PY
)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "gpu-check: NCCL loopback skipped: it needs at least 2 GPUs, discovery found ${gpus:-0}" >&2
  exit "$rc"
fi
if [ "$hcas" = - ]; then
  echo "gpu-check: NCCL loopback skipped: no active RDMA port (/sys/class/infiniband)" >&2
  exit "$rc"
fi
sizes=$(python3 -c 'print(",".join(str(8 << 20 << i) for i in range(8)))')  # 8 MiB .. 1 GiB
loop=(nccl-ranks --single-node --sizes "$sizes" --warmup 5 --iterations 20)
[ -n "$NCCL" ] && loop+=(--nccl-library "$NCCL")
[ -n "${RAILGUARD_CUDA_LIBRARY:-}" ] && loop+=(--cuda-library "$RAILGUARD_CUDA_LIBRARY")
echo "gpu-check: NCCL loopback: $gpus ranks, NCCL_IB_HCA=$hcas, P2P, SHM and NVLS off" >&2
set +e
env -u NCCL_ENV_PLUGIN NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 \
  NCCL_IB_HCA="$hcas" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
  timeout 300 "$BIN" "${loop[@]}" >"$work/loopback.out" 2>"$work/loopback.log"
lrc=$?
set -e
python3 - "$work/loopback.out" >&2 <<'PY' || lrc=1
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
if not lines:
    print("gpu-check: NCCL loopback printed no result")
    sys.exit(1)
r = json.loads(lines[-1])
if r.get("type") != "result":
    print("gpu-check: NCCL loopback failed: %s" % json.dumps(r))
    sys.exit(1)
print("gpu-check: NCCL loopback result (NCCL %s, %d ranks):" % (r["ncclVersion"], r["nranks"]))
print("  %12s %12s %12s %12s %8s" % ("bytes", "time us", "algbw GB/s", "busbw GB/s", "#wrong"))
wrong = 0
for p in r["points"]:
    wrong += p["wrong"]
    print("  %12d %12.1f %12.2f %12.2f %8d" % (p["bytes"], p["timeUs"], p["algbwGBps"], p["busbwGBps"], p["wrong"]))
print("  " + json.dumps(r))
sys.exit(1 if wrong else 0)
PY
{
  # Every hop should read NET/IB/<its rank's HCA>/GDRDMA; a P2P or SHM hop never left the GPU.
  echo "gpu-check: NCCL loopback transport (NCCL's log):"
  sed -n 's/.* NCCL INFO //p' "$work/loopback.log" \
    | grep -E "^NET/IB : Using|^Using network|GPU Direct RDMA" | sort -u | sed 's/^/  /' \
    || echo "  (no NCCL network lines)"
  echo "gpu-check: NCCL loopback hops by transport:"
  grep -oE "via [A-Za-z]+/[^ ]+" "$work/loopback.log" | sort | uniq -c | sed 's/^/  /' \
    || echo "  (no channel lines)"
} >&2
if [ "$lrc" -eq 124 ]; then
  echo "gpu-check: NCCL loopback timed out after 300 s" >&2
  lrc=1
fi
[ "$lrc" -ne 0 ] && [ "$rc" -eq 0 ] && rc=1
exit "$rc"
