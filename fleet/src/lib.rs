//! The fleet comparison: every certified node of a profile held against that profile's
//! fleet, per measurement, online from the certificates already on the Nodes.
//!
//! Pure functions over plain data: [`measurements`] reads a certificate into figures,
//! [`analyze_fleet`] computes the baseline (median and robust spread per measurement) and
//! marks outliers, [`drift`] compares the baseline with its own history, and
//! [`record_snapshot`] keeps that history. The controller (`railguard-prober fleet --watch`)
//! and the report only move data in and out.

pub mod cleanup;
pub mod html;
pub mod marks;
pub mod report;

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use railguard_api::fleet::{
    BaselineSnapshot, FleetDrift, FleetSpec, FleetSplit, FleetStatus, MeasurementBaseline,
    MAX_LISTED_OUTLIERS,
};
pub use railguard_api::fleet::{Measurement, MeasurementKind};
use railguard_api::Certificate;

/// The scale that makes the median absolute deviation estimate a standard deviation for
/// normally distributed figures (1 / Φ⁻¹(3/4)).
pub const MAD_SCALE: f64 = 1.4826;

/// The figures of one node's certificate, by measurement.
pub type Figures = BTreeMap<Measurement, f64>;

/// Reads the fleet's figures from a certificate: only finite, positive numbers count (a
/// rail that measured nothing is the certificate's business, not the fleet's).
pub fn measurements(cert: &Certificate) -> Figures {
    let mut out = Figures::new();
    let mut put = |m: Measurement, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite() && *v > 0.0) {
            out.insert(m, v);
        }
    };
    for r in &cert.rails {
        let id = r.id();
        put(
            Measurement::rail(MeasurementKind::WriteBwHost, &id),
            r.write_bw_host_gbps,
        );
        put(
            Measurement::rail(MeasurementKind::WriteBwGpu, &id),
            r.write_bw_gpu_gbps,
        );
        put(
            Measurement::rail(MeasurementKind::Latency, &id),
            r.latency_us,
        );
    }
    put(
        Measurement::node(MeasurementKind::BusbwPlateau),
        cert.nccl.as_ref().and_then(|n| n.busbw_plateau_gbps),
    );
    let mut pairs: BTreeMap<Option<String>, Vec<f64>> = BTreeMap::new();
    for p in cert.nccl_pairs() {
        if let Some(bw) = p.busbw_gbps.filter(|v| v.is_finite() && *v > 0.0) {
            pairs.entry(p.rail.clone()).or_default().push(bw);
        }
    }
    for (rail, mut v) in pairs {
        let m = Measurement {
            kind: MeasurementKind::PairBusbw,
            rail,
        };
        put(m, median(&mut v));
    }
    out
}

/// One node as the fleet sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetNode {
    pub name: String,
    /// `certified`, `degraded`, `expired`, ... ([`railguard_api::FabricState::kind`]).
    pub state: &'static str,
    /// Only certified nodes make and are held to the baseline.
    pub certified: bool,
    pub figures: Figures,
    /// Rails its certificate calls healthy (0 without a certificate).
    pub healthy_rails: usize,
}

impl FleetNode {
    /// Rails `cert` calls healthy.
    pub fn healthy_rails_of(cert: &Certificate) -> usize {
        cert.rails
            .iter()
            .filter(|r| r.verdict == railguard_api::RailVerdict::Healthy)
            .count()
    }
}

/// The baseline of one measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Baseline {
    pub median: f64,
    /// Robust spread: [`MAD_SCALE`] × MAD, floored at `minSpreadPercent` of the median.
    pub spread: f64,
    pub nodes: usize,
}

impl Baseline {
    /// Distance of `value` from the median in spreads, negative on the worse side.
    pub fn distance(&self, kind: MeasurementKind, value: f64) -> f64 {
        let d = (value - self.median) / self.spread;
        if kind.higher_is_better() {
            d
        } else {
            -d
        }
    }

    /// `value` relative to the median (1.0 = the median).
    pub fn relative(&self, value: f64) -> f64 {
        value / self.median
    }
}

/// A measurement of a node beyond the fleet's spread.
#[derive(Clone, Debug, PartialEq)]
pub struct Outlier {
    pub measurement: Measurement,
    pub value: f64,
    pub median: f64,
    pub spread: f64,
    /// Spreads on the worse side (positive).
    pub spreads: f64,
}

impl Outlier {
    /// How much worse than the median, percent.
    pub fn worse_percent(&self) -> f64 {
        let d = (self.value - self.median) / self.median * 100.0;
        if self.measurement.kind.higher_is_better() {
            -d
        } else {
            d
        }
    }
}

/// What a node's condition says: `rail mlx5_3:1 writeBwHost 326.4 Gb/s is 15.0% below the
/// fleet median 384.0 Gb/s (12.3 spreads, 12 nodes)`.
impl fmt::Display for Outlier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.measurement.kind;
        let side = if kind.higher_is_better() {
            "below"
        } else {
            "above"
        };
        if let Some(rail) = &self.measurement.rail {
            write!(f, "rail {rail} ")?;
        }
        write!(
            f,
            "{} {:.1} {unit} is {:.1}% {side} the fleet median {:.1} {unit} ({:.1} spreads)",
            kind.as_str(),
            self.value,
            self.worse_percent(),
            self.median,
            self.spreads,
            unit = kind.unit(),
        )
    }
}

/// The fleet of one profile, analysed.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetAnalysis {
    pub profile: String,
    /// Certified nodes the baseline came from.
    pub certified: usize,
    /// Empty when there are fewer than `minNodes` certified nodes.
    pub baseline: BTreeMap<Measurement, Baseline>,
    /// Why there is no baseline.
    pub no_baseline: Option<String>,
    /// Outlier measurements by node, worst first; only certified nodes are marked.
    pub outliers: BTreeMap<String, Vec<Outlier>>,
    /// Measurements that would have marked more than `maxOutlierPercent` of the fleet.
    pub split: Vec<(Measurement, usize)>,
    /// Every node of the profile, by name.
    pub nodes: Vec<FleetNode>,
    /// The fewest healthy rails of a certified node (`None` without one): the rail count
    /// every node of a job can give NCCL ([`FleetStatus::consistent_rail_count`]).
    pub consistent_rail_count: Option<usize>,
}

impl FleetAnalysis {
    pub fn is_outlier(&self, node: &str) -> bool {
        self.outliers.contains_key(node)
    }
}

/// The median of `v` (sorted in place); `None` for an empty slice.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The baseline of a set of figures (`None` for an empty set).
pub fn baseline_of(values: &mut [f64], min_spread_percent: f64) -> Option<Baseline> {
    let med = median(values)?;
    let mut dev: Vec<f64> = values.iter().map(|v| (v - med).abs()).collect();
    let mad = median(&mut dev).unwrap_or(0.0);
    let floor = med.abs() * min_spread_percent / 100.0;
    let spread = (MAD_SCALE * mad).max(floor);
    // A zero median and no spread: nothing to compare against.
    if spread <= 0.0 || !spread.is_finite() {
        return None;
    }
    Some(Baseline {
        median: med,
        spread,
        nodes: values.len(),
    })
}

/// Analyses one profile's fleet: the baseline from its certified nodes, then every
/// certified node's figures against it.
pub fn analyze_fleet(profile: &str, spec: &FleetSpec, nodes: Vec<FleetNode>) -> FleetAnalysis {
    let certified = nodes.iter().filter(|n| n.certified).count();
    // Only certified nodes take jobs (the extender turns the others away), so they alone
    // bound what a job's nodes can all give; no baseline is needed for that.
    let consistent_rail_count = nodes
        .iter()
        .filter(|n| n.certified)
        .map(|n| n.healthy_rails)
        .min();
    let mut out = FleetAnalysis {
        profile: profile.to_string(),
        certified,
        baseline: BTreeMap::new(),
        no_baseline: None,
        outliers: BTreeMap::new(),
        split: Vec::new(),
        nodes: Vec::new(),
        consistent_rail_count,
    };
    let min_nodes = usize::try_from(spec.min_nodes).unwrap_or(usize::MAX);
    if certified < min_nodes {
        out.no_baseline = Some(format!(
            "{certified} certified node(s), the baseline needs {min_nodes}"
        ));
        out.nodes = nodes;
        return out;
    }
    let mut values: BTreeMap<&Measurement, Vec<f64>> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.certified) {
        for (m, v) in &n.figures {
            values.entry(m).or_default().push(*v);
        }
    }
    for (m, mut v) in values {
        // A measurement only some nodes report (a campaign's pair test on a few) still
        // needs enough nodes to mean anything.
        if v.len() < min_nodes {
            continue;
        }
        if let Some(b) = baseline_of(&mut v, spec.min_spread_percent) {
            out.baseline.insert(m.clone(), b);
        }
    }
    let mut marks: BTreeMap<&Measurement, Vec<(&str, Outlier)>> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.certified) {
        for (m, v) in &n.figures {
            let Some(b) = out.baseline.get(m) else {
                continue;
            };
            let d = b.distance(m.kind, *v);
            if d < -spec.outlier_spreads {
                marks.entry(m).or_default().push((
                    n.name.as_str(),
                    Outlier {
                        measurement: m.clone(),
                        value: *v,
                        median: b.median,
                        spread: b.spread,
                        spreads: -d,
                    },
                ));
            }
        }
    }
    let max_marked = (certified as f64 * spec.max_outlier_percent / 100.0).floor() as usize;
    for (m, list) in marks {
        if list.len() > max_marked {
            out.split.push((m.clone(), list.len()));
            continue;
        }
        for (node, o) in list {
            out.outliers.entry(node.to_string()).or_default().push(o);
        }
    }
    for list in out.outliers.values_mut() {
        list.sort_by(|a, b| b.spreads.total_cmp(&a.spreads));
    }
    out.nodes = nodes;
    out
}

/// The medians of a baseline, keyed as in `status.fleet`.
pub fn medians(analysis: &FleetAnalysis) -> BTreeMap<String, f64> {
    analysis
        .baseline
        .iter()
        .map(|(m, b)| (m.to_string(), b.median))
        .collect()
}

/// The kind of a `status.fleet` measurement key (`writeBwHost/mlx5_0:1` → WriteBwHost).
pub fn kind_of_key(key: &str) -> Option<MeasurementKind> {
    let kind = key.split('/').next().unwrap_or(key);
    [
        MeasurementKind::WriteBwHost,
        MeasurementKind::WriteBwGpu,
        MeasurementKind::Latency,
        MeasurementKind::BusbwPlateau,
        MeasurementKind::PairBusbw,
    ]
    .into_iter()
    .find(|k| k.as_str() == kind)
}

/// Fleet drift: measurements whose current median is more than `driftTolerancePercent`
/// worse than the median of their kept snapshots' medians. Needs at least one snapshot.
pub fn drift(
    spec: &FleetSpec,
    history: &[BaselineSnapshot],
    current: &BTreeMap<String, f64>,
) -> Vec<FleetDrift> {
    let mut out = Vec::new();
    for (key, &now) in current {
        let Some(kind) = kind_of_key(key) else {
            continue;
        };
        let mut past: Vec<f64> = history
            .iter()
            .filter_map(|s| s.medians.get(key).copied())
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect();
        let Some(reference) = median(&mut past) else {
            continue;
        };
        let change = (now - reference) / reference * 100.0;
        let worse = if kind.higher_is_better() {
            -change
        } else {
            change
        };
        if worse > spec.drift_tolerance_percent {
            out.push(FleetDrift {
                measurement: key.clone(),
                reference,
                current: now,
                worse_percent: worse,
            });
        }
    }
    out
}

/// Appends the current medians to the history when the last snapshot is older than
/// `historyIntervalSeconds` (or there is none), keeping the newest `historyDepth`.
/// Snapshots come from baselines only: a fleet without one records nothing.
pub fn record_snapshot(
    spec: &FleetSpec,
    history: &[BaselineSnapshot],
    analysis: &FleetAnalysis,
    now: Timestamp,
) -> Vec<BaselineSnapshot> {
    let mut out = history.to_vec();
    if analysis.baseline.is_empty() {
        return out;
    }
    let interval = i64::try_from(spec.history_interval_seconds).unwrap_or(i64::MAX);
    let due = out
        .last()
        .is_none_or(|s| now.as_second().saturating_sub(s.at.0.as_second()) >= interval);
    if due {
        out.push(BaselineSnapshot {
            at: Time(now),
            nodes: u32::try_from(analysis.certified).unwrap_or(u32::MAX),
            medians: medians(analysis),
        });
    }
    let depth = usize::try_from(spec.history_depth).unwrap_or(usize::MAX);
    if out.len() > depth {
        out.drain(..out.len() - depth);
    }
    out
}

/// `status.fleet` for an analysis: drift is judged against the history before this
/// snapshot, so a new level is reported until it fills the history.
pub fn fleet_status(
    spec: &FleetSpec,
    analysis: &FleetAnalysis,
    history: &[BaselineSnapshot],
    now: Timestamp,
) -> FleetStatus {
    let current = medians(analysis);
    FleetStatus {
        computed_at: Some(Time(now)),
        nodes: u32::try_from(analysis.certified).unwrap_or(u32::MAX),
        no_baseline: analysis.no_baseline.clone(),
        baseline: analysis
            .baseline
            .iter()
            .map(|(m, b)| MeasurementBaseline {
                measurement: m.to_string(),
                median: b.median,
                spread: b.spread,
                nodes: u32::try_from(b.nodes).unwrap_or(u32::MAX),
            })
            .collect(),
        outliers: u32::try_from(analysis.outliers.len()).unwrap_or(u32::MAX),
        outlier_nodes: analysis
            .outliers
            .keys()
            .take(MAX_LISTED_OUTLIERS)
            .cloned()
            .collect(),
        drift: drift(spec, history, &current),
        split: analysis
            .split
            .iter()
            .map(|(m, n)| FleetSplit {
                measurement: m.to_string(),
                nodes: u32::try_from(*n).unwrap_or(u32::MAX),
            })
            .collect(),
        history: record_snapshot(spec, history, analysis, now),
        consistent_rail_count: analysis
            .consistent_rail_count
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    }
}

#[cfg(test)]
mod tests;
