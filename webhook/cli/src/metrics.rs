//! Prometheus metrics of the webhook (served on the plain metrics port).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub outcome: String,
    pub profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub failure_mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

/// Labels of a node guard decision: `outcome` (`untouched`, `allowed`, `denied`, `ignored`,
/// `malformed`) and `writer` (who was allowed, or who asked when denied; see
/// [`railguard_webhook::node_guard::NodeAdmission`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeGuardLabels {
    pub outcome: String,
    pub writer: String,
}

/// Every metric the webhook exports.
pub struct Metrics {
    pub registry: Registry,
    /// Admissions by outcome and profile.
    pub admissions: Family<AdmissionLabels, Counter>,
    /// Time to decide one `/mutate` request (decode to encoded response).
    pub latency: Histogram,
    /// Admission warnings by kind.
    pub warnings: Family<KindLabels, Counter>,
    /// Internal errors building a patch, by failure mode.
    pub internal_errors: Family<ModeLabels, Counter>,
    /// Bodies that were not an AdmissionReview (HTTP 400).
    pub bad_requests: Counter,
    /// Certificate reloads by result (`ok`, `rejected`).
    pub tls_reloads: Family<ResultLabels, Counter>,
    /// Profiles usable now.
    pub profiles: Gauge,
    /// 1 for each FabricProfile skipped as invalid, by name.
    pub profiles_invalid: railguard_kube::InvalidProfileGauge,
    /// Node guard decisions (`/validate-nodes`) by outcome and writer.
    pub node_guard_decisions: Family<NodeGuardLabels, Counter>,
    /// Pod decisions taken from the decision cache (`hit`) or made (`miss`).
    pub decision_cache: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("railguard_webhook");
        let admissions = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admissions",
            "Pod admissions by outcome and profile",
            admissions.clone(),
        );
        // 25 µs .. ~0.4 s.
        let latency = Histogram::new(exponential_buckets(25e-6, 2.0, 15));
        registry.register(
            "admission_duration_seconds",
            "Time to decide one /mutate request",
            latency.clone(),
        );
        let warnings = Family::<KindLabels, Counter>::default();
        registry.register("warnings", "Admission warnings by kind", warnings.clone());
        let internal_errors = Family::<ModeLabels, Counter>::default();
        registry.register(
            "internal_errors",
            "Internal errors building a patch, by failure mode",
            internal_errors.clone(),
        );
        let bad_requests = Counter::default();
        registry.register(
            "bad_requests",
            "Request bodies that were not an AdmissionReview",
            bad_requests.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_reloads",
            "Certificate reloads by result",
            tls_reloads.clone(),
        );
        let profiles = Gauge::default();
        registry.register("profiles", "FabricProfiles in use", profiles.clone());
        let profiles_invalid = railguard_kube::InvalidProfileGauge::default();
        registry.register(
            "fabric_profiles_invalid",
            "FabricProfiles skipped as invalid (1 per profile, by name)",
            profiles_invalid.clone(),
        );
        let node_guard_decisions = Family::<NodeGuardLabels, Counter>::default();
        registry.register(
            "node_guard_decisions",
            "Node guard decisions on Node changes, by outcome and writer",
            node_guard_decisions.clone(),
        );
        let decision_cache = Family::<ResultLabels, Counter>::default();
        registry.register(
            "decision_cache_lookups",
            "Pod decisions answered from the decision cache (hit) or made (miss)",
            decision_cache.clone(),
        );
        Self {
            registry,
            admissions,
            latency,
            warnings,
            internal_errors,
            bad_requests,
            tls_reloads,
            profiles,
            profiles_invalid,
            node_guard_decisions,
            decision_cache,
        }
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
