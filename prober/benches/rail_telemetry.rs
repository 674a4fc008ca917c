//! Cost of passive rail telemetry (issue #45 items 1 and 3; target: under 1% of one core for
//! 8 rails at a 1 s interval). Builds an 8-rail mlx5-like tree (11 `counters/`, 40
//! `hw_counters/` per port), runs N ticks of read + rates and prints a table: wall µs per
//! tick, CPU (user + sys, getrusage) µs per tick and % of one core at the interval.
//! `cargo bench -p railguard-prober --bench rail_telemetry [-- TICKS]`.
//!
//! The tree is regular files: a real sysfs read also runs the attribute's show() (mlx5's
//! hw_counters query the firmware once per `lifespan`, 10 ms by default, for a port's whole
//! set), which this does not measure.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use railguard_prober::telemetry::grey::{GreyPolicy, GreyRailJudge, RailWindow};
use railguard_prober::telemetry::{rates, Rail, RailCounterReader, Sample, PORT_COUNTERS};

/// mlx5 names (`drivers/infiniband/hw/mlx5/counters.c`), 40 in all.
const HW: [&str; 40] = [
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rx_icrc_encapsulated",
    "cc_rx_ce_pkts",
    "cc_rx_cnp_pkts",
    "cc_tx_cnp_pkts",
    "rdma_tx_packets",
    "rdma_tx_bytes",
    "rdma_rx_packets",
    "rdma_rx_bytes",
    "vport_out_of_buffer",
    "vport_out_of_sequence",
];

const RAILS: usize = 8;

fn write(p: &Path, text: &str) {
    if let Some(d) = p.parent() {
        if let Err(e) = std::fs::create_dir_all(d) {
            panic!("{}: {e}", d.display());
        }
    }
    if let Err(e) = std::fs::write(p, text) {
        panic!("{}: {e}", p.display());
    }
}

fn cpu() -> Duration {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(e) => panic!("getrusage: {e}"),
    }
}

fn main() {
    let ticks: u32 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let rails: Vec<Rail> = (0..RAILS)
        .map(|i| Rail {
            hca: format!("mlx5_{i}"),
            port: 1,
        })
        .collect();
    for r in &rails {
        let pd = dir
            .path()
            .join(format!("sys/class/infiniband/{}/ports/{}", r.hca, r.port));
        for c in PORT_COUNTERS {
            write(&pd.join("counters").join(c), "123456789012\n");
        }
        for c in HW {
            write(&pd.join("hw_counters").join(c), "4294967295\n");
        }
        write(&pd.join("hw_counters/lifespan"), "10\n");
    }
    let opened = Instant::now();
    let (mut reader, problems) = RailCounterReader::open(dir.path(), &rails);
    let open_us = opened.elapsed().as_secs_f64() * 1e6;
    assert!(problems.is_empty(), "{problems:?}");
    let files = reader.counter_count();
    assert_eq!(files, RAILS * (PORT_COUNTERS.len() + HW.len()));
    let mut prev = reader.sample();
    let mut cur = Sample::default();
    // Warm-up.
    for _ in 0..100 {
        reader.sample_into(&mut cur);
        std::mem::swap(&mut prev, &mut cur);
    }
    let mut measure = |with_rates: bool| -> (f64, f64) {
        let (c0, t0) = (cpu(), Instant::now());
        let mut n = 0usize;
        for _ in 0..ticks {
            reader.sample_into(&mut cur);
            if with_rates {
                n += rates(&prev, &cur, Duration::from_secs(1)).len();
            }
            std::mem::swap(&mut prev, &mut cur);
        }
        let (wall, cpu_t) = (t0.elapsed(), cpu() - c0);
        std::hint::black_box(n);
        let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(ticks);
        (per(wall), per(cpu_t))
    };
    let (read_wall, read_cpu) = measure(false);
    let (tick_wall, tick_cpu) = measure(true);
    let rates_t0 = Instant::now();
    let mut n = 0usize;
    for _ in 0..ticks {
        n += std::hint::black_box(rates(&prev, &cur, Duration::from_secs(1))).len();
    }
    std::hint::black_box(n);
    let rates_us = rates_t0.elapsed().as_secs_f64() * 1e6 / f64::from(ticks);
    // The grey-rail judge over one tick's rates (8 rails alike: every symmetry test runs).
    let rr = rates(&prev, &cur, Duration::from_secs(1));
    let mut judge = GreyRailJudge::new(GreyPolicy::default());
    let judge_t0 = Instant::now();
    let mut changes = 0usize;
    for _ in 0..ticks {
        let windows: Vec<RailWindow> = rr
            .iter()
            .map(|r| RailWindow {
                bytes_per_second: Some(40e9),
                ..RailWindow::of(r)
            })
            .collect();
        changes += std::hint::black_box(judge.judge(&windows)).len();
    }
    std::hint::black_box(changes);
    let judge_us = judge_t0.elapsed().as_secs_f64() * 1e6 / f64::from(ticks);
    // % of one core at a 1 s interval: CPU µs per tick / 1e6 µs × 100.
    let pct = |us: f64| us / 1e4;
    println!(
        "rail telemetry: {RAILS} rails, {files} counter files, {ticks} ticks (open: {open_us:.0} µs)"
    );
    println!(
        "{:<22} {:>12} {:>12} {:>16}",
        "step", "wall µs/tick", "CPU µs/tick", "% core @ 1 s"
    );
    println!(
        "{:<22} {:>12.1} {:>12.1} {:>16.4}",
        "read (pread × files)",
        read_wall,
        read_cpu,
        pct(read_cpu)
    );
    println!(
        "{:<22} {:>12.1} {:>12} {:>16}",
        "rates (pure)", rates_us, "-", "-"
    );
    println!(
        "{:<22} {:>12.1} {:>12} {:>16}",
        "grey judge (pure)", judge_us, "-", "-"
    );
    println!(
        "{:<22} {:>12.1} {:>12.1} {:>16.4}",
        "tick (read + rates)",
        tick_wall,
        tick_cpu,
        pct(tick_cpu)
    );
    let target = 1.0;
    println!(
        "target: under {target}% of one core: {}",
        if pct(tick_cpu) < target {
            "met"
        } else {
            "NOT met"
        }
    );
}
