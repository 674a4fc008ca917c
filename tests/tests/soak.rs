//! Soak (issue #14): the real `railguard-webhook` and `railguard-extender` binaries against a
//! real kube-apiserver, under sustained keep-alive TLS load, while their serving certificates
//! are rotated the way the kubelet rotates a Secret volume (a new timestamped directory and
//! an atomic `..data` symlink swap) and kube-apiserver is restarted once half-way.
//!
//! Expected: zero failed admissions, zero wrong filter answers, every rotation reloaded once
//! by each server and presented to new connections, and memory flat.
//!
//! Length and pace: `RAILGUARD_SOAK_SECONDS` (default 120, the CI run; the recorded run in
//! BENCHMARKS.md is 600), `RAILGUARD_SOAK_ROTATE_SECONDS` (default 20; recorded: 60) and
//! `RAILGUARD_SOAK_RATE` (requests per second offered to each server, default 100). The
//! figures are printed as a table at the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use railguard_api::{FabricProfile, Verdict};
use railguard_sim::certificates as synth;
use railguard_tests::ports::spawn_serving;
use railguard_tests::{fixture_profile, labels, tls_connector, workspace_binary, ControlPlane};
use rustls::pki_types::ServerName;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A request slower than this counts as failed (the chart's webhook timeout is shorter).
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Requests on one connection before the client opens a new one (and a new handshake).
const REQUESTS_PER_CONNECTION: usize = 50;
const CLIENTS_PER_SERVER: usize = 4;
const RSS_LIMIT_KIB: u64 = 300 * 1024;
/// How long a server may take to bind its listeners.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}

/// A CA that issues serving certificates for `127.0.0.1` and `localhost`, and one client
/// certificate (the scheduler's).
struct Authority {
    ca_pem: String,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
    client_cert_pem: String,
    client_key_pem: String,
}

impl Authority {
    fn new() -> Authority {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "railguard-soak-ca");
        let ca = params.self_signed(&ca_key).unwrap();
        let mut client = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "railguard-scheduler");
        client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = rcgen::KeyPair::generate().unwrap();
        let client_cert = client.signed_by(&client_key, &ca, &ca_key).unwrap();
        Authority {
            ca_pem: ca.pem(),
            ca,
            ca_key,
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        }
    }

    /// A new serving pair (PEM certificate, PEM key), serial `serial`.
    fn issue(&self, serial: u64) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn connector(&self, client_cert: bool) -> tokio_rustls::TlsConnector {
        let client = (self.client_cert_pem.as_str(), self.client_key_pem.as_str());
        tls_connector(&self.ca_pem, client_cert.then_some(client)).unwrap()
    }
}

/// A directory laid out as the kubelet lays out a Secret volume.
struct SecretVolume {
    dir: PathBuf,
    version: u32,
}

impl SecretVolume {
    fn new(dir: PathBuf) -> SecretVolume {
        std::fs::create_dir_all(&dir).unwrap();
        SecretVolume { dir, version: 0 }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes a new version of every file and swaps `..data` to it atomically.
    fn write(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let version = format!("..2026_12_01_{:04}", self.version);
        let v = self.dir.join(&version);
        std::fs::create_dir_all(&v).unwrap();
        for (name, text) in files {
            std::fs::write(v.join(name), text).unwrap();
            let link = self.dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), link).unwrap();
            }
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

/// A server process under soak; killed on drop.
struct Server {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
    tls: tokio_rustls::TlsConnector,
    rss_kib: Arc<Mutex<Vec<(Duration, u64)>>>,
    sampling: Arc<AtomicBool>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.sampling.store(false, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn start_server(
    name: &'static str,
    package: &str,
    args: Vec<String>,
    tls: tokio_rustls::TlsConnector,
    dir: &Path,
) -> Server {
    let bin = workspace_binary(package, name).unwrap();
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(bin);
    cmd.args(&args).arg("--cert-poll-seconds=1");
    let (child, addr, metrics) = spawn_serving(&mut cmd, &log, LISTEN_TIMEOUT).await.unwrap();
    let rss = Arc::new(Mutex::new(Vec::new()));
    let sampling = Arc::new(AtomicBool::new(true));
    let (samples, on, pid, t0) = (rss.clone(), sampling.clone(), child.id(), Instant::now());
    std::thread::spawn(move || {
        while on.load(Ordering::Relaxed) {
            if let Some(kib) = rss_kib(pid) {
                samples.lock().unwrap().push((t0.elapsed(), kib));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let server = Server {
        name,
        child,
        addr,
        metrics,
        log,
        tls,
        rss_kib: rss,
        sampling,
    };
    let started = Instant::now();
    while metrics_text(&server, "/readyz").await.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name} not ready; see {}",
            server.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server
}

/// GET on the plain metrics port; the body of a 200.
async fn metrics_text(server: &Server, path: &str) -> Option<String> {
    let mut tcp = TcpStream::connect(server.metrics).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.trim().to_string())
}

/// The value of a counter line `name{labels} value` in an OpenMetrics text.
fn counter(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// Opens a TLS connection; the serial of the certificate the server presented.
async fn open(server: &Server) -> std::io::Result<(BufReader<Tls>, Vec<u8>)> {
    let tcp = TcpStream::connect(server.addr).await?;
    tcp.set_nodelay(true)?;
    let stream = server
        .tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| std::io::Error::other("no server certificate"))?;
    Ok((BufReader::new(stream), leaf))
}

/// One keep-alive exchange: the status and body.
async fn exchange(
    io: &mut BufReader<Tls>,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    // One write: head and body in separate TLS records would wait on Nagle and delayed ACK.
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    io.get_mut().write_all(&request).await?;
    io.get_mut().flush().await?;
    let mut status_line = String::new();
    io.read_line(&mut status_line).await?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut length = None;
    loop {
        let mut line = String::new();
        if io.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::other("connection closed in the head"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
        }
    }
    let length = length.ok_or_else(|| std::io::Error::other("no content-length"))?;
    let mut body = vec![0; length];
    io.read_exact(&mut body).await?;
    Ok((status, body))
}

/// What one server's clients saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
    first_failures: Vec<String>,
    latencies_us: Vec<u64>,
    /// Serving certificates presented, in the order first seen.
    certificates: Vec<Vec<u8>>,
    /// The certificate each connection opened after each rotation settled presented.
    stale_after_rotation: u64,
}

impl Tally {
    fn fail(&mut self, why: String) {
        self.failed += 1;
        if self.first_failures.len() < 5 {
            self.first_failures.push(why);
        }
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        if v.is_empty() {
            return 0.0;
        }
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i] as f64 / 1000.0
    }
}

/// The certificate each client must be shown: the current one, unless it was swapped in
/// within the last few seconds (the poll interval plus slack).
struct Rotation {
    current: Vec<u8>,
    since: Instant,
}

/// Judges one answer body; `Err` says why it is wrong.
type Judge = Arc<dyn Fn(&[u8]) -> Result<(), String> + Send + Sync>;

#[allow(clippy::too_many_arguments)]
async fn load(
    server: Arc<Server>,
    path: &'static str,
    body: Arc<Vec<u8>>,
    judge: Judge,
    rate_per_client: f64,
    until: Instant,
    rotation: Arc<Mutex<Rotation>>,
    tally: Arc<Mutex<Tally>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate_per_client));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut conn: Option<(BufReader<Tls>, usize)> = None;
    while Instant::now() < until {
        tick.tick().await;
        if conn
            .as_ref()
            .is_none_or(|(_, n)| *n >= REQUESTS_PER_CONNECTION)
        {
            match tokio::time::timeout(REQUEST_DEADLINE, open(&server)).await {
                Ok(Ok((io, leaf))) => {
                    let mut t = tally.lock().unwrap();
                    if !t.certificates.contains(&leaf) {
                        t.certificates.push(leaf.clone());
                    }
                    let r = rotation.lock().unwrap();
                    if r.since.elapsed() > Duration::from_secs(4) && leaf != r.current {
                        t.stale_after_rotation += 1;
                    }
                    conn = Some((io, 0));
                }
                Ok(Err(e)) => {
                    tally.lock().unwrap().fail(format!("connect: {e}"));
                    continue;
                }
                Err(_) => {
                    tally.lock().unwrap().fail("connect: timed out".into());
                    continue;
                }
            }
        }
        let Some((io, n)) = conn.as_mut() else {
            continue;
        };
        *n += 1;
        let start = Instant::now();
        let answer = tokio::time::timeout(REQUEST_DEADLINE, exchange(io, path, &body)).await;
        let took = start.elapsed();
        let verdict = match answer {
            Ok(Ok((200, body))) => judge(&body),
            Ok(Ok((status, body))) => {
                Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)))
            }
            Ok(Err(e)) => Err(format!("exchange: {e}")),
            Err(_) => Err(format!("no answer within {REQUEST_DEADLINE:?}")),
        };
        let mut t = tally.lock().unwrap();
        match verdict {
            Ok(()) => {
                t.ok += 1;
                t.latencies_us.push(took.as_micros() as u64);
            }
            Err(why) => {
                t.fail(format!("{}: {why}", server.name));
                conn = None;
            }
        }
    }
}

fn der_of(pem: &str) -> Vec<u8> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// The servers' logs and TLS files; kept after a failure.
struct LogDir(Option<tempfile::TempDir>);

impl LogDir {
    fn path(&self) -> &Path {
        self.0.as_ref().map(|d| d.path()).unwrap_or(Path::new("/"))
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = self.0.take() {
                eprintln!("soak: logs kept in {}", d.keep().display());
            }
        }
    }
}

fn hours_ago(h: f64) -> Timestamp {
    Timestamp::now()
        .checked_sub(SignedDuration::from_secs_f64(h * 3600.0))
        .unwrap()
}

fn gpu_pod(profile: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "soak", "namespace": "train",
                     "annotations": {"railguard.io/profile": profile}},
        "spec": {"containers": [{"name": "c", "image": "trainer",
                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    })
}

fn admission_review(pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "7f0c1b6e-soak", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "train", "operation": "CREATE",
            "userInfo": {"username": "tenant"}, "object": pod
        }
    }))
    .unwrap()
}

/// The extender's answer as a set of passing names and a set of failed names.
fn filter_outcome(body: &[u8]) -> Result<(BTreeSet<String>, BTreeSet<String>), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    if let Some(e) = v
        .get("Error")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())
    {
        return Err(format!("extender error: {e}"));
    }
    let names = v["NodeNames"]
        .as_array()
        .ok_or("no NodeNames")?
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    // A failed certificate is no matter for preemption: either map counts.
    let failed = ["FailedNodes", "FailedAndUnresolvableNodes"]
        .iter()
        .filter_map(|k| v[*k].as_object())
        .flat_map(|m| m.keys().cloned())
        .collect();
    Ok((names, failed))
}

/// Mean RSS (KiB) of the samples within `[from, to)` of the run.
fn mean_rss(samples: &[(Duration, u64)], from: Duration, to: Duration) -> u64 {
    let window: Vec<u64> = samples
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, k)| *k)
        .collect();
    window.iter().sum::<u64>() / (window.len().max(1) as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_and_extender_hold_under_load_rotation_and_an_apiserver_restart() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let soak = Duration::from_secs(env_u64("RAILGUARD_SOAK_SECONDS", 120));
    let rotate_every = Duration::from_secs(env_u64("RAILGUARD_SOAK_ROTATE_SECONDS", 20));
    let rate = env_u64("RAILGUARD_SOAK_RATE", 100) as f64;
    assert!(soak >= rotate_every * 2, "the soak must span rotations");

    let mut cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let client = cp.client();
    let h100: FabricProfile = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    let profile = h100.metadata.name.clone().unwrap();
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &h100)
        .await
        .unwrap();
    cp.create_namespace("train", &labels(&[])).await.unwrap();
    let product = "nvidia.com/gpu.product";
    let pool = h100.spec.node_selector[product].clone();
    let alloc = [("nvidia.com/gpu", "8"), ("rdma/rdma_shared_device_a", "1")];
    let certified: BTreeSet<String> = (0..6).map(|i| format!("n-certified-{i}")).collect();
    for name in certified.iter().map(String::as_str).chain(["n-failed"]) {
        cp.create_node(name, &labels(&[(product, &pool)]), &alloc)
            .await
            .unwrap();
        let verdict = if name == "n-failed" {
            Verdict::Failed
        } else {
            Verdict::Certified
        };
        let cert = synth::certificate(&h100, verdict, hours_ago(1.0), 392.0, 370.0);
        cp.publish_certificate(name, &cert).await.unwrap();
    }

    let dir = LogDir(Some(tempfile::tempdir().unwrap()));
    let authority = Authority::new();
    let mut serial = 1;
    let mut volumes = [
        SecretVolume::new(dir.path().join("webhook-tls")),
        SecretVolume::new(dir.path().join("extender-tls")),
    ];
    let mut pairs = Vec::new();
    for v in &mut volumes {
        let (cert, key) = authority.issue(serial);
        serial += 1;
        v.write(&[
            ("tls.crt", &cert),
            ("tls.key", &key),
            ("ca.crt", &authority.ca_pem),
        ]);
        pairs.push(cert);
    }
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let tls_args = |v: &SecretVolume| {
        vec![
            format!("--tls-cert={}", v.path("tls.crt").display()),
            format!("--tls-key={}", v.path("tls.key").display()),
        ]
    };
    let mut webhook_args = vec![
        format!("--kubeconfig={kubeconfig}"),
        "--shutdown-delay-seconds=0".to_string(),
    ];
    webhook_args.extend(tls_args(&volumes[0]));
    let mut extender_args = vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--tls-client-ca={}", volumes[1].path("ca.crt").display()),
    ];
    extender_args.extend(tls_args(&volumes[1]));
    let webhook = Arc::new(
        start_server(
            "railguard-webhook",
            "railguard-webhook-cli",
            webhook_args,
            authority.connector(false),
            dir.path(),
        )
        .await,
    );
    let extender = Arc::new(
        start_server(
            "railguard-extender",
            "railguard-extender-cli",
            extender_args,
            authority.connector(true),
            dir.path(),
        )
        .await,
    );

    // The answers every request must get: the webhook's patch for this pod (taken from its
    // first answer, checked to carry the profile's NCCL_IB_HCA), the extender's exact split.
    let review = Arc::new(admission_review(&gpu_pod(&profile)));
    let (mut io, _) = open(&webhook).await.unwrap();
    let (status, first) = exchange(&mut io, "/mutate", &review).await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&first));
    let first: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(first["response"]["allowed"], true, "{first}");
    let expected_patch = first["response"]["patch"]
        .as_str()
        .expect("the GPU pod is mutated")
        .to_string();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&expected_patch)
        .unwrap();
    let decoded = String::from_utf8(decoded).unwrap();
    assert!(decoded.contains("NCCL_IB_HCA"), "{decoded}");
    let webhook_judge: Judge = Arc::new(move |body: &[u8]| {
        let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
        let r = &v["response"];
        if r["allowed"] != true {
            return Err(format!("not allowed: {r}"));
        }
        if r["patch"].as_str() != Some(expected_patch.as_str()) {
            return Err(format!("another patch: {r}"));
        }
        Ok(())
    });
    let mut candidates: Vec<String> = certified.iter().cloned().collect();
    candidates.push("n-failed".into());
    let filter_args = Arc::new(
        serde_json::to_vec(&json!({"Pod": gpu_pod(&profile), "NodeNames": candidates})).unwrap(),
    );
    let want = certified.clone();
    let extender_judge: Judge = Arc::new(move |body: &[u8]| {
        let (names, failed) = filter_outcome(body)?;
        if names != want || failed != BTreeSet::from(["n-failed".to_string()]) {
            return Err(format!("wrong split: pass {names:?}, failed {failed:?}"));
        }
        Ok(())
    });
    extender_judge(
        &exchange(
            &mut open(&extender).await.unwrap().0,
            "/filter",
            &filter_args,
        )
        .await
        .unwrap()
        .1,
    )
    .expect("the extender's first answer");

    let started = Instant::now();
    let until = started + soak;
    let rotations: Vec<Arc<Mutex<Rotation>>> = pairs
        .iter()
        .map(|pem| {
            Arc::new(Mutex::new(Rotation {
                current: der_of(pem),
                since: Instant::now(),
            }))
        })
        .collect();
    let tallies: Vec<Arc<Mutex<Tally>>> = (0..2).map(|_| Arc::default()).collect();
    let mut clients = Vec::new();
    for (i, (server, path, body, judge)) in [
        (webhook.clone(), "/mutate", review.clone(), webhook_judge),
        (
            extender.clone(),
            "/filter",
            filter_args.clone(),
            extender_judge,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        for _ in 0..CLIENTS_PER_SERVER {
            clients.push(tokio::spawn(load(
                server.clone(),
                path,
                body.clone(),
                judge.clone(),
                rate / CLIENTS_PER_SERVER as f64,
                until,
                rotations[i].clone(),
                tallies[i].clone(),
            )));
        }
    }

    // Rotate both servers' certificates every `rotate_every`; restart kube-apiserver once,
    // half-way (between rotations).
    let mut rotated = 0u64;
    let mut restart_took = None;
    let mut next_rotation = started + rotate_every;
    let restart_at = started + soak / 2 + rotate_every / 2;
    while Instant::now() + Duration::from_secs(5) < until {
        let now = Instant::now();
        if restart_took.is_none() && now >= restart_at {
            let t = Instant::now();
            cp.restart_apiserver()
                .await
                .expect("kube-apiserver restarts");
            restart_took = Some(t.elapsed());
        }
        if now >= next_rotation {
            for (v, r) in volumes.iter_mut().zip(&rotations) {
                let (cert, key) = authority.issue(serial);
                serial += 1;
                let der = der_of(&cert);
                v.write(&[
                    ("tls.crt", &cert),
                    ("tls.key", &key),
                    ("ca.crt", &authority.ca_pem),
                ]);
                *r.lock().unwrap() = Rotation {
                    current: der,
                    since: Instant::now(),
                };
            }
            rotated += 1;
            next_rotation += rotate_every;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    let elapsed = started.elapsed();
    cp.check_alive().expect("the control plane still runs");

    // Figures.
    eprintln!(
        "soak: {:.0} s, {rotated} rotations, kube-apiserver restart took {:.1} s, offered {rate} req/s per server",
        elapsed.as_secs_f64(),
        restart_took.map(|d| d.as_secs_f64()).unwrap_or(0.0)
    );
    eprintln!("| server | requests ok | failed | req/s | p50 ms | p99 ms | max ms | certificates seen | TLS reloads ok | RSS start MiB | RSS end MiB | RSS peak MiB |");
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let warm = Duration::from_secs(10).min(soak / 4);
    for (server, tally) in [&webhook, &extender].into_iter().zip(&tallies) {
        // Scraped before the tally is locked: no guard is held across the await.
        let metrics = metrics_text(server, "/metrics").await.unwrap_or_default();
        let t = tally.lock().unwrap();
        let samples = server.rss_kib.lock().unwrap().clone();
        let run_end = samples.last().map(|s| s.0).unwrap_or_default();
        let fifth = run_end / 5;
        let rss_start = mean_rss(&samples, warm, warm + fifth);
        let rss_end = mean_rss(&samples, run_end - fifth, run_end + Duration::from_secs(1));
        let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
        let prefix = match server.name {
            "railguard-webhook" => "railguard_webhook",
            _ => "railguard_extender",
        };
        let reloads = counter(
            &metrics,
            &format!("{prefix}_tls_reloads_total{{result=\"ok\"}}"),
        );
        let rejected = counter(
            &metrics,
            &format!("{prefix}_tls_reloads_total{{result=\"rejected\"}}"),
        );
        eprintln!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {} | {reloads} | {} | {} | {} |",
            server.name,
            t.ok,
            t.failed,
            t.ok as f64 / elapsed.as_secs_f64(),
            t.percentile_ms(0.5),
            t.percentile_ms(0.99),
            t.latencies_us.iter().max().copied().unwrap_or(0) as f64 / 1000.0,
            t.certificates.len(),
            rss_start / 1024,
            rss_end / 1024,
            peak / 1024,
        );
        assert_eq!(
            t.failed,
            0,
            "{}: failed requests, first ones: {:#?}; see {}",
            server.name,
            t.first_failures,
            server.log.display()
        );
        assert!(t.ok > 0, "{}: no request answered", server.name);
        assert_eq!(
            reloads, rotated,
            "{}: each rotation is reloaded once",
            server.name
        );
        assert_eq!(rejected, 0, "{}: no rotation rejected", server.name);
        assert_eq!(
            t.certificates.len() as u64,
            rotated + 1,
            "{}: new connections were shown every certificate",
            server.name
        );
        assert_eq!(
            t.stale_after_rotation, 0,
            "{}: connections opened seconds after a rotation got the old certificate",
            server.name
        );
        assert!(peak < RSS_LIMIT_KIB, "{}: peak RSS {peak} KiB", server.name);
        // Flat: the last fifth of the run within a quarter (plus allocator slack) of the
        // first fifth after warm-up.
        assert!(
            rss_end <= rss_start + rss_start / 4 + 16 * 1024,
            "{}: RSS grew from {rss_start} KiB to {rss_end} KiB",
            server.name
        );
    }
}
