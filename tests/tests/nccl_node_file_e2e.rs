//! End-to-end: the prober daemon on a simulated node writes the NCCL plugin's node file
//! (`--nccl-config-file`) from the certificate it publishes to a real kube-apiserver, installs
//! the plugin library (`--nccl-plugin-install-dir`), and the node file loses a rail when a
//! passive check fails it; `railguard-prober nccl-env` over the node's own sysfs answers
//! from that file.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use railguard_tests::daemon::ANY_LOOPBACK_PORT;
use railguard_tests::sim_prober::{h100_profile_file, prober_bin_dir, Prober};
use railguard_tests::{eventually, labels, ControlPlane};

const RDMA: &str = "rdma/rdma_shared_device_a";

/// The node file as JSON (its format is the plugin's; `railguard_nccl_env` parses it in the
/// `nccl-env` runs below).
fn read(path: &std::path::Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn rails(f: &serde_json::Value) -> Vec<serde_json::Value> {
    f["rails"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_daemon_writes_the_node_file_and_a_failed_rail_leaves_it() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = prober_bin_dir()?;
    let cp = ControlPlane::start().await?;
    let work = tempfile::tempdir()?;
    let prober = Prober {
        bin: bin.clone(),
        kubeconfig: cp.kubeconfig_path(),
        work: work.path(),
        profile_file: h100_profile_file(),
    };
    cp.create_node(
        "gpu-n",
        &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
        &[(RDMA, "1k"), ("nvidia.com/gpu", "8")],
    )
    .await?;
    let node_file = work.path().join("run/railguard/nccl.json");
    let plugin_dir = work.path().join("opt/railguard/lib");
    let plugin_source = work.path().join("libnccl-env-railguard.so");
    std::fs::write(&plugin_source, b"a stand-in library")?;
    let log = work.path().join("daemon.log");
    let mut daemon = prober
        .command("daemon", "gpu-n", "dgx-h100")
        .args([
            "--passive-interval-secs",
            "1",
            "--interval-secs",
            "3600",
            "--window-ms",
            "700",
            "--poll-ms",
            "200",
            "--jitter-percent",
            "0",
        ])
        .arg("--metrics-listen")
        .arg(ANY_LOOPBACK_PORT)
        .arg("--nccl-config-file")
        .arg(&node_file)
        .arg("--nccl-plugin-install-dir")
        .arg(&plugin_dir)
        .arg("--nccl-plugin-source")
        .arg(&plugin_source)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting the daemon")?;

    let certified = eventually(
        Duration::from_secs(120),
        "a certified node file",
        || async { Ok(read(&node_file).filter(|f| f["certificate"]["verdict"] == "certified")) },
    )
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    assert_eq!(certified["version"], 1);
    assert_eq!(certified["node"], "gpu-n");
    let r = rails(&certified);
    assert_eq!(r.len(), 8, "{certified}");
    assert!(
        r.iter()
            .all(|r| r["health"] == "healthy" && r["pciAddress"].is_string()),
        "{certified}"
    );
    let gpus = certified["gpus"].as_array().cloned().unwrap_or_default();
    assert_eq!(gpus.len(), 8, "{certified}");
    assert!(gpus.iter().all(|g| g["rail"].is_string()), "{certified}");
    let meta = std::fs::metadata(&node_file)?;
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o644
    );
    assert_eq!(
        std::fs::read(plugin_dir.join("libnccl-env-railguard.so"))?,
        b"a stand-in library"
    );

    // What the plugin answers over the node's own devices (a container given every rail).
    let sysfs = work.path().join("sysfs-gpu-n");
    let out = std::process::Command::new(bin.join("railguard-prober"))
        .arg("nccl-env")
        .arg("--config")
        .arg(&node_file)
        .arg("--sysfs-root")
        .arg(&sysfs)
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("NCCL_IB_HCA")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("NCCL_IB_HCA==mlx5_"), "{stdout}");
    assert!(stdout.contains("mlx5_4:1"), "{stdout}");

    // Link errors on mlx5_4: a passive check fails the rail, and the node file follows.
    let counter = sysfs.join("sys/class/infiniband/mlx5_4/ports/1/counters/symbol_error");
    let failed = eventually(
        Duration::from_secs(60),
        "mlx5_4:1 failed in the node file",
        || {
            let counter = counter.clone();
            let node_file = node_file.clone();
            async move {
                let now: u64 = std::fs::read_to_string(&counter)?.trim().parse()?;
                std::fs::write(&counter, format!("{}\n", now + 3))?;
                Ok(read(&node_file).filter(|f| {
                    rails(f)
                        .iter()
                        .any(|r| r["hca"] == "mlx5_4" && r["health"] == "failed")
                }))
            }
        },
    )
    .await?;
    let generation = |f: &serde_json::Value| f["certificate"]["generation"].as_u64();
    assert!(generation(&failed) > generation(&certified), "{failed}");
    let out = std::process::Command::new(bin.join("railguard-prober"))
        .arg("nccl-env")
        .arg("--config")
        .arg(&node_file)
        .arg("--sysfs-root")
        .arg(&sysfs)
        .arg("--json")
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    // A failed certificate: the plugin answers nothing, and says so.
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["unhealthy"], true, "{v}");
    assert!(v["warnings"].to_string().contains("is failed"), "{v}");

    let pid = daemon.id().context("daemon pid")?;
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    let status = tokio::time::timeout(Duration::from_secs(20), daemon.wait()).await??;
    assert!(status.success(), "daemon exit: {status}");
    Ok(())
}
