//! The pure half of the coordinator: whether a rail passed, and what the tests and the
//! localization say about each node.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use railguard_api::certificate::WireResult;
use railguard_api::RailVerdict;

use super::{CampaignNode, Limits, TestRecord};
use crate::plan::{Localization, NodeIx, RailOutcome};
use crate::wire::{RailRef, RailReport};
use railguard_api::campaign_findings::{NodeFindings, RailBlame};
use railguard_prober::nccl::round2;

/// Whether one rail's report passes the limits.
pub fn judge(report: &RailReport, limits: &Limits) -> RailOutcome {
    match report {
        RailReport::Measured {
            bw_gbps,
            latency_us,
        } => {
            let slow = !bw_gbps.is_finite() || *bw_gbps < limits.min_bw_gbps;
            let late = limits
                .max_latency_us
                .is_some_and(|max| !latency_us.is_finite() || *latency_us > max);
            if slow || late {
                RailOutcome::Fail
            } else {
                RailOutcome::Pass
            }
        }
        RailReport::Failed { .. } => RailOutcome::Fail,
        RailReport::Inconclusive { .. } => RailOutcome::Inconclusive,
    }
}

fn describe(report: &RailReport) -> String {
    match report {
        RailReport::Measured {
            bw_gbps,
            latency_us,
        } => format!("{bw_gbps:.1} Gb/s, {latency_us:.2} us"),
        RailReport::Failed { reason } | RailReport::Inconclusive { reason } => reason.clone(),
    }
}

/// Turns the tests and the localization into findings per node (pure).
pub fn findings(
    nodes: &[CampaignNode],
    rails: &[RailRef],
    limits: &Limits,
    records: &[TestRecord],
    loc: &Localization,
    now: Timestamp,
) -> BTreeMap<String, NodeFindings> {
    let ix: HashMap<&str, NodeIx> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut out: BTreeMap<String, NodeFindings> = nodes
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                NodeFindings {
                    node: n.name.clone(),
                    ..Default::default()
                },
            )
        })
        .collect();
    // The last conclusive report per (node pair, rail).
    let mut pair_reports: HashMap<(NodeIx, NodeIx, usize), &RailReport> = HashMap::new();
    for rec in records {
        let (Some(&a), Some(&b)) = (
            ix.get(rec.initiator.as_str()),
            ix.get(rec.responder.as_str()),
        ) else {
            continue;
        };
        for (r, rr) in rec.rails.iter().enumerate() {
            if rr.outcome == RailOutcome::Inconclusive {
                continue;
            }
            pair_reports.insert((a.min(b), a.max(b), r), &rr.report);
            let (bw, lat) = match rr.report {
                RailReport::Measured {
                    bw_gbps,
                    latency_us,
                } => (Some(round2(bw_gbps)), Some(round2(latency_us))),
                _ => (None, None),
            };
            let note = match &rr.report {
                RailReport::Failed { reason } => Some(reason.clone()),
                RailReport::Measured { .. } if rr.outcome == RailOutcome::Fail => {
                    Some(format!("below limits (>= {} Gb/s)", limits.min_bw_gbps))
                }
                _ => None,
            };
            // When the initiator's endpoint could not run the test at all, the responder's
            // rails were never exercised: only the initiator's certificate records it.
            let sides: &[(&String, &String)] = if rec.error.is_some() {
                &[(&rec.initiator, &rec.responder)]
            } else {
                &[
                    (&rec.initiator, &rec.responder),
                    (&rec.responder, &rec.initiator),
                ]
            };
            for &(me, peer) in sides {
                if let Some(f) = out.get_mut(me.as_str()) {
                    let list = f.wire.entry(rails[r].id()).or_default();
                    list.retain(|w| &w.peer != peer);
                    list.push(WireResult {
                        peer: peer.clone(),
                        write_bw_gbps: bw,
                        latency_us: lat,
                        ok: rr.outcome == RailOutcome::Pass,
                        tested_at: Some(now),
                        note: note.clone(),
                    });
                }
            }
        }
    }
    let report_of =
        |a: NodeIx, b: NodeIx, r: usize| pair_reports.get(&(a.min(b), a.max(b), r)).copied();
    for (&(n, r), peers) in &loc.rail_faults {
        let evidence: Vec<String> = peers
            .iter()
            .map(|&p| {
                let what = report_of(n, p, r).map(describe).unwrap_or_default();
                format!("{} ({what})", nodes[p].name)
            })
            .collect();
        let measured = peers
            .iter()
            .all(|&p| matches!(report_of(n, p, r), Some(RailReport::Measured { .. })));
        let (verdict, word) = if measured {
            (RailVerdict::Degraded, "degraded")
        } else {
            (RailVerdict::Failed, "failed")
        };
        let id = rails[r].id();
        let reason = format!(
            "rail {id} {word} with {} healthy peers: {} (expected >= {} Gb/s)",
            peers.len(),
            evidence.join(", "),
            limits.min_bw_gbps
        );
        if let Some(f) = out.get_mut(&nodes[n].name) {
            f.blamed_rails.insert(id, RailBlame { verdict, reason });
        }
    }
    for &n in &loc.node_faults {
        let peers: std::collections::BTreeSet<&str> = loc
            .rail_faults
            .iter()
            .filter(|((m, _), _)| *m == n)
            .flat_map(|(_, ps)| ps.iter().map(|&p| nodes[p].name.as_str()))
            .collect();
        if let Some(f) = out.get_mut(&nodes[n].name) {
            f.node_fault = Some(format!(
                "node failed on every rail with healthy peers ({}): the node, not a rail or cable",
                peers.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    for &(a, b, r) in &loc.link_faults {
        let what = report_of(a, b, r).map(describe).unwrap_or_default();
        let reason = format!(
            "link {}<->{} on {} failed ({what}) while both ends passed with other peers: cable or switch port",
            nodes[a].name,
            nodes[b].name,
            rails[r].id()
        );
        note_link(&mut out, nodes, [a, b], &reason);
    }
    for &(a, b, r) in &loc.suspect_links {
        let reason = format!(
            "link {}<->{} on {} suspect: failed with one peer only, unconfirmed",
            nodes[a].name,
            nodes[b].name,
            rails[r].id()
        );
        note_link(&mut out, nodes, [a, b], &reason);
    }
    out
}

/// Notes `reason` about a link on both its ends.
fn note_link(
    out: &mut BTreeMap<String, NodeFindings>,
    nodes: &[CampaignNode],
    ends: [NodeIx; 2],
    reason: &str,
) {
    for n in ends {
        if let Some(f) = out.get_mut(&nodes[n].name) {
            f.links.push(reason.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn judge_applies_limits() {
        let l = Limits {
            min_bw_gbps: 360.0,
            max_latency_us: Some(5.0),
        };
        let m = |bw, lat| RailReport::Measured {
            bw_gbps: bw,
            latency_us: lat,
        };
        assert_eq!(judge(&m(380.0, 2.0), &l), RailOutcome::Pass);
        assert_eq!(judge(&m(190.0, 2.0), &l), RailOutcome::Fail);
        assert_eq!(judge(&m(380.0, 9.0), &l), RailOutcome::Fail);
        assert_eq!(judge(&m(f64::NAN, 2.0), &l), RailOutcome::Fail);
        assert_eq!(
            judge(&RailReport::Failed { reason: "x".into() }, &l),
            RailOutcome::Fail
        );
        assert_eq!(
            judge(&RailReport::Inconclusive { reason: "x".into() }, &l),
            RailOutcome::Inconclusive
        );
        let no_lat = Limits {
            max_latency_us: None,
            ..l
        };
        assert_eq!(judge(&m(380.0, 90.0), &no_lat), RailOutcome::Pass);
    }
}
