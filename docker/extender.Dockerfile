# syntax=docker/dockerfile:1
# railguard-extender: the kube-scheduler extender.
# Build from the repository root:  docker build -f docker/extender.Dockerfile -t railguard-extender .
ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p railguard-extender-cli --bin railguard-extender \
 && install -D -m 0755 target/release/railguard-extender /out/railguard-extender

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/railguard-extender /usr/local/bin/railguard-extender
USER 65532:65532
EXPOSE 8888 9090
ENTRYPOINT ["/usr/local/bin/railguard-extender"]
