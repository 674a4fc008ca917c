//! The "JSON output" section of `docs/reference.md` is the contract of every `--json`: each
//! key the real output has is documented there, and each documented key that is not marked
//! *only when* is in every output (`a[].b`: in the elements of a non-empty list `a`).
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use railguard_campaign::coordinator::{run_campaign, CampaignNode, CampaignSettings};
use serde_json::Value;

mod common;

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(p)
}

/// Where the keys are documented (relative to `prober/`, as [`manifest`] joins it).
const REFERENCE: &str = "../docs/reference.md";

/// A documented key and whether it may be absent.
#[derive(Debug)]
struct Key {
    optional: bool,
}

/// The "JSON output" section: first command of each `###` heading -> its keys.
fn documented() -> BTreeMap<String, BTreeMap<String, Key>> {
    let doc = std::fs::read_to_string(manifest(REFERENCE)).unwrap();
    let start = doc
        .find("\n## JSON output\n")
        .expect("docs/reference.md has a JSON output section");
    let section = &doc[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut out: BTreeMap<String, BTreeMap<String, Key>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in section[..end].lines() {
        if let Some(h) = line.strip_prefix("### ") {
            let command = backticked(h)
                .first()
                .and_then(|c| c.split_whitespace().next().map(str::to_string))
                .expect("a heading names its command");
            current = Some(command.clone());
            out.entry(command).or_default();
            continue;
        }
        let Some(cmd) = &current else { continue };
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || cells[1] == "key" || cells[1].starts_with("---") {
            continue;
        }
        let optional = cells[2].contains("only when");
        for key in backticked(cells[1]) {
            out.get_mut(cmd).unwrap().insert(key, Key { optional });
        }
    }
    out
}

fn backticked(s: &str) -> Vec<String> {
    s.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, t)| t.to_string())
        .collect()
}

/// Top-level keys and `list[].key` of lists of objects.
fn paths(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (k, x) in v.as_object().expect("a JSON object") {
        out.insert(k.clone());
        for e in x.as_array().into_iter().flatten() {
            for sub in e.as_object().into_iter().flat_map(|o| o.keys()) {
                out.insert(format!("{k}[].{sub}"));
            }
        }
    }
    out
}

fn non_empty_lists(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap()
        .iter()
        .filter(|(_, x)| {
            x.as_array()
                .is_some_and(|a| a.iter().any(|e| e.is_object()))
        })
        .map(|(k, _)| k.clone())
        .collect()
}

fn json_of(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut c = Command::new(common::prober_with_standin());
    c.args(args).env("RAILGUARD_LOG", "off");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn sim(dir: &Path, model: &str) -> String {
    let out = dir.join(model);
    let status = Command::new(common::prober_with_standin())
        .args(["sim-sysfs", "--model"])
        .arg(manifest(&format!("models/{model}.yaml")))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(status.status.success());
    out.display().to_string()
}

fn check(command: &str, docs: &BTreeMap<String, Key>, outputs: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, v) in outputs.iter().enumerate() {
        let have = paths(v);
        for p in have.iter().filter(|p| !docs.contains_key(*p)) {
            problems.push(format!(
                "{command} output {i}: key `{p}` is not in docs/reference.md"
            ));
        }
        let lists = non_empty_lists(v);
        for k in docs.iter().filter(|(_, k)| !k.optional).map(|(k, _)| k) {
            let applies = match k.split_once("[].") {
                Some((list, _)) => lists.contains(list),
                None => true,
            };
            if applies && !have.contains(k) {
                problems.push(format!(
                    "{command} output {i}: docs/reference.md's `{k}` is missing (mark it \"only when ...\"?)"
                ));
            }
        }
    }
    problems
}

fn profile_file() -> String {
    manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml")
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_documents_every_json_key() {
    let docs = documented();
    assert_eq!(
        docs.keys().map(String::as_str).collect::<Vec<_>>(),
        ["analyze", "campaign", "certify", "discover", "preflight"]
    );
    let dir = tempfile::tempdir().unwrap();
    let good = sim(dir.path(), "dgx-h100");
    let down = sim(dir.path(), "h100-port-down");
    let logs = dir.path().join("logs").display().to_string();
    let profile = profile_file();
    let mut outputs: BTreeMap<&str, Vec<Value>> = BTreeMap::new();

    let topo = manifest("fixtures/topo/hgx-h100-roce400-12nic-single-numa.txt");
    outputs.insert(
        "discover",
        vec![
            json_of(&["discover", "--sysfs-root", &good, "--json"], &[]),
            json_of(&["discover", "--sysfs-root", &down, "--json"], &[]),
            json_of(
                &["affinity", "--topo", topo.to_str().unwrap(), "--json"],
                &[],
            ),
        ],
    );
    let certify = |root: &str| {
        json_of(
            &[
                "certify",
                "--node",
                "node-a",
                "--sim-root",
                root,
                "--profile-file",
                &profile,
                "--log-dir",
                &logs,
                "--json",
            ],
            &[],
        )
    };
    outputs.insert("certify", vec![certify(&good), certify(&down)]);

    let oci = manifest("fixtures/nccl-tests/oci-h100-roce-2x8-allreduce.txt");
    let sock = manifest("fixtures/nccl-debug/moc-h100-2x4-socket-fallback.txt");
    outputs.insert(
        "analyze",
        vec![
            json_of(
                &["analyze", "--nccl-tests", oci.to_str().unwrap(), "--json"],
                &[],
            ),
            json_of(
                &[
                    "analyze",
                    "--nccl-log",
                    sock.to_str().unwrap(),
                    "--profile-file",
                    &profile,
                    "--json",
                ],
                &[],
            ),
            json_of(
                &[
                    "campaign",
                    "--profile",
                    "h100-ndr",
                    "--profile-file",
                    &profile,
                    "--nccl-log",
                    oci.to_str().unwrap(),
                    "--json",
                ],
                &[],
            ),
        ],
    );

    let view = dir.path().join("container");
    std::fs::create_dir_all(
        view.join("sys/class/infiniband/mlx5_0/device/infiniband_verbs/uverbs0"),
    )
    .unwrap();
    std::fs::create_dir_all(view.join("dev/infiniband")).unwrap();
    std::fs::write(view.join("dev/infiniband/uverbs0"), "").unwrap();
    std::fs::create_dir_all(view.join("dev/shm")).unwrap();
    let root = view.display().to_string();
    outputs.insert(
        "preflight",
        vec![
            json_of(
                &["preflight", "--root", &root, "--json"],
                &[("NCCL_IB_HCA", "=mlx5_0:1"), ("RAILGUARD_SHM_SIZE", "1Mi")],
            ),
            json_of(
                &["preflight", "--root", &root, "--json"],
                &[("NCCL_IB_HCA", "=mlx5_9:1")],
            ),
        ],
    );

    // A campaign over three nodes whose endpoints do not answer: every key of the report,
    // serialized as `campaign --json` prints it.
    let text = std::fs::read_to_string(&profile).unwrap();
    let p = railguard_api::profiles_from_yaml(&text).unwrap().remove(0);
    let mut settings = CampaignSettings::from_profile(&p, &[7u8; 32]).unwrap();
    settings.io_timeout = Duration::from_millis(500);
    settings.test_timeout = Duration::from_secs(1);
    let dead = |n: &str, port: u16| CampaignNode {
        name: n.into(),
        endpoint: format!("127.0.0.1:{port}"),
    };
    let report = run_campaign(
        &[dead("node-a", 1), dead("node-b", 2), dead("node-c", 3)],
        &settings,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    outputs.insert("campaign", vec![serde_json::to_value(&report).unwrap()]);

    let mut problems = Vec::new();
    for (command, keys) in &docs {
        problems.extend(check(command, keys, &outputs[command.as_str()]));
    }
    assert!(
        problems.is_empty(),
        "docs/reference.md \"JSON output\" is out of date:\n{}",
        problems.join("\n")
    );
}
