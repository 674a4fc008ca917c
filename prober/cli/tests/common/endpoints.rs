//! Simulated nodes' `railguard-prober peer-endpoint` processes on loopback addresses, for the
//! campaign tests (included with `#[path]`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use railguard_api::FabricProfile;
use railguard_campaign::coordinator::{CampaignNode, CampaignSettings};

pub const TOKEN: &str = "campaign-test-token-0123456789";

pub fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

pub fn profile() -> FabricProfile {
    let text =
        std::fs::read_to_string(root().join("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

/// The campaign settings of [`profile`] with [`TOKEN`], with timeouts and iterations cut
/// down for loopback.
pub fn settings() -> CampaignSettings {
    let mut s = CampaignSettings::from_profile(&profile(), TOKEN.as_bytes()).unwrap();
    s.test_timeout = Duration::from_secs(20);
    s.io_timeout = Duration::from_secs(5);
    s.iterations = 10;
    s
}

/// The campaign's nodes: each name with its endpoint address, in order.
pub fn campaign_nodes(names: &[impl ToString], addrs: &[String]) -> Vec<CampaignNode> {
    names
        .iter()
        .zip(addrs)
        .map(|(n, a)| CampaignNode {
            name: n.to_string(),
            endpoint: a.clone(),
        })
        .collect()
}

/// Where simulated node `i` listens: its own loopback address, port 0 (the kernel picks the
/// port when the endpoint binds; [`start`] reads it back, so no other process can take it in
/// between).
pub fn listen_on(i: u8) -> String {
    format!("127.0.0.{}:0", 10 + i)
}

/// Waits until the process logging to `log` says where its `flag` listener is (the line
/// `railguard_runtime::bind` writes); fails at once if it exits, and after `timeout` with the
/// log's end.
pub fn wait_listen_addr(child: &mut Child, log: &Path, flag: &str, timeout: Duration) -> String {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(addr) = railguard_runtime::logged_listen_addr(&text, flag) {
            return addr.to_string();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "{} exited with {status} before listening:\n{text}",
                log.display()
            );
        }
        assert!(
            started.elapsed() < timeout,
            "no listening line for {flag} in {} after {timeout:?}:\n{text}",
            log.display()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A running endpoint, killed when dropped.
pub struct Endpoint {
    pub child: Child,
    pub log: PathBuf,
    /// Where it listens.
    pub addr: String,
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_railguard-prober"))
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
    let addr = wait_listen_addr(&mut child, &log_path, "--listen", Duration::from_secs(20));
    Endpoint {
        child,
        log: log_path,
        addr,
    }
}
