//! Published nccl-tests outputs and NCCL debug logs (prober/fixtures, each names its source)
//! parsed into the values a reader of the file can check by eye.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;

use railguard_api::{FabricProfile, Transport};
use railguard_prober::analyze::{analyze, AnalyzeVerdict};
use railguard_prober::nccl::{
    parse_debug_log, parse_perf_output, NcclObservation, PerfFormat, PerfParseError,
};

fn fixture(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn profile() -> FabricProfile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../api/fixtures/profiles/dgx-h100-ndr.yaml");
    let text = std::fs::read_to_string(p).unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

fn close(a: Option<f64>, b: f64) {
    let a = a.expect("value present");
    assert!((a - b).abs() < 0.01, "{a} != {b}");
}

#[test]
fn deepops_old_format_without_rank_lines() {
    let r = parse_perf_output(&fixture(
        "nccl-tests/dgx-a100-hdr-2x8-allreduce-k8s-deepops.txt",
    ))
    .unwrap()
    .unwrap();
    assert_eq!(r.format, PerfFormat::Old);
    assert_eq!(r.rows.len(), 30, "8 B .. 4 GiB");
    assert_eq!(r.rows[0].size_bytes, 8);
    assert_eq!(r.rows.last().unwrap().size_bytes, 4294967296);
    assert_eq!(r.rows[0].out_of_place.max_error, Some(2e-7));
    assert_eq!(r.avg_busbw_gbps, 53.7098);
    assert_eq!(
        r.wrong(),
        Some(0),
        "old format: from `Out of bounds values : 0 OK`"
    );
    assert_eq!(r.ranks, None);
    close(r.max_busbw_gbps(), 188.70);
    // median of 512M..4G row means: 179.41, 182.375, 186.72, 188.615
    close(r.plateau_busbw_gbps(), 184.5475);
}

#[test]
fn gcp_new_format_with_root_and_wrong_columns() {
    let r = parse_perf_output(&fixture("nccl-tests/gcp-a3mega-h100-2x8-allreduce.txt"))
        .unwrap()
        .unwrap();
    assert_eq!(r.format, PerfFormat::New);
    assert_eq!(r.rows.len(), 31, "8 B .. 8 GiB");
    assert_eq!(r.ranks, Some(16));
    assert_eq!(r.nodes, Some(2));
    assert_eq!(r.hosts, vec!["ztan-mig-235z", "ztan-mig-gq73"]);
    assert_eq!(r.gpus_per_process, Some(1));
    assert_eq!(r.wrong(), Some(0));
    assert_eq!(r.avg_busbw_gbps, 70.742);
    close(r.max_busbw_gbps(), 338.82);
    close(r.plateau_busbw_gbps(), 324.5025);
    close(r.plateau_algbw_gbps(), 173.0675);
}

#[test]
fn oci_output_with_job_script_noise_and_version_line() {
    let r = parse_perf_output(&fixture("nccl-tests/oci-h100-roce-2x8-allreduce.txt"))
        .unwrap()
        .unwrap();
    assert_eq!(r.rows.len(), 5);
    assert_eq!(r.rows[0].size_bytes, 1073741824);
    assert_eq!(r.ranks, Some(16));
    assert_eq!(r.nodes, Some(2));
    assert_eq!(r.nccl_version.as_deref(), Some("2.23.4+cuda12.6"));
    assert_eq!(r.avg_busbw_gbps, 464.075);
    close(r.plateau_busbw_gbps(), 468.6875);
}

#[test]
fn superbench_output_with_interleaved_nccl_info() {
    let text = fixture("nccl-tests/superbench-a100-1x8-allreduce-interleaved-info.txt");
    let r = parse_perf_output(&text).unwrap().unwrap();
    assert_eq!(r.format, PerfFormat::Old);
    assert_eq!(r.rows.len(), 34, "0, 0, then 4 B .. 8 GiB");
    assert_eq!(r.ranks, Some(8));
    assert_eq!(r.nodes, Some(1));
    assert_eq!(r.gpus_per_process, Some(8));
    assert_eq!(
        r.rows[2].out_of_place.max_error, None,
        "N/A with validation off"
    );
    close(r.plateau_busbw_gbps(), 233.1425);
    // the same file read as a log finds the interleaved INFO line
    let log = parse_debug_log(&text);
    assert!(log.nccl_lines >= 1);
    assert_eq!(log.net, None);
}

#[test]
fn run_cut_short_is_an_error() {
    let text = fixture("nccl-tests/gcp-a3mega-h100-2x8-allreduce.txt");
    let cut: String = text
        .lines()
        .take_while(|l| !l.trim_start().starts_with("2147483648"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        parse_perf_output(&cut),
        Err(PerfParseError::CutShort {
            last_size: 1073741824
        })
    );
    // and a row cut mid-line, at the end of the capture
    let half =
        format!("{cut}  2147483648     536870912     float     sum      -1    12646  169.81");
    assert!(matches!(
        parse_perf_output(&half),
        Err(PerfParseError::CutShort { .. })
    ));
}

#[test]
fn mpi_noise_inside_the_table_is_skipped() {
    let text = fixture("nccl-tests/oci-h100-roce-2x8-allreduce.txt");
    let noisy: String = text
        .lines()
        .flat_map(|l| {
            let mut v = vec![l.to_string()];
            if l.trim_start().starts_with("2147483648") {
                v.push("[h100-ord01-03-14:1942267] 15 more processes have sent help message help-mpi-btl-openib.txt".into());
                v.push("h100-ord01-03-14:1942267:1942300 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0".into());
                v.push("12 slots were requested but the job has 8".into());
            }
            v
        })
        .map(|l| l + "\n")
        .collect();
    let obs = NcclObservation::from_texts([noisy.as_str()]).unwrap();
    let perf = obs.perf.as_ref().unwrap();
    assert_eq!(perf.rows.len(), 5);
    assert_eq!(perf.skipped_lines, 1, "the numeric-looking MPI line");
    assert_eq!(obs.nodes(), Some(2));
}

#[test]
fn hgx_roce_log_uses_ib_with_gdrdma_on_eight_hcas() {
    let r = parse_debug_log(&fixture(
        "nccl-debug/hgx-h100-roce400-2node-init-gdrdma.txt",
    ));
    assert_eq!(r.nccl_version.as_deref(), Some("2.27.5+cuda12.9"));
    assert_eq!(r.net, Some(Transport::Ib));
    assert_eq!(r.gdr, Some(true));
    assert_eq!(
        r.hcas,
        vec![
            "mlx5_0:1",
            "mlx5_1:1",
            "mlx5_2:1",
            "mlx5_5:1",
            "mlx5_6:1",
            "mlx5_7:1",
            "mlx5_8:1",
            "mlx5_11:1"
        ]
    );
    assert_eq!(
        r.hca_link_layers.get("mlx5_11:1").map(String::as_str),
        Some("RoCE")
    );
    assert!(r.intra_node.contains("P2P/IPC"));
    assert!(r.dmabuf);
    assert_eq!(r.ranks, Some(16));
    assert_eq!(r.nodes, Some(2));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[test]
fn moc_log_with_gdr_disabled() {
    let r = parse_debug_log(&fixture(
        "nccl-debug/moc-h100-2x4-roce400-net-ib-gdr-disabled.txt",
    ));
    assert_eq!(r.net, Some(Transport::Ib));
    assert_eq!(r.gdr, Some(false));
    assert_eq!(r.hcas, vec!["mlx5_2:1"]);
    assert_eq!(r.nccl_version.as_deref(), Some("2.26.2+cuda12.2"));
}

#[test]
fn moc_log_with_socket_fallback() {
    let r = parse_debug_log(&fixture("nccl-debug/moc-h100-2x4-socket-fallback.txt"));
    assert_eq!(r.net, Some(Transport::Socket));
    assert_eq!(r.gdr, Some(false));
    assert!(r.hcas.is_empty());
}

#[test]
fn azure_log_lists_an_ethernet_vf_and_warns() {
    let r = parse_debug_log(&fixture(
        "nccl-debug/azure-ndv5-h100-netib-includes-roce-vf-warn.txt",
    ));
    assert_eq!(r.net, Some(Transport::Ib));
    assert_eq!(r.gdr, Some(true), "GPU Direct RDMA Enabled lines");
    assert_eq!(r.hcas.len(), 9);
    assert_eq!(
        r.hca_link_layers.get("mlx5_1:1").map(String::as_str),
        Some("RoCE")
    );
    assert_eq!(r.errors, vec!["Attribute busid of node nic not found"]);
}

#[test]
fn analyze_without_profile_is_unknown_unless_a_hard_rule_fails() {
    let oci = fixture("nccl-tests/oci-h100-roce-2x8-allreduce.txt");
    let r = analyze(&NcclObservation::from_texts([oci.as_str()]).unwrap(), None);
    assert_eq!(r.verdict, AnalyzeVerdict::Unknown);
    assert_eq!(r.transport, None);
    assert_eq!(r.gdr, None);
    assert_eq!(r.hcas, None);
    assert_eq!(r.wrong, Some(0));

    let sock = fixture("nccl-debug/moc-h100-2x4-socket-fallback.txt");
    let r = analyze(&NcclObservation::from_texts([sock.as_str()]).unwrap(), None);
    assert_eq!(r.verdict, AnalyzeVerdict::Fail);
    assert_eq!(r.transport, Some("Socket"));
    assert!(r.reasons[0].contains("NET/Socket"), "{:?}", r.reasons);
}

#[test]
fn analyze_json_keys_are_the_contract() {
    let oci = fixture("nccl-tests/oci-h100-roce-2x8-allreduce.txt");
    let r = analyze(&NcclObservation::from_texts([oci.as_str()]).unwrap(), None);
    let v = serde_json::to_value(&r).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "avg_busbw_gbps",
            "busbw_max_gbps",
            "busbw_plateau_gbps",
            "errors",
            "gdr",
            "hcas",
            "nodes",
            "ranks",
            "reasons",
            "transport",
            "verdict",
            "wqe",
            "wrong"
        ]
    );
    assert_eq!(v["verdict"], "unknown");
    assert!(v["gdr"].is_null());
    assert!(v["wqe"].is_null(), "no WQE lines in the input");
}

#[test]
fn analyze_against_a_profile() {
    let p = profile();
    // A100 HDR numbers against the H100 NDR profile: plateau too low.
    let a100 = fixture("nccl-tests/dgx-a100-hdr-2x8-allreduce-k8s-deepops.txt");
    let hgx = fixture("nccl-debug/hgx-h100-roce400-2node-init-gdrdma.txt");
    let r = analyze(
        &NcclObservation::from_texts([a100.as_str(), hgx.as_str()]).unwrap(),
        Some(&p.spec),
    );
    assert_eq!(r.verdict, AnalyzeVerdict::Fail);
    assert!(r
        .reasons
        .iter()
        .any(|x| x
            == "NCCL busbw plateau 184.55 GB/s, expected at least 320 GB/s (a 2-node run: 8 rails x the loopback's 40 GB/s)"));
    // the HGX log used mlx5_1, mlx5_2, mlx5_7, mlx5_8, which the DGX profile does not name
    assert!(
        r.reasons
            .iter()
            .any(|x| x
                == "NCCL used HCAs outside the profile: mlx5_1:1, mlx5_2:1, mlx5_7:1, mlx5_8:1")
    );

    // OCI 468 GB/s with a GDR-disabled log: fails on GDR only
    let oci = fixture("nccl-tests/oci-h100-roce-2x8-allreduce.txt");
    let moc = fixture("nccl-debug/moc-h100-2x4-roce400-net-ib-gdr-disabled.txt");
    let mut p2 = p.spec.clone();
    p2.rails[0].hca = "mlx5_2".into();
    let r = analyze(
        &NcclObservation::from_texts([oci.as_str(), moc.as_str()]).unwrap(),
        Some(&p2),
    );
    assert_eq!(r.verdict, AnalyzeVerdict::Fail);
    assert_eq!(
        r.reasons,
        vec!["GPUDirect RDMA not in use (NCCL network channels lack GDRDMA), profile expects it"]
    );

    // and the same table with an IB+GDR log over the profile's HCAs passes
    let good_log =
        "n:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; OOB eth0:1<0>\n\
                    n:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n\
                    n:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1/GDRDMA\n";
    let r = analyze(
        &NcclObservation::from_texts([oci.as_str(), good_log]).unwrap(),
        Some(&p.spec),
    );
    assert_eq!(r.verdict, AnalyzeVerdict::Pass, "{:?}", r.reasons);
    assert!(r.reasons.is_empty());
}
