//! What a run knows of its Node, read once.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use railguard_api::{keys, Certificate};

use crate::certify::ResourceExposure;

/// The fabric condition as last seen (or last written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionSeen {
    /// `True` or `False`.
    pub status: String,
    pub last_transition: Option<Timestamp>,
}

/// A snapshot of the Node: what a certification run reads from it, taken with one GET
/// ([`super::NodePublisher::read_state`]) and kept current by the publisher's writes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeState {
    /// The certificate on the Node; an unreadable one counts as absent (the next publish
    /// replaces it).
    pub certificate: Option<Certificate>,
    /// `status.allocatable`, resource name to quantity.
    pub allocatable: BTreeMap<String, String>,
    /// `RailguardFabricReady`.
    pub condition: Option<ConditionSeen>,
    /// The Node's uid (Events refer to it).
    pub uid: Option<String>,
    /// `railguard.io/recertify` is set (non-empty).
    pub recertify_requested: bool,
    /// The `railguard.io/fabric` label.
    pub fabric_label: Option<String>,
    /// Why no invasive test may start here now ([`unavailable_for_tests`]).
    pub unavailable_for_tests: Option<String>,
    /// The Node carries railguard's `testing` taint: an invasive run is under way, or one
    /// was left by a prober killed mid-run.
    pub run_tainted: bool,
    /// The Node's taints as `key`, `key=value` and their effect, for holds named in a value
    /// ([`held_by_named_taint`]).
    pub taints: Vec<(String, Option<String>, String)>,
}

impl NodeState {
    /// Pure: the snapshot of a Node object.
    pub fn of(node: &Node) -> Self {
        let annotations = node.metadata.annotations.as_ref();
        let certificate = Certificate::of_annotations(annotations)
            .and_then(|parsed| match parsed {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "existing certificate annotation is unreadable; replacing it");
                    None
                }
            });
        let status = node.status.as_ref();
        let allocatable = status
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| a.iter().map(|(k, q)| (k.clone(), q.0.clone())).collect())
            .unwrap_or_default();
        let condition = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == keys::CONDITION_FABRIC_READY))
            .map(|c| ConditionSeen {
                status: c.status.clone(),
                last_transition: c.last_transition_time.as_ref().map(|t| t.0),
            });
        NodeState {
            certificate,
            allocatable,
            condition,
            uid: node.metadata.uid.clone(),
            recertify_requested: annotations
                .and_then(|a| a.get(keys::ANNOTATION_RECERTIFY))
                .is_some_and(|v| !v.trim().is_empty()),
            fabric_label: fabric_label_of(node),
            unavailable_for_tests: unavailable_for_tests(node),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
                .collect(),
            run_tainted: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| {
                    t.iter().any(|t| {
                        t.key == keys::TAINT_FABRIC_UNHEALTHY
                            && t.value.as_deref() == Some(keys::taint_reason::TESTING)
                    })
                }),
        }
    }

    /// How the Node advertises `resource` (the profile's RDMA resource).
    pub fn exposure(&self, resource: &str) -> ResourceExposure {
        ResourceExposure {
            resource: resource.to_string(),
            allocatable: self.allocatable.get(resource).cloned(),
        }
    }
}

/// Karpenter's taint on a node it is disrupting (consolidation, drift, expiry): the node is
/// about to be drained and deleted (karpenter `pkg/apis/v1/taints.go`, `DisruptedTaintKey`).
pub const TAINT_KARPENTER_DISRUPTED: &str = "karpenter.sh/disrupted";

/// Pure: why `node` is out of service for invasive tests, if it is: cordoned (which a
/// drain starts with: `kubectl drain` cordons, then evicts), in a maintenance window (the
/// label `railguard.io/maintenance`, any value but `false`, set by whoever plans the window),
/// held by another quarantine: a `NoExecute` taint (the node lifecycle controller's
/// `not-ready`/`unreachable`, a GPU health checker's), or Karpenter disrupting it.
pub fn unavailable_for_tests(node: &Node) -> Option<String> {
    let spec = node.spec.as_ref();
    let taints = spec.and_then(|s| s.taints.as_deref()).unwrap_or_default();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false)
        || taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unschedulable");
    if cordoned {
        return Some("cordoned (spec.unschedulable; a drain starts so)".to_string());
    }
    if let Some(t) = taints.iter().find(|t| t.key == TAINT_KARPENTER_DISRUPTED) {
        return Some(format!("being disrupted by Karpenter (taint {})", t.key));
    }
    if let Some(t) = taints.iter().find(|t| t.effect == "NoExecute") {
        return Some(format!(
            "held by a NoExecute taint ({}{}:NoExecute)",
            t.key,
            t.value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default()
        ));
    }
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::LABEL_MAINTENANCE))
        .filter(|v| v.trim() != "false")
        .map(|v| {
            format!(
                "in a maintenance window (label {}={v})",
                keys::LABEL_MAINTENANCE
            )
        })
}

/// Pure: the first of `taints` (key, value, effect) that a hold of `holds` names: a key
/// (`nvidia.com/gpu-health`), a key and value (`example.com/quarantine=true`), either with
/// `*` for any characters (`*.example.com/*`). Such a taint holds invasive runs and campaign
/// tests like the built-in holds of [`unavailable_for_tests`] (`--hold-taints`, the chart's
/// `prober.holdTaints`): a health checker's NoSchedule quarantine, a team's own marker.
pub fn held_by_named_taint(
    taints: &[(String, Option<String>, String)],
    holds: &[String],
) -> Option<String> {
    taints.iter().find_map(|(key, value, effect)| {
        let hold = holds
            .iter()
            .map(|h| h.trim())
            .filter(|h| !h.is_empty())
            .find(|h| match h.split_once('=') {
                Some((k, v)) => {
                    railguard_api::pod::resource_matches(k, key)
                        && value
                            .as_deref()
                            .is_some_and(|val| railguard_api::pod::resource_matches(v, val))
                }
                None => railguard_api::pod::resource_matches(h, key),
            })?;
        Some(format!(
            "held by the taint {key}{}:{effect} (--hold-taints {hold})",
            value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default()
        ))
    })
}

/// The Node's `railguard.io/fabric` label.
pub fn fabric_label_of(node: &Node) -> Option<String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::LABEL_FABRIC))
        .cloned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_taint_named_in_the_holds_keeps_tests_off() {
        let taints = vec![
            (
                "nvidia.com/gpu-health".to_string(),
                Some("xid-79".to_string()),
                "NoSchedule".to_string(),
            ),
            (
                "team.example.com/quarantine".to_string(),
                Some("true".to_string()),
                "NoSchedule".to_string(),
            ),
        ];
        let held = |holds: &[&str]| {
            held_by_named_taint(
                &taints,
                &holds.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(held(&[]), None);
        assert_eq!(held(&["other.io/x", " "]), None);
        let why = held(&["nvidia.com/gpu-health"]).unwrap();
        assert!(
            why.contains("nvidia.com/gpu-health=xid-79:NoSchedule"),
            "{why}"
        );
        assert!(held(&["*.example.com/quarantine=true"]).is_some());
        assert!(held(&["team.example.com/quarantine=false"]).is_none());
        assert!(held(&["nvidia.com/gpu-health=xid-*"]).is_some());
    }

    #[test]
    fn no_execute_taints_and_karpenter_disruption_hold_invasive_tests() {
        let with = |taints: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n"}, "spec": {"taints": taints}
            }))
            .unwrap()
        };
        let held = unavailable_for_tests(&with(serde_json::json!([
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
        ])))
        .unwrap();
        assert!(
            held.contains("node.kubernetes.io/unreachable:NoExecute"),
            "{held}"
        );
        let held = unavailable_for_tests(&with(serde_json::json!([
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
        ])))
        .unwrap();
        assert!(held.contains("Karpenter"), "{held}");
        // NoSchedule taints of others, and railguard's own, hold nothing.
        let free = with(serde_json::json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": keys::TAINT_FABRIC_UNHEALTHY, "value": "testing", "effect": "NoSchedule"}
        ]));
        assert_eq!(unavailable_for_tests(&free), None);
        assert!(NodeState::of(&free).run_tainted);
        assert!(!NodeState::of(&with(serde_json::json!([]))).run_tainted);
    }

    #[test]
    fn the_snapshot_reads_certificate_resource_condition_and_recertify() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "uid": "u-1", "annotations": {
                keys::ANNOTATION_CERTIFICATE: "not json",
                keys::ANNOTATION_RECERTIFY: "now",
            }},
            "status": {
                "allocatable": {"rdma/ib": "8"},
                "conditions": [{"type": keys::CONDITION_FABRIC_READY, "status": "True",
                    "lastTransitionTime": "2024-01-01T00:00:00Z"}],
            }
        }))
        .unwrap();
        let s = NodeState::of(&node);
        assert_eq!(s.certificate, None);
        assert!(s.recertify_requested);
        assert_eq!(s.uid.as_deref(), Some("u-1"));
        assert_eq!(s.exposure("rdma/ib").allocatable.as_deref(), Some("8"));
        assert_eq!(s.exposure("rdma/x").allocatable, None);
        let c = s.condition.unwrap();
        assert_eq!(c.status, "True");
        assert!(c.last_transition.is_some());
        assert!(!NodeState::of(&Node::default()).recertify_requested);
    }

    #[test]
    fn cordoned_draining_and_maintenance_nodes_are_out_of_service_for_tests() {
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        assert_eq!(unavailable_for_tests(&Node::default()), None);
        let cordoned = node(serde_json::json!({"spec": {"unschedulable": true}}));
        assert!(unavailable_for_tests(&cordoned)
            .unwrap()
            .contains("cordoned"));
        // The taint the node lifecycle controller mirrors a cordon with.
        let tainted = node(serde_json::json!({"spec": {"taints": [
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}));
        assert!(unavailable_for_tests(&tainted)
            .unwrap()
            .contains("cordoned"));
        let window = node(serde_json::json!({"metadata": {"labels": {
            keys::LABEL_MAINTENANCE: "2026-12-05T02:00Z"}}}));
        assert_eq!(
            unavailable_for_tests(&window).as_deref(),
            Some("in a maintenance window (label railguard.io/maintenance=2026-12-05T02:00Z)")
        );
        let over = node(serde_json::json!({"metadata": {"labels": {
            keys::LABEL_MAINTENANCE: "false"}}}));
        assert_eq!(unavailable_for_tests(&over), None);
        assert_eq!(
            NodeState::of(&cordoned).unavailable_for_tests,
            unavailable_for_tests(&cordoned)
        );
    }
}
