#!/usr/bin/env bash
# Builds (once) and caches the real Kueue controller manager the Kueue end-to-end test runs
# (tests/tests/kueue_e2e.rs) on the 1.37 control plane, from the Go module proxy:
# - kueue: sigs.k8s.io/kueue/cmd/kueue at v0.17.0, the newest release the proxy serves
#   (`go list -m -versions sigs.k8s.io/kueue`, 2026-12). Built from Kueue's own go.mod and
#   go.sum (`go install …@version`: its go.mod has no replace directives), static and
#   stripped, with the version stamp of Kueue's Makefile (pkg/version).
# - crds/: the module's own CustomResourceDefinitions (config/components/crd/bases), the
#   ones `kubectl apply --server-side -f manifests.yaml` installs from a Kueue release.
#
# Usage: tests/scripts/kueue.sh      # prints the directory holding kueue and crds/, last line
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/railguard/kueue-<version>/{kueue,crds/,STAMP}; the Go
#        module and build caches are control-plane-modern.sh's (…/railguard/go).
set -euo pipefail

cache="${XDG_CACHE_HOME:-$HOME/.cache}/railguard"
log() { printf '[kueue] %s\n' "$*" >&2; }

kueue_version=v0.17.0
# `go mod download -json sigs.k8s.io/kueue@v0.17.0`'s Sum, checked by the checksum database
# on the day it was pinned: a proxy serving other bytes under this version fails the build.
kueue_sum='h1:7hzb38M4eKGzYW+CFv2s1L+swzzacUCHOCXxZmAV90I='
bin="$cache/kueue-$kueue_version"
stamp="kueue $kueue_version $kueue_sum"
cached() {
  [ -x "$bin/kueue" ] && [ -d "$bin/crds" ] && [ "$(cat "$bin/STAMP" 2>/dev/null)" = "$stamp" ]
}

if cached; then
  log "using cached kueue in $bin ($stamp)"
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/kueue-$kueue_version.lock"
flock 9
if cached; then # another run built it while this one waited
  echo "$bin"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "no go command on PATH (Go >= 1.25 needed)"; exit 1; }
# Kueue's go.mod names go 1.25.0: the machine's Go (1.26) builds it as it is.
export GOTOOLCHAIN="${RAILGUARD_GOTOOLCHAIN:-local}"
export GOPATH="$cache/go" GOMODCACHE="$cache/go/pkg/mod" GOCACHE="$cache/go/build-cache"
export CGO_ENABLED=0 GOWORK=off
log "Go $(go env GOVERSION) (GOTOOLCHAIN=$GOTOOLCHAIN)"

tmp="$bin.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/crds"

start=$(date +%s)
download=$(cd "$tmp" && GOFLAGS= go mod download -json "sigs.k8s.io/kueue@$kueue_version")
sum=$(printf '%s\n' "$download" | awk -F'"' '$2 == "Sum" { print $4 }')
src=$(printf '%s\n' "$download" | awk -F'"' '$2 == "Dir" { print $4 }')
[ "$sum" = "$kueue_sum" ] || { log "sigs.k8s.io/kueue@$kueue_version hashes to '$sum', pinned $kueue_sum"; exit 1; }
log "building kueue $kueue_version (a few minutes the first time)"
# Kueue's Makefile: LD_FLAGS stamp pkg/version.GitVersion and GitCommit.
kv=sigs.k8s.io/kueue/pkg/version
(cd "$tmp" && GOBIN="$tmp" GOFLAGS=-buildvcs=false nice -n 10 go install -trimpath \
  -ldflags="-w -s -X $kv.GitVersion=$kueue_version -X $kv.GitCommit=release" \
  "sigs.k8s.io/kueue/cmd/kueue@$kueue_version" >&2)
log "kueue built in $(($(date +%s) - start)) s"
cp "$src"/config/components/crd/bases/*.yaml "$tmp/crds/"
chmod -R u+w "$tmp/crds"

mkdir -p "$bin"
rm -rf "$bin/crds"
mv -f "$tmp/kueue" "$bin/kueue"
mv "$tmp/crds" "$bin/crds"
echo "$stamp" >"$bin/STAMP"
rm -rf "$tmp"
echo "$bin"
