//! End-to-end: the prober daemon on a simulated node writes the NCCL plugin's node file
//! (`--nccl-config-file`) from the certificate it publishes to a real kube-apiserver, installs
//! the plugin library (`--nccl-plugin-install-dir`), and the node file loses a rail when a
//! passive check fails it; `railguard-prober nccl-env` over the node's own sysfs answers
//! from that file.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, Patch, PatchParams, PostParams};
use railguard_api::FabricProfile;
use railguard_tests::sim_prober::{h100_profile_file, prober_bin_dir, terminate, Prober};
use railguard_tests::{eventually, fixture_profile, labels, ControlPlane};
use serde_json::json;

const RDMA: &str = "rdma/rdma_shared_device_a";

/// The node file as JSON (its format is the plugin's; `railguard_nccl_env` parses it in the
/// `nccl-env` runs below).
fn read(path: &std::path::Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn rails(f: &serde_json::Value) -> Vec<serde_json::Value> {
    f["rails"].as_array().cloned().unwrap_or_default()
}

/// `railguard-prober nccl-env` over the node file and the node's own sysfs (a container
/// given every rail and GPU), with no NCCL or GPU variable of this process.
fn nccl_env(
    bin: &Path,
    node_file: &Path,
    sysfs: &Path,
    extra: &[&str],
) -> Result<std::process::Output> {
    std::process::Command::new(bin.join("railguard-prober"))
        .arg("nccl-env")
        .arg("--config")
        .arg(node_file)
        .arg("--sysfs-root")
        .arg(sysfs)
        .args(extra)
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("NCCL_IB_HCA")
        .output()
        .context("running nccl-env")
}

/// The daemon on simulated `node`, checking passively every second, writing the node file
/// and installing the plugin from `plugin_source`; its log goes to `log`.
fn spawn_daemon(
    prober: &Prober<'_>,
    node: &str,
    node_file: &Path,
    plugin_dir: &Path,
    plugin_source: &Path,
    log: &Path,
) -> Result<tokio::process::Child> {
    prober
        .passive_daemon(node, "dgx-h100")
        .arg("--nccl-config-file")
        .arg(node_file)
        .arg("--nccl-plugin-install-dir")
        .arg(plugin_dir)
        .arg("--nccl-plugin-source")
        .arg(plugin_source)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("starting the daemon")
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
    let mut daemon = spawn_daemon(
        &prober,
        "gpu-n",
        &node_file,
        &plugin_dir,
        &plugin_source,
        &log,
    )?;

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
    let out = nccl_env(&bin, &node_file, &sysfs, &[])?;
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
    let out = nccl_env(&bin, &node_file, &sysfs, &["--json"])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    // One rail failed, the others pass: the certificate is degraded and the plugin answers
    // the healthy rails only, and says which it left out.
    assert_eq!(failed["certificate"]["verdict"], "degraded", "{failed}");
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["unhealthy"], false, "{v}");
    let hca = v["variables"]["NCCL_IB_HCA"].as_str().unwrap_or_default();
    assert!(
        hca.starts_with('=') && !hca.contains("mlx5_4") && hca.contains("mlx5_0:1"),
        "{v}"
    );
    assert!(
        v["info"]
            .to_string()
            .contains("rails not answered: mlx5_4:1 (failed)"),
        "{v}"
    );

    let status = terminate(&mut daemon, Duration::from_secs(20)).await?;
    assert!(status.success(), "daemon exit: {status}");
    Ok(())
}

/// `nccl.consistentRails`: the daemon reads the fleet controller's
/// `status.fleet.consistentRailCount` off the FabricProfile and writes it into the node file,
/// and the plugin's rules then answer that many rails on this 8-rail node; when the fleet's
/// count changes, the next node file follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleets_rail_count_reaches_the_node_file() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = prober_bin_dir()?;
    let cp = ControlPlane::start().await?;
    cp.apply_fabricprofile_crd().await?;
    let work = tempfile::tempdir()?;
    let mut profile = fixture_profile("dgx-h100-ndr.yaml")?;
    profile.spec.nccl.delivery = railguard_api::profile::NcclDelivery::Plugin;
    profile.spec.nccl.consistent_rails = true;
    let profile_file = work.path().join("profile.yaml");
    std::fs::write(&profile_file, serde_yaml_ng::to_string(&profile)?)?;
    let client = cp.client();
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    profiles.create(&PostParams::default(), &profile).await?;
    // What the fleet controller writes when the fewest healthy rails of a certified node of
    // the profile is 6 (fleet_e2e runs the real controller).
    let set_count = |n: u32| {
        let profiles = profiles.clone();
        let name = profile.name().to_string();
        async move {
            profiles
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"fleet": {
                        "nodes": 3, "outliers": 0, "consistentRailCount": n}}})),
                )
                .await
        }
    };
    set_count(6).await?;
    let prober = Prober {
        bin: bin.clone(),
        kubeconfig: cp.kubeconfig_path(),
        work: work.path(),
        profile_file,
    };
    cp.create_node(
        "gpu-c",
        &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
        &[(RDMA, "1k"), ("nvidia.com/gpu", "8")],
    )
    .await?;
    let node_file = work.path().join("run/railguard/nccl.json");
    let plugin_source = work.path().join("libnccl-env-railguard.so");
    std::fs::write(&plugin_source, b"a stand-in library")?;
    let log = work.path().join("daemon.log");
    let mut daemon = spawn_daemon(
        &prober,
        "gpu-c",
        &node_file,
        &work.path().join("opt/railguard/lib"),
        &plugin_source,
        &log,
    )?;
    let with_count = |n: u64| {
        let node_file = node_file.clone();
        move || {
            let node_file = node_file.clone();
            async move {
                Ok(read(&node_file).filter(|f| {
                    f["certificate"]["verdict"] == "certified"
                        && f["fleet"]["consistentRailCount"] == n
                }))
            }
        }
    };
    let file = eventually(
        Duration::from_secs(120),
        "a certified node file with the fleet's 6 rails",
        with_count(6),
    )
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    assert_eq!(file["nccl"]["consistentRails"], true, "{file}");
    assert_eq!(rails(&file).len(), 8, "{file}");

    let sysfs = work.path().join("sysfs-gpu-c");
    let answered = |out: &std::process::Output| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["variables"]["NCCL_IB_HCA"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches('=')
            .split(',')
            .filter(|r| !r.is_empty())
            .map(str::to_string)
            .collect()
    };
    let out = nccl_env(&bin, &node_file, &sysfs, &["--json"])?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(answered(&out).len(), 6, "{text}");
    assert!(text.contains("like the rest of the fleet"), "{text}");

    // The fleet heals to 8: the next steps write 8, and every rail is answered.
    set_count(8).await?;
    eventually(
        Duration::from_secs(60),
        "the node file with the fleet's 8 rails",
        with_count(8),
    )
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let out = nccl_env(&bin, &node_file, &sysfs, &["--json"])?;
    assert_eq!(
        answered(&out).len(),
        8,
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    daemon.start_kill()?;
    daemon.wait().await?;
    Ok(())
}
