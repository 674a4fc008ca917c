//! Progress of a certification on a simulated node: the run reports each rail and each NCCL
//! run (the `all_reduce_perf_sim` child process) to its [`Progress`] sink.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use railguard_prober::certify::run::{gather_invasive_with, invasive_steps, NodeSetup};
use railguard_prober::progress::{Progress, RecordingProgress};
use railguard_sim::node::{rdma_model, standin_env};
use railguard_sim::rdma::SimulatedRdmaEngine;
use railguard_sim::software::ModelSoftware;
use railguard_sim::{write_sysfs, NodeModel};

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../prober")).join(p)
}

/// The shipped DGX H100 profile, run by nccl-tests: this test is about the stand-in's steps.
fn profile() -> railguard_api::FabricProfile {
    let text =
        std::fs::read_to_string(manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    let mut p = railguard_api::profiles_from_yaml(&text).unwrap().remove(0);
    p.spec.certification.nccl_runner = railguard_api::profile::NcclRunner::NcclTests;
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rail_and_nccl_run_is_a_step() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sysfs");
    let model = NodeModel::load(&manifest("models/dgx-h100.yaml")).unwrap();
    write_sysfs(&model, &root).unwrap();
    let engine = SimulatedRdmaEngine::new(rdma_model(&model, "node-a")).unwrap();
    let setup = NodeSetup {
        sysfs_root: root.clone(),
        use_nvml: false,
        engine: Arc::new(engine),
        nccl_binary: PathBuf::from(env!("CARGO_BIN_EXE_all_reduce_perf_sim")),
        // Not run: the profile runs nccl-tests (the stand-in).
        native_nccl: railguard_prober::nccl::native::NativeNccl::new(PathBuf::from(
            "railguard-prober",
        )),
        nccl_env: standin_env(&root, "node-a"),
        log_dir: dir.path().join("logs"),
        nccl_timeout: Duration::from_secs(120),
        software: Arc::new(ModelSoftware::new(&root, model.software.clone())),
        simulated: true,
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
