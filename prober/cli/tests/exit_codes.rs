//! One exit-status convention for every `railguard-prober` subcommand, on the built binary
//! with simulated nodes: 0 pass, 1 a failed verdict or a CRITICAL finding, 2 a usage,
//! configuration or runtime error (README, "Exit status").
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(p)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(common::prober_with_standin());
    c.args(args);
    for k in [
        "RAILGUARD_JSON",
        "RAILGUARD_SYSFS_ROOT",
        "RAILGUARD_PROFILE",
        "RAILGUARD_PROFILE_FILE",
        "KUBECONFIG",
        "KUBERNETES_SERVICE_HOST",
        "NCCL_IB_HCA",
        "RAILGUARD_SHM_SIZE",
    ] {
        c.env_remove(k);
    }
    c.env("RAILGUARD_LOG", "warn");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run railguard-prober")
}

#[track_caller]
fn exits(code: i32, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = run(args, env);
    assert_eq!(
        out.status.code(),
        Some(code),
        "railguard-prober {args:?}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn sim(model: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = manifest(&format!("models/{model}.yaml"));
    exits(
        0,
        &["sim-sysfs", "--model", s(&model), "--out", s(dir.path())],
        &[],
    );
    dir
}

fn h100_profile() -> PathBuf {
    manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml")
}

#[test]
fn discover_fails_on_a_critical_finding() {
    let ok = sim("dgx-h100");
    exits(0, &["discover", "--sysfs-root", s(ok.path())], &[]);
    // The port-down model: "[CRITICAL] compute rail mlx5_5:1 is DOWN", with --json too.
    let down = sim("h100-port-down");
    let out = exits(
        1,
        &["discover", "--sysfs-root", s(down.path()), "--json"],
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
    assert!(v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["severity"] == "critical"));
    exits(
        2,
        &["discover", "--sysfs-root", "/nonexistent/railguard"],
        &[],
    );
    exits(2, &["discover", "--no-such-flag"], &[]);
}

#[test]
fn affinity_fails_on_a_critical_finding() {
    let topo = manifest("fixtures/topo/hgx-h100-roce400-12nic-single-numa.txt");
    exits(0, &["affinity", "--topo", s(&topo)], &[]);
    // GPU0 reaches every NIC only across sockets: its closest compute NIC is SYS away.
    let text = std::fs::read_to_string(&topo).unwrap();
    let far: String = text
        .lines()
        .map(|l| {
            if l.starts_with("GPU0\t") {
                l.replace("PIX", "SYS").replace("NODE", "SYS")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let dir = tempfile::tempdir().unwrap();
    let far_path = dir.path().join("far.txt");
    std::fs::write(&far_path, far).unwrap();
    let out = exits(1, &["affinity", "--topo", s(&far_path)], &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("[CRITICAL]"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    exits(2, &["affinity", "--topo", "/nonexistent/topo.txt"], &[]);
}

#[test]
fn emit_profile_and_sim_sysfs_pass_or_error() {
    let ok = sim("dgx-h100");
    exits(
        0,
        &[
            "emit-profile",
            "--sysfs-root",
            s(ok.path()),
            "--profile",
            "p",
        ],
        &[],
    );
    exits(
        2,
        &[
            "emit-profile",
            "--sysfs-root",
            "/nonexistent",
            "--profile",
            "p",
        ],
        &[],
    );
    exits(2, &["emit-profile"], &[]);
    let dir = tempfile::tempdir().unwrap();
    exits(
        2,
        &[
            "sim-sysfs",
            "--model",
            "/nonexistent.yaml",
            "--out",
            s(dir.path()),
        ],
        &[],
    );
}

#[test]
fn certify_is_0_certified_1_not_2_error() {
    let profile = h100_profile();
    let logs = tempfile::tempdir().unwrap();
    for (model, code, verdict) in [
        ("dgx-h100", 0, "certified"),
        // One rail down of eight: that rail failed, the node serves on seven (`degraded`).
        ("h100-port-down", 1, "degraded"),
    ] {
        let node = sim(model);
        let out = exits(
            code,
            &[
                "certify",
                "--node",
                "node-a",
                "--sim-root",
                s(node.path()),
                "--profile-file",
                s(&profile),
                "--log-dir",
                s(logs.path()),
                "--json",
            ],
            &[],
        );
        let cert: serde_json::Value = serde_json::from_slice(&out.stdout).expect("certificate");
        assert_eq!(cert["verdict"], verdict, "{model}");
    }
    exits(
        2,
        &[
            "certify",
            "--node",
            "node-a",
            "--profile-file",
            "/nonexistent.yaml",
        ],
        &[],
    );
}

/// A FabricProfile may only name an nccl-tests binary the prober was installed to allow:
/// editing a profile must not run an arbitrary program as root on every node.
#[test]
fn a_profile_naming_a_binary_outside_the_allow_list_is_refused() {
    let node = sim("dgx-h100");
    let text = std::fs::read_to_string(h100_profile()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let evil = dir.path().join("evil.yaml");
    std::fs::write(
        &evil,
        text.replace(
            "  certification:\n",
            "  certification:\n    ncclRunner: NcclTests\n    ncclTests: { binary: /tmp/payload }\n",
        ),
    )
    .unwrap();
    let args = [
        "certify",
        "--node",
        "node-a",
        "--sysfs-root",
        s(node.path()),
        "--profile-file",
        s(&evil),
    ];
    let out = exits(2, &args, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("names ncclTests.binary /tmp/payload, which this prober may not run")
            && stderr.contains("/usr/local/bin/all_reduce_perf (--allowed-nccl-binaries)"),
        "{stderr}"
    );
    // Allowed at install time, the same profile gets past the check (and fails later, on
    // this machine without RDMA devices, for reasons of its own).
    let out = run(
        &args,
        &[("RAILGUARD_ALLOWED_NCCL_BINARIES", "/tmp/payload")],
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("which this prober may not run"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn analyze_is_0_pass_or_unknown_1_fail_2_error() {
    let oci = manifest("fixtures/nccl-tests/oci-h100-roce-2x8-allreduce.txt");
    let sock = manifest("fixtures/nccl-debug/moc-h100-2x4-socket-fallback.txt");
    // No thresholds: unknown, not a failure.
    exits(0, &["analyze", "--nccl-tests", s(&oci)], &[]);
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.log");
    std::fs::write(
        &good,
        "n:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; OOB eth0:1<0>\n\
         n:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n\
         n:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1/GDRDMA\n",
    )
    .unwrap();
    let profile = h100_profile();
    let args = [
        "analyze",
        "--nccl-tests",
        s(&oci),
        "--nccl-log",
        s(&good),
        "--profile-file",
        s(&profile),
    ];
    exits(0, &args, &[]);
    exits(1, &["analyze", "--nccl-log", s(&sock)], &[]);
    exits(2, &["analyze"], &[]);
    // The same judgement of a collected 2-node log from `campaign --nccl-log`.
    let campaign = |log: &Path| {
        vec![
            "campaign".to_string(),
            "--profile".into(),
            "h100-ndr".into(),
            "--profile-file".into(),
            s(&profile).into(),
            "--nccl-log".into(),
            s(&oci).into(),
            "--nccl-log".into(),
            s(log).into(),
        ]
    };
    let args = campaign(&good);
    exits(0, &args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let args = campaign(&sock);
    let out = exits(1, &args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("verdict: fail"));
    exits(
        2,
        &[
            "campaign",
            "--profile",
            "h100-ndr",
            "--nccl-log",
            s(&oci),
            "--profile-file",
            "/nonexistent",
        ],
        &[],
    );
}

/// A container view for `preflight --root`: one HCA with its device file, CAP_IPC_LOCK
/// effective, and /dev/shm (statvfs'd: a directory on the test's filesystem, large enough
/// for a small expected size).
fn container_view() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let dirs = [
        "sys/class/infiniband/mlx5_0/device/infiniband_verbs/uverbs0",
        "dev/infiniband",
        "dev/shm",
        "proc/self",
    ];
    for d in dirs {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let files = [
        ("dev/infiniband/uverbs0", ""),
        ("proc/self/status", "CapEff:\t0000000000004000\n"),
    ];
    for (f, text) in files {
        std::fs::write(root.join(f), text).unwrap();
    }
    dir
}

#[test]
fn preflight_is_0_passed_1_failed_2_usage() {
    let view = container_view();
    let root = s(view.path());
    let good = [("NCCL_IB_HCA", "=mlx5_0:1"), ("RAILGUARD_SHM_SIZE", "1Mi")];
    let out = exits(0, &["preflight", "--root", root], &good);
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("railguard preflight passed\n"));
    // An HCA the pod cannot see: exit 1, the report on stderr ending with the reason.
    let bad = [
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
        ("RAILGUARD_SHM_SIZE", "1Mi"),
    ];
    let out = exits(1, &["preflight", "--root", root], &bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.lines().last(),
        Some("railguard preflight failed: NCCL_IB_HCA names mlx5_3 but the pod cannot see them"),
        "{err}"
    );
    // --json: on stdout either way.
    let out = exits(1, &["preflight", "--root", root, "--json"], &bad);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["passed"], false);
    assert_eq!(
        v["failure"],
        "NCCL_IB_HCA names mlx5_3 but the pod cannot see them"
    );
    exits(2, &["preflight", "--no-such-flag"], &good);
}

#[test]
fn long_running_subcommands_exit_2_on_errors() {
    // Short shared token, before anything listens.
    exits(
        2,
        &[
            "peer-endpoint",
            "--node",
            "a",
            "--profile",
            "p",
            "--token",
            "short",
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    exits(
        2,
        &[
            "daemon",
            "--node",
            "a",
            "--metrics-listen",
            "127.0.0.1:0",
            "--kubeconfig",
            "/nonexistent",
        ],
        &[],
    );
    exits(
        2,
        &["campaign", "--profile", "p", "--kubeconfig", "/nonexistent"],
        &[],
    );
    exits(2, &["no-such-subcommand"], &[]);
}
