# syntax=docker/dockerfile:1
# railguard-webhook: the mutating admission webhook.
# Build from the repository root:  docker build -f docker/webhook.Dockerfile -t railguard-webhook .
ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p railguard-webhook-cli --bin railguard-webhook \
 && install -D -m 0755 target/release/railguard-webhook /out/railguard-webhook

# glibc + libgcc only, no shell, runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/railguard-webhook /usr/local/bin/railguard-webhook
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/railguard-webhook"]
