#!/bin/bash
# Builds the boot files for the Soft-RoCE test VMs from Debian packages.
#
#   build-image.sh --binary PATH --out DIR [--file SRC=DEST]... [--vm NAME=SCRIPT]...
#
# Prints KERNEL=<path> and, for each --vm, INITRD_<NAME>=<path>.
#
# Cached under ${RAILGUARD_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/railguard/vm}: the Debian
# kernel (linux-image-amd64's current flavour, downloaded with `apt-get download` and unpacked,
# never installed on the host) and a base initramfs (busybox, iproute2's ip and rdma, rdma-core
# userspace with the rxe provider, and the kernel modules Soft-RoCE needs with a generated
# modules.dep). Per call, the test binary (stripped, plus its shared libraries from ldd) and one
# /rg/run.sh per VM are appended as extra cpio archives, which the kernel unpacks in order.
# Each --file (a test double library, say) is copied to DEST inside the VM with its shared
# libraries.
set -euo pipefail

usage() { echo "usage: $0 --binary PATH --out DIR [--file SRC=DEST]... [--vm NAME=SCRIPT]..." >&2; exit 2; }

BINARY="" OUT="" VMS=() FILES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BINARY="${2:-}"; shift 2 ;;
    --out) OUT="${2:-}"; shift 2 ;;
    --vm) VMS+=("${2:-}"); shift 2 ;;
    --file) FILES+=("${2:-}"); shift 2 ;;
    *) usage ;;
  esac
done
[ -n "$BINARY" ] && [ -n "$OUT" ] || usage
[ -x "$BINARY" ] || { echo "build-image: binary $BINARY is not executable" >&2; exit 1; }

for tool in busybox cpio depmod ldd gzip dpkg-deb apt-get strip; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is missing (run prober/vm/install-deps.sh)" >&2; exit 1; }
done

CACHE="${RAILGUARD_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/railguard/vm}"
mkdir -p "$CACHE" "$OUT"
HERE="$(cd "$(dirname "$0")" && pwd)"

# --- kernel ---------------------------------------------------------------------------------
KPKG="${RAILGUARD_VM_KERNEL_PKG:-}"
if [ -z "$KPKG" ]; then
  KPKG="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  if [ -z "$KPKG" ]; then
    apt-get update -q >&2
    KPKG="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  fi
fi
[ -n "$KPKG" ] || { echo "build-image: cannot resolve linux-image-amd64" >&2; exit 1; }
KDIR="$CACHE/$KPKG"
if [ ! -f "$KDIR/.complete" ]; then
  rm -rf "$KDIR" && mkdir -p "$KDIR/deb"
  ( cd "$KDIR/deb" && { apt-get download "$KPKG" >&2 || { apt-get update -q >&2 && apt-get download "$KPKG" >&2; }; } )
  dpkg-deb -x "$KDIR"/deb/*.deb "$KDIR/root"
  rm -rf "$KDIR/deb"
  touch "$KDIR/.complete"
  # Debian moved to a newer kernel: older unpacked kernels are dead weight.
  for old in "$CACHE"/linux-image-*; do
    [ "$old" = "$KDIR" ] || rm -rf "$old"
  done
fi
KVER="$(ls "$KDIR/root/lib/modules" | head -n1)"
KERNEL="$(ls "$KDIR"/root/boot/vmlinuz-* | head -n1)"
[ -n "$KVER" ] && [ -f "$KERNEL" ] || { echo "build-image: kernel package $KPKG has no vmlinuz/modules" >&2; exit 1; }

# Copies FILE and the shared libraries it needs into ROOT, keeping their paths.
copy_with_libs() {
  local root="$1" file="$2" lib
  mkdir -p "$root$(dirname "$file")"
  cp -L "$file" "$root$file"
  for lib in $(ldd "$file" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [ -e "$lib" ] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

pack() { ( cd "$1" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 ) | gzip -1; }

# --- base initramfs ---------------------------------------------------------------------------
pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }
KEY="$( { cat "$0" "$HERE/init"; echo "$KPKG"; for p in busybox-static iproute2 libibverbs1 ibverbs-providers libc6; do pkgver "$p"; done; } | sha256sum | cut -c1-16)"
BASE="$KDIR/base-$KEY.cpio.gz"
if [ ! -f "$BASE" ]; then
  R="$(mktemp -d)"
  trap 'rm -rf "$R"' EXIT
  mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,run,rg,lib/modules}
  cp /bin/busybox "$R/bin/busybox"
  # Applets the init script and the kernel (module autoloading via /sbin/modprobe) need.
  for a in sh mount umount mkdir cat echo sleep poweroff insmod modprobe ls dmesg grep seq \
           tr cut ps kill uname hostname ifconfig; do
    ln -sf busybox "$R/bin/$a"
  done
  ln -sf ../bin/busybox "$R/sbin/modprobe"
  ln -sf ../bin/busybox "$R/sbin/poweroff"
  # iproute2: busybox's ip mishandles some links, and busybox has no rdma.
  copy_with_libs "$R" "$(command -v ip)"
  copy_with_libs "$R" /usr/bin/rdma
  # rdma-core userspace: libibverbs finds providers through /etc/libibverbs.d.
  copy_with_libs "$R" "$(readlink -f /usr/lib/x86_64-linux-gnu/libibverbs.so.1)"
  mkdir -p "$R/etc/libibverbs.d"
  cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
  copy_with_libs "$R" /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
  cp -a /usr/lib/x86_64-linux-gnu/libibverbs.so.1* "$R/usr/lib/x86_64-linux-gnu/" 2>/dev/null || true
  # Kernel modules: NIC, Soft-RoCE and their dependencies; modules.dep generated with depmod
  # (the package ships none).
  M="$KDIR/root/lib/modules/$KVER"
  mkdir -p "$R/lib/modules/$KVER"
  cp "$M"/modules.order "$M"/modules.builtin* "$R/lib/modules/$KVER/" 2>/dev/null || true
  for d in kernel/drivers/infiniband kernel/drivers/net/virtio_net.ko kernel/drivers/net/net_failover.ko \
           kernel/net/core/failover.ko kernel/net/ipv4/udp_tunnel.ko kernel/net/ipv6/ip6_udp_tunnel.ko \
           kernel/drivers/virtio kernel/arch/x86/crypto kernel/crypto kernel/lib; do
    for f in "$M"/$d*; do
      [ -e "$f" ] || continue
      rel="${f#"$M"/}"
      mkdir -p "$R/lib/modules/$KVER/$(dirname "$rel")"
      cp -a "$f" "$R/lib/modules/$KVER/$rel"
    done
  done
  depmod -b "$R" "$KVER"
  cp "$HERE/init" "$R/init"
  chmod 755 "$R/init"
  rm -f "$KDIR"/base-*.cpio.gz
  pack "$R" > "$BASE.tmp" && mv "$BASE.tmp" "$BASE"
  rm -rf "$R"
  trap - EXIT
fi

# --- per-call layers --------------------------------------------------------------------------
B="$(mktemp -d)"
trap 'rm -rf "$B"' EXIT
copy_with_libs "$B" "$(readlink -f "$BINARY")"
mkdir -p "$B/bin"
mv "$B$(readlink -f "$BINARY")" "$B/bin/railguard-rdma-vmtest"
strip --strip-debug "$B/bin/railguard-rdma-vmtest"
for f in "${FILES[@]+"${FILES[@]}"}"; do
  src="${f%%=*}" dest="${f#*=}"
  [ -f "$src" ] && [ "${dest#/}" != "$dest" ] || { echo "build-image: --file $f needs an existing SRC and an absolute DEST" >&2; exit 1; }
  copy_with_libs "$B" "$src"
  mkdir -p "$B$(dirname "$dest")"
  cp -L "$src" "$B$dest"
done
pack "$B" > "$OUT/binary.cpio.gz"

echo "KERNEL=$KERNEL"
for vm in "${VMS[@]+"${VMS[@]}"}"; do
  name="${vm%%=*}" script="${vm#*=}"
  [ -f "$script" ] || { echo "build-image: script $script for VM $name is missing" >&2; exit 1; }
  S="$B/vm-$name"
  mkdir -p "$S/rg"
  cp "$script" "$S/rg/run.sh"
  pack "$S" > "$OUT/$name.cpio.gz"
  cat "$BASE" "$OUT/binary.cpio.gz" "$OUT/$name.cpio.gz" > "$OUT/$name.initrd"
  echo "INITRD_$name=$OUT/$name.initrd"
done
