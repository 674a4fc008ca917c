//! The NCCL pair lab shared by tests/nccl_pair.rs and benches/nccl_pair.rs: real
//! `railguard-prober peer-endpoint` processes on loopback over the CUDA and NCCL doubles.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use railguard_api::profile::NcclPairSpec;
use railguard_api::FabricProfile;
use railguard_campaign::coordinator::{
    run_nccl_scope, CampaignNode, CampaignSettings, NcclScopeRecord, NcclSettings,
};
use railguard_campaign::wire::NcclSide;

pub(crate) const TOKEN: &str = "nccl-pair-test-token-0123456789";
/// Two fake GPUs per node.
pub(crate) const GPUS: &str = "0000:1b:00.0,0000:9a:00.0";
/// A slow rail's extra time per all-reduce: far below the minimums set in [`profile`]. A
/// healthy 1 MiB all-reduce of the doubles takes well under a millisecond; the minimums
/// leave it 200 ms (over 200 times that) before a healthy pair fails, so a stall on a busy
/// CI machine does not pass for a slow rail, and the slow rail (500 ms) stays 2.5 times
/// below them.
pub(crate) const SLOW_US: &str = "500000";

pub(crate) fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// The DGX H100 profile cut to two rails (GPU 0 on mlx5_0, GPU 1 on mlx5_3), with NCCL pair
/// tests on small sizes and minimums a loopback run passes and a slow rail does not.
pub(crate) fn profile() -> FabricProfile {
    let text =
        std::fs::read_to_string(root().join("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    let mut p = railguard_api::profiles_from_yaml(&text).unwrap().remove(0);
    p.spec.rails.truncate(2);
    p.spec.certification.nccl_pair = Some(NcclPairSpec {
        // 1 MiB in 200 ms: 0.0052 GB/s algbw; the full node's 4 ranks give busbw 1.5x.
        min_busbw_gbps: Some(0.0075),
        min_rail_busbw_gbps: Some(0.005),
        min_bytes: 256 << 10,
        max_bytes: 1 << 20,
        warmup: 1,
        iterations: 2,
        timeout_seconds: 30,
        ..Default::default()
    });
    p
}

// The endpoint harness of the campaign tests: its port-0 listen address read back from the log.
#[path = "endpoints.rs"]
mod endpoints;

/// Where lab node `i` listens: its own loopback address, port 0 (read back when it starts).
pub(crate) fn listen_on(i: u8) -> String {
    format!("127.0.0.{}:0", 60 + i)
}

pub(crate) struct Endpoint {
    pub(crate) child: Child,
    pub(crate) node: CampaignNode,
    pub(crate) logs: PathBuf,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct Lab {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) doubles: railguard_gpu::doubles::Doubles,
}

impl Lab {
    pub(crate) fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let doubles = railguard_gpu::doubles::build(dir.path()).unwrap();
        Lab { dir, doubles }
    }

    /// A peer endpoint for `node` whose NCCL children see `env` (the doubles' knobs).
    pub(crate) fn endpoint(
        &self,
        i: u8,
        node: &str,
        env: &[(&str, &str)],
        nccl: Option<&Path>,
    ) -> Endpoint {
        let dir = self.dir.path();
        let listen = listen_on(i);
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let logs = dir.join(format!("{node}-nccl"));
        let log_path = dir.join(format!("{node}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_railguard-prober"));
        cmd.arg("peer-endpoint")
            .args(["--node", node, "--profile", "h100-ndr", "--listen", &listen])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--sim")
            .arg(root().join("models/dgx-h100.yaml"))
            .arg("--cuda-library")
            .arg(&self.doubles.cuda)
            .arg("--nccl-library")
            .arg(nccl.unwrap_or(&self.doubles.nccl))
            .arg("--nccl-log-dir")
            .arg(&logs)
            .env_remove("KUBECONFIG")
            .env("RAILGUARD_CUDA_DOUBLE_PCI", GPUS)
            // Both endpoints run on this machine; NCCL (and its double) tells nodes apart
            // by NCCL_HOSTID where it is set (src/misc/utils.cc), so each is a node of its own.
            .env("NCCL_HOSTID", node)
            .env("RAILGUARD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let endpoint =
            endpoints::wait_listen_addr(&mut child, &log_path, "--listen", Duration::from_secs(20));
        Endpoint {
            child,
            node: CampaignNode {
                name: node.to_string(),
                endpoint,
            },
            logs,
        }
    }
}

pub(crate) fn settings(p: &FabricProfile) -> (CampaignSettings, NcclSettings) {
    let mut s = CampaignSettings::from_profile(p, TOKEN.as_bytes()).unwrap();
    s.test_timeout = Duration::from_secs(20);
    s.io_timeout = Duration::from_secs(5);
    s.iterations = 10;
    let nccl = s
        .nccl
        .clone()
        .expect("the profile asks for NCCL pair tests");
    (s, nccl)
}

pub(crate) async fn pair(a: &Endpoint, b: &Endpoint, scope: usize) -> NcclScopeRecord {
    let (s, nccl) = settings(&profile());
    run_nccl_scope(&a.node, &b.node, &s, &nccl, &nccl.scopes[scope]).await
}

pub(crate) fn measured_nranks(r: &NcclScopeRecord) -> Vec<u32> {
    r.sides
        .iter()
        .filter_map(|s| match &s.side {
            NcclSide::Measured { nranks, .. } => Some(*nranks),
            _ => None,
        })
        .collect()
}
