//! The NCCL pair benchmark (prints two tables; see BENCHMARKS.md):
//! `cargo bench -p railguard-prober-cli --bench nccl_pair`
//!
//! 1. Wall time of one NCCL pair test over the doubles (two endpoints, the children, the
//!    rendezvous over the control channel, a 3-size sweep), full node and one rail.
//! 2. Tests per campaign at N = 64, 256, 1,024 with the per-rail matrix included (8 rails: 9
//!    scopes per pair test), from the planner with k faulty scopes, and the campaign's NCCL
//!    wall time those counts give with the measured pair time (scopes run one after the
//!    other, the pairs of a round at once).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/nccl_lab.rs"]
mod nccl_lab;

use std::time::{Duration, Instant};

use railguard_campaign::plan::RailOutcome;

use nccl_lab::*;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(nccl_pair_bench());
}

async fn nccl_pair_bench() {
    use railguard_campaign::plan::{sweep_order, PlanOptions};
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
