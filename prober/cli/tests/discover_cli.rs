//! The built `railguard-prober` binary: discover / affinity / emit-profile / sim-sysfs.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_railguard-prober");

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(p)
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("RAILGUARD_JSON")
        .env_remove("RAILGUARD_SYSFS_ROOT");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run railguard-prober")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf8")
}

fn sim(model: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = manifest(&format!("models/{model}.yaml"));
    let out = run(
        &[
            "sim-sysfs",
            "--model",
            model.to_str().expect("path"),
            "--out",
            dir.path().to_str().expect("path"),
        ],
        &[],
    );
    let text = ok(&out);
    assert!(text.contains("8 GPUs"), "{text}");
    dir
}

#[test]
fn discover_json_has_the_contract_shape() {
    let dir = sim("dgx-h100");
    let root = dir.path().to_str().expect("path");
    let out = ok(&run(&["discover", "--sysfs-root", root, "--json"], &[]));
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(8));
    assert_eq!(v["gpus"][0]["index"], json!(0));
    assert_eq!(v["gpus"][0]["numa"], json!(0));
    assert_eq!(
        v["gpus"][0]["preferred"],
        json!({"hca": "mlx5_0", "port": 1, "path": "PXB"})
    );
    assert_eq!(v["gpus"][5]["preferred"]["hca"], json!("mlx5_9"));
    assert_eq!(v["gpus"][0]["alternates"][0]["hca"], json!("mlx5_3"));
    assert_eq!(v["gpus"][0]["alternates"][0]["path"], json!("NODE"));
    assert_eq!(v["indexOrder"], json!("pci"));
    assert_eq!(v["rails"].as_array().map(Vec::len), Some(8));
    assert!(v["signature"]
        .as_str()
        .is_some_and(|s| s.starts_with("v1-")));
    // Same through environment variables.
    let env_out = ok(&run(
        &["discover"],
        &[("RAILGUARD_SYSFS_ROOT", root), ("RAILGUARD_JSON", "true")],
    ));
    assert_eq!(serde_json::from_str::<Value>(&env_out).expect("json"), v);
}

#[test]
fn discover_table_names_rails_and_findings() {
    let dir = sim("h100-port-down");
    let out = run(
        &[
            "discover",
            "--sysfs-root",
            dir.path().to_str().expect("path"),
        ],
        &[],
    );
    // A CRITICAL finding is exit status 1, with the table printed all the same.
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = String::from_utf8(out.stdout).expect("utf8");
    assert!(out.contains("GPU affinity"), "{out}");
    assert!(out.contains("mlx5_5:1"), "{out}");
    assert!(
        out.contains("[CRITICAL] compute rail mlx5_5:1 is DOWN"),
        "{out}"
    );
    assert!(
        out.contains("storage/management NICs: mlx5_1:1, mlx5_2:1, mlx5_7:1, mlx5_8:1"),
        "{out}"
    );
}

#[test]
fn affinity_from_topo_json_has_null_ports() {
    let topo = manifest("fixtures/topo/dgx-h200-layout-12nic-pxb-pix-pairs-tabs.txt");
    let out = ok(&run(
        &["affinity", "--topo", topo.to_str().expect("path"), "--json"],
        &[],
    ));
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        v["gpus"][0],
        json!({
            "index": 0,
            "numa": 0,
            "preferred": {"hca": "mlx5_0", "port": null, "path": "PXB"},
            "alternates": [
                {"hca": "mlx5_3", "path": "NODE"},
                {"hca": "mlx5_4", "path": "NODE"},
                {"hca": "mlx5_5", "path": "NODE"}
            ]
        })
    );
    assert_eq!(v["gpus"][7]["preferred"]["hca"], json!("mlx5_11"));
    assert_eq!(v["indexOrder"], json!("topo"));
}

#[test]
fn affinity_on_a_cut_file_fails_clearly() {
    let topo = manifest("fixtures/topo/gcp-a4-b200-8nic-roce-pix-pairs.txt");
    let text = std::fs::read_to_string(&topo).expect("fixture");
    let dir = tempfile::tempdir().expect("tempdir");
    let cut = dir.path().join("cut.txt");
    std::fs::write(&cut, &text[..text.len() / 2]).expect("write");
    let out = run(&["affinity", "--topo", cut.to_str().expect("path")], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "invalid nvidia-smi topo -m output {} (--topo)",
            cut.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("matrix is incomplete: no row for GPU7"),
        "{err}"
    );
    let missing = run(&["affinity", "--topo", "/nonexistent/topo.txt"], &[]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr)
        .contains("cannot read nvidia-smi topo -m output /nonexistent/topo.txt (--topo)"));
}

#[test]
fn emit_profile_is_a_valid_fabricprofile_matching_the_example() {
    let dir = sim("dgx-h100");
    let out = ok(&run(
        &[
            "emit-profile",
            "--sysfs-root",
            dir.path().to_str().expect("path"),
            "--name",
            "h100-ndr",
        ],
        &[],
    ));
    let emitted = railguard_api::profiles_from_yaml(&out).expect("valid FabricProfile YAML");
    assert_eq!(emitted.len(), 1);
    assert_eq!(emitted[0].name(), "h100-ndr");
    let example = railguard_api::profiles_from_yaml(
        &std::fs::read_to_string(manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml"))
            .expect("fixture"),
    )
    .expect("example");
    assert_eq!(emitted[0].spec.rails, example[0].spec.rails);
    assert!(
        out.contains(&example[0].spec.signature()),
        "signature in the header comment"
    );
}

#[test]
fn bad_roots_and_models_exit_nonzero_with_a_message() {
    let out = run(&["discover", "--sysfs-root", "/nonexistent/railguard"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot read the sysfs root /nonexistent/railguard (--sysfs-root)"));
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(
        &[
            "emit-profile",
            "--sysfs-root",
            dir.path().to_str().expect("path"),
            "--name",
            "x",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no sys/bus/pci/devices"));
    let out = run(
        &[
            "sim-sysfs",
            "--model",
            "/nonexistent/model.yaml",
            "--out",
            dir.path().to_str().expect("path"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read model /nonexistent/model.yaml")
    );
}
