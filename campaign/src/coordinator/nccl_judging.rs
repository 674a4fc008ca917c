//! The pure half of the campaign's NCCL pair tests: what a test covers ([`NcclScope`]),
//! whether its two sides pass the profile ([`judge_pair`]), and what the tests and their
//! localization say about each node ([`nccl_findings`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use jiff::Timestamp;
use railguard_api::certificate::NcclPairResult;
use railguard_api::profile::NcclPairSpec;
use railguard_api::{FabricProfileSpec, RailVerdict, Transport};
use serde::{Deserialize, Serialize};

use super::CampaignNode;
use crate::plan::{Localization, NodeIx, Purpose, RailOutcome};
use crate::wire::{NcclSide, NcclSideReport, RailRef};
use railguard_api::campaign_findings::{NodeFindings, RailBlame};
use railguard_prober::nccl::round2;

/// What one NCCL pair test covers: the full node, or one rail with the GPUs it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclScope {
    /// The rail of a one-rail test; `None` for the full node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<RailRef>,
    /// GPU indices that run a rank on each node (empty: every GPU).
    #[serde(default)]
    pub gpus: Vec<u32>,
}

impl NcclScope {
    /// `node`, or the rail's `hca:port`.
    pub fn label(&self) -> String {
        self.rail
            .as_ref()
            .map_or_else(|| "node".to_string(), RailRef::id)
    }

    /// The rails the test uses, out of the campaign's.
    pub fn rails(&self, all: &[RailRef]) -> Vec<RailRef> {
        match &self.rail {
            Some(r) => vec![r.clone()],
            None => all.to_vec(),
        }
    }
}

/// Pass limits of the NCCL pair tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclLimits {
    pub min_busbw_gbps: Option<f64>,
    pub min_rail_busbw_gbps: Option<f64>,
    /// GDRDMA must show on NCCL's network channels.
    pub expect_gdr: bool,
    /// A side that cannot run the test fails it.
    pub require_measured: bool,
}

/// The NCCL phase of a campaign.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclSettings {
    pub scopes: Vec<NcclScope>,
    pub limits: NcclLimits,
    pub sizes: Vec<usize>,
    pub warmup: u32,
    pub iterations: u32,
    /// Limit of one test (one scope of one pair).
    pub timeout: Duration,
}

impl NcclSettings {
    /// The profile's pair tests, or `None` when it asks for none.
    pub fn from_profile(spec: &FabricProfileSpec) -> Option<NcclSettings> {
        let pair: &NcclPairSpec = spec.certification.nccl_pair.as_ref()?;
        let mut scopes = Vec::new();
        if pair.full_node {
            scopes.push(NcclScope {
                rail: None,
                gpus: Vec::new(),
            });
        }
        if pair.per_rail {
            for r in &spec.rails {
                scopes.push(NcclScope {
                    rail: Some(RailRef {
                        hca: r.hca.clone(),
                        port: r.port,
                    }),
                    // A rail serving no GPU is still tested, from the first one.
                    gpus: if r.gpus.is_empty() {
                        vec![0]
                    } else {
                        r.gpus.clone()
                    },
                });
            }
        }
        if scopes.is_empty() {
            return None;
        }
        Some(NcclSettings {
            scopes,
            limits: NcclLimits {
                min_busbw_gbps: pair.min_busbw_gbps,
                min_rail_busbw_gbps: pair.min_rail_busbw_gbps,
                expect_gdr: spec.certification.nccl_tests.expect_gdr,
                require_measured: pair.require_measured,
            },
            sizes: pair.sizes(),
            warmup: pair.warmup,
            iterations: pair.iterations.max(1),
            timeout: Duration::from_secs(pair.timeout_seconds.max(1)),
        })
    }
}

/// The verdict on one pair test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclJudgement {
    pub outcome: RailOutcome,
    /// Both sides ran the collective to the end.
    pub measured: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busbw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algbw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdr: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrong: Option<u64>,
    #[serde(default)]
    pub hcas: Vec<String>,
    /// Why it failed or proved nothing.
    #[serde(default)]
    pub reasons: Vec<String>,
}

impl NcclJudgement {
    /// A verdict with no measurement behind it, for `reason`.
    pub(crate) fn without_result(outcome: RailOutcome, reason: String) -> Self {
        NcclJudgement {
            outcome,
            measured: false,
            bytes: None,
            busbw_gbps: None,
            algbw_gbps: None,
            transport: None,
            gdr: None,
            wrong: None,
            hcas: Vec::new(),
            reasons: vec![reason],
        }
    }
}

/// Judges both sides of one pair test against the limits of its scope.
///
/// A side that could not run the test (no NCCL, no GPU) makes it *not measured*: no evidence,
/// unless the profile requires a measurement. A side whose NCCL or CUDA calls failed is
/// evidence against the pair, whatever the other side says. Otherwise a timed-out, refused or
/// vanished side proves nothing. Two measured sides pass when the result is correct on every
/// rank, NCCL's log shows NET/IB (with GDRDMA when the profile expects it) over the scope's
/// HCAs only, and the busbw at the largest size meets the scope's minimum.
pub fn judge_pair(
    scope: &NcclScope,
    rails: &[RailRef],
    sides: &[NcclSideReport],
    limits: &NcclLimits,
) -> NcclJudgement {
    if let Some((node, reason)) = sides.iter().find_map(|s| match &s.side {
        NcclSide::NotMeasured { reason } => Some((&s.node, reason)),
        _ => None,
    }) {
        let outcome = if limits.require_measured {
            RailOutcome::Fail
        } else {
            RailOutcome::Inconclusive
        };
        return NcclJudgement::without_result(outcome, format!("not measured on {node}: {reason}"));
    }
    let failed: Vec<String> = sides
        .iter()
        .filter_map(|s| match &s.side {
            NcclSide::Failed { reason, .. } => Some(format!("{}: {reason}", s.node)),
            _ => None,
        })
        .collect();
    if !failed.is_empty() {
        return NcclJudgement {
            reasons: failed,
            ..NcclJudgement::without_result(RailOutcome::Fail, String::new())
        };
    }
    let measured: Vec<(
        &str,
        &[railguard_prober::nccl::ranks::PairPoint],
        &crate::wire::NcclLogSummary,
    )> = sides
        .iter()
        .filter_map(|s| match &s.side {
            NcclSide::Measured { points, log, .. } => {
                Some((s.node.as_str(), points.as_slice(), log))
            }
            _ => None,
        })
        .collect();
    if measured.len() < 2 {
        let why: Vec<String> = sides
            .iter()
            .filter_map(|s| match &s.side {
                NcclSide::Inconclusive { reason } => Some(format!("{}: {reason}", s.node)),
                _ => None,
            })
            .collect();
        let reason = if why.is_empty() {
            format!("{} of 2 sides reported", sides.len())
        } else {
            why.join("; ")
        };
        return NcclJudgement::without_result(RailOutcome::Inconclusive, reason);
    }
    let mut reasons = Vec::new();
    // The largest size both sides measured; the slower side's time is the collective's.
    let largest = measured
        .iter()
        .map(|(_, pts, _)| pts.iter().map(|p| p.bytes).max().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let at_largest: Vec<&railguard_prober::nccl::ranks::PairPoint> = measured
        .iter()
        .filter_map(|(_, pts, _)| pts.iter().find(|p| p.bytes == largest))
        .collect();
    let busbw = at_largest
        .iter()
        .map(|p| p.busbw_gbps)
        .fold(f64::INFINITY, f64::min);
    let algbw = at_largest
        .iter()
        .map(|p| p.algbw_gbps)
        .fold(f64::INFINITY, f64::min);
    let (busbw, algbw) = if at_largest.len() == measured.len() && busbw.is_finite() {
        (Some(busbw), Some(algbw))
    } else {
        reasons.push("the sides measured no common message size".to_string());
        (None, None)
    };
    let wrong: u64 = measured
        .iter()
        .flat_map(|(_, pts, _)| pts.iter().map(|p| p.wrong))
        .sum();
    if wrong > 0 {
        reasons.push(format!(
            "{wrong} wrong elements in the all-reduce results, expected 0 (data corruption)"
        ));
    }
    let expected: BTreeSet<String> = scope.rails(rails).iter().map(RailRef::id).collect();
    let mut hcas = BTreeSet::new();
    let mut transport = None;
    let mut gdr = None;
    for (node, _, log) in &measured {
        match log.net {
            Some(Transport::Ib) => {}
            Some(Transport::Socket) => reasons.push(format!(
                "NCCL on {node} fell back to NET/Socket, expected NET/IB: the test did not use RDMA"
            )),
            Some(other) => reasons.push(format!("NCCL on {node} used {other:?}, expected NET/IB")),
            None => reasons.push(format!(
                "NCCL's log on {node} does not show the NET/IB transport"
            )),
        }
        if transport.is_none() || log.net != Some(Transport::Ib) {
            transport = log.net.or(transport);
        }
        if limits.expect_gdr && log.net == Some(Transport::Ib) && log.gdr != Some(true) {
            reasons.push(format!(
                "GPUDirect RDMA not in use on {node} (no GDRDMA on NCCL's network channels), profile expects it"
            ));
        }
        gdr = match (gdr, log.gdr) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (_, g) => g.or(gdr),
        };
        let extra: Vec<&String> = log.hcas.iter().filter(|h| !expected.contains(*h)).collect();
        if !extra.is_empty() {
            reasons.push(format!(
                "NCCL on {node} used HCAs outside the test's rails: {}",
                extra
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for e in &log.errors {
            reasons.push(format!("NCCL error on {node}: {e}"));
        }
        hcas.extend(log.hcas.iter().cloned());
    }
    let min = if scope.rail.is_some() {
        limits.min_rail_busbw_gbps
    } else {
        limits.min_busbw_gbps
    };
    if let (Some(min), Some(got)) = (min, busbw) {
        // NaN is below every minimum.
        if got.is_nan() || got < min {
            reasons.push(format!(
                "busbw {} GB/s at {largest} bytes, expected at least {min} GB/s",
                round2(got)
            ));
        }
    }
    NcclJudgement {
        outcome: if reasons.is_empty() {
            RailOutcome::Pass
        } else {
            RailOutcome::Fail
        },
        measured: true,
        bytes: Some(largest),
        busbw_gbps: busbw.map(round2),
        algbw_gbps: algbw.map(round2),
        transport,
        gdr,
        wrong: Some(wrong),
        hcas: hcas.into_iter().collect(),
        reasons,
    }
}

/// One scope of one pair test as it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclScopeRecord {
    pub scope: NcclScope,
    pub sides: Vec<NcclSideReport>,
    pub judgement: NcclJudgement,
    /// Why the asked endpoint produced no sides (refusal, unreachable, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One pair of the NCCL phase: every scope, one after the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclTestRecord {
    pub round: usize,
    pub initiator: String,
    pub responder: String,
    pub purpose: Purpose,
    pub scopes: Vec<NcclScopeRecord>,
}

/// The NCCL phase of a campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclPhaseReport {
    /// The scopes' labels (`node`, `mlx5_0:1`, ...), the localization's "rails".
    pub scopes: Vec<String>,
    pub rounds: usize,
    pub tests: Vec<NcclTestRecord>,
    pub localization: Localization,
}

impl NcclPhaseReport {
    /// NCCL runs of the phase (pairs × scopes).
    pub fn runs(&self) -> usize {
        self.tests.iter().map(|t| t.scopes.len()).sum()
    }
}

fn describe(j: &NcclJudgement) -> String {
    match j.busbw_gbps {
        Some(b) if j.reasons.is_empty() => format!("{b} GB/s"),
        Some(b) => format!("{b} GB/s: {}", j.reasons.join("; ")),
        None => j.reasons.join("; "),
    }
}

/// Adds the NCCL phase's results and blame to each node's findings (pure).
pub fn nccl_findings(
    nodes: &[CampaignNode],
    settings: &NcclSettings,
    report: &NcclPhaseReport,
    now: Timestamp,
    out: &mut BTreeMap<String, NodeFindings>,
) {
    let ix: HashMap<&str, NodeIx> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    for f in out.values_mut() {
        f.nccl_pairs = Some(Vec::new());
    }
    let mut judged: HashMap<(NodeIx, NodeIx, usize), &NcclJudgement> = HashMap::new();
    for rec in &report.tests {
        let (Some(&a), Some(&b)) = (
            ix.get(rec.initiator.as_str()),
            ix.get(rec.responder.as_str()),
        ) else {
            continue;
        };
        for (s, sr) in rec.scopes.iter().enumerate() {
            let j = &sr.judgement;
            if j.outcome == RailOutcome::Inconclusive {
                continue;
            }
            judged.insert((a.min(b), a.max(b), s), j);
            let sides: &[(&String, &String)] = if sr.error.is_some() {
                &[(&rec.initiator, &rec.responder)]
            } else {
                &[
                    (&rec.initiator, &rec.responder),
                    (&rec.responder, &rec.initiator),
                ]
            };
            let rail = sr.scope.rail.as_ref().map(RailRef::id);
            for &(me, peer) in sides {
                let Some(list) = out.get_mut(me.as_str()).and_then(|f| f.nccl_pairs.as_mut())
                else {
                    continue;
                };
                list.retain(|p| !(&p.peer == peer && p.rail == rail));
                list.push(NcclPairResult {
                    peer: peer.clone(),
                    rail: rail.clone(),
                    busbw_gbps: j.busbw_gbps,
                    algbw_gbps: j.algbw_gbps,
                    transport: j.transport,
                    gdr: j.gdr,
                    wrong: j.wrong,
                    hcas: j.hcas.clone(),
                    ok: j.outcome == RailOutcome::Pass,
                    tested_at: Some(now),
                    note: (!j.reasons.is_empty()).then(|| j.reasons.join("; ")),
                });
            }
        }
    }
    let loc = &report.localization;
    let judged_of = |a: NodeIx, b: NodeIx, s: usize| judged.get(&(a.min(b), a.max(b), s)).copied();
    for (&(n, s), peers) in &loc.rail_faults {
        let Some(scope) = settings.scopes.get(s) else {
            continue;
        };
        let evidence: Vec<String> = peers
            .iter()
            .map(|&p| {
                let what = judged_of(n, p, s).map(describe).unwrap_or_default();
                format!("{} ({what})", nodes[p].name)
            })
            .collect();
        // Only slow, correct runs degrade; anything else (wrong results, no IB) fails.
        let only_slow = peers.iter().all(|&p| {
            judged_of(n, p, s)
                .is_some_and(|j| j.measured && j.reasons.iter().all(|r| r.starts_with("busbw ")))
        });
        let (verdict, word) = if only_slow {
            (RailVerdict::Degraded, "below its busbw minimum")
        } else {
            (RailVerdict::Failed, "failed")
        };
        let label = scope.label();
        let reason = format!(
            "NCCL pair test ({label}) {word} with {} healthy peers: {}",
            peers.len(),
            evidence.join(", ")
        );
        if let Some(f) = out.get_mut(&nodes[n].name) {
            f.nccl_blamed.insert(label, RailBlame { verdict, reason });
        }
    }
    for &n in &loc.node_faults {
        if let Some(f) = out.get_mut(&nodes[n].name) {
            f.nccl_blamed.insert(
                "node".into(),
                RailBlame {
                    verdict: RailVerdict::Failed,
                    reason: "NCCL pair tests failed in every scope with healthy peers: the node"
                        .into(),
                },
            );
        }
    }
    for &(a, b, s) in &loc.link_faults {
        let label = settings
            .scopes
            .get(s)
            .map(NcclScope::label)
            .unwrap_or_default();
        let what = judged_of(a, b, s).map(describe).unwrap_or_default();
        let reason = format!(
            "NCCL pair test ({label}) {}<->{} failed ({what}) while both passed with other peers: cable or switch port",
            nodes[a].name, nodes[b].name
        );
        for n in [a, b] {
            if let Some(f) = out.get_mut(&nodes[n].name) {
                f.links.push(reason.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::wire::NcclLogSummary;
    use railguard_prober::nccl::ranks::PairPoint;

    fn rails() -> Vec<RailRef> {
        ["mlx5_0", "mlx5_3"]
            .iter()
            .map(|h| RailRef {
                hca: h.to_string(),
                port: 1,
            })
            .collect()
    }

    fn ib(hcas: &[&str]) -> NcclLogSummary {
        NcclLogSummary {
            net: Some(Transport::Ib),
            gdr: Some(true),
            hcas: hcas.iter().map(|s| s.to_string()).collect(),
            nccl_lines: 5,
            ..Default::default()
        }
    }

    fn measured(node: &str, busbw: f64, wrong: u64, log: NcclLogSummary) -> NcclSideReport {
        NcclSideReport {
            node: node.into(),
            side: NcclSide::Measured {
                points: vec![
                    PairPoint {
                        bytes: 1 << 20,
                        time_us: 10.0,
                        algbw_gbps: busbw / 2.0,
                        busbw_gbps: busbw / 1.5,
                        wrong: 0,
                    },
                    PairPoint {
                        bytes: 1 << 22,
                        time_us: 40.0,
                        algbw_gbps: busbw / 1.5,
                        busbw_gbps: busbw,
                        wrong,
                    },
                ],
                nranks: 4,
                gpus: vec![],
                log,
            },
        }
    }

    fn limits() -> NcclLimits {
        NcclLimits {
            min_busbw_gbps: Some(300.0),
            min_rail_busbw_gbps: Some(40.0),
            expect_gdr: true,
            require_measured: false,
        }
    }

    fn full() -> NcclScope {
        NcclScope {
            rail: None,
            gpus: vec![],
        }
    }

    #[test]
    fn a_correct_fast_ib_pair_passes_at_its_largest_size() {
        let both = ["mlx5_0:1", "mlx5_3:1"];
        let j = judge_pair(
            &full(),
            &rails(),
            &[
                measured("a", 350.0, 0, ib(&both)),
                measured("b", 340.0, 0, ib(&both)),
            ],
            &limits(),
        );
        assert_eq!(j.outcome, RailOutcome::Pass, "{:?}", j.reasons);
        assert_eq!(j.busbw_gbps, Some(340.0), "the slower side");
        assert_eq!(j.bytes, Some(1 << 22));
        assert_eq!(j.wrong, Some(0));
    }

    #[test]
    fn wrong_results_socket_missing_gdr_foreign_hcas_and_slow_runs_fail() {
        let rail0 = NcclScope {
            rail: Some(rails()[0].clone()),
            gpus: vec![0],
        };
        let one = ["mlx5_0:1"];
        let case = |a: NcclSideReport| {
            judge_pair(
                &rail0,
                &rails(),
                &[a, measured("b", 50.0, 0, ib(&one))],
                &limits(),
            )
        };
        let j = case(measured("a", 50.0, 1, ib(&one)));
        assert!(j.reasons[0].contains("1 wrong elements"), "{:?}", j.reasons);
        let socket = NcclLogSummary {
            net: Some(Transport::Socket),
            ..ib(&[])
        };
        let j = case(measured("a", 50.0, 0, socket));
        assert_eq!(j.outcome, RailOutcome::Fail);
        assert!(j.reasons[0].contains("NET/Socket"), "{:?}", j.reasons);
        assert_eq!(j.transport, Some(Transport::Socket));
        let no_gdr = NcclLogSummary {
            gdr: Some(false),
            ..ib(&one)
        };
        assert!(case(measured("a", 50.0, 0, no_gdr)).reasons[0].contains("GPUDirect"));
        let silent = NcclLogSummary::default();
        assert!(case(measured("a", 50.0, 0, silent)).reasons[0].contains("does not show"));
        let j = case(measured("a", 50.0, 0, ib(&["mlx5_0:1", "mlx5_3:1"])));
        assert!(
            j.reasons[0].contains("outside the test's rails: mlx5_3:1"),
            "{:?}",
            j.reasons
        );
        let j = case(measured("a", 20.0, 0, ib(&one)));
        assert_eq!(j.outcome, RailOutcome::Fail);
        assert!(j.reasons[0].starts_with("busbw 20 GB/s"), "{:?}", j.reasons);
        assert!(j.measured);
    }

    #[test]
    fn not_measured_is_the_profiles_call_and_failures_beat_inconclusive_sides() {
        let none = NcclSideReport {
            node: "a".into(),
            side: NcclSide::NotMeasured {
                reason: "cannot load NCCL from libnccl.so.2".into(),
            },
        };
        let gone = NcclSideReport {
            node: "b".into(),
            side: NcclSide::Inconclusive {
                reason: "not started".into(),
            },
        };
        let j = judge_pair(&full(), &rails(), &[none.clone(), gone.clone()], &limits());
        assert_eq!(j.outcome, RailOutcome::Inconclusive);
        assert_eq!(
            j.reasons,
            ["not measured on a: cannot load NCCL from libnccl.so.2"]
        );
        let strict = NcclLimits {
            require_measured: true,
            ..limits()
        };
        assert_eq!(
            judge_pair(&full(), &rails(), &[none, gone.clone()], &strict).outcome,
            RailOutcome::Fail
        );
        let init = NcclSideReport {
            node: "a".into(),
            side: NcclSide::Failed {
                reason: "ncclCommInitRank failed: unhandled system error".into(),
                log: NcclLogSummary::default(),
            },
        };
        let j = judge_pair(&full(), &rails(), &[init, gone.clone()], &limits());
        assert_eq!(j.outcome, RailOutcome::Fail);
        assert!(j.reasons[0].starts_with("a: ncclCommInitRank failed"));
        let j = judge_pair(&full(), &rails(), &[gone], &limits());
        assert_eq!(j.outcome, RailOutcome::Inconclusive);
    }

    #[test]
    fn profile_scopes_are_the_full_node_then_each_rail_with_its_gpus() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../api/fixtures/profiles/dgx-h100-ndr.yaml"
        ))
        .unwrap();
        let mut p = railguard_api::profiles_from_yaml(&text).unwrap().remove(0);
        assert!(NcclSettings::from_profile(&p.spec).is_none());
        p.spec.certification.nccl_pair = Some(NcclPairSpec::default());
        let s = NcclSettings::from_profile(&p.spec).unwrap();
        assert_eq!(s.scopes.len(), 9);
        assert_eq!(s.scopes[0].label(), "node");
        assert_eq!(s.scopes[2].label(), "mlx5_3:1");
        assert_eq!(s.scopes[2].gpus, vec![1]);
        assert_eq!(s.sizes.first(), Some(&(1 << 20)));
        assert_eq!(s.sizes.last(), Some(&(256 << 20)));
    }
}
