//! The stand-in `all_reduce_perf` as a child process, given what the real tool is given:
//! ranks follow `-t` × `-g` in one process, more GPUs than the node has fail as nccl-tests
//! fails, NCCL's P2P/SHM/NET choice follows the environment, and the loopback the prober runs
//! (`certify::run::nccl_plan`) crosses the NICs and certifies on the shipped H100 profile.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use railguard_api::Transport;
use railguard_prober::certify::evidence::RUN_MAIN;
use railguard_prober::certify::run::nccl_plan;
use railguard_prober::nccl::NcclObservation;
use railguard_sim::node::standin_env;
use railguard_sim::{write_sysfs, NodeModel};

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../prober")).join(p)
}

struct Node {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sysfs");
    let model = NodeModel::load(&manifest("models/dgx-h100.yaml")).unwrap();
    write_sysfs(&model, &root).unwrap();
    Node { _dir: dir, root }
}

/// Runs the stand-in; (exit status, stdout + NCCL log, stderr).
fn run(n: &Node, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_all_reduce_perf_sim"))
        .args(["-b", "8M", "-e", "1G", "-f", "2"])
        .args(args)
        .envs(standin_env(&n.root, "node-a"))
        .env("NCCL_DEBUG", "INFO")
        .env_remove("NCCL_DEBUG_FILE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn observe(text: &str) -> NcclObservation {
    NcclObservation::from_texts([text]).unwrap()
}

#[test]
fn without_g_the_tool_runs_one_rank_and_moves_no_byte() {
    let n = node();
    let (code, out, _) = run(&n, &[], &[]);
    assert_eq!(code, 0);
    let obs = observe(&out);
    assert_eq!(obs.ranks(), Some(1));
    assert_eq!(obs.nodes(), Some(1));
    assert_eq!(obs.busbw_plateau_gbps(), Some(0.0));
    assert!(out.contains("# nThread 1 nGpus 1 "), "{out}");
}

#[test]
fn ranks_are_threads_times_gpus_and_too_many_fail_like_nccl_tests() {
    let n = node();
    let (_, out, _) = run(&n, &["-g", "4", "-t", "2"], &[]);
    assert_eq!(observe(&out).ranks(), Some(8));
    let (_, out, _) = run(&n, &["-g4"], &[]);
    assert_eq!(observe(&out).ranks(), Some(4));
    let (code, out, err) = run(&n, &["-g", "16"], &[]);
    assert_eq!(code, 5, "testNotImplemented");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("Invalid number of GPUs: 16 requested but only 8 were found."),
        "{err}"
    );
}

#[test]
fn eight_gpus_use_nvlink_unless_p2p_and_shm_are_disabled() {
    let n = node();
    let (_, out, _) = run(&n, &["-g", "8"], &[]);
    let obs = observe(&out);
    assert!(
        obs.log.intra_node.contains("P2P/direct"),
        "{:?}",
        obs.log.intra_node
    );
    assert_eq!(obs.log.net_channels, 0);
    assert!(
        obs.busbw_plateau_gbps().unwrap() > 400.0,
        "NVLink, not a NIC"
    );

    let (_, out, _) = run(&n, &["-g", "8"], &[("NCCL_P2P_DISABLE", "1")]);
    assert!(observe(&out).log.intra_node.contains("SHM"));

    let (_, out, _) = run(
        &n,
        &["-g", "8"],
        &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")],
    );
    let obs = observe(&out);
    assert!(obs.log.intra_node.is_empty(), "{:?}", obs.log.intra_node);
    assert!(obs.log.net_channels >= 16, "a send and a receive per rank");
    assert_eq!(obs.log.net, Some(Transport::Ib));
    assert_eq!(obs.log.gdr, Some(true));
    let plateau = obs.busbw_plateau_gbps().unwrap();
    assert!(plateau > 40.0 && plateau < 50.0, "one NDR rail: {plateau}");
}

#[test]
fn the_probers_loopback_certifies_on_the_shipped_profile() {
    let text =
        std::fs::read_to_string(manifest("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    let profile = railguard_api::profiles_from_yaml(&text).unwrap().remove(0);
    let spec = &profile.spec.certification.nccl_tests;
    let (label, env) = nccl_plan(spec).remove(0);
    assert_eq!(label, RUN_MAIN);
    let n = node();
    let args = spec.args_for_node(8);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, out, err) = run(&n, &args, &env);
    assert_eq!(code, 0, "{err}");
    let obs = observe(&out);
    assert_eq!(obs.ranks(), Some(8));
    assert!(obs.busbw_plateau_gbps().unwrap() >= profile.spec.thresholds.busbw_plateau_gbps);
}
