//! Deciding a decoded request against the caches or the request's own Nodes.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use railguard_api::{FabricProfile, NodeFabric};

use crate::cache::ClusterState;
use crate::metrics::ReasonLabels;
use crate::server::{AppState, Profiles, Source};
use railguard_extender::cache::NodeIndex;
use railguard_extender::cache::{CachedNode, ProfileSet};
use railguard_extender::decision::{
    filter_by, prioritize, prioritize_scores, shift_lowest_to_zero, target_for, topology_keys_for,
    ExtenderConfig, JobTopology, NodeSlot, PodTarget,
};
use railguard_extender::error::ExtenderError;
use railguard_extender::pod::PodFacts;
use railguard_extender::wire::{
    decode_node, Candidates, ExtenderFilterResult, HostPriority, NodeList, NodeName, Request,
};

/// The pod's target, with what the decision needs from the caches.
struct Prepared<'p> {
    facts: PodFacts,
    target: PodTarget<'p>,
}

fn prepare<'p>(state: &AppState, req: &Request<'_>, profiles: &'p [FabricProfile]) -> Prepared<'p> {
    let facts = PodFacts::from_pod(&req.pod, &state.config.job_label_keys);
    let ns_labels = match &state.source {
        Source::Cluster(c) => c.namespaces.get(&facts.namespace),
        Source::Standalone { .. } => None,
    };
    let target = target_for(&facts, profiles, ns_labels.as_deref(), &state.config);
    Prepared { facts, target }
}

/// Full Node objects interpreted at `now`.
fn interpret_nodes(
    items: &[Box<serde_json::value::RawValue>],
    now: Timestamp,
) -> Result<Vec<NodeFabric>, ExtenderError> {
    items
        .iter()
        .enumerate()
        .map(|(i, raw)| decode_node(raw, i).map(|n| NodeFabric::from_node(&n, now)))
        .collect()
}

/// Answers a decoded `/filter` request.
pub fn answer_filter<'a>(
    state: &AppState,
    req: Request<'a>,
    now: Timestamp,
) -> Result<ExtenderFilterResult<'a>, ExtenderError> {
    state.ready().map_err(ExtenderError::NotSynced)?;
    let profiles = state.profiles();
    let prepared = prepare(state, &req, profiles.list());
    let Request { candidates, .. } = req;
    match candidates {
        Candidates::Nodes(items) => {
            if matches!(prepared.target, PodTarget::PassThrough) {
                return Ok(ExtenderFilterResult {
                    nodes: Some(NodeList { items }),
                    ..ExtenderFilterResult::default()
                });
            }
            let fabrics = interpret_nodes(&items, now)?;
            let slots: Vec<NodeSlot<'_>> = fabrics
                .iter()
                .map(|f| NodeSlot::new(&f.name, Some(f)))
                .collect();
            let verdicts = filter_by(
                &prepared.target,
                &slots,
                now,
                |i| {
                    NodeName(Cow::Owned(
                        slots
                            .get(i)
                            .map_or_else(String::new, |s| s.name.to_string()),
                    ))
                },
                |m| m,
            );
            record_rejections(state, &verdicts.reasons);
            let mut keep = vec![false; items.len()];
            for &i in &verdicts.passed {
                keep[i] = true;
            }
            let items = items
                .into_iter()
                .zip(keep)
                .filter_map(|(item, k)| k.then_some(item))
                .collect();
            let (failed_nodes, failed_and_unresolvable_nodes) =
                failure_maps(&state.config, verdicts.failed, verdicts.unresolvable);
            Ok(ExtenderFilterResult {
                nodes: Some(NodeList { items }),
                node_names: None,
                failed_nodes,
                failed_and_unresolvable_nodes,
                error: String::new(),
            })
        }
        Candidates::Names(names) => {
            let Source::Cluster(cluster) = &state.source else {
                return Err(ExtenderError::NamesWithoutCache);
            };
            if matches!(prepared.target, PodTarget::PassThrough) {
                return Ok(ExtenderFilterResult {
                    node_names: Some(names),
                    ..ExtenderFilterResult::default()
                });
            }
            // Rejected names are the request's own (borrowed), messages the cache's (shared).
            let verdicts =
                with_cached_slots(cluster, &names, &profiles, &prepared.target, |slots, _| {
                    filter_by(
                        &prepared.target,
                        slots,
                        now,
                        |i| names.get(i).cloned().unwrap_or_default(),
                        |m| m,
                    )
                });
            record_rejections(state, &verdicts.reasons);
            let passed = keep_passed(names, &verdicts.passed);
            let (failed_nodes, failed_and_unresolvable_nodes) =
                failure_maps(&state.config, verdicts.failed, verdicts.unresolvable);
            Ok(ExtenderFilterResult {
                nodes: None,
                node_names: Some(passed),
                failed_nodes,
                failed_and_unresolvable_nodes,
                error: String::new(),
            })
        }
    }
}

/// `FailedNodes` and `FailedAndUnresolvableNodes` as the configured scheduler reads them.
fn failure_maps<K: Ord, V>(
    config: &ExtenderConfig,
    mut failed: BTreeMap<K, V>,
    unresolvable: BTreeMap<K, V>,
) -> (BTreeMap<K, V>, BTreeMap<K, V>) {
    if config.report_unresolvable_as_failed {
        failed.extend(unresolvable);
        (failed, BTreeMap::new())
    } else {
        (failed, unresolvable)
    }
}

/// Runs `decide` over slots for cached nodes, each with its precheck for the pod's profile
/// when the cache has one (the pod carries its profile's own signature and the profile set
/// is current). Reads the [`NodeIndex`](crate::cache::NodeIndex) when it reflects the node
/// cache and the profile set, and the node cache itself otherwise (same answers, slower).
/// `decide` also gets the index when the slots came from it (they then carry their interned
/// topology ids).
fn with_cached_slots<T>(
    cluster: &ClusterState,
    names: &[NodeName<'_>],
    profiles: &Profiles,
    target: &PodTarget<'_>,
    decide: impl FnOnce(&[NodeSlot<'_>], Option<&NodeIndex>) -> T,
) -> T {
    let (set, index) = match (profiles, target) {
        (
            Profiles::Cluster(set),
            PodTarget::Profile {
                profile, signature, ..
            },
        ) => (Some(&**set), set.index_of(profile.name(), signature)),
        (Profiles::Cluster(set), _) => (Some(&**set), None),
        (Profiles::Standalone(_), _) => (None, None),
    };
    let node_index = cluster.node_index();
    if let Some(set) = set {
        if node_index.is_current(cluster.nodes.version(), set.generation) {
            let slots: Vec<NodeSlot<'_>> =
                names.iter().map(|n| node_index.slot(n, index)).collect();
            return decide(&slots, Some(&node_index));
        }
    }
    let nodes = cluster.nodes.read();
    let slots = cached_slots(names, &nodes, set.zip(index));
    decide(&slots, None)
}

/// Slots read from the node cache map (the path while the index is being rebuilt).
fn cached_slots<'a>(
    names: &'a [NodeName<'_>],
    nodes: &'a HashMap<String, Arc<CachedNode>>,
    index: Option<(&'a ProfileSet, usize)>,
) -> Vec<NodeSlot<'a>> {
    names
        .iter()
        .map(|n| match nodes.get(n.as_str()) {
            Some(cached) => NodeSlot {
                name: n,
                fabric: Some(&cached.fabric),
                precheck: index.and_then(|(set, i)| cached.precheck(set, i)),
                topology: &[],
                fleet_outlier: cached.fabric.fleet_outlier.is_some(),
            },
            None => NodeSlot::new(n, None),
        })
        .collect()
}

/// The names at the `passed` indices (ascending), moved out of `names`.
fn keep_passed<'a>(names: Vec<NodeName<'a>>, passed: &[usize]) -> Vec<NodeName<'a>> {
    let mut next = passed.iter().peekable();
    names
        .into_iter()
        .enumerate()
        .filter_map(|(i, n)| {
            if next.peek() == Some(&&i) {
                next.next();
                Some(n)
            } else {
                None
            }
        })
        .collect()
}

fn record_rejections(
    state: &AppState,
    reasons: &std::collections::BTreeMap<railguard_extender::decision::RejectReason, u64>,
) {
    for (reason, n) in reasons {
        state
            .metrics
            .nodes_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc_by(*n);
    }
}

/// Answers a decoded `/prioritize` request: each candidate's score 0..=10, lowered by the
/// lowest candidate's ([`shift_lowest_to_zero`]: the ranking stays), in input order.
/// Candidates at 0 are left out: kube-scheduler adds nothing for a host the list does not
/// name, and a shorter list is less for it to decode.
pub fn answer_prioritize<'r>(
    state: &AppState,
    req: &'r Request<'_>,
    now: Timestamp,
) -> Result<Vec<HostPriority<'r>>, ExtenderError> {
    state.ready().map_err(ExtenderError::NotSynced)?;
    let profiles = state.profiles();
    let prepared = prepare(state, req, profiles.list());
    // Only a job's pods score locality and rank fleet outliers last; in cluster mode the
    // cache knows where the job already runs.
    let is_job = prepared.facts.job.is_some();
    let job = match (&state.source, &prepared.facts.job) {
        (Source::Cluster(c), Some(job)) => Some((c, job)),
        _ => None,
    };
    // The job's nodes as full fabrics, for the paths that score from labels.
    let peer_fabrics = || -> Vec<Arc<NodeFabric>> {
        job.map(|(c, job)| c.peers(&prepared.facts.namespace, job))
            .unwrap_or_default()
    };
    let by_labels = |slots: &[NodeSlot<'_>]| -> Vec<(String, i64)> {
        let peers = peer_fabrics();
        let peer_refs: Vec<&NodeFabric> = peers.iter().map(|p| &**p).collect();
        let job = is_job.then_some(peer_refs.as_slice());
        prioritize(&prepared.target, slots, job, now, &state.config)
    };
    let scored =
        |host: Cow<'r, str>, score: i64| (score > 0).then_some(HostPriority { host, score });
    match &req.candidates {
        Candidates::Nodes(items) => {
            let fabrics = interpret_nodes(items, now)?;
            let slots: Vec<NodeSlot<'_>> = fabrics
                .iter()
                .map(|f| NodeSlot::new(&f.name, Some(f)))
                .collect();
            let (hosts, mut scores): (Vec<String>, Vec<i64>) =
                by_labels(&slots).into_iter().unzip();
            shift_lowest_to_zero(&mut scores);
            Ok(hosts
                .into_iter()
                .zip(scores)
                .filter_map(|(host, score)| scored(Cow::Owned(host), score))
                .collect())
        }
        Candidates::Names(names) => {
            let Source::Cluster(cluster) = &state.source else {
                return Err(ExtenderError::NamesWithoutCache);
            };
            let mut scores = with_cached_slots(
                cluster,
                names,
                &profiles,
                &prepared.target,
                |slots, index| match index {
                    Some(index) => {
                        let mut peers = Vec::new();
                        if let Some((c, job)) = job {
                            c.jobs.each_node(&prepared.facts.namespace, job, |node| {
                                if let Some(slot) = index.lookup(node) {
                                    peers.push(index.topology(slot));
                                }
                            });
                        }
                        let keys = topology_keys_for(&prepared.target, &state.config);
                        let job =
                            is_job.then(|| JobTopology::new(keys, index.topology_keys(), peers));
                        prioritize_scores(&prepared.target, slots, job.as_ref(), now)
                    }
                    None => by_labels(slots)
                        .into_iter()
                        .map(|(_, score)| score)
                        .collect(),
                },
            );
            shift_lowest_to_zero(&mut scores);
            Ok(names
                .iter()
                .zip(scores)
                .filter_map(|(name, score)| scored(Cow::Borrowed(name.as_str()), score))
                .collect())
        }
    }
}
