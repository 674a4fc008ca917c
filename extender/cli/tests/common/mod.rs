//! Shared test material: the recorded kube-scheduler 1.20 requests and the example profiles.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod serving;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, Pod};
use railguard_api::fleet::reason;
use railguard_api::{FabricProfile, NodeFabric, Verdict};
use railguard_sim::certificates as synth;

pub const ARGS_FULL: &str = include_str!("../../../fixtures/extender-args-sample.json");
pub const ARGS_NAMES: &str = include_str!("../../../fixtures/extender-args-nodecache-sample.json");
pub const PRIORITIZE_NAMES: &str =
    include_str!("../../../fixtures/extender-prioritize-nodecache-sample.json");

pub fn profiles() -> Vec<FabricProfile> {
    let mut out = Vec::new();
    for text in [
        include_str!("../../../../api/fixtures/profiles/dgx-h100-ndr.yaml"),
        include_str!("../../../../api/fixtures/profiles/dgx-a100-hdr.yaml"),
        include_str!("../../../../api/fixtures/profiles/roce-cloud.yaml"),
    ] {
        out.extend(railguard_api::profiles_from_yaml(text).unwrap());
    }
    out
}

pub fn profile<'a>(profiles: &'a [FabricProfile], name: &str) -> &'a FabricProfile {
    profiles.iter().find(|p| p.name() == name).unwrap()
}

/// A real Node as kube-scheduler 1.20 sent it.
pub fn sample_node() -> Node {
    let v: serde_json::Value = serde_json::from_str(ARGS_FULL).unwrap();
    serde_json::from_value(v["Nodes"]["items"][0].clone()).unwrap()
}

/// The recorded pod (no railguard annotations, no GPUs).
pub fn sample_pod() -> Pod {
    let v: serde_json::Value = serde_json::from_str(ARGS_FULL).unwrap();
    serde_json::from_value(v["Pod"].clone()).unwrap()
}

/// The recorded pod as the webhook would leave it for `profile`.
pub fn training_pod(profile: &FabricProfile) -> Pod {
    let mut pod = sample_pod();
    let ann = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    ann.insert("railguard.io/profile".into(), profile.name().into());
    ann.insert("railguard.io/signature".into(), profile.spec.signature());
    pod
}

/// Sets `node`'s `RailguardFleetOutlier` condition, as the fleet controller writes it.
pub fn mark_outlier(node: &mut Node, status: &str, message: &str) {
    let conditions = node
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != railguard_api::keys::CONDITION_FLEET_OUTLIER);
    conditions.push(k8s_openapi::api::core::v1::NodeCondition {
        type_: railguard_api::keys::CONDITION_FLEET_OUTLIER.into(),
        status: status.into(),
        reason: Some(
            match status {
                "True" => reason::OUTLIER,
                _ => reason::WITHIN_BASELINE,
            }
            .into(),
        ),
        message: Some(message.into()),
        ..Default::default()
    });
}

pub fn now() -> Timestamp {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

pub fn hours_ago(h: i64) -> Timestamp {
    now().checked_sub(SignedDuration::from_hours(h)).unwrap()
}

/// The six kinds of node the issue names, built on the recorded Node, interpreted at `now()`.
pub fn six_nodes(profiles: &[FabricProfile]) -> Vec<NodeFabric> {
    six_nodes_at(profiles, now())
}

/// The six nodes with certificates dated relative to `at`, interpreted at `at`.
pub fn six_nodes_at(profiles: &[FabricProfile], at: Timestamp) -> Vec<NodeFabric> {
    six_node_objects(profiles, at)
        .iter()
        .map(|n| NodeFabric::from_node(n, at))
        .collect()
}

/// The six Node objects, certificates dated relative to `at`.
pub fn six_node_objects(profiles: &[FabricProfile], at: Timestamp) -> Vec<Node> {
    let hours_ago = |h: i64| at.checked_sub(SignedDuration::from_hours(h)).unwrap();
    let h100 = profile(profiles, "h100-ndr");
    let a100 = profile(profiles, "a100-hdr");
    let base = sample_node();
    let good = synth::certificate(h100, Verdict::Certified, hours_ago(1), 392.0, 370.0);
    let other = synth::certificate(a100, Verdict::Certified, hours_ago(1), 195.0, 190.0);
    // TTL is 24h: issued 26h10m ago means expired 2h10m ago.
    let expired = synth::certificate(
        h100,
        Verdict::Certified,
        at.checked_sub(SignedDuration::from_secs(26 * 3600 + 600))
            .unwrap(),
        392.0,
        370.0,
    );
    let mut degraded = good.clone();
    synth::degrade_rail(&mut degraded, "mlx5_3", 1, 196.0);
    let mut failed = synth::certificate(h100, Verdict::Failed, hours_ago(1), 392.0, 120.0);
    failed.reasons = vec!["NCCL fell back to Socket transport".into()];
    vec![
        synth::node(&base, "n-certified", Some(&good), &[]),
        synth::node(&base, "n-other-profile", Some(&other), &[]),
        synth::node(&base, "n-expired", Some(&expired), &[]),
        synth::node(&base, "n-degraded", Some(&degraded), &[]),
        synth::node(&base, "n-failed", Some(&failed), &[]),
        synth::node(&base, "n-none", None, &[]),
    ]
}
