//! Work per request, counted rather than timed (instruction counts do not depend on what else
//! runs): answers the http_load bench's review `ITERS` times, as `/mutate` decides it
//! (decode, admit, encode; no HTTP, no metrics) or as the `/noop` baseline does (decode the
//! review and its Pod, allow). `mutate` sends the same pod each time, as a job's pods are, so
//! after the first the decision cache answers; `mutate-distinct` cycles through 1,000 pods
//! that differ in one env value, more than the cache holds, so every one is decided.
//!
//! Build: `cargo bench -p railguard-webhook-cli --bench review_work --no-run`, then count with
//! `valgrind --tool=cachegrind --cache-sim=no <binary> mutate|mutate-distinct|noop ITERS` at two ITERS
//! (say 10 and 1010): the difference of the `I refs` totals over 1000 is the instructions
//! per request, start-up excluded. Run alone (`cargo bench`), it times 20000 of each.

#![allow(clippy::expect_used, clippy::unwrap_used)] // bench harness: a failed setup should abort loudly

use std::hint::black_box;
use std::time::Instant;

mod support;

fn main() {
    let state = support::app_state(support::H100);
    let body = support::review_body();
    let distinct: Vec<Vec<u8>> = (0..1000).map(support::distinct_review_body).collect();
    let next = std::cell::Cell::new(0usize);
    let answer = |endpoint: &str| match endpoint {
        "mutate" => support::mutate_answer(black_box(&body), &state).expect("answer"),
        "mutate-distinct" => {
            let i = next.get();
            next.set((i + 1) % distinct.len());
            support::mutate_answer(black_box(&distinct[i]), &state).expect("answer")
        }
        "noop" => support::noop_answer(black_box(&body)).expect("answer"),
        other => panic!("endpoint {other:?}: mutate, mutate-distinct or noop"),
    };
    // Keep the count honest: /mutate must patch, /noop must not.
    for endpoint in ["mutate", "mutate-distinct", "noop"] {
        let has_patch = answer(endpoint).windows(9).any(|w| w == b"\"patch\":\"");
        assert_eq!(has_patch, endpoint != "noop", "answer of {endpoint}");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [endpoint, iters] if !endpoint.starts_with('-') => {
            let iters: usize = iters.parse().expect("ITERS");
            for _ in 0..iters {
                black_box(answer(endpoint));
            }
        }
        // `cargo bench` passes `--bench`.
        _ => {
            for endpoint in ["mutate", "mutate-distinct", "noop"] {
                let n = 20_000;
                let start = Instant::now();
                for _ in 0..n {
                    black_box(answer(endpoint));
                }
                let us = start.elapsed().as_secs_f64() * 1e6 / n as f64;
                println!("{endpoint}: {us:.1} µs per answer");
            }
        }
    }
}
