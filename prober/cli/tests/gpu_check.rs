//! `railguard-prober gpu-check` as a node operator runs it, against the CUDA and NCCL test
//! doubles (loaded by the same dlopen code as the real libraries): a CPU-only node is
//! skipped, a GPU node passes with a correct one-GPU all-reduce, and a wrong result or a
//! missing NCCL fails with the reason. tests/scripts/gpu-check.sh runs the same subcommand on
//! a machine with a real GPU.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_railguard-prober");

fn gpu_check(args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let mut cmd = Command::new(BIN);
    cmd.arg("gpu-check").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run railguard-prober gpu-check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "gpu-check printed no JSON ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// A small run's arguments: the sysfs tree at `root`, these libraries, few and small
/// buffers.
fn small_run<'a>(root: &'a str, cuda: &'a str, nccl: Option<&'a str>) -> Vec<&'a str> {
    let mut args = vec!["--sysfs-root", root, "--cuda-library", cuda];
    if let Some(nccl) = nccl {
        args.extend(["--nccl-library", nccl]);
    }
    args.extend([
        "--alloc-bytes",
        "65536",
        "--sizes",
        "4096,65536",
        "--iterations",
        "3",
    ]);
    args
}

#[test]
fn gpu_check_skips_cpu_only_nodes_and_checks_every_layer_of_a_gpu_node() {
    let dir = tempfile::tempdir().unwrap();
    let doubles = railguard_gpu::doubles::build(dir.path()).unwrap();
    let root = tempfile::tempdir().unwrap();
    let root_arg = root.path().to_str().unwrap();
    let absent = dir.path().join("absent/libcuda.so.1");
    let (cuda, nccl) = (
        doubles.cuda.to_str().unwrap(),
        doubles.nccl.to_str().unwrap(),
    );
    // A CPU-only node: no GPU on the bus, no driver. Skipped, exit 0.
    let args = small_run(root_arg, absent.to_str().unwrap(), None);
    let (code, r) = gpu_check(&args, &[]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "skip", "{r:#}");
    assert!(r["cuda"]["notRun"]
        .as_str()
        .unwrap()
        .contains("cannot load the CUDA driver library"));

    // Two GPUs: every layer answers; the all-reduce's result is checked element by element.
    let args = small_run(root_arg, cuda, Some(nccl));
    let env = [
        ("RAILGUARD_CUDA_DOUBLE_PCI", "0000:1b:00.0,0000:9a:00.0"),
        ("RAILGUARD_CUDA_DOUBLE_DMABUF", "memfd"),
    ];
    let (code, r) = gpu_check(&args, &env);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "pass", "{r:#}");
    let devices = r["cuda"]["ok"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["pciBusId"], "0000:9a:00.0");
    for m in r["memory"].as_array().unwrap() {
        assert_eq!(m["roundTrip"], "ok", "{m}");
        assert_eq!(m["dmaBuf"], "ok", "{m}");
    }
    let points = r["nccl"]["ok"]["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for p in points {
        assert_eq!(p["wrong"], 0, "{p}");
        // One rank: busbw is algbw x 2(n-1)/n = 0, as nccl-tests prints it.
        assert_eq!(p["busbwGBps"].as_f64(), Some(0.0), "{p}");
        assert!(p["algbwGBps"].as_f64().unwrap() > 0.0, "{p}");
    }

    // A wrong all-reduce result fails the node, with the count.
    let mut corrupt = env.to_vec();
    corrupt.push(("RAILGUARD_NCCL_DOUBLE_CORRUPT", "1"));
    let (code, r) = gpu_check(&args, &corrupt);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(r["status"], "fail");
    assert!(r["reasons"][0]
        .as_str()
        .unwrap()
        .contains("NCCL all-reduce of 4096 bytes: 1 wrong values"));

    // No NCCL library: a failed layer, named.
    let missing = dir.path().join("absent/libnccl.so.2");
    let args = small_run(root_arg, cuda, Some(missing.to_str().unwrap()));
    let (code, r) = gpu_check(&args, &env);
    assert_eq!(code, 1, "{r:#}");
    assert!(r["reasons"][0]
        .as_str()
        .unwrap()
        .starts_with("NCCL: cannot load NCCL from"));
}

/// The script a GPU machine runs (tests/scripts/gpu-check.sh): here through the doubles, and
/// on this CPU-only machine its skip.
#[test]
fn the_gpu_check_script_runs_the_subcommand_and_skips_cpu_only_machines() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scripts/gpu-check.sh"
    );
    let dir = tempfile::tempdir().unwrap();
    let doubles = railguard_gpu::doubles::build(dir.path()).unwrap();
    let out = Command::new(script)
        .env("RAILGUARD_PROBER_BIN", BIN)
        .env("RAILGUARD_CUDA_LIBRARY", &doubles.cuda)
        .env("RAILGUARD_NCCL_LIBRARY", &doubles.nccl)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["status"], "pass", "{report:#}");
    assert_eq!(
        report["nccl"]["ok"]["points"].as_array().map(Vec::len),
        Some(3)
    );

    let has_gpu = std::path::Path::new("/dev/nvidiactl").exists()
        || Command::new("sh")
            .args(["-c", "ldconfig -p | grep -q 'libcuda\\.so\\.1'"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
    if !has_gpu {
        let out = Command::new(script)
            .env_remove("RAILGUARD_CUDA_LIBRARY")
            .env("RAILGUARD_PROBER_BIN", BIN)
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{report:#}");
        assert_eq!(report["status"], "skip", "{report:#}");
    }
}
