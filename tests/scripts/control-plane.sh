#!/usr/bin/env bash
# Builds (once) and caches a real Kubernetes 1.20 control plane and node from Debian's
# `kubernetes` source package (kube-apiserver, kube-scheduler, kube-controller-manager,
# kubelet, kube-proxy), and makes sure etcd is installed.
#
# Usage: tests/scripts/control-plane.sh            # prints the cache dir on success
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/railguard/kube-1.20/<binary>
# The machine's apt configuration is not changed: deb-src lists live in a private dir.
set -euo pipefail

cache="${XDG_CACHE_HOME:-$HOME/.cache}/railguard"
bin="$cache/kube-1.20"
log() { printf '[control-plane] %s\n' "$*" >&2; }
binaries=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy)
cached() { for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done; }

need_pkgs=()
command -v etcd >/dev/null 2>&1 || need_pkgs+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
if ! cached; then
  # Kubernetes 1.20's build needs Debian's Go 1.19, not the machine's newer default Go.
  [ -x /usr/lib/go-1.19/bin/go ] || need_pkgs+=(golang-1.19-go)
  command -v rsync >/dev/null 2>&1 || need_pkgs+=(rsync)
  command -v dpkg-source >/dev/null 2>&1 || need_pkgs+=(dpkg-dev)
  [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need_pkgs+=(golang-github-modern-go-reflect2-dev)
  command -v make >/dev/null 2>&1 || need_pkgs+=(make)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
fi

if cached; then
  log "using cached binaries in $bin"
  echo "$bin"
  exit 0
fi

work="$cache/build"
rm -rf "$work"
mkdir -p "$work/apt/lists/partial" "$work/apt/archives/partial" "$work/src"

# A private deb-src list for the same suites the machine uses.
suites=$(. /etc/os-release && echo "$VERSION_CODENAME")
cat > "$work/apt/sources.list" <<SRC
deb-src http://deb.debian.org/debian $suites main
deb-src http://deb.debian.org/debian $suites-updates main
deb-src http://deb.debian.org/debian-security $suites-security main
SRC
aptopts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
         -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::Archives=$work/apt/archives"
         -o "APT::Get::List-Cleanup=0")
log "fetching Debian's kubernetes source package"
apt-get "${aptopts[@]}" update -qq >&2
(cd "$work/src" && apt-get "${aptopts[@]}" source -qq kubernetes >&2)
srcdir=$(find "$work/src" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -n1)
[ -n "$srcdir" ] || { log "kubernetes source was not unpacked"; exit 1; }
log "source in $srcdir"

# reflect2 1.0.1 crashes kube-apiserver built with Go >= 1.18 when a webhook returns a patch.
rm -rf "$srcdir/vendor/github.com/modern-go/reflect2"
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$srcdir/vendor/github.com/modern-go/reflect2"

log "building ${binaries[*]} (takes several minutes the first time)"
cd "$srcdir"
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
PATH="/usr/lib/go-1.19/bin:$PATH" GOPATH="$PWD/.go" GOFLAGS=-mod=vendor GO111MODULE=auto CGO_ENABLED=0 \
  make WHAT="${binaries[*]/#/cmd/}" >&2
mkdir -p "$bin"
for b in "${binaries[@]}"; do
  f=$(find "$srcdir/_output" -type f -name "$b" -perm -u+x | head -n1)
  [ -n "$f" ] || { log "build produced no $b"; exit 1; }
  cp "$f" "$bin/$b.tmp" && mv "$bin/$b.tmp" "$bin/$b"
done
rm -rf "$work"
log "cached in $bin"
echo "$bin"
