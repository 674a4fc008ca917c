#!/usr/bin/env bash
# Builds real OCI images of railguard's components (and the few images a real local node
# needs) with buildah, without a registry and without Docker, as OCI archives that
# `ctr -n k8s.io image import` loads under their refs.
#
# Usage: tests/scripts/build-images.sh OUT_DIR [IMAGE...]        (as root)
#        tests/scripts/build-images.sh --runtime-stage DOCKERFILE
#          prints what is read out of DOCKERFILE's runtime stage (see dockerfile_runtime)
#   IMAGE: webhook extender prober prober-sim kube-scheduler pause testbox (default: all)
#   env RAILGUARD_BIN_DIR       cargo-built binaries (default: <repo>/target/debug)
#       RAILGUARD_KUBE_BIN_DIR  holds kube-scheduler
#                               (default: ${XDG_CACHE_HOME:-$HOME/.cache}/railguard/kube-1.20)
#       RAILGUARD_NCCL_LIB_DIR  holds the nvidia-nccl-cu12 wheel's libnccl.so.2 for the prober
#                               image (default: tests/scripts/nccl-wheel.sh's cache, fetched
#                               by it on first use)
# Output: OUT_DIR/<image>.tar (oci-archive, ref inside) and OUT_DIR/images.txt, one
#         "REF ARCHIVE" line per image of this run. buildah's storage is private to
#         OUT_DIR/.buildah; an archive newer than all of its inputs is not rebuilt.
#
# The railguard images mirror the runtime stage of docker/<component>.Dockerfile (the stage
# a plain `docker build` ends in): ENTRYPOINT, USER, EXPOSE and the binary's path are read
# out of the Dockerfile here, not repeated. The Dockerfiles' base images (distroless cc,
# debian bookworm-slim) cannot be pulled here, so the rootfs is made from the host: the
# stripped binary, the shared libraries ldd lists (and the dynamic loader), /etc/passwd and
# /etc/group with uid/gid 65532, CA certificates, /tmp; for the prober also rdma-core's
# userspace (libibverbs providers and /etc/libibverbs.d) and, in the prober image, the
# wheel's libnccl.so.2 where the Dockerfile's nccl stage puts it (byte for byte: the
# certificate's software.libnccl is its sha256). prober-sim leaves that 470 MB library out:
# a simulated node loads the CUDA and NCCL test doubles. tests/tests/images.rs checks the
# result against the Dockerfiles.
set -euo pipefail

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- Dockerfile runtime stage --------------------------------------------------------------
# Prints, for the stage a plain `docker build` ends in (the last stage, following
# `FROM <alias>` back through earlier stages; instructions applied from the first stage of
# the chain on):
#   stage=<first stage of the chain>  entrypoint=<JSON array>  user=<user>  expose=<port[/proto]> ...
#   copy=<source> <dest>   (one line per COPY in the chain)
# Fails if the stage has no exec-form ENTRYPOINT or no USER.
dockerfile_runtime() {
  awk '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
    function instr(s,    kw, rest, w, nw, i, j) {
      s = trim(s)
      if (s == "") return
      kw = toupper(s); sub(/[ \t].*/, "", kw)
      rest = s; sub(/^[^ \t]+[ \t]*/, "", rest); rest = trim(rest)
      if (kw == "FROM") {
        n++
        nw = split(rest, w, /[ \t]+/)
        for (i = 1; i <= nw && w[i] ~ /^--/; i++) {}
        base[n] = tolower(w[i]); alias[n] = ""
        if (i + 2 <= nw && toupper(w[i + 1]) == "AS") alias[n] = tolower(w[i + 2])
        return
      }
      if (n == 0) return            # ARG before the first FROM
      if (kw == "ENTRYPOINT") ent[n] = rest
      else if (kw == "USER") usr[n] = rest
      else if (kw == "EXPOSE") exp_[n] = exp_[n] " " rest
      else if (kw == "COPY") {
        nw = split(rest, w, /[ \t]+/)
        for (i = 1; i <= nw && w[i] ~ /^--/; i++) {}
        for (j = i; j < nw; j++) { ncopy[n]++; copy[n, ncopy[n]] = w[j] " " w[nw] }
      }
    }
    /^[ \t]*#/ { next }              # comments and parser directives
    {
      sub(/\r$/, "")
      if ($0 ~ /\\[ \t]*$/) { l = $0; sub(/\\[ \t]*$/, "", l); buf = buf l " "; next }
      instr(buf $0); buf = ""
    }
    END {
      if (buf != "") instr(buf)
      if (n == 0) { print "no FROM instruction" > "/dev/stderr"; exit 1 }
      # The chain: last stage, then the stage its FROM names, and so on.
      len = 0; cur = n
      while (1) {
        chain[++len] = cur
        found = 0
        for (k = cur - 1; k >= 1; k--) if (alias[k] != "" && alias[k] == base[cur]) { found = k; break }
        if (!found) break
        cur = found
      }
      e = ""; u = ""; nports = 0
      for (i = len; i >= 1; i--) {
        s = chain[i]
        if (s in ent) e = ent[s]
        if (s in usr) u = usr[s]
        np = split(exp_[s], p, /[ \t]+/)
        for (j = 1; j <= np; j++) if (p[j] != "" && !(p[j] in seen)) { seen[p[j]] = 1; ports[++nports] = p[j] }
        for (j = 1; j <= ncopy[s]; j++) print "copy=" copy[s, j]
      }
      # Named like `docker build --target` takes it: the alias, else the 0-based index.
      r = chain[len]; name = alias[r] != "" ? alias[r] : r - 1
      if (e !~ /^\[.*\]$/) { printf "%s: no exec-form (JSON) ENTRYPOINT\n", name > "/dev/stderr"; exit 1 }
      if (u == "") { printf "%s: no USER\n", name > "/dev/stderr"; exit 1 }
      print "stage=" name
      print "entrypoint=" e
      print "user=" u
      line = "expose="
      for (j = 1; j <= nports; j++) line = line (j > 1 ? " " : "") ports[j]
      print line
    }
  ' "$1"
}

# value KEY < dockerfile_runtime output
value() { sed -n "s/^$1=//p" | head -n1; }

if [ "${1:-}" = --runtime-stage ]; then
  [ $# = 2 ] || die "usage: $0 --runtime-stage DOCKERFILE"
  dockerfile_runtime "$2"
  exit
fi
[ $# -ge 1 ] || die "usage: $0 OUT_DIR [IMAGE...]"
[ "$(id -u)" = 0 ] || die "must run as root (buildah with overlay storage)"
command -v buildah >/dev/null || die "buildah is not installed (tests/scripts/install-deps.sh)"

script="$(readlink -f "${BASH_SOURCE[0]}")"
repo="$(cd "$(dirname "$script")/../.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
shift
bin_dir="${RAILGUARD_BIN_DIR:-$repo/target/debug}"
kube_bin_dir="${RAILGUARD_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/railguard/kube-1.20}"
all_images=(webhook extender prober prober-sim kube-scheduler pause testbox)
if [ $# -gt 0 ]; then images=("$@"); else images=("${all_images[@]}"); fi

# One run at a time per OUT_DIR.
exec 9>"$out/.lock"
flock 9

store="$out/.buildah"
mkdir -p "$store/root" "$store/run" "$store/tmp" "$out/rootfs"
# Big temporary files (layer blobs) go under OUT_DIR, not /var/tmp.
export TMPDIR="$store/tmp"
B=(buildah --root "$store/root" --runroot "$store/run" --storage-driver overlay)
# A failed build leaves no working container mounted under OUT_DIR.
trap 'rc=$?; [ "$rc" = 0 ] || "${B[@]}" rm --all >/dev/null 2>&1 || true' EXIT

# --- rootfs helpers ------------------------------------------------------------------------
# Same merged-/usr layout as the host (Debian 12 images have it too).
rootfs_skeleton() {
  local root=$1 d
  rm -rf "$root"
  mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  for d in bin sbin lib lib32 lib64 libx32; do
    if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"; mkdir -p "$root/$(readlink -m "/$d" | sed 's|^/||')"; fi
  done
}

# copy_file ROOT PATH: PATH (symlinks resolved) at the same path under ROOT.
copy_file() {
  local root=$1 path=$2
  mkdir -p "$root/$(dirname "$path")"
  cp -L --preserve=mode "$path" "$root/$path"
}

# copy_libs ROOT ELF...: every shared library ldd lists for the ELF files, and the loader.
copy_libs() {
  local root=$1 libs lib
  shift
  libs="$(
    for f in "$@"; do
      # "libx.so.1 => /path (0x..)", "/lib64/ld-linux-x86-64.so.2 (0x..)", "not a dynamic
      # executable" (static: nothing to copy, ldd exits 1), "libx.so => not found" (fatal).
      ldd "$f" 2>/dev/null | awk -v f="$f" '
        /=> not found/ { print "missing library " $1 " of " f > "/dev/stderr"; exit 3 }
        $2 == "=>" && $3 ~ /^\// { print $3; next }
        $1 ~ /^\// { print $1 }' || { rc=$?; [ "$rc" = 1 ] || exit "$rc"; }
    done | sort -u
  )" || die "ldd $*: a shared library is missing on this host"
  for lib in $libs; do copy_file "$root" "$lib"; done
}

# install_bin ROOT SRC DEST: SRC without debug info (debug builds are huge) at DEST + its libs.
install_bin() {
  local root=$1 src=$2 dest=$3
  mkdir -p "$root/$(dirname "$dest")"
  strip --strip-debug -o "$root/$dest" "$src"
  chmod 0755 "$root/$dest"
  copy_libs "$root" "$src"
}

# users ROOT NAME HOME SHELL: /etc/passwd and /etc/group with root and NAME as 65532:65532.
users() {
  local root=$1 name=$2 home=$3 shell=$4
  printf 'root:x:0:0:root:/root:/sbin/nologin\n%s:x:65532:65532:%s:%s:%s\n' \
    "$name" "$name" "$home" "$shell" >"$root/etc/passwd"
  printf 'root:x:0:\n%s:x:65532:\n' "$name" >"$root/etc/group"
}

ca_certs() {
  local root=$1
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    copy_file "$root" /etc/ssl/certs/ca-certificates.crt
  fi
}

# --- image build ---------------------------------------------------------------------------
listed=()

# fresh ARCHIVE INPUT...: the archive exists and is newer than every input.
fresh() {
  local ar=$1 in
  shift
  [ -f "$ar" ] || return 1
  for in in "$@" "$script"; do [ "$in" -nt "$ar" ] && return 1; done
  return 0
}

# commit SHORT REF ROOTFS [buildah config args...]: image from scratch with ROOTFS as its one
# layer, pushed to OUT_DIR/SHORT.tar.
commit() {
  local short=$1 ref=$2 root=$3 c mnt ar="$out/$1.tar"
  shift 3
  c="$("${B[@]}" from --quiet scratch)"
  # cp -a into the mounted container keeps modes, owners and symlinks as made here.
  mnt="$("${B[@]}" mount "$c")"
  cp -a "$root/." "$mnt/"
  "${B[@]}" umount "$c" >/dev/null
  "${B[@]}" config --created-by "tests/scripts/build-images.sh" "$@" "$c"
  "${B[@]}" commit --quiet --rm "$c" "$ref" >/dev/null
  rm -f "$ar.tmp"
  "${B[@]}" push --quiet "$ref" "oci-archive:$ar.tmp:$ref" >/dev/null
  "${B[@]}" rmi "$ref" >/dev/null 2>&1 || true
  mv -f "$ar.tmp" "$ar"
  rm -rf "$root"
  printf '%-38s built      %s (%s, %ds)\n' "$ref" "$ar" "$(numfmt --to=iec --suffix=B "$(stat -c %s "$ar")")" "$((SECONDS - image_start))"
}

need_file() { [ -f "$1" ] || die "$1 not found ($2)"; }

# railguard SHORT COMPONENT BIN: the image of docker/COMPONENT.Dockerfile's runtime stage.
railguard_image() {
  local short=$1 component=$2 bin=$3 ref="localhost/railguard-$1:dev"
  local dockerfile="$repo/docker/$component.Dockerfile" src="$bin_dir/$bin" extra=()
  local ar="$out/$short.tar" meta dest entry user port args=()
  need_file "$dockerfile" "Dockerfile"
  need_file "$src" "cargo build --workspace --bins, or set RAILGUARD_BIN_DIR"
  if [ "$short" = prober-sim ]; then
    extra=("$bin_dir/all_reduce_perf_sim")
    need_file "${extra[0]}" "cargo build -p railguard-sim --bin all_reduce_perf_sim"
  fi
  local plugin="$bin_dir/librailguard_nccl_env_plugin.so" inputs=() nccl=""
  if [ "$component" = prober ]; then
    need_file "$plugin" "cargo build -p railguard-nccl-env-plugin (the NCCL environment plugin)"
    inputs=("$plugin")
  fi
  if [ "$short" = prober ]; then
    nccl="${RAILGUARD_NCCL_LIB_DIR:-$(bash "$repo/tests/scripts/nccl-wheel.sh" | tail -n1)}/libnccl.so.2"
    need_file "$nccl" "tests/scripts/nccl-wheel.sh caches it, or set RAILGUARD_NCCL_LIB_DIR"
    inputs+=("$nccl")
  fi
  listed+=("$ref $ar")
  if fresh "$ar" "$src" "$dockerfile" "${extra[@]}" "${inputs[@]}"; then
    printf '%-38s up to date %s\n' "$ref" "$ar"
    return
  fi
  meta="$(dockerfile_runtime "$dockerfile")" || die "$dockerfile: cannot read its runtime stage"
  entry="$(value entrypoint <<<"$meta")"
  user="$(value user <<<"$meta")"
  # Where the Dockerfile puts the binary: the COPY whose source is named like it.
  dest="$(sed -n 's/^copy=//p' <<<"$meta" | awk -v b="$bin" '{ n = split($1, s, "/") } s[n] == b { d = $2; if (d ~ /\/$/) d = d b; print d; exit }')"
  [ -n "$dest" ] || die "$dockerfile: no COPY of $bin in its runtime stage"

  local root="$out/rootfs/$short"
  rootfs_skeleton "$root"
  install_bin "$root" "$src" "$dest"
  ca_certs "$root"
  if [ "$component" = prober ]; then
    # The Dockerfile's useradd (--user-group, --no-create-home) and rdma-core's userspace:
    # libibverbs, its providers (dlopened, named by /etc/libibverbs.d/*.driver), their libs.
    users "$root" railguard /home/railguard /usr/sbin/nologin
    local providers=(/usr/lib/x86_64-linux-gnu/libibverbs/*.so) p
    [ -e "${providers[0]}" ] || die "no libibverbs providers on this host (apt-get install ibverbs-providers)"
    for p in "${providers[@]}"; do copy_file "$root" "$p"; done
    copy_libs "$root" "${providers[@]}"
    if [ -d /etc/libibverbs.d ]; then mkdir -p "$root/etc"; cp -a /etc/libibverbs.d "$root/etc/"; fi
    for p in "${extra[@]}"; do install_bin "$root" "$p" "$(dirname "$dest")/$(basename "$p")"; done
    # The NCCL environment plugin where the Dockerfile's COPY puts libnccl-env-railguard.so.
    local plugin_dest
    plugin_dest="$(sed -n 's/^copy=//p' <<<"$meta" | awk '{ n = split($1, s, "/") } s[n] == "libnccl-env-railguard.so" { print $2; exit }')"
    [ -n "$plugin_dest" ] || die "$dockerfile: no COPY of libnccl-env-railguard.so in its runtime stage"
    mkdir -p "$root/$(dirname "$plugin_dest")"
    strip --strip-debug -o "$root/$plugin_dest" "$plugin"
    chmod 0644 "$root/$plugin_dest"
    copy_libs "$root" "$plugin"
    if [ -n "$nccl" ]; then
      # The wheel's NCCL where the Dockerfile's COPY puts libnccl.so.2, unstripped.
      local nccl_dest
      nccl_dest="$(sed -n 's/^copy=//p' <<<"$meta" | awk '{ n = split($1, s, "/") } s[n] == "libnccl.so.2" { print $2; exit }')"
      [ -n "$nccl_dest" ] || die "$dockerfile: no COPY of libnccl.so.2 in its runtime stage"
      mkdir -p "$root/$(dirname "$nccl_dest")"
      cp "$nccl" "$root/$nccl_dest"
      chmod 0644 "$root/$nccl_dest"
      copy_libs "$root" "$nccl"
      # NCCL's BSD licence goes with it where the Dockerfile copies the wheel's licences
      # (caches made before nccl-wheel.sh kept it have none).
      local licences
      licences="$(sed -n 's/^copy=//p' <<<"$meta" | awk '$1 ~ /licenses\/?$/ { print $2; exit }')"
      if [ -n "$licences" ] && [ -f "$(dirname "$nccl")/License.txt" ]; then
        install -D -m 0644 "$(dirname "$nccl")/License.txt" "$root/${licences%/}/License.txt"
      fi
    fi
    args+=(--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  else
    # distroless cc-debian12:nonroot
    users "$root" nonroot /home/nonroot /sbin/nologin
    mkdir -p "$root/home/nonroot"
    chown 65532:65532 "$root/home/nonroot"
    chmod 0700 "$root/home/nonroot"
    args+=(--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --workingdir /home/nonroot)
  fi
  for port in $(value expose <<<"$meta"); do
    case "$port" in */*) ;; *) port="$port/tcp" ;; esac
    args+=(--port "$port")
  done
  commit "$short" "$ref" "$root" --entrypoint "$entry" --cmd '[]' --user "$user" "${args[@]}" \
    --label "io.railguard.dockerfile=docker/$component.Dockerfile" \
    --label "io.railguard.stage=$(value stage <<<"$meta")"
}

kube_scheduler_image() {
  local ref=localhost/kube-scheduler:v1.20.2 ar="$out/kube-scheduler.tar"
  local src="$kube_bin_dir/kube-scheduler" root="$out/rootfs/kube-scheduler"
  need_file "$src" "tests/scripts/control-plane.sh builds it; set RAILGUARD_KUBE_BIN_DIR, or leave kube-scheduler out of the image list"
  listed+=("$ref $ar")
  if fresh "$ar" "$src"; then printf '%-38s up to date %s\n' "$ref" "$ar"; return; fi
  rootfs_skeleton "$root"
  install_bin "$root" "$src" /usr/local/bin/kube-scheduler
  users "$root" nonroot /home/nonroot /sbin/nologin
  ca_certs "$root"
  commit kube-scheduler "$ref" "$root" --env PATH=/usr/local/bin:/bin --cmd '[]'
}

pause_image() {
  local ref=k8s.gcr.io/pause:3.2 ar="$out/pause.tar" root="$out/rootfs/pause"
  listed+=("$ref $ar")
  if fresh "$ar"; then printf '%-38s up to date %s\n' "$ref" "$ar"; return; fi
  command -v cc >/dev/null || die "no C compiler (apt-get install gcc libc6-dev)"
  rm -rf "$root"
  mkdir -p "$root"
  # The sandbox's first process: holds the pod's namespaces, reaps orphans, leaves on
  # SIGTERM/SIGINT.
  cat >"$TMPDIR/pause.c" <<'EOF'
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig)
{
	(void)sig;
	_exit(0);
}

static void reap(int sig)
{
	int saved = errno;

	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

int main(int argc, char **argv)
{
	struct sigaction on_stop, on_child;

	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("pause 3.2 (railguard test build)");
		return 0;
	}
	memset(&on_stop, 0, sizeof(on_stop));
	on_stop.sa_handler = leave;
	sigemptyset(&on_stop.sa_mask);
	memset(&on_child, 0, sizeof(on_child));
	on_child.sa_handler = reap;
	on_child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	sigemptyset(&on_child.sa_mask);
	if (sigaction(SIGTERM, &on_stop, NULL) || sigaction(SIGINT, &on_stop, NULL) ||
	    sigaction(SIGCHLD, &on_child, NULL)) {
		perror("pause: sigaction");
		return 1;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: not running as PID 1\n");
	for (;;)
		pause();
}
EOF
  cc -static -Os -s -o "$root/pause" "$TMPDIR/pause.c"
  commit pause "$ref" "$root" --entrypoint '["/pause"]' --cmd '[]'
}

testbox_image() {
  local ref=localhost/railguard-testbox:dev ar="$out/testbox.tar" root="$out/rootfs/testbox"
  local busybox=/bin/busybox a
  [ -x "$busybox" ] || busybox=/usr/bin/busybox
  need_file "$busybox" "apt-get install busybox-static"
  ! readelf -l "$busybox" | grep -q INTERP || die "$busybox is not static (install busybox-static)"
  listed+=("$ref $ar")
  if fresh "$ar" "$busybox"; then printf '%-38s up to date %s\n' "$ref" "$ar"; return; fi
  rm -rf "$root"
  mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/root"
  chmod 1777 "$root/tmp"
  cp -L "$busybox" "$root/bin/busybox"
  for a in sh env sleep cat ls grep df id wget nc echo hostname mount; do ln -s busybox "$root/bin/$a"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  commit testbox "$ref" "$root" --cmd '["/bin/sh"]' --env PATH=/bin
}

for image in "${images[@]}"; do
  image_start=$SECONDS
  case "$image" in
    webhook) railguard_image webhook webhook railguard-webhook ;;
    extender) railguard_image extender extender railguard-extender ;;
    prober) railguard_image prober prober railguard-prober ;;
    prober-sim) railguard_image prober-sim prober railguard-prober ;;
    kube-scheduler) kube_scheduler_image ;;
    pause) pause_image ;;
    testbox) testbox_image ;;
    *) die "unknown image $image (one of: ${all_images[*]})" ;;
  esac
done
printf '%s\n' "${listed[@]}" >"$out/images.txt.tmp"
mv -f "$out/images.txt.tmp" "$out/images.txt"
