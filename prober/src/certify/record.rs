//! Turning an [`Assessment`] into the [`Certificate`] stored on the Node.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use railguard_api::certificate::{HistoryEntry, CERTIFICATE_VERSION};
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
        simulated: subject.simulated,
        version: CERTIFICATE_VERSION,
        generation: previous.map(|p| p.generation + 1).unwrap_or(1),
        issued_at: now,
        expires_at,
        profile: subject.profile_name.to_string(),
        signature: subject.signature(),
        node: Some(subject.node.to_string()),
        verdict: assessment.verdict,
        reasons: assessment.reasons.clone(),
        rails: assessment.rails.clone(),
        gpus: subject.gpus.clone(),
        nccl: assessment.nccl.clone(),
        findings: assessment.findings.clone(),
        software: software.clone(),
        passive_checked_at: Some(now),
        history,
        extra: BTreeMap::new(),
    }
}

/// The certificate after a passive check: issue and expiry times stay those of the last
/// invasive run; rails, verdict and reasons reflect the check.
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
            if assessment.verdict == Verdict::Failed {
                c.reasons = assessment.reasons.clone();
            }
            c.rails = assessment.rails.clone();
            c.findings = assessment.findings.clone();
            c.passive_checked_at = Some(now);
            c.node = Some(subject.node.to_string());
            c.simulated |= subject.simulated;
            c
        }
        None => Certificate {
            version: CERTIFICATE_VERSION,
            generation: 1,
            issued_at: now,
            // Nothing invasive ever passed here, so nothing is valid.
            expires_at: now,
            profile: subject.profile_name.to_string(),
            signature: subject.signature(),
            node: Some(subject.node.to_string()),
            verdict: assessment.verdict,
            reasons: assessment.reasons.clone(),
            rails: assessment.rails.clone(),
            gpus: subject.gpus.clone(),
            nccl: None,
            findings: assessment.findings.clone(),
            software: BTreeMap::new(),
            passive_checked_at: Some(now),
            history: Vec::new(),
            simulated: subject.simulated,
            extra: BTreeMap::new(),
        },
    }
}
