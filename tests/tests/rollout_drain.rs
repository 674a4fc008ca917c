//! Keep-alive rollouts with no cluster (issue #43): real `railguard-webhook` processes behind
//! a forwarder that pins each TCP connection to the backend it was opened to, as kube-proxy
//! with conntrack does to the API server's connections to a webhook Service. Eight clients
//! post AdmissionReviews back to back on kept-alive TLS connections, the way kube-apiserver's
//! webhook client does; five times a new process takes over and the old one gets SIGTERM.
//!
//! The clients follow Go's `net/http` transport (net/http/transport.go): a connection whose
//! response said `Connection: close` is not reused; a pooled connection the server already
//! closed is dropped before use and the request goes on a new one (`persistConn.readLoop`
//! notices the close); but a POST already written on a connection that then ends without a
//! response is *not* retried (`persistConn.shouldRetryRequest`: `isReplayable` is false for
//! POST) and fails: kube-apiserver refuses the pod with `EOF` (its webhook dispatcher calls
//! the webhook once; k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go).
//!
//! Expected: not one request fails, every old process exits 0 within its drain delay and
//! grace, and its `/readyz` says 503 while it drains.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use railguard_tests::ports::spawn_serving;
use railguard_tests::{tls_connector, workspace_binary, workspace_root, ServingCertificate};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CLIENTS: usize = 8;
const ROLLOUTS: usize = 5;
/// The drain delay the processes run with (the chart's default is longer).
const DRAIN_DELAY_S: u64 = 2;
const GRACE_S: u64 = 5;
/// How long after SIGTERM the forwarder still sends new connections to the old process
/// (the endpoint update on its way to kube-proxy); below the drain delay, as the chart's
/// defaults intend.
const ENDPOINT_LAG: Duration = Duration::from_millis(1000);
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);
/// kube-apiserver's default webhook timeout.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

struct Webhook {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    log: std::path::PathBuf,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_webhook(certs_dir: &Path, dir: &Path, n: usize) -> Webhook {
    let bin = workspace_binary("railguard-webhook-cli", "railguard-webhook").unwrap();
    let log = dir.join(format!("webhook-{n}.log"));
    let profiles = workspace_root().join("api/fixtures/profiles/dgx-h100-ndr.yaml");
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--profiles={}", profiles.display()))
        .arg(format!(
            "--tls-cert={}",
            certs_dir.join("tls.crt").display()
        ))
        .arg(format!("--tls-key={}", certs_dir.join("tls.key").display()))
        .arg(format!("--shutdown-delay-seconds={DRAIN_DELAY_S}"))
        .arg(format!("--shutdown-grace-seconds={GRACE_S}"))
        .env("RAILGUARD_LOG", "info,railguard_runtime=debug");
    let (child, addr, metrics) = spawn_serving(&mut cmd, &log, LISTEN_TIMEOUT).await.unwrap();
    let webhook = Webhook {
        child,
        addr,
        metrics,
        log,
    };
    let start = Instant::now();
    while readyz(webhook.metrics).await != Some(200) {
        assert!(start.elapsed() < LISTEN_TIMEOUT, "webhook {n} never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    webhook
}

/// `/readyz`'s status code (None when it cannot be reached).
async fn readyz(addr: SocketAddr) -> Option<u16> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// kube-proxy with conntrack: a new connection goes to the backend of the moment and stays
/// there until one side closes it.
async fn forward(listener: TcpListener, backend: Arc<Mutex<SocketAddr>>) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let to = *backend.lock().unwrap();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(to).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
}

#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    failed: AtomicU64,
    redialed: AtomicU64,
    closed_by_answer: AtomicU64,
    latencies_us: Mutex<Vec<u64>>,
    failures: Mutex<Vec<String>>,
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// One answer on a kept-alive connection: the status, whether it said close, the body.
async fn exchange(conn: &mut Tls, request: &[u8]) -> std::io::Result<(u16, bool, Vec<u8>)> {
    conn.write_all(request).await?;
    conn.flush().await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("closed without a full response ({} bytes read)", buf.len()),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other("no content-length"))?;
    let close = head
        .lines()
        .any(|l| l.starts_with("connection:") && l.contains("close"));
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed in the body",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok((status, close, buf[head_end..head_end + length].to_vec()))
}

/// Whether the server already closed this idle connection (Go's read loop would have seen
/// it and taken the connection out of the pool before picking it).
async fn closed_while_idle(conn: &mut Tls) -> bool {
    let mut byte = [0u8; 1];
    // Ready at once: EOF, an error, or bytes no request asked for; pending: still open.
    tokio::time::timeout(Duration::ZERO, conn.read(&mut byte))
        .await
        .is_ok()
}

async fn client(
    entry: SocketAddr,
    tls: tokio_rustls::TlsConnector,
    request: Vec<u8>,
    tally: Arc<Tally>,
    running: Arc<AtomicBool>,
) {
    let mut conn: Option<Tls> = None;
    while running.load(Ordering::Relaxed) {
        if let Some(c) = conn.as_mut() {
            if closed_while_idle(c).await {
                conn = None;
                tally.redialed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let start = Instant::now();
        let c = match conn.as_mut() {
            Some(c) => c,
            None => {
                let dialed = async {
                    let tcp = TcpStream::connect(entry).await?;
                    tls.connect(ServerName::try_from("localhost").unwrap(), tcp)
                        .await
                };
                match dialed.await {
                    Ok(c) => conn.insert(c),
                    Err(e) => {
                        tally.failed.fetch_add(1, Ordering::Relaxed);
                        tally.failures.lock().unwrap().push(format!("dial: {e}"));
                        continue;
                    }
                }
            }
        };
        match tokio::time::timeout(REQUEST_DEADLINE, exchange(c, &request)).await {
            Ok(Ok((200, close, body)))
                if String::from_utf8_lossy(&body).contains("\"AdmissionReview\"") =>
            {
                tally.answered.fetch_add(1, Ordering::Relaxed);
                let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                tally.latencies_us.lock().unwrap().push(us);
                if close {
                    tally.closed_by_answer.fetch_add(1, Ordering::Relaxed);
                    conn = None;
                }
            }
            other => {
                let what = match other {
                    Ok(Ok((status, _, body))) => {
                        format!("status {status}: {}", String::from_utf8_lossy(&body))
                    }
                    Ok(Err(e)) => format!("request written, then: {e}"),
                    Err(_) => "no answer within the deadline".to_string(),
                };
                tally.failed.fetch_add(1, Ordering::Relaxed);
                tally.failures.lock().unwrap().push(what);
                conn = None;
            }
        }
    }
}

fn post(body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST /mutate?timeout=10s HTTP/1.1\r\nhost: railguard-webhook.railguard.svc:443\r\ncontent-type: application/json\r\naccept: application/json, */*\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keep_alive_clients_lose_no_request_through_five_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    let certs = ServingCertificate::loopback("railguard-rollout-ca").unwrap();
    let certs_dir = dir.path().join("serving");
    std::fs::create_dir_all(&certs_dir).unwrap();
    certs.write_pair(&certs_dir).unwrap();
    let tls = tls_connector(&certs.ca_pem, None).unwrap();
    let review =
        std::fs::read(workspace_root().join("webhook/fixtures/admission-review-sample.json"))
            .unwrap();
    let request = post(&review);

    let mut current = start_webhook(&certs_dir, dir.path(), 0).await;
    let backend = Arc::new(Mutex::new(current.addr));
    let entry = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let entry_addr = entry.local_addr().unwrap();
    tokio::spawn(forward(entry, backend.clone()));

    let tally = Arc::new(Tally::default());
    let running = Arc::new(AtomicBool::new(true));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            tokio::spawn(client(
                entry_addr,
                tls.clone(),
                request.clone(),
                tally.clone(),
                running.clone(),
            ))
        })
        .collect();

    let mut drains = Vec::new();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for n in 1..=ROLLOUTS {
        let next = start_webhook(&certs_dir, dir.path(), n).await;
        let mut old = std::mem::replace(&mut current, next);
        let answered_before = tally.answered.load(Ordering::Relaxed);
        let sigterm = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &old.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        // While it drains it says not ready, and it keeps serving.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            readyz(old.metrics).await,
            Some(503),
            "rollout {n}: the draining webhook still says ready"
        );
        tokio::time::sleep(ENDPOINT_LAG.saturating_sub(Duration::from_millis(300))).await;
        *backend.lock().unwrap() = current.addr;
        let exit = loop {
            if let Some(s) = old.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                sigterm.elapsed() < Duration::from_secs(DRAIN_DELAY_S + GRACE_S + 5),
                "rollout {n}: the old webhook did not exit"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let took = sigterm.elapsed();
        assert!(
            exit.success(),
            "rollout {n}: exit {exit:?}\n{}",
            std::fs::read_to_string(&old.log).unwrap_or_default()
        );
        drains.push((
            took,
            tally.answered.load(Ordering::Relaxed) - answered_before,
        ));
        // Both processes were not alive at the end: the Drop of `old` reaps nothing more.
        drop(old);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    running.store(false, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }

    let answered = tally.answered.load(Ordering::Relaxed);
    let failed = tally.failed.load(Ordering::Relaxed);
    let mut lat = tally.latencies_us.lock().unwrap().clone();
    lat.sort_unstable();
    println!("rollout drain: {CLIENTS} keep-alive clients, {ROLLOUTS} rollouts, drain delay {DRAIN_DELAY_S} s, endpoint lag {} ms", ENDPOINT_LAG.as_millis());
    println!("| requests answered | failed | closed by a `Connection: close` answer | pooled connections found closed | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {answered} | {failed} | {} | {} | {:.2} | {:.2} | {:.2} |",
        tally.closed_by_answer.load(Ordering::Relaxed),
        tally.redialed.load(Ordering::Relaxed),
        percentile(&lat, 0.5) as f64 / 1000.0,
        percentile(&lat, 0.99) as f64 / 1000.0,
        lat.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
    for (i, (took, during)) in drains.iter().enumerate() {
        println!(
            "rollout {}: old process exited {:.1} s after SIGTERM; {during} answers meanwhile",
            i + 1,
            took.as_secs_f64()
        );
    }
    let failures = tally.failures.lock().unwrap();
    assert_eq!(
        failed,
        0,
        "requests lost during rollouts: {:?}",
        &failures[..failures.len().min(10)]
    );
    assert!(
        answered > 1000,
        "too little load to mean anything: {answered}"
    );
    assert!(
        tally.closed_by_answer.load(Ordering::Relaxed) >= ROLLOUTS as u64,
        "no answer ever closed its connection"
    );
}
