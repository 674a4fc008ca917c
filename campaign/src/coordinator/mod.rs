//! The coordinator: runs a [`CampaignPlan`] against the nodes' peer endpoints round by
//! round, judges every rail against the profile, and turns the localization into per-node
//! findings. The IO is [`run_campaign`]; judging and findings are pure ([`judging`]).

mod judging;
mod nccl_judging;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use railguard_api::FabricProfile;
use serde::{Deserialize, Serialize};
use tracing::{info, info_span, warn, Instrument};

pub use judging::{findings, judge};
pub use nccl_judging::{
    judge_pair, nccl_findings, NcclJudgement, NcclLimits, NcclPhaseReport, NcclScope,
    NcclScopeRecord, NcclSettings, NcclTestRecord,
};

use super::endpoint::{request_as, Speaker};
use super::identity::CoordinatorIdentity;
use super::plan::{
    CampaignPlan, Localization, PairResult, PairTest, PlanOptions, Purpose, RailOutcome,
};
use super::wire::{
    AcceptPeerRequest, ControlRequest, ControlResponse, NcclTestRequest, RailRef, RailReport,
    RunTestRequest,
};
use super::CampaignError;
use railguard_api::campaign_findings::NodeFindings;
use railguard_prober::progress::{NoProgress, Progress};
use railguard_prober::rdma::peer::PairKey;
use railguard_prober::rdma::{MemoryKind, TrafficClass};

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
    /// The profile's service level and traffic class, so the pair tests cross the fabric in
    /// the class jobs use.
    pub class: TrafficClass,
    pub allow_gpu_pods: bool,
    /// Pair tests of a round run in waves of at most this many at once (a round of a
    /// 2,000-node ring is 1,000 pairs on the fabric running jobs share).
    pub max_concurrent_pairs: usize,
    /// Limit for one pair test (all rails).
    pub test_timeout: Duration,
    /// Limit for one control-channel step.
    pub io_timeout: Duration,
    token: Vec<u8>,
    pub plan: PlanOptions,
    /// The NCCL pair tests after the RDMA tests (the profile's `certification.ncclPair`).
    pub nccl: Option<NcclSettings>,
    /// Node identity: the coordinator's account (it proves itself to the endpoints with a
    /// token per connection), how endpoints prove their node, and a fresh pair key for every
    /// two-node test. `None`: the shared token alone.
    pub identity: Option<CoordinatorIdentity>,
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
        if token.len() < railguard_prober::rdma::peer::MIN_TOKEN_BYTES {
            return Err(CampaignError::Token {
                reason: format!(
                    "{} bytes, at least {} are required",
                    token.len(),
                    railguard_prober::rdma::peer::MIN_TOKEN_BYTES
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
            class: TrafficClass::of_profile(&profile.spec),
            allow_gpu_pods: false,
            max_concurrent_pairs: DEFAULT_MAX_CONCURRENT_PAIRS,
            test_timeout: Duration::from_secs(120),
            io_timeout: Duration::from_secs(10),
            token: token.to_vec(),
            plan: PlanOptions::default(),
            nccl: NcclSettings::from_profile(&profile.spec),
            identity: None,
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
    /// The NCCL pair tests, when the profile asks for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclPhaseReport>,
    /// Nodes left out because their endpoint failed the identity check, with the reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refused: BTreeMap<String, String>,
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

/// Default of [`CampaignSettings::max_concurrent_pairs`] (`--max-concurrent-pairs`).
pub const DEFAULT_MAX_CONCURRENT_PAIRS: usize = 8;

/// Runs the whole campaign against the endpoints. Tests of a round run concurrently, in
/// waves of at most [`CampaignSettings::max_concurrent_pairs`].
pub async fn run_campaign(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    now: Timestamp,
) -> Result<CampaignReport, CampaignError> {
    run_campaign_with(nodes, settings, now, &NoProgress).await
}

/// [`run_campaign`], reporting to `progress`: each round's pair tests are planned as it
/// starts (the plan adapts to results, so the total grows), each finished test is a step.
/// Its log lines are in a `campaign` span (profile, nodes), each round's in a
/// `campaign_round` span and each pair test's in a `campaign_pair` span naming both nodes.
#[tracing::instrument(name = "campaign", skip_all, fields(profile = %settings.profile, nodes = nodes.len()))]
pub async fn run_campaign_with(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    now: Timestamp,
    progress: &dyn Progress,
) -> Result<CampaignReport, CampaignError> {
    let (verified, refused) = verify_nodes(nodes, settings).await;
    let nodes = verified.as_slice();
    let mut plan = CampaignPlan::new(nodes.len(), settings.rails.len(), settings.plan.clone())?;
    let mut records = Vec::new();
    while let Some(round) = plan.next_round() {
        let n = plan.rounds();
        let span = info_span!("campaign_round", round = n, tests = round.len());
        span.in_scope(|| info!("campaign round"));
        let step = format!(
            "round {n}: {} pair tests of {} rails",
            round.len(),
            settings.rails.len()
        );
        let run = |t| run_pair(nodes, settings, t, n);
        let records_of_round = run_round(&round, nodes, settings, span, &step, progress, run).await;
        for (test, record) in round.iter().zip(records_of_round) {
            let outcomes = record.rails.iter().map(|r| r.outcome).collect();
            plan.record(PairResult {
                test: *test,
                rails: outcomes,
            })?;
            records.push(record);
        }
    }
    let localization = plan.localize();
    let mut findings = findings(
        nodes,
        &settings.rails,
        &settings.limits,
        &records,
        &localization,
        now,
    );
    let nccl = match &settings.nccl {
        Some(nccl) => {
            let report = run_nccl_phase(nodes, settings, nccl, progress).await?;
            nccl_findings(nodes, nccl, &report, now, &mut findings);
            Some(report)
        }
        None => None,
    };
    Ok(CampaignReport {
        profile: settings.profile.clone(),
        nodes: nodes.iter().map(|n| n.name.clone()).collect(),
        rails: settings.rails.clone(),
        rounds: plan.rounds(),
        tests: records,
        localization,
        findings,
        nccl,
        refused,
    })
}

/// Identity checks run at once.
const IDENTITY_CHECKS_AT_ONCE: usize = 16;

/// The nodes whose endpoints prove which node they run on, and why the others were left
/// out. A node that cannot be reached is kept: its tests then say so.
async fn verify_nodes(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
) -> (Vec<CampaignNode>, BTreeMap<String, String>) {
    let Some(check) = settings
        .identity
        .as_ref()
        .and_then(|i| i.endpoints.as_ref())
    else {
        return (nodes.to_vec(), BTreeMap::new());
    };
    let checks = nodes.iter().map(|n| async move {
        let speaker = Speaker {
            key: &settings.token,
            from: None,
            identity: settings.identity.as_ref(),
        };
        let t = settings.io_timeout;
        let answer = request_as(
            &n.endpoint,
            speaker,
            &ControlRequest::Identify,
            Some(&n.name),
            t,
            t,
        )
        .await;
        let verdict = match answer {
            Ok(ControlResponse::Identity { token, .. }) => check.verify(&n.name, &token).await,
            Ok(ControlResponse::Refused { reason }) => Err(CampaignError::Identity {
                node: n.name.clone(),
                reason: format!("the endpoint gave no identity: {reason}"),
            }),
            Ok(_) => Err(CampaignError::Identity {
                node: n.name.clone(),
                reason: "the endpoint answered Identify with something else".into(),
            }),
            Err(e @ CampaignError::Unreachable { .. }) => {
                warn!(node = %n.name, error = %e, "endpoint unreachable; its tests will say so");
                Ok(())
            }
            Err(e) => Err(e),
        };
        (n, verdict)
    });
    let mut verified = Vec::new();
    let mut refused = BTreeMap::new();
    // A few at a time: each check is a TokenRequest and a TokenReview on the API server.
    let verdicts: Vec<_> = futures::stream::iter(checks)
        .buffered(IDENTITY_CHECKS_AT_ONCE)
        .collect()
        .await;
    for (n, verdict) in verdicts {
        match verdict {
            Ok(()) => verified.push(n.clone()),
            Err(e) => {
                warn!(node = %n.name, error = %e, "node left out of the campaign");
                refused.insert(n.name.clone(), e.to_string());
            }
        }
    }
    (verified, refused)
}

/// With node identity: a fresh pair key for a test of `a` (the side that connects) with
/// `b`, announced to `b`. `Ok(None)`: the shared token alone. `Err`: why `b` did not take it
/// (no evidence either way).
async fn announce_pair(
    a: &CampaignNode,
    b: &CampaignNode,
    settings: &CampaignSettings,
    lifetime: Duration,
) -> Result<Option<String>, String> {
    let Some(identity) = &settings.identity else {
        return Ok(None);
    };
    let key = PairKey::random().to_hex();
    let accept = ControlRequest::AcceptPeer(AcceptPeerRequest {
        peer_node: a.name.clone(),
        pair_key: key.clone(),
        ttl_ms: lifetime.as_millis() as u64,
    });
    let speaker = Speaker {
        key: &settings.token,
        from: None,
        identity: Some(identity),
    };
    let t = settings.io_timeout;
    match request_as(&b.endpoint, speaker, &accept, Some(&b.name), t, t).await {
        Ok(ControlResponse::PeerAccepted { .. }) => Ok(Some(key)),
        Ok(ControlResponse::Refused { reason }) => Err(format!(
            "{} refused the pair key for {}: {reason}",
            b.name, a.name
        )),
        Ok(_) => Err(format!(
            "{} answered the pair key with something else",
            b.name
        )),
        Err(e) => Err(format!("cannot give {} the pair key: {e}", b.name)),
    }
}

/// Runs `tests` with at most `limit` (at least one) under way at once, their results in
/// the order given: a wave is refilled as each test ends, so a slow pair does not hold the
/// rest.
async fn run_at_most<T, F>(tests: impl Iterator<Item = F>, limit: usize) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    use futures::StreamExt;
    futures::stream::iter(tests)
        .buffered(limit.max(1))
        .collect()
        .await
}

/// Runs the pair tests of one round in waves of at most
/// [`CampaignSettings::max_concurrent_pairs`], each in its [`pair_span`] and all in the
/// round's span; the round is a progress step named `step`, each test a step of it. The
/// records in the round's order.
async fn run_round<R, F>(
    round: &[PairTest],
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    span: tracing::Span,
    step: &str,
    progress: &dyn Progress,
    run: impl Fn(PairTest) -> F,
) -> Vec<R>
where
    F: std::future::Future<Output = R>,
{
    progress.plan(round.len() as u64);
    progress.step(step);
    let runs = round.iter().map(|t| {
        let test = run(*t).instrument(pair_span(nodes, t.initiator, t.responder));
        async move {
            let record = test.await;
            progress.step_done();
            record
        }
    });
    run_at_most(runs, settings.max_concurrent_pairs)
        .instrument(span)
        .await
}

/// Sends `req` to node `a`'s endpoint as the coordinator and waits up to `answer_timeout`
/// for its answer; the endpoint must prove it runs on `a`.
async fn ask(
    a: &CampaignNode,
    settings: &CampaignSettings,
    req: &ControlRequest,
    answer_timeout: Duration,
) -> Result<ControlResponse, CampaignError> {
    let speaker = coordinator(settings);
    request_as(
        &a.endpoint,
        speaker,
        req,
        Some(&a.name),
        settings.io_timeout,
        answer_timeout,
    )
    .await
}

/// The span of one pair test's log lines: `campaign_pair`, the node that starts the test
/// and the one that answers it.
fn pair_span(nodes: &[CampaignNode], initiator: usize, responder: usize) -> tracing::Span {
    info_span!(
        "campaign_pair",
        initiator = %nodes[initiator].name,
        responder = %nodes[responder].name
    )
}

/// The NCCL phase: the same planner and localization as the RDMA tests, with one "rail" per
/// scope (the full node, then each rail); a pair test runs its scopes one after the other,
/// the pairs of a round at once.
pub async fn run_nccl_phase(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    nccl: &NcclSettings,
    progress: &dyn Progress,
) -> Result<NcclPhaseReport, CampaignError> {
    let mut plan = CampaignPlan::new(nodes.len(), nccl.scopes.len(), settings.plan.clone())?;
    let mut records = Vec::new();
    while let Some(round) = plan.next_round() {
        let n = plan.rounds();
        let span = info_span!(
            "nccl_round",
            round = n,
            pairs = round.len(),
            scopes = nccl.scopes.len()
        );
        span.in_scope(|| info!("NCCL round"));
        let step = format!(
            "NCCL round {n}: {} pairs, {} tests each",
            round.len(),
            nccl.scopes.len()
        );
        let run = |t| run_nccl_pair(nodes, settings, nccl, t, n);
        let records_of_round = run_round(&round, nodes, settings, span, &step, progress, run).await;
        for (test, record) in round.iter().zip(records_of_round) {
            plan.record(PairResult {
                test: *test,
                rails: record.scopes.iter().map(|s| s.judgement.outcome).collect(),
            })?;
            records.push(record);
        }
    }
    Ok(NcclPhaseReport {
        scopes: nccl.scopes.iter().map(NcclScope::label).collect(),
        rounds: plan.rounds(),
        tests: records,
        localization: plan.localize(),
    })
}

/// Every scope of one pair, in order.
async fn run_nccl_pair(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    nccl: &NcclSettings,
    t: PairTest,
    round: usize,
) -> NcclTestRecord {
    let (a, b) = (&nodes[t.initiator], &nodes[t.responder]);
    let mut scopes = Vec::with_capacity(nccl.scopes.len());
    for scope in &nccl.scopes {
        scopes.push(run_nccl_scope(a, b, settings, nccl, scope).await);
    }
    NcclTestRecord {
        round,
        initiator: a.name.clone(),
        responder: b.name.clone(),
        purpose: t.purpose,
        scopes,
    }
}

/// One NCCL pair test, `a`'s ranks first.
pub async fn run_nccl_scope(
    a: &CampaignNode,
    b: &CampaignNode,
    settings: &CampaignSettings,
    nccl: &NcclSettings,
    scope: &NcclScope,
) -> NcclScopeRecord {
    // The rank-0 endpoint waits for its ranks and for the peer's answer, one step each.
    let answer_timeout = nccl.timeout + 2 * settings.io_timeout;
    let no_sides = |outcome: RailOutcome, reason: String| NcclScopeRecord {
        scope: scope.clone(),
        sides: Vec::new(),
        judgement: NcclJudgement::without_result(outcome, reason.clone()),
        error: Some(reason),
    };
    let pair_key = match announce_pair(a, b, settings, answer_timeout).await {
        Ok(k) => k,
        Err(reason) => {
            warn!(error = %reason, "NCCL pair test without a result");
            return no_sides(RailOutcome::Inconclusive, reason);
        }
    };
    let req = ControlRequest::RunNccl(NcclTestRequest {
        profile: settings.profile.clone(),
        peer_node: b.name.clone(),
        peer_addr: b.endpoint.clone(),
        rails: scope.rails(&settings.rails),
        gpus: scope.gpus.clone(),
        sizes: nccl.sizes.clone(),
        warmup: nccl.warmup,
        iterations: nccl.iterations,
        allow_gpu_pods: settings.allow_gpu_pods,
        timeout_ms: nccl.timeout.as_millis() as u64,
        pair_key,
    });
    let answer = ask(a, settings, &req, answer_timeout).await;
    let record = match answer {
        Ok(ControlResponse::NcclResult { sides, .. }) => NcclScopeRecord {
            judgement: judge_pair(scope, &settings.rails, &sides, &nccl.limits),
            scope: scope.clone(),
            sides,
            error: None,
        },
        Ok(ControlResponse::Refused { reason }) => no_sides(
            RailOutcome::Inconclusive,
            format!("{} refused the NCCL test with {}: {reason}", a.name, b.name),
        ),
        Ok(_) => no_sides(
            RailOutcome::Inconclusive,
            format!(
                "endpoint of {} answered an NCCL test with something else",
                a.name
            ),
        ),
        // A node that cannot be reached is evidence against it, as in the RDMA tests.
        Err(e @ CampaignError::Unreachable { .. }) => {
            no_sides(RailOutcome::Fail, format!("node {}: {e}", a.name))
        }
        Err(e) => no_sides(RailOutcome::Inconclusive, format!("node {}: {e}", a.name)),
    };
    if let Some(e) = &record.error {
        warn!(scope = %scope.label(), error = %e, "NCCL pair test without a result");
    }
    record
}

async fn run_pair(
    nodes: &[CampaignNode],
    settings: &CampaignSettings,
    t: PairTest,
    round: usize,
) -> TestRecord {
    let (a, b) = (&nodes[t.initiator], &nodes[t.responder]);
    let answer_timeout = settings.test_timeout + settings.io_timeout;
    let all = |report: RailReport| -> Vec<RailReport> { vec![report; settings.rails.len()] };
    let pair_key = match announce_pair(a, b, settings, answer_timeout).await {
        Ok(k) => k,
        Err(reason) => {
            warn!(error = %reason, "pair test without a result");
            let report = RailReport::Inconclusive {
                reason: reason.clone(),
            };
            return record(t, round, a, b, settings, all(report), Some(reason));
        }
    };
    let req = ControlRequest::RunTest(RunTestRequest {
        profile: settings.profile.clone(),
        peer_node: b.name.clone(),
        peer_addr: b.endpoint.clone(),
        rails: settings.rails.clone(),
        memory: settings.memory,
        sizes: settings.sizes.clone(),
        iterations: settings.iterations,
        class: settings.class,
        allow_gpu_pods: settings.allow_gpu_pods,
        timeout_ms: settings.test_timeout.as_millis() as u64,
        pair_key,
    });
    let (reports, error) = match ask(a, settings, &req, answer_timeout).await {
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
        Ok(_) => {
            let reason = format!("endpoint of {} answered a test with something else", a.name);
            (
                all(RailReport::Inconclusive {
                    reason: reason.clone(),
                }),
                Some(reason),
            )
        }
        // The node cannot be reached: that is evidence against it, as a dead node is. One
        // that accepted the connection and then ran out of time (saturated, or its test
        // starved) is not: that is the Inconclusive arm below.
        Err(e @ CampaignError::Unreachable { .. }) => {
            let reason = format!("node {}: {e}", a.name);
            (
                all(RailReport::Failed {
                    reason: reason.clone(),
                }),
                Some(reason),
            )
        }
        Err(e) => {
            let reason = match &e {
                CampaignError::Timeout { .. } | CampaignError::Closed { .. } => format!(
                    "node {}: {e} (its endpoint may be saturated; no evidence against its rails)",
                    a.name
                ),
                _ => format!("node {}: {e}", a.name),
            };
            (
                all(RailReport::Inconclusive {
                    reason: reason.clone(),
                }),
                Some(reason),
            )
        }
    };
    if let Some(e) = &error {
        warn!(error = %e, "pair test without a result");
    }
    record(t, round, a, b, settings, reports, error)
}

/// How the coordinator speaks to endpoints.
fn coordinator(settings: &CampaignSettings) -> Speaker<'_> {
    Speaker {
        key: &settings.token,
        from: None,
        identity: settings.identity.as_ref(),
    }
}

fn record(
    t: PairTest,
    round: usize,
    a: &CampaignNode,
    b: &CampaignNode,
    settings: &CampaignSettings,
    reports: Vec<RailReport>,
    error: Option<String>,
) -> TestRecord {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn pair_tests_run_at_most_the_limit_at_once_results_in_order() {
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let tests = (0..20u64).map(|i| {
            let (running, most) = (&running, &most);
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Uneven lengths: later tests may end first.
                tokio::time::sleep(Duration::from_millis(1 + (i * 7) % 5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                i
            }
        });
        let out = run_at_most(tests, 3).await;
        assert_eq!(out, (0..20).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), 3);
        // A limit of 0 is taken as 1, never as "no test".
        let one = run_at_most((0..3).map(|i| async move { i }), 0).await;
        assert_eq!(one, vec![0, 1, 2]);
    }
}
