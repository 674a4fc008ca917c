//! The merge rule of a Node's two certificate writers (pure).
//!
//! The prober writes its own run's results; the campaign coordinator writes cross-node
//! findings into the same certificate. The campaign's part is its [`NodeFindings`], kept in
//! the certificate under [`keys::CERTIFICATE_CAMPAIGN_KEY`], and the NCCL pair results
//! (`ncclPairs`). The prober builds each certificate from its own evidence, then carries the
//! campaign's part over from the certificate on the Node and re-applies the findings
//! ([`carry_campaign`]); the campaign merges its findings into the certificate on the Node
//! ([`merge_findings`]). Both write with the read's `resourceVersion` as a precondition, so
//! whichever writes second merges onto the first's result.

use railguard_api::certificate::NCCL_PAIRS_KEY;
use railguard_api::{keys, Certificate};

use crate::campaign::verdict::{apply_findings, NodeFindings};

/// The last campaign's findings stored in `cert` (`None` when no campaign wrote, or the entry
/// is unreadable: then nothing is re-applied and the next campaign replaces it).
pub fn campaign_findings(cert: &Certificate) -> Option<NodeFindings> {
    let v = cert.extra.get(keys::CERTIFICATE_CAMPAIGN_KEY)?;
    match serde_json::from_value(v.clone()) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(error = %e, "the certificate's campaign findings are unreadable; ignored");
            None
        }
    }
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
/// nothing).
pub fn merge_findings(cert: &mut Certificate, findings: &NodeFindings) {
    apply_findings(cert, findings);
    if says_nothing(findings) {
        cert.extra.remove(keys::CERTIFICATE_CAMPAIGN_KEY);
        return;
    }
    match serde_json::to_value(findings) {
        Ok(v) => {
            cert.extra
                .insert(keys::CERTIFICATE_CAMPAIGN_KEY.to_string(), v);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot encode campaign findings; not stored");
        }
    }
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
    use crate::campaign::verdict::{RailBlame, CAMPAIGN_REASON_PREFIX};
    use railguard_api::certificate::{NcclPairResult, WireResult};
    use railguard_api::{RailVerdict, Verdict};
    use std::collections::BTreeMap;

    fn cert(profile: &str, generation: u64) -> Certificate {
        let now = jiff::Timestamp::now();
        let mut c = two_rail_certificate(profile, now);
        c.generation = generation;
        c
    }

    // A certified certificate with two rails (the library's unit tests do not use the
    // simulator).
    fn two_rail_certificate(profile: &str, now: jiff::Timestamp) -> Certificate {
        let rail = |hca: &str| railguard_api::RailResult {
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
            version: railguard_api::certificate::CERTIFICATE_VERSION,
            generation: 1,
            issued_at: now,
            expires_at: now,
            profile: profile.into(),
            signature: "sig".into(),
            node: Some("a".into()),
            verdict: Verdict::Certified,
            usable_rails: None,
            reasons: vec![],
            rails: vec![rail("mlx5_0"), rail("mlx5_1")],
            gpus: vec![],
            nccl: None,
            findings: vec![],
            software: BTreeMap::new(),
            passive_checked_at: None,
            history: vec![],
            simulated: false,
            extra: BTreeMap::new(),
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
        merge_findings(&mut on_node, &blaming_mlx5_1());
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
        assert_eq!(rail.faults, vec![railguard_api::RailFault::Wire]);
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
        merge_findings(&mut on_node, &blaming_mlx5_1());
        merge_findings(
            &mut on_node,
            &NodeFindings {
                node: "a".into(),
                ..NodeFindings::default()
            },
        );
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
        merge_findings(&mut stale, &blaming_mlx5_1());
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
        );
        assert_eq!(c, before);
    }

    #[test]
    fn a_stale_snapshot_does_not_bring_back_cleared_campaign_blame() {
        // The prober's passive certificate starts from a snapshot taken while a campaign's
        // blame stood; the next campaign cleared it on the Node meanwhile.
        let mut snapshot = cert("p", 3);
        merge_findings(&mut snapshot, &blaming_mlx5_1());
        let mut on_node = snapshot.clone();
        merge_findings(&mut on_node, &NodeFindings::default());
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
        merge_findings(&mut c, &blaming_mlx5_1());
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
        assert_eq!(c.verdict, railguard_api::Verdict::Certified);
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
