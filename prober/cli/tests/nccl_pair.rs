//! NCCL pair tests over real processes: `railguard-prober peer-endpoint`s on loopback, each
//! starting its `nccl-ranks` children, which load the CUDA and NCCL test doubles
//! (railguard-gpu's `doubles`, built here) through the same dlopen code as the real
//! libraries. The doubles' all-reduce really runs over TCP between the two nodes' children,
//! so the rendezvous over the authenticated control channel, the timing, busbw and the
//! correctness check all run for real above them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use railguard_api::profile::NcclPairSpec;
use railguard_api::{FabricProfile, RailVerdict, Transport};
use railguard_prober::campaign::coordinator::{
    run_campaign, run_nccl_scope, CampaignNode, CampaignSettings, NcclScopeRecord, NcclSettings,
};
use railguard_prober::campaign::plan::RailOutcome;
use railguard_prober::campaign::wire::NcclSide;

const TOKEN: &str = "nccl-pair-test-token-0123456789";
/// Two fake GPUs per node.
const GPUS: &str = "0000:1b:00.0,0000:9a:00.0";
/// A slow rail's extra time per all-reduce: far below the minimums set in [`profile`].
const SLOW_US: &str = "200000";

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// The DGX H100 profile cut to two rails (GPU 0 on mlx5_0, GPU 1 on mlx5_3), with NCCL pair
/// tests on small sizes and minimums a loopback run passes and a slow rail does not.
fn profile() -> FabricProfile {
    let text =
        std::fs::read_to_string(root().join("../api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    let mut p = railguard_api::profiles_from_yaml(&text).unwrap().remove(0);
    p.spec.rails.truncate(2);
    p.spec.certification.nccl_pair = Some(NcclPairSpec {
        min_busbw_gbps: Some(0.03),
        min_rail_busbw_gbps: Some(0.02),
        min_bytes: 256 << 10,
        max_bytes: 1 << 20,
        warmup: 1,
        iterations: 2,
        timeout_seconds: 30,
        ..Default::default()
    });
    p
}

fn addr(i: u8) -> String {
    let ip = format!("127.0.0.{}", 60 + i);
    let l = TcpListener::bind(format!("{ip}:0")).unwrap();
    format!("{ip}:{}", l.local_addr().unwrap().port())
}

struct Endpoint {
    child: Child,
    node: CampaignNode,
    logs: PathBuf,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Lab {
    dir: tempfile::TempDir,
    doubles: railguard_gpu::doubles::Doubles,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let doubles = railguard_gpu::doubles::build(dir.path()).unwrap();
        Lab { dir, doubles }
    }

    /// A peer endpoint for `node` whose NCCL children see `env` (the doubles' knobs).
    fn endpoint(&self, i: u8, node: &str, env: &[(&str, &str)], nccl: Option<&Path>) -> Endpoint {
        let dir = self.dir.path();
        let listen = addr(i);
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let logs = dir.join(format!("{node}-nccl"));
        let log = std::fs::File::create(dir.join(format!("{node}.log"))).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_railguard-prober"));
        cmd.arg("peer-endpoint")
            .args(["--node", node, "--profile", "h100-ndr", "--listen", &listen])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--sim")
            .arg(root().join("models/dgx-h100.yaml"))
            .arg("--cuda-library")
            .arg(&self.doubles.cuda)
            .arg("--nccl-library")
            .arg(nccl.unwrap_or(&self.doubles.nccl))
            .arg("--nccl-log-dir")
            .arg(&logs)
            .env_remove("KUBECONFIG")
            .env("RAILGUARD_CUDA_DOUBLE_PCI", GPUS)
            .env("RAILGUARD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let started = Instant::now();
        while TcpStream::connect(&listen).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "endpoint {node} did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Endpoint {
            child,
            node: CampaignNode {
                name: node.to_string(),
                endpoint: listen,
            },
            logs,
        }
    }
}

fn settings(p: &FabricProfile) -> (CampaignSettings, NcclSettings) {
    let mut s = CampaignSettings::from_profile(p, TOKEN.as_bytes()).unwrap();
    s.test_timeout = Duration::from_secs(20);
    s.io_timeout = Duration::from_secs(5);
    s.iterations = 10;
    let nccl = s
        .nccl
        .clone()
        .expect("the profile asks for NCCL pair tests");
    (s, nccl)
}

async fn pair(a: &Endpoint, b: &Endpoint, scope: usize) -> NcclScopeRecord {
    let (s, nccl) = settings(&profile());
    run_nccl_scope(&a.node, &b.node, &s, &nccl, &nccl.scopes[scope]).await
}

fn measured_nranks(r: &NcclScopeRecord) -> Vec<u32> {
    r.sides
        .iter()
        .filter_map(|s| match &s.side {
            NcclSide::Measured { nranks, .. } => Some(*nranks),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_node_and_per_rail_pair_tests_run_for_real_over_the_doubles() {
    let lab = Lab::new();
    let a = lab.endpoint(0, "node-a", &[], None);
    let b = lab.endpoint(1, "node-b", &[], None);
    let (_, nccl) = settings(&profile());
    assert_eq!(
        nccl.scopes.iter().map(|s| s.label()).collect::<Vec<_>>(),
        ["node", "mlx5_0:1", "mlx5_3:1"]
    );

    // Full node: both GPUs of each node, 4 ranks, every rail.
    let full = pair(&a, &b, 0).await;
    let j = &full.judgement;
    assert_eq!(j.outcome, RailOutcome::Pass, "{full:#?}");
    assert_eq!(measured_nranks(&full), [4, 4]);
    assert_eq!(j.transport, Some(Transport::Ib));
    assert_eq!(j.gdr, Some(true));
    assert_eq!(j.hcas, ["mlx5_0:1", "mlx5_3:1"]);
    assert_eq!(j.wrong, Some(0));
    assert_eq!(j.bytes, Some(1 << 20));
    for side in &full.sides {
        let NcclSide::Measured { points, gpus, .. } = &side.side else {
            panic!("{side:?}");
        };
        assert_eq!(gpus, &["0000:1b:00.0", "0000:9a:00.0"]);
        assert_eq!(points.len(), 3, "256 KiB, 512 KiB, 1 MiB");
        for p in points {
            assert!(p.busbw_gbps > 0.0 && p.time_us > 0.0, "{p:?}");
            // busbw = algbw * 2(n-1)/n with n = 4.
            assert!((p.busbw_gbps - p.algbw_gbps * 1.5).abs() < 1e-9, "{p:?}");
        }
    }
    // The rank-0 side's NCCL log was captured where the endpoint keeps it.
    let log = std::fs::read_to_string(a.logs.join("nccl-pair-node-b-node-root.log")).unwrap();
    assert!(
        log.contains("NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_3:1/RoCE"),
        "{log}"
    );

    // One rail: its GPU only (2 ranks: busbw = algbw), NCCL_IB_HCA limited to it.
    let rail = pair(&a, &b, 2).await;
    assert_eq!(rail.judgement.outcome, RailOutcome::Pass, "{rail:#?}");
    assert_eq!(measured_nranks(&rail), [2, 2]);
    assert_eq!(rail.judgement.hcas, ["mlx5_3:1"]);
    for side in &rail.sides {
        let NcclSide::Measured { points, gpus, .. } = &side.side else {
            panic!("{side:?}");
        };
        assert_eq!(gpus, &["0000:9a:00.0"], "the GPU the rail serves");
        assert!(points.iter().all(|p| p.busbw_gbps == p.algbw_gbps));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_results_socket_fallback_init_failure_and_a_slow_rail_are_evidence() {
    let lab = Lab::new();
    let good = lab.endpoint(10, "good", &[], None);
    let corrupt = lab.endpoint(
        11,
        "corrupt",
        &[("RAILGUARD_NCCL_DOUBLE_CORRUPT", "1")],
        None,
    );
    let socket = lab.endpoint(
        12,
        "socket",
        &[("RAILGUARD_NCCL_DOUBLE_NET", "Socket")],
        None,
    );
    let broken = lab.endpoint(
        13,
        "broken",
        &[("RAILGUARD_NCCL_DOUBLE_FAIL", "init")],
        None,
    );
    let slow = lab.endpoint(
        14,
        "slow",
        &[
            ("RAILGUARD_NCCL_DOUBLE_DELAY_US", SLOW_US),
            ("RAILGUARD_NCCL_DOUBLE_SLOW_HCA", "mlx5_3"),
        ],
        None,
    );

    // Rank 0 sums, so the corrupting double must run the rank-0 side.
    let r = pair(&corrupt, &good, 1).await;
    assert_eq!(r.judgement.outcome, RailOutcome::Fail, "{r:#?}");
    assert!(r.judgement.wrong.unwrap() > 0);
    assert!(r.judgement.reasons[0].contains("wrong elements"), "{r:#?}");

    let r = pair(&good, &socket, 1).await;
    assert_eq!(r.judgement.outcome, RailOutcome::Fail, "{r:#?}");
    assert!(
        r.judgement
            .reasons
            .iter()
            .any(|m| m.contains("socket fell back to NET/Socket")),
        "{:?}",
        r.judgement.reasons
    );

    // The joining side's init fails: the rank-0 side is stopped at once, not at the limit.
    let started = Instant::now();
    let r = pair(&good, &broken, 0).await;
    assert_eq!(r.judgement.outcome, RailOutcome::Fail, "{r:#?}");
    assert!(
        r.judgement.reasons[0]
            .starts_with("broken: ncclCommInitRank failed: unhandled system error"),
        "{:?}",
        r.judgement.reasons
    );
    assert!(
        r.judgement.reasons[0].contains("ibv_reg_dmabuf_mr"),
        "NCCL's own warning from the log: {:?}",
        r.judgement.reasons
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );

    // The slow rail fails its busbw minimum, the other rail of the same node passes.
    let r = pair(&slow, &good, 2).await;
    assert_eq!(r.judgement.outcome, RailOutcome::Fail, "{r:#?}");
    assert!(r.judgement.measured);
    assert!(
        r.judgement.reasons[0].starts_with("busbw "),
        "{:?}",
        r.judgement.reasons
    );
    let r = pair(&slow, &good, 1).await;
    assert_eq!(r.judgement.outcome, RailOutcome::Pass, "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_libnccl_the_test_is_not_measured_and_the_profile_decides() {
    let lab = Lab::new();
    let good = lab.endpoint(20, "good", &[], None);
    let absent = lab.dir.path().join("absent/libnccl.so.2");
    let bare = lab.endpoint(21, "bare", &[], Some(&absent));
    for (a, b) in [(&bare, &good), (&good, &bare)] {
        let r = pair(a, b, 0).await;
        assert_eq!(r.judgement.outcome, RailOutcome::Inconclusive, "{r:#?}");
        let reason = &r.judgement.reasons[0];
        assert!(
            reason.starts_with("not measured on bare: cannot load NCCL from")
                && reason.contains("absent/libnccl.so.2"),
            "{reason}"
        );
    }
    let mut strict = profile();
    strict
        .spec
        .certification
        .nccl_pair
        .as_mut()
        .unwrap()
        .require_measured = true;
    let (s, nccl) = settings(&strict);
    let r = run_nccl_scope(&bare.node, &good.node, &s, &nccl, &nccl.scopes[0]).await;
    assert_eq!(r.judgement.outcome, RailOutcome::Fail, "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_campaign_blames_the_slow_rail_and_records_every_pair() {
    let lab = Lab::new();
    let mut endpoints = Vec::new();
    for i in 0..4u8 {
        let env: &[(&str, &str)] = if i == 2 {
            &[
                ("RAILGUARD_NCCL_DOUBLE_DELAY_US", SLOW_US),
                ("RAILGUARD_NCCL_DOUBLE_SLOW_HCA", "mlx5_3"),
            ]
        } else {
            &[]
        };
        endpoints.push(lab.endpoint(30 + i, &format!("node-{i}"), env, None));
    }
    let nodes: Vec<CampaignNode> = endpoints.iter().map(|e| e.node.clone()).collect();
    let (s, _) = settings(&profile());
    let report = run_campaign(&nodes, &s, jiff::Timestamp::now())
        .await
        .unwrap();
    assert!(report.localization.rail_faults.is_empty(), "RDMA is fine");
    let nccl = report.nccl.as_ref().expect("the NCCL phase ran");
    assert_eq!(nccl.scopes, ["node", "mlx5_0:1", "mlx5_3:1"]);
    assert!(
        nccl.runs() >= 12,
        "4 ring pairs x 3 scopes: {}",
        nccl.runs()
    );

    let blamed = report.blamed_nodes();
    assert_eq!(blamed, ["node-2"], "{:#?}", report.findings);
    let f = &report.findings["node-2"];
    let rail = &f.nccl_blamed["mlx5_3:1"];
    assert_eq!(rail.verdict, RailVerdict::Degraded, "{rail:?}");
    assert!(
        rail.reason
            .contains("below its busbw minimum with 2 healthy peers"),
        "{}",
        rail.reason
    );
    assert!(!f.nccl_blamed.contains_key("mlx5_0:1"));
    for (name, f) in &report.findings {
        let pairs = f.nccl_pairs.as_ref().unwrap();
        assert!(
            pairs.len() >= 6,
            "{name}: two peers x three scopes: {pairs:?}"
        );
        if name != "node-2" {
            let with_healthy = pairs.iter().filter(|p| p.peer != "node-2");
            assert!(with_healthy.clone().all(|p| p.ok), "{name}: {pairs:?}");
        }
    }
}

/// The NCCL pair benchmark (prints two tables, asserts nothing about speed):
/// `cargo test -p railguard-prober-cli --release --test nccl_pair -- --ignored --nocapture nccl_pair_bench`
///
/// 1. Wall time of one NCCL pair test over the doubles (two endpoints, the children, the
///    rendezvous over the control channel, a 3-size sweep), full node and one rail.
/// 2. Tests per campaign at N = 64, 256, 1,024 with the per-rail matrix included (8 rails: 9
///    scopes per pair test), from the planner with k faulty scopes, and the campaign's NCCL
///    wall time those counts give with the measured pair time (scopes run one after the
///    other, the pairs of a round at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: run explicitly, prints a table"]
async fn nccl_pair_bench() {
    use railguard_prober::campaign::plan::{sweep_order, PlanOptions};
    use railguard_sim::campaign_faults::{random_faults, simulate};

    const REPS: usize = 5;
    let lab = Lab::new();
    let a = lab.endpoint(40, "bench-a", &[], None);
    let b = lab.endpoint(41, "bench-b", &[], None);
    println!("| NCCL pair test (doubles) | runs | min | median | max |");
    println!("|---|---|---|---|---|");
    let mut median_full = Duration::ZERO;
    for (label, scope) in [("full node, 2+2 GPUs", 0), ("one rail, 1+1 GPU", 1)] {
        let mut times = Vec::new();
        for _ in 0..REPS {
            let started = Instant::now();
            let r = pair(&a, &b, scope).await;
            times.push(started.elapsed());
            assert_eq!(r.judgement.outcome, RailOutcome::Pass, "{r:#?}");
        }
        times.sort();
        if scope == 0 {
            median_full = times[REPS / 2];
        }
        println!(
            "| {label} | {REPS} | {:.0?} | {:.0?} | {:.0?} |",
            times[0],
            times[REPS / 2],
            times[REPS - 1]
        );
    }

    const RAILS: usize = 8;
    let scopes = 1 + RAILS;
    println!();
    println!("| N | k | pair tests | NCCL runs (x{scopes} scopes) | rounds | C(N,2) x {scopes} | NCCL wall (rounds x scopes x full-node median) |");
    println!("|---|---|---|---|---|---|---|");
    for n in [64usize, 256, 1024] {
        for k in [0usize, 4] {
            let opts = PlanOptions {
                shuffle_seed: Some(7),
                ..PlanOptions::default()
            };
            let faults = random_faults(&sweep_order(n, opts.shuffle_seed), scopes, k, 7);
            let (plan, _) = simulate(n, scopes, &faults, opts).unwrap();
            let wall = median_full * (plan.rounds() * scopes) as u32;
            println!(
                "| {n} | {k} | {} | {} | {} | {} | {:.1?} |",
                plan.tests(),
                plan.tests() * scopes,
                plan.rounds(),
                n * (n - 1) / 2 * scopes,
                wall
            );
        }
    }
}
