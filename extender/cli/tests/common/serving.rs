//! An extender served in-process over real HTTP and TLS, as the binary serves it, and a
//! client for it.

use std::sync::Arc;

use railguard_extender::ExtenderConfig;
use railguard_extender_cli::metrics::Metrics;
use railguard_extender_cli::server::{self, AppState, Source};
use serde_json::Value;

use super::{profile, profiles, training_pod};

pub struct Running {
    pub base: String,
    pub health: String,
    pub client: reqwest::Client,
    pub stop: Vec<tokio_util::sync::CancellationToken>,
    pub state: Arc<AppState>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.iter().for_each(|s| s.cancel());
    }
}

/// A CA and a serving certificate for 127.0.0.1 signed by it: (ca PEM, cert PEM, key PEM).
fn tls_material() -> (String, String, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

pub async fn start(source: Source) -> Running {
    start_with(source, ExtenderConfig::default()).await
}

pub async fn start_with(source: Source, config: ExtenderConfig) -> Running {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let state = Arc::new(AppState {
        source,
        config,
        max_nodes: server::DEFAULT_MAX_NODES,
        metrics: Arc::new(Metrics::new()),
    });
    let (ca, cert, key) = tls_material();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    let tls = railguard_runtime::server_tls(railguard_runtime::TlsFiles {
        cert: &dir.path().join("tls.crt"),
        key: &dir.path().join("tls.key"),
        client_ca: None,
    })
    .unwrap();
    let tls: railguard_runtime::TlsConfigSource = Arc::new(move || tls.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let limits = railguard_runtime::ServeLimits::default();
    let extender = railguard_runtime::spawn_serve(
        listener,
        server::extender_router(state.clone(), 512 << 20),
        Some(tls),
        limits.clone(),
    )
    .unwrap();
    let health = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let health_port = health.local_addr().unwrap().port();
    let health = railguard_runtime::spawn_serve(
        health,
        server::health_router(state.clone(), Default::default()),
        None,
        limits,
    )
    .unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    Running {
        base: format!("https://127.0.0.1:{port}"),
        health: format!("http://127.0.0.1:{health_port}"),
        client,
        stop: vec![extender.stop, health.stop],
        state,
    }
}

pub fn standalone() -> Source {
    Source::Standalone {
        profiles: Arc::new(profiles()),
    }
}

pub fn h100_pod() -> Value {
    let profiles = profiles();
    serde_json::to_value(training_pod(profile(&profiles, "h100-ndr"))).unwrap()
}

pub async fn post(r: &Running, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
    let resp = r
        .client
        .post(format!("{}{path}", r.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}
