//! The fleet controller's Prometheus metrics and health.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use railguard_fleet::{report, FleetAnalysis};

/// Every metric the controller exports, as scraped (counters with `_total`); the chart's
/// Grafana dashboard is checked against this list.
pub const METRIC_NAMES: &[&str] = &[
    "railguard_fleet_nodes",
    "railguard_fleet_outliers",
    "railguard_fleet_baseline_median",
    "railguard_fleet_baseline_spread",
    "railguard_fleet_drift_worse_percent",
    "railguard_fleet_node_distance_spreads",
    "railguard_fleet_node_rail_relative",
    "railguard_fleet_recompute_seconds",
    "railguard_fleet_recomputes_total",
    "railguard_fleet_tainted_nodes",
    "railguard_fleet_device_taint_rules",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProfileLabels {
    profile: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MeasurementLabels {
    profile: String,
    measurement: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    profile: String,
    node: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RailLabels {
    profile: String,
    node: String,
    rail: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaintLabels {
    profile: String,
    reason: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct FleetMetrics {
    registry: Registry,
    nodes: Family<ProfileLabels, Gauge>,
    outliers: Family<ProfileLabels, Gauge>,
    median: Family<MeasurementLabels, FloatGauge>,
    spread: Family<MeasurementLabels, FloatGauge>,
    drift: Family<MeasurementLabels, FloatGauge>,
    distance: Family<NodeLabels, FloatGauge>,
    relative: Family<RailLabels, FloatGauge>,
    recompute: Histogram,
    recomputes: Family<OutcomeLabels, Counter>,
    tainted: Family<TaintLabels, Gauge>,
    device_taint_rules: Gauge,
    /// The families above are replaced as a whole per recomputation; a scrape waits for it.
    update: Mutex<()>,
    ready: AtomicBool,
    alive_at: Mutex<Instant>,
    stall_after: Duration,
}

impl FleetMetrics {
    pub fn new(stall_after: Duration) -> Self {
        let mut registry = Registry::default();
        let m = FleetMetrics {
            nodes: Family::default(),
            outliers: Family::default(),
            median: Family::default(),
            spread: Family::default(),
            drift: Family::default(),
            distance: Family::default(),
            relative: Family::default(),
            recompute: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            recomputes: Family::default(),
            tainted: Family::default(),
            device_taint_rules: Gauge::default(),
            update: Mutex::new(()),
            ready: AtomicBool::new(false),
            alive_at: Mutex::new(Instant::now()),
            stall_after,
            registry: Registry::default(),
        };
        registry.register(
            "railguard_fleet_nodes",
            "Certified nodes the profile's baseline is computed from",
            m.nodes.clone(),
        );
        registry.register(
            "railguard_fleet_outliers",
            "Nodes of the profile marked as fleet outliers",
            m.outliers.clone(),
        );
        registry.register(
            "railguard_fleet_baseline_median",
            "Fleet median of a measurement (Gb/s, GB/s or us, see the measurement)",
            m.median.clone(),
        );
        registry.register(
            "railguard_fleet_baseline_spread",
            "Robust spread (1.4826 x MAD, floored) of a measurement",
            m.spread.clone(),
        );
        registry.register(
            "railguard_fleet_drift_worse_percent",
            "How much worse a measurement's fleet median is than its history, for drifting measurements",
            m.drift.clone(),
        );
        registry.register(
            "railguard_fleet_node_distance_spreads",
            "A node's worst signed distance from the baseline over its measurements, in spreads (negative: worse)",
            m.distance.clone(),
        );
        registry.register(
            "railguard_fleet_node_rail_relative",
            "A rail's host write bandwidth relative to the fleet median (1 = median)",
            m.relative.clone(),
        );
        registry.register(
            "railguard_fleet_recompute_seconds",
            "Time to recompute every profile's baseline and marks",
            m.recompute.clone(),
        );
        registry.register(
            "railguard_fleet_recomputes",
            "Recomputations by outcome (ok, error)",
            m.recomputes.clone(),
        );
        registry.register(
            "railguard_fleet_tainted_nodes",
            "Nodes of the profile that should carry the railguard.io/fabric-unhealthy taint, by reason (failed, degraded, expired, outlier)",
            m.tainted.clone(),
        );
        registry.register(
            "railguard_fleet_device_taint_rules",
            "DRA DeviceTaintRules railguard keeps for unhealthy rails (0 where DRA is not served)",
            m.device_taint_rules.clone(),
        );
        FleetMetrics { registry, ..m }
    }

    /// The number of DeviceTaintRules the last reconciliation wanted.
    pub fn publish_device_taints(&self, rules: usize) {
        self.device_taint_rules
            .set(i64::try_from(rules).unwrap_or(i64::MAX));
    }

    /// Replaces the taint series: nodes by profile and reason.
    pub fn publish_taints(
        &self,
        counts: &std::collections::BTreeMap<(String, &'static str), usize>,
    ) {
        let _guard = self.update.lock().unwrap_or_else(|p| p.into_inner());
        self.tainted.clear();
        for ((profile, reason), n) in counts {
            self.tainted
                .get_or_create(&TaintLabels {
                    profile: profile.clone(),
                    reason: (*reason).to_string(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Replaces the per-profile and per-node series with those of `analyses`.
    pub fn publish(&self, analyses: &[FleetAnalysis], drift: &[(String, String, f64)]) {
        let _guard = self.update.lock().unwrap_or_else(|p| p.into_inner());
        for f in [&self.median, &self.spread, &self.drift] {
            f.clear();
        }
        self.distance.clear();
        self.relative.clear();
        self.nodes.clear();
        self.outliers.clear();
        for a in analyses {
            let p = ProfileLabels {
                profile: a.profile.clone(),
            };
            self.nodes
                .get_or_create(&p)
                .set(i64::try_from(a.certified).unwrap_or(i64::MAX));
            self.outliers
                .get_or_create(&p)
                .set(i64::try_from(a.outliers.len()).unwrap_or(i64::MAX));
            for (m, b) in &a.baseline {
                let l = MeasurementLabels {
                    profile: a.profile.clone(),
                    measurement: m.to_string(),
                };
                self.median.get_or_create(&l).set(b.median);
                self.spread.get_or_create(&l).set(b.spread);
            }
            let rails = report::rails(a);
            for row in report::rows(a) {
                if let Some(d) = row.worst_distance {
                    self.distance
                        .get_or_create(&NodeLabels {
                            profile: a.profile.clone(),
                            node: row.node.clone(),
                        })
                        .set(d);
                }
                for (rail, v) in rails.iter().zip(&row.relative) {
                    if let Some(v) = v {
                        self.relative
                            .get_or_create(&RailLabels {
                                profile: a.profile.clone(),
                                node: row.node.clone(),
                                rail: rail.clone(),
                            })
                            .set(*v);
                    }
                }
            }
        }
        for (profile, measurement, worse) in drift {
            self.drift
                .get_or_create(&MeasurementLabels {
                    profile: profile.clone(),
                    measurement: measurement.clone(),
                })
                .set(*worse);
        }
    }

    pub fn recomputed(&self, took: Duration, ok: bool) {
        self.recompute.observe(took.as_secs_f64());
        self.recomputes
            .get_or_create(&OutcomeLabels {
                outcome: if ok { "ok" } else { "error" },
            })
            .inc();
        if ok {
            self.ready.store(true, Ordering::Relaxed);
        }
    }

    /// The loop is alive (called every turn, also while waiting).
    pub fn heartbeat(&self) {
        *self.alive_at.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn alive(&self) -> bool {
        self.alive_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            < self.stall_after
    }

    pub fn encode(&self) -> String {
        let _guard = self.update.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::error!("cannot encode metrics");
        }
        out
    }
}

impl crate::health::Observed for FleetMetrics {
    fn encode(&self) -> String {
        FleetMetrics::encode(self)
    }
    fn alive(&self) -> bool {
        FleetMetrics::alive(self)
    }
    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
    const STUCK: &'static str = "the fleet loop is stuck";
    const NOT_READY: &'static str = "no recomputation finished yet";
}

#[cfg(test)]
mod tests {
    use super::*;
    use railguard_api::fleet::FleetSpec;
    use railguard_fleet::{analyze_fleet, Figures, FleetNode, Measurement, MeasurementKind};

    fn fleet() -> Vec<FleetAnalysis> {
        let nodes = (0..10)
            .map(|i| {
                let bw = if i == 3 { 320.0 } else { 384.0 };
                FleetNode {
                    name: format!("gpu-{i}"),
                    state: "certified",
                    certified: true,
                    figures: Figures::from([(
                        Measurement::rail(MeasurementKind::WriteBwHost, "mlx5_0:1"),
                        bw,
                    )]),
                    healthy_rails: 1,
                }
            })
            .collect();
        vec![analyze_fleet("h100", &FleetSpec::default(), nodes)]
    }

    /// The names the dashboard is checked against are exactly the families exported.
    #[test]
    fn metric_names_are_the_exported_families() {
        let m = FleetMetrics::new(Duration::from_secs(60));
        m.publish(
            &fleet(),
            &[("h100".into(), "writeBwHost/mlx5_0:1".into(), 9.5)],
        );
        m.recomputed(Duration::from_millis(3), true);
        let text = m.encode();
        let mut exported: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(|n| {
                if n == "railguard_fleet_recomputes" {
                    format!("{n}_total")
                } else {
                    n.to_string()
                }
            })
            .collect();
        exported.sort();
        let mut named: Vec<String> = METRIC_NAMES.iter().map(|s| s.to_string()).collect();
        named.sort();
        assert_eq!(exported, named, "{text}");
        assert!(
            text.contains("railguard_fleet_outliers{profile=\"h100\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("railguard_fleet_node_rail_relative{profile=\"h100\",node=\"gpu-3\",rail=\"mlx5_0:1\"} 0.8333"),
            "{text}"
        );
        assert!(text.contains("railguard_fleet_drift_worse_percent{profile=\"h100\",measurement=\"writeBwHost/mlx5_0:1\"} 9.5"), "{text}");
        // A recomputation replaces the series: a profile gone is gone from the metrics.
        m.publish(&[], &[]);
        assert!(!m.encode().contains("profile=\"h100\""));
    }
}
