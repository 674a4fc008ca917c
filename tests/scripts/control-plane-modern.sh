#!/usr/bin/env bash
# Builds (once) and caches a modern Kubernetes control plane: kube-apiserver, kube-scheduler,
# kube-controller-manager and the etcd that release supports, from the Go module proxy,
# with the versions pinned in tests/k8s-modern/go.mod and go.sum (k8s.io/kubernetes, every
# k8s.io staging module, go.etcd.io/etcd/server/v3). The 1.20 floor is control-plane.sh's.
#
# Usage: tests/scripts/control-plane-modern.sh     # prints the cache dir on success
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/railguard/kube-<minor>/<binary>, e.g. kube-1.37;
#        the Go module and build caches in ${XDG_CACHE_HOME:-$HOME/.cache}/railguard/go.
# A cached run only compares the stamp (a hash of go.mod and go.sum) and exits.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$(cd "$here/../k8s-modern" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/railguard"
log() { printf '[control-plane-modern] %s\n' "$*" >&2; }

# The versions, from go.mod (no go command needed for a cached run).
modver() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$mod/go.mod"; }
kube_version=$(modver k8s.io/kubernetes)   # v1.37.2
etcd_version=$(modver go.etcd.io/etcd/server/v3)
[ -n "$kube_version" ] && [ -n "$etcd_version" ] || { log "no versions in $mod/go.mod"; exit 1; }
minor=$(echo "$kube_version" | sed -E 's/^v([0-9]+)\.([0-9]+)\..*/\1.\2/')
bin="$cache/kube-$minor"
binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd)
stamp="kubernetes $kube_version etcd $etcd_version $(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-16)"
cached() {
  for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done
  [ "$(cat "$bin/STAMP" 2>/dev/null)" = "$stamp" ]
}

if cached; then
  log "using cached binaries in $bin ($stamp)"
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/kube-$minor.lock"
flock 9
if cached; then # another run built them while this one waited
  echo "$bin"
  exit 0
fi

command -v openssl >/dev/null 2>&1 || {
  log "installing openssl"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends openssl >&2
}

# Go: the go line of go.mod is the minimum.
need_go=$(awk '$1 == "go" { print $2; exit }' "$mod/go.mod")
# shellcheck source=go-toolchain.sh
. "$here/go-toolchain.sh"
use_go_toolchain "$need_go" "$cache"
# -mod=readonly: build exactly what go.mod and go.sum pin, never edit them.
export GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 GOWORK=off
log "Go $(go env GOVERSION) (go.mod wants >= $need_go, GOTOOLCHAIN=$GOTOOLCHAIN)"

# As Kubernetes' own release build does (hack/lib/golang.sh, hack/lib/version.sh): version
# stamped into the binaries, stripped, trimmed paths, the same build tags.
major=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=${minor#*.}"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done
tmp="$bin.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
start=$(date +%s)
cd "$mod"
log "building kube-apiserver, kube-scheduler, kube-controller-manager $kube_version (long the first time)"
nice -n 10 go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="all=$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager >&2
log "building etcd $etcd_version"
nice -n 10 go build -trimpath -ldflags="-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 >&2
"$tmp/kube-apiserver" --version >&2
"$tmp/etcd" --version >&2
mkdir -p "$bin"
for b in "${binaries[@]}"; do mv -f "$tmp/$b" "$bin/$b"; done
rm -rf "$tmp"
echo "$stamp" > "$bin/STAMP"
log "built in $(($(date +%s) - start)) s; cached in $bin"
echo "$bin"
