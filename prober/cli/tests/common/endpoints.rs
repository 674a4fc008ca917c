//! Simulated nodes' `railguard-prober peer-endpoint` processes on loopback addresses, for the
//! campaign tests (included with `#[path]`).
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use railguard_api::FabricProfile;

pub const TOKEN: &str = "campaign-test-token-0123456789";

pub fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

pub fn profile() -> FabricProfile {
    let text =
        std::fs::read_to_string(root().join("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

/// A loopback address and a port free on it right now.
pub fn addr(i: u8) -> String {
    let ip = format!("127.0.0.{}", 10 + i);
    let l = TcpListener::bind(format!("{ip}:0")).unwrap();
    let port = l.local_addr().unwrap().port();
    format!("{ip}:{port}")
}

/// A running endpoint, killed when dropped.
pub struct Endpoint {
    pub child: Child,
    pub log: PathBuf,
}

impl Endpoint {
    /// Threads of the endpoint process now.
    pub fn threads(&self) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Spec<'a> {
    pub node: &'a str,
    pub profile: &'a str,
    pub model: &'a str,
    pub token: &'a str,
    pub extra: Vec<String>,
}

pub fn spec(node: &str) -> Spec<'_> {
    Spec {
        node,
        profile: "h100-ndr",
        model: "dgx-h100.yaml",
        token: TOKEN,
        extra: vec![],
    }
}

pub fn start(dir: &Path, s: &Spec<'_>, listen: &str) -> Endpoint {
    let token_file = dir.join(format!("{}.token", s.node));
    std::fs::write(&token_file, format!("{}\n", s.token)).unwrap();
    let log_path = dir.join(format!("{}.log", s.node));
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_railguard-prober"))
        .arg("peer-endpoint")
        .args(["--node", s.node, "--profile", s.profile, "--listen", listen])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--sim")
        .arg(root().join("models").join(s.model))
        .args(&s.extra)
        .env_remove("KUBECONFIG")
        .env("RAILGUARD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let started = Instant::now();
    while TcpStream::connect(listen).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "endpoint {} did not start",
            s.node
        );
        thread::sleep(Duration::from_millis(50));
    }
    Endpoint {
        child,
        log: log_path,
    }
}
