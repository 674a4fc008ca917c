//! The coordinator: runs a [`CampaignPlan`] against the nodes' peer endpoints round by
//! round, judges every rail against the profile, and turns the localization into per-node
//! findings. The IO is [`run_campaign`]; judging and findings are pure.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;
use railguard_api::certificate::WireResult;
use railguard_api::{FabricProfile, RailVerdict};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::endpoint::request;
use super::plan::{
    CampaignPlan, Localization, NodeIx, PairResult, PairTest, PlanOptions, Purpose, RailOutcome,
};
use super::verdict::{NodeFindings, RailBlame};
use super::wire::{ControlRequest, ControlResponse, RailRef, RailReport, RunTestRequest};
use super::CampaignError;
use crate::progress::{NoProgress, Progress};
use crate::rdma::MemoryKind;

/// A node taking part, with its endpoint address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CampaignNode {
    pub name: String,
    pub endpoint: String,
}

/// Pass limits of one rail test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub min_bw_gbps: f64,
    pub max_latency_us: Option<f64>,
}

/// How a campaign runs.
#[derive(Clone)]
pub struct CampaignSettings {
    pub profile: String,
    pub rails: Vec<RailRef>,
    pub limits: Limits,
    pub memory: MemoryKind,
    pub sizes: Vec<usize>,
    pub iterations: u32,
    pub allow_gpu_pods: bool,
    /// Limit for one pair test (all rails).
    pub test_timeout: Duration,
    /// Limit for one control-channel step.
    pub io_timeout: Duration,
    token: Vec<u8>,
    pub plan: PlanOptions,
}

impl std::fmt::Debug for CampaignSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CampaignSettings")
            .field("profile", &self.profile)
            .field("rails", &self.rails)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl CampaignSettings {
    /// Settings from a profile: its rails and host-memory thresholds, the default sweep.
    pub fn from_profile(profile: &FabricProfile, token: &[u8]) -> Result<Self, CampaignError> {
        let token = token.strip_suffix(b"\n").unwrap_or(token);
        if token.len() < crate::rdma::peer::MIN_TOKEN_BYTES {
            return Err(CampaignError::Token {
                reason: format!(
                    "{} bytes, at least {} are required",
                    token.len(),
                    crate::rdma::peer::MIN_TOKEN_BYTES
                ),
            });
        }
        let rails: Vec<RailRef> = profile
            .spec
            .rails
            .iter()
            .map(|r| RailRef {
                hca: r.hca.clone(),
                port: r.port,
            })
            .collect();
        if rails.is_empty() {
            return Err(CampaignError::Profile {
                profile: profile.name().to_string(),
                reason: "has no rails".into(),
            });
        }
        Ok(CampaignSettings {
            profile: profile.name().to_string(),
            rails,
            limits: Limits {
                min_bw_gbps: profile.spec.thresholds.write_bw_host_gbps,
                max_latency_us: profile.spec.thresholds.max_latency_us,
            },
            memory: MemoryKind::Host,
            sizes: vec![8, 4096, 65536, 1 << 20, 8 << 20],
            iterations: 200,
            allow_gpu_pods: false,
            test_timeout: Duration::from_secs(120),
            io_timeout: Duration::from_secs(10),
            token: token.to_vec(),
            plan: PlanOptions::default(),
        })
    }
}

/// One pair test as it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TestRecord {
    pub round: usize,
    pub initiator: String,
    pub responder: String,
    pub purpose: Purpose,
    pub rails: Vec<RailRecord>,
    /// Why the whole test produced no or only negative evidence (refusal, unreachable, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RailRecord {
    pub rail: RailRef,
    pub report: RailReport,
    pub outcome: RailOutcome,
}

/// Everything a campaign did and concluded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CampaignReport {
    pub profile: String,
    pub nodes: Vec<String>,
    pub rails: Vec<RailRef>,
    pub rounds: usize,
    pub tests: Vec<TestRecord>,
    pub localization: Localization,
    pub findings: BTreeMap<String, NodeFindings>,
}

impl CampaignReport {
    /// Names of the nodes blamed for anything.
    pub fn blamed_nodes(&self) -> Vec<&str> {
        self.findings
            .values()
            .filter(|f| f.blames_node())
            .map(|f| f.node.as_str())
            .collect()
    }
}

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

/// Runs the whole campaign against the endpoints. Tests of a round run concurrently.
pub async fn run_campaign(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    now: Timestamp,
) -> Result<CampaignReport, CampaignError> {
    run_campaign_with(nodes, settings, now, &NoProgress).await
}

/// [`run_campaign`], reporting to `progress`: each round's pair tests are planned as it
/// starts (the plan adapts to results, so the total grows), each finished test is a step.
pub async fn run_campaign_with(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    now: Timestamp,
    progress: &dyn Progress,
) -> Result<CampaignReport, CampaignError> {
    let mut plan = CampaignPlan::new(nodes.len(), settings.rails.len(), settings.plan.clone())?;
    let mut records = Vec::new();
    while let Some(round) = plan.next_round() {
        let n = plan.rounds();
        info!(round = n, tests = round.len(), "campaign round");
        progress.plan(round.len() as u64);
        progress.step(&format!(
            "round {n}: {} pair tests of {} rails",
            round.len(),
            settings.rails.len()
        ));
        let runs = round.iter().map(|t| async move {
            let record = run_pair(nodes, settings, *t, n).await;
            progress.step_done();
            record
        });
        for (test, record) in round.iter().zip(futures::future::join_all(runs).await) {
            let outcomes = record.rails.iter().map(|r| r.outcome).collect();
            plan.record(PairResult {
                test: *test,
                rails: outcomes,
            })?;
            records.push(record);
        }
    }
    let localization = plan.localize();
    let findings = findings(
        nodes,
        &settings.rails,
        &settings.limits,
        &records,
        &localization,
        now,
    );
    Ok(CampaignReport {
        profile: settings.profile.clone(),
        nodes: nodes.iter().map(|n| n.name.clone()).collect(),
        rails: settings.rails.clone(),
        rounds: plan.rounds(),
        tests: records,
        localization,
        findings,
    })
}

async fn run_pair(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    t: PairTest,
    round: usize,
) -> TestRecord {
    let (a, b) = (&nodes[t.initiator], &nodes[t.responder]);
    let req = ControlRequest::RunTest(RunTestRequest {
        profile: settings.profile.clone(),
        peer_node: b.name.clone(),
        peer_addr: b.endpoint.clone(),
        rails: settings.rails.clone(),
        memory: settings.memory,
        sizes: settings.sizes.clone(),
        iterations: settings.iterations,
        allow_gpu_pods: settings.allow_gpu_pods,
        timeout_ms: settings.test_timeout.as_millis() as u64,
    });
    let answer_timeout = settings.test_timeout + settings.io_timeout;
    let all = |report: RailReport| -> Vec<RailReport> { vec![report; settings.rails.len()] };
    let (reports, error) = match request(
        &a.endpoint,
        &settings.token,
        &req,
        Some(&a.name),
        settings.io_timeout,
        answer_timeout,
    )
    .await
    {
        Ok(ControlResponse::TestResult { rails, .. }) => {
            let by_rail: HashMap<RailRef, RailReport> =
                rails.into_iter().map(|r| (r.rail, r.report)).collect();
            let reports = settings
                .rails
                .iter()
                .map(|r| {
                    by_rail.get(r).cloned().unwrap_or(RailReport::Inconclusive {
                        reason: format!("endpoint of {} did not report rail {}", a.name, r.id()),
                    })
                })
                .collect();
            (reports, None)
        }
        Ok(ControlResponse::Refused { reason }) => {
            let reason = format!("{} refused the test with {}: {reason}", a.name, b.name);
            (
                all(RailReport::Inconclusive {
                    reason: reason.clone(),
                }),
                Some(reason),
            )
        }
        Ok(ControlResponse::Status { .. }) => {
            let reason = format!("endpoint of {} answered a test with its status", a.name);
            (
                all(RailReport::Inconclusive {
                    reason: reason.clone(),
                }),
                Some(reason),
            )
        }
        // The node cannot be reached or hangs: that is evidence against it, as a dead node is.
        Err(e @ (CampaignError::Unreachable { .. } | CampaignError::Timeout { .. })) => {
            let reason = format!("node {}: {e}", a.name);
            (
                all(RailReport::Failed {
                    reason: reason.clone(),
                }),
                Some(reason),
            )
        }
        Err(e) => {
            let reason = format!("node {}: {e}", a.name);
            (
                all(RailReport::Inconclusive {
                    reason: reason.clone(),
                }),
                Some(reason),
            )
        }
    };
    if let Some(e) = &error {
        warn!(initiator = %a.name, responder = %b.name, error = %e, "pair test without a result");
    }
    TestRecord {
        round,
        initiator: a.name.clone(),
        responder: b.name.clone(),
        purpose: t.purpose,
        rails: settings
            .rails
            .iter()
            .zip(reports)
            .map(|(rail, report)| RailRecord {
                rail: rail.clone(),
                outcome: judge(&report, &settings.limits),
                report,
            })
            .collect(),
        error,
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
        for n in [a, b] {
            if let Some(f) = out.get_mut(&nodes[n].name) {
                f.links.push(reason.clone());
            }
        }
    }
    for &(a, b, r) in &loc.suspect_links {
        let reason = format!(
            "link {}<->{} on {} suspect: failed with one peer only, unconfirmed",
            nodes[a].name,
            nodes[b].name,
            rails[r].id()
        );
        for n in [a, b] {
            if let Some(f) = out.get_mut(&nodes[n].name) {
                f.links.push(reason.clone());
            }
        }
    }
    out
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
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
