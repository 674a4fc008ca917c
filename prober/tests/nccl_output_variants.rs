//! Real-world output variants the parsers must read: nccl-tests 2.17 and later (its own
//! header and footer lines), and NCCL errors quoted by other tools without the `NCCL WARN`
//! prefix. Every fixture names its source in its first lines.

use std::path::PathBuf;

use railguard_prober::nccl::debug_log::parse_debug_log;
use railguard_prober::nccl::perf::{parse_perf_output, AverageSource, PerfParseError};

fn fixture(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn a_2_17_run_that_concludes_without_its_average_is_complete() {
    let r = parse_perf_output(&fixture(
        "nccl-tests/dgx-spark-gb10-2x1-allreduce-2.20.0-concluded.txt",
    ))
    .unwrap()
    .unwrap();
    assert_eq!(r.nccl_tests_version.as_deref(), Some("2.20.0"));
    assert_eq!(r.collective.as_deref(), Some("all_reduce_perf"));
    assert!(r.concluded);
    assert_eq!(r.rows.len(), 4);
    assert_eq!(r.ranks, Some(2));
    assert_eq!(r.nodes, Some(2));
    assert_eq!(r.wrong(), Some(0));
    // nccl-tests' own mean over both halves of every row:
    // (0.23+0.27+0.52+0.53+0.83+0.88+0.96+1.01) / 8 = 0.65375
    assert_eq!(r.avg_source, AverageSource::Computed);
    assert!(
        (r.avg_busbw_gbps - 0.65375).abs() < 1e-9,
        "{}",
        r.avg_busbw_gbps
    );
}

#[test]
fn a_2_17_run_cut_in_its_footer_is_cut_short() {
    let text = fixture("nccl-tests/dgx-spark-gb10-2x1-allgather-2.17.6-cut-in-footer.txt");
    assert_eq!(
        parse_perf_output(&text),
        Err(PerfParseError::CutShort {
            last_size: 17_179_869_184
        })
    );
    // The same run with its footer complete is a result.
    let complete = format!(
        "{}Avg bus bandwidth    : 19.945 \n#\n# Collective test concluded: all_gather_perf\n",
        text.trim_end_matches("Avg\n")
    );
    let r = parse_perf_output(&complete).unwrap().unwrap();
    assert_eq!(r.avg_source, AverageSource::Reported);
    assert_eq!(r.avg_busbw_gbps, 19.945);
    assert_eq!(r.collective.as_deref(), Some("all_gather_perf"));
    assert_eq!(r.nccl_tests_version.as_deref(), Some("2.17.6"));
}

#[test]
fn quoted_nccl_errors_without_the_warn_prefix_are_found() {
    let r = parse_debug_log(&fixture("nccl-debug/health-check-quoted-errors.txt"));
    assert_eq!(
        r.errors,
        vec![
            "Call to ibv_reg_dmabuf_mr failed with error Operation not supported".to_string(),
            "NET/IB : Got completion with error 12, opcode 32736, len 32736, vendor err 129"
                .to_string(),
            "unhandled system error (run with NCCL_DEBUG=INFO for details)".to_string(),
        ]
    );
    // Quoted errors are not NCCL debug lines: they do not make a network transport.
    assert_eq!(r.net, None);
    assert_eq!(r.nccl_lines, 0);
}

#[test]
fn cloud_network_plugins_are_reported_by_name() {
    let log = "\
h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v9)
h:1:1 [0] NCCL INFO Using network AWS Libfabric
h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA
h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/1/GDRDMA
";
    let r = parse_debug_log(log);
    assert_eq!(r.net, None, "not IB, not sockets");
    assert_eq!(r.net_plugin.as_deref(), Some("AWS Libfabric"));
    assert_eq!(r.gdr, Some(true));
}
