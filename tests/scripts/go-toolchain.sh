# Sourced by control-plane-modern.sh and helm.sh (after they define `log`), not run.
#
# use_go_toolchain NEED CACHE: the go command for a module that wants Go >= NEED. An older go
# command fetches an approved toolchain from the module proxy instead (GOTOOLCHAIN);
# RAILGUARD_GOTOOLCHAIN overrides. Go's module and build caches go under CACHE/go.
go_older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$1" ]; }
use_go_toolchain() {
  local need=$1 cache=$2 have
  command -v go >/dev/null 2>&1 || { log "no go command on PATH (Go >= 1.21 needed, it fetches newer toolchains)"; exit 1; }
  have=$(GOTOOLCHAIN=local go env GOVERSION | sed 's/^go//')
  if [ -n "${RAILGUARD_GOTOOLCHAIN:-}" ]; then
    export GOTOOLCHAIN="$RAILGUARD_GOTOOLCHAIN"
  elif go_older "$have" "$need"; then
    export GOTOOLCHAIN=go1.27.3
  else
    export GOTOOLCHAIN=local
  fi
  export GOPATH="$cache/go" GOMODCACHE="$cache/go/pkg/mod" GOCACHE="$cache/go/build-cache"
}
