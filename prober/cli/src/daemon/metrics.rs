//! The daemon's Prometheus metrics and its health endpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use railguard_api::Certificate;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RailLabels {
    rail: String,
    memory: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabels {
    rail: String,
    counter: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    verdict: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    kind: String,
    outcome: String,
}

/// The daemon's metrics, readiness and liveness.
pub struct Metrics {
    registry: Registry,
    rail_bw: Family<RailLabels, Gauge<f64, AtomicU64>>,
    counter_delta: Family<CounterLabels, Gauge>,
    verdict: Family<VerdictLabels, Gauge>,
    busbw: Gauge<f64, AtomicU64>,
    /// `expiresAt` of the node's certificate, Unix seconds (0 before the first).
    expires_at: Gauge,
    runs: Family<RunLabels, Counter>,
    /// Passive rail telemetry (`super::telemetry`), published by its own task.
    pub(crate) telemetry: super::telemetry::TelemetryMetrics,
    ready: AtomicBool,
    alive_at: Mutex<Instant>,
    /// The loop is stuck when its last heartbeat is older than this (set again once the
    /// profile, which bounds a run, is known).
    stall_after: Mutex<Duration>,
    /// 1 for each FabricProfile skipped as invalid, by name.
    profiles_invalid: railguard_kube::InvalidProfileGauge,
    /// 1 while this node is a GPU node no FabricProfile matches (`crate::unprofiled`).
    unprofiled: Gauge,
}

impl Metrics {
    /// Metrics of a loop that beats at least every `stall_after` while it makes progress.
    pub fn new(stall_after: Duration) -> Self {
        let mut registry = Registry::with_prefix("railguard_prober");
        let rail_bw = Family::<RailLabels, Gauge<f64, AtomicU64>>::default();
        let counter_delta = Family::<CounterLabels, Gauge>::default();
        let verdict = Family::<VerdictLabels, Gauge>::default();
        let busbw = Gauge::<f64, AtomicU64>::default();
        let expires_at = Gauge::default();
        let runs = Family::<RunLabels, Counter>::default();
        registry.register(
            "rail_write_bandwidth_gbps",
            "RDMA WRITE bandwidth per rail of the last invasive run",
            rail_bw.clone(),
        );
        registry.register(
            "rail_counter_delta",
            "Error counter growth per rail over the last check window",
            counter_delta.clone(),
        );
        registry.register(
            "verdict",
            "1 for the node's current verdict",
            verdict.clone(),
        );
        registry.register(
            "nccl_busbw_plateau_gbps",
            "NCCL all_reduce busbw plateau of the last invasive run",
            busbw.clone(),
        );
        registry.register(
            "certificate_expires_at_seconds",
            "expiresAt of the node's certificate, Unix seconds",
            expires_at.clone(),
        );
        registry.register("runs", "Checks run, by kind and outcome", runs.clone());
        let telemetry = super::telemetry::TelemetryMetrics::register(&mut registry);
        let profiles_invalid = railguard_kube::InvalidProfileGauge::default();
        registry.register(
            "fabric_profiles_invalid",
            "FabricProfiles skipped as invalid (1 per profile, by name)",
            profiles_invalid.clone(),
        );
        let unprofiled = Gauge::default();
        registry.register(
            "unprofiled",
            "1 while this node is a GPU node that no FabricProfile matches (nothing is certified)",
            unprofiled.clone(),
        );
        Metrics {
            registry,
            rail_bw,
            counter_delta,
            verdict,
            busbw,
            expires_at,
            runs,
            telemetry,
            ready: AtomicBool::new(false),
            alive_at: Mutex::new(Instant::now()),
            stall_after: Mutex::new(stall_after),
            profiles_invalid,
            unprofiled,
        }
    }

    pub(crate) fn record(&self, cert: &Certificate, kind: &str) {
        for v in ["certified", "degraded", "failed", "pending"] {
            self.verdict
                .get_or_create(&VerdictLabels { verdict: v.into() })
                .set(i64::from(cert.verdict.as_label() == v));
        }
        for r in &cert.rails {
            for (mem, bw) in [("host", r.write_bw_host_gbps), ("gpu", r.write_bw_gpu_gbps)] {
                if let Some(bw) = bw {
                    self.rail_bw
                        .get_or_create(&RailLabels {
                            rail: r.id(),
                            memory: mem.into(),
                        })
                        .set(bw);
                }
            }
            for (c, d) in &r.counter_deltas {
                self.counter_delta
                    .get_or_create(&CounterLabels {
                        rail: r.id(),
                        counter: c.clone(),
                    })
                    .set(i64::try_from(*d).unwrap_or(i64::MAX));
            }
        }
        if let Some(b) = cert.nccl.as_ref().and_then(|n| n.busbw_plateau_gbps) {
            self.busbw.set(b);
        }
        self.expires_at.set(cert.expires_at.as_second());
        self.run(kind, cert.verdict.as_label());
        self.ready.store(true, Ordering::Relaxed);
    }

    pub(crate) fn run(&self, kind: &str, outcome: &str) {
        self.runs
            .get_or_create(&RunLabels {
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The loop made progress (one step started).
    pub(crate) fn heartbeat(&self) {
        if let Ok(mut t) = self.alive_at.lock() {
            *t = Instant::now();
        }
    }

    /// Whether the loop beat within `stall_after` (what `/healthz` answers).
    pub fn alive(&self) -> bool {
        let stall_after = self.stall_after.lock().map(|d| *d).unwrap_or_default();
        self.alive_at
            .lock()
            .map(|t| t.elapsed() <= stall_after)
            .unwrap_or(false)
    }

    pub(crate) fn set_stall_after(&self, stall_after: Duration) {
        if let Ok(mut d) = self.stall_after.lock() {
            *d = stall_after;
        }
    }

    /// Sets `fabric_profiles_invalid` from what changed.
    pub(crate) fn record_invalid_profiles(
        &self,
        changes: &railguard_api::profile_list::ProfileChanges,
    ) {
        railguard_kube::record_profile_changes(changes, &self.profiles_invalid);
    }

    /// Sets `unprofiled`: whether this node is a GPU node no profile matches.
    pub(crate) fn set_unprofiled(&self, unprofiled: bool) {
        self.unprofiled.set(i64::from(unprofiled));
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        if prometheus_client::encoding::text::encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        s
    }
}

impl crate::health::Observed for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }
    fn alive(&self) -> bool {
        Metrics::alive(self)
    }
    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
    const STUCK: &'static str = "the check loop is stuck";
    const NOT_READY: &'static str = "no check finished yet";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_heartbeat() {
        let m = Metrics::new(Duration::from_millis(50));
        assert!(m.alive());
        std::thread::sleep(Duration::from_millis(80));
        assert!(!m.alive(), "no heartbeat within the bound");
        m.heartbeat();
        assert!(m.alive());
    }

    #[test]
    fn the_unprofiled_gauge_is_exported_and_follows_the_node() {
        let m = Metrics::new(Duration::from_secs(60));
        assert!(m.encode().contains("railguard_prober_unprofiled 0\n"));
        m.set_unprofiled(true);
        assert!(m.encode().contains("railguard_prober_unprofiled 1\n"));
        m.set_unprofiled(false);
        assert!(m.encode().contains("railguard_prober_unprofiled 0\n"));
    }
}
