//! The node's own history: medians of its last passing results (the regression baseline)
//! and what changed in its software since the last pass.

use std::collections::BTreeMap;

use railguard_api::certificate::HistoryEntry;
use railguard_api::Verdict;

use crate::nccl::perf::median;

/// Medians over the node's last passing results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistoryMedians {
    pub busbw_plateau_gbps: Option<f64>,
    /// Host-memory write bandwidth per rail (`hca:port`).
    pub rail_write_bw_gbps: BTreeMap<String, f64>,
    /// How many passing results the medians come from.
    pub passes: usize,
}

/// Medians of the last `depth` passing (`certified`) entries, newest last in `history`.
pub fn history_medians(history: &[HistoryEntry], depth: usize) -> HistoryMedians {
    let passes: Vec<&HistoryEntry> = history
        .iter()
        .rev()
        .filter(|h| h.verdict == Verdict::Certified)
        .take(depth.max(1))
        .collect();
    let busbw = median(passes.iter().filter_map(|h| h.busbw_plateau_gbps).collect());
    let mut per_rail: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for h in &passes {
        for (rail, bw) in &h.rail_write_bw_gbps {
            per_rail.entry(rail.clone()).or_default().push(*bw);
        }
    }
    HistoryMedians {
        busbw_plateau_gbps: busbw,
        rail_write_bw_gbps: per_rail
            .into_iter()
            .filter_map(|(k, v)| median(v).map(|m| (k, m)))
            .collect(),
        passes: passes.len(),
    }
}

/// What changed in the software baseline since the last passing entry, e.g.
/// `driver 550.54 -> 560.28, nccl 2.21.5 -> 2.23.4`; `None` when nothing did or there is no
/// earlier pass.
pub fn software_changes(
    history: &[HistoryEntry],
    current: &BTreeMap<String, String>,
) -> Option<String> {
    let last = history
        .iter()
        .rev()
        .find(|h| h.verdict == Verdict::Certified)?;
    let diff = software_diff(&last.software, current);
    if diff.is_empty() {
        None
    } else {
        Some(diff.join(", "))
    }
}

/// `key old -> new` for every key whose value differs (`none` for a missing side).
pub fn software_diff(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let a = old.get(k);
            let b = new.get(k);
            if a == b {
                return None;
            }
            let show = |v: Option<&String>| v.map(|s| short(s)).unwrap_or_else(|| "none".into());
            Some(format!("{k} {} -> {}", show(a), show(b)))
        })
        .collect()
}

/// Digests are long; 12 hex digits identify a binary well enough in a reason.
fn short(v: &str) -> String {
    if v.len() == 64 && v.chars().all(|c| c.is_ascii_hexdigit()) {
        v[..12].to_string()
    } else {
        v.to_string()
    }
}
