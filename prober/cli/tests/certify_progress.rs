//! Progress of a certification: the run reports each rail and each NCCL run to its
//! [`Progress`] sink; off a terminal (and with `--json`) the binary draws nothing.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use railguard_prober::certify::run::{gather_invasive_with, invasive_steps, NodeSetup};
use railguard_prober::progress::{Progress, RecordingProgress};
use railguard_prober::sim::{write_sysfs, NodeModel};

fn manifest(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn profile() -> railguard_api::FabricProfile {
    let text =
        std::fs::read_to_string(manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rail_and_nccl_run_is_a_step() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sysfs");
    let model = NodeModel::load(&manifest("models/dgx-h100.yaml")).unwrap();
    write_sysfs(&model, &root).unwrap();
    let engine = railguard_prober::rdma::SimulatedRdmaEngine::new(
        railguard_prober::campaign::simnode::rdma_model(&model, "node-a"),
    )
    .unwrap();
    let setup = NodeSetup {
        sysfs_root: root.clone(),
        use_nvml: false,
        engine: Arc::new(engine),
        nccl_binary: PathBuf::from(env!("CARGO_BIN_EXE_all_reduce_perf_sim")),
        nccl_env: vec![
            ("RAILGUARD_SIM_ROOT".into(), root.display().to_string()),
            ("RAILGUARD_SIM_HOSTNAME".into(), "node-a".into()),
        ],
        log_dir: dir.path().join("logs"),
        nccl_timeout: Duration::from_secs(120),
        sim: Some(model),
    };
    let profile = profile();
    let progress = Arc::new(RecordingProgress::default());
    let sink: Arc<dyn Progress> = progress.clone();
    gather_invasive_with(&setup, &profile.spec, None, sink)
        .await
        .unwrap();
    let events = progress.events();
    let rails = profile.spec.rails.len();
    assert_eq!(invasive_steps(&profile.spec), rails as u64 + 1);
    assert_eq!(events[0], format!("plan {}", rails + 1));
    // Every planned step is done once.
    assert_eq!(events.iter().filter(|e| *e == "done").count(), rails + 1);
    // Which rail, which step.
    assert!(
        events.contains(&"step RDMA 1/8 mlx5_0:1 host memory".to_string()),
        "{events:?}"
    );
    assert!(
        events.contains(&"step RDMA 1/8 mlx5_0:1 GPU 0 memory".to_string()),
        "{events:?}"
    );
    assert!(
        events.contains(&"step RDMA 8/8 mlx5_11:1 host memory".to_string()),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("step NCCL 1/1 main (all_reduce_perf_sim")),
        "{events:?}"
    );
    // finish() is the caller's (certify_once), after the whole window.
    assert!(!events.contains(&"finish".to_string()));
}

#[test]
fn off_a_terminal_certify_prints_nothing_but_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    let bin = env!("CARGO_BIN_EXE_railguard-prober");
    let out = Command::new(bin)
        .args(["sim-sysfs", "--model"])
        .arg(manifest("models/dgx-h100.yaml"))
        .arg("--out")
        .arg(&node)
        .output()
        .unwrap();
    assert!(out.status.success());
    for json in [false, true] {
        let mut c = Command::new(bin);
        c.args(["certify", "--node", "node-a", "--sim-root"])
            .arg(&node)
            .arg("--profile-file")
            .arg(manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml"))
            .arg("--log-dir")
            .arg(dir.path().join("logs"))
            // Logs off: whatever is left on stderr would be progress.
            .env("RAILGUARD_LOG", "off")
            .env_remove("RAILGUARD_JSON");
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(
            out.stderr.is_empty(),
            "stderr is a pipe: nothing drawn, got {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(!stdout.contains('\u{1b}'), "{stdout:?}");
        if json {
            let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(v["verdict"], "certified");
        } else {
            assert!(stdout.ends_with("verdict: certified\n"), "{stdout}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_campaign_round_is_planned_and_each_pair_test_is_a_step() {
    use railguard_prober::campaign::coordinator::{
        run_campaign_with, CampaignNode, CampaignSettings,
    };
    let p = profile();
    let mut settings = CampaignSettings::from_profile(&p, &[7u8; 32]).unwrap();
    settings.io_timeout = Duration::from_millis(300);
    settings.test_timeout = Duration::from_secs(1);
    // Endpoints that refuse connections: every test is inconclusive, quickly.
    let nodes: Vec<CampaignNode> = (1..=4)
        .map(|i| CampaignNode {
            name: format!("node-{i}"),
            endpoint: format!("127.0.0.1:{i}"),
        })
        .collect();
    let progress = RecordingProgress::default();
    let report = run_campaign_with(&nodes, &settings, jiff::Timestamp::now(), &progress)
        .await
        .unwrap();
    let events = progress.events();
    let planned: u64 = events
        .iter()
        .filter_map(|e| e.strip_prefix("plan "))
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert_eq!(planned as usize, report.tests.len(), "{events:?}");
    assert_eq!(
        events.iter().filter(|e| *e == "done").count(),
        report.tests.len()
    );
    assert!(
        events.iter().any(|e| e.starts_with("step round 1: ")),
        "{events:?}"
    );
}
