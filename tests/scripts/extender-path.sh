#!/usr/bin/env bash
# The extender's round trip as kube-scheduler pays it (issue #16): a sidecar on localhost
# against a Service path, measured with hey (an independent client, Go's net/http like
# kube-scheduler's) at one request at a time, as the scheduler calls its extender.
#
# Service path, on this one machine: the extender in its own network namespace behind a veth
# pair (a pod's network), reached through an iptables DNAT from a virtual Service IP (what
# kube-proxy's iptables mode installs). A real Service to a pod on another node adds the
# fabric's round trip on top. Needs root, iproute2 and iptables.
#
# Usage: tests/scripts/extender-path.sh        (release build of railguard-extender)
#   env LOAD_REQUESTS  requests per path (default 20000)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
requests=${LOAD_REQUESTS:-20000}
gobin=${XDG_CACHE_HOME:-$HOME/.cache}/railguard/go/bin
hey=$gobin/hey
[ -x "$hey" ] || { mkdir -p "$gobin"; GOBIN=$gobin go install github.com/rakyll/hey@v0.1.5; }
target=${CARGO_TARGET_DIR:-$repo/target}
bin=$target/release/railguard-extender
[ -x "$bin" ] || cargo build --release -p railguard-extender-cli --bin railguard-extender
body=$repo/extender/fixtures/extender-args-sample.json
profiles=$repo/api/fixtures/profiles/dgx-h100-ndr.yaml

ns=rg-extender-path
svc_ip=10.96.203.10
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  iptables -t nat -D OUTPUT -d "$svc_ip/32" -p tcp --dport 80 -j DNAT --to-destination 10.203.0.2:8888 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
cleanup

ip netns add "$ns"
ip link add rg-ext-h type veth peer name rg-ext-p
ip link set rg-ext-p netns "$ns"
ip addr add 10.203.0.1/30 dev rg-ext-h
ip link set rg-ext-h up
ip -n "$ns" addr add 10.203.0.2/30 dev rg-ext-p
ip -n "$ns" link set rg-ext-p up
ip -n "$ns" link set lo up
# Replies go back to whatever source address the host picked for the Service IP.
ip -n "$ns" route add default via 10.203.0.1
iptables -t nat -A OUTPUT -d "$svc_ip/32" -p tcp --dport 80 -j DNAT --to-destination 10.203.0.2:8888

"$bin" --standalone --profiles "$profiles" --listen 127.0.0.1:18888 --metrics-listen 127.0.0.1:19090 >/dev/null 2>&1 &
pids+=($!)
ip netns exec "$ns" "$bin" --standalone --profiles "$profiles" --listen 10.203.0.2:8888 --metrics-listen 127.0.0.1:9090 >/dev/null 2>&1 &
pids+=($!)
for url in http://127.0.0.1:18888 "http://$svc_ip:80"; do
  for _ in $(seq 1 100); do
    curl -sf --max-time 2 -o /dev/null -X POST --data-binary @"$body" "$url/filter" && break
    sleep 0.1
  done
done

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# One request at a time, so the mean round trip is 1 / (req/s), exact; hey's percentiles
# have 0.1 ms resolution.
printf '| path | requests | req/s | mean round trip | p50 | p99 |\n|---|---|---|---|---|---|\n'
for path in sidecar service; do
  case $path in
    sidecar) url=http://127.0.0.1:18888/filter ;;
    service) url=http://$svc_ip:80/filter ;;
  esac
  out=$("$hey" -n "$requests" -c 1 -m POST -T application/json -D "$body" "$url")
  codes=$(awk '/^Status code distribution:/{f=1; next} f && /^ *\[/{print $1} f && /^$/{f=0}' <<<"$out" | sort -u | tr '\n' ' ')
  if [ "$codes" != "[200] " ] || grep -q '^Error distribution:' <<<"$out"; then
    echo "extender-path: $path: not every response was 200: $out" >&2
    exit 1
  fi
  rps=$(awk '/Requests\/sec:/{printf "%.0f", $2}' <<<"$out")
  mean=$(awk '/Requests\/sec:/{printf "%.1f µs", 1e6 / $2}' <<<"$out")
  # hey prints "50%% in 0.0005 secs".
  pct() { awk -v p="$1" '$1 ~ "^"p"%+$" && $2=="in"{printf "%.1f ms", $3*1000}' <<<"$out"; }
  printf '| %s | %s | %s | %s | %s | %s |\n' "$path" "$requests" "$rps" "$mean" "$(pct 50)" "$(pct 99)"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
