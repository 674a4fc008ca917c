//! `/prioritize`: bandwidth headroom over the profile plus locality to the job's other pods;
//! for a job's pods, fleet outliers last.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use railguard_api::{Certificate, FabricProfile, NodeFabric};

use crate::decision::{check_node, ExtenderConfig, NodeSlot, PodTarget};
use crate::wire::MAX_EXTENDER_PRIORITY;

/// Score share of bandwidth headroom and of gang locality (each up to half of 10).
const HEADROOM_POINTS: i64 = MAX_EXTENDER_PRIORITY / 2;
const LOCALITY_POINTS: i64 = MAX_EXTENDER_PRIORITY - HEADROOM_POINTS;
/// Headroom that earns all headroom points: 10% above every threshold.
const FULL_HEADROOM: f64 = 0.10;

/// Bandwidth headroom of a certified node over the profile's thresholds: the smallest
/// ratio measured/threshold minus one, over every rail and the NCCL plateau.
fn headroom(cert: &Certificate, profile: &FabricProfile) -> Option<f64> {
    let t = &profile.spec.thresholds;
    let mut worst: Option<f64> = None;
    let mut take = |got: Option<f64>, want: f64| {
        if want > 0.0 {
            let ratio = got.unwrap_or(0.0) / want - 1.0;
            worst = Some(worst.map_or(ratio, |w: f64| w.min(ratio)));
        }
    };
    for spec in &profile.spec.rails {
        let rail = cert.rail(&spec.hca, spec.port);
        take(
            rail.and_then(|r| r.write_bw_host_gbps),
            t.write_bw_host_gbps,
        );
        if let Some(want) = t.write_bw_gpu_gbps {
            take(rail.and_then(|r| r.write_bw_gpu_gbps), want);
        }
    }
    take(
        cert.nccl.as_ref().and_then(|n| n.busbw_plateau_gbps),
        t.busbw_plateau_gbps,
    );
    worst
}

/// The topology label keys that `target`'s locality is scored on, most specific first: its
/// profile's own, or the extender's defaults when the profile names none.
pub fn topology_keys_for<'a>(target: &PodTarget<'a>, config: &'a ExtenderConfig) -> &'a [String] {
    match target {
        PodTarget::Profile { profile, .. } if !profile.spec.topology_keys.is_empty() => {
            &profile.spec.topology_keys
        }
        _ => &config.topology_keys,
    }
}

/// Topology label values interned as small ids, per key: equal values of one key get equal
/// ids. Locality compares ids instead of looking labels up in each node's label map (most of
/// `/prioritize`'s time before) and hashing their values.
#[derive(Clone, Debug, Default)]
pub struct TopologyInterner {
    keys: Vec<String>,
    ids: Vec<HashMap<String, u32, hashbrown::DefaultHashBuilder>>,
}

impl TopologyInterner {
    pub fn new(keys: Vec<String>) -> Self {
        let ids = keys.iter().map(|_| HashMap::default()).collect();
        TopologyInterner { keys, ids }
    }

    /// The keys, in the order of every id slice this interner writes.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Appends one id per key for a node's `labels` to `out` (`None` where it lacks the label).
    pub fn intern_into(&mut self, labels: &BTreeMap<String, String>, out: &mut Vec<Option<u32>>) {
        for (key, ids) in self.keys.iter().zip(&mut self.ids) {
            out.push(labels.get(key).map(|value| {
                let next = ids.len() as u32;
                match ids.get(value.as_str()) {
                    Some(&id) => id,
                    None => {
                        ids.insert(value.clone(), next);
                        next
                    }
                }
            }));
        }
    }
}

/// Where a job already runs, as locality scoring reads it: the topology ids of each node
/// running its pods, and where each of the target's keys (most specific first) sits in an id
/// slice (`None`: no node has ids for that key).
#[derive(Clone, Debug, Default)]
pub struct JobTopology<'a> {
    pub key_positions: Vec<Option<usize>>,
    pub peers: Vec<&'a [Option<u32>]>,
}

impl<'a> JobTopology<'a> {
    /// `target_keys` located among `interned_keys` (the keys behind every id slice).
    pub fn new(
        target_keys: &[String],
        interned_keys: &[String],
        peers: Vec<&'a [Option<u32>]>,
    ) -> Self {
        let key_positions = target_keys
            .iter()
            .map(|k| interned_keys.iter().position(|i| i == k))
            .collect();
        JobTopology {
            key_positions,
            peers,
        }
    }
}

/// Ranks candidate nodes 0..=10: bandwidth headroom over the profile (up to 5) plus, for a
/// pod of a multi-node job (`job` is `Some`: it carries a job label), locality to the nodes
/// already running the job's pods (the `job` nodes; up to 5 for sharing the most specific
/// topology label value). Only nodes that pass the filter earn headroom points.
///
/// The slowest node sets the pace of a multi-node job, so for a job's pod a node the fleet
/// controller marked an outlier ranks below every other candidate: when one is among the
/// candidates, outliers score 0 and every other candidate at least 1.
///
/// This form reads labels and each node's fleet mark; the server scores through
/// [`prioritize_scores`] with ids and marks its node index copied once per node change. Both
/// give the same scores.
pub fn prioritize(
    target: &PodTarget<'_>,
    nodes: &[NodeSlot<'_>],
    job: Option<&[&NodeFabric]>,
    now: Timestamp,
    config: &ExtenderConfig,
) -> Vec<(String, i64)> {
    let peers = job.unwrap_or_default();
    let keys = topology_keys_for(target, config);
    let mut interner = TopologyInterner::new(keys.to_vec());
    let width = keys.len();
    let mut ids = Vec::with_capacity(width * (nodes.len() + peers.len()));
    for labels in nodes
        .iter()
        .map(|s| s.fabric.map(|f| &f.labels))
        .chain(peers.iter().map(|p| Some(&p.labels)))
    {
        match labels {
            Some(labels) => interner.intern_into(labels, &mut ids),
            None => ids.extend(std::iter::repeat_n(None, width)),
        }
    }
    let (node_ids, peer_ids) = ids.split_at(width * nodes.len());
    let slots: Vec<NodeSlot<'_>> = nodes
        .iter()
        .enumerate()
        .map(|(i, s)| NodeSlot {
            topology: node_ids.get(i * width..(i + 1) * width).unwrap_or_default(),
            fleet_outlier: s.fabric.is_some_and(|f| f.fleet_outlier.is_some()),
            ..*s
        })
        .collect();
    let job = job.map(|_| {
        JobTopology::new(
            keys,
            interner.keys(),
            peer_ids.chunks(width.max(1)).collect(),
        )
    });
    let scores = prioritize_scores(target, &slots, job.as_ref(), now);
    nodes
        .iter()
        .zip(scores)
        .map(|(s, score)| (s.name.to_string(), score))
        .collect()
}

/// The scores of [`prioritize`], in candidate order, for slots that carry their topology ids
/// (`NodeSlot::topology`, in the id order `job` was located against) and their fleet marks
/// (`NodeSlot::fleet_outlier`). `job` is `None` for a pod of no job.
pub fn prioritize_scores(
    target: &PodTarget<'_>,
    nodes: &[NodeSlot<'_>],
    job: Option<&JobTopology<'_>>,
    now: Timestamp,
) -> Vec<i64> {
    let PodTarget::Profile {
        profile, signature, ..
    } = target
    else {
        return vec![0; nodes.len()];
    };
    let occupied = job.map(Occupied::new);
    let mut scores: Vec<i64> = nodes
        .iter()
        .map(|slot| {
            let score = slot.fabric.map_or(0, |node| {
                let headroom = match slot.precheck {
                    Some(pre) => pre.headroom_points(now),
                    None => headroom_points(node, profile, signature, now),
                };
                headroom
                    + occupied
                        .as_ref()
                        .map_or(0, |o| o.locality_points(slot.topology))
            });
            score.clamp(0, MAX_EXTENDER_PRIORITY)
        })
        .collect();
    if job.is_some() {
        outliers_last(nodes, &mut scores);
    }
    scores
}

/// The scores as the answer carries them: every one lowered by the lowest, so the candidates
/// at the lowest score are left out of it. kube-scheduler adds `score × weight` to each node
/// the answer names (nothing to one it does not) and takes the highest total, so lowering
/// every candidate by the same amount keeps the ranking and the ties, and the answer is as
/// short as the scores allow (for 1,000 candidates of equal headroom, empty instead of 1,000
/// entries for kube-scheduler to decode).
pub fn shift_lowest_to_zero(scores: &mut [i64]) {
    let Some(&lowest) = scores.iter().min() else {
        return;
    };
    if lowest > 0 {
        for score in scores {
            *score -= lowest;
        }
    }
}

/// When an outlier is among the candidates: outliers score 0 (left out of the answer, so
/// kube-scheduler adds nothing for them) and every other candidate at least 1.
fn outliers_last(nodes: &[NodeSlot<'_>], scores: &mut [i64]) {
    if !nodes.iter().any(|s| s.fleet_outlier) {
        return;
    }
    for (slot, score) in nodes.iter().zip(scores) {
        *score = if slot.fleet_outlier {
            0
        } else {
            (*score).max(1)
        };
    }
}

fn headroom_points(
    node: &NodeFabric,
    profile: &FabricProfile,
    signature: &str,
    now: Timestamp,
) -> i64 {
    if check_node(node, profile, signature, now).is_err() {
        return 0;
    }
    let Some(cert) = node.state.certificate() else {
        return 0;
    };
    points_for_headroom(cert, profile)
}

/// Headroom points of a certificate that passes the profile.
pub(crate) fn points_for_headroom(cert: &Certificate, profile: &FabricProfile) -> i64 {
    let h = headroom(cert, profile).unwrap_or(0.0).max(0.0);
    // Truncation is intended: a point per full 2% of headroom.
    let points = (h / FULL_HEADROOM * HEADROOM_POINTS as f64).floor() as i64;
    points.clamp(0, HEADROOM_POINTS)
}

/// The topology ids a job's pods occupy, per key, most specific key first; only keys with at
/// least one id are kept, so a job with no placed pods costs nothing per node.
struct Occupied {
    /// `(rank, position, ids)`: rank is the key's position from the least specific (1) up,
    /// position where its id sits in a node's id slice, ids sorted.
    keys: Vec<(i64, usize, Vec<u32>)>,
    count: i64,
}

impl Occupied {
    fn new(job: &JobTopology<'_>) -> Self {
        let count = job.key_positions.len() as i64;
        let keys = job
            .key_positions
            .iter()
            .enumerate()
            .filter_map(|(i, position)| {
                let position = (*position)?;
                let mut ids: Vec<u32> = job
                    .peers
                    .iter()
                    .filter_map(|p| p.get(position).copied().flatten())
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                (!ids.is_empty()).then_some((count - i as i64, position, ids))
            })
            .collect();
        Occupied { keys, count }
    }

    fn locality_points(&self, topology: &[Option<u32>]) -> i64 {
        for (rank, position, ids) in &self.keys {
            if let Some(Some(id)) = topology.get(*position) {
                if ids.binary_search(id).is_ok() {
                    // Most specific key earns all points, the least specific still one or more.
                    return (LOCALITY_POINTS * rank + self.count - 1) / self.count;
                }
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use railguard_api::fleet::OutlierMark;
    use railguard_api::FabricState;

    use super::*;

    #[test]
    fn shifting_keeps_every_difference_and_zeroes_the_lowest() {
        let cases: [&[i64]; 5] = [&[], &[7], &[3, 5, 3, 10], &[0, 4, 9], &[10, 10, 10]];
        for case in cases {
            let mut shifted = case.to_vec();
            shift_lowest_to_zero(&mut shifted);
            if let Some(&lowest) = case.iter().min() {
                assert_eq!(shifted.iter().min(), Some(&0), "{case:?}");
                let offset = lowest.max(0);
                for (before, after) in case.iter().zip(&shifted) {
                    assert_eq!(before - after, offset, "{case:?} -> {shifted:?}");
                }
            } else {
                assert!(shifted.is_empty());
            }
        }
    }

    fn h100() -> FabricProfile {
        let text = include_str!("../../../api/fixtures/profiles/dgx-h100-ndr.yaml");
        railguard_api::profiles_from_yaml(text).unwrap().remove(0)
    }

    /// A node with no certificate (no headroom points) on `leaf`, marked an outlier or not.
    fn node(name: &str, leaf: &str, outlier: bool) -> NodeFabric {
        NodeFabric {
            name: name.into(),
            profile: None,
            signature: None,
            state: FabricState::Absent,
            labels: BTreeMap::from([(
                "network.topology.nvidia.com/leaf".to_string(),
                leaf.to_string(),
            )]),
            allocatable: BTreeMap::new(),
            fleet_outlier: outlier.then(|| OutlierMark {
                message: "rail mlx5_0:1 writeBwHost 326.4 Gb/s is 15.0% below the fleet median"
                    .into(),
            }),
        }
    }

    #[test]
    fn a_jobs_outliers_score_below_every_other_candidate() {
        let profile = h100();
        let target = PodTarget::Profile {
            signature: profile.spec.signature(),
            profile: &profile,
            exempt: false,
        };
        let config = ExtenderConfig::default();
        let peer = node("peer", "L1", false);
        let nodes = [
            node("near", "L1", false),
            node("far", "L9", false),
            node("near-outlier", "L1", true),
            node("far-outlier", "L9", true),
        ];
        let slots: Vec<NodeSlot<'_>> = nodes
            .iter()
            .map(|n| NodeSlot::new(&n.name, Some(n)))
            .collect();
        let scores = |slots: &[NodeSlot<'_>], job: Option<&[&NodeFabric]>| -> Vec<i64> {
            prioritize(&target, slots, job, Timestamp::UNIX_EPOCH, &config)
                .into_iter()
                .map(|(_, s)| s)
                .collect()
        };
        // A job with a placed pod: locality counts, outliers last even when near the job.
        assert_eq!(scores(&slots, Some(&[&peer])), [5, 1, 0, 0]);
        // The job's first pod: no locality, yet outliers still rank last.
        assert_eq!(scores(&slots, Some(&[])), [1, 1, 0, 0]);
        // Without an outlier among the candidates nothing is lifted to 1.
        assert_eq!(scores(&slots[..2], Some(&[&peer])), [5, 0]);
        // A pod of no job is not ranked by fleet marks.
        assert_eq!(scores(&slots, None), [0, 0, 0, 0]);
        // The slot's copied mark is what the interned path reads.
        let marked: Vec<NodeSlot<'_>> = slots
            .iter()
            .map(|s| NodeSlot {
                topology: &[],
                ..*s
            })
            .collect();
        let job = JobTopology::new(&[], &[], Vec::new());
        assert_eq!(
            prioritize_scores(&target, &marked, Some(&job), Timestamp::UNIX_EPOCH),
            [1, 1, 0, 0]
        );
        assert_eq!(
            prioritize_scores(&target, &marked, None, Timestamp::UNIX_EPOCH),
            [0, 0, 0, 0]
        );
    }
}
