//! `certify` with `certification.ncclRunner: Native` (the default): the node's NCCL loopback
//! run by the prober's own `nccl-ranks --single-node` child through NCCL's C API, over the
//! CUDA and NCCL test doubles (railguard-gpu's `doubles`, loaded by the same dlopen code as
//! libcuda.so.1 and libnccl.so.2) on a simulated DGX H100. The doubles choose transports as
//! NCCL does, so the loopback's P2P and SHM switches are what send every hop through the
//! NICs, and the simulated node's fabric runs at its model's bus bandwidth.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(p)
}

struct Node {
    dir: tempfile::TempDir,
    root: PathBuf,
    profile: PathBuf,
    doubles: railguard_gpu::doubles::Doubles,
    /// The simulated node's GPUs, for the CUDA double.
    gpus: String,
}

/// A simulated DGX H100 and the shipped DGX H100 profile (its native runner and threshold),
/// with a shorter sweep.
fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sysfs");
    let out = Command::new(common::prober_with_standin())
        .args(["sim-sysfs", "--model"])
        .arg(manifest("models/dgx-h100.yaml"))
        .arg("--out")
        .arg(&root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text =
        std::fs::read_to_string(manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    let mut profile: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert!(profile["spec"]["certification"]["ncclRunner"].is_null());
    profile["spec"]["certification"]["ncclNative"] = serde_json::json!({
        "minBytes": 1 << 20, "maxBytes": 32 << 20, "warmup": 1, "iterations": 5
    });
    let path = dir.path().join("profile.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&profile).unwrap()).unwrap();
    let discovered = Command::new(common::prober_with_standin())
        .args(["discover", "--json", "--sysfs-root"])
        .arg(&root)
        .output()
        .unwrap();
    let discovered: Value = serde_json::from_slice(&discovered.stdout).unwrap();
    let gpus: Vec<&str> = discovered["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pciBusId"].as_str().unwrap())
        .collect();
    assert_eq!(gpus.len(), 8);
    let doubles = railguard_gpu::doubles::build(dir.path()).unwrap();
    Node {
        gpus: gpus.join(","),
        dir,
        root,
        profile: path,
        doubles,
    }
}

/// `certify --json` of the node: (exit code, report).
fn certify(n: &Node, nccl: Option<&Path>, env: &[(&str, &str)]) -> (i32, Value) {
    let mut c = Command::new(common::prober_with_standin());
    c.args(["certify", "--node", "node-a", "--json", "--sim-root"])
        .arg(&n.root)
        .arg("--profile-file")
        .arg(&n.profile)
        .arg("--log-dir")
        .arg(n.dir.path().join("logs"))
        .arg("--cuda-library")
        .arg(&n.doubles.cuda)
        .env("RAILGUARD_LOG", "off")
        .env("RAILGUARD_CUDA_DOUBLE_PCI", &n.gpus)
        .env_remove("LD_LIBRARY_PATH");
    if let Some(p) = nccl {
        c.arg("--nccl-library").arg(p);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

fn reasons(report: &Value) -> String {
    report["reasons"].to_string()
}

#[test]
fn the_native_loopback_certifies_a_healthy_node_through_every_nic() {
    let n = node();
    let (code, report) = certify(&n, Some(&n.doubles.nccl), &[]);
    let cert = &report;
    assert_eq!(cert["verdict"], "certified", "{report:#}");
    assert_eq!(code, 0);
    let nccl = &cert["nccl"];
    assert_eq!(nccl["ranks"], 8, "one rank per GPU: {nccl}");
    assert_eq!(nccl["transport"], "IB", "{nccl}");
    assert_eq!(nccl["gdr"], true, "{nccl}");
    assert_eq!(nccl["ncclVersion"], "2.21.5", "{nccl}");
    let hcas: Vec<&str> = nccl["hcas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    assert_eq!(
        hcas.len(),
        8,
        "every rail's HCA carried the loopback: {nccl}"
    );
    // The simulated fabric's, which the shipped 40 GB/s threshold accepts.
    let plateau = nccl["busbwPlateauGBps"].as_f64().unwrap();
    assert!((40.0..=46.5).contains(&plateau), "{nccl}");
    assert!(
        cert["software"]["libnccl"]
            .as_str()
            .is_some_and(|d| d.len() == 64),
        "the library that ran is in the baseline: {}",
        cert["software"]
    );
    // The version ncclGetVersion of the loaded library answered.
    assert_eq!(cert["software"]["nccl"], "2.21.5", "{}", cert["software"]);
}

/// Without libraries given, a simulated node builds the doubles into its own tree, with its
/// GPUs as the CUDA double's devices, and certifies with them as shipped.
#[test]
fn a_simulated_node_loads_doubles_of_its_own_without_libraries_given() {
    let n = node();
    let out = Command::new(common::prober_with_standin())
        .args(["certify", "--node", "node-a", "--json", "--sim-root"])
        .arg(&n.root)
        .arg("--profile-file")
        .arg(manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml"))
        .arg("--log-dir")
        .arg(n.dir.path().join("logs"))
        .env("RAILGUARD_LOG", "off")
        .env_remove("RAILGUARD_CUDA_LIBRARY")
        .env_remove("RAILGUARD_NCCL_LIBRARY")
        .env_remove("RAILGUARD_CUDA_DOUBLE_PCI")
        .output()
        .unwrap();
    let cert: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(cert["verdict"], "certified", "{cert:#}");
    assert_eq!(cert["nccl"]["ranks"], 8, "{cert:#}");
    let libs = n.root.join("railguard-sim/gpu-libs");
    assert!(libs.join("libnccl.so.2").is_file() && libs.join("libcuda.so.1").is_file());
    let pci = std::fs::read_to_string(libs.join("railguard-cuda-double.pci")).unwrap();
    assert_eq!(pci.lines().collect::<Vec<_>>().join(","), n.gpus);
}

#[test]
fn without_gdr_without_nccl_or_with_one_gpu_the_node_is_not_certified() {
    let n = node();
    // GPUDirect off on the NICs: the loopback runs but fails the profile's expectGdr.
    let (code, report) = certify(
        &n,
        Some(&n.doubles.nccl),
        &[("RAILGUARD_NCCL_DOUBLE_GDR", "0")],
    );
    assert_eq!(code, 1, "{report:#}");
    assert_ne!(report["verdict"], "certified");
    assert!(
        reasons(&report).contains("GPUDirect RDMA not in use"),
        "{report:#}"
    );
    // No NCCL library where the loader looks: not measured, and said so.
    let (code, report) = certify(&n, Some(&n.dir.path().join("missing/libnccl.so.2")), &[]);
    assert_eq!(code, 1, "{report:#}");
    assert!(
        reasons(&report).contains("NCCL cannot run on this node"),
        "{report:#}"
    );
    // CUDA sees one GPU (CUDA_VISIBLE_DEVICES=0, say): one rank moves no byte.
    let one = n.gpus.split(',').next().unwrap().to_string();
    let (code, report) = certify(
        &n,
        Some(&n.doubles.nccl),
        &[("RAILGUARD_CUDA_DOUBLE_PCI", one.as_str())],
    );
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["nccl"]["ranks"], 1, "{report:#}");
    assert!(reasons(&report).contains("NCCL ran 1 rank"), "{report:#}");
}
