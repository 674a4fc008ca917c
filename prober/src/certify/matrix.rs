//! The runbook's comparison matrix: one row per measurement (RDMA per rail, each NCCL run)
//! with run, nodes, GPUs, rail, transport, GDR, bandwidth, errors and notes, then the verdict.

use railguard_api::{FabricProfileSpec, Transport};

use super::evidence::{Evidence, NcclRunEvidence};
use super::policy::{fmt_num, Assessment};

/// One row of the matrix.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MatrixRow {
    pub run: String,
    pub nodes: String,
    pub gpus: String,
    pub rail: String,
    pub transport: String,
    pub gdr: String,
    pub busbw: String,
    pub errors: String,
    pub notes: String,
}

const HEADERS: [&str; 9] = [
    "RUN",
    "NODES",
    "GPUS",
    "RAIL",
    "TRANSPORT",
    "GDR",
    "BUSBW",
    "ERRORS",
    "NOTES",
];

/// The rows for a run's evidence and assessment.
pub fn matrix_rows(
    profile: &FabricProfileSpec,
    evidence: &Evidence,
    assessment: &Assessment,
) -> Vec<MatrixRow> {
    let mut rows = Vec::new();
    for rail in &assessment.rails {
        let spec = profile.rail(&rail.hca, rail.port);
        let gpus = spec
            .map(|s| {
                s.gpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let bw = match (rail.write_bw_host_gbps, rail.write_bw_gpu_gbps) {
            (Some(h), Some(g)) => format!("{} / {} Gb/s", fmt_num(h), fmt_num(g)),
            (Some(h), None) => format!("{} Gb/s", fmt_num(h)),
            _ => "-".to_string(),
        };
        let errors: u64 = rail.counter_deltas.values().sum();
        rows.push(MatrixRow {
            run: if evidence.benches.is_empty() {
                "passive".into()
            } else {
                "rdma-write".into()
            },
            nodes: "1".into(),
            gpus,
            rail: rail.id(),
            transport: rail
                .link_layer
                .map(|l| l.to_string())
                .unwrap_or_else(|| "-".into()),
            gdr: if rail.write_bw_gpu_gbps.is_some() {
                "yes".into()
            } else {
                "-".into()
            },
            busbw: bw,
            errors: errors.to_string(),
            notes: if rail.reasons.is_empty() {
                format!("{} {}", rail.state, verdict_word(rail.verdict))
            } else {
                rail.reasons
                    .iter()
                    .map(|r| {
                        r.trim_start_matches(&format!("rail {}: ", rail.id()))
                            .to_string()
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        });
    }
    for run in &evidence.nccl {
        rows.push(nccl_row(run));
    }
    rows
}

fn verdict_word(v: railguard_api::RailVerdict) -> &'static str {
    match v {
        railguard_api::RailVerdict::Healthy => "healthy",
        railguard_api::RailVerdict::Degraded => "degraded",
        railguard_api::RailVerdict::Failed => "failed",
    }
}

fn nccl_row(run: &NcclRunEvidence) -> MatrixRow {
    let env = run
        .env
        .iter()
        .filter(|(k, _)| k != "NCCL_IB_HCA")
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    match &run.outcome {
        Err(e) => MatrixRow {
            run: format!("nccl/{}", run.label),
            nodes: "-".into(),
            gpus: "-".into(),
            rail: "-".into(),
            transport: "-".into(),
            gdr: "-".into(),
            busbw: "-".into(),
            errors: "run failed".into(),
            notes: e.clone(),
        },
        Ok(o) => {
            let r = o.to_result();
            let mut errors = Vec::new();
            if let Some(w) = o.wrong() {
                errors.push(format!("#wrong {w}"));
            }
            if !o.log.errors.is_empty() {
                errors.push(format!("{} log errors", o.log.errors.len()));
            }
            let mut notes = Vec::new();
            if !env.is_empty() {
                notes.push(env);
            }
            if let Some(v) = &r.nccl_version {
                notes.push(format!("NCCL {v}"));
            }
            notes.extend(o.log.errors.iter().take(2).cloned());
            MatrixRow {
                run: format!("nccl/{}", run.label),
                nodes: o.nodes().map(|n| n.to_string()).unwrap_or("-".into()),
                gpus: o.ranks().map(|n| n.to_string()).unwrap_or("-".into()),
                rail: if r.hcas.is_empty() {
                    "-".into()
                } else {
                    format!("{} HCAs", r.hcas.len())
                },
                transport: match r.transport {
                    Some(Transport::Ib) => "NET/IB".into(),
                    Some(Transport::Socket) => "NET/Socket".into(),
                    Some(Transport::P2p) => "P2P".into(),
                    Some(Transport::Shm) => "SHM".into(),
                    None => "-".into(),
                },
                gdr: match r.gdr {
                    Some(true) => "on".into(),
                    Some(false) => "off".into(),
                    None => "-".into(),
                },
                busbw: r
                    .busbw_plateau_gbps
                    .map(|b| format!("{} GB/s", fmt_num(b)))
                    .unwrap_or("-".into()),
                errors: errors.join(", "),
                notes: notes.join("; "),
            }
        }
    }
}

/// The matrix as an aligned text table followed by the verdict and its reasons.
pub fn render_matrix(rows: &[MatrixRow], assessment: &Assessment) -> String {
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.run.clone(),
                r.nodes.clone(),
                r.gpus.clone(),
                r.rail.clone(),
                r.transport.clone(),
                r.gdr.clone(),
                r.busbw.clone(),
                r.errors.clone(),
                r.notes.clone(),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = HEADERS.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (i, c) in row.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cols: Vec<&str>, out: &mut String| {
        let mut l = String::new();
        for (i, c) in cols.iter().enumerate() {
            if i + 1 == cols.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(HEADERS.to_vec(), &mut out);
    for row in &cells {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out.push_str(&format!("\nverdict: {}\n", assessment.verdict));
    for r in &assessment.reasons {
        out.push_str(&format!("  - {r}\n"));
    }
    out
}
