#!/usr/bin/env bash
# Takes down a real local node started by the test harness (`railguard_tests::RealNode`)
# and puts the host back as it was: processes by PID, containers, mounts, network
# namespaces, the CNI bridge, iptables rules, sysctls, cgroups and the host directories
# kubelet and containerd create at fixed paths.
#
# Usage: tests/scripts/real-node-teardown.sh DIR [--all]
#   DIR    the node's work directory (node/*.pid, host-state/, containerd/)
#   --all  also stop the control plane processes (DIR/*.pid): for a run that died
#          without cleaning up (the harness runs this itself before a new start).
# Idempotent; every step tolerates what is already gone.
set -uo pipefail
dir=${1:?usage: real-node-teardown.sh DIR [--all]}
all=${2:-}
state="$dir/host-state"
log() { printf '[real-node-teardown] %s\n' "$*" >&2; }

# Stops a process recorded in a pid file: TERM, then KILL after a few seconds.
stop_pid() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null) || return 0
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$f"
}

# 1. kube-proxy, then its own cleanup of the rules it wrote; kubelet (no restarts of
#    containers behind our back).
stop_pid "$dir/node/kube-proxy.pid"
stop_pid "$dir/node/kubelet.pid"

# 2. Every container process: the node's pod cgroups, in every hierarchy.
for cg in $(find /sys/fs/cgroup -maxdepth 3 -type d -name kubepods 2>/dev/null); do
  find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
done
sock="$dir/containerd/containerd.sock"
if [ -S "$sock" ]; then
  for t in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1
  done
fi
stop_pid "$dir/node/containerd.pid"
pkill -KILL -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null

if [ "$all" = "--all" ]; then
  for f in "$dir"/kube-controller-manager.pid "$dir"/kube-scheduler.pid \
           "$dir"/kube-apiserver.pid "$dir"/etcd.pid; do
    stop_pid "$f"
  done
fi

# 3. Mounts: volumes, container root filesystems, network namespaces (deepest first).
for _ in 1 2 3; do
  mounts=$(awk '{print $2}' /proc/mounts | grep -E "^($dir|/run/containerd|/run/netns|/var/run/netns|/var/lib/kubelet)" | sort -r)
  [ -n "$mounts" ] || break
  for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done
for ns in /run/netns/cni-*; do [ -e "$ns" ] && rm -f "$ns"; done

# 4. Network: the CNI bridge (pod veths went with their namespaces), then iptables and
#    sysctls exactly as they were before the node started.
ip link del cni0 2>/dev/null
if [ -f "$state/iptables.rules" ]; then
  for _ in 1 2 3; do
    iptables-restore < "$state/iptables.rules" 2>/dev/null && \
      ! iptables-save 2>/dev/null | grep -qE '^:(KUBE|CNI)-' && break
    sleep 1
  done
  iptables-save 2>/dev/null | grep -qE '^:(KUBE|CNI)-' && log "iptables still hold KUBE-/CNI- chains"
fi
if [ -f "$state/ip6tables.rules" ]; then
  ip6tables-restore < "$state/ip6tables.rules" 2>/dev/null || true
fi
if [ -f "$state/sysctl" ]; then
  while read -r key value; do
    [ -n "$key" ] && echo "$value" > "/proc/sys/${key//.//}" 2>/dev/null
  done < "$state/sysctl"
fi

# 5. Cgroups the kubelet made (children first).
for cg in $(find /sys/fs/cgroup -maxdepth 3 -type d -name kubepods 2>/dev/null); do
  find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
done

# 6. Host directories that did not exist before the node started.
if [ -f "$state/absent-dirs" ]; then
  while read -r d; do
    [ -n "$d" ] && rm -rf "$d"
  done < "$state/absent-dirs"
fi
rm -f "$state/active"
log "node in $dir is down"
