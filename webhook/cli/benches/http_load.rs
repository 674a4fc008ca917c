//! HTTP load over TLS with keep-alive against the webhook's own server in a child process on
//! 127.0.0.1 (this bench binary started again in server mode, standalone profiles), `/mutate`
//! and a no-op `/noop` in the same run. The production server has no `/noop`: the child adds
//! it to the library's admission routes, so both endpoints share the listener, the TLS stack,
//! the limits and the process. Prints a table: throughput, p50/p99 latency, the server's RSS.
//!
//! Run: `cargo bench -p railguard-webhook-cli --bench http_load`
//! Knobs (env): LOAD_CONNECTIONS (10), LOAD_REQUESTS (20000 per endpoint and round),
//! LOAD_ROUNDS (2), LOAD_PACED_SECONDS (5).
//!
//! Server only (for an outside load generator, `tests/scripts/webhook-load.sh`):
//! `LOAD_SERVE_ONLY=1` runs just the server, in this process, until SIGTERM or SIGINT, and
//! prints one line `<admission addr> <metrics addr> <review file>`: `/mutate` and `/noop`
//! over TLS on the admission address (a throwaway self-signed certificate for `localhost`),
//! and the file holding the review body this bench sends.

#![allow(clippy::expect_used, clippy::unwrap_used)] // bench harness: a failed setup should abort loudly

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use railguard_webhook_cli::server::{self, ServeOptions};
use railguard_webhook_cli::tls::CertReloader;

mod support;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Set in the child: the directory with `tls.crt`, `tls.key`, `profiles.yaml` and
/// `review.json` (see [`serve_dir`]).
const SERVE_DIR_ENV: &str = "RAILGUARD_BENCH_SERVE_DIR";
/// Set to `1` to run only the server (module doc).
const SERVE_ONLY_ENV: &str = "LOAD_SERVE_ONLY";
const REVIEW_FILE: &str = "review.json";

/// Server mode (in the child, or alone): the library's admission routes plus `/noop`, served
/// until SIGTERM or SIGINT. Prints `<admission addr> <metrics addr> <review file>` once both
/// listen.
fn serve(dir: &Path) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let yaml = std::fs::read_to_string(dir.join("profiles.yaml")).expect("profiles");
        let state = support::app_state(&yaml);
        let reloader =
            CertReloader::new(&dir.join("tls.crt"), &dir.join("tls.key")).expect("serving pair");
        let running =
            server::start_routes(support::routes(), state, reloader, ServeOptions::default())
                .await
                .expect("server starts");
        println!(
            "{} {} {}",
            running.addr,
            running.metrics_addr,
            dir.join(REVIEW_FILE).display()
        );
        railguard_runtime::shutdown_signal().await;
        running.shutdown().await.expect("clean shutdown");
    });
}

struct Server {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    ca_pem: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// A directory to serve from: a CA and a `localhost` certificate it signed, the profile and
/// the review body. Returns it and the CA's PEM.
fn serve_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .signed_by(&key, &ca, &ca_key)
        .expect("cert");
    std::fs::write(dir.path().join("tls.crt"), cert.pem()).expect("write");
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).expect("write");
    std::fs::write(dir.path().join("profiles.yaml"), support::H100).expect("write");
    std::fs::write(dir.path().join(REVIEW_FILE), support::review_body()).expect("write");
    (dir, ca.pem())
}

fn start_server() -> Server {
    let (dir, ca_pem) = serve_dir();
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .env(SERVE_DIR_ENV, dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("server address");
    let addr = line
        .split_whitespace()
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the server did not start: {line:?}"));
    Server {
        child,
        addr,
        _dir: dir,
        ca_pem,
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr, tls: &tokio_rustls::TlsConnector) -> Sender {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let stream = tls.connect(name, tcp).await.expect("tls handshake");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("http handshake");
    tokio::spawn(conn);
    sender
}

async fn one(sender: &mut Sender, path: &str, body: &Bytes) -> Duration {
    sender.ready().await.expect("ready");
    let req = hyper::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .expect("request");
    let start = Instant::now();
    let resp = sender.send_request(req).await.expect("send");
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let elapsed = start.elapsed();
    // Keep the server honest: /mutate must patch, /noop must not.
    let has_patch = bytes.windows(9).any(|w| w == b"\"patch\":\"");
    assert_eq!(
        has_patch,
        path == "/mutate",
        "unexpected answer from {path}"
    );
    elapsed
}

struct Run {
    label: String,
    requests: usize,
    secs: f64,
    lat: Vec<Duration>,
}

impl Run {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.lat.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i].as_secs_f64() * 1e3
    }
}

/// Closed loop: `conns` keep-alive connections, each sending `per_conn` requests back to back.
async fn closed_loop(
    addr: SocketAddr,
    tls: &tokio_rustls::TlsConnector,
    path: &'static str,
    body: &Bytes,
    conns: usize,
    per_conn: usize,
) -> Run {
    let mut senders = Vec::new();
    for _ in 0..conns {
        senders.push(connect(addr, tls).await);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut s in senders {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_conn);
            for _ in 0..per_conn {
                lat.push(one(&mut s, path, &body).await);
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("task"));
    }
    Run {
        label: format!("{path} closed loop, {conns} conns"),
        requests: lat.len(),
        secs: start.elapsed().as_secs_f64(),
        lat,
    }
}

/// Open loop at `rate` req/s for `secs`, spread over `conns` connections. Two latencies per
/// request: from the scheduled send time (no coordinated omission, but tokio's timer fires on
/// a 1 ms tick, so a send that slept is up to 1 ms late by the client's own clock), and from
/// the send itself where the client slept to it (from the schedule where it was behind, so a
/// server stall is still counted).
async fn paced(
    addr: SocketAddr,
    tls: &tokio_rustls::TlsConnector,
    path: &'static str,
    body: &Bytes,
    conns: usize,
    rate: u64,
    secs: u64,
) -> [Run; 2] {
    let per_conn_rate = rate as f64 / conns as f64;
    let per_conn = (per_conn_rate * secs as f64) as usize;
    let interval = Duration::from_secs_f64(1.0 / per_conn_rate);
    let mut senders = Vec::new();
    for _ in 0..conns {
        senders.push(connect(addr, tls).await);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut s) in senders.into_iter().enumerate() {
        let body = body.clone();
        // Stagger connections across one interval.
        let offset = interval.mul_f64(i as f64 / conns as f64);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_conn);
            for k in 0..per_conn {
                let due = start + offset + interval.mul_f64(k as f64);
                let sent = if Instant::now() < due {
                    tokio::time::sleep_until(due.into()).await;
                    Instant::now()
                } else {
                    due
                };
                one(&mut s, path, &body).await;
                lat.push((due.elapsed(), sent.elapsed()));
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("task"));
    }
    let secs = start.elapsed().as_secs_f64();
    let (from_schedule, from_send) = lat.into_iter().unzip::<_, _, Vec<_>, Vec<_>>();
    [
        Run {
            label: format!("{path} paced {rate}/s, {conns} conns"),
            requests: from_send.len(),
            secs,
            lat: from_send,
        },
        Run {
            label: format!("{path} paced {rate}/s, timed from the 1 ms timer's schedule"),
            requests: from_schedule.len(),
            secs,
            lat: from_schedule,
        },
    ]
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() {
    if let Some(dir) = std::env::var_os(SERVE_DIR_ENV) {
        return serve(Path::new(&dir));
    }
    if std::env::var(SERVE_ONLY_ENV).is_ok_and(|v| v == "1") {
        let (dir, _) = serve_dir();
        return serve(dir.path());
    }
    // The client gets one thread; the server process keeps the rest of the machine.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let conns = env_or("LOAD_CONNECTIONS", 10) as usize;
    let requests = env_or("LOAD_REQUESTS", 20_000) as usize;
    let rounds = env_or("LOAD_ROUNDS", 2);
    let paced_secs = env_or("LOAD_PACED_SECONDS", 5);
    let server = start_server();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut server.ca_pem.as_bytes()) {
        roots.add(c.expect("ca")).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
    let body = Bytes::from(support::review_body());
    let pid = server.child.id();

    // Warm-up on both endpoints.
    for path in ["/noop", "/mutate"] {
        closed_loop(server.addr, &tls, path, &body, conns, 200).await;
    }
    let per_conn = requests.div_ceil(conns);
    let mut runs = Vec::new();
    let mut noop_total = (0usize, 0f64);
    let mut mutate_total = (0usize, 0f64);
    // Alternate endpoints so drift on a shared machine hits both alike.
    for _ in 0..rounds {
        for path in ["/noop", "/mutate"] {
            let r = closed_loop(server.addr, &tls, path, &body, conns, per_conn).await;
            let t = if path == "/noop" {
                &mut noop_total
            } else {
                &mut mutate_total
            };
            t.0 += r.requests;
            t.1 += r.secs;
            runs.push(r);
        }
    }
    runs.extend(paced(server.addr, &tls, "/mutate", &body, conns, 1000, paced_secs).await);
    runs.extend(paced(server.addr, &tls, "/noop", &body, conns, 1000, paced_secs).await);
    let (rss, hwm) = rss_kib(pid);

    println!(
        "\nrailguard-webhook HTTP load: TLS 1.3 keep-alive, {conns} connections, body {} bytes, client 1 thread",
        body.len()
    );
    println!("| run | requests | req/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for r in &runs {
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} |",
            r.label,
            r.requests,
            r.requests as f64 / r.secs,
            r.pct(0.50),
            r.pct(0.99)
        );
    }
    let noop_rps = noop_total.0 as f64 / noop_total.1;
    let mutate_rps = mutate_total.0 as f64 / mutate_total.1;
    println!(
        "\n/mutate throughput = {:.1}% of /noop ({mutate_rps:.0} vs {noop_rps:.0} req/s, all closed-loop rounds)",
        100.0 * mutate_rps / noop_rps
    );
    println!(
        "server RSS after the run: {:.1} MiB (peak {:.1} MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
}
