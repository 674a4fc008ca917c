//! `/prioritize`: bandwidth headroom over the profile plus locality to the job's other pods.

use std::collections::HashSet;

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

/// Ranks candidate nodes 0..=10: bandwidth headroom over the profile (up to 5) plus
/// locality to the nodes already running the job's pods (`peers`; up to 5 for sharing the
/// most specific topology label value). Only nodes that pass the filter earn headroom points.
pub fn prioritize(
    target: &PodTarget<'_>,
    nodes: &[NodeSlot<'_>],
    peers: &[&NodeFabric],
    now: Timestamp,
    config: &ExtenderConfig,
) -> Vec<(String, i64)> {
    let PodTarget::Profile {
        profile, signature, ..
    } = target
    else {
        return nodes.iter().map(|s| (s.name.to_string(), 0)).collect();
    };
    let keys: &[String] = if profile.spec.topology_keys.is_empty() {
        &config.topology_keys
    } else {
        &profile.spec.topology_keys
    };
    let occupied = Occupied::new(keys, peers);
    nodes
        .iter()
        .map(|slot| {
            let score = slot.fabric.map_or(0, |node| {
                let headroom = match slot.precheck {
                    Some(pre) => pre.headroom_points(now),
                    None => headroom_points(node, profile, signature, now),
                };
                headroom + occupied.locality_points(node)
            });
            (slot.name.to_string(), score.clamp(0, MAX_EXTENDER_PRIORITY))
        })
        .collect()
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

/// The topology values a job's pods occupy, per key, most specific key first; only keys
/// with at least one value are kept, so a job with no placed pods costs nothing per node.
struct Occupied<'a> {
    /// `(rank, key, values)`: rank is the key's position from the least specific (1) up.
    keys: Vec<(
        i64,
        &'a str,
        HashSet<&'a str, hashbrown::DefaultHashBuilder>,
    )>,
    count: i64,
}

impl<'a> Occupied<'a> {
    fn new(keys: &'a [String], peers: &[&'a NodeFabric]) -> Self {
        let count = keys.len() as i64;
        let keys = keys
            .iter()
            .enumerate()
            .filter_map(|(i, key)| {
                let values: HashSet<&str, _> = peers
                    .iter()
                    .filter_map(|p| p.labels.get(key).map(String::as_str))
                    .collect();
                (!values.is_empty()).then_some((count - i as i64, key.as_str(), values))
            })
            .collect();
        Occupied { keys, count }
    }

    fn locality_points(&self, node: &NodeFabric) -> i64 {
        for (rank, key, values) in &self.keys {
            if let Some(v) = node.labels.get(*key) {
                if values.contains(v.as_str()) {
                    // Most specific key earns all points, the least specific still one or more.
                    return (LOCALITY_POINTS * rank + self.count - 1) / self.count;
                }
            }
        }
        0
    }
}
