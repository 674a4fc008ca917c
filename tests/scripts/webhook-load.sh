#!/usr/bin/env bash
# The webhook under an independent load generator (issue #16): hey (Go's net/http and TLS, not
# the project's hyper/rustls client) against the http_load bench's server, `/mutate` and the
# `/noop` baseline in the same run on one TLS listener, POSTing the bench's review (the
# kube-apiserver 1.20 review turned into an 8-GPU, 3-container pod).
#
# Usage: tests/scripts/webhook-load.sh
#   env LOAD_REQUESTS       requests per endpoint in the closed loop (default 20000)
#       LOAD_PACED_SECONDS  length of each paced run (default 10)
#       LOAD_RATES          paced total rates, req/s (default "1000 5000")
#       LOAD_CLOSED_ROUNDS  closed-loop rounds per endpoint (default 2)
#       HEY_VERSION         hey to install (default v0.1.5)
#       CARGO_TARGET_DIR    as for cargo
# Runs, each endpoint in turn so drift on the machine hits both alike:
#   closed loop: 10 connections (hey's keep-alive), LOAD_REQUESTS requests, LOAD_CLOSED_ROUNDS
#     rounds in alternating order (noop, mutate; then mutate, noop; ...), so a steady drift
#     of the machine's speed during the run weighs on both endpoints alike
#   paced: 10 connections, RATE req/s in total (hey's -q is per connection: RATE/10 each)
# Prints a table (req/s, p50, p99 per endpoint and run; the /mutate ÷ /noop throughput ratio
# of the closed loop). Fails if any response is not 200 or hey reports errors.
#
# A figure is a result only from a quiet machine: nothing else running, the load average
# (printed before and after) under 1 at the start. hey's latency is from each request's
# actual send, so a paced run that falls behind shows it as a lower req/s, not in p99.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
requests=${LOAD_REQUESTS:-20000}
paced_secs=${LOAD_PACED_SECONDS:-10}
rates=${LOAD_RATES:-"1000 5000"}
closed_rounds=${LOAD_CLOSED_ROUNDS:-2}
conns=10
hey_version=${HEY_VERSION:-v0.1.5}
gobin=${XDG_CACHE_HOME:-$HOME/.cache}/railguard/go/bin
hey=$gobin/hey

if [ ! -x "$hey" ]; then
  echo "installing hey $hey_version into $gobin" >&2
  mkdir -p "$gobin"
  GOBIN=$gobin go install "github.com/rakyll/hey@$hey_version"
fi

# The bench binary itself (not `cargo bench`), so the server is this script's own child.
bin=$(cargo bench -p railguard-webhook-cli --bench http_load --no-run --message-format=json \
  | grep '"name":"http_load"' \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "webhook-load: no http_load bench binary built" >&2; exit 1; }

work=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

LOAD_SERVE_ONLY=1 "$bin" >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
for _ in $(seq 1 300); do
  [ -s "$work/server.out" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.err" >&2; exit 1; }
  sleep 0.1
done
read -r addr _metrics review <"$work/server.out" || true
[ -n "${review:-}" ] && [ -s "$review" ] \
  || { echo "webhook-load: the server did not start: $(cat "$work/server.out" "$work/server.err")" >&2; exit 1; }
echo "server $addr (pid $server_pid), review $(wc -c <"$review") bytes; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# hey ARGS... ENDPOINT: one run; its output goes to $work/last.
run_hey() {
  local endpoint=${*: -1}
  local args=("${@:1:$#-1}")
  # -host: hey sends the Host header as the TLS server name, and the server's certificate is
  # for localhost (with the default, "127.0.0.1:PORT", the TLS handshake is refused).
  "$hey" "${args[@]}" -c "$conns" -host localhost -m POST -T application/json -D "$review" \
    "https://$addr/$endpoint" >"$work/last"
  # Every response 200, no transport errors.
  local codes
  codes=$(awk '/^Status code distribution:/{f=1; next} f && /^ *\[/{print $1} f && /^$/{f=0}' "$work/last" | sort -u | tr '\n' ' ')
  if [ "$codes" != "[200] " ] || grep -q '^Error distribution:' "$work/last"; then
    echo "webhook-load: /$endpoint answered other than 200 (status codes: ${codes:-none})" >&2
    cat "$work/last" >&2
    exit 1
  fi
}

# Fields of the last run: req/s, p50 ms, p99 ms (hey prints "50%% in 0.0005 secs": its
# latencies have 0.1 ms resolution).
stats() {
  awk '/Requests\/sec:/{rps=$2}
       /^ *50%+ in/{p50=$3*1000} /^ *99%+ in/{p99=$3*1000}
       END{printf "%.0f %.1f %.1f", rps, p50, p99}' "$work/last"
}

# Warm-up on both endpoints.
for endpoint in noop mutate; do run_hey -n 2000 "$endpoint"; done

rows=()
declare -A rps
# Closed loop: rounds in alternating order; the ratio is over the sums of all rounds.
rps[closed/noop]=0
rps[closed/mutate]=0
for round in $(seq 1 "$closed_rounds"); do
  order="noop mutate"
  [ $((round % 2)) -eq 0 ] && order="mutate noop"
  for endpoint in $order; do
    run_hey -n "$requests" "$endpoint"
    read -r r p50 p99 <<<"$(stats)"
    rps[closed/$endpoint]=$((rps[closed/$endpoint] + r))
    rows+=("| /$endpoint | closed round $round, $conns conns | $r | $p50 | $p99 |")
  done
done
runs=("closed|")
for rate in $rates; do
  runs+=("paced $rate/s|-q $((rate / conns)) -z ${paced_secs}s")
done
for run in "${runs[@]:1}"; do
  label=${run%%|*}
  read -r -a args <<<"${run#*|}"
  for endpoint in noop mutate; do
    run_hey "${args[@]}" "$endpoint"
    read -r r p50 p99 <<<"$(stats)"
    rps[$label/$endpoint]=$r
    rows+=("| /$endpoint | $label, $conns conns | $r | $p50 | $p99 |")
  done
done

echo
echo "railguard-webhook under hey $hey_version: TLS keep-alive, $conns connections, body $(wc -c <"$review") bytes"
echo "| endpoint | run | req/s | p50 ms | p99 ms |"
echo "|---|---|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
echo
for run in "${runs[@]}"; do
  label=${run%%|*}
  awk -v m="${rps[$label/mutate]}" -v n="${rps[$label/noop]}" -v l="$label" \
    'BEGIN{printf "/mutate ÷ /noop throughput, %s: %.2f (%s vs %s req/s)\n", l, m / n, m, n}'
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
