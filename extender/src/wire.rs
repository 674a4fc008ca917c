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

use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeStatus, Pod, PodSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
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
        let json = |source| ExtenderError::Json { source };
        let mut de = serde_json::Deserializer::from_slice(body);
        let args = BoundedArgs { max_nodes }
            .deserialize(&mut de)
            .map_err(json)?;
        de.end().map_err(json)?;
        let raw_pod = args.pod.ok_or(ExtenderError::MissingPod)?;
        if raw_pod.get() == "null" {
            return Err(ExtenderError::MissingPod);
        }
        let candidates = match (args.nodes, args.node_names) {
            (Some(_), Some(_)) => return Err(ExtenderError::BothNodeForms),
            (None, None) => return Err(ExtenderError::NoNodes),
            (Some(list), None) => Candidates::Nodes(list.map_err(too_many(max_nodes))?),
            (None, Some(names)) => Candidates::Names(names.map_err(too_many(max_nodes))?),
        };
        let pod = decode_pod(raw_pod)?;
        Ok(Request { pod, candidates })
    }
}

fn too_many(max: usize) -> impl Fn(usize) -> ExtenderError {
    move |count| ExtenderError::TooManyNodes { count, max }
}

/// Candidates as decoded: the list, or how many there were when more than `max_nodes`.
type BoundedList<T> = Result<Vec<T>, usize>;

/// `ExtenderArgs` as [`ExtenderArgs::decode`] reads it: the candidate lists stop growing
/// past `max_nodes` while they are decoded (the rest is only counted), so a body of a
/// million names costs its bytes, not a million entries.
struct BoundedArgs {
    max_nodes: usize,
}

struct DecodedArgs<'a> {
    pod: Option<&'a RawValue>,
    nodes: Option<BoundedList<Box<RawValue>>>,
    node_names: Option<BoundedList<NodeName<'a>>>,
}

impl<'de> DeserializeSeed<'de> for BoundedArgs {
    type Value = DecodedArgs<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BoundedArgs {
    type Value = DecodedArgs<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("struct ExtenderArgs")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut args = DecodedArgs {
            pod: None,
            nodes: None,
            node_names: None,
        };
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match &*key {
                // The keys and aliases of the derived `ExtenderArgs`.
                "Pod" | "pod" => {
                    if args.pod.is_some() {
                        return Err(de::Error::duplicate_field("Pod"));
                    }
                    args.pod = map.next_value::<Option<&'de RawValue>>()?;
                }
                "Nodes" | "nodes" => {
                    if args.nodes.is_some() {
                        return Err(de::Error::duplicate_field("Nodes"));
                    }
                    args.nodes = map.next_value_seed(Nullable(BoundedNodeList {
                        max: self.max_nodes,
                    }))?;
                }
                "NodeNames" | "nodenames" | "nodeNames" => {
                    if args.node_names.is_some() {
                        return Err(de::Error::duplicate_field("NodeNames"));
                    }
                    args.node_names =
                        map.next_value_seed(Nullable(BoundedSeq::new(self.max_nodes)))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(args)
    }
}

/// `null` as `None`, anything else through the inner seed.
struct Nullable<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a value or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// A JSON array of at most `max` items kept; past that the items are counted, not kept.
struct BoundedSeq<T> {
    max: usize,
    item: std::marker::PhantomData<T>,
}

impl<T> BoundedSeq<T> {
    fn new(max: usize) -> Self {
        Self {
            max,
            item: std::marker::PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for BoundedSeq<T> {
    type Value = BoundedList<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for BoundedSeq<T> {
    type Value = BoundedList<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // The size hint is the client's word: never reserve past the bound on it.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max).min(4096));
        while items.len() < self.max {
            match seq.next_element::<T>()? {
                Some(item) => items.push(item),
                None => return Ok(Ok(items)),
            }
        }
        if seq.next_element::<IgnoredAny>()?.is_none() {
            return Ok(Ok(items));
        }
        let mut count = items.len() + 1;
        drop(items);
        while seq.next_element::<IgnoredAny>()?.is_some() {
            count += 1;
        }
        Ok(Err(count))
    }
}

/// `v1.NodeList` keeping at most `max` items.
struct BoundedNodeList {
    max: usize,
}

impl<'de> DeserializeSeed<'de> for BoundedNodeList {
    type Value = BoundedList<Box<RawValue>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BoundedNodeList {
    type Value = BoundedList<Box<RawValue>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("struct NodeList")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut items = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "items" {
                if items.is_some() {
                    return Err(de::Error::duplicate_field("items"));
                }
                items = Some(
                    map.next_value_seed(Nullable(BoundedSeq::new(self.max)))?
                        .unwrap_or(Ok(Vec::new())),
                );
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(items.unwrap_or(Ok(Vec::new())))
    }
}

/// The fields of a Pod that [`crate::pod::PodFacts::from_pod`] reads: metadata and container
/// resources. The rest of the spec and the status are skipped without being built.
#[derive(Deserialize)]
struct SlimPod {
    #[serde(default)]
    metadata: Option<SlimPodMeta>,
    #[serde(default)]
    spec: Option<SlimPodSpec>,
}

#[derive(Default, Deserialize)]
struct SlimPodMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct SlimPodSpec {
    #[serde(default)]
    containers: Vec<SlimContainer>,
    #[serde(default, rename = "initContainers")]
    init_containers: Option<Vec<SlimContainer>>,
}

#[derive(Deserialize)]
struct SlimContainer {
    #[serde(default)]
    name: String,
    #[serde(default)]
    resources: Option<ResourceRequirements>,
}

impl SlimContainer {
    fn into_container(self) -> Container {
        Container {
            name: self.name,
            resources: self.resources,
            ..Container::default()
        }
    }
}

/// Decodes the part of the request's Pod that railguard interprets.
fn decode_pod(raw: &RawValue) -> Result<Pod, ExtenderError> {
    let slim: SlimPod =
        serde_json::from_str(raw.get()).map_err(|source| ExtenderError::PodJson { source })?;
    let meta = slim.metadata.unwrap_or_default();
    Ok(Pod {
        metadata: ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            labels: meta.labels,
            annotations: meta.annotations,
            ..ObjectMeta::default()
        },
        spec: slim.spec.map(|spec| PodSpec {
            containers: spec
                .containers
                .into_iter()
                .map(SlimContainer::into_container)
                .collect(),
            init_containers: spec
                .init_containers
                .map(|c| c.into_iter().map(SlimContainer::into_container).collect()),
            ..PodSpec::default()
        }),
        status: None,
    })
}

/// The fields of a Node that [`railguard_api::NodeFabric::from_node`] reads. Decoding only
/// these skips managedFields, images and every condition but the fleet outlier mark, which
/// dominate a Node's size.
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
    #[serde(default, deserialize_with = "fleet_outlier_condition")]
    conditions: Option<NodeCondition>,
}

/// One entry of `status.conditions`, borrowed from the body where unescaped: only the kept
/// one is copied.
#[derive(Deserialize)]
struct SlimCondition<'a> {
    #[serde(rename = "type", default, borrow)]
    type_: Cow<'a, str>,
    #[serde(default, borrow)]
    status: Cow<'a, str>,
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

/// `status.conditions` reduced to the one condition `NodeFabric::from_node` reads: the first
/// [`CONDITION_FLEET_OUTLIER`](railguard_api::keys::CONDITION_FLEET_OUTLIER) with status
/// `True`. Filtered while decoding, so however many conditions a Node carries, only that one
/// is kept.
fn fleet_outlier_condition<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<NodeCondition>, D::Error> {
    struct Conditions;

    impl<'de> Visitor<'de> for Conditions {
        type Value = Option<NodeCondition>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of node conditions")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(c) = seq.next_element::<SlimCondition<'de>>()? {
                if found.is_none()
                    && c.type_ == railguard_api::keys::CONDITION_FLEET_OUTLIER
                    && c.status == "True"
                {
                    found = Some(NodeCondition {
                        type_: c.type_.into_owned(),
                        status: c.status.into_owned(),
                        reason: c.reason.map(Cow::into_owned),
                        message: c.message.map(Cow::into_owned),
                        ..NodeCondition::default()
                    });
                }
            }
            Ok(found)
        }
    }

    d.deserialize_any(Conditions)
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
            conditions: s.conditions.map(|c| vec![c]),
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
    /// The JSON body, written into a buffer sized up front: growing it by doubling would copy
    /// the 100 kB answer to a 5,000-name request several times.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        // Quotes, comma and a little slack per entry; escapes beyond that are rare.
        let names: usize = self.node_names.iter().flatten().map(|n| n.len() + 4).sum();
        let rejected: usize = self
            .failed_nodes
            .iter()
            .chain(&self.failed_and_unresolvable_nodes)
            .map(|(n, m)| n.len() + m.len() + 8)
            .sum();
        let nodes: usize = self
            .nodes
            .iter()
            .flat_map(|l| &l.items)
            .map(|n| n.get().len() + 1)
            .sum();
        let mut out = Vec::with_capacity(128 + names + rejected + nodes + self.error.len());
        // By hand, in the derived field order and serde_json's compact form (a test holds it
        // to `serde_json::to_vec`): serde_json checks every byte of every string for escapes
        // one at a time, which was most of the encode time of a 5,000-name answer.
        out.extend_from_slice(b"{\"Nodes\":");
        serde_json::to_writer(&mut out, &self.nodes)?;
        out.extend_from_slice(b",\"NodeNames\":");
        match &self.node_names {
            None => out.extend_from_slice(b"null"),
            Some(names) => {
                out.push(b'[');
                for (i, name) in names.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_json_str(&mut out, name)?;
                }
                out.push(b']');
            }
        }
        for (key, map) in [
            (&b",\"FailedNodes\":"[..], &self.failed_nodes),
            (
                &b",\"FailedAndUnresolvableNodes\":"[..],
                &self.failed_and_unresolvable_nodes,
            ),
        ] {
            out.extend_from_slice(key);
            out.push(b'{');
            for (i, (name, message)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_str(&mut out, name)?;
                out.push(b':');
                write_json_str(&mut out, message)?;
            }
            out.push(b'}');
        }
        out.extend_from_slice(b",\"Error\":");
        write_json_str(&mut out, &self.error)?;
        out.push(b'}');
        Ok(out)
    }

    /// A result that fails the whole scheduling cycle with a message.
    pub fn error(message: impl Into<String>) -> Self {
        ExtenderFilterResult {
            error: message.into(),
            ..Self::default()
        }
    }
}

/// Writes `s` as a JSON string: copied as is when nothing in it needs escaping (node names
/// never do), through serde_json otherwise.
fn write_json_str(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    // A fold without short circuit, so the check compiles to a vectorized scan.
    let needs_escape = s.bytes().fold(false, |acc, b| {
        acc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if needs_escape {
        serde_json::to_writer(out, s)
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        Ok(())
    }
}

/// One entry of a `HostPriorityList`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct HostPriority<'a> {
    #[serde(rename = "Host", borrow)]
    pub host: Cow<'a, str>,
    #[serde(rename = "Score")]
    pub score: i64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::pod::PodFacts;

    /// The hand-written encoder gives serde_json's bytes, escapes included.
    #[test]
    fn to_json_equals_serde_json() {
        let awkward = [
            "plain-node.example.com",
            "quote\"back\\slash",
            "line\nbreak\ttab\u{1}\u{1f}",
            "µs \u{2028} \u{7f} ✓",
            "",
        ];
        let name = |s: &'static str| NodeName(Cow::Borrowed(s));
        let message = |s: &str| Arc::<str>::from(format!("railguard: {s}"));
        let full = ExtenderFilterResult {
            nodes: None,
            node_names: Some(awkward.iter().map(|s| name(s)).collect()),
            failed_nodes: awkward.iter().map(|s| (name(s), message(s))).collect(),
            failed_and_unresolvable_nodes: BTreeMap::from([(name("n-1"), message("x\"y"))]),
            error: String::new(),
        };
        let with_nodes = ExtenderFilterResult {
            nodes: Some(NodeList {
                items: vec![
                    RawValue::from_string(r#"{"metadata":{"name":"a"}}"#.into()).unwrap(),
                    RawValue::from_string("{}".into()).unwrap(),
                ],
            }),
            ..ExtenderFilterResult::default()
        };
        let empty = ExtenderFilterResult {
            node_names: Some(Vec::new()),
            ..ExtenderFilterResult::default()
        };
        for r in [
            full,
            with_nodes,
            empty,
            ExtenderFilterResult::default(),
            ExtenderFilterResult::error("railguard: caches \"not\" synced\n"),
        ] {
            let ours = String::from_utf8(r.to_json().unwrap()).unwrap();
            assert_eq!(ours, serde_json::to_string(&r).unwrap());
        }
    }

    /// The slim Pod decode reads the same facts as a full k8s-openapi decode.
    #[test]
    fn slim_pod_gives_the_facts_of_the_full_pod() {
        let pod = serde_json::json!({
            "metadata": {"name": "w-0", "namespace": "ml", "uid": "u",
                "labels": {"jobset.sigs.k8s.io/jobset-name": "llama"},
                "annotations": {"railguard.io/profile": "h100-ndr", "railguard.io/signature": "abc",
                                "railguard.io/allow-uncertified": "true"},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {
                "schedulerName": "default-scheduler",
                "initContainers": [{"name": "init", "image": "x",
                    "resources": {"limits": {"rdma/rdma_shared_device_a": "1"}}}],
                "containers": [{"name": "c", "image": "y", "command": ["train"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "4"}}}]},
            "status": {"phase": "Pending"}
        });
        let body = serde_json::json!({"Pod": pod, "NodeNames": ["n1", "n\u{0032}"]}).to_string();
        let req = ExtenderArgs::decode(body.as_bytes(), 10).unwrap();
        let full: Pod = serde_json::from_value(pod).unwrap();
        let keys: Vec<String> = railguard_api::keys::DEFAULT_JOB_LABEL_KEYS
            .iter()
            .map(|s| s.to_string())
            .collect();
        let slim_facts = PodFacts::from_pod(&req.pod, &keys);
        assert_eq!(slim_facts, PodFacts::from_pod(&full, &keys));
        assert_eq!(slim_facts.extended_resources.len(), 2);
        let Candidates::Names(names) = req.candidates else {
            panic!("names expected")
        };
        assert_eq!(names, ["n1", "n2"]);
        // Escaped names are decoded (copied), not rejected.
        let escaped = br#"{"Pod": {}, "NodeNames": ["n\u0031", "n2"]}"#;
        let req = ExtenderArgs::decode(escaped, 10).unwrap();
        let Candidates::Names(names) = req.candidates else {
            panic!("names expected")
        };
        assert_eq!(names, ["n1", "n2"]);
        assert!(matches!(names[0].0, Cow::Owned(_)) && matches!(names[1].0, Cow::Borrowed(_)));
    }

    /// The slim Node decode keeps what `NodeFabric::from_node` reads, the fleet outlier mark
    /// included, and nothing of the other conditions.
    #[test]
    fn slim_node_keeps_the_fleet_outlier_condition() {
        use railguard_api::NodeFabric;
        let now: jiff::Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
        let node = |conditions: serde_json::Value| {
            serde_json::json!({
                "metadata": {"name": "n1", "labels": {"railguard.io/fabric": "pending"},
                    "managedFields": [{"manager": "kubelet"}]},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": conditions,
                    "images": [{"names": ["x"], "sizeBytes": 1}]}
            })
        };
        let ready = serde_json::json!({"type": "Ready", "status": "True",
            "reason": "KubeletReady", "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-11-29T11:59:00Z"});
        let mark = |status: &str, message: &str| {
            serde_json::json!({"type": "RailguardFleetOutlier", "status": status,
                "reason": "FleetOutlier", "message": message,
                "lastTransitionTime": "2026-11-29T11:00:00Z"})
        };
        let slow = "rail mlx5_3:1 writeBwHost 326.4 Gb/s is 15.0% below the fleet median 384.0 Gb/s (12.3 spreads)";
        let cases = [
            (
                node(serde_json::json!([ready, mark("True", slow)])),
                Some(slow),
            ),
            // Escaped text is decoded; the first True condition is the one read.
            (
                node(serde_json::json!([
                    mark("False", "within"),
                    mark("True", "a \"b\"\n"),
                    mark("True", "later")
                ])),
                Some("a \"b\"\n"),
            ),
            (
                node(serde_json::json!([ready, mark("Unknown", "no baseline")])),
                None,
            ),
            (node(serde_json::json!([ready])), None),
            (node(serde_json::json!([])), None),
            (node(serde_json::Value::Null), None),
            (
                serde_json::json!({"metadata": {"name": "n1"}, "status": {}}),
                None,
            ),
            (serde_json::json!({"metadata": {"name": "n1"}}), None),
        ];
        for (i, (full, want)) in cases.into_iter().enumerate() {
            let raw = RawValue::from_string(full.to_string()).unwrap();
            let slim = decode_node(&raw, i).unwrap();
            let kept = slim
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .map_or(0, Vec::len);
            assert!(kept <= 1, "case {i}: only the mark is kept, got {kept}");
            let full: Node = serde_json::from_value(full).unwrap();
            let fabric = NodeFabric::from_node(&slim, now);
            assert_eq!(fabric, NodeFabric::from_node(&full, now), "case {i}");
            assert_eq!(
                fabric.fleet_outlier.map(|m| m.message).as_deref(),
                want,
                "case {i}"
            );
        }
        // The limits still hold: a nameless Node and conditions that are not a list.
        let nameless = RawValue::from_string(
            node(serde_json::json!([]))
                .to_string()
                .replace("\"n1\"", "\"\""),
        )
        .unwrap();
        assert!(matches!(
            decode_node(&nameless, 3),
            Err(ExtenderError::NodeWithoutName { index: 3 })
        ));
        let bad =
            RawValue::from_string(node(serde_json::json!({"type": "Ready"})).to_string()).unwrap();
        assert!(matches!(
            decode_node(&bad, 4),
            Err(ExtenderError::NodeJson { index: 4, .. })
        ));
    }

    /// The candidate lists stop growing at the bound while decoding, and the count is still
    /// exact; exactly the bound passes; keys, aliases and nulls read as before.
    #[test]
    fn candidates_are_bounded_while_decoding() {
        let names = |n: usize| {
            let list: Vec<String> = (0..n).map(|i| format!("\"n{i}\"")).collect();
            format!(r#"{{"Pod": {{}}, "NodeNames": [{}]}}"#, list.join(","))
        };
        let err = ExtenderArgs::decode(names(1_000).as_bytes(), 10).unwrap_err();
        assert!(
            matches!(
                err,
                ExtenderError::TooManyNodes {
                    count: 1_000,
                    max: 10
                }
            ),
            "{err}"
        );
        let ten = names(10);
        let req = ExtenderArgs::decode(ten.as_bytes(), 10).unwrap();
        assert_eq!(req.candidates.len(), 10);
        assert!(ExtenderArgs::decode(names(0).as_bytes(), 0).is_ok());
        let nodes = |n: usize| {
            let list: Vec<String> = (0..n)
                .map(|i| format!(r#"{{"metadata": {{"name": "n{i}"}}}}"#))
                .collect();
            format!(
                r#"{{"pod": {{}}, "Nodes": {{"kind": "NodeList", "items": [{}]}}}}"#,
                list.join(",")
            )
        };
        let err = ExtenderArgs::decode(nodes(12).as_bytes(), 11).unwrap_err();
        assert!(
            matches!(err, ExtenderError::TooManyNodes { count: 12, max: 11 }),
            "{err}"
        );
        let eleven = nodes(11);
        let req = ExtenderArgs::decode(eleven.as_bytes(), 11).unwrap();
        assert_eq!(req.candidates.len(), 11);
        // Null lists are absent; a null Pod is missing; trailing garbage is invalid JSON.
        let null_names = br#"{"Pod": {}, "NodeNames": null, "nodes": {"items": null}}"#;
        assert!(ExtenderArgs::decode(null_names, 5)
            .unwrap()
            .candidates
            .is_empty());
        assert!(matches!(
            ExtenderArgs::decode(br#"{"Pod": null, "NodeNames": []}"#, 5),
            Err(ExtenderError::MissingPod)
        ));
        assert!(matches!(
            ExtenderArgs::decode(br#"{"Pod": {}, "NodeNames": []} x"#, 5),
            Err(ExtenderError::Json { .. })
        ));
        assert!(matches!(
            ExtenderArgs::decode(br#"{"Pod": {}, "NodeNames": [], "nodeNames": []}"#, 5),
            Err(ExtenderError::Json { .. })
        ));
        // An unbounded run of tiny names is refused with its count, not stored.
        let flood = format!(
            r#"{{"Pod": {{}}, "NodeNames": [{}"a"]}}"#,
            "\"a\",".repeat(200_000)
        );
        let err = ExtenderArgs::decode(flood.as_bytes(), 15_000).unwrap_err();
        assert!(
            matches!(err, ExtenderError::TooManyNodes { count: 200_001, .. }),
            "{err}"
        );
    }
}
