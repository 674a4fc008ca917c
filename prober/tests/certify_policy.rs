//! The certification policy, one test per failure reason, plus history regression, the
//! software diff, passive checks and the certificate record.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;

use jiff::Timestamp;
use railguard_api::certificate::HistoryEntry;
use railguard_api::{FabricProfileSpec, LinkLayer, RailVerdict, Transport, Verdict};
use railguard_prober::certify::evidence::{RUN_GDR_OFF, RUN_MAIN};
use railguard_prober::certify::policy::assess_in_fleet;
use railguard_prober::certify::record::{invasive_certificate, passive_certificate, Subject};
use railguard_prober::certify::{
    assess, assess_passive, Evidence, NcclRunEvidence, PortReading, RailBench, ResourceExposure,
};
use railguard_prober::nccl::NcclObservation;

const PROFILE: &str = r#"
apiVersion: railguard.io/v1alpha1
kind: FabricProfile
metadata: { name: test-ndr }
spec:
  rails:
    - { hca: mlx5_0, port: 1, linkLayer: IB, rateGbps: 400, gpus: [0] }
    - { hca: mlx5_1, port: 1, linkLayer: IB, rateGbps: 400, gpus: [1] }
  rdma: { resourceName: rdma/rdma_shared_device_a, countMode: SharedDevice }
  thresholds:
    writeBwHostGbps: 360
    writeBwGpuGbps: 350
    maxLatencyUs: 5
    busbwPlateauGBps: 360
    counterGrowth: { port_rcv_errors: 2 }
    regressionTolerancePercent: 10
  certification:
    historyDepth: 3
    ttlSeconds: 3600
    intervalSeconds: 600
"#;

fn profile() -> FabricProfileSpec {
    railguard_api::profiles_from_yaml(PROFILE)
        .unwrap()
        .remove(0)
        .spec
}

fn port(hca: &str, counters: &[(&str, u64)]) -> PortReading {
    PortReading {
        hca: hca.into(),
        port: 1,
        state: "ACTIVE".into(),
        phys_state: Some("5: LinkUp".into()),
        link_layer: Some(LinkLayer::Ib),
        rate_gbps: Some(400.0),
        counters: counters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        pci_address: None,
        sriov_vfs: Vec::new(),
    }
}

/// nccl-tests output (new format) whose large sizes all run at `busbw`.
fn table(busbw: f64, wrong: u64) -> String {
    let mut s = String::from(
        "#  Rank  0 Group  0 Pid 1 on node-a device  0 [0x0f] NVIDIA H100\n\
         #  Rank  1 Group  0 Pid 1 on node-b device  0 [0x0f] NVIDIA H100\n\
         #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n",
    );
    for p in 23..=33u32 {
        let size = 1u64 << p;
        let bw = if p < 30 { busbw / 4.0 } else { busbw };
        s.push_str(&format!(
            "{size} {} float sum -1 100.0 {a:.2} {bw:.2} {wrong} 100.0 {a:.2} {bw:.2} 0\n",
            size / 4,
            a = bw / 2.0
        ));
    }
    s.push_str("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 200.5\n");
    s
}

fn log(net: &str, gdr: bool, hcas: &[&str]) -> String {
    let using: Vec<String> = hcas
        .iter()
        .enumerate()
        .map(|(i, h)| format!("[{i}]{h}:1/IB"))
        .collect();
    let mut s = format!(
        "node-a:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n\
         node-a:1:1 [0] NCCL INFO NET/{net} : Using {} [RO]; OOB eth0:10.0.0.1<0>\n",
        using.join(" ")
    );
    for (i, _) in hcas.iter().enumerate() {
        s.push_str(&format!(
            "node-a:1:1 [0] NCCL INFO Channel 0{i}/0 : 0[0] -> 1[0] [send] via NET/{net}/{i}{}\n",
            if gdr { "/GDRDMA" } else { "" }
        ));
    }
    s
}

fn observation(busbw: f64, wrong: u64, log_text: &str) -> NcclObservation {
    let t = table(busbw, wrong);
    NcclObservation::from_texts([t.as_str(), log_text]).unwrap()
}

fn main_run(obs: NcclObservation) -> NcclRunEvidence {
    NcclRunEvidence {
        label: RUN_MAIN.into(),
        env: vec![],
        outcome: Ok(obs),
    }
}

fn good() -> Evidence {
    let p = profile();
    Evidence {
        before: vec![
            port("mlx5_0", &[("symbol_error", 5), ("port_rcv_errors", 10)]),
            port("mlx5_1", &[("symbol_error", 0)]),
        ],
        after: vec![
            port("mlx5_0", &[("symbol_error", 5), ("port_rcv_errors", 11)]),
            port("mlx5_1", &[("symbol_error", 0)]),
        ],
        benches: ["mlx5_0", "mlx5_1"]
            .iter()
            .map(|h| RailBench {
                hca: h.to_string(),
                port: 1,
                write_bw_host_gbps: Some(390.0),
                write_bw_gpu_gbps: Some(380.0),
                latency_us: Some(2.1),
                ..RailBench::default()
            })
            .collect(),
        nccl: vec![main_run(observation(
            380.0,
            0,
            &log("IB", true, &["mlx5_0", "mlx5_1"]),
        ))],
        layout_signature: Some(p.signature()),
        software: [("driver", "550.54.15"), ("nccl", "2.21.5")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        exposure: Some(ResourceExposure {
            resource: "rdma/rdma_shared_device_a".into(),
            allocatable: Some("1k".into()),
        }),
        findings: vec![],
        gpu_rails: [("0000:1b:00.0", "mlx5_0:1"), ("0000:43:00.0", "mlx5_1:1")]
            .iter()
            .map(|(g, r)| (g.to_string(), r.to_string()))
            .collect(),
        grey: Default::default(),
    }
}

/// A profile that sets writeBwGpuGbps and a node that cannot measure GPU memory: not
/// certified, with the reason, never silently passed.
#[test]
fn unmeasurable_gpu_memory_fails_a_profile_that_requires_it() {
    let mut e = good();
    e.benches[0].write_bw_gpu_gbps = None;
    e.benches[0].gpu_unavailable = Some("no CUDA driver (libcuda.so.1 not found)".into());
    let p = profile();
    assert!(p.thresholds.write_bw_gpu_gbps.is_some());
    let a = assess(&p, &e, &[]);
    assert_eq!(a.verdict, Verdict::Degraded);
    assert_eq!(a.rails[0].faults, vec![railguard_api::RailFault::Gpudirect]);
    assert!(
        a.reasons.iter().any(|r| r
            == "rail mlx5_0:1: RDMA write bandwidth (GPU memory) not measured (no CUDA driver (libcuda.so.1 not found)), the profile requires at least 350 Gb/s"),
        "{:?}",
        a.reasons
    );
    // Without the threshold the same node certifies (GPU memory is then informational).
    let mut lax = profile();
    lax.thresholds.write_bw_gpu_gbps = None;
    assert_eq!(assess(&lax, &e, &[]).verdict, Verdict::Certified);
}

/// The certificate says how GPU memory was registered (and why the path before it failed),
/// and carries the runbook's near/far GPU comparison.
#[test]
fn gpu_memory_registration_and_far_gpu_are_recorded() {
    use railguard_prober::certify::evidence::FarGpuBench;
    use railguard_prober::rdma::{GpuRegistrationReport, RegistrationAttempt, RegistrationPath};
    let mut e = good();
    e.benches[0].latency_gpu_us = Some(2.456);
    e.benches[0].gpu_registration = Some(GpuRegistrationReport {
        gpu: 0,
        pci_bus_id: "0000:1b:00.0".into(),
        path: RegistrationPath::PeerMem,
        failed: vec![RegistrationAttempt {
            path: RegistrationPath::DmaBuf,
            error: "ibv_reg_dmabuf_mr failed: Operation not supported".into(),
        }],
    });
    e.benches[0].far_gpu = Some(FarGpuBench {
        gpu: 4,
        write_bw_gbps: Some(301.234),
        error: None,
    });
    let a = assess(&profile(), &e, &[]);
    assert_eq!(a.verdict, Verdict::Certified, "{:?}", a.reasons);
    let g = a.rails[0].gpu_memory.as_ref().expect("recorded");
    assert_eq!(g.gpu, 0);
    assert_eq!(g.registration, "peermem");
    assert_eq!(
        g.unavailable,
        ["dma-buf: ibv_reg_dmabuf_mr failed: Operation not supported"]
    );
    assert_eq!(g.latency_us, Some(2.46));
    assert_eq!((g.far_gpu, g.far_write_bw_gbps), (Some(4), Some(301.23)));
    // A rail whose GPU memory was not measured records nothing beyond its reasons.
    assert_eq!(a.rails[1].gpu_memory, None);
}

/// Discovery findings count: a fatal kind fails the node and is recorded with its evidence;
/// a profile may make it informational.
#[test]
fn fatal_findings_fail_and_are_recorded() {
    use railguard_api::{Finding, FindingKind, Severity};
    let mut e = good();
    e.findings = vec![
        Finding {
            kind: FindingKind::AcsRedirect,
            severity: Severity::Critical,
            subject: "0000:15:01.0".into(),
            message: "ACS P2P redirect is on".into(),
            evidence: vec!["ACS control = 0x001d".into()],
        },
        Finding {
            kind: FindingKind::Iommu,
            severity: Severity::Warning,
            subject: "node".into(),
            message: "IOMMU translates DMA".into(),
            evidence: vec![],
        },
    ];
    let p = profile();
    let a = assess(&p, &e, &[]);
    assert_eq!(a.verdict, Verdict::Failed);
    assert_eq!(
        a.reasons,
        vec!["acs-redirect on 0000:15:01.0: ACS P2P redirect is on".to_string()]
    );
    assert_eq!(
        a.findings.len(),
        2,
        "both recorded, only the fatal one fails"
    );

    let mut tolerant = profile();
    tolerant.certification.fatal_findings = vec![FindingKind::PcieDowngrade];
    let a = assess(&tolerant, &e, &[]);
    assert_eq!(a.verdict, Verdict::Certified, "{:?}", a.reasons);
    assert_eq!(a.findings.len(), 2);

    // A passive check applies the same rule.
    let a = assess_passive(&p, &e, Some(Verdict::Certified), &[]);
    assert_eq!(a.verdict, Verdict::Failed);
}

/// A node-level reason fails the node; a rail's own reason fails that rail and leaves the
/// node `degraded` on its other rail (the profile has two).
fn failed_with(e: &Evidence, reason: &str) {
    let a = assess(&profile(), e, &[]);
    if reason.starts_with("rail mlx5") {
        assert_eq!(a.verdict, Verdict::Degraded, "reasons: {:?}", a.reasons);
        assert_eq!(a.usable_rails, 1, "reasons: {:?}", a.reasons);
        let rail = reason
            .trim_start_matches("rail ")
            .split(':')
            .next()
            .unwrap_or("");
        let r = a.rails.iter().find(|r| r.hca == rail).unwrap();
        assert_eq!(r.verdict, RailVerdict::Failed);
        assert!(!r.faults.is_empty(), "a failed rail names its fault class");
    } else {
        assert_eq!(a.verdict, Verdict::Failed, "reasons: {:?}", a.reasons);
    }
    assert!(
        a.reasons.iter().any(|r| r == reason),
        "expected reason {reason:?} in {:?}",
        a.reasons
    );
}

#[test]
fn healthy_node_is_certified_with_counter_growth_within_allowance() {
    let a = assess(&profile(), &good(), &[]);
    assert_eq!(a.verdict, Verdict::Certified, "{:?}", a.reasons);
    assert!(a.reasons.is_empty());
    assert!(a.rails.iter().all(|r| r.verdict == RailVerdict::Healthy));
    // port_rcv_errors grew by 1, allowed 2: recorded, not failed
    assert_eq!(a.rails[0].counter_deltas.get("port_rcv_errors"), Some(&1));
    let n = a.nccl.unwrap();
    assert_eq!(n.busbw_plateau_gbps, Some(380.0));
    assert_eq!(n.transport, Some(Transport::Ib));
    assert_eq!(n.gdr, Some(true));
    assert_eq!(n.hcas, vec!["mlx5_0:1", "mlx5_1:1"]);
    assert_eq!(n.nccl_version.as_deref(), Some("2.21.5"));
}

#[test]
fn missing_rail_fails() {
    let mut e = good();
    e.after.retain(|p| p.hca != "mlx5_1");
    e.before.retain(|p| p.hca != "mlx5_1");
    e.exposure = None;
    failed_with(&e, "rail mlx5_1:1: port not found (expected IB 400 Gb/s)");
}

#[test]
fn port_down_and_phys_state_fail() {
    let mut e = good();
    e.after[1].state = "DOWN".into();
    e.after[1].phys_state = Some("3: Disabled".into());
    failed_with(&e, "rail mlx5_1:1: port state DOWN, expected ACTIVE");
    failed_with(
        &e,
        "rail mlx5_1:1: physical state \"3: Disabled\", expected LinkUp",
    );
    let a = assess(&profile(), &e, &[]);
    assert_eq!(a.rails[1].verdict, RailVerdict::Failed);
    assert_eq!(a.rails[0].verdict, RailVerdict::Healthy);
}

#[test]
fn wrong_link_layer_fails() {
    let mut e = good();
    e.after[0].link_layer = Some(LinkLayer::Roce);
    failed_with(&e, "rail mlx5_0:1: link layer RoCE, expected IB");
}

#[test]
fn low_link_rate_fails() {
    let mut e = good();
    e.after[0].rate_gbps = Some(200.0);
    failed_with(&e, "rail mlx5_0:1: link rate 200 Gb/s, expected 400 Gb/s");
}

#[test]
fn growing_error_counters_fail() {
    let mut e = good();
    e.after[1].counters.insert("symbol_error".into(), 7);
    failed_with(
        &e,
        "rail mlx5_1:1: error counter symbol_error grew by 7 during the check window (allowed 0)",
    );
    // beyond the profile's allowance
    let mut e = good();
    e.after[0].counters.insert("port_rcv_errors".into(), 13);
    failed_with(
        &e,
        "rail mlx5_0:1: error counter port_rcv_errors grew by 3 during the check window (allowed 2)",
    );
    // traffic counters are never judged
    let mut e = good();
    e.before[0].counters.insert("port_xmit_data".into(), 1);
    e.after[0]
        .counters
        .insert("port_xmit_data".into(), 1_000_000);
    assert_eq!(assess(&profile(), &e, &[]).verdict, Verdict::Certified);
}

#[test]
fn counter_reset_counts_from_zero() {
    let mut e = good();
    e.before[1].counters.insert("link_downed".into(), 40);
    e.after[1].counters.insert("link_downed".into(), 1);
    failed_with(
        &e,
        "rail mlx5_1:1: error counter link_downed grew by 1 during the check window (allowed 0)",
    );
}

#[test]
fn rdma_bandwidth_latency_and_errors_fail() {
    let mut e = good();
    e.benches[0].write_bw_host_gbps = Some(180.5);
    failed_with(
        &e,
        "rail mlx5_0:1: RDMA write bandwidth (host memory) 180.5 Gb/s, expected at least 360 Gb/s",
    );
    let mut e = good();
    e.benches[1].write_bw_gpu_gbps = Some(90.0);
    failed_with(
        &e,
        "rail mlx5_1:1: RDMA write bandwidth (GPU memory) 90 Gb/s, expected at least 350 Gb/s",
    );
    let mut e = good();
    e.benches[1].latency_us = Some(12.5);
    failed_with(
        &e,
        "rail mlx5_1:1: RDMA write latency 12.5 us, expected at most 5 us",
    );
    let mut e = good();
    e.benches[0].error = Some("no RDMA devices".into());
    failed_with(&e, "rail mlx5_0:1: RDMA write test failed: no RDMA devices");
    let mut e = good();
    e.benches.remove(1);
    failed_with(&e, "rail mlx5_1:1: no RDMA write measurement");
}

#[test]
fn wrong_values_always_fail() {
    let mut e = good();
    e.nccl = vec![main_run(observation(
        400.0,
        5,
        &log("IB", true, &["mlx5_0", "mlx5_1"]),
    ))];
    failed_with(
        &e,
        // 5 wrong out-of-place values on each of the 11 sizes
        "NCCL all_reduce reported #wrong 55, expected 0 (data corruption)",
    );
}

#[test]
fn socket_fallback_always_fails() {
    let mut e = good();
    let sock = "node-a:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n\
                node-a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n";
    e.nccl = vec![main_run(observation(400.0, 0, sock))];
    failed_with(
        &e,
        "NCCL fell back to NET/Socket, expected NET/IB: the run did not use RDMA",
    );
}

#[test]
fn missing_gdr_fails_only_when_expected() {
    let mut e = good();
    e.nccl = vec![main_run(observation(
        400.0,
        0,
        &log("IB", false, &["mlx5_0", "mlx5_1"]),
    ))];
    failed_with(
        &e,
        "GPUDirect RDMA not in use (NCCL network channels lack GDRDMA), profile expects it",
    );
    let mut p = profile();
    p.certification.nccl_tests.expect_gdr = false;
    assert_eq!(assess(&p, &e, &[]).verdict, Verdict::Certified);
}

#[test]
fn no_network_transport_fails() {
    let mut e = good();
    e.nccl = vec![main_run(observation(400.0, 0, ""))];
    failed_with(
        &e,
        "NCCL log shows no network transport, expected NET/IB: the run did not cross the fabric",
    );
}

#[test]
fn low_plateau_fails() {
    let mut e = good();
    e.nccl = vec![main_run(observation(
        250.0,
        0,
        &log("IB", true, &["mlx5_0", "mlx5_1"]),
    ))];
    failed_with(
        &e,
        "NCCL loopback busbw plateau 250 GB/s, expected at least 360 GB/s",
    );
}

/// A real `all_reduce_perf -g 1` run (prober/fixtures/nccl-tests/gtx1660-...): one rank, busbw
/// 0, no network channel. Not certified, with the reason.
#[test]
fn a_one_rank_run_is_not_certified() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/nccl-tests/gtx1660-1x1-allreduce-g1-one-rank.txt");
    let text = std::fs::read_to_string(p).unwrap();
    let mut e = good();
    e.nccl = vec![main_run(
        NcclObservation::from_texts([text.as_str()]).unwrap(),
    )];
    failed_with(
        &e,
        "NCCL ran 1 rank: one rank moves no byte (busbw 0) and uses no NIC; the loopback needs one rank per GPU (ncclTests.args without -g; for the native runner, CUDA must see every GPU of the node)",
    );
    failed_with(
        &e,
        "NCCL loopback busbw plateau 0 GB/s, expected at least 360 GB/s",
    );
}

/// With P2P on, NCCL connects the GPUs of one node over NVLink: the NICs carried nothing, even
/// though NCCL opened them at init (`Using network IB`).
#[test]
fn a_loopback_over_p2p_or_shm_is_not_certified() {
    let mut e = good();
    let l = log("IB", true, &["mlx5_0", "mlx5_1"])
        .replace(" [send] via NET/IB/0/GDRDMA", " via P2P/direct pointer");
    e.nccl = vec![main_run(observation(380.0, 0, &l))];
    failed_with(
        &e,
        "NCCL loopback connected GPUs through P2P/direct instead of the NICs: NCCL_P2P_DISABLE/NCCL_SHM_DISABLE did not take effect",
    );
    // No channel lines at all, only NCCL's init: no evidence the NICs carried the run.
    let init_only: String = log("IB", true, &["mlx5_0", "mlx5_1"])
        .lines()
        .filter(|l| !l.contains("Channel"))
        .map(|l| format!("{l}\n"))
        .collect();
    e.nccl = vec![main_run(observation(380.0, 0, &init_only))];
    failed_with(
        &e,
        "NCCL log shows no channel through the network: the loopback did not cross a NIC",
    );
}

#[test]
fn the_nvlink_run_is_judged_only_against_its_own_threshold() {
    use railguard_prober::certify::evidence::RUN_NVLINK;
    let mut e = good();
    let nvlink = |busbw: f64| NcclRunEvidence {
        label: RUN_NVLINK.into(),
        env: vec![],
        outcome: Ok(observation(
            busbw,
            0,
            &log("IB", true, &["mlx5_0", "mlx5_1"]),
        )),
    };
    e.nccl.push(nvlink(300.0));
    let mut p = profile();
    let a = assess(&p, &e, &[]);
    assert_eq!(a.verdict, Verdict::Certified, "{:?}", a.reasons);
    assert_eq!(a.nccl.as_ref().unwrap().nvlink_busbw_gbps, Some(300.0));
    p.thresholds.nvlink_busbw_gbps = Some(450.0);
    let a = assess(&p, &e, &[]);
    assert!(
        a.reasons.contains(
            &"NCCL NVLink run busbw plateau 300 GB/s, expected at least 450 GB/s".to_string()
        ),
        "{:?}",
        a.reasons
    );
}

#[test]
fn nccl_log_errors_fail() {
    let mut e = good();
    let l = log("IB", true, &["mlx5_0", "mlx5_1"])
        + "node-a:1:2 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_dmabuf_mr failed with error Bad address\n";
    e.nccl = vec![main_run(observation(400.0, 0, &l))];
    failed_with(
        &e,
        "NCCL error: Call to ibv_reg_dmabuf_mr failed with error Bad address",
    );
}

#[test]
fn nccl_on_the_wrong_hcas_fails() {
    let mut e = good();
    e.nccl = vec![main_run(observation(
        400.0,
        0,
        &log("IB", true, &["mlx5_0", "mlx5_4"]),
    ))];
    failed_with(&e, "NCCL used HCAs outside the profile: mlx5_4:1");
    failed_with(&e, "NCCL did not use the profile's rails mlx5_1:1");
}

#[test]
fn nccl_run_failure_or_absence_fails() {
    let mut e = good();
    e.nccl = vec![NcclRunEvidence {
        label: RUN_MAIN.into(),
        env: vec![],
        outcome: Err("all_reduce_perf exited with exit status: 3".into()),
    }];
    failed_with(
        &e,
        "NCCL loopback failed: all_reduce_perf exited with exit status: 3",
    );
    let mut e = good();
    e.nccl.clear();
    failed_with(&e, "NCCL loopback did not run (no NCCL evidence)");
}

#[test]
fn gdr_negative_control_must_be_slower() {
    let mut e = good();
    e.nccl.push(NcclRunEvidence {
        label: RUN_GDR_OFF.into(),
        env: vec![("NCCL_NET_GDR_LEVEL".into(), "LOC".into())],
        outcome: Ok(observation(
            375.0,
            0,
            &log("IB", false, &["mlx5_0", "mlx5_1"]),
        )),
    });
    failed_with(&e, "GDR negative control (NCCL_NET_GDR_LEVEL=LOC) reached 375 GB/s vs 380 GB/s with GDR: GPUDirect RDMA is not what carries the traffic");
    // a slower control passes
    if let Ok(o) = &mut e.nccl[1].outcome {
        *o = observation(200.0, 0, &log("IB", false, &["mlx5_0", "mlx5_1"]));
    }
    assert_eq!(assess(&profile(), &e, &[]).verdict, Verdict::Certified);
}

#[test]
fn foreign_layout_fails() {
    let mut e = good();
    e.layout_signature = Some("v1-000000000000".into());
    let expected = profile().signature();
    failed_with(
        &e,
        &format!("rail layout signature v1-000000000000 differs from the profile's {expected}"),
    );
}

#[test]
fn rdma_resource_exposure() {
    let mut e = good();
    e.exposure = Some(ResourceExposure {
        resource: "rdma/rdma_shared_device_a".into(),
        allocatable: None,
    });
    failed_with(
        &e,
        "node does not advertise RDMA resource rdma/rdma_shared_device_a in allocatable (found none)",
    );
    let mut e = good();
    e.after.retain(|p| p.hca != "mlx5_1");
    failed_with(
        &e,
        "node advertises RDMA resource rdma/rdma_shared_device_a (1k) but lacks the profile's rails mlx5_1:1",
    );
}

fn pass(at: i64, busbw: f64, bw0: f64, driver: &str) -> HistoryEntry {
    HistoryEntry {
        issued_at: Timestamp::from_second(at).unwrap(),
        verdict: Verdict::Certified,
        busbw_plateau_gbps: Some(busbw),
        rail_write_bw_gbps: [
            ("mlx5_0:1".to_string(), bw0),
            ("mlx5_1:1".to_string(), 390.0),
        ]
        .into_iter()
        .collect(),
        software: [("driver", driver), ("nccl", "2.21.5")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn drop_against_history_median_degrades_even_above_threshold() {
    // history median busbw 440 (430, 440, 450); now 380: 13.6% down, threshold is 360
    let history = vec![
        pass(1, 430.0, 390.0, "550.54"),
        pass(2, 450.0, 390.0, "550.54"),
        pass(3, 440.0, 390.0, "550.54"),
    ];
    let mut e = good();
    e.software.insert("driver".into(), "560.28".into());
    let a = assess(&profile(), &e, &history);
    assert_eq!(a.verdict, Verdict::Degraded, "{:?}", a.reasons);
    assert!(a.regressed);
    assert_eq!(
        a.reasons,
        vec![
            "NCCL busbw plateau 380 GB/s is 13.6% below this node's history median 440 GB/s (tolerance 10%)".to_string(),
            "changed since the last pass: driver 550.54 -> 560.28".to_string(),
        ]
    );
}

#[test]
fn rail_bandwidth_regression_degrades_the_rail() {
    let history = vec![
        pass(1, 380.0, 460.0, "550.54.15"),
        pass(2, 380.0, 470.0, "550.54.15"),
    ];
    let a = assess(&profile(), &good(), &history);
    assert_eq!(a.verdict, Verdict::Degraded);
    assert_eq!(a.rails[0].verdict, RailVerdict::Degraded);
    assert_eq!(a.rails[1].verdict, RailVerdict::Healthy);
    assert_eq!(
        a.rails[0].reasons,
        vec!["rail mlx5_0:1: RDMA write bandwidth (host memory) 390 Gb/s is 16.1% below this node's history median 465 Gb/s (tolerance 10%)"]
    );
    // same software: no diff reason
    assert!(!a.reasons.iter().any(|r| r.starts_with("changed since")));
}

#[test]
fn a_drop_the_whole_fleet_shares_is_said_and_not_held_against_the_node() {
    // The node's busbw dropped 13.6% and rail mlx5_0:1 16.1% below its own history, after a
    // driver roll-out; the fleet controller reports both as fleet drift.
    let history = vec![
        pass(1, 430.0, 460.0, "550.54"),
        pass(2, 450.0, 470.0, "550.54"),
        pass(3, 440.0, 465.0, "550.54"),
    ];
    let mut e = good();
    e.software.insert("driver".into(), "560.28".into());
    let drifting: std::collections::BTreeSet<String> = [
        "busbwPlateau".to_string(),
        "writeBwHost/mlx5_0:1".to_string(),
    ]
    .into();
    let a = assess_in_fleet(&profile(), &e, &history, &drifting);
    assert_eq!(a.verdict, Verdict::Certified, "{:?}", a.reasons);
    assert!(!a.regressed);
    assert_eq!(a.rails[0].verdict, RailVerdict::Healthy);
    assert_eq!(
        a.reasons,
        vec![
            "rail mlx5_0:1: RDMA write bandwidth (host memory) 390 Gb/s is 16.1% below this node's history median 465 Gb/s (tolerance 10%); the profile's whole fleet dropped on writeBwHost/mlx5_0:1 (fleet drift), so it is not held against this node".to_string(),
            "NCCL busbw plateau 380 GB/s is 13.6% below this node's history median 440 GB/s (tolerance 10%); the profile's whole fleet dropped on busbwPlateau (fleet drift), so it is not held against this node".to_string(),
        ]
    );
    // Drift on one measurement excuses only that one.
    let only_busbw: std::collections::BTreeSet<String> = ["busbwPlateau".to_string()].into();
    let a = assess_in_fleet(&profile(), &e, &history, &only_busbw);
    assert_eq!(a.verdict, Verdict::Degraded);
    assert_eq!(a.rails[0].verdict, RailVerdict::Degraded);
    // Without a fleet, both drops are the node's.
    assert_eq!(assess(&profile(), &e, &history).verdict, Verdict::Degraded);
}

#[test]
fn history_within_tolerance_and_failed_entries_are_ignored() {
    let mut failed = pass(3, 1000.0, 1000.0, "x");
    failed.verdict = Verdict::Failed;
    // median of passes 400 -> 380 is 5% down: within 10%
    let history = vec![
        pass(1, 400.0, 400.0, "550.54.15"),
        pass(2, 400.0, 400.0, "550.54.15"),
        failed,
    ];
    let a = assess(&profile(), &good(), &history);
    assert_eq!(a.verdict, Verdict::Certified, "{:?}", a.reasons);
}

#[test]
fn only_the_last_history_depth_passes_count() {
    // depth 3: the old 1000 GB/s pass falls out of the window
    let history = vec![
        pass(1, 1000.0, 390.0, "550.54.15"),
        pass(2, 390.0, 390.0, "550.54.15"),
        pass(3, 390.0, 390.0, "550.54.15"),
        pass(4, 390.0, 390.0, "550.54.15"),
    ];
    assert_eq!(
        assess(&profile(), &good(), &history).verdict,
        Verdict::Certified
    );
}

#[test]
fn passive_counter_growth_fails_at_once_and_a_clean_window_keeps_the_verdict() {
    let p = profile();
    let full = assess(&p, &good(), &[]);
    let mut e = good();
    e.benches.clear();
    e.nccl.clear();
    let ok = assess_passive(&p, &e, Some(Verdict::Certified), &full.rails);
    assert_eq!(ok.verdict, Verdict::Certified);
    assert_eq!(
        ok.rails[0].write_bw_host_gbps,
        Some(390.0),
        "bench figures carried over"
    );

    e.after[0].counters.insert("symbol_error".into(), 9);
    let bad = assess_passive(&p, &e, Some(Verdict::Certified), &full.rails);
    // One of two rails failed: the node serves on the other.
    assert_eq!(bad.verdict, Verdict::Degraded);
    assert_eq!(bad.usable_rails, 1);
    assert_eq!(bad.rails[0].faults, vec![railguard_api::RailFault::Errors]);
    assert_eq!(
        bad.reasons,
        vec!["rail mlx5_0:1: error counter symbol_error grew by 4 during the check window (allowed 0)"]
    );
    assert_eq!(bad.rails[0].verdict, RailVerdict::Failed);
    assert_eq!(bad.rails[1].verdict, RailVerdict::Healthy);

    // nothing certified yet: a clean passive window certifies nothing
    let mut clean = good();
    clean.benches.clear();
    assert_eq!(
        assess_passive(&p, &clean, None, &[]).verdict,
        Verdict::Pending
    );
}

/// A rail the grey-rail judge holds grey fails in the passive check with fault `grey` and
/// the judge's evidence, while its link and counters look clean.
#[test]
fn a_grey_rail_fails_the_passive_check_with_the_judges_evidence() {
    let p = profile();
    let full = assess(&p, &good(), &[]);
    let mut e = good();
    e.benches.clear();
    e.nccl.clear();
    let why = "grey for 3 windows in a row: throughput 5.00 GB/s, 12.3 spreads below the median 45.10 GB/s of 8 used rails";
    e.grey.insert("mlx5_1:1".into(), why.into());
    let a = assess_passive(&p, &e, Some(Verdict::Certified), &full.rails);
    assert_eq!(a.verdict, Verdict::Degraded);
    assert_eq!(a.rails[1].verdict, RailVerdict::Failed);
    assert_eq!(a.rails[1].faults, vec![railguard_api::RailFault::Grey]);
    assert_eq!(a.reasons, vec![format!("rail mlx5_1:1: {why}")]);
    assert_eq!(a.rails[0].verdict, RailVerdict::Healthy);
}

#[test]
fn certificate_record_keeps_history_and_expiry_from_the_invasive_pass() {
    let p = profile();
    let subject = Subject {
        node: "gpu-1",
        profile_name: "test-ndr",
        profile: &p,
        signature: None,
        gpus: vec![],
        simulated: false,
    };
    let e = good();
    let t0 = Timestamp::from_second(1_700_000_000).unwrap();
    let mut prev = None;
    for i in 0..5 {
        let now = t0 + jiff::SignedDuration::from_secs(600 * i);
        let a = assess(
            &p,
            &e,
            prev.as_ref()
                .map(|c: &railguard_api::Certificate| c.history.as_slice())
                .unwrap_or(&[]),
        );
        let c = invasive_certificate(&subject, &a, &e.software, prev.as_ref(), now);
        assert_eq!(c.generation, i as u64 + 1);
        assert_eq!(c.issued_at, now);
        assert_eq!(c.expires_at, now + jiff::SignedDuration::from_secs(3600));
        assert!(c.history.len() <= 3, "history depth 3");
        assert_eq!(c.history.last().unwrap().issued_at, now);
        // the annotation round-trips through the api reader
        let back =
            railguard_api::Certificate::from_annotation(&c.to_annotation().unwrap()).unwrap();
        assert_eq!(back, c);
        prev = Some(c);
    }
    let last = prev.unwrap();
    assert_eq!(last.signature, p.signature());
    assert_eq!(
        last.software.get("driver").map(String::as_str),
        Some("550.54.15")
    );

    // a passive failure later: new generation, verdict failed, same issue/expiry
    let mut e2 = good();
    e2.benches.clear();
    e2.after[1].counters.insert("symbol_error".into(), 3);
    let a = assess_passive(&p, &e2, Some(last.verdict), &last.rails);
    let later = last.issued_at + jiff::SignedDuration::from_secs(60);
    let c = passive_certificate(&subject, &a, Some(&last), later);
    assert_eq!(c.verdict, Verdict::Degraded);
    assert_eq!(c.usable_rails, Some(1));
    assert_eq!(c.generation, last.generation + 1);
    assert_eq!(c.issued_at, last.issued_at);
    assert_eq!(c.expires_at, last.expires_at);
    assert_eq!(c.passive_checked_at, Some(later));
    assert_eq!(c.history, last.history);
    assert!(c.reasons[0].contains("symbol_error grew by 3"));
}

#[test]
fn history_medians_and_software_diff_are_plain_functions() {
    use railguard_prober::certify::history::{history_medians, software_diff};
    let h = vec![
        pass(1, 100.0, 10.0, "a"),
        pass(2, 300.0, 30.0, "a"),
        pass(3, 200.0, 20.0, "a"),
    ];
    let m = history_medians(&h, 5);
    assert_eq!(m.busbw_plateau_gbps, Some(200.0));
    assert_eq!(m.rail_write_bw_gbps.get("mlx5_0:1"), Some(&20.0));
    assert_eq!(m.passes, 3);
    let old: BTreeMap<String, String> = [
        ("driver".to_string(), "550.54".to_string()),
        ("ofed".to_string(), "24.01".to_string()),
    ]
    .into();
    let new: BTreeMap<String, String> = [
        ("driver".to_string(), "560.28".to_string()),
        ("nccl".to_string(), "2.23.4".to_string()),
    ]
    .into();
    assert_eq!(
        software_diff(&old, &new),
        vec![
            "driver 550.54 -> 560.28",
            "nccl none -> 2.23.4",
            "ofed 24.01 -> none"
        ]
    );
}

/// Partial certification: a failed rail leaves the node `degraded` with the count of usable
/// rails; the loopback that crossed the failed rail is not held against the others, but a
/// fault no failed rail explains (socket fallback) still fails the node, and so does every
/// rail failing.
#[test]
fn a_failed_rail_degrades_the_node_and_only_all_rails_failing_fails_it() {
    let p = profile();
    let mut e = good();
    e.after[1].state = "DOWN".into();
    let a = assess(&p, &e, &[]);
    assert_eq!(a.verdict, Verdict::Degraded, "{:?}", a.reasons);
    assert_eq!(a.usable_rails, 1);
    assert_eq!(a.rails[1].faults, vec![railguard_api::RailFault::LinkDown]);
    assert!(
        a.reasons
            .iter()
            .any(|r| r == "1 of 2 rails usable: failed mlx5_1:1"),
        "{:?}",
        a.reasons
    );

    // The loopback ran slow over the failed rail: explained, recorded, not a node failure.
    let mut slow = e.clone();
    slow.nccl[0] = main_run(observation(100.0, 0, &log("IB", true, &["mlx5_0"])));
    let a = assess(&p, &slow, &[]);
    assert_eq!(a.verdict, Verdict::Degraded, "{:?}", a.reasons);
    assert!(
        a.reasons
            .iter()
            .any(|r| r.contains("busbw plateau 100 GB/s")
                && r.contains("crossed the failed rails mlx5_1:1")),
        "{:?}",
        a.reasons
    );
    // The same slow loopback with every rail passing fails the node, as before.
    let mut slow_all_up = good();
    slow_all_up.nccl[0] = main_run(observation(
        100.0,
        0,
        &log("IB", true, &["mlx5_0", "mlx5_1"]),
    ));
    assert_eq!(assess(&p, &slow_all_up, &[]).verdict, Verdict::Failed);

    // Data corruption is never explained by a rail.
    let mut wrong = e.clone();
    wrong.nccl[0] = main_run(observation(380.0, 3, &log("IB", true, &["mlx5_0"])));
    assert_eq!(assess(&p, &wrong, &[]).verdict, Verdict::Failed);

    // Every rail failed: nothing usable.
    let mut all = e.clone();
    all.after[0].state = "DOWN".into();
    let a = assess(&p, &all, &[]);
    assert_eq!(a.verdict, Verdict::Failed);
    assert_eq!(a.usable_rails, 0);
}

/// A fatal finding about one rail's own device (its GPU's PCIe link, its HCA) fails that rail
/// with the matching fault, not the node: the node is degraded on its other rails. A finding
/// about anything else (a bridge, the node) still fails the node.
#[test]
fn a_finding_on_a_rails_device_fails_that_rail() {
    use railguard_api::{Finding, FindingKind, RailFault, Severity};
    let p = profile();
    let mut e = good();
    e.findings = vec![Finding {
        kind: FindingKind::PcieDowngrade,
        severity: Severity::Warning,
        subject: "0000:43:00.0".into(),
        message: "GPU 0000:43:00.0 PCIe link runs at x8 16 GT/s below its maximum x16 32 GT/s"
            .into(),
        evidence: vec![],
    }];
    let a = assess(&p, &e, &[]);
    assert_eq!(a.verdict, Verdict::Degraded, "{:?}", a.reasons);
    assert_eq!(a.usable_rails, 1);
    assert_eq!(a.rails[1].verdict, RailVerdict::Failed);
    assert_eq!(a.rails[1].faults, vec![RailFault::Pcie]);
    assert!(
        a.rails[1].reasons[0].starts_with("rail mlx5_1:1: pcie-downgrade on 0000:43:00.0"),
        "{:?}",
        a.rails[1].reasons
    );
    assert_eq!(a.rails[0].verdict, RailVerdict::Healthy);
    // The same by the HCA's PCI address, on a passive check.
    e.after[0].pci_address = Some("0000:18:00.0".into());
    e.findings[0].subject = "0000:18:00.0".into();
    let a = assess_passive(&p, &e, Some(Verdict::Certified), &[]);
    assert_eq!(a.verdict, Verdict::Degraded, "{:?}", a.reasons);
    assert_eq!(a.rails[0].faults, vec![RailFault::Pcie]);
    // A bridge's link is the node's.
    e.findings[0].subject = "0000:15:01.0".into();
    assert_eq!(assess(&p, &e, &[]).verdict, Verdict::Failed);
}

/// Passive healing, as the daemon runs it: each passive check is judged against the
/// certificate on the Node (read back from its annotation, as after a restart) and the
/// resulting certificate published.
mod passive_healing {
    use super::*;
    use railguard_api::{Certificate, RailFault};
    use railguard_prober::certify::assess_passive_against;
    use railguard_prober::publish::event_for;

    fn subject(p: &FabricProfileSpec) -> Subject<'_> {
        Subject {
            node: "gpu-1",
            profile_name: "test-ndr",
            profile: p,
            signature: None,
            gpus: vec![],
            simulated: false,
        }
    }

    fn window() -> Evidence {
        let mut e = good();
        e.benches.clear();
        e.nccl.clear();
        e
    }

    /// A window in which rail `i`'s symbol_error counter grew.
    fn tick(i: usize) -> Evidence {
        let mut e = window();
        e.after[i].counters.insert("symbol_error".into(), 99);
        e
    }

    /// One passive check against `cert`, through the annotation (what a restarted prober
    /// reads).
    fn check(p: &FabricProfileSpec, cert: &Certificate, e: &Evidence) -> Certificate {
        let on_node = Certificate::from_annotation(&cert.to_annotation().unwrap()).unwrap();
        let a = assess_passive_against(p, e, Some(&on_node));
        let now = on_node.passive_checked_at.unwrap() + jiff::SignedDuration::from_secs(60);
        passive_certificate(&subject(p), &a, Some(&on_node), now)
    }

    fn invasive(p: &FabricProfileSpec, e: &Evidence, history: &[HistoryEntry]) -> Certificate {
        let a = assess(p, e, history);
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        invasive_certificate(&subject(p), &a, &e.software, None, now)
    }

    fn profile_healing(n: u32) -> FabricProfileSpec {
        let mut p = profile();
        p.certification.passive_heal_windows = n;
        p
    }

    #[test]
    fn the_default_is_five_windows() {
        assert_eq!(profile().certification.passive_heal_windows, 5);
    }

    #[test]
    fn a_counter_tick_fails_the_rail_and_n_clean_windows_restore_the_certified_node() {
        let p = profile_healing(3);
        let certified = invasive(&p, &good(), &[]);
        assert_eq!(certified.verdict, Verdict::Certified);

        let failed = check(&p, &certified, &tick(0));
        assert_eq!(failed.verdict, Verdict::Degraded);
        assert_eq!(failed.rails[0].verdict, RailVerdict::Failed);
        assert_eq!(failed.rails[0].faults, vec![RailFault::Errors]);
        let hold = failed
            .passive_hold()
            .expect("the node's verdict before is recorded");
        assert_eq!(hold.before.verdict, Verdict::Certified);
        let ev = event_for(&failed, Some(&certified), false).unwrap();
        assert_eq!(ev.reason, "Regressed");

        let mut c = failed.clone();
        for i in 1..3 {
            let next = check(&p, &c, &window());
            assert_eq!(next.verdict, Verdict::Degraded, "clean window {i}");
            assert_eq!(next.rails[0].verdict, RailVerdict::Failed);
            assert_eq!(
                next.rails[0].passive_hold.as_ref().unwrap().clean_windows,
                i
            );
            assert_eq!(
                next.reasons, failed.reasons,
                "the failure is still the reason"
            );
            // The count is news: it is written, so a restarted prober goes on counting.
            assert!(railguard_prober::certify::record::passive_is_news(
                &c,
                &next,
                Some("degraded"),
                next.passive_checked_at.unwrap()
            ));
            assert_eq!(event_for(&next, Some(&c), false), None);
            c = next;
        }
        let healed = check(&p, &c, &window());
        assert_eq!(healed.verdict, Verdict::Certified);
        assert!(healed.reasons.is_empty(), "{:?}", healed.reasons);
        assert_eq!(healed.usable_rails, Some(2));
        assert_eq!(healed.rails[0].verdict, RailVerdict::Healthy);
        assert!(healed.rails[0].faults.is_empty());
        assert_eq!(healed.passive_hold(), None);
        assert!(healed.rails[0].passive_hold.is_some(), "on probation");
        assert_eq!(healed.issued_at, certified.issued_at);
        assert_eq!(healed.expires_at, certified.expires_at);
        let ev = event_for(&healed, Some(&c), false).unwrap();
        assert_eq!((ev.reason, ev.kind), ("RailHealedPassively", "Normal"));
        assert!(
            ev.message
                .contains("mlx5_0:1 after 3 consecutive clean passive checks")
                && ev.message.contains("node certified again (was degraded)"),
            "{}",
            ev.message
        );
        // Probation runs out: the certificate is as small as before the failure.
        let mut c = healed;
        for _ in 0..3 {
            c = check(&p, &c, &window());
        }
        assert!(c.rails.iter().all(|r| r.passive_hold.is_none()));
        let text = c.to_annotation().unwrap();
        assert!(!text.contains("passiveHold"), "{text}");
        assert_eq!(c.verdict, Verdict::Certified);
    }

    #[test]
    fn a_tick_during_the_hold_resets_the_count_and_doubles_the_requirement() {
        let p = profile_healing(2);
        let mut c = check(&p, &invasive(&p, &good(), &[]), &tick(1));
        c = check(&p, &c, &window());
        c = check(&p, &c, &tick(1));
        let hold = c.rails[1].passive_hold.clone().unwrap();
        assert_eq!((hold.clean_windows, hold.flaps), (0, 1));
        let mut windows = 0;
        while c.verdict != Verdict::Certified {
            c = check(&p, &c, &window());
            windows += 1;
            assert!(windows <= 4);
        }
        assert_eq!(windows, 4, "2N after one flap");
        // A tick on probation (the hold after the heal) is one more flap: 4N.
        c = check(&p, &c, &tick(1));
        assert_eq!(c.verdict, Verdict::Degraded);
        assert_eq!(c.rails[1].passive_hold.as_ref().unwrap().flaps, 2);
        let mut windows = 0;
        while c.verdict != Verdict::Certified {
            c = check(&p, &c, &window());
            windows += 1;
        }
        assert_eq!(windows, 8);
    }

    #[test]
    fn the_node_returns_to_degraded_when_another_rail_was_degraded_by_the_invasive_run() {
        let p = profile_healing(1);
        let history = vec![
            pass(1, 380.0, 460.0, "550.54.15"),
            pass(2, 380.0, 470.0, "550.54.15"),
        ];
        let degraded = invasive(&p, &good(), &history);
        assert_eq!(degraded.verdict, Verdict::Degraded);
        assert_eq!(degraded.rails[0].verdict, RailVerdict::Degraded);
        // Rail 1 goes down, then both fail at once: no rail usable.
        let mut down = window();
        down.after[1].state = "DOWN".into();
        let c = check(&p, &degraded, &down);
        assert_eq!(c.verdict, Verdict::Degraded);
        assert_eq!(c.rails[1].faults, vec![RailFault::LinkDown]);
        down.after[0].phys_state = Some("3: Disabled".into());
        let c = check(&p, &c, &down);
        assert_eq!(c.verdict, Verdict::Failed);
        assert_eq!(c.usable_rails, Some(0));
        let hold = c.rails[1].passive_hold.clone().unwrap();
        assert_eq!(
            (hold.clean_windows, hold.flaps),
            (0, 0),
            "down in two checks in a row: one failure, not a flap"
        );
        // Clean again: each rail back to what it was, the node to degraded with its reasons.
        let healed = check(&p, &c, &window());
        assert_eq!(healed.verdict, Verdict::Degraded);
        assert_eq!(healed.reasons, degraded.reasons);
        assert_eq!(healed.rails[0].verdict, RailVerdict::Degraded);
        assert_eq!(healed.rails[0].reasons, degraded.rails[0].reasons);
        assert_eq!(healed.rails[1].verdict, RailVerdict::Healthy);
        assert_eq!(
            event_for(&healed, Some(&c), false).unwrap().reason,
            "RailHealedPassively"
        );
    }

    #[test]
    fn an_invasive_failed_rail_is_never_healed_passively() {
        let p = profile_healing(1);
        let mut e = good();
        e.benches[1].write_bw_host_gbps = Some(100.0);
        let rdma = invasive(&p, &e, &[]);
        assert_eq!(rdma.rails[1].faults, vec![RailFault::Rdma]);
        assert_eq!(rdma.verdict, Verdict::Degraded);
        // Clean windows, then a tick on that same rail, then clean windows again.
        let mut c = check(&p, &rdma, &window());
        c = check(&p, &c, &tick(1));
        assert_eq!(c.rails[1].passive_hold, None);
        for _ in 0..20 {
            c = check(&p, &c, &window());
            assert_eq!(c.rails[1].verdict, RailVerdict::Failed);
            assert_eq!(c.verdict, Verdict::Degraded);
        }
        // A passive failure of the other rail heals; the rdma rail stays failed.
        c = check(&p, &c, &tick(0));
        assert_eq!(c.usable_rails, Some(0));
        c = check(&p, &c, &window());
        assert_eq!(c.rails[0].verdict, RailVerdict::Healthy);
        assert_eq!(c.rails[1].verdict, RailVerdict::Failed);
        assert_eq!(c.verdict, Verdict::Degraded);
    }

    #[test]
    fn an_invasive_run_clears_the_hold_and_the_count() {
        let p = profile_healing(4);
        let mut c = check(&p, &invasive(&p, &good(), &[]), &tick(0));
        c = check(&p, &c, &tick(0));
        c = check(&p, &c, &window());
        assert!(c.passive_hold().is_some() && c.rails[0].passive_hold.is_some());
        let a = assess(&p, &good(), &c.history);
        let now = c.passive_checked_at.unwrap() + jiff::SignedDuration::from_secs(60);
        let renewed = invasive_certificate(&subject(&p), &a, &good().software, Some(&c), now);
        assert_eq!(renewed.verdict, Verdict::Certified);
        assert_eq!(renewed.passive_hold(), None);
        assert!(renewed.rails.iter().all(|r| r.passive_hold.is_none()));
        // The next tick starts from N again.
        let again = check(&p, &renewed, &tick(0));
        let hold = again.rails[0].passive_hold.clone().unwrap();
        assert_eq!((hold.clean_windows, hold.flaps), (0, 0));
    }

    #[test]
    fn zero_windows_keep_the_failure_until_an_invasive_run() {
        let p = profile_healing(0);
        let mut c = check(&p, &invasive(&p, &good(), &[]), &tick(0));
        for _ in 0..50 {
            c = check(&p, &c, &window());
            assert_eq!(c.verdict, Verdict::Degraded);
            assert_eq!(c.rails[0].verdict, RailVerdict::Failed);
        }
        assert!(!c.to_annotation().unwrap().contains("passiveHold"));
    }

    #[test]
    fn a_node_level_failure_during_the_hold_is_not_healed() {
        let p = profile_healing(1);
        let c = check(&p, &invasive(&p, &good(), &[]), &tick(0));
        let mut foreign = window();
        foreign.layout_signature = Some("v1-other".into());
        let c = check(&p, &c, &foreign);
        assert_eq!(c.verdict, Verdict::Failed);
        assert_eq!(c.passive_hold(), None);
        // The rail heals, the node stays failed until an invasive run.
        let c = check(&p, &c, &window());
        assert_eq!(c.rails[0].verdict, RailVerdict::Healthy);
        assert_eq!(c.verdict, Verdict::Failed);
    }
}
