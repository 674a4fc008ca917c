//! What the webhook's HTTP tests share: a CA and serving pairs, a directory laid out like a
//! mounted Secret, an in-process webhook on loopback over real TLS, and a client for it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test binary uses some

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use railguard_webhook::decisions::{CacheLimits, DecisionCache};
use railguard_webhook::{FailureMode, WebhookConfig};
use railguard_webhook_cli::catalog::Catalog;
use railguard_webhook_cli::metrics::Metrics;
use railguard_webhook_cli::server::{self, AppState, NodeGuardState, RunningServer, ServeOptions};
use railguard_webhook_cli::tls::CertReloader;
use serde_json::{json, Value};

pub const SAMPLE: &str = include_str!("../../../fixtures/admission-review-sample.json");
pub const PROFILES: &[&str] = &[
    include_str!("../../../../api/fixtures/profiles/dgx-h100-ndr.yaml"),
    include_str!("../../../../api/fixtures/profiles/roce-cloud.yaml"),
];

pub struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A serving pair for 127.0.0.1 and localhost: (cert PEM, key PEM).
    pub fn serving_pair(&self) -> (String, String) {
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// A directory laid out like a mounted Secret: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<version>`.
pub struct SecretVolume {
    dir: tempfile::TempDir,
    version: u32,
}

impl SecretVolume {
    pub fn new(cert: &str, key: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut v = Self { dir, version: 0 };
        v.publish(cert, key);
        std::os::unix::fs::symlink("..data/tls.crt", v.dir.path().join("tls.crt")).unwrap();
        std::os::unix::fs::symlink("..data/tls.key", v.dir.path().join("tls.key")).unwrap();
        v
    }

    /// Writes a new version and swaps `..data` atomically, as the kubelet does.
    pub fn publish(&mut self, cert: &str, key: &str) {
        self.version += 1;
        let name = format!("..2024_06_01_00_00_{:02}.{}", self.version, self.version);
        let versioned = self.dir.path().join(&name);
        std::fs::create_dir(&versioned).unwrap();
        std::fs::write(versioned.join("tls.crt"), cert).unwrap();
        std::fs::write(versioned.join("tls.key"), key).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }
}

pub async fn start(volume: &SecretVolume, failure_mode: FailureMode) -> RunningServer {
    start_routes(volume, failure_mode, server::admission_routes(), None).await
}

pub async fn start_routes(
    volume: &SecretVolume,
    failure_mode: FailureMode,
    routes: axum::Router<Arc<AppState>>,
    node_guard: Option<Arc<NodeGuardState>>,
) -> RunningServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let profiles = railguard_api::profiles_from_yaml(&PROFILES.join("\n---\n")).unwrap();
    let state = Arc::new(AppState {
        catalog: Catalog::standalone(profiles),
        config: WebhookConfig::default(),
        failure_mode,
        metrics: Arc::new(Metrics::new()),
        decisions: DecisionCache::new(CacheLimits::default()),
        node_guard,
    });
    let reloader = CertReloader::new(&volume.cert(), &volume.key()).unwrap();
    let opts = ServeOptions {
        cert_poll_interval: Duration::from_millis(50),
        max_body_bytes: 1 << 20,
        shutdown_grace: Duration::from_secs(5),
        ..ServeOptions::default()
    };
    server::start_routes(routes, state, reloader, opts)
        .await
        .unwrap()
}

pub fn client(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .use_rustls_tls()
        // Every request opens a new connection, so a reloaded certificate is seen.
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

pub fn sample() -> Value {
    serde_json::from_str(SAMPLE).unwrap()
}

/// The recorded review, with 8 GPUs requested by its container.
pub fn gpu_sample() -> Value {
    let mut v = sample();
    v["request"]["object"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}});
    v
}

pub async fn post(
    c: &reqwest::Client,
    addr: std::net::SocketAddr,
    path: &str,
    body: Vec<u8>,
) -> (u16, String) {
    let r = c
        .post(format!("https://127.0.0.1:{}{path}", addr.port()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// [`post`] of a JSON value.
pub async fn post_json(
    c: &reqwest::Client,
    addr: std::net::SocketAddr,
    path: &str,
    body: &Value,
) -> (u16, String) {
    post(c, addr, path, serde_json::to_vec(body).unwrap()).await
}

/// The first warning of a review's response, which must allow the object.
pub fn allowed_warning(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    v["response"]["warnings"][0].as_str().unwrap().to_string()
}

/// The text of the metrics endpoint on the plain port.
pub async fn metrics(metrics_addr: std::net::SocketAddr) -> String {
    let response = reqwest::get(format!("http://{metrics_addr}/metrics")).await;
    response.unwrap().text().await.unwrap()
}
