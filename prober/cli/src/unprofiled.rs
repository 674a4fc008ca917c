//! GPU nodes that no FabricProfile selects ("unprofiled"): railguard certifies nothing there,
//! and nothing says so unless it is reported.
//!
//! - The daemon, when its node matches no profile (reason `NoProfile`) and is a GPU node,
//!   posts one Warning Event `Unprofiled` on it per process (not per poll) and sets
//!   `railguard_prober_unprofiled` to 1 (0 once a profile is usable).
//! - `railguard-prober fleet` lists such nodes under `unprofiled` (the table's last section,
//!   the `--json` key): in a chart install each prober DaemonSet runs only where its profile's
//!   nodeSelector matches, so a GPU node outside every profile has no prober to report it and
//!   the fleet view is where it shows.
//!
//! The decisions are pure ([`is_gpu_node`], [`unprofiled_gpu_nodes`], [`unprofiled_event`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use railguard_api::node::NodeEvent;
use railguard_api::{keys, FabricProfile};

/// The Event reason (Warning) on a GPU node no profile matches.
pub const REASON_UNPROFILED: &str = "Unprofiled";
/// GPU Feature Discovery's label on nodes with an NVIDIA GPU.
pub const GPU_PRESENT_LABEL: &str = "nvidia.com/gpu.present";
/// The device plugin's GPU resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// A GPU node: labelled `nvidia.com/gpu.present=true`, or with a non-zero allocatable
/// `nvidia.com/gpu`.
pub fn is_gpu_node(node: &Node) -> bool {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(GPU_PRESENT_LABEL))
        .is_some_and(|v| v == "true");
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(GPU_RESOURCE))
        .is_some_and(|q| q.0.chars().any(|c| c.is_ascii_digit() && c != '0'));
    labelled || allocatable
}

/// Whether `selector` (a nodeSelector: every key with its value) selects `labels`. An empty
/// selector selects every node, as a DaemonSet's does.
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The profile `node` belongs to among `profiles`: the first whose nodeSelector selects it,
/// else the one its `railguard.io/profile` label names (a prober started without
/// `--profile` chose it by rail layout or as the default).
pub fn profile_for<'a>(node: &Node, profiles: &'a [FabricProfile]) -> Option<&'a str> {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    profiles
        .iter()
        .find(|p| selects(&p.spec.node_selector, labels))
        .or_else(|| {
            let named = labels.get(keys::LABEL_PROFILE)?;
            profiles.iter().find(|p| p.name() == named)
        })
        .map(FabricProfile::name)
}

/// The GPU nodes among `nodes` that belong to none of `profiles`, by name.
pub fn unprofiled_gpu_nodes(nodes: &[Node], profiles: &[FabricProfile]) -> Vec<String> {
    let mut out: Vec<String> = nodes
        .iter()
        .filter(|n| is_gpu_node(n) && profile_for(n, profiles).is_none())
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    out.sort();
    out
}

/// The Event for the daemon's node when it is a GPU node and no profile matches it
/// (`reason` is the unusable profile's condition reason; only `NoProfile` counts: an invalid
/// profile or a refused binary is a profile that does match). `None`: not that case.
pub fn unprofiled_event(reason: &str, node: &Node, cause: &str) -> Option<NodeEvent> {
    if reason != crate::profile_source::REASON_NO_PROFILE || !is_gpu_node(node) {
        return None;
    }
    Some(NodeEvent {
        reason: REASON_UNPROFILED,
        kind: "Warning",
        message: format!(
            "GPU node matches no FabricProfile ({cause}); railguard certifies nothing here: \
             enable or create a profile whose nodeSelector selects it"
        ),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node(name: &str, labels: &[(&str, &str)], gpus: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        if let Some(q) = gpus {
            n.status = Some(NodeStatus {
                allocatable: Some(BTreeMap::from([(
                    GPU_RESOURCE.to_string(),
                    Quantity(q.into()),
                )])),
                ..NodeStatus::default()
            });
        }
        n
    }

    fn profiles() -> Vec<FabricProfile> {
        [
            include_str!("../../../api/fixtures/profiles/dgx-h100-ndr.yaml"),
            include_str!("../../../api/fixtures/profiles/dgx-h200-ndr.yaml"),
        ]
        .iter()
        .map(|t| railguard_api::profiles_from_yaml(t).unwrap().remove(0))
        .collect()
    }

    const PRODUCT: &str = "nvidia.com/gpu.product";

    #[test]
    fn a_gpu_node_is_labelled_by_gfd_or_has_allocatable_gpus() {
        assert!(is_gpu_node(&node(
            "a",
            &[(GPU_PRESENT_LABEL, "true")],
            None
        )));
        assert!(is_gpu_node(&node("b", &[], Some("8"))));
        assert!(!is_gpu_node(&node(
            "c",
            &[(GPU_PRESENT_LABEL, "false")],
            None
        )));
        assert!(!is_gpu_node(&node("d", &[], Some("0"))));
        assert!(!is_gpu_node(&node("e", &[], None)));
    }

    #[test]
    fn gpu_nodes_outside_every_profile_are_listed_by_name() {
        let nodes = [
            // Selected by h100-ndr and h200-ndr's nodeSelectors.
            node("h100", &[(PRODUCT, "NVIDIA-H100-80GB-HBM3")], Some("8")),
            node("h200", &[(PRODUCT, "NVIDIA-H200")], Some("8")),
            // GPU nodes no profile selects (with a different product, or none).
            node(
                "l40s-b",
                &[(GPU_PRESENT_LABEL, "true"), (PRODUCT, "NVIDIA-L40S")],
                None,
            ),
            node("b200", &[(PRODUCT, "NVIDIA-B200")], Some("8")),
            // A prober without --profile labelled it with an existing profile: profiled.
            node("chosen", &[(keys::LABEL_PROFILE, "h100-ndr")], Some("8")),
            // Labelled with a profile that is gone: unprofiled.
            node("stale", &[(keys::LABEL_PROFILE, "gone")], Some("4")),
            // Not a GPU node: never listed.
            node("cpu", &[], None),
        ];
        assert_eq!(
            unprofiled_gpu_nodes(&nodes, &profiles()),
            ["b200", "l40s-b", "stale"]
        );
        // No profile at all: every GPU node.
        assert_eq!(unprofiled_gpu_nodes(&nodes, &[]).len(), 6);
        // An empty nodeSelector selects every node.
        let mut any = profiles().remove(0);
        any.spec.node_selector.clear();
        assert!(unprofiled_gpu_nodes(&nodes, &[any]).is_empty());
    }

    #[test]
    fn only_a_gpu_node_without_a_matching_profile_gets_the_event() {
        let gpu = node("g", &[(GPU_PRESENT_LABEL, "true")], None);
        let ev = unprofiled_event("NoProfile", &gpu, "no FabricProfile matches").unwrap();
        assert_eq!((ev.reason, ev.kind), ("Unprofiled", "Warning"));
        assert!(
            ev.message.contains("no FabricProfile matches"),
            "{}",
            ev.message
        );
        assert!(unprofiled_event("NoProfile", &node("c", &[], None), "x").is_none());
        assert!(unprofiled_event("InvalidProfile", &gpu, "x").is_none());
        assert!(unprofiled_event("NcclBinaryNotAllowed", &gpu, "x").is_none());
    }
}
