//! The pure merge of a campaign's findings into a node's certificate.
//!
//! The campaign owns three things in a certificate: each rail's `wire` entries (replaced by
//! every campaign), reasons starting with [`CAMPAIGN_REASON_PREFIX`] (on the certificate and
//! on rails), and the verdict changes those reasons cause. Everything else (the certifier's
//! results, reasons, history, fields this version does not know) is kept as is, and a node
//! that a previous campaign failed gets its certifier's verdict back once the campaign clears
//! it.

use std::collections::BTreeMap;

use railguard_api::certificate::{NcclPairResult, WireResult};
use railguard_api::{Certificate, RailFault, RailVerdict, Verdict};
use serde::{Deserialize, Serialize};

/// Reasons written by a campaign start with this.
pub const CAMPAIGN_REASON_PREFIX: &str = "campaign: ";

/// A rail of this node that the campaign blames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailBlame {
    /// `Degraded` when the writes ran but too slowly, `Failed` when they did not get through.
    pub verdict: RailVerdict,
    pub reason: String,
}

/// What one campaign found about one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFindings {
    pub node: String,
    /// Wire entries per rail (`hca:port`), one per conclusive test with a peer.
    pub wire: BTreeMap<String, Vec<WireResult>>,
    /// Rails (`hca:port`) the campaign blames on this node.
    pub blamed_rails: BTreeMap<String, RailBlame>,
    /// Set when every rail is blamed: the node itself is the culprit.
    pub node_fault: Option<String>,
    /// Links from this node found (or suspected) bad; informational, the node keeps its verdict.
    pub links: Vec<String>,
    /// The NCCL pair results with peers, when the campaign ran NCCL pair tests (they replace
    /// the certificate's; `None` keeps them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_pairs: Option<Vec<NcclPairResult>>,
    /// NCCL pair scopes blamed on this node: `node` (the full-node test, or every scope) or a
    /// rail's `hca:port`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nccl_blamed: BTreeMap<String, RailBlame>,
}

impl NodeFindings {
    pub fn blames_node(&self) -> bool {
        self.node_fault.is_some() || !self.blamed_rails.is_empty() || !self.nccl_blamed.is_empty()
    }
}

fn is_campaign(reason: &str) -> bool {
    reason.starts_with(CAMPAIGN_REASON_PREFIX)
}

fn with_prefix(reason: &str) -> String {
    if is_campaign(reason) {
        reason.to_string()
    } else {
        format!("{CAMPAIGN_REASON_PREFIX}{reason}")
    }
}

fn rank(v: RailVerdict) -> u8 {
    match v {
        RailVerdict::Healthy => 0,
        RailVerdict::Degraded => 1,
        RailVerdict::Failed => 2,
    }
}

/// Merges `findings` into `cert`. Idempotent: applying the same findings twice changes nothing.
pub fn apply_findings(cert: &mut Certificate, findings: &NodeFindings) {
    // What the certifier alone said, before any campaign.
    let only_campaign_made_it_bad = matches!(cert.verdict, Verdict::Degraded | Verdict::Failed)
        && !cert.reasons.is_empty()
        && cert.reasons.iter().all(|r| is_campaign(r));
    cert.reasons.retain(|r| !is_campaign(r));
    let mut base = if only_campaign_made_it_bad {
        Verdict::Certified
    } else {
        cert.verdict
    };

    // The worst blame on the node as a whole (the full-node NCCL test, unlisted rails, a
    // node fault); blames of listed rails decide through the rails themselves.
    let mut worst = RailVerdict::Healthy;
    for rail in &mut cert.rails {
        let id = rail.id();
        let campaign_only = rail.verdict != RailVerdict::Healthy
            && !rail.reasons.is_empty()
            && rail.reasons.iter().all(|r| is_campaign(r));
        rail.reasons.retain(|r| !is_campaign(r));
        rail.faults.retain(|f| *f != RailFault::Wire);
        if campaign_only {
            rail.verdict = RailVerdict::Healthy;
            rail.faults.clear();
        }
        rail.wire = findings.wire.get(&id).cloned().unwrap_or_default();
        for blame in [
            findings.blamed_rails.get(&id),
            findings.nccl_blamed.get(&id),
        ]
        .into_iter()
        .flatten()
        {
            if rank(blame.verdict) > rank(rail.verdict) {
                rail.verdict = blame.verdict;
            }
            if blame.verdict == RailVerdict::Failed && !rail.faults.contains(&RailFault::Wire) {
                rail.faults.push(RailFault::Wire);
            }
            rail.reasons.push(with_prefix(&blame.reason));
        }
    }
    let rails_failed = cert
        .rails
        .iter()
        .filter(|r| r.verdict == RailVerdict::Failed)
        .count();
    let rails_degraded = cert
        .rails
        .iter()
        .any(|r| r.verdict == RailVerdict::Degraded);
    let usable = cert.rails.len() - rails_failed;
    if let Some(pairs) = &findings.nccl_pairs {
        cert.set_nccl_pairs(pairs);
    }
    // The full-node NCCL test, and NCCL blame of rails the certificate does not list.
    for (scope, blame) in &findings.nccl_blamed {
        let on_no_listed_rail = scope == "node" || !cert.rails.iter().any(|r| &r.id() == scope);
        if on_no_listed_rail && rank(blame.verdict) > rank(worst) {
            worst = blame.verdict;
        }
        cert.reasons.push(with_prefix(&blame.reason));
    }
    // Blamed rails the certificate does not list still name the culprit.
    for (id, blame) in &findings.blamed_rails {
        if !cert.rails.iter().any(|r| &r.id() == id) && rank(blame.verdict) > rank(worst) {
            worst = blame.verdict;
        }
        cert.reasons.push(with_prefix(&blame.reason));
    }
    if let Some(reason) = &findings.node_fault {
        cert.reasons.push(with_prefix(reason));
        worst = RailVerdict::Failed;
    }
    for link in &findings.links {
        cert.reasons.push(with_prefix(link));
    }
    // A pending certification stays pending: its run decides, the campaign only adds evidence.
    // As the certifier judges: a failed rail with others usable leaves the node degraded
    // (it serves on the others), no usable rail or a node-wide blame fails it.
    if base != Verdict::Pending {
        base = match (base, worst) {
            (Verdict::Failed, _) | (_, RailVerdict::Failed) => Verdict::Failed,
            _ if rails_failed > 0 && usable == 0 => Verdict::Failed,
            _ if rails_failed > 0 || rails_degraded => Verdict::Degraded,
            (_, RailVerdict::Degraded) => Verdict::Degraded,
            (b, RailVerdict::Healthy) => b,
        };
    }
    // Recorded where the certifier recorded it or the campaign took rails away (findings
    // that say nothing leave the certificate as it was).
    if base != Verdict::Pending && (cert.usable_rails.is_some() || usable < cert.rails.len()) {
        cert.usable_rails = Some(usable as u32);
    }
    cert.verdict = base;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use railguard_api::certificate::CERTIFICATE_VERSION;
    use railguard_api::RailResult;

    fn cert() -> Certificate {
        let rail = |hca: &str| RailResult {
            hca: hca.into(),
            port: 1,
            pci_address: None,
            sriov_vfs: Vec::new(),
            faults: Vec::new(),
            link_layer: None,
            state: "ACTIVE".into(),
            rate_gbps: Some(400.0),
            write_bw_host_gbps: Some(390.0),
            write_bw_gpu_gbps: None,
            latency_us: Some(2.0),
            gid_index: None,
            counter_deltas: BTreeMap::new(),
            verdict: RailVerdict::Healthy,
            reasons: vec![],
            wire: vec![],
            gpu_memory: None,
            passive_hold: None,
        };
        Certificate {
            version: CERTIFICATE_VERSION,
            generation: 3,
            issued_at: "2026-01-01T00:00:00Z".parse().unwrap(),
            expires_at: "2026-01-02T00:00:00Z".parse().unwrap(),
            profile: "p".into(),
            signature: "sig".into(),
            node: Some("a".into()),
            verdict: Verdict::Certified,
            usable_rails: None,
            reasons: vec![],
            rails: vec![rail("mlx5_0"), rail("mlx5_1")],
            gpus: vec![],
            nccl: None,
            findings: vec![],
            software: BTreeMap::from([("driver".into(), "550".into())]),
            passive_checked_at: None,
            history: vec![],
            simulated: false,
            extra: BTreeMap::from([("future".into(), serde_json::json!(1))]),
        }
    }

    fn wire(peer: &str, ok: bool) -> WireResult {
        WireResult {
            peer: peer.into(),
            write_bw_gbps: Some(if ok { 390.0 } else { 190.0 }),
            latency_us: Some(2.5),
            ok,
            tested_at: None,
            note: None,
        }
    }

    #[test]
    fn healthy_findings_add_wire_entries_and_keep_everything_else() {
        let mut c = cert();
        let f = NodeFindings {
            node: "a".into(),
            wire: BTreeMap::from([("mlx5_0:1".into(), vec![wire("b", true), wire("c", true)])]),
            ..Default::default()
        };
        apply_findings(&mut c, &f);
        assert_eq!(c.verdict, Verdict::Certified);
        assert!(c.reasons.is_empty());
        assert_eq!(c.rails[0].wire.len(), 2);
        assert!(c.rails[1].wire.is_empty());
        assert_eq!(c.generation, 3);
        assert_eq!(c.extra["future"], 1);
        assert_eq!(c.software["driver"], "550");
    }

    #[test]
    fn blamed_rail_degrades_then_a_clean_campaign_restores() {
        let mut c = cert();
        let f = NodeFindings {
            node: "a".into(),
            blamed_rails: BTreeMap::from([(
                "mlx5_1:1".into(),
                RailBlame {
                    verdict: RailVerdict::Degraded,
                    reason: "rail mlx5_1:1 degraded with 2 healthy peers".into(),
                },
            )]),
            ..Default::default()
        };
        apply_findings(&mut c, &f);
        assert_eq!(c.verdict, Verdict::Degraded);
        assert_eq!(c.rails[1].verdict, RailVerdict::Degraded);
        assert_eq!(
            c.rails[1].reasons,
            vec!["campaign: rail mlx5_1:1 degraded with 2 healthy peers"]
        );
        assert!(c.reasons.iter().any(|r| r.contains("mlx5_1:1")));
        let once = c.clone();
        apply_findings(&mut c, &f);
        assert_eq!(c, once, "idempotent");

        apply_findings(
            &mut c,
            &NodeFindings {
                node: "a".into(),
                ..Default::default()
            },
        );
        assert_eq!(c.verdict, Verdict::Certified);
        assert_eq!(c.rails[1].verdict, RailVerdict::Healthy);
        assert!(c.reasons.is_empty() && c.rails[1].reasons.is_empty());
    }

    #[test]
    fn certifier_failure_is_never_cleared_by_a_campaign() {
        let mut c = cert();
        c.verdict = Verdict::Failed;
        c.reasons = vec!["rail mlx5_0:1: write bandwidth 100 < 360".into()];
        apply_findings(
            &mut c,
            &NodeFindings {
                node: "a".into(),
                ..Default::default()
            },
        );
        assert_eq!(c.verdict, Verdict::Failed);
        assert_eq!(c.reasons.len(), 1);
    }

    #[test]
    fn node_fault_fails_and_links_only_inform() {
        let mut c = cert();
        apply_findings(
            &mut c,
            &NodeFindings {
                node: "a".into(),
                links: vec!["link a<->b on mlx5_0:1 failed".into()],
                ..Default::default()
            },
        );
        assert_eq!(c.verdict, Verdict::Certified);
        assert_eq!(c.reasons, vec!["campaign: link a<->b on mlx5_0:1 failed"]);

        let mut c = cert();
        apply_findings(
            &mut c,
            &NodeFindings {
                node: "a".into(),
                node_fault: Some("node failed on every rail".into()),
                ..Default::default()
            },
        );
        assert_eq!(c.verdict, Verdict::Failed);
    }

    #[test]
    fn nccl_pair_results_are_stored_and_blame_degrades_a_rail_or_the_node() {
        let mut c = cert();
        let pair = NcclPairResult {
            peer: "b".into(),
            rail: Some("mlx5_1:1".into()),
            busbw_gbps: Some(20.0),
            algbw_gbps: Some(20.0),
            transport: Some(railguard_api::Transport::Ib),
            gdr: Some(true),
            wrong: Some(0),
            hcas: vec!["mlx5_1:1".into()],
            ok: false,
            tested_at: None,
            note: Some("busbw 20 GB/s".into()),
        };
        let f = NodeFindings {
            node: "a".into(),
            nccl_pairs: Some(vec![pair.clone()]),
            nccl_blamed: BTreeMap::from([(
                "mlx5_1:1".into(),
                RailBlame {
                    verdict: RailVerdict::Degraded,
                    reason: "NCCL pair test (mlx5_1:1) below its busbw minimum".into(),
                },
            )]),
            ..Default::default()
        };
        apply_findings(&mut c, &f);
        assert_eq!(c.nccl_pairs(), vec![pair]);
        assert_eq!(c.verdict, Verdict::Degraded);
        assert_eq!(c.rails[1].verdict, RailVerdict::Degraded);
        let once = c.clone();
        apply_findings(&mut c, &f);
        assert_eq!(c, once, "idempotent");
        let back = Certificate::from_annotation(&c.to_annotation().unwrap()).unwrap();
        assert_eq!(back.nccl_pairs(), c.nccl_pairs(), "survives the annotation");

        // A campaign without NCCL tests keeps the results; the full-node blame fails.
        let f = NodeFindings {
            node: "a".into(),
            nccl_blamed: BTreeMap::from([(
                "node".into(),
                RailBlame {
                    verdict: RailVerdict::Failed,
                    reason: "NCCL pair test (node) failed with 2 healthy peers".into(),
                },
            )]),
            ..Default::default()
        };
        apply_findings(&mut c, &f);
        assert_eq!(c.verdict, Verdict::Failed);
        assert_eq!(c.rails[1].verdict, RailVerdict::Healthy);
        assert_eq!(c.nccl_pairs().len(), 1);
        apply_findings(
            &mut c,
            &NodeFindings {
                node: "a".into(),
                nccl_pairs: Some(vec![]),
                ..Default::default()
            },
        );
        assert_eq!(c.verdict, Verdict::Certified);
        assert!(c.nccl_pairs().is_empty() && !c.extra.contains_key("ncclPairs"));
    }

    #[test]
    fn pending_stays_pending() {
        let mut c = cert();
        c.verdict = Verdict::Pending;
        let f = NodeFindings {
            node: "a".into(),
            node_fault: Some("dead".into()),
            ..Default::default()
        };
        apply_findings(&mut c, &f);
        assert_eq!(c.verdict, Verdict::Pending);
    }

    #[test]
    fn a_rail_failed_on_the_wire_degrades_the_node_and_every_rail_failed_fails_it() {
        let blame = |ids: &[&str]| NodeFindings {
            node: "a".into(),
            blamed_rails: ids
                .iter()
                .map(|id| {
                    (
                        id.to_string(),
                        RailBlame {
                            verdict: RailVerdict::Failed,
                            reason: format!("rail {id} failed with 2 healthy peers"),
                        },
                    )
                })
                .collect(),
            ..Default::default()
        };
        let mut c = cert();
        let n = c.rails.len();
        apply_findings(&mut c, &blame(&["mlx5_0:1"]));
        assert_eq!(c.verdict, Verdict::Degraded);
        assert_eq!(c.usable_rails, Some(n as u32 - 1));
        assert_eq!(c.rails[0].faults, vec![RailFault::Wire]);
        // Idempotent, and a clean campaign gives the rail back.
        let once = c.clone();
        apply_findings(&mut c, &blame(&["mlx5_0:1"]));
        assert_eq!(c, once);
        apply_findings(&mut c, &NodeFindings::default());
        assert_eq!(c.verdict, Verdict::Certified);
        assert!(c.rails[0].faults.is_empty());

        let mut c = cert();
        let all: Vec<String> = c.rails.iter().map(|r| r.id()).collect();
        let ids: Vec<&str> = all.iter().map(String::as_str).collect();
        apply_findings(&mut c, &blame(&ids));
        assert_eq!(c.verdict, Verdict::Failed);
        assert_eq!(c.usable_rails, Some(0));
    }
}
