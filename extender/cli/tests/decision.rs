//! filter and prioritize over node states built from the Node JSON a real kube-scheduler
//! 1.20 sent, with certificates built by railguard_api::Certificate.

#![allow(clippy::unwrap_used, clippy::type_complexity)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use jiff::SignedDuration;
use railguard_api::fleet::OutlierAction;
use railguard_api::{NodeFabric, RailVerdict, Verdict};
use railguard_extender::cache::{CachedNode, NodeIndex};
use railguard_extender::decision::{
    check_node, filter_by, prioritize_scores, topology_keys_for, JobTopology,
};
use railguard_extender::{
    filter, prioritize, target_for, ExtenderConfig, NodeSlot, PodFacts, PodTarget, RejectReason,
};
use railguard_extender_cli::cache::ClusterState;
use railguard_kube::store::{Applier, Change};
use railguard_sim::certificates as synth;

fn slots(nodes: &[NodeFabric]) -> Vec<NodeSlot<'_>> {
    nodes
        .iter()
        .map(|n| NodeSlot::new(&n.name, Some(n)))
        .collect()
}

fn facts(pod: &k8s_openapi::api::core::v1::Pod) -> PodFacts {
    PodFacts::from_pod(pod, &ExtenderConfig::default().job_label_keys)
}

#[test]
fn six_nodes_split_into_passed_failed_and_unresolvable() {
    let profiles = profiles();
    let nodes = six_nodes(&profiles);
    let pod = facts(&training_pod(profile(&profiles, "h100-ndr")));
    let target = target_for(&pod, &profiles, None, &ExtenderConfig::default());
    let v = filter(&target, &slots(&nodes), now());

    let passed: Vec<&str> = v.passed.iter().map(|&i| nodes[i].name.as_str()).collect();
    assert_eq!(passed, ["n-certified"]);
    // Only the expired node may become eligible without a repair.
    assert_eq!(
        v.failed,
        BTreeMap::from([(
            "n-expired".to_string(),
            "railguard: certificate expired 2h10m ago".to_string()
        )])
    );
    let u = &v.unresolvable;
    assert_eq!(u.len(), 4, "{u:?}");
    assert_eq!(
        u["n-other-profile"],
        "railguard: node is certified for profile a100-hdr, pod needs h100-ndr"
    );
    assert_eq!(
        u["n-degraded"],
        "railguard: rail mlx5_3:1 measured 196 Gb/s, profile h100-ndr needs 360"
    );
    assert_eq!(
        u["n-failed"],
        "railguard: fabric certification failed: NCCL fell back to Socket transport"
    );
    assert!(
        u["n-none"].starts_with("railguard: node has no fabric certificate; profile h100-ndr"),
        "{}",
        u["n-none"]
    );
    assert_eq!(v.reasons[&RejectReason::Expired], 1);
    assert_eq!(v.reasons[&RejectReason::Degraded], 1);
    assert!(v
        .failed
        .values()
        .chain(u.values())
        .all(|m| !m.contains('\n')));
}

#[test]
fn recorded_nodes_without_railguard_metadata_are_unresolvable() {
    let profiles = profiles();
    let args: serde_json::Value = serde_json::from_str(ARGS_FULL).unwrap();
    let nodes: Vec<NodeFabric> = args["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| NodeFabric::from_node(&serde_json::from_value(n.clone()).unwrap(), now()))
        .collect();
    assert_eq!(nodes.len(), 3);
    let pod = facts(&training_pod(profile(&profiles, "a100-hdr")));
    let target = target_for(&pod, &profiles, None, &ExtenderConfig::default());
    let v = filter(&target, &slots(&nodes), now());
    assert!(v.passed.is_empty());
    assert_eq!(
        v.unresolvable.keys().collect::<Vec<_>>(),
        ["fake-node-1", "fake-node-2", "fake-node-3"]
    );
}

#[test]
fn pods_that_are_not_training_pods_pass_untouched() {
    let profiles = profiles();
    let nodes = six_nodes(&profiles);
    let pod = facts(&sample_pod());
    let target = target_for(&pod, &profiles, None, &ExtenderConfig::default());
    assert!(matches!(target, PodTarget::PassThrough));
    let v = filter(&target, &slots(&nodes), now());
    assert_eq!(v.passed, (0..6).collect::<Vec<_>>());
    assert!(v.failed.is_empty() && v.unresolvable.is_empty());
    assert!(prioritize(
        &target,
        &slots(&nodes),
        None,
        now(),
        &ExtenderConfig::default()
    )
    .iter()
    .all(|(_, s)| *s == 0));
}

fn gpu_pod(rdma: bool) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = sample_pod();
    let c = &mut pod.spec.as_mut().unwrap().containers[0];
    let mut limits = BTreeMap::from([(
        "nvidia.com/gpu".to_string(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
    )]);
    if rdma {
        limits.insert(
            "rdma/rdma_shared_device_a".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        );
    }
    c.resources.get_or_insert_with(Default::default).limits = Some(limits);
    pod
}

#[test]
fn unannotated_gpu_rdma_pods_are_held_to_the_default_profile() {
    let profiles = profiles();
    let config = ExtenderConfig::default();
    let pod = facts(&gpu_pod(true));
    match target_for(&pod, &profiles, None, &config) {
        PodTarget::Profile {
            profile,
            signature,
            exempt,
        } => {
            assert_eq!(profile.name(), "h100-ndr");
            assert_eq!(signature, profile.spec.signature());
            assert!(!exempt);
        }
        other => panic!("expected the default profile, got {other:?}"),
    }
    // No default profile: every node fails, unresolvably (preemption cannot give the pod a
    // profile), with a message that says why.
    let no_default: Vec<_> = profiles
        .iter()
        .filter(|p| !p.spec.default)
        .cloned()
        .collect();
    let target = target_for(&pod, &no_default, None, &config);
    let nodes = six_nodes(&profiles);
    let v = filter(&target, &slots(&nodes), now());
    assert!(v.passed.is_empty());
    assert!(v.failed.is_empty());
    assert_eq!(v.unresolvable.len(), 6);
    assert!(v.unresolvable["n-certified"].contains("no FabricProfile is marked default"));
}

/// The nodes of [`six_nodes`] in pools: `n-other-profile` in the A100 pool, `n-none` in
/// none, the rest in the H100 pool.
fn pooled_nodes(profiles: &[railguard_api::FabricProfile]) -> Vec<NodeFabric> {
    let mut nodes = six_nodes(profiles);
    for n in &mut nodes {
        let product = match n.name.as_str() {
            "n-other-profile" => Some("NVIDIA-A100-SXM4-80GB"),
            "n-none" => None,
            _ => Some("NVIDIA-H100-80GB-HBM3"),
        };
        n.labels.remove("nvidia.com/gpu.product");
        if let Some(p) = product {
            n.labels.insert("nvidia.com/gpu.product".into(), p.into());
        }
    }
    nodes
}

/// With the webhook down (failurePolicy Ignore), a GPU pod without RDMA and without a
/// profile is still held, on each pool's nodes, to that pool's profile; nodes of no pool
/// are not railguard's.
#[test]
fn unannotated_gpu_pods_without_rdma_are_held_to_each_pools_profile() {
    let profiles = profiles();
    let config = ExtenderConfig::default();
    let target = target_for(&facts(&gpu_pod(false)), &profiles, None, &config);
    assert!(matches!(target, PodTarget::Pools(_)), "{target:?}");
    let nodes = pooled_nodes(&profiles);
    let v = filter(&target, &slots(&nodes), now());
    let passed: Vec<&str> = v.passed.iter().map(|&i| nodes[i].name.as_str()).collect();
    // The A100 pool's node is held to a100-hdr, whose certificate it has.
    assert_eq!(passed, ["n-certified", "n-other-profile", "n-none"]);
    assert_eq!(
        v.failed["n-expired"],
        "railguard: certificate expired 2h10m ago"
    );
    assert_eq!(
        v.unresolvable["n-degraded"],
        "railguard: rail mlx5_3:1 measured 196 Gb/s, profile h100-ndr needs 360"
    );
    // A pod with no GPUs is not railguard's.
    assert!(matches!(
        target_for(&facts(&sample_pod()), &profiles, None, &config),
        PodTarget::PassThrough
    ));
    // A node in two pools cannot say which profile holds the pod.
    let mut overlapping = profiles.clone();
    overlapping[1].spec.node_selector.clear();
    let v = filter(
        &target_for(&facts(&gpu_pod(false)), &overlapping, None, &config),
        &slots(&nodes[..1]),
        now(),
    );
    assert!(
        v.unresolvable["n-certified"].contains("in the pools of several FabricProfiles"),
        "{v:?}"
    );
}

#[test]
fn unknown_profile_fails_every_node_unresolvably() {
    let profiles = profiles();
    let mut pod = facts(&sample_pod());
    pod.profile = Some("b200-xdr".into());
    let target = target_for(&pod, &profiles, None, &ExtenderConfig::default());
    let nodes = six_nodes(&profiles);
    let v = filter(&target, &slots(&nodes), now());
    // A deleted profile is the pod's problem: no node invites preemption.
    assert!(v.failed.is_empty());
    assert_eq!(v.unresolvable.len(), 6);
    assert_eq!(
        v.unresolvable["n-certified"],
        "railguard: pod asks for FabricProfile b200-xdr, which does not exist"
    );
}

#[test]
fn allow_uncertified_is_honored_only_where_the_profile_allows() {
    let profiles = profiles();
    let nodes = six_nodes(&profiles);
    let config = ExtenderConfig::default();
    let mut pod = facts(&training_pod(profile(&profiles, "h100-ndr")));
    pod.allow_uncertified = true;
    let allowed = BTreeMap::from([("railguard.io/exemptions".into(), "allowed".into())]);
    let other = BTreeMap::from([("team".into(), "ml".into())]);

    let exempt = target_for(&pod, &profiles, Some(&allowed), &config);
    // Outside the profile's pool the exemption does nothing: only the certified node.
    assert_eq!(filter(&exempt, &slots(&nodes), now()).passed, vec![0]);
    for labels in [Some(&other), None] {
        let t = target_for(&pod, &profiles, labels, &config);
        assert_eq!(filter(&t, &slots(&nodes), now()).passed, vec![0]);
    }
    // The exemption reaches the nodes of the profile's own pool, uncertified ones included,
    // and never another pool's node: a namespace exempt in one profile cannot borrow that
    // exemption to land on another profile's uncertified nodes.
    let pooled = pooled_nodes(&profiles);
    let v = filter(&exempt, &slots(&pooled), now());
    let passed: Vec<&str> = v.passed.iter().map(|&i| pooled[i].name.as_str()).collect();
    assert_eq!(
        passed,
        ["n-certified", "n-expired", "n-degraded", "n-failed"]
    );
    assert_eq!(
        v.unresolvable["n-other-profile"],
        "railguard: node is certified for profile a100-hdr, pod needs h100-ndr"
    );
    assert!(v.unresolvable["n-none"].starts_with("railguard: node has no fabric certificate"));
}

#[test]
fn a_certificate_that_expires_after_caching_is_rejected_as_expired() {
    let profiles = profiles();
    let nodes = six_nodes(&profiles);
    let h100 = profile(&profiles, "h100-ndr");
    let later = now().checked_add(SignedDuration::from_hours(24)).unwrap();
    let r = check_node(&nodes[0], h100, &h100.spec.signature(), later).unwrap_err();
    assert_eq!(r.reason, RejectReason::Expired);
    assert_eq!(&*r.message, "railguard: certificate expired 1h0m ago");
}

#[test]
fn signature_thresholds_and_missing_rails_are_checked_on_certified_nodes() {
    let profiles = profiles();
    let h100 = profile(&profiles, "h100-ndr");
    let sig = h100.spec.signature();
    let base = sample_node();
    let build = |edit: &dyn Fn(&mut railguard_api::Certificate)| {
        let mut c = synth::certificate(h100, Verdict::Certified, hours_ago(1), 392.0, 370.0);
        edit(&mut c);
        NodeFabric::from_node(&synth::node(&base, "n", Some(&c), &[]), now())
    };
    let cases: Vec<(Box<dyn Fn(&mut railguard_api::Certificate)>, RejectReason, &str)> = vec![
        (
            Box::new(|c| c.signature = "0000deadbeef".into()),
            RejectReason::OtherSignature,
            "railguard: node rail layout 0000deadbeef differs from the pod's",
        ),
        (
            Box::new(|c| c.rails[2].write_bw_host_gbps = Some(301.5)),
            RejectReason::RailBelowThreshold,
            "railguard: rail mlx5_4:1 measured 301.5 Gb/s, profile h100-ndr needs 360",
        ),
        (
            Box::new(|c| c.rails[7].write_bw_gpu_gbps = Some(200.0)),
            RejectReason::RailBelowThreshold,
            "railguard: rail mlx5_11:1 measured 200 Gb/s from GPU memory, profile h100-ndr needs 350",
        ),
        (
            Box::new(|c| {
                c.rails.remove(1);
            }),
            RejectReason::RailMissing,
            "railguard: rail mlx5_3:1 of profile h100-ndr is missing",
        ),
        (
            Box::new(|c| c.nccl.as_mut().unwrap().busbw_plateau_gbps = Some(30.0)),
            RejectReason::BusbwBelowThreshold,
            "railguard: NCCL busbw plateau 30 GB/s, profile h100-ndr needs 40",
        ),
        (
            Box::new(|c| c.rails[0].latency_us = Some(9.0)),
            RejectReason::RailBelowThreshold,
            "railguard: rail mlx5_0:1 latency 9 us, profile h100-ndr allows 5",
        ),
    ];
    for (edit, reason, prefix) in cases {
        let node = build(&*edit);
        let r = check_node(&node, h100, &sig, now()).unwrap_err();
        assert_eq!(r.reason, reason, "{}", r.message);
        assert!(r.message.starts_with(prefix), "{}", r.message);
    }
    assert!(check_node(&build(&|_| {}), h100, &sig, now()).is_ok());
}

#[test]
fn a_profile_with_nccl_pair_tests_rejects_a_scope_that_failed_with_every_peer() {
    use railguard_api::certificate::NcclPairResult;
    let profiles = profiles();
    let mut h100 = profile(&profiles, "h100-ndr").clone();
    let sig = h100.spec.signature();
    let base = sample_node();
    let pair = |peer: &str, rail: Option<&str>, ok: bool| NcclPairResult {
        peer: peer.into(),
        rail: rail.map(String::from),
        busbw_gbps: Some(if ok { 48.0 } else { 12.5 }),
        algbw_gbps: None,
        transport: None,
        gdr: None,
        wrong: Some(0),
        hcas: vec![],
        ok,
        tested_at: None,
        note: None,
    };
    let node = |pairs: &[NcclPairResult]| {
        let mut c = synth::certificate(&h100, Verdict::Certified, hours_ago(1), 392.0, 370.0);
        c.set_nccl_pairs(pairs);
        NodeFabric::from_node(&synth::node(&base, "n", Some(&c), &[]), now())
    };
    let one_bad_peer = node(&[
        pair("a", Some("mlx5_3:1"), false),
        pair("b", Some("mlx5_3:1"), true),
        pair("a", None, true),
    ]);
    let every_peer = node(&[
        pair("a", Some("mlx5_3:1"), false),
        pair("b", Some("mlx5_3:1"), false),
        pair("a", None, true),
    ]);
    // Without ncclPair in the profile the results are informational.
    assert!(check_node(&every_peer, &h100, &sig, now()).is_ok());
    h100.spec.certification.nccl_pair = Some(Default::default());
    assert!(check_node(&one_bad_peer, &h100, &sig, now()).is_ok());
    let r = check_node(&every_peer, &h100, &sig, now()).unwrap_err();
    assert_eq!(r.reason, RejectReason::BusbwBelowThreshold);
    assert_eq!(
        &*r.message,
        "railguard: NCCL pair test (mlx5_3:1) failed with every peer: a (12.5 GB/s), b (12.5 GB/s)"
    );
    assert_eq!(
        railguard_extender::decision::precheck(&every_peer, &h100, &sig).check(now()),
        Err(r)
    );
}

/// `spec.fleet.outliers: Filter` rejects a marked node that passes every threshold, with the
/// controller's message; `Score` (the default) lets it pass. A firmer reason wins, and a
/// condition that is not `True` marks nothing.
#[test]
fn fleet_outliers_fail_the_filter_only_where_the_profile_filters_them() {
    use railguard_extender::decision::precheck;
    let profiles = profiles();
    let mut h100 = profile(&profiles, "h100-ndr").clone();
    let sig = h100.spec.signature();
    let base = sample_node();
    let mark = "rail mlx5_3:1 writeBwHost 326.4 Gb/s is 15.0% below the fleet median 384.0 Gb/s (12.3 spreads)";
    let node = |gbps: f64, status: &str, message: &str| {
        let c = synth::certificate(&h100, Verdict::Certified, hours_ago(1), gbps, 370.0);
        let mut n = synth::node(&base, "n", Some(&c), &[]);
        mark_outlier(&mut n, status, message);
        NodeFabric::from_node(&n, now())
    };
    let outlier = node(392.0, "True", mark);
    let below_threshold = node(301.5, "True", mark);
    let within = node(392.0, "False", "within the fleet baseline");
    let unnamed = node(392.0, "True", "");
    assert_eq!(h100.spec.fleet.outliers, OutlierAction::Score);
    for n in [&outlier, &within, &unnamed] {
        assert_eq!(check_node(n, &h100, &sig, now()), Ok(()));
    }

    h100.spec.fleet.outliers = OutlierAction::Filter;
    let r = check_node(&outlier, &h100, &sig, now()).unwrap_err();
    assert_eq!(r.reason, RejectReason::FleetOutlier);
    assert_eq!(r.reason.as_str(), "fleet_outlier");
    assert!(!r.reason.resolvable());
    assert_eq!(&*r.message, format!("railguard: fleet outlier: {mark}"));
    // The cached verdict says the same, and expiry still comes first.
    let pre = precheck(&outlier, &h100, &sig);
    assert_eq!(pre.check(now()), Err(r));
    assert_eq!(pre.headroom_points(now()), 0);
    let later = now().checked_add(SignedDuration::from_hours(24)).unwrap();
    assert_eq!(
        check_node(&outlier, &h100, &sig, later).unwrap_err().reason,
        RejectReason::Expired
    );
    let r = check_node(&below_threshold, &h100, &sig, now()).unwrap_err();
    assert_eq!(r.reason, RejectReason::RailBelowThreshold, "{}", r.message);
    assert_eq!(check_node(&within, &h100, &sig, now()), Ok(()));
    let r = check_node(&unnamed, &h100, &sig, now()).unwrap_err();
    assert_eq!(
        &*r.message,
        "railguard: fleet outlier: node has condition RailguardFleetOutlier=True and profile h100-ndr filters fleet outliers"
    );
    // Through the filter: the outlier is unresolvable and counted under its reason.
    let pod = facts(&training_pod(&h100));
    let profiles = [h100.clone()];
    let target = target_for(&pod, &profiles, None, &ExtenderConfig::default());
    let nodes = [outlier, within];
    let v = filter(&target, &slots(&nodes), now());
    assert_eq!(v.passed, [1]);
    assert_eq!(v.reasons[&RejectReason::FleetOutlier], 1);
    assert_eq!(
        v.unresolvable["n"],
        format!("railguard: fleet outlier: {mark}")
    );
}

#[test]
fn pending_and_unreadable_nodes() {
    let profiles = profiles();
    let h100 = profile(&profiles, "h100-ndr");
    let mut pending = sample_node();
    pending
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("railguard.io/fabric".into(), "pending".into());
    let mut unreadable = sample_node();
    unreadable
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("railguard.io/certificate".into(), "{not json".into());
    let r = check_node(&NodeFabric::from_node(&pending, now()), h100, "x", now()).unwrap_err();
    assert_eq!(r.reason, RejectReason::Pending);
    assert!(r.reason.resolvable());
    let r = check_node(&NodeFabric::from_node(&unreadable, now()), h100, "x", now()).unwrap_err();
    assert_eq!(r.reason, RejectReason::Unreadable);
    assert!(!r.reason.resolvable());
    assert!(
        r.message.starts_with(
            "railguard: node fabric metadata is unreadable: annotation railguard.io/certificate"
        ),
        "{}",
        r.message
    );
}

#[test]
fn nodes_missing_from_the_cache_fail_resolvably() {
    let profiles = profiles();
    let pod = facts(&training_pod(profile(&profiles, "h100-ndr")));
    let target = target_for(&pod, &profiles, None, &ExtenderConfig::default());
    let v = filter(&target, &[NodeSlot::new("new-node", None)], now());
    assert_eq!(
        v.failed["new-node"],
        "railguard: node is not in the extender's cache yet"
    );
}

#[test]
fn prioritize_prefers_headroom_and_the_jobs_topology() {
    let profiles = profiles();
    let h100 = profile(&profiles, "h100-ndr");
    let base = sample_node();
    let cert = |gbps: f64| synth::certificate(h100, Verdict::Certified, hours_ago(1), gbps, 400.0);
    let topo = |leaf: &'static str, spine: &'static str| {
        vec![
            ("network.topology.nvidia.com/leaf", leaf),
            ("network.topology.nvidia.com/spine", spine),
            ("fabric.topograph.run/tier-1", "t1"),
        ]
    };
    let mk = |name: &str, gbps: f64, leaf: &'static str, spine: &'static str| {
        NodeFabric::from_node(
            &synth::node(&base, name, Some(&cert(gbps)), &topo(leaf, spine)),
            now(),
        )
    };
    let nodes = vec![
        mk("same-leaf-fast", 400.0, "L1", "S1"), // 11% headroom, same leaf
        mk("same-spine-slow", 367.2, "L2", "S1"), // 2% headroom, same spine
        mk("far-fast", 396.0, "L9", "S9"),       // 10% headroom, same tier-1 only
        NodeFabric::from_node(
            &synth::node(&base, "uncertified", None, &topo("L1", "S1")),
            now(),
        ),
    ];
    let peer = mk("peer", 400.0, "L1", "S1");
    let pod = facts(&training_pod(h100));
    let target = target_for(&pod, &profiles, None, &ExtenderConfig::default());
    let scores = prioritize(
        &target,
        &slots(&nodes),
        Some(&[&peer]),
        now(),
        &ExtenderConfig::default(),
    );
    assert_eq!(
        scores,
        vec![
            ("same-leaf-fast".to_string(), 10),
            ("same-spine-slow".to_string(), 1 + 4),
            ("far-fast".to_string(), 5 + 2),
            ("uncertified".to_string(), 5),
        ]
    );
    // Without peers only headroom counts; an ineligible node gets nothing.
    let alone = prioritize(
        &target,
        &slots(&nodes),
        Some(&[]),
        now(),
        &ExtenderConfig::default(),
    );
    assert_eq!(
        alone.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        [5, 1, 5, 0]
    );
}

/// A small deterministic generator (xorshift), so the equivalence test is reproducible
/// without a dependency.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    /// A bandwidth mostly above `threshold`, sometimes below (or exactly on it), rarely absent.
    fn gbps(&mut self, threshold: f64) -> Option<f64> {
        match self.below(60) {
            0 => None,
            1 => Some(threshold),
            2..=3 => Some(threshold * (0.5 + self.below(50) as f64 / 100.0)),
            _ => Some(threshold * (1.0 + self.below(20) as f64 / 100.0)),
        }
    }
}

/// A node in a random fabric state: any verdict, profile, signature, age, rail values around
/// the thresholds, missing or reordered rails, disagreeing labels, unreadable annotations.
fn random_node(g: &mut Gen, profiles: &[railguard_api::FabricProfile], i: usize) -> NodeFabric {
    let base = sample_node();
    let name = format!("gen-{i}");
    if g.chance(10) {
        return NodeFabric::from_node(&synth::node(&base, &name, None, &[]), now());
    }
    let p = &profiles[g.below(profiles.len() as u64) as usize];
    let t = &p.spec.thresholds;
    let verdict = [
        Verdict::Certified,
        Verdict::Certified,
        Verdict::Certified,
        Verdict::Degraded,
        Verdict::Failed,
        Verdict::Pending,
    ][g.below(6) as usize];
    // Issued between 30h ago and now: TTL 24h, so about a fifth are already expired.
    let issued = now()
        .checked_sub(SignedDuration::from_secs(g.below(30 * 3600) as i64))
        .unwrap();
    let mut c = synth::certificate(p, verdict, issued, 0.0, 0.0);
    for r in &mut c.rails {
        r.write_bw_host_gbps = g.gbps(t.write_bw_host_gbps);
        r.write_bw_gpu_gbps = g.gbps(t.write_bw_gpu_gbps.unwrap_or(100.0));
        r.latency_us = match g.below(40) {
            0 => None,
            1 => Some(9.5),
            _ => Some(1.0 + g.below(30) as f64 / 10.0),
        };
        if g.chance(60) {
            r.verdict = if g.chance(2) {
                RailVerdict::Degraded
            } else {
                RailVerdict::Failed
            };
            r.reasons = vec![format!("counter symbol_error grew by {}", g.below(9) + 1)];
        }
    }
    if g.chance(15) && !c.rails.is_empty() {
        let at = g.below(c.rails.len() as u64) as usize;
        c.rails.remove(at);
    }
    if g.chance(10) {
        c.rails.reverse();
    }
    c.nccl.as_mut().unwrap().busbw_plateau_gbps = g.gbps(t.busbw_plateau_gbps);
    if g.chance(10) {
        c.signature = "0000deadbeef".into();
    }
    if g.chance(6) {
        c.reasons = vec!["line one\nline two".into()];
    }
    let mut node = synth::node(&base, &name, Some(&c), &[]);
    let labels = node.metadata.labels.as_mut().unwrap();
    // Topology: a few leaves and spines (so locality matches), sometimes a label missing.
    for (key, values) in [
        ("network.topology.nvidia.com/leaf", 12),
        ("network.topology.nvidia.com/spine", 3),
        ("fabric.topograph.run/tier-1", 2),
    ] {
        if !g.chance(8) {
            labels.insert(key.into(), format!("v{}", g.below(values)));
        }
    }
    if g.chance(25) {
        labels.insert("railguard.io/fabric".into(), "certified".into());
    }
    if g.chance(25) {
        labels.remove("railguard.io/fabric");
    }
    if g.chance(30) {
        node.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("railguard.io/certificate".into(), "{\"version\": 1".into());
    }
    // Fleet marks: some outliers, some nodes the controller found within the baseline.
    match g.below(8) {
        0 => mark_outlier(
            &mut node,
            "True",
            &format!("rail mlx5_0:1 writeBwHost {i} Gb/s is 15.0% below the fleet median"),
        ),
        1 => mark_outlier(&mut node, "False", "within the fleet baseline"),
        _ => {}
    }
    NodeFabric::from_node(&node, now())
}

#[test]
fn prechecked_verdicts_equal_the_pure_filter_over_generated_nodes() {
    use railguard_extender::decision::{precheck, Precheck};
    let mut profiles = profiles();
    // Both outlier actions: every other profile filters fleet outliers.
    for p in profiles.iter_mut().step_by(2) {
        p.spec.fleet.outliers = OutlierAction::Filter;
    }
    let config = ExtenderConfig::default();
    let mut g = Gen(0x5eed_cafe_f00d_1234);
    let nodes: Vec<NodeFabric> = (0..2000)
        .map(|i| random_node(&mut g, &profiles, i))
        .collect();
    let kinds: std::collections::BTreeSet<&str> = nodes.iter().map(|n| n.state.kind()).collect();
    let outliers = nodes.iter().filter(|n| n.fleet_outlier.is_some()).count();
    assert!(
        outliers > 100,
        "the generator marks fleet outliers: {outliers}"
    );
    assert_eq!(
        kinds.len(),
        7,
        "the generator covers every fabric state: {kinds:?}"
    );
    // Filter times before and after caching, around the 24h expiry of the youngest certificates.
    let times: Vec<jiff::Timestamp> = [-3600i64, 0, 1, 6 * 3600, 25 * 3600]
        .iter()
        .map(|s| now().checked_add(SignedDuration::from_secs(*s)).unwrap())
        .collect();
    // The same nodes through the cluster cache and its node index, as `/filter` reads them.
    let cluster = ClusterState::new(config.clone());
    cluster.replace_profiles(profiles.iter().cloned());
    cluster.replace_nodes(nodes.clone());
    let set = cluster.profile_set();
    let index = cluster.node_index();
    assert!(index.is_current(cluster.nodes.version(), set.generation));
    assert_eq!(index.len(), nodes.len());
    // Candidates as the scheduler sends them: shuffled, with names the cache does not know.
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, g.below(i as u64 + 1) as usize);
    }
    let unknown = ["gen-x", "gen-", "", "gen-00", "gen-1999 "];
    let candidates: Vec<(&str, Option<&NodeFabric>)> = order
        .iter()
        .map(|&i| (nodes[i].name.as_str(), Some(&nodes[i])))
        .chain(unknown.iter().map(|u| (*u, None)))
        .collect();
    let plain_candidates: Vec<NodeSlot<'_>> = candidates
        .iter()
        .map(|(name, fabric)| NodeSlot::new(name, *fabric))
        .collect();
    let mut indexed_with_precheck = 0;

    let mut passed_somewhere = 0;
    let mut local_scores = 0;
    let mut reasons = std::collections::BTreeSet::new();
    for p in &profiles {
        for sig in [p.spec.signature(), "0000deadbeef".to_string()] {
            let pre: Vec<Precheck> = nodes.iter().map(|n| precheck(n, p, &sig)).collect();
            // The index holds exactly these prechecks for each profile's own signature.
            let at = set.index_of(p.name(), &sig);
            assert_eq!(at.is_some(), sig == p.spec.signature());
            let indexed: Vec<NodeSlot<'_>> = candidates
                .iter()
                .map(|(name, _)| index.slot(name, at))
                .collect();
            for (slot, (name, fabric)) in indexed.iter().zip(&candidates) {
                assert_eq!(slot.name, *name);
                assert_eq!(
                    slot.fabric.map(|f| &f.name),
                    fabric.map(|f| &f.name),
                    "{name}"
                );
                if let (Some(got), Some(f)) = (slot.precheck, fabric) {
                    assert_eq!(got, &precheck(f, p, &sig), "{name}");
                    indexed_with_precheck += 1;
                }
            }
            // Each node at the edges of its own expiry.
            for (n, pc) in nodes.iter().zip(&pre) {
                if let Some(c) = n.state.certificate() {
                    let before = c.expires_at.checked_sub(SignedDuration::from_nanos(1));
                    for t in [c.expires_at, before.unwrap()] {
                        assert_eq!(pc.check(t), check_node(n, p, &sig, t), "{} at {t}", n.name);
                    }
                }
            }
            for &t in &times {
                for (n, pc) in nodes.iter().zip(&pre) {
                    let want = check_node(n, p, &sig, t);
                    assert_eq!(pc.check(t), want, "node {} at {t}", n.name);
                    match &want {
                        Ok(()) => passed_somewhere += 1,
                        Err(r) => {
                            reasons.insert(r.reason);
                        }
                    }
                }
                // The whole decisions, with and without prechecks.
                let target = PodTarget::Profile {
                    profile: p,
                    signature: sig.clone(),
                    exempt: false,
                };
                let plain = slots(&nodes);
                let fast: Vec<NodeSlot<'_>> = nodes
                    .iter()
                    .zip(&pre)
                    .map(|(n, pc)| NodeSlot {
                        name: &n.name,
                        fabric: Some(n),
                        precheck: Some(pc),
                        topology: &[],
                        fleet_outlier: n.fleet_outlier.is_some(),
                    })
                    .collect();
                assert_eq!(filter(&target, &fast, t), filter(&target, &plain, t));
                let peers = [&nodes[0], &nodes[1]];
                assert_eq!(
                    prioritize(&target, &fast, Some(&peers), t, &config),
                    prioritize(&target, &plain, Some(&peers), t, &config)
                );
                // Through the node index, in scheduler order with unknown names.
                assert_eq!(
                    filter(&target, &indexed, t),
                    filter(&target, &plain_candidates, t)
                );
                // The server's form: names by input position, messages shared.
                let by_position = |slots: &[NodeSlot<'_>]| {
                    filter_by(&target, slots, t, |i| candidates[i].0, |m| m)
                };
                assert_eq!(by_position(&indexed), by_position(&plain_candidates));
                assert_eq!(
                    prioritize(&target, &indexed, Some(&peers), t, &config),
                    prioritize(&target, &plain_candidates, Some(&peers), t, &config)
                );
                // The server's scoring: topology ids the index interned, peers looked up in it.
                let peer_ids = peers
                    .iter()
                    .filter_map(|n| index.lookup(&n.name))
                    .map(|slot| index.topology(slot))
                    .collect();
                let keys = topology_keys_for(&target, &config);
                let job = JobTopology::new(keys, index.topology_keys(), peer_ids);
                let job = Some(&job);
                let by_labels: Vec<i64> =
                    prioritize(&target, &plain_candidates, Some(&peers), t, &config)
                        .into_iter()
                        .map(|(_, score)| score)
                        .collect();
                assert_eq!(prioritize_scores(&target, &indexed, job, t), by_labels);
                // Outliers are among the candidates: each scores below every other candidate.
                for ((_, fabric), score) in candidates.iter().zip(&by_labels) {
                    if fabric.is_some_and(|f| f.fleet_outlier.is_some()) {
                        assert_eq!(*score, 0);
                    } else {
                        assert!(*score >= 1);
                    }
                }
                let alone = prioritize(&target, &plain_candidates, Some(&[]), t, &config);
                local_scores += by_labels
                    .iter()
                    .zip(&alone)
                    .filter(|(with, (_, without))| *with != without)
                    .count();
            }
        }
    }
    // The comparison covered passing nodes and every reason a node's state can give.
    assert!(passed_somewhere > 100, "{passed_somewhere}");
    assert!(local_scores > 100, "locality scored: {local_scores}");
    assert_eq!(indexed_with_precheck, profiles.len() * nodes.len());
    for r in [
        RejectReason::NoCertificate,
        RejectReason::Unreadable,
        RejectReason::Pending,
        RejectReason::Failed,
        RejectReason::Degraded,
        RejectReason::Expired,
        RejectReason::OtherProfile,
        RejectReason::OtherSignature,
        RejectReason::RailMissing,
        RejectReason::RailUnhealthy,
        RejectReason::RailBelowThreshold,
        RejectReason::BusbwBelowThreshold,
        RejectReason::FleetOutlier,
    ] {
        assert!(
            reasons.contains(&r),
            "no generated node was rejected for {r:?}"
        );
    }
}

#[test]
fn cache_prechecks_follow_profile_changes() {
    use railguard_extender_cli::cache::ClusterState;
    let mut profiles = profiles();
    let cluster = ClusterState::new(ExtenderConfig::default());
    let nodes = six_nodes_at(&profiles, jiff::Timestamp::now());
    // Nodes listed before the profiles: no prechecks yet, so decisions fall back.
    cluster.replace_nodes(nodes.clone());
    let set = cluster.profile_set();
    let h100_sig = profile(&profiles, "h100-ndr").spec.signature();
    assert_eq!(set.index_of("h100-ndr", &h100_sig), None);

    let load = |profiles: &[railguard_api::FabricProfile]| {
        cluster.replace_profiles(profiles.iter().cloned());
        let set = cluster.profile_set();
        let i = set.index_of("h100-ndr", &h100_sig).unwrap();
        let cached = cluster.nodes.get("n-certified").unwrap();
        cached
            .precheck(&set, i)
            .expect("refreshed for the current profiles")
            .check(jiff::Timestamp::now())
    };
    assert_eq!(load(&profiles), Ok(()));
    // Raising the NCCL threshold above the node's 370 GB/s rejects it without a node event.
    let h100 = profiles
        .iter_mut()
        .find(|p| p.name() == "h100-ndr")
        .unwrap();
    h100.spec.thresholds.busbw_plateau_gbps = 380.0;
    let r = load(&profiles).unwrap_err();
    assert_eq!(r.reason, RejectReason::BusbwBelowThreshold);
    assert_eq!(
        &*r.message,
        "railguard: NCCL busbw plateau 370 GB/s, profile h100-ndr needs 380"
    );
    // A precheck from an older profile set is never used.
    let old_set = cluster.profile_set();
    cluster.rebuild_profile_list();
    let cached = cluster.nodes.get("n-certified").unwrap();
    assert!(cached.precheck(&old_set, 0).is_none());
}

#[test]
fn node_index_follows_node_changes_and_is_never_used_stale() {
    let profiles = profiles();
    let cluster = ClusterState::new(ExtenderConfig::default());
    cluster.replace_profiles(profiles.iter().cloned());
    let nodes = six_nodes_at(&profiles, jiff::Timestamp::now());
    cluster.replace_nodes(nodes.clone());
    let set = cluster.profile_set();
    let current = |c: &ClusterState| {
        c.node_index()
            .is_current(c.nodes.version(), c.profile_set().generation)
    };
    assert!(current(&cluster));
    assert_eq!(cluster.node_index().len(), 6);
    assert!(cluster.node_index().lookup("n-certified").is_some());
    assert!(cluster.node_index().lookup("n-added").is_none());

    // A node event makes the index stale until the refresh the watch runs after it.
    let mut watch = Applier::default();
    let mut added = nodes[0].clone();
    added.name = "n-added".into();
    watch.apply(
        &cluster.nodes,
        Change::Changed(
            "n-added".into(),
            Some(CachedNode::new(Arc::new(added), &set)),
        ),
    );
    assert!(!current(&cluster));
    cluster.refresh_prechecks();
    assert!(current(&cluster));
    let index = cluster.node_index();
    let h100 = set
        .index_of("h100-ndr", &profile(&profiles, "h100-ndr").spec.signature())
        .unwrap();
    let slot = index.slot("n-added", Some(h100));
    assert_eq!(slot.fabric.unwrap().name, "n-added");
    assert_eq!(slot.precheck.unwrap().check(jiff::Timestamp::now()), Ok(()));

    watch.apply(&cluster.nodes, Change::Changed("n-added".into(), None));
    assert!(!current(&cluster));
    cluster.refresh_prechecks();
    assert!(current(&cluster));
    assert!(cluster.node_index().lookup("n-added").is_none());
    assert_eq!(cluster.node_index().len(), 6);

    // A profile change also makes it stale, and the rebuild carries the new prechecks.
    cluster.rebuild_profile_list();
    assert!(current(&cluster));
    assert_ne!(cluster.profile_set().generation, set.generation);
    assert!(!cluster
        .node_index()
        .is_current(cluster.nodes.version(), set.generation));
}

/// Every slot of `index` holds what a node index built afresh from the same cache holds:
/// fabric, fleet mark and prechecks, and topology ids that are equal exactly where the
/// label values are (ids themselves may differ: they are kept across changes).
fn assert_index_matches_cache(index: &NodeIndex, cluster: &ClusterState, context: &str) {
    let set = cluster.profile_set();
    let nodes = cluster.nodes.read();
    assert!(
        index.is_current(cluster.nodes.version(), set.generation),
        "{context}"
    );
    assert_eq!(index.len(), nodes.len(), "{context}");
    let keys = index.topology_keys().to_vec();
    let mut id_of_value: BTreeMap<(usize, &str), u32> = BTreeMap::new();
    let mut value_of_id: BTreeMap<(usize, u32), &str> = BTreeMap::new();
    for (name, cached) in nodes.iter() {
        for p in 0..set.profiles.len() {
            let slot = index.slot(name, Some(p));
            assert!(
                slot.fabric
                    .is_some_and(|f| std::ptr::eq(f, &*cached.fabric)),
                "{context}: {name} holds the cached fabric"
            );
            assert_eq!(slot.precheck, cached.precheck(&set, p), "{context}: {name}");
            assert_eq!(
                slot.fleet_outlier,
                cached.fabric.fleet_outlier.is_some(),
                "{context}: {name}"
            );
        }
        let ids = index.slot(name, None).topology;
        assert_eq!(ids.len(), keys.len(), "{context}: {name}");
        for (k, (key, id)) in keys.iter().zip(ids).enumerate() {
            let value = cached.fabric.labels.get(key).map(String::as_str);
            assert_eq!(id.is_some(), value.is_some(), "{context}: {name} {key}");
            if let (Some(id), Some(value)) = (*id, value) {
                assert_eq!(
                    *id_of_value.entry((k, value)).or_insert(id),
                    id,
                    "{context}"
                );
                assert_eq!(
                    *value_of_id.entry((k, id)).or_insert(value),
                    value,
                    "{context}"
                );
            }
        }
    }
}

#[test]
fn node_index_replaces_a_changed_nodes_slot_and_equals_a_rebuild() {
    let profiles = profiles();
    let cluster = ClusterState::new(ExtenderConfig::default());
    cluster.replace_profiles(profiles.iter().cloned());
    let mut g = Gen(0x1dec_0de5_7a7e_0001);
    let nodes: Vec<NodeFabric> = (0..300)
        .map(|i| random_node(&mut g, &profiles, i))
        .collect();
    cluster.replace_nodes(nodes);
    let set = cluster.profile_set();
    assert_index_matches_cache(&cluster.node_index(), &cluster, "listed");
    let mut watch = Applier::default();
    let (mut replaced, mut rebuilt) = (0, 0);
    for step in 0..400 {
        let before = cluster.node_index();
        let i = g.below(320) as usize;
        let name = format!("gen-{i}");
        let value = match g.below(10) {
            // Mostly the node as generated (new certificate, verdict, topology)...
            0..=6 => Some(random_node(&mut g, &profiles, i)),
            // ...sometimes a leaf no node had before...
            7 | 8 => {
                let mut node = random_node(&mut g, &profiles, i);
                node.labels.insert(
                    "network.topology.nvidia.com/leaf".into(),
                    format!("leaf-new-{step}"),
                );
                Some(node)
            }
            // ...or the node deleted.
            _ => None,
        };
        let existed = cluster.nodes.get(&name).is_some();
        let change = value.map(|n| CachedNode::new(Arc::new(n), &set));
        let applied = watch.apply(&cluster.nodes, Change::Changed(name.clone(), change));
        cluster.node_changed(&applied);
        let after = cluster.node_index();
        let exists = cluster.nodes.get(&name).is_some();
        // Only a node that stays (existed and exists) keeps the name table.
        if existed && exists {
            assert!(
                after.shares_name_table(&before),
                "step {step}: {name} replaced"
            );
            replaced += 1;
        } else {
            assert!(
                !after.shares_name_table(&before),
                "step {step}: {name} rebuilt"
            );
            rebuilt += 1;
        }
        assert_index_matches_cache(&after, &cluster, &format!("step {step}"));
    }
    assert!(
        replaced > 200 && rebuilt > 30,
        "{replaced} replaced, {rebuilt} rebuilt"
    );

    // A profile change rebuilds, and the rebuild keeps matching the cache.
    cluster.rebuild_profile_list();
    assert_index_matches_cache(&cluster.node_index(), &cluster, "profiles changed");
}

/// A certificate made by a simulated engine and stand-in (`--sim`) certifies nothing unless
/// the profile says its nodes are simulated (`certification.acceptSimulated`); a simulated
/// certificate whose node lacks the `railguard.io/simulated` label is unreadable.
#[test]
fn simulated_certificates_count_only_where_the_profile_accepts_them() {
    use railguard_api::keys;
    use railguard_extender::decision::precheck;
    let profiles = profiles();
    let mut h100 = profile(&profiles, "h100-ndr").clone();
    assert!(
        !h100.spec.certification.accept_simulated,
        "the shipped profile refuses simulation"
    );
    let sig = h100.spec.signature();
    let base = sample_node();
    let mut cert = synth::certificate(&h100, Verdict::Certified, hours_ago(1), 392.0, 370.0);
    cert.simulated = true;
    let node = synth::node(&base, "n-sim", Some(&cert), &[]);
    assert_eq!(
        node.metadata.labels.as_ref().unwrap()[keys::LABEL_SIMULATED],
        "true"
    );
    let simulated = NodeFabric::from_node(&node, now());

    let r = check_node(&simulated, &h100, &sig, now()).unwrap_err();
    assert_eq!(r.reason, RejectReason::Simulated);
    assert_eq!(r.reason.as_str(), "simulated");
    assert!(!r.reason.resolvable());
    assert!(
        r.message.contains("simulated engine") && r.message.contains("acceptSimulated"),
        "{}",
        r.message
    );
    assert_eq!(precheck(&simulated, &h100, &sig).check(now()), Err(r));
    let pod = facts(&training_pod(&h100));
    let target = target_for(
        &pod,
        std::slice::from_ref(&h100),
        None,
        &ExtenderConfig::default(),
    );
    let v = filter(&target, &slots(std::slice::from_ref(&simulated)), now());
    assert!(v.passed.is_empty());
    assert_eq!(v.reasons[&RejectReason::Simulated], 1);

    h100.spec.certification.accept_simulated = true;
    assert_eq!(check_node(&simulated, &h100, &sig, now()), Ok(()));
    assert!(precheck(&simulated, &h100, &sig).check(now()).is_ok());

    // The label is what a node affinity sees: without it the certificate is not trusted.
    let mut unlabelled = node.clone();
    unlabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(keys::LABEL_SIMULATED);
    let r = check_node(
        &NodeFabric::from_node(&unlabelled, now()),
        &h100,
        &sig,
        now(),
    )
    .unwrap_err();
    assert_eq!(r.reason, RejectReason::Unreadable);
    assert!(
        r.message.contains("railguard.io/simulated"),
        "{}",
        r.message
    );
    // A measured certificate with the label is just as suspect.
    let measured = synth::certificate(&h100, Verdict::Certified, hours_ago(1), 392.0, 370.0);
    let relabelled = synth::node(
        &base,
        "n",
        Some(&measured),
        &[(keys::LABEL_SIMULATED, "true")],
    );
    let r = check_node(
        &NodeFabric::from_node(&relabelled, now()),
        &h100,
        &sig,
        now(),
    )
    .unwrap_err();
    assert_eq!(r.reason, RejectReason::Unreadable, "{}", r.message);
}
