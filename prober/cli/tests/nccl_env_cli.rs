//! `railguard-prober nccl-env`, the real binary, against a synthetic container sysfs tree and
//! node file: what the plugin would answer, exit 0 / 1 (unhealthy) / 2 (unreadable input or
//! usage), text and JSON.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_railguard-prober");

/// A container that was given mlx5_0 (PF 0000:0c:00.0, port 1) only.
fn container(root: &Path) {
    let pci = root.join("sys/devices/pci0000:00/0000:0c:00.0");
    fs::create_dir_all(pci.join("net/ibp12s0")).unwrap();
    let dev = root.join("sys/class/infiniband/mlx5_0");
    fs::create_dir_all(dev.join("ports/1")).unwrap();
    symlink(&pci, dev.join("device")).unwrap();
}

fn node_file(dir: &Path, expires_at: &str) -> PathBuf {
    let path = dir.join("nccl.json");
    let text = serde_json::json!({
        "version": 1, "node": "gpu-a1", "profile": "h100-ib",
        "certificate": {"generation": 7, "verdict": "degraded", "expiresAt": expires_at},
        "rails": [
            {"hca": "mlx5_0", "port": 1, "pciAddress": "0000:0c:00.0", "health": "healthy"},
            {"hca": "mlx5_1", "port": 1, "pciAddress": "0000:2a:00.0", "health": "failed"}
        ],
        "nccl": {"socketIfname": "=eth0", "trafficClass": 106}
    });
    fs::write(&path, text.to_string()).unwrap();
    path
}

/// The binary with a clean environment: no NCCL_* or GPU visibility of the test's own.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.env_clear().arg("nccl-env").args(args);
    if let Some(p) = std::env::var_os("PATH") {
        c.env("PATH", p);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Case {
    _dir: tempfile::TempDir,
    root: String,
    config: String,
}

fn case(expires_at: &str, with_devices: bool) -> Case {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir_all(&root).unwrap();
    if with_devices {
        container(&root);
    }
    let config = node_file(dir.path(), expires_at);
    Case {
        root: root.display().to_string(),
        config: config.display().to_string(),
        _dir: dir,
    }
}

#[test]
fn a_healthy_answer_prints_name_value_lines_and_exits_0() {
    let c = case("2999-01-01T00:00:00Z", true);
    let out = run(&["--config", &c.config, "--sysfs-root", &c.root], &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        "NCCL_IB_HCA==mlx5_0:1\nNCCL_IB_TC=106\nNCCL_SOCKET_IFNAME==eth0\n"
    );
    assert!(
        stderr.contains("info: rails not answered: mlx5_1:1 (failed)"),
        "{stderr}"
    );
}

#[test]
fn the_containers_own_value_is_kept_as_the_plugin_would() {
    let c = case("2999-01-01T00:00:00Z", true);
    // The node file through its variable, as the plugin reads it.
    let out = run(
        &["--sysfs-root", &c.root],
        &[
            ("RAILGUARD_NCCL_CONFIG", &c.config),
            ("NCCL_SOCKET_IFNAME", "=eth7"),
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("NCCL_SOCKET_IFNAME"), "{stdout}");
    assert!(
        stderr.contains("the container's \"=eth7\" is kept"),
        "{stderr}"
    );
}

#[test]
fn json_gives_variables_warnings_unhealthy_and_the_node_file() {
    let c = case("2999-01-01T00:00:00Z", true);
    let out = run(
        &["--config", &c.config, "--sysfs-root", &c.root, "--json"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["variables"]["NCCL_IB_HCA"], "=mlx5_0:1");
    assert_eq!(v["unhealthy"], false);
    assert_eq!(v["warnings"], serde_json::json!([]));
    assert_eq!(v["nodeFile"], c.config.as_str());
}

#[test]
fn an_expired_certificate_is_unhealthy_exit_1() {
    let c = case("2000-01-01T00:00:00Z", true);
    let out = run(
        &["--config", &c.config, "--sysfs-root", &c.root, "--json"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["unhealthy"], true);
    assert_eq!(v["variables"], serde_json::json!({}));
    let w = v["warnings"].to_string();
    assert!(w.contains("expired at 2000-01-01T00:00:00Z"), "{w}");
    // Text: nothing on stdout, the warning on stderr.
    let out = run(&["--config", &c.config, "--sysfs-root", &c.root], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    assert!(
        text(&out.stderr).contains("warning: railguard: gpu-a1: certificate generation 7 expired")
    );
}

#[test]
fn a_container_without_the_rails_devices_is_unhealthy_exit_1() {
    let c = case("2999-01-01T00:00:00Z", false);
    let out = run(&["--config", &c.config, "--sysfs-root", &c.root], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no rail is healthy, visible in this container"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_unreadable_node_file_or_a_bad_flag_is_exit_2() {
    let c = case("2999-01-01T00:00:00Z", true);
    let missing = format!("{}.missing", c.config);
    let out = run(&["--config", &missing, "--sysfs-root", &c.root], &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("railguard-prober: ")
            && last.contains("(--config)")
            && last.contains(&missing),
        "{stderr}"
    );
    fs::write(&c.config, "not json").unwrap();
    let out = run(&["--config", &c.config, "--sysfs-root", &c.root], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not a json object"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["--no-such-flag"], &[]);
    assert_eq!(out.status.code(), Some(2));
}
