#!/bin/sh
# Debian packages the prober needs to build (ibverbs-sys) and to run its Soft-RoCE VM test.
set -eu
PKGS="cmake libnl-3-dev libnl-route-3-dev libclang-dev libibverbs-dev \
qemu-system-x86 busybox-static libibverbs1 ibverbs-providers rdma-core iproute2 cpio kmod binutils"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $missing
fi
