//! Prometheus metrics of the extender, served on the separate metrics port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// `nodes` (full Node objects) or `names` (nodeCacheCapable).
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `rejected`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    pub cache: &'static str,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~1.6 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// All extender metrics and the registry that exposes them.
pub struct Metrics {
    pub registry: Registry,
    pub filter_seconds: Family<ModeLabels, Histogram, fn() -> Histogram>,
    pub prioritize_seconds: Family<ModeLabels, Histogram, fn() -> Histogram>,
    pub nodes_rejected: Family<ReasonLabels, Counter>,
    pub request_errors: Family<ReasonLabels, Counter>,
    pub cache_age_seconds: Family<CacheLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub cache_objects: Family<CacheLabels, Gauge>,
    pub watch_errors: Family<CacheLabels, Counter>,
    /// 1 for each FabricProfile skipped as invalid, by name.
    pub profiles_invalid: railguard_kube::InvalidProfileGauge,
    pub tls_reloads: Family<ResultLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("railguard_extender");
        let filter_seconds =
            Family::<ModeLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            );
        let prioritize_seconds =
            Family::<ModeLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            );
        let nodes_rejected = Family::<ReasonLabels, Counter>::default();
        let request_errors = Family::<ReasonLabels, Counter>::default();
        let cache_age_seconds = Family::default();
        let cache_objects = Family::<CacheLabels, Gauge>::default();
        let watch_errors = Family::<CacheLabels, Counter>::default();
        let profiles_invalid = railguard_kube::InvalidProfileGauge::default();
        registry.register(
            "fabric_profiles_invalid",
            "FabricProfiles skipped as invalid (1 per profile, by name)",
            profiles_invalid.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "filter_duration_seconds",
            "Time to answer a /filter call, decoding included",
            filter_seconds.clone(),
        );
        registry.register(
            "prioritize_duration_seconds",
            "Time to answer a /prioritize call, decoding included",
            prioritize_seconds.clone(),
        );
        registry.register(
            "nodes_rejected",
            "Nodes rejected by /filter, by reason",
            nodes_rejected.clone(),
        );
        registry.register(
            "request_errors",
            "Requests answered with an Error or HTTP 400, by reason",
            request_errors.clone(),
        );
        registry.register(
            "cache_age_seconds",
            "Seconds since the cache last heard from the API server (list or watch event)",
            cache_age_seconds.clone(),
        );
        registry.register(
            "cache_objects",
            "Objects held by each cache",
            cache_objects.clone(),
        );
        registry.register(
            "watch_errors",
            "Errors of the cache watches (they retry with backoff)",
            watch_errors.clone(),
        );
        registry.register(
            "tls_reloads",
            "Reloads of the TLS files of --listen, by result",
            tls_reloads.clone(),
        );
        Metrics {
            registry,
            filter_seconds,
            prioritize_seconds,
            nodes_rejected,
            request_errors,
            cache_age_seconds,
            cache_objects,
            watch_errors,
            profiles_invalid,
            tls_reloads,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
