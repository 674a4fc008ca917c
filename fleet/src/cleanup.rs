//! What `helm uninstall` takes off a Node (the chart's post-delete hook,
//! `railguard-prober cleanup`): pure plans over a Node, written by the shell.
//!
//! Always: railguard's taint (`railguard.io/fabric-unhealthy`, any reason), which would
//! otherwise keep every scheduler off the node with nothing left to lift it. Unless the
//! operator keeps them: the labels railguard wrote (`railguard.io/fabric`, `profile`,
//! `signature`, `simulated`) and its conditions (`RailguardFabricReady`,
//! `RailguardFleetOutlier`). The certificate annotation stays either way: it is the
//! evidence and history of the node's runs, inert without railguard (no scheduler reads
//! annotations), and a reinstall's probers take it up instead of retesting the fleet.

use k8s_openapi::api::core::v1::Node;
use railguard_api::keys;
use serde_json::{json, Map, Value};

/// The labels railguard writes on Nodes.
pub const NODE_LABELS: [&str; 4] = [
    keys::LABEL_FABRIC,
    keys::LABEL_PROFILE,
    keys::LABEL_SIGNATURE,
    keys::LABEL_SIMULATED,
];

/// The Node conditions railguard writes.
pub const NODE_CONDITIONS: [&str; 2] =
    [keys::CONDITION_FABRIC_READY, keys::CONDITION_FLEET_OUTLIER];

/// The writes that clean one Node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeCleanup {
    /// A JSON merge patch of the taints (the whole list less railguard's, with the Node's
    /// resourceVersion: another controller's taint written meanwhile is never lost) and the
    /// labels (each set to null).
    pub node: Option<Value>,
    /// A strategic merge patch of `status.conditions` deleting railguard's by type.
    pub status: Option<Value>,
}

impl NodeCleanup {
    pub fn is_empty(&self) -> bool {
        self.node.is_none() && self.status.is_none()
    }
}

/// Pure: what to write to clean `node`; `keep_state` keeps the labels and conditions.
pub fn node_cleanup(node: &Node, keep_state: bool) -> NodeCleanup {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let ours = taints.iter().any(|t| t.key == keys::TAINT_FABRIC_UNHEALTHY);
    let labels: Vec<&str> = if keep_state {
        Vec::new()
    } else {
        let present = node.metadata.labels.as_ref();
        NODE_LABELS
            .iter()
            .copied()
            .filter(|k| present.is_some_and(|l| l.contains_key(*k)))
            .collect()
    };
    let node_patch = (ours || !labels.is_empty()).then(|| {
        let mut metadata = json!({ "resourceVersion": node.metadata.resource_version });
        if !labels.is_empty() {
            let nulls: Map<String, Value> = labels
                .iter()
                .map(|k| (k.to_string(), Value::Null))
                .collect();
            metadata["labels"] = Value::Object(nulls);
        }
        let mut patch = json!({ "metadata": metadata });
        if ours {
            let others: Vec<&k8s_openapi::api::core::v1::Taint> = taints
                .iter()
                .filter(|t| t.key != keys::TAINT_FABRIC_UNHEALTHY)
                .collect();
            patch["spec"] = json!({
                "taints": if others.is_empty() { Value::Null } else { json!(others) }
            });
        }
        patch
    });
    let conditions: Vec<Value> = if keep_state {
        Vec::new()
    } else {
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|c| NODE_CONDITIONS.contains(&c.type_.as_str()))
            .map(|c| json!({ "type": c.type_, "$patch": "delete" }))
            .collect()
    };
    let status =
        (!conditions.is_empty()).then(|| json!({ "status": { "conditions": conditions } }));
    NodeCleanup {
        node: node_patch,
        status,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(v: Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn tended() -> Node {
        node(json!({
            "metadata": {"name": "gpu-a", "resourceVersion": "42",
                "labels": {"railguard.io/fabric": "failed", "railguard.io/profile": "h100-ndr",
                           "railguard.io/signature": "abc", "kubernetes.io/hostname": "gpu-a"},
                "annotations": {"railguard.io/certificate": "{}"}},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "railguard.io/fabric-unhealthy", "value": "failed", "effect": "NoSchedule"}
            ]},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "RailguardFabricReady", "status": "False"},
                {"type": "RailguardFleetOutlier", "status": "False"}
            ]}
        }))
    }

    #[test]
    fn uninstall_takes_railguards_taint_labels_and_conditions_and_nothing_else() {
        let c = node_cleanup(&tended(), false);
        let n = c.node.unwrap();
        assert_eq!(n["metadata"]["resourceVersion"], "42");
        assert_eq!(
            n["metadata"]["labels"],
            json!({"railguard.io/fabric": null, "railguard.io/profile": null,
                   "railguard.io/signature": null})
        );
        assert!(
            n["metadata"].get("annotations").is_none(),
            "the certificate stays"
        );
        assert_eq!(
            n["spec"]["taints"],
            json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
        );
        assert_eq!(
            c.status.unwrap(),
            json!({"status": {"conditions": [
                {"type": "RailguardFabricReady", "$patch": "delete"},
                {"type": "RailguardFleetOutlier", "$patch": "delete"}
            ]}})
        );
    }

    #[test]
    fn kept_state_still_loses_the_taint_and_a_clean_node_needs_no_write() {
        let c = node_cleanup(&tended(), true);
        let n = c.node.unwrap();
        assert!(n["metadata"].get("labels").is_none());
        assert_eq!(n["spec"]["taints"].as_array().unwrap().len(), 1);
        assert_eq!(c.status, None);
        // The taint alone: the list goes with it.
        let only = node(json!({"metadata": {"name": "n", "resourceVersion": "1"},
            "spec": {"taints": [{"key": "railguard.io/fabric-unhealthy", "value": "testing",
                                  "effect": "NoSchedule"}]}}));
        assert_eq!(
            node_cleanup(&only, true).node.unwrap()["spec"]["taints"],
            Value::Null
        );
        let clean = node(json!({"metadata": {"name": "n", "labels": {"a": "b"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
        assert!(node_cleanup(&clean, false).is_empty());
    }
}
