//! Off a terminal (and with `--json`) the binary draws no progress.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(p)
}

#[test]
fn off_a_terminal_certify_prints_nothing_but_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    let bin = common::prober_with_standin();
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
