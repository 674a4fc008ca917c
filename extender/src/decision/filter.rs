//! `/filter`: which candidate nodes pass, and why the others do not.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use railguard_api::NodeFabric;

use crate::decision::target::in_pool;
use crate::decision::{check_node, PodTarget, Precheck, RejectReason, Rejection};

/// A candidate node: its name and, when known, its fabric state.
#[derive(Clone, Copy, Debug)]
pub struct NodeSlot<'a> {
    pub name: &'a str,
    /// `None` when the node is not in the extender's cache (cache mode only).
    pub fabric: Option<&'a NodeFabric>,
    /// The node's [`Precheck`] for the target's profile and signature, when the cache has
    /// one; decisions then skip re-checking the certificate.
    pub precheck: Option<&'a Precheck>,
    /// The node's topology label values as interned ids (see
    /// [`TopologyInterner`](crate::decision::TopologyInterner)); empty where not interned.
    pub topology: &'a [Option<u32>],
    /// Whether the fleet controller marked the node an outlier (`fabric.fleet_outlier`),
    /// copied where the slot is built so that scoring reads no fabric per candidate.
    pub fleet_outlier: bool,
}

impl<'a> NodeSlot<'a> {
    /// A slot decided from the fabric state alone.
    pub fn new(name: &'a str, fabric: Option<&'a NodeFabric>) -> Self {
        NodeSlot {
            name,
            fabric,
            precheck: None,
            topology: &[],
            fleet_outlier: fabric.is_some_and(|f| f.fleet_outlier.is_some()),
        }
    }
}

/// The outcome of a filter call: by default keyed by owned names with owned messages;
/// [`filter_by`] chooses other key and message types (the server borrows names from the
/// request and shares messages with the cache, so rejecting a node allocates nothing).
#[derive(Clone, Debug, PartialEq)]
pub struct FilterVerdicts<K = String, M = String> {
    /// Indices into the input of the nodes that passed, in input order.
    pub passed: Vec<usize>,
    /// Nodes that may become eligible (`FailedNodes`).
    pub failed: BTreeMap<K, M>,
    /// Nodes this pod can never use (`FailedAndUnresolvableNodes`).
    pub unresolvable: BTreeMap<K, M>,
    /// Rejections counted by reason.
    pub reasons: BTreeMap<RejectReason, u64>,
}

impl<K, M> Default for FilterVerdicts<K, M> {
    fn default() -> Self {
        FilterVerdicts {
            passed: Vec::new(),
            failed: BTreeMap::new(),
            unresolvable: BTreeMap::new(),
            reasons: BTreeMap::new(),
        }
    }
}

impl<K: Ord, M> FilterVerdicts<K, M> {
    fn reject(&mut self, key: K, reason: RejectReason, message: M) {
        *self.reasons.entry(reason).or_default() += 1;
        let map = if reason.resolvable() {
            &mut self.failed
        } else {
            &mut self.unresolvable
        };
        map.insert(key, message);
    }
}

/// Filters candidate nodes for a pod held to `target` at time `now`.
pub fn filter(target: &PodTarget<'_>, nodes: &[NodeSlot<'_>], now: Timestamp) -> FilterVerdicts {
    filter_by(
        target,
        nodes,
        now,
        |i| {
            nodes
                .get(i)
                .map_or_else(String::new, |s| s.name.to_string())
        },
        |message| message.to_string(),
    )
}

/// [`filter`], naming rejected node `i` (its index in `nodes`) `key(i)` and keeping its
/// message as `message(..)`.
pub fn filter_by<K: Ord, M>(
    target: &PodTarget<'_>,
    nodes: &[NodeSlot<'_>],
    now: Timestamp,
    key: impl Fn(usize) -> K,
    message: impl Fn(Arc<str>) -> M,
) -> FilterVerdicts<K, M> {
    let mut out = FilterVerdicts::default();
    let not_cached = || {
        Rejection::new(
            RejectReason::NotCached,
            "railguard: node is not in the extender's cache yet",
        )
    };
    match target {
        PodTarget::PassThrough => out.passed = (0..nodes.len()).collect(),
        PodTarget::Pools(profiles) => {
            for (i, slot) in nodes.iter().enumerate() {
                let Some(node) = slot.fabric else {
                    let r = not_cached();
                    out.reject(key(i), r.reason, message(r.message));
                    continue;
                };
                let pools: Vec<_> = profiles.iter().filter(|p| in_pool(node, p)).collect();
                let verdict = match pools.as_slice() {
                    [] => Ok(()),
                    [p] => check_node(node, p, &p.spec.signature(), now),
                    many => Err(Rejection::new(
                        RejectReason::Unplaceable,
                        format!(
                            "railguard: node is in the pools of several FabricProfiles ({}); a GPU pod without railguard.io/profile cannot be held to one",
                            many.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
                        ),
                    )),
                };
                match verdict {
                    Ok(()) => out.passed.push(i),
                    Err(r) => out.reject(key(i), r.reason, message(r.message)),
                }
            }
        }
        PodTarget::Unplaceable(why) => {
            let r = Rejection::new(RejectReason::Unplaceable, why.to_string());
            for i in 0..nodes.len() {
                out.reject(key(i), r.reason, message(r.message.clone()));
            }
        }
        PodTarget::Profile {
            profile,
            signature,
            exempt,
        } => {
            out.passed.reserve(nodes.len());
            for (i, slot) in nodes.iter().enumerate() {
                // An exemption is the profile's: it reaches only that profile's pool.
                if *exempt && slot.fabric.is_some_and(|n| in_pool(n, profile)) {
                    out.passed.push(i);
                    continue;
                }
                let verdict = match (slot.precheck, slot.fabric) {
                    (Some(pre), _) => pre.check(now),
                    (None, Some(node)) => check_node(node, profile, signature, now),
                    (None, None) => Err(not_cached()),
                };
                match verdict {
                    Ok(()) => out.passed.push(i),
                    Err(r) => out.reject(key(i), r.reason, message(r.message)),
                }
            }
        }
    }
    out
}
