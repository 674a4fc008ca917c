//! The kube-scheduler extender v1 wire format (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go types carry no JSON tags, so the keys are the Go field names: `Pod`, `Nodes`,
//! `NodeNames`, `FailedNodes`, `FailedAndUnresolvableNodes`, `Error`, `Host`, `Score`.
//! Go's decoder matches keys case-insensitively; lower-case aliases are accepted for
//! schedulers that tag them. Nodes stay raw JSON so a full-Node answer echoes the
//! scheduler's own bytes (no loss of fields this crate's Node type does not know).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::ExtenderError;

/// Highest score an extender may return (`MaxExtenderPriority`).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// `ExtenderArgs` as received, borrowing from the request body. Use [`ExtenderArgs::decode`]
/// to validate.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct ExtenderArgs<'a> {
    #[serde(rename = "Pod", alias = "pod", default, borrow)]
    pub pod: Option<&'a RawValue>,
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        alias = "nodeNames",
        default,
        borrow
    )]
    pub node_names: Option<Vec<NodeName<'a>>>,
}

/// A node name, borrowed from the request body unless JSON escapes forced a copy (never for
/// a valid name: they are DNS subdomains). Saves an allocation per candidate in cache mode.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(transparent)]
pub struct NodeName<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl NodeName<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// Ordered, compared and hashed as the `str` it holds (derived through `Cow<str>`), so maps
// keyed by names can be read with a `&str`.
impl std::borrow::Borrow<str> for NodeName<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for NodeName<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for NodeName<'_> {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for NodeName<'_> {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

/// A `v1.NodeList` whose items are kept as raw JSON.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<Box<RawValue>>,
}

/// The candidate nodes of a request, in the form the scheduler chose.
#[derive(Debug)]
pub enum Candidates<'a> {
    /// `nodeCacheCapable: false`: full Node objects.
    Nodes(Vec<Box<RawValue>>),
    /// `nodeCacheCapable: true`: names; state comes from the extender's cache.
    Names(Vec<NodeName<'a>>),
}

impl Candidates<'_> {
    pub fn len(&self) -> usize {
        match self {
            Candidates::Nodes(n) => n.len(),
            Candidates::Names(n) => n.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A validated request: the pod and its candidate nodes (names borrowed from the body).
#[derive(Debug)]
pub struct Request<'a> {
    pub pod: Pod,
    pub candidates: Candidates<'a>,
}

impl<'a> ExtenderArgs<'a> {
    /// Decodes and validates a request body. `max_nodes` bounds the candidate count.
    pub fn decode(body: &'a [u8], max_nodes: usize) -> Result<Request<'a>, ExtenderError> {
        let args: ExtenderArgs =
            serde_json::from_slice(body).map_err(|source| ExtenderError::Json { source })?;
        let raw_pod = args.pod.ok_or(ExtenderError::MissingPod)?;
        if raw_pod.get() == "null" {
            return Err(ExtenderError::MissingPod);
        }
        let candidates = match (args.nodes, args.node_names) {
            (Some(_), Some(_)) => return Err(ExtenderError::BothNodeForms),
            (None, None) => return Err(ExtenderError::NoNodes),
            (Some(list), None) => Candidates::Nodes(list.items),
            (None, Some(names)) => Candidates::Names(names),
        };
        if candidates.len() > max_nodes {
            return Err(ExtenderError::TooManyNodes {
                count: candidates.len(),
                max: max_nodes,
            });
        }
        let pod: Pod = serde_json::from_str(raw_pod.get())
            .map_err(|source| ExtenderError::PodJson { source })?;
        Ok(Request { pod, candidates })
    }
}

/// The fields of a Node that [`railguard_api::NodeFabric::from_node`] reads. Decoding only
/// these skips managedFields, images and conditions, which dominate a Node's size.
#[derive(Deserialize)]
struct SlimNode {
    #[serde(default)]
    metadata: SlimMeta,
    #[serde(default)]
    status: Option<SlimStatus>,
}

#[derive(Default, Deserialize)]
struct SlimMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct SlimStatus {
    #[serde(default)]
    allocatable: Option<BTreeMap<String, Quantity>>,
}

/// Decodes the part of a raw Node that railguard interprets.
pub fn decode_node(raw: &RawValue, index: usize) -> Result<Node, ExtenderError> {
    let slim: SlimNode = serde_json::from_str(raw.get())
        .map_err(|source| ExtenderError::NodeJson { index, source })?;
    if slim.metadata.name.as_deref().is_none_or(str::is_empty) {
        return Err(ExtenderError::NodeWithoutName { index });
    }
    Ok(Node {
        metadata: ObjectMeta {
            name: slim.metadata.name,
            labels: slim.metadata.labels,
            annotations: slim.metadata.annotations,
            ..ObjectMeta::default()
        },
        spec: None,
        status: slim.status.map(|s| NodeStatus {
            allocatable: s.allocatable,
            ..NodeStatus::default()
        }),
    })
}

/// `ExtenderFilterResult`; in cache mode the passing names borrow from the request.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct ExtenderFilterResult<'a> {
    /// Passing nodes in full-Node mode (`nodeCacheCapable: false`).
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<NodeList>,
    /// Passing node names in cache mode (`nodeCacheCapable: true`).
    #[serde(rename = "NodeNames", default, borrow)]
    pub node_names: Option<Vec<NodeName<'a>>>,
    /// Nodes that may become eligible, with a reason (preemption may consider them).
    #[serde(rename = "FailedNodes", default, borrow)]
    pub failed_nodes: BTreeMap<NodeName<'a>, Arc<str>>,
    /// Nodes this pod can never use; schedulers from 1.21 on keep them out of preemption.
    #[serde(rename = "FailedAndUnresolvableNodes", default, borrow)]
    pub failed_and_unresolvable_nodes: BTreeMap<NodeName<'a>, Arc<str>>,
    /// Set when the whole request failed; the scheduler then fails the pod's cycle.
    #[serde(rename = "Error", default)]
    pub error: String,
}

impl ExtenderFilterResult<'_> {
    /// A result that fails the whole scheduling cycle with a message.
    pub fn error(message: impl Into<String>) -> Self {
        ExtenderFilterResult {
            error: message.into(),
            ..Self::default()
        }
    }
}

/// One entry of a `HostPriorityList`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}
