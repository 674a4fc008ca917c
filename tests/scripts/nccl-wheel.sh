#!/usr/bin/env bash
# Downloads (once) NVIDIA's PyPI wheel nvidia-nccl-cu12==2.32.3, checks its sha256 and caches
# the real NCCL library it ships (nvidia/nccl/lib/libnccl.so.2). The prober image of
# tests/scripts/build-images.sh carries it, as docker/prober.Dockerfile's image does (the
# Dockerfile pins the same version and sha256: tests/tests/images.rs holds them equal), and
# the NCCL environment plugin's integration test (nccl-env/plugin/tests/real_nccl.rs) loads
# it; NCCL runs without a GPU as far as ncclGetUniqueId, which is where it asks the env
# plugin for its bootstrap variables.
#
# Usage: tests/scripts/nccl-wheel.sh            # prints the cache dir on stdout's last line
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/railguard/nccl-2.32.3/libnccl.so.2 (and License.txt)
# Needs: pip (python3 -m pip) and network access to PyPI on the first run (about 350 MB).
set -euo pipefail

version=2.32.3
cache="${XDG_CACHE_HOME:-$HOME/.cache}/railguard"
dir="$cache/nccl-$version"
log() { printf '[nccl-wheel] %s\n' "$*" >&2; }

if [ -s "$dir/libnccl.so.2" ]; then
  log "using cached $dir/libnccl.so.2"
  echo "$dir"
  exit 0
fi

# The wheel's sha256 as PyPI's simple index lists it
# (https://pypi.org/simple/nvidia-nccl-cu12/, PEP 691 JSON, 2026-12).
case "$(uname -m)" in
  x86_64)
    wheel="nvidia_nccl_cu12-$version-py3-none-manylinux_2_27_x86_64.whl"
    sha256=bb94b2348e4861d5e8aa00b36c3d12d9bdf9c6369b82cbb723de0b582280a21c ;;
  aarch64)
    wheel="nvidia_nccl_cu12-$version-py3-none-manylinux_2_27_aarch64.whl"
    sha256=061af42ae1044816820e16b872075e243d1ac0656f51860fbc8e106c257aa83a ;;
  *) log "no nvidia-nccl-cu12 wheel for $(uname -m)"; exit 1 ;;
esac

pip=(python3 -m pip)
"${pip[@]}" --version >/dev/null 2>&1 || { log "pip is missing (python3 -m pip)"; exit 1; }

mkdir -p "$cache"
work=$(mktemp -d "$cache/nccl-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "downloading nvidia-nccl-cu12==$version (about 350 MB)"
"${pip[@]}" download --no-deps --only-binary=:all: --no-cache-dir \
  -d "$work" "nvidia-nccl-cu12==$version" >&2
[ -f "$work/$wheel" ] || { log "pip did not download $wheel: got $(ls "$work")"; exit 1; }

got=$(sha256sum "$work/$wheel" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
  log "sha256 mismatch for $wheel: got $got, want $sha256"
  exit 1
fi
log "sha256 $got ok"

# A wheel is a zip; python3 is there (pip needs it), unzip may not be. NCCL's BSD licence
# (the wheel's dist-info/licenses/License.txt) goes with the library into the prober image.
python3 - "$work/$wheel" "$work/libnccl.so.2" "$work/License.txt" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    with z.open("nvidia/nccl/lib/libnccl.so.2") as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
    for name in z.namelist():
        if name.rsplit("/", 1)[-1].lower().startswith("license"):
            with z.open(name) as src, open(sys.argv[3], "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
mkdir -p "$dir"
if [ -f "$work/License.txt" ]; then mv "$work/License.txt" "$dir/License.txt"; fi
# Renamed into place last, so a cut-off run never leaves a partial library in the cache.
mv "$work/libnccl.so.2" "$dir/libnccl.so.2"
log "cached in $dir"
echo "$dir"
