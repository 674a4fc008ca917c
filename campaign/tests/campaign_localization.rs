//! The campaign planner and the coordinator's findings against simulated fabrics with injected
//! faults ([`railguard_sim::campaign_faults`]): every fault is found, nothing healthy is
//! blamed, and the findings name the rail, the peers and the measured values.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use jiff::Timestamp;
use railguard_api::RailVerdict;
use railguard_campaign::coordinator::{findings, CampaignNode, Limits, RailRecord, TestRecord};
use railguard_campaign::plan::{
    sweep_order, CampaignPlan, Localization, PlanOptions, Purpose, RailOutcome,
};
use railguard_campaign::wire::{RailRef, RailReport};
use railguard_sim::campaign_faults::{check_localization, random_faults, simulate, FaultSet};

fn faults(rails: &[(usize, usize)], nodes: &[usize], links: &[(usize, usize, usize)]) -> FaultSet {
    FaultSet {
        rails: rails.iter().copied().collect(),
        nodes: nodes.iter().copied().collect(),
        links: links
            .iter()
            .map(|&(a, b, r)| (a.min(b), a.max(b), r))
            .collect(),
    }
}

fn run_checked(
    n: usize,
    r: usize,
    f: &FaultSet,
    opts: PlanOptions,
) -> (CampaignPlan, Localization) {
    let mut plan = CampaignPlan::new(n, r, opts).unwrap();
    while let Some(round) = plan.next_round() {
        let mut seen = BTreeSet::new();
        for t in &round {
            assert_ne!(
                t.initiator, t.responder,
                "a node is never paired with itself"
            );
            assert!(
                seen.insert(t.initiator),
                "node {} twice in a round",
                t.initiator
            );
            assert!(
                seen.insert(t.responder),
                "node {} twice in a round",
                t.responder
            );
        }
        for t in &round {
            plan.record(f.run(t, r)).unwrap();
        }
    }
    let loc = plan.localize();
    (plan, loc)
}

#[test]
fn healthy_fabric_blames_nobody_and_every_node_meets_two_peers() {
    let (plan, loc) = run_checked(16, 4, &FaultSet::default(), PlanOptions::default());
    assert_eq!(loc, Localization::default());
    assert_eq!(plan.tests(), 16);
    assert_eq!(plan.rounds(), 2);
    assert!((0..16).all(|n| plan.peers_met(n) >= 2));
}

#[test]
fn rail_failing_with_two_healthy_peers_is_the_nodes_rail() {
    let f = faults(&[(5, 2)], &[], &[]);
    let (_, loc) = run_checked(10, 4, &f, PlanOptions::default());
    assert_eq!(
        loc.rail_faults.keys().copied().collect::<Vec<_>>(),
        vec![(5, 2)]
    );
    assert_eq!(loc.rail_faults[&(5, 2)], BTreeSet::from([4, 6]));
    assert!(loc.link_faults.is_empty() && loc.node_faults.is_empty());
    assert!(loc.unresolved.is_empty() && loc.suspect_links.is_empty());
}

#[test]
fn failure_with_one_peer_only_is_the_link_once_third_nodes_clear_both_ends() {
    let f = faults(&[], &[], &[(3, 4, 1)]);
    let (plan, loc) = run_checked(10, 2, &f, PlanOptions::default());
    assert_eq!(loc.link_faults, BTreeSet::from([(3, 4, 1)]));
    assert!(loc.rail_faults.is_empty(), "{loc:?}");
    // Both ends passed rail 1 with a third node.
    assert!(plan.is_good(3, 1) && plan.is_good(4, 1));
}

#[test]
fn confirmation_uses_a_known_good_third_node() {
    // 0 and 1 are both bad on rail 0 and adjacent in the ring: each needs a second
    // healthy peer, found by a confirmation test against a node that passed.
    let f = faults(&[(0, 0), (1, 0)], &[], &[]);
    let (plan, loc) = run_checked(8, 2, &f, PlanOptions::default());
    assert!(loc.rail_faults.contains_key(&(0, 0)) && loc.rail_faults.contains_key(&(1, 0)));
    assert_eq!(loc.rail_faults.len(), 2);
    for t in plan
        .results()
        .iter()
        .filter(|r| matches!(r.test.purpose, Purpose::Confirm { .. }))
    {
        let Purpose::Confirm { suspect } = t.test.purpose else {
            unreachable!()
        };
        let reference = t.test.peer_of(suspect).unwrap();
        assert!(
            !f.faulty_nodes().contains(&reference),
            "reference {reference} must be healthy"
        );
    }
}

#[test]
fn node_failing_on_every_rail_is_the_node() {
    let f = faults(&[], &[7], &[]);
    let (_, loc) = run_checked(12, 4, &f, PlanOptions::default());
    assert_eq!(loc.node_faults, BTreeSet::from([7]));
    assert_eq!(loc.rail_faults.len(), 4);
    assert!(loc.link_faults.is_empty() && loc.suspect_links.is_empty());
}

#[test]
fn link_on_all_rails_is_not_the_node() {
    let f = faults(&[], &[], &[(2, 3, 0), (2, 3, 1)]);
    let (_, loc) = run_checked(8, 2, &f, PlanOptions::default());
    assert!(loc.node_faults.is_empty() && loc.rail_faults.is_empty());
    assert_eq!(loc.link_faults.len(), 2);
}

/// Many random fault placements, node-disjoint as in the scale simulation: everything is
/// found and no healthy node is ever blamed.
#[test]
fn random_faults_are_all_found_and_no_healthy_node_is_blamed() {
    for seed in 0..200u64 {
        let n = 16 + (seed as usize % 48);
        let rails = 1 + (seed as usize % 8);
        let k = 1 + (seed as usize % 6);
        let opts = PlanOptions {
            shuffle_seed: Some(seed),
            ..Default::default()
        };
        let f = random_faults(&sweep_order(n, opts.shuffle_seed), rails, k, seed);
        assert_eq!(f.rails.len() + f.links.len() + f.nodes.len(), k);
        let (plan, loc) = run_checked(n, rails, &f, opts);
        assert_eq!(
            check_localization(&f, &loc),
            Ok(()),
            "seed {seed} n={n} rails={rails} k={k}"
        );
        assert!(
            plan.tests() < 3 * n,
            "seed {seed}: {} tests for n={n}",
            plan.tests()
        );
    }
}

/// Findings from a simulated campaign: the blamed node names the rail and the peers.
#[test]
fn findings_name_rail_peers_and_values() {
    let nodes: Vec<CampaignNode> = (0..6)
        .map(|i| CampaignNode {
            name: format!("n{i}"),
            endpoint: format!("127.0.0.{}:1", i + 1),
        })
        .collect();
    let rails = vec![
        RailRef {
            hca: "mlx5_0".into(),
            port: 1,
        },
        RailRef {
            hca: "mlx5_1".into(),
            port: 1,
        },
    ];
    let limits = Limits {
        min_bw_gbps: 360.0,
        max_latency_us: None,
    };
    let faults = FaultSet {
        rails: [(2, 1)].into(),
        ..Default::default()
    };
    let (plan, loc) = simulate(6, 2, &faults, PlanOptions::default()).unwrap();
    let records: Vec<TestRecord> = plan
        .results()
        .iter()
        .map(|res| TestRecord {
            round: 1,
            initiator: nodes[res.test.initiator].name.clone(),
            responder: nodes[res.test.responder].name.clone(),
            purpose: res.test.purpose,
            rails: res
                .rails
                .iter()
                .enumerate()
                .map(|(r, o)| RailRecord {
                    rail: rails[r].clone(),
                    report: RailReport::Measured {
                        bw_gbps: if *o == RailOutcome::Pass {
                            390.0
                        } else {
                            190.0
                        },
                        latency_us: 2.0,
                    },
                    outcome: *o,
                })
                .collect(),
            error: None,
        })
        .collect();
    let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let f = findings(&nodes, &rails, &limits, &records, &loc, now);
    let n2 = &f["n2"];
    let blame = &n2.blamed_rails["mlx5_1:1"];
    assert_eq!(blame.verdict, RailVerdict::Degraded);
    assert!(
        blame.reason.contains("n1 (190.0 Gb/s") && blame.reason.contains("n3 (190.0 Gb/s"),
        "{}",
        blame.reason
    );
    assert!(n2.node_fault.is_none());
    for other in ["n0", "n1", "n3", "n4", "n5"] {
        assert!(!f[other].blames_node(), "{other} must not be blamed");
        assert!(f[other].links.is_empty());
    }
    // n1 sees n2 as a failed wire entry on mlx5_1:1 and a good one on mlx5_0:1.
    let w = &f["n1"].wire["mlx5_1:1"];
    assert!(w.iter().any(|w| w.peer == "n2" && !w.ok));
    assert!(f["n1"].wire["mlx5_0:1"].iter().all(|w| w.ok));
}
