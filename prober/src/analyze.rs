//! `railguard-prober analyze`: offline analysis of nccl-tests output and NCCL debug logs that
//! users already have (bare metal, Slurm). Each input is read for everything it holds, since
//! NCCL INFO lines are often mixed into nccl-tests output. Pure: texts in, report out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use railguard_api::{FabricProfileSpec, RailSpec, Transport};
use serde::Serialize;

use crate::certify::policy::fmt_num;
use crate::nccl::wqe::{wqe_faults, PortWqe};
use crate::nccl::{round2, NcclObservation};

/// The JSON printed by `analyze --json`. Keys are a contract; fields no input provides are
/// null.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AnalyzeReport {
    pub busbw_plateau_gbps: Option<f64>,
    pub busbw_max_gbps: Option<f64>,
    pub avg_busbw_gbps: Option<f64>,
    pub wrong: Option<u64>,
    pub ranks: Option<u32>,
    pub nodes: Option<u32>,
    /// The inter-node network NCCL chose: `IB` or `Socket`.
    pub transport: Option<&'static str>,
    pub gdr: Option<bool>,
    pub hcas: Option<Vec<String>>,
    pub errors: Vec<String>,
    /// NCCL's WQE latency lines by local HCA port (`null` when the logs hold none).
    pub wqe: Option<BTreeMap<String, PortWqe>>,
    /// `pass`, `fail`, or `unknown` (no thresholds, or evidence missing).
    pub verdict: AnalyzeVerdict,
    pub reasons: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AnalyzeVerdict {
    Pass,
    Fail,
    Unknown,
}

/// The busbw bar of a run over `nodes` nodes, and what it is derived from. The profile's
/// threshold is the one-node loopback's, where every ring hop crosses one rail; across nodes
/// NCCL's rings leave each node through every rail at once, so the bar is the rail count
/// times that.
fn plateau_bar(p: &FabricProfileSpec, nodes: Option<u32>) -> (f64, String) {
    let t = p.thresholds.busbw_plateau_gbps;
    match nodes {
        Some(n) if n > 1 && !p.rails.is_empty() => (
            t * p.rails.len() as f64,
            format!(
                " (a {n}-node run: {} rails x the loopback's {} GB/s)",
                p.rails.len(),
                fmt_num(t)
            ),
        ),
        _ => (t, String::new()),
    }
}

/// Analyzes what the inputs showed, against a profile's thresholds when given.
///
/// Rules that need no threshold (`#wrong > 0`, socket fallback, NCCL errors) fail even
/// without a profile. With a profile, the plateau, GPUDirect expectation and the HCAs are
/// judged too; `pass` needs evidence for every check, otherwise the verdict stays `unknown`
/// and a reason says what was missing.
pub fn analyze(obs: &NcclObservation, profile: Option<&FabricProfileSpec>) -> AnalyzeReport {
    let perf = obs.perf.as_ref();
    let wrong = obs.wrong();
    let transport = match obs.log.net {
        Some(Transport::Ib) => Some("IB"),
        Some(Transport::Socket) => Some("Socket"),
        _ => None,
    };
    let plateau = obs.busbw_plateau_gbps().map(round2);
    let mut fails = Vec::new();
    let mut missing = Vec::new();

    match wrong {
        Some(w) if w > 0 => fails.push(format!(
            "nccl-tests reported #wrong {w}, expected 0 (data corruption)"
        )),
        Some(_) => {}
        None => missing.push("no validated nccl-tests result (#wrong unknown)".to_string()),
    }
    match obs.log.net {
        Some(Transport::Socket) => fails.push(
            "NCCL fell back to NET/Socket, expected NET/IB: the run did not use RDMA".to_string(),
        ),
        Some(_) => {}
        None => missing.push("the input does not show NCCL's network transport".to_string()),
    }
    for e in &obs.log.errors {
        fails.push(format!("NCCL error: {e}"));
    }
    // Stalls and a port slower than its siblings need no threshold of ours: NCCL's own
    // (`NCCL_IB_WQE_LATENCY_THRESHOLD_NS`) picked the lines.
    fails.extend(
        wqe_faults(&obs.log.wqe)
            .into_iter()
            .map(|(_, reason)| reason),
    );
    missing.extend(obs.log.wqe.unreadable.iter().cloned());

    match profile {
        None => missing.push("no profile given: no thresholds to judge against".to_string()),
        Some(p) => {
            let (want, basis) = plateau_bar(p, obs.nodes());
            match plateau {
                Some(b) if b < want => fails.push(format!(
                    "NCCL busbw plateau {} GB/s, expected at least {} GB/s{basis}",
                    fmt_num(b),
                    fmt_num(want)
                )),
                Some(_) => {}
                None => missing.push("no nccl-tests table (busbw plateau unknown)".to_string()),
            }
            if p.certification.nccl_tests.expect_gdr && obs.log.net != Some(Transport::Socket) {
                match obs.log.gdr {
                    Some(true) => {}
                    Some(false) => fails.push(
                        "GPUDirect RDMA not in use (NCCL network channels lack GDRDMA), profile expects it"
                            .to_string(),
                    ),
                    None => missing.push("the input does not show whether GPUDirect RDMA was used".to_string()),
                }
            }
            if !obs.log.hcas.is_empty() {
                let expected: BTreeSet<String> = p.rails.iter().map(RailSpec::id).collect();
                let extra: Vec<&String> = obs
                    .log
                    .hcas
                    .iter()
                    .filter(|h| !expected.contains(*h))
                    .collect();
                if !extra.is_empty() {
                    fails.push(format!(
                        "NCCL used HCAs outside the profile: {}",
                        extra
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
    }

    let verdict = if !fails.is_empty() {
        AnalyzeVerdict::Fail
    } else if !missing.is_empty() {
        AnalyzeVerdict::Unknown
    } else {
        AnalyzeVerdict::Pass
    };
    let mut reasons = fails;
    if verdict != AnalyzeVerdict::Fail {
        reasons.extend(missing);
    }
    AnalyzeReport {
        busbw_plateau_gbps: plateau,
        busbw_max_gbps: perf.and_then(|p| p.max_busbw_gbps()),
        avg_busbw_gbps: perf.map(|p| p.avg_busbw_gbps),
        wrong,
        ranks: obs.ranks(),
        nodes: obs.nodes(),
        transport,
        gdr: obs.log.gdr,
        hcas: if obs.log.hcas.is_empty() {
            None
        } else {
            Some(obs.log.hcas.clone())
        },
        errors: obs.log.errors.clone(),
        wqe: (!obs.log.wqe.ports.is_empty()).then(|| obs.log.wqe.ports.clone()),
        verdict,
        reasons,
    }
}

/// Human-readable form of a report.
pub fn render_report(r: &AnalyzeReport) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let mut out = String::new();
    out.push_str(&format!(
        "busbw plateau: {} GB/s (max {} GB/s, avg {} GB/s)\n",
        opt(r.busbw_plateau_gbps.map(fmt_num)),
        opt(r.busbw_max_gbps.map(fmt_num)),
        opt(r.avg_busbw_gbps.map(fmt_num))
    ));
    out.push_str(&format!(
        "#wrong: {}  ranks: {}  nodes: {}\n",
        opt(r.wrong.map(|w| w.to_string())),
        opt(r.ranks.map(|w| w.to_string())),
        opt(r.nodes.map(|w| w.to_string()))
    ));
    out.push_str(&format!(
        "transport: {}  GDR: {}  HCAs: {}\n",
        r.transport.unwrap_or("-"),
        opt(r.gdr.map(|g| if g { "on".into() } else { "off".into() })),
        opt(r.hcas.as_ref().map(|h| h.join(",")))
    ));
    for e in &r.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    for (rail, w) in r.wqe.iter().flatten() {
        out.push_str(&format!(
            "WQE {rail}: {} slow, {} stall lines; {} of {} completions slow; max {} ns; {} QPs\n",
            w.slow_lines,
            w.stall_lines,
            w.slow_completions,
            w.completions,
            opt(w.max_ns.map(|n| n.to_string())),
            w.qps
        ));
    }
    out.push_str(&format!(
        "verdict: {}\n",
        match r.verdict {
            AnalyzeVerdict::Pass => "pass",
            AnalyzeVerdict::Fail => "fail",
            AnalyzeVerdict::Unknown => "unknown",
        }
    ));
    for reason in &r.reasons {
        out.push_str(&format!("  - {reason}\n"));
    }
    out
}

/// Why `analyze` could not run.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("analyze needs at least one input: --nccl-tests FILE or --nccl-log FILE")]
    NoInput,
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: nccl-tests output is unusable")]
    Perf {
        path: String,
        #[source]
        source: crate::nccl::PerfParseError,
    },
    #[error(
        "profile file {path} (--profile-file) holds no FabricProfile named {name} (--profile)"
    )]
    NoSuchProfile { path: String, name: String },
}

/// What `analyze` reads: nccl-tests outputs and NCCL debug logs (each may hold both), and
/// optionally the profiles of a profile file (read by the caller) and which of them to judge
/// against (default: the first).
#[derive(Clone, Debug, Default)]
pub struct AnalyzeInputs {
    pub files: Vec<PathBuf>,
    /// The profile file's path (for messages) and its profiles.
    pub profiles: Option<(PathBuf, Vec<railguard_api::FabricProfile>)>,
    pub profile: Option<String>,
}

/// Reads the inputs and analyzes them. Each input is parsed on its own first, so an error
/// names the file.
pub fn analyze_files(inputs: &AnalyzeInputs) -> Result<AnalyzeReport, AnalyzeError> {
    if inputs.files.is_empty() {
        return Err(AnalyzeError::NoInput);
    }
    let mut texts = Vec::new();
    for p in &inputs.files {
        let text = std::fs::read_to_string(p).map_err(|source| AnalyzeError::Read {
            path: p.display().to_string(),
            source,
        })?;
        crate::nccl::parse_perf_output(&text).map_err(|source| AnalyzeError::Perf {
            path: p.display().to_string(),
            source,
        })?;
        texts.push(text);
    }
    let obs = NcclObservation::from_texts(texts.iter().map(String::as_str)).map_err(|source| {
        AnalyzeError::Perf {
            path: "inputs".into(),
            source,
        }
    })?;
    let profile = match &inputs.profiles {
        None => None,
        Some((path, list)) => match &inputs.profile {
            Some(name) => Some(list.iter().find(|p| p.name() == name).ok_or_else(|| {
                AnalyzeError::NoSuchProfile {
                    path: path.display().to_string(),
                    name: name.clone(),
                }
            })?),
            None => list.first(),
        },
    };
    Ok(analyze(&obs, profile.map(|p| &p.spec)))
}
