//! Scale simulation of the campaign planner: tests and rounds to localize k faults among N
//! nodes, against all pairs. Prints a Markdown table for BENCHMARKS.md.
//!
//! `cargo bench -p railguard-campaign --bench campaign_scale`

use std::time::Instant;

use railguard_campaign::plan::{sweep_order, PlanOptions};
use railguard_sim::campaign_faults::{check_localization, random_faults, simulate};

const RAILS: usize = 8;
const SEEDS: u64 = 20;

fn main() {
    println!("| N | k | tests mean | tests max | 3·N | C(N,2) | rounds mean | rounds max | all found | healthy blamed | plan+localize time |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut failures = 0;
    for n in [64usize, 232, 256, 1024] {
        for k in [1usize, 4, 16] {
            let (mut tests, mut rounds, mut max_tests, mut max_rounds) =
                (0usize, 0usize, 0usize, 0usize);
            let (mut found, mut blamed) = (0u64, 0u64);
            let started = Instant::now();
            for seed in 0..SEEDS {
                let opts = PlanOptions {
                    shuffle_seed: Some(seed),
                    ..PlanOptions::default()
                };
                let faults = random_faults(&sweep_order(n, opts.shuffle_seed), RAILS, k, seed);
                let (plan, loc) = match simulate(n, RAILS, &faults, opts) {
                    Ok(v) => v,
                    Err(e) => {
                        eprintln!("N={n} k={k} seed={seed}: {e}");
                        failures += 1;
                        continue;
                    }
                };
                tests += plan.tests();
                rounds += plan.rounds();
                max_tests = max_tests.max(plan.tests());
                max_rounds = max_rounds.max(plan.rounds());
                match check_localization(&faults, &loc) {
                    Ok(()) => found += 1,
                    Err(e) => {
                        if e.blames_healthy() {
                            blamed += 1;
                        }
                        eprintln!("N={n} k={k} seed={seed}: {e}");
                        failures += 1;
                    }
                }
            }
            let per_run = started.elapsed() / SEEDS as u32;
            println!(
                "| {n} | {k} | {:.1} | {max_tests} | {} | {} | {:.1} | {max_rounds} | {found}/{SEEDS} | {blamed} | {per_run:.2?} |",
                tests as f64 / SEEDS as f64,
                3 * n,
                n * (n - 1) / 2,
                rounds as f64 / SEEDS as f64,
            );
        }
    }
    println!();
    println!("{RAILS} rails per node, {SEEDS} fault placements (seeds) per row; faults cycle rail / pair link / dead node.");
    if failures > 0 {
        eprintln!("{failures} runs did not localize every fault");
        std::process::exit(1);
    }
}
