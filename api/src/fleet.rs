//! The fleet comparison's contract: how a FabricProfile sets it (`spec.fleet`), what the
//! fleet controller (`railguard-prober fleet --watch`) writes back (`status.fleet`), and the
//! Node condition that marks an outlier.
//!
//! A node can pass its profile's fixed thresholds and still be the slowest of its pool. The
//! fleet controller holds each measurement of every certified node against that profile's
//! fleet: the median, and a robust spread (1.4826 × the median absolute deviation, floored
//! at `minSpreadPercent` of the median so a fleet of identical figures does not turn noise
//! into blame). A node more than `outlierSpreads` spreads on the bad side is an outlier.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::FieldProblem;

/// What a figure measures. Bandwidths are better higher, latency lower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MeasurementKind {
    /// Per rail: RDMA WRITE bandwidth from host memory, Gb/s.
    WriteBwHost,
    /// Per rail: RDMA WRITE bandwidth from GPU memory (GPUDirect), Gb/s.
    WriteBwGpu,
    /// Per rail: small-message RDMA WRITE latency, µs.
    Latency,
    /// Per node: the NCCL all_reduce bus bandwidth plateau, GB/s.
    BusbwPlateau,
    /// Per node (full-node test) or per rail: the median busbw of the last campaign's NCCL
    /// pair tests, GB/s.
    PairBusbw,
}

impl MeasurementKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MeasurementKind::WriteBwHost => "writeBwHost",
            MeasurementKind::WriteBwGpu => "writeBwGpu",
            MeasurementKind::Latency => "latency",
            MeasurementKind::BusbwPlateau => "busbwPlateau",
            MeasurementKind::PairBusbw => "pairBusbw",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            MeasurementKind::WriteBwHost | MeasurementKind::WriteBwGpu => "Gb/s",
            MeasurementKind::Latency => "µs",
            MeasurementKind::BusbwPlateau | MeasurementKind::PairBusbw => "GB/s",
        }
    }

    /// Whether a larger figure is better.
    pub fn higher_is_better(self) -> bool {
        !matches!(self, MeasurementKind::Latency)
    }
}

/// One measurement: its kind and, for per-rail figures, the rail (`hca:port`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Measurement {
    pub kind: MeasurementKind,
    pub rail: Option<String>,
}

impl Measurement {
    pub fn node(kind: MeasurementKind) -> Self {
        Measurement { kind, rail: None }
    }

    pub fn rail(kind: MeasurementKind, rail: impl Into<String>) -> Self {
        Measurement {
            kind,
            rail: Some(rail.into()),
        }
    }
}

/// `writeBwHost/mlx5_0:1`, `busbwPlateau`: the key in `status.fleet` and in metrics.
impl fmt::Display for Measurement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rail {
            Some(r) => write!(f, "{}/{r}", self.kind.as_str()),
            None => f.write_str(self.kind.as_str()),
        }
    }
}

/// What the extender does with a node the fleet controller marked as an outlier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OutlierAction {
    /// Keep it schedulable, but score it last for multi-node jobs.
    #[default]
    Score,
    /// Filter it out for every training pod of the profile.
    Filter,
}

/// `spec.fleet`: the fleet comparison of a profile's nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetSpec {
    /// A node is an outlier when a measurement is more than this many robust spreads worse
    /// than the fleet median. 3.5 is the usual cut for the MAD-based modified z-score
    /// (Iglewicz and Hoaglin); with the spread floor it means at least 3.5% below.
    #[serde(default = "default_outlier_spreads")]
    pub outlier_spreads: f64,
    /// Floor of the robust spread, percent of the median: the run-to-run noise of a healthy
    /// rail (perftest bandwidth repeats within about 1%).
    #[serde(default = "default_min_spread_percent")]
    pub min_spread_percent: f64,
    /// With fewer certified nodes than this there is no baseline and nobody is marked.
    #[serde(default = "default_min_nodes")]
    pub min_nodes: u32,
    /// The most nodes one measurement may mark, percent of the fleet. Beyond it the fleet
    /// has two populations (a roll-out half done): nobody is marked for that measurement,
    /// and the profile's status reports the split instead.
    #[serde(default = "default_max_outlier_percent")]
    pub max_outlier_percent: f64,
    /// What the extender does with an outlier.
    #[serde(default)]
    pub outliers: OutlierAction,
    /// A baseline median this many percent worse than the median of its own history is
    /// fleet drift (a driver or firmware roll-out), reported on the profile, not the nodes.
    #[serde(default = "default_drift_tolerance_percent")]
    pub drift_tolerance_percent: f64,
    /// Baseline snapshots kept in `status.fleet.history`.
    #[serde(default = "default_fleet_history_depth")]
    pub history_depth: u32,
    /// The least time between two kept snapshots, seconds.
    #[serde(default = "default_fleet_history_interval")]
    pub history_interval_seconds: u64,
}

fn default_outlier_spreads() -> f64 {
    3.5
}
fn default_min_spread_percent() -> f64 {
    1.0
}
fn default_min_nodes() -> u32 {
    8
}
fn default_max_outlier_percent() -> f64 {
    20.0
}
fn default_drift_tolerance_percent() -> f64 {
    5.0
}
fn default_fleet_history_depth() -> u32 {
    48
}
fn default_fleet_history_interval() -> u64 {
    3600
}

/// Bounds of `spec.fleet.historyDepth` (the status object stays small).
pub const MAX_FLEET_HISTORY_DEPTH: u32 = 500;
/// The smallest `spec.fleet.minNodes`: a median and a MAD of fewer mean nothing.
pub const MIN_FLEET_NODES: u32 = 3;

impl Default for FleetSpec {
    fn default() -> Self {
        Self {
            outlier_spreads: default_outlier_spreads(),
            min_spread_percent: default_min_spread_percent(),
            min_nodes: default_min_nodes(),
            max_outlier_percent: default_max_outlier_percent(),
            outliers: OutlierAction::default(),
            drift_tolerance_percent: default_drift_tolerance_percent(),
            history_depth: default_fleet_history_depth(),
            history_interval_seconds: default_fleet_history_interval(),
        }
    }
}

impl FleetSpec {
    pub(crate) fn problems(&self, out: &mut Vec<FieldProblem>) {
        let at = |f: &str| format!("spec.fleet.{f}");
        let mut positive = |field: &str, v: f64, max: f64| {
            if !v.is_finite() || v <= 0.0 || v > max {
                out.push(FieldProblem {
                    field: at(field),
                    message: format!("must be above 0 and at most {max}, got {v}"),
                });
            }
        };
        positive("outlierSpreads", self.outlier_spreads, 100.0);
        positive("minSpreadPercent", self.min_spread_percent, 100.0);
        positive("maxOutlierPercent", self.max_outlier_percent, 50.0);
        positive("driftTolerancePercent", self.drift_tolerance_percent, 100.0);
        if self.min_nodes < MIN_FLEET_NODES {
            out.push(FieldProblem {
                field: at("minNodes"),
                message: format!("must be at least {MIN_FLEET_NODES}"),
            });
        }
        if self.history_depth == 0 || self.history_depth > MAX_FLEET_HISTORY_DEPTH {
            out.push(FieldProblem {
                field: at("historyDepth"),
                message: format!("must be between 1 and {MAX_FLEET_HISTORY_DEPTH}"),
            });
        }
        if self.history_interval_seconds == 0 {
            out.push(FieldProblem {
                field: at("historyIntervalSeconds"),
                message: "must be positive".into(),
            });
        }
    }
}

/// One measurement's fleet baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeasurementBaseline {
    /// The measurement (`writeBwHost/mlx5_0:1`, `busbwPlateau`, ...).
    pub measurement: String,
    pub median: f64,
    /// Robust spread: 1.4826 × MAD, floored at `minSpreadPercent` of the median.
    pub spread: f64,
    /// Nodes that reported the measurement.
    pub nodes: u32,
}

/// Fleet-wide drift of one measurement: the baseline moved, not one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetDrift {
    pub measurement: String,
    /// The median of the kept snapshots' medians.
    pub reference: f64,
    pub current: f64,
    /// How much worse the current median is, percent of the reference.
    pub worse_percent: f64,
}

/// A measurement for which more nodes fell outside than `maxOutlierPercent` allows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetSplit {
    pub measurement: String,
    /// Nodes that would have been marked.
    pub nodes: u32,
}

/// A kept baseline: its time and the median of every measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaselineSnapshot {
    pub at: Time,
    pub nodes: u32,
    pub medians: BTreeMap<String, f64>,
}

/// `status.fleet`, written by the fleet controller (field manager `railguard-fleet`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub computed_at: Option<Time>,
    /// Certified nodes of the profile the baseline was computed from.
    pub nodes: u32,
    /// Why there is no baseline (too few certified nodes), when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_baseline: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline: Vec<MeasurementBaseline>,
    /// Number of nodes marked as outliers.
    pub outliers: u32,
    /// The first marked nodes, by name (at most [`MAX_LISTED_OUTLIERS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outlier_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<FleetDrift>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<FleetSplit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<BaselineSnapshot>,
    /// The fewest healthy rails any certified node of the profile has (absent without a
    /// certified node): what `spec.nccl.consistentRails` answers on every node, so one job
    /// never mixes nodes that give NCCL different rail counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_rail_count: Option<u32>,
}

/// How many outlier names `status.fleet.outlierNodes` lists.
pub const MAX_LISTED_OUTLIERS: usize = 50;

/// Reasons of the [`crate::keys::CONDITION_FLEET_OUTLIER`] Node condition and of the
/// fleet controller's Events.
pub mod reason {
    /// Condition `True`, Warning Event on the Node: a measurement is an outlier.
    pub const OUTLIER: &str = "FleetOutlier";
    /// Condition `False`: every measurement is within the fleet's spread.
    pub const WITHIN_BASELINE: &str = "WithinFleetBaseline";
    /// Condition `Unknown`: the profile has no baseline (too few certified nodes) or the
    /// node is not certified.
    pub const NO_BASELINE: &str = "NoFleetBaseline";
    /// Normal Event on the Node: it was an outlier and no longer is.
    pub const OUTLIER_CLEARED: &str = "FleetOutlierCleared";
    /// Warning Event on the FabricProfile: the baseline itself dropped.
    pub const DRIFT: &str = "FleetDrift";
}

/// The fleet mark of a Node as read from its [`crate::keys::CONDITION_FLEET_OUTLIER`]
/// condition (status `True`): the condition's message names the measurement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutlierMark {
    pub message: String,
}
