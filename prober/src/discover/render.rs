//! Output of `discover` and `affinity`: the JSON contract and the human tables.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::{AffinityMap, Discovery, Finding, IndexOrder, NicSummary, Rail};

/// The JSON both `discover --json` and `affinity --json` print:
/// `{"gpus":[{"index":0,"numa":0,"preferred":{"hca":"mlx5_0","port":1,"path":"PXB"},
/// "alternates":[{"hca":"mlx5_1","path":"NODE"}]}], "indexOrder": ..., "nics": [...],
/// "rails": [...], "findings": [...]}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AffinityJson {
    pub gpus: Vec<super::GpuAffinityEntry>,
    pub index_order: IndexOrder,
    #[serde(default)]
    pub nics: Vec<NicSummary>,
    #[serde(default)]
    pub rails: Vec<Rail>,
    /// Rail-layout signature (discover only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    #[serde(default)]
    pub findings: Vec<Finding>,
}

impl AffinityJson {
    pub fn from_discovery(d: &Discovery) -> Self {
        Self {
            gpus: d.affinity.gpus.clone(),
            index_order: d.index_order,
            nics: d.nics.clone(),
            rails: d.rails.clone(),
            signature: Some(d.signature()),
            findings: d.findings.clone(),
        }
    }

    pub fn from_map(map: &AffinityMap, order: IndexOrder, findings: Vec<Finding>) -> Self {
        Self {
            gpus: map.gpus.clone(),
            index_order: order,
            nics: Vec::new(),
            rails: Vec::new(),
            signature: None,
            findings,
        }
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// Affinity table, rails table and findings as aligned text.
pub fn render_table(j: &AffinityJson) -> String {
    let mut s = String::new();
    let order = match j.index_order {
        IndexOrder::Nvml => "NVML order",
        IndexOrder::Pci => "PCI order (NVML unavailable)",
        IndexOrder::Topo => "nvidia-smi order",
    };
    let _ = writeln!(s, "GPU affinity ({order})");
    let _ = writeln!(
        s,
        "{:<5} {:<14} {:<5} {:<5} ALTERNATES",
        "GPU", "PREFERRED", "NUMA", "PATH"
    );
    for g in &j.gpus {
        let (pref, path) = match &g.preferred {
            Some(p) => (
                match p.port {
                    Some(port) => format!("{}:{port}", p.hca),
                    None => p.hca.clone(),
                },
                p.path.to_string(),
            ),
            None => ("-".into(), "-".into()),
        };
        let alts: Vec<String> = g
            .alternates
            .iter()
            .map(|a| format!("{}({})", a.hca, a.path))
            .collect();
        let _ = writeln!(
            s,
            "{:<5} {:<14} {:<5} {:<5} {}",
            g.index,
            pref,
            opt(g.numa),
            path,
            if alts.is_empty() {
                "-".into()
            } else {
                alts.join(" ")
            }
        );
    }
    if !j.rails.is_empty() {
        let _ = writeln!(
            s,
            "\nRails{}",
            j.signature
                .as_ref()
                .map_or(String::new(), |x| format!(" (signature {x})"))
        );
        let _ = writeln!(
            s,
            "{:<14} {:<5} {:<7} {:<9} {:<12} GPUS",
            "RAIL", "LL", "STATE", "RATE", "NETDEV"
        );
        for r in &j.rails {
            let gpus: Vec<String> = r.gpus.iter().map(u32::to_string).collect();
            let _ = writeln!(
                s,
                "{:<14} {:<5} {:<7} {:<9} {:<12} {}",
                format!("{}:{}", r.hca, r.port),
                opt(r.link_layer),
                r.state.as_str(),
                r.rate_gbps.map_or("-".into(), |v| format!("{v} Gb/s")),
                r.netdev.as_deref().unwrap_or("-"),
                if gpus.is_empty() {
                    "-".into()
                } else {
                    gpus.join(",")
                }
            );
        }
        let storage: Vec<String> = j
            .nics
            .iter()
            .filter(|n| n.role == super::NicRole::Storage)
            .map(|n| format!("{}:{}", n.hca, n.port))
            .collect();
        if !storage.is_empty() {
            let _ = writeln!(s, "storage/management NICs: {}", storage.join(", "));
        }
    }
    let _ = writeln!(s, "\nFindings");
    if j.findings.is_empty() {
        let _ = writeln!(s, "none");
    }
    for f in &j.findings {
        let sev = format!("{:?}", f.severity).to_uppercase();
        let _ = writeln!(s, "[{sev}] {}", f.message);
        for e in &f.evidence {
            let _ = writeln!(s, "    {e}");
        }
    }
    s
}
