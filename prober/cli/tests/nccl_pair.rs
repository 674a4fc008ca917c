//! NCCL pair tests over real processes: `railguard-prober peer-endpoint`s on loopback, each
//! starting its `nccl-ranks` children, which load the CUDA and NCCL test doubles
//! (railguard-gpu's `doubles`, built here) through the same dlopen code as the real
//! libraries. The doubles' all-reduce really runs over TCP between the two nodes' children,
//! so the rendezvous over the authenticated control channel, the timing, busbw and the
//! correctness check all run for real above them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/nccl_lab.rs"]
mod nccl_lab;

use std::time::{Duration, Instant};

use railguard_api::{RailVerdict, Transport};
use railguard_campaign::coordinator::{run_campaign, run_nccl_scope, CampaignNode};
use railguard_campaign::plan::RailOutcome;
use railguard_campaign::wire::NcclSide;

use nccl_lab::*;

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
