#!/usr/bin/env bash
# Builds (once) and caches the real Helm and kubectl the chart tests run (tests/tests/chart_e2e.rs:
# helm lint --strict, helm template, kubectl apply --dry-run=server), both from the Go module
# proxy:
# - helm: helm.sh/helm/v4/cmd/helm at v4.3.2, the newest v4 release the proxy serves
#   (`go list -m -versions helm.sh/helm/v4`, 2026-12: v4.2.1 ... v4.3.2). Helm 4 is the current
#   major (v3 gets fixes only), and v4.3.2's own go.mod pins the k8s.io modules at v0.37.2, the
#   release of the modern control plane, so its client and capabilities match the newest server
#   under test. Built from Helm's own go.mod and go.sum (`go install …@version`, no replace
#   directives), with the flags of Helm's Makefile; the module's hash is pinned below.
# - kubectl: k8s.io/kubernetes/cmd/kubectl from tests/k8s-modern-kubectl, whose go.mod is
#   tests/k8s-modern's (the module graph control-plane-modern.sh builds the 1.37 kube-apiserver
#   from) plus what kubectl alone needs (kustomize, cli-runtime, ...), with the same version
#   stamp and build tags. A module both list at different versions fails the build: update
#   both together (copy k8s-modern's go.mod, then `go mod tidy` there).
#
# Usage: tests/scripts/helm.sh      # prints the directory holding helm and kubectl, last line
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/railguard/helm-<helm version>/{helm,kubectl};
#        the Go module and build caches are control-plane-modern.sh's (…/railguard/go), so
#        kubectl reuses the packages the control plane build compiled.
# A cached run only compares the stamp (the versions and a hash of the kubectl module) and exits.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$(cd "$here/../k8s-modern-kubectl" && pwd)"
control_plane_mod="$(cd "$here/../k8s-modern" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/railguard"
log() { printf '[helm] %s\n' "$*" >&2; }

helm_version=v4.3.2
# `go mod download -json helm.sh/helm/v4@v4.3.2`'s Sum, checked by the checksum database on
# the day it was pinned: a proxy serving other bytes under this version fails the build.
helm_sum='h1:zdd8DgKTlLrlYIzdoAntDHLH0V3RkgNIpQ3yjzuD84M='
kube_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$mod/go.mod")
[ -n "$kube_version" ] || { log "no k8s.io/kubernetes version in $mod/go.mod"; exit 1; }
bin="$cache/helm-$helm_version"
stamp="helm $helm_version kubectl $kube_version $(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-16)"
cached() {
  [ -x "$bin/helm" ] && [ -x "$bin/kubectl" ] && [ "$(cat "$bin/STAMP" 2>/dev/null)" = "$stamp" ]
}

if cached; then
  log "using cached helm and kubectl in $bin ($stamp)"
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/helm-$helm_version.lock"
flock 9
if cached; then # another run built them while this one waited
  echo "$bin"
  exit 0
fi

# Both modules name go 1.26.0.
# shellcheck source=go-toolchain.sh
. "$here/go-toolchain.sh"
use_go_toolchain 1.26.0 "$cache"
export CGO_ENABLED=0 GOWORK=off
log "Go $(go env GOVERSION) (GOTOOLCHAIN=$GOTOOLCHAIN)"

# The two graphs agree: every module both select (replacements applied) at one version.
graph() {
  (cd "$1" && GOFLAGS="-mod=readonly" go list -m \
    -f '{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' all | sort -u)
}
skew=$(join <(graph "$mod") <(graph "$control_plane_mod") | awk '$2 != $3')
[ -z "$skew" ] || {
  log "kubectl's and the control plane's module versions differ (module, kubectl's, the control plane's):"
  log "$skew"
  exit 1
}

tmp="$bin.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"

start=$(date +%s)
sum=$(cd "$tmp" && GOFLAGS= go mod download -json "helm.sh/helm/v4@$helm_version" |
  awk -F'"' '$2 == "Sum" { print $4 }')
[ "$sum" = "$helm_sum" ] || { log "helm.sh/helm/v4@$helm_version hashes to '$sum', pinned $helm_sum"; exit 1; }
log "building helm $helm_version"
# Helm's Makefile: static, trimmed, stripped, the release version stamped in (a tagged build
# clears the "unreleased" metadata).
hv=helm.sh/helm/v4/internal/version
(cd "$tmp" && GOBIN="$tmp" GOFLAGS=-buildvcs=false nice -n 10 go install -trimpath \
  -ldflags="-w -s -X $hv.version=$helm_version -X $hv.metadata= -X $hv.gitTreeState=clean" \
  "helm.sh/helm/v4/cmd/helm@$helm_version" >&2)
helm_s=$(($(date +%s) - start))
log "helm built in $helm_s s"

start=$(date +%s)
log "building kubectl $kube_version from $mod"
# control-plane-modern.sh's stamp and tags (Kubernetes' hack/lib/golang.sh, hack/lib/version.sh).
minor=$(echo "$kube_version" | sed -E 's/^v([0-9]+)\.([0-9]+)\..*/\1.\2/')
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=${minor%%.*} -X $pkg.gitMinor=${minor#*.}"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done
# -mod=readonly: exactly what go.mod and go.sum pin, never edit them.
(cd "$mod" && GOFLAGS="-mod=readonly -buildvcs=false" nice -n 10 go build -trimpath \
  -tags=selinux,notest,grpcnotrace -ldflags="all=$ldflags" -o "$tmp/kubectl" \
  k8s.io/kubernetes/cmd/kubectl >&2)
log "kubectl built in $(($(date +%s) - start)) s"

"$tmp/helm" version >&2
"$tmp/kubectl" version --client >&2
mkdir -p "$bin"
for b in helm kubectl; do mv -f "$tmp/$b" "$bin/$b"; done
rm -rf "$tmp"
echo "$stamp" > "$bin/STAMP"
log "cached in $bin"
echo "$bin"
