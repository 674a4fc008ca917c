# syntax=docker/dockerfile:1
# railguard-prober: node discovery, certification, campaign peer endpoint and coordinator.
#
# Build from the repository root:
#   docker build -f docker/prober.Dockerfile -t railguard-prober .
#
# The default image has the prober, rdma-core's userspace (libibverbs + mlx5 provider) and
# NCCL: libnccl.so.2 of NVIDIA's PyPI wheel nvidia-nccl-cu12 (BSD-licensed; version and
# sha256 pinned below and in tests/scripts/nccl-wheel.sh, its licence files in
# /usr/share/doc/nccl) at /usr/lib/railguard/nccl/libnccl.so.2, which the prober loads when
# no --nccl-library is given. That is enough for discovery, passive rail checks, the native
# RDMA engine, the native NCCL loopback (certification.ncclRunner: Native, the default) and
# the campaign. The CUDA driver and NVML come from the driver that the NVIDIA container
# runtime mounts at run time (the chart sets runtimeClassName: nvidia). To certify with the
# node's own NCCL instead, the chart mounts it (prober.gpuLibraries.ncclLibrary).
#
# nccl-tests and perftest: NCCL is a user-space library, and the NCCL that certification
# uses should be the one your training images use. Profiles with ncclRunner: NcclTests run
# all_reduce_perf; build the `with-nccl-tests` target with the CUDA and NCCL versions of
# your training images:
#
#   docker build -f docker/prober.Dockerfile --target with-nccl-tests \
#     --build-arg CUDA_IMAGE=nvcr.io/nvidia/cuda:12.6.3-devel-ubuntu24.04 \
#     --build-arg NCCL_VERSION=2.23.4-1+cuda12.6 \
#     --build-arg NCCL_TESTS_REF=v2.13.11 --build-arg PERFTEST_REF=24.07.0-0.44 \
#     -t railguard-prober:nccl-2.23.4 .
#
# It installs libnccl2/libnccl-dev of exactly NCCL_VERSION from NVIDIA's CUDA apt repository
# (already configured in the CUDA images), builds nccl-tests (`all_reduce_perf` and friends,
# without MPI: the prober runs single-node tests; the 2-node test runs as an MPIJob) into
# /usr/local/bin — the profile's `certification.ncclTests.binary` default — and perftest
# with CUDA support (`ib_write_bw --use_cuda`) for GPUDirect checks by hand. Check the
# versions with `railguard-prober certify`: the certificate records the NCCL version seen in
# the NCCL log and the digest of the nccl-tests binary.
#
# The prober binary is built on Debian bookworm (glibc 2.36); the CUDA images must have at
# least that glibc (Ubuntu 24.04 based ones do; 22.04 ones do not).
ARG RUST_VERSION=1.89
ARG CUDA_IMAGE=nvcr.io/nvidia/cuda:12.6.3-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvcr.io/nvidia/cuda:12.6.3-runtime-ubuntu24.04

FROM rust:${RUST_VERSION}-bookworm AS build
# ibverbs-sys generates bindings and builds against rdma-core (its cmake finds libnl with
# pkg-config).
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake pkg-config clang libclang-dev libnl-3-dev libnl-route-3-dev libibverbs-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p railguard-prober-cli --bin railguard-prober \
 && cargo build --release --locked -p railguard-nccl-env-plugin --lib \
 && install -D -m 0755 target/release/railguard-prober /out/railguard-prober \
 && install -D -m 0644 target/release/librailguard_nccl_env_plugin.so /out/libnccl-env-railguard.so

# NCCL of the default image: the wheel downloaded by pip with its hash required (either
# architecture's sha256 as PyPI's simple index lists it), and its libnccl.so.2 extracted.
FROM debian:bookworm-slim AS nccl
ARG NCCL_WHEEL_VERSION=2.32.3
ARG NCCL_WHEEL_SHA256_AMD64=bb94b2348e4861d5e8aa00b36c3d12d9bdf9c6369b82cbb723de0b582280a21c
ARG NCCL_WHEEL_SHA256_ARM64=061af42ae1044816820e16b872075e243d1ac0656f51860fbc8e106c257aa83a
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN printf 'nvidia-nccl-cu12==%s --hash=sha256:%s --hash=sha256:%s\n' \
      "${NCCL_WHEEL_VERSION}" "${NCCL_WHEEL_SHA256_AMD64}" "${NCCL_WHEEL_SHA256_ARM64}" >/tmp/nccl.txt \
 && python3 -m pip download --no-deps --only-binary=:all: --no-cache-dir --require-hashes \
      -r /tmp/nccl.txt -d /wheel \
 && python3 -c "import glob, zipfile; z = zipfile.ZipFile(glob.glob('/wheel/*.whl')[0]); [z.extract(n, '/x') for n in z.namelist() if n == 'nvidia/nccl/lib/libnccl.so.2' or n.rsplit('/', 1)[-1].upper().startswith('LICENSE')]" \
 && install -D -m 0644 /x/nvidia/nccl/lib/libnccl.so.2 /out/libnccl.so.2 \
 && mkdir -p /out/licenses && find /x -iname 'license*' -type f -exec cp {} /out/licenses/ \;

# Default image. The DaemonSet runs it as root only for IPC_LOCK (an added capability is not
# effective for a non-root user); the campaign coordinator runs it as 65532.
FROM debian:bookworm-slim AS prober
RUN apt-get update \
 && apt-get install -y --no-install-recommends libibverbs1 ibverbs-providers rdma-core ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin railguard
COPY --from=build /out/railguard-prober /usr/local/bin/railguard-prober
# The NCCL environment plugin, under the name NCCL's loader opens (NCCL_ENV_PLUGIN=railguard):
# the daemon copies it onto the node (--nccl-plugin-source, --nccl-plugin-install-dir) for
# training containers to mount. Built on bookworm: it needs glibc 2.36 or newer there.
COPY --from=build /out/libnccl-env-railguard.so /usr/lib/railguard/libnccl-env-railguard.so
# The NCCL the prober loads by default (railguard_gpu::BUNDLED_NCCL_LIBRARY).
COPY --from=nccl /out/libnccl.so.2 /usr/lib/railguard/nccl/libnccl.so.2
COPY --from=nccl /out/licenses/ /usr/share/doc/nccl/
USER 65532:65532
EXPOSE 7470 9100
ENTRYPOINT ["/usr/local/bin/railguard-prober"]

# nccl-tests and perftest built against a pinned NCCL (see the top of this file).
FROM ${CUDA_IMAGE} AS nccl-build
ARG NCCL_VERSION
ARG NCCL_TESTS_REF=v2.13.11
ARG PERFTEST_REF=24.07.0-0.44
RUN test -n "${NCCL_VERSION}" || { echo "set --build-arg NCCL_VERSION to your training images' NCCL (e.g. 2.23.4-1+cuda12.6)"; exit 1; }
RUN apt-get update \
 && apt-get install -y --no-install-recommends --allow-change-held-packages \
      git ca-certificates build-essential autoconf automake libtool pkg-config \
      libibverbs-dev librdmacm-dev libibumad-dev libpci-dev \
      "libnccl2=${NCCL_VERSION}" "libnccl-dev=${NCCL_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
RUN git clone --depth 1 --branch "${NCCL_TESTS_REF}" https://github.com/NVIDIA/nccl-tests.git /nccl-tests \
 && make -C /nccl-tests -j"$(nproc)" CUDA_HOME=/usr/local/cuda \
 && install -D -m 0755 -t /out/bin /nccl-tests/build/*_perf
RUN git clone --depth 1 --branch "${PERFTEST_REF}" https://github.com/linux-rdma/perftest.git /perftest \
 && cd /perftest && ./autogen.sh \
 && ./configure --prefix=/out CUDA_H_PATH=/usr/local/cuda/include/cuda.h \
 && make -j"$(nproc)" && make install

FROM ${CUDA_RUNTIME_IMAGE} AS with-nccl-tests
ARG NCCL_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends --allow-change-held-packages \
      libibverbs1 ibverbs-providers librdmacm1 libibumad3 libpci3 rdma-core "libnccl2=${NCCL_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin railguard
COPY --from=nccl-build /out/bin/ /usr/local/bin/
COPY --from=build /out/railguard-prober /usr/local/bin/railguard-prober
COPY --from=build /out/libnccl-env-railguard.so /usr/lib/railguard/libnccl-env-railguard.so
USER 65532:65532
EXPOSE 7470 9100
ENTRYPOINT ["/usr/local/bin/railguard-prober"]

# `docker build` without --target gives the default image.
FROM prober
