//! What one recomputation of the fleet controller costs at 1,000 and 10,000 nodes (prints a
//! table; see BENCHMARKS.md): `cargo bench -p railguard-prober-cli --bench fleet_recompute`
//!
//! The steps the controller runs per recomputation, over Node objects as its reflector
//! cache holds them (one profile, 8 rails, certificates with campaign pair results, each
//! figure jittered by up to ±0.5%, one node in 200 slow on one rail):
//! 1. decode: `NodeFabric::from_node` for every Node (the certificate annotation's JSON), on
//!    the first recomputation (cold) and on a later one where no Node changed (warm: the
//!    controller's `FabricCache` keeps what it decoded while `resourceVersion` stays);
//! 2. analyze: the fleet's figures, baseline, outliers (`fleet::analyze`);
//! 3. conditions: the condition every node should carry (`marks::node_condition`);
//! 4. metrics: replacing every series (`FleetMetrics::publish`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use railguard_api::certificate::NcclPairResult;
use railguard_api::{FabricProfile, Verdict};
use railguard_fleet::marks::node_condition;
use railguard_prober_cli::fleet::metrics::FleetMetrics;
use railguard_prober_cli::fleet::FabricCache;
use railguard_sim::certificates as synth;

const RUNS: usize = 11;

fn profile() -> FabricProfile {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../api/fixtures/profiles/dgx-h100-ndr.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

/// A deterministic jitter in [-0.005, 0.005].
fn jitter(seed: u64) -> f64 {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        >> 33;
    (x % 1001) as f64 / 100_000.0 - 0.005
}

fn fleet(profile: &FabricProfile, n: usize) -> Vec<Node> {
    let issued = Timestamp::now() - SignedDuration::from_hours(1);
    let base = Node::default();
    (0..n)
        .map(|i| {
            let mut cert = synth::certificate(profile, Verdict::Certified, issued, 384.0, 360.0);
            for (r, rail) in cert.rails.iter_mut().enumerate() {
                let f = 1.0 + jitter((i * 16 + r) as u64);
                let slow = if i % 200 == 7 && r == 4 { 0.85 } else { 1.0 };
                rail.write_bw_host_gbps = Some(384.0 * f * slow);
                rail.write_bw_gpu_gbps = Some(376.0 * f * slow);
                rail.latency_us = Some(2.5 * f);
            }
            let pairs: Vec<NcclPairResult> = (0..2)
                .map(|p| NcclPairResult {
                    peer: format!("gpu-{:05}", (i + p + 1) % n),
                    rail: None,
                    busbw_gbps: Some(340.0 * (1.0 + jitter((i * 7 + p) as u64))),
                    algbw_gbps: None,
                    transport: None,
                    gdr: None,
                    wrong: None,
                    hcas: Vec::new(),
                    ok: true,
                    tested_at: None,
                    note: None,
                })
                .collect();
            cert.set_nccl_pairs(&pairs);
            let mut node = synth::node(&base, &format!("gpu-{i:05}"), Some(&cert), &[]);
            node.metadata.resource_version = Some(format!("{}", 1000 + i));
            node
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let profile = profile();
    let metrics = FleetMetrics::new(Duration::from_secs(600));
    println!("| nodes | decode (cold) | decode (warm) | analyze | conditions | metrics | total (cold) | total (warm) | outliers |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for n in [1_000usize, 10_000] {
        let nodes = fleet(&profile, n);
        let mut steps: [Vec<Duration>; 7] = Default::default();
        let mut outliers = 0;
        for _ in 0..RUNS {
            let now = Timestamp::now();
            let mut cache = FabricCache::default();
            let cold = Instant::now();
            cache.refresh(nodes.iter(), now);
            let cold = cold.elapsed();
            let start = Instant::now();
            cache.refresh(nodes.iter(), now);
            let t1 = Instant::now();
            let analysis = railguard_prober_cli::fleet::analyze(&profile, cache.fabrics());
            let t2 = Instant::now();
            let wanted = analysis
                .nodes
                .iter()
                .map(|m| node_condition(&analysis, Some(m)))
                .filter(|c| c.status == "True")
                .count();
            let t3 = Instant::now();
            outliers = analysis.outliers.len();
            assert_eq!(wanted, outliers);
            metrics.publish(std::slice::from_ref(&analysis), &[]);
            let t4 = Instant::now();
            for (i, d) in [
                cold,
                t1 - start,
                t2 - t1,
                t3 - t2,
                t4 - t3,
                cold + (t4 - t1),
                t4 - start,
            ]
            .into_iter()
            .enumerate()
            {
                steps[i].push(d);
            }
        }
        let [a, b, c, d, e, f, g] = steps.map(median);
        println!(
            "| {n} | {a:.1?} | {b:.1?} | {c:.1?} | {d:.1?} | {e:.1?} | {f:.1?} | {g:.1?} | {outliers} |"
        );
    }
    println!("\nmedian of {RUNS} runs per row");
}
