//! Turning an [`Assessment`] into the [`Certificate`] stored on the Node.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use railguard_api::certificate::HistoryEntry;
use railguard_api::{Certificate, FabricProfileSpec, GpuAffinity, Verdict};

use super::policy::Assessment;

/// Who and what a certificate is for.
#[derive(Clone, Debug)]
pub struct Subject<'a> {
    pub node: &'a str,
    pub profile_name: &'a str,
    pub profile: &'a FabricProfileSpec,
    /// Signature of the node's discovered layout; the profile's when discovery gave none.
    pub signature: Option<String>,
    pub gpus: Vec<GpuAffinity>,
    /// Evidence from simulated engines (see [`railguard_api::Certificate::simulated`]).
    pub simulated: bool,
}

impl Subject<'_> {
    fn signature(&self) -> String {
        self.signature
            .clone()
            .unwrap_or_else(|| self.profile.signature())
    }
}

/// The certificate of an invasive run: issued now, valid for the profile's TTL, with this
/// run appended to the history (kept to the profile's depth).
/// It carries no passive hold, on the node or a rail: an invasive run clears every hold and
/// count of passive healing ([`super::heal`]).
pub fn invasive_certificate(
    subject: &Subject<'_>,
    assessment: &Assessment,
    software: &BTreeMap<String, String>,
    previous: Option<&Certificate>,
    now: Timestamp,
) -> Certificate {
    let cert = &subject.profile.certification;
    let ttl = i64::try_from(cert.ttl_seconds).unwrap_or(i64::MAX / 2);
    let expires_at = now
        .checked_add(SignedDuration::from_secs(ttl))
        .unwrap_or(Timestamp::MAX);
    let mut history: Vec<HistoryEntry> = previous
        .filter(|p| p.profile == subject.profile_name)
        .map(|p| p.history.clone())
        .unwrap_or_default();
    history.push(HistoryEntry {
        issued_at: now,
        verdict: assessment.verdict,
        busbw_plateau_gbps: assessment.nccl.as_ref().and_then(|n| n.busbw_plateau_gbps),
        rail_write_bw_gbps: assessment
            .rails
            .iter()
            .filter_map(|r| r.write_bw_host_gbps.map(|bw| (r.id(), bw)))
            .collect(),
        software: software.clone(),
    });
    let depth = (cert.history_depth as usize).max(1);
    if history.len() > depth {
        history.drain(..history.len() - depth);
    }
    Certificate {
        generation: previous.map(|p| p.generation + 1).unwrap_or(1),
        nccl: assessment.nccl.clone(),
        software: software.clone(),
        history,
        ..judged(subject, assessment, expires_at, now)
    }
}

/// A first certificate of `subject` as `assessment` judged it at `now`, valid until
/// `expires_at`: generation 1, no NCCL result, software or history yet.
fn judged(
    subject: &Subject<'_>,
    assessment: &Assessment,
    expires_at: Timestamp,
    now: Timestamp,
) -> Certificate {
    Certificate {
        generation: 1,
        node: Some(subject.node.to_string()),
        reasons: assessment.reasons.clone(),
        usable_rails: Some(assessment.usable_rails),
        rails: assessment.rails.clone(),
        gpus: subject.gpus.clone(),
        findings: assessment.findings.clone(),
        passive_checked_at: Some(now),
        simulated: subject.simulated,
        ..Certificate::new(
            subject.profile_name,
            &subject.signature(),
            assessment.verdict,
            now,
            expires_at,
        )
    }
}

/// Whether a passive check's certificate `next` is news against `previous`, the one on the
/// Node whose fabric label is `label_on_node`: a change of verdict, reasons, rails or
/// findings, or a label that no longer says what the certificate stands for at `now` (an
/// expiry). A check that found nothing new writes nothing: no generation bump, no condition
/// heartbeat, no Node update fanned out to every watcher (at 2,000 nodes and a 60 s interval,
/// 33 writes a second saved).
pub fn passive_is_news(
    previous: &Certificate,
    next: &Certificate,
    label_on_node: Option<&str>,
    now: Timestamp,
) -> bool {
    let comparable = |c: &Certificate| Certificate {
        generation: 0,
        passive_checked_at: None,
        ..c.clone()
    };
    comparable(previous) != comparable(next) || label_on_node != Some(next.fabric_label(now))
}

/// The certificate after a passive check: issue and expiry times stay those of the last
/// invasive run; rails, verdict and reasons reflect the check, and the node's passive hold
/// ([`Certificate::passive_hold`]) is the assessment's.
pub fn passive_certificate(
    subject: &Subject<'_>,
    assessment: &Assessment,
    previous: Option<&Certificate>,
    now: Timestamp,
) -> Certificate {
    match previous {
        Some(prev) => {
            let mut c = prev.clone();
            c.generation = prev.generation + 1;
            c.verdict = assessment.verdict;
            // A heal restores the reasons from before the passive failure, none included.
            if assessment.restored
                || (matches!(assessment.verdict, Verdict::Failed | Verdict::Degraded)
                    && !assessment.reasons.is_empty())
            {
                c.reasons = assessment.reasons.clone();
            }
            c.set_passive_hold(assessment.passive_hold.as_ref());
            c.usable_rails = Some(assessment.usable_rails);
            c.rails = assessment.rails.clone();
            c.findings = assessment.findings.clone();
            c.passive_checked_at = Some(now);
            c.node = Some(subject.node.to_string());
            c.simulated |= subject.simulated;
            c
        }
        None => {
            // Nothing invasive ever passed here, so nothing is valid.
            let mut c = judged(subject, assessment, now, now);
            c.set_passive_hold(assessment.passive_hold.as_ref());
            c
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn certified() -> Certificate {
        Certificate::from_annotation(
            &serde_json::json!({
                "version": 1, "generation": 7,
                "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-02T00:00:00Z",
                "profile": "h100", "signature": "v1-abc", "node": "gpu-a",
                "verdict": "certified", "reasons": [], "gpus": [],
                "rails": [{"hca": "mlx5_0", "port": 1, "linkLayer": "IB", "state": "ACTIVE",
                           "rateGbps": 400.0, "verdict": "healthy"}],
                "passiveCheckedAt": "2026-01-01T06:00:00Z",
            })
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn a_passive_check_that_found_nothing_new_is_no_news() {
        let before: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let prev = certified();
        let mut next = prev.clone();
        next.generation += 1;
        next.passive_checked_at = Some(before);
        assert!(!passive_is_news(&prev, &next, Some("certified"), before));
        // A rail that changed, a verdict that changed: news.
        let mut down = next.clone();
        down.rails[0].state = "DOWN".into();
        assert!(passive_is_news(&prev, &down, Some("certified"), before));
        let mut failed = next.clone();
        failed.verdict = Verdict::Failed;
        assert!(passive_is_news(&prev, &failed, Some("certified"), before));
        // The label disagrees with what the certificate stands for: an expiry to record, or
        // a label someone else changed.
        let after: Timestamp = "2026-01-02T00:00:01Z".parse().unwrap();
        assert!(passive_is_news(&prev, &next, Some("certified"), after));
        assert!(!passive_is_news(&prev, &next, Some("pending"), after));
        assert!(passive_is_news(&prev, &next, None, before));
    }
}
