//! The fleet as operators read it: one row per node with its verdict, outlier marks and
//! per-rail host bandwidth relative to the baseline, as a text table (and, in
//! [`super::html`], a heatmap).

use std::fmt::Write as _;

use super::{FleetAnalysis, Measurement, MeasurementKind};

/// One node's row.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    pub node: String,
    /// `certified`, `degraded`, ...
    pub state: &'static str,
    /// The node's outlier marks, worst first, as the condition words them.
    pub outliers: Vec<String>,
    /// Host write bandwidth relative to the baseline median, per rail of [`rails`]
    /// (`None`: no figure or no baseline for that rail).
    pub relative: Vec<Option<f64>>,
    /// The largest distance from the median on the worse side over all measurements, in
    /// spreads (negative: worse); `None` without a baseline.
    pub worst_distance: Option<f64>,
}

/// The rails of a fleet (every rail any node reported), in order.
pub fn rails(a: &FleetAnalysis) -> Vec<String> {
    let mut out: Vec<String> = a
        .nodes
        .iter()
        .flat_map(|n| n.figures.keys())
        .filter(|m| m.kind == MeasurementKind::WriteBwHost)
        .filter_map(|m| m.rail.clone())
        .collect();
    out.sort_by_key(|r| natural_key(r));
    out.dedup();
    out
}

/// `mlx5_10:1` after `mlx5_9:1`: the text around each run of digits, and the run's value.
fn natural_key(s: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut digits = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            if !digits.is_empty() {
                out.push((
                    std::mem::take(&mut text),
                    digits.parse().unwrap_or(u64::MAX),
                ));
                digits.clear();
            }
            text.push(c);
        }
    }
    out.push((text, digits.parse().unwrap_or(0)));
    out
}

/// The rows of a fleet, by node name.
pub fn rows(a: &FleetAnalysis) -> Vec<NodeRow> {
    // Each rail's key and baseline once, not per node.
    let columns: Vec<(Measurement, Option<&super::Baseline>)> = rails(a)
        .into_iter()
        .map(|r| {
            let m = Measurement::rail(MeasurementKind::WriteBwHost, r);
            let b = a.baseline.get(&m);
            (m, b)
        })
        .collect();
    a.nodes
        .iter()
        .map(|n| {
            let relative = columns
                .iter()
                .map(|(m, b)| Some((*b)?.relative(*n.figures.get(m)?)))
                .collect();
            let worst_distance = n
                .figures
                .iter()
                .filter_map(|(m, v)| Some(a.baseline.get(m)?.distance(m.kind, *v)))
                .min_by(f64::total_cmp);
            NodeRow {
                node: n.name.clone(),
                state: n.state,
                outliers: a
                    .outliers
                    .get(&n.name)
                    .map(|l| l.iter().map(ToString::to_string).collect())
                    .unwrap_or_default(),
                relative,
                worst_distance,
            }
        })
        .collect()
}

/// The text table of one profile's fleet.
pub fn table(a: &FleetAnalysis) -> String {
    let rails = rails(a);
    let rows = rows(a);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "profile {}: {} certified node(s), {} outlier(s){}",
        a.profile,
        a.certified,
        a.outliers.len(),
        match &a.no_baseline {
            Some(why) => format!(", no baseline: {why}"),
            None => String::new(),
        }
    );
    for (m, n) in &a.split {
        let _ = writeln!(
            out,
            "  split: {m} would mark {n} nodes, more than the profile allows: none marked"
        );
    }
    let width = rows.iter().map(|r| r.node.len()).max().unwrap_or(4).max(4);
    let _ = write!(
        out,
        "{:<width$}  {:<10}  {:<7}",
        "NODE", "VERDICT", "OUTLIER"
    );
    for r in &rails {
        let _ = write!(out, "  {r:>9}");
    }
    out.push('\n');
    for row in &rows {
        let _ = write!(
            out,
            "{:<width$}  {:<10}  {:<7}",
            row.node,
            row.state,
            if row.outliers.is_empty() { "-" } else { "yes" }
        );
        for rel in &row.relative {
            match rel {
                Some(v) => {
                    let _ = write!(out, "  {:>8.1}%", v * 100.0);
                }
                None => {
                    let _ = write!(out, "  {:>9}", "-");
                }
            }
        }
        out.push('\n');
        for mark in &row.outliers {
            let _ = writeln!(out, "{:<width$}    {mark}", "");
        }
    }
    out
}
