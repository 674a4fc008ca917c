//! What a campaign found about a node, and the pure merge of those findings into the node's
//! certificate: the rule both of a Node's certificate writers follow.
//!
//! The campaign owns three things in a certificate: each rail's `wire` entries (replaced by
//! every campaign), reasons starting with [`CAMPAIGN_REASON_PREFIX`] (on the certificate and
//! on rails), and the verdict changes those reasons cause. Everything else (the certifier's
//! results, reasons, history, fields this version does not know) is kept as is, and a node
//! that a previous campaign failed gets its certifier's verdict back once the campaign clears
//! it.
//!
//! The prober writes its own run's results; the campaign coordinator writes cross-node
//! findings into the same certificate. The campaign's part is its [`NodeFindings`], kept in
//! the certificate under [`keys::CERTIFICATE_CAMPAIGN_KEY`], and the NCCL pair results
//! (`ncclPairs`). The prober builds each certificate from its own evidence, then carries the
//! campaign's part over from the certificate on the Node and re-applies the findings
//! ([`carry_campaign`]); the campaign merges its findings into the certificate on the Node
//! ([`merge_findings`]). Both write with the read's `resourceVersion` as a precondition, so
//! whichever writes second merges onto the first's result.

use std::collections::BTreeMap;

use crate::certificate::{NcclPairResult, WireResult, NCCL_PAIRS_KEY};
use crate::{keys, Certificate, RailFault, RailVerdict, Verdict};
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

/// The last campaign's findings stored in `cert` (`None` when no campaign wrote, or the entry
/// is unreadable: then nothing is re-applied and the next campaign replaces it).
pub fn campaign_findings(cert: &Certificate) -> Option<NodeFindings> {
    stored_campaign_findings(cert).ok().flatten()
}

/// The stored findings, or why they cannot be read (for the caller's log: an unreadable
/// entry is then treated as none).
pub fn stored_campaign_findings(
    cert: &Certificate,
) -> Result<Option<NodeFindings>, serde_json::Error> {
    cert.extra
        .get(keys::CERTIFICATE_CAMPAIGN_KEY)
        .map(|v| serde_json::from_value(v.clone()))
        .transpose()
}

/// Findings that say nothing about the node (no test with a peer, no blame): a node whose
/// endpoint proved nothing keeps its certificate as it was.
fn says_nothing(f: &NodeFindings) -> bool {
    f.wire.is_empty()
        && f.blamed_rails.is_empty()
        && f.node_fault.is_none()
        && f.links.is_empty()
        && f.nccl_pairs.is_none()
        && f.nccl_blamed.is_empty()
}

/// The campaign's side: merges `findings` into `cert` and stores them, so the prober's next
/// certificate carries them (findings that say nothing are not stored: they would change
/// nothing). The findings are applied even when they cannot be encoded; the error says
/// they were not stored.
pub fn merge_findings(
    cert: &mut Certificate,
    findings: &NodeFindings,
) -> Result<(), serde_json::Error> {
    apply_findings(cert, findings);
    if says_nothing(findings) {
        cert.extra.remove(keys::CERTIFICATE_CAMPAIGN_KEY);
        return Ok(());
    }
    let v = serde_json::to_value(findings)?;
    cert.extra
        .insert(keys::CERTIFICATE_CAMPAIGN_KEY.to_string(), v);
    Ok(())
}

/// The prober's side: `cert` (built from this run's evidence) takes the campaign's part of
/// `on_node`, the certificate on the Node now, and the stored findings are applied to it.
/// A certificate for another profile has other rails: nothing is carried, the next campaign
/// of the new profile writes its own.
pub fn carry_campaign(cert: &mut Certificate, on_node: Option<&Certificate>) {
    let Some(on_node) = on_node.filter(|c| c.profile == cert.profile) else {
        return;
    };
    for key in [keys::CERTIFICATE_CAMPAIGN_KEY, NCCL_PAIRS_KEY] {
        match on_node.extra.get(key) {
            Some(v) => {
                cert.extra.insert(key.to_string(), v.clone());
            }
            None => {
                cert.extra.remove(key);
            }
        }
    }
    // Without stored findings the campaign's part is empty: what `cert` brought from an
    // older snapshot (wire entries, campaign reasons) is cleared, as the campaign cleared it.
    let findings = campaign_findings(cert).unwrap_or_default();
    apply_findings(cert, &findings);
}

/// The fabric label the campaign writes: a node that its prober marked `pending` stays
/// pending (its run decides, and no job may land mid-test); otherwise the merged verdict
/// as of `now` (an expired certification stays `pending`, [`Certificate::fabric_label`]).
pub fn campaign_fabric_label(
    current: Option<&str>,
    merged: &Certificate,
    now: jiff::Timestamp,
) -> &'static str {
    if current == Some(keys::fabric::PENDING) {
        keys::fabric::PENDING
    } else {
        merged.fabric_label(now)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::certificate::CERTIFICATE_VERSION;
    use crate::RailResult;

    pub(super) fn cert() -> Certificate {
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
            renewal: None,
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
            transport: Some(crate::Transport::Ib),
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

#[cfg(test)]
mod merge_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::certificate::{NcclPairResult, WireResult};
    use crate::{RailVerdict, Verdict};
    use std::collections::BTreeMap;

    fn cert(profile: &str, generation: u64) -> Certificate {
        let now = jiff::Timestamp::now();
        let mut c = two_rail_certificate(profile, now);
        c.generation = generation;
        c
    }

    // A certified certificate with two rails (the library's unit tests do not use the
    // simulator): the findings tests' one, issued and expiring `now`, without extras.
    fn two_rail_certificate(profile: &str, now: jiff::Timestamp) -> Certificate {
        Certificate {
            generation: 1,
            issued_at: now,
            expires_at: now,
            profile: profile.into(),
            software: BTreeMap::new(),
            extra: BTreeMap::new(),
            ..super::tests::cert()
        }
    }

    fn blaming_mlx5_1() -> NodeFindings {
        NodeFindings {
            node: "a".into(),
            wire: BTreeMap::from([(
                "mlx5_0:1".to_string(),
                vec![WireResult {
                    peer: "b".into(),
                    write_bw_gbps: Some(390.0),
                    latency_us: Some(2.0),
                    ok: true,
                    tested_at: None,
                    note: None,
                }],
            )]),
            blamed_rails: BTreeMap::from([(
                "mlx5_1:1".to_string(),
                RailBlame {
                    verdict: RailVerdict::Failed,
                    reason: "rail mlx5_1:1 failed with b and c".into(),
                },
            )]),
            nccl_pairs: Some(vec![NcclPairResult {
                peer: "b".into(),
                rail: None,
                busbw_gbps: Some(350.0),
                algbw_gbps: None,
                transport: None,
                gdr: None,
                wrong: None,
                hcas: vec![],
                ok: true,
                tested_at: None,
                note: None,
            }]),
            ..NodeFindings::default()
        }
    }

    #[test]
    fn the_probers_new_certificate_keeps_the_campaigns_findings() {
        let mut on_node = cert("p", 3);
        merge_findings(&mut on_node, &blaming_mlx5_1()).unwrap();
        // One of two rails failed on the wire: the node serves on the other.
        assert_eq!(on_node.verdict, Verdict::Degraded);
        assert_eq!(on_node.usable_rails, Some(1));
        // The prober's next run knows nothing of the campaign; the merge brings it back.
        let mut next = cert("p", 4);
        carry_campaign(&mut next, Some(&on_node));
        assert_eq!(next.generation, 4, "the prober's own result stays");
        assert_eq!(next.verdict, Verdict::Degraded);
        let rail = next.rail("mlx5_1", 1).unwrap();
        assert_eq!(rail.verdict, RailVerdict::Failed);
        assert_eq!(rail.faults, vec![crate::RailFault::Wire]);
        assert!(rail.reasons[0].starts_with(CAMPAIGN_REASON_PREFIX));
        assert_eq!(next.rail("mlx5_0", 1).unwrap().wire.len(), 1);
        assert_eq!(next.nccl_pairs().len(), 1);
        assert_eq!(campaign_findings(&next), Some(blaming_mlx5_1()));
        // Idempotent: carrying twice changes nothing.
        let again = next.clone();
        carry_campaign(&mut next, Some(&again));
        assert_eq!(next, again);
    }

    #[test]
    fn a_campaign_that_clears_the_node_gives_the_probers_verdict_back() {
        let mut on_node = cert("p", 3);
        merge_findings(&mut on_node, &blaming_mlx5_1()).unwrap();
        merge_findings(
            &mut on_node,
            &NodeFindings {
                node: "a".into(),
                ..NodeFindings::default()
            },
        )
        .unwrap();
        assert_eq!(on_node.verdict, Verdict::Certified);
        let mut next = cert("p", 4);
        next.verdict = Verdict::Degraded;
        next.reasons = vec!["nccl busbw below the threshold".into()];
        carry_campaign(&mut next, Some(&on_node));
        assert_eq!(next.verdict, Verdict::Degraded, "the prober's own verdict");
        assert!(campaign_findings(&next).is_none());
    }

    #[test]
    fn nothing_is_carried_without_a_campaign_or_across_profiles() {
        let mut stale = cert("p", 4);
        merge_findings(&mut stale, &blaming_mlx5_1()).unwrap();
        // The node's certificate has no campaign part (none wrote): a stale one is dropped.
        let mut next = stale.clone();
        carry_campaign(&mut next, Some(&cert("p", 3)));
        assert!(campaign_findings(&next).is_none());
        assert!(next.nccl_pairs().is_empty());
        // Another profile's findings are not applied to this profile's rails.
        let mut other = cert("q", 1);
        carry_campaign(&mut other, Some(&stale));
        assert!(other.extra.is_empty());
        assert_eq!(other.verdict, Verdict::Certified);
        // No certificate on the node: nothing to carry.
        let mut fresh = cert("p", 1);
        let before = fresh.clone();
        carry_campaign(&mut fresh, None);
        assert_eq!(fresh.extra, before.extra);
    }

    #[test]
    fn findings_that_say_nothing_leave_the_certificate_as_it_was() {
        let mut c = cert("p", 1);
        let before = c.clone();
        merge_findings(
            &mut c,
            &NodeFindings {
                node: "a".into(),
                ..NodeFindings::default()
            },
        )
        .unwrap();
        assert_eq!(c, before);
    }

    #[test]
    fn a_stale_snapshot_does_not_bring_back_cleared_campaign_blame() {
        // The prober's passive certificate starts from a snapshot taken while a campaign's
        // blame stood; the next campaign cleared it on the Node meanwhile.
        let mut snapshot = cert("p", 3);
        merge_findings(&mut snapshot, &blaming_mlx5_1()).unwrap();
        let mut on_node = snapshot.clone();
        merge_findings(&mut on_node, &NodeFindings::default()).unwrap();
        let mut next = snapshot.clone();
        next.generation = 4;
        carry_campaign(&mut next, Some(&on_node));
        assert_eq!(next.verdict, Verdict::Certified);
        assert!(next.reasons.is_empty(), "{:?}", next.reasons);
        let rail = next.rail("mlx5_1", 1).unwrap();
        assert_eq!(rail.verdict, RailVerdict::Healthy);
        assert!(rail.reasons.is_empty());
        assert!(next.rails.iter().all(|r| r.wire.is_empty()));
        assert!(campaign_findings(&next).is_none());
    }

    #[test]
    fn a_pending_node_stays_pending_under_the_campaigns_label() {
        let mut c = cert("p", 1);
        merge_findings(&mut c, &blaming_mlx5_1()).unwrap();
        assert_eq!(
            campaign_fabric_label(Some(keys::fabric::PENDING), &c, c.issued_at),
            keys::fabric::PENDING
        );
        assert_eq!(
            campaign_fabric_label(Some(keys::fabric::CERTIFIED), &c, c.issued_at),
            keys::fabric::DEGRADED
        );
        assert_eq!(
            campaign_fabric_label(None, &c, c.issued_at),
            keys::fabric::DEGRADED
        );
    }

    #[test]
    fn an_expired_certification_is_labelled_pending_by_the_campaign_too() {
        let mut c = cert("p", 1);
        c.expires_at = c.issued_at + jiff::SignedDuration::from_hours(24);
        assert_eq!(c.verdict, crate::Verdict::Certified);
        assert_eq!(
            campaign_fabric_label(Some(keys::fabric::CERTIFIED), &c, c.issued_at),
            keys::fabric::CERTIFIED
        );
        assert_eq!(
            campaign_fabric_label(Some(keys::fabric::CERTIFIED), &c, c.expires_at),
            keys::fabric::PENDING
        );
    }
}
