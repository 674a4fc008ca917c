//! Certification benchmarks, printed as a table (`cargo bench -p railguard-sim --bench certify`):
//! NCCL debug log parsing throughput (target > 200 MB/s), nccl-tests output parsing, and one
//! full simulated certification (synthetic sysfs, simulated RDMA engine, the
//! `all_reduce_perf_sim` child process, parsers, policy, certificate).

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use railguard_prober::certify::record::{invasive_certificate, Subject};
use railguard_prober::certify::run::{gather_invasive, NodeSetup};
use railguard_prober::certify::{assess, policy};
use railguard_prober::nccl::{parse_debug_log, parse_perf_output};
use railguard_sim::software::ModelSoftware;
use railguard_sim::{write_sysfs, NodeModel};

fn manifest() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../prober"))
}

fn best_of<F: FnMut()>(runs: usize, mut f: F) -> Duration {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let mut rows: Vec<(String, String)> = Vec::new();

    // NCCL debug log: the real 2-node HGX log, repeated to ~64 MiB.
    let one = std::fs::read_to_string(
        manifest().join("fixtures/nccl-debug/hgx-h100-roce400-2node-init-gdrdma.txt"),
    )
    .unwrap_or_default();
    let mut big = String::with_capacity(64 << 20);
    while big.len() < (64 << 20) && !one.is_empty() {
        big.push_str(&one);
    }
    let t = best_of(5, || {
        black_box(parse_debug_log(black_box(&big)));
    });
    let mbps = big.len() as f64 / 1e6 / t.as_secs_f64();
    rows.push((
        format!("NCCL debug log parse ({:.0} MB)", big.len() as f64 / 1e6),
        format!("{mbps:.0} MB/s ({:.1} ms)", t.as_secs_f64() * 1e3),
    ));

    // nccl-tests output with interleaved INFO lines, repeated tables are not valid, so time
    // many parses of one file.
    let perf = std::fs::read_to_string(
        manifest().join("fixtures/nccl-tests/superbench-a100-1x8-allreduce-interleaved-info.txt"),
    )
    .unwrap_or_default();
    let n = 2000;
    let t = best_of(3, || {
        for _ in 0..n {
            let _ = black_box(parse_perf_output(black_box(&perf)));
        }
    });
    rows.push((
        format!("nccl-tests output parse ({} B file)", perf.len()),
        format!(
            "{:.1} us/file, {:.0} MB/s",
            t.as_secs_f64() * 1e6 / n as f64,
            (perf.len() * n) as f64 / 1e6 / t.as_secs_f64()
        ),
    ));

    // One full simulated certification of a DGX H100 model.
    let tmp = std::env::temp_dir().join(format!("railguard-bench-{}", std::process::id()));
    let model = NodeModel::load(&manifest().join("models/dgx-h100.yaml"));
    let profile_text =
        std::fs::read_to_string(manifest().join("../api/fixtures/profiles/dgx-h100-ndr.yaml"))
            .unwrap_or_default();
    match (model, railguard_api::profiles_from_yaml(&profile_text)) {
        (Ok(model), Ok(mut profiles)) if !profiles.is_empty() => {
            let mut profile = profiles.remove(0);
            // The stand-in's certification, as BENCHMARKS.md records it.
            profile.spec.certification.nccl_runner = railguard_api::profile::NcclRunner::NcclTests;
            let root = tmp.join("sysfs");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build();
            match (write_sysfs(&model, &root), rt) {
                (Ok(_), Ok(rt)) => {
                    let engine = railguard_sim::rdma::SimulatedRdmaEngine::new(
                        railguard_sim::node::rdma_model(&model, "bench"),
                    );
                    if let Ok(engine) = engine {
                        let setup = NodeSetup {
                            sysfs_root: root.clone(),
                            use_nvml: false,
                            engine: Arc::new(engine),
                            nccl_binary: PathBuf::from(env!("CARGO_BIN_EXE_all_reduce_perf_sim")),
                            // Not run: the profile runs nccl-tests (the stand-in).
                            native_nccl: railguard_prober::nccl::native::NativeNccl::new(
                                PathBuf::from("railguard-prober"),
                            ),
                            nccl_env: vec![
                                ("RAILGUARD_SIM_ROOT".into(), root.display().to_string()),
                                ("RAILGUARD_SIM_HOSTNAME".into(), "bench".into()),
                            ],
                            log_dir: tmp.join("logs"),
                            nccl_timeout: Duration::from_secs(60),
                            software: Arc::new(ModelSoftware::new(&root, model.software.clone())),
                            simulated: true,
                        };
                        let mut verdict = String::new();
                        let t = best_of(5, || {
                            let g = rt.block_on(gather_invasive(&setup, &profile.spec, None));
                            if let Ok(g) = g {
                                let a = assess(&profile.spec, &g.evidence, &[]);
                                let subject = Subject {
                                    node: "bench",
                                    profile_name: profile.name(),
                                    profile: &profile.spec,
                                    signature: g.evidence.layout_signature.clone(),
                                    gpus: g.gpus.clone(),
                                    simulated: true,
                                };
                                let c = invasive_certificate(
                                    &subject,
                                    &a,
                                    &g.evidence.software,
                                    None,
                                    jiff::Timestamp::now(),
                                );
                                verdict = c.verdict.to_string();
                                black_box(c);
                            }
                        });
                        rows.push((
                            "full simulated certification (dgx-h100, 8 rails, 1 NCCL run)".into(),
                            format!("{:.1} ms, verdict {verdict}", t.as_secs_f64() * 1e3),
                        ));
                    }
                }
                _ => rows.push(("full simulated certification".into(), "setup failed".into())),
            }
        }
        _ => rows.push((
            "full simulated certification".into(),
            "model/profile unreadable".into(),
        )),
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = policy::fmt_num(0.0);

    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    println!("{:<w$}  result", "benchmark");
    for (k, v) in rows {
        println!("{k:<w$}  {v}");
    }
}
