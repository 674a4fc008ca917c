//! Test fixtures shared by the whole-pipeline tests and each step's own tests: the profiles
//! of `api/fixtures`, pods from JSON, a context as the gates would open it, and applying a
//! plan's operations with a real JSON-patch implementation.

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use railguard_api::FabricProfile;

use super::{gates, Ctx, Draft};
use crate::config::{NamespaceInfo, WebhookConfig};
use crate::patch::PatchOp;

pub(crate) const H100: &str = include_str!("../../../api/fixtures/profiles/dgx-h100-ndr.yaml");
pub(crate) const A100: &str = include_str!("../../../api/fixtures/profiles/dgx-a100-hdr.yaml");
pub(crate) const ROCE: &str = include_str!("../../../api/fixtures/profiles/roce-cloud.yaml");

pub(crate) fn profile(yaml: &str) -> FabricProfile {
    let mut v = railguard_api::profiles_from_yaml(yaml).unwrap();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

pub(crate) fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

/// A pod of `containers` (JSON) in namespace `ml`.
pub(crate) fn pod_of(containers: serde_json::Value) -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": containers}
    }))
}

/// What a step's test opens a context with: `profiles`, namespace `ml` without labels and
/// the default configuration.
pub(crate) fn in_ml(
    profiles: Vec<FabricProfile>,
) -> (Vec<FabricProfile>, NamespaceInfo, WebhookConfig) {
    (profiles, NamespaceInfo::new("ml"), WebhookConfig::default())
}

/// The context the gates open for `pod` with `profile` in `namespace`, and an empty draft.
pub(crate) fn open<'a>(
    pod: &'a Pod,
    namespace: &'a NamespaceInfo,
    profile: &'a [FabricProfile],
    config: &'a WebhookConfig,
) -> (Ctx<'a>, Draft) {
    let spec = pod.spec.as_ref().unwrap();
    match gates::open(pod, spec, namespace, profile, config) {
        gates::Gate::Open(ctx, plan) => {
            let draft = Draft::new(&ctx, plan);
            (ctx, draft)
        }
        gates::Gate::Closed(plan) => panic!("the gates closed: {plan:?}"),
    }
}

/// Applies `ops` to the pod; the result must still be a Pod.
pub(crate) fn apply_ops(pod: &Pod, ops: &[PatchOp]) -> Pod {
    let mut doc = serde_json::to_value(pod).unwrap();
    json_patch::patch(&mut doc, &crate::patch::to_patch(ops.to_vec())).unwrap();
    serde_json::from_value(doc).unwrap()
}
