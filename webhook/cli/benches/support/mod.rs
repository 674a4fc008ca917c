//! What the benches share: the profile, the review they send, and the `/noop` baseline the
//! server adds next to `/mutate`.

#![allow(dead_code)] // each bench uses its own part

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use k8s_openapi::api::core::v1::Pod;
use railguard_webhook::decisions::{CacheLimits, DecisionCache};
use railguard_webhook::error::DecodeError;
use railguard_webhook::review::{self, ReviewResponse};
use railguard_webhook::{FailureMode, NamespaceInfo, Warning, WarningKind, WebhookConfig};
use railguard_webhook_cli::catalog::Catalog;
use railguard_webhook_cli::metrics::Metrics;
use railguard_webhook_cli::server::{self, AppState};
use serde_json::json;

pub const H100: &str = include_str!("../../../../api/fixtures/profiles/dgx-h100-ndr.yaml");
const SAMPLE: &str = include_str!("../../../fixtures/admission-review-sample.json");

/// The review recorded from kube-apiserver 1.20, turned into an 8-GPU, 3-container pod.
pub fn review_body() -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_str(SAMPLE).expect("sample");
    let c0 = v["request"]["object"]["spec"]["containers"][0].clone();
    let mut trainer = c0.clone();
    trainer["name"] = json!("pytorch");
    trainer["resources"] =
        json!({"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}});
    trainer["env"] = json!([{"name": "MASTER_ADDR", "value": "llama-master-0"}]);
    let mut shipper = c0.clone();
    shipper["name"] = json!("log-shipper");
    let mut exporter = c0;
    exporter["name"] = json!("dcgm-exporter");
    v["request"]["object"]["spec"]["containers"] = json!([trainer, shipper, exporter]);
    serde_json::to_vec(&v).expect("review")
}

/// Environment knob of the benches: the decision cache's entries (the binary's
/// `--decision-cache-entries`; 0 decides every review, as before the cache).
pub const CACHE_ENTRIES_ENV: &str = "LOAD_DECISION_CACHE_ENTRIES";

/// The webhook's state as the binary builds it in standalone mode, with `yaml`'s profiles.
pub fn app_state(yaml: &str) -> Arc<AppState> {
    let profiles = railguard_api::profiles_from_yaml(yaml).expect("profiles parse");
    let max_entries = std::env::var(CACHE_ENTRIES_ENV)
        .map(|v| v.parse().expect("LOAD_DECISION_CACHE_ENTRIES: a count"))
        .unwrap_or(CacheLimits::default().max_entries);
    Arc::new(AppState {
        catalog: Catalog::standalone(profiles),
        config: WebhookConfig::default(),
        failure_mode: FailureMode::Open,
        metrics: Arc::new(Metrics::new()),
        decisions: DecisionCache::new(CacheLimits {
            max_entries,
            ..CacheLimits::default()
        }),
        node_guard: None,
    })
}

/// The review of [`review_body`] with the trainer's `MASTER_ADDR` set to `llama-master-<i>`:
/// a different pod for each `i`, so no decision of one answers another.
pub fn distinct_review_body(i: usize) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&review_body()).expect("review");
    v["request"]["object"]["spec"]["containers"][0]["env"][0]["value"] =
        json!(format!("llama-master-{i}"));
    serde_json::to_vec(&v).expect("review")
}

/// The library's admission routes plus the `/noop` baseline.
pub fn routes() -> Router<Arc<AppState>> {
    server::admission_routes().route("/noop", axum::routing::post(noop))
}

/// The baseline endpoint: decode the review and its Pod, allow, no patch (`/mutate` minus the
/// decision and the patch).
async fn noop(body: Bytes) -> Response {
    match noop_answer(&body) {
        Ok(answer) => ([(header::CONTENT_TYPE, "application/json")], answer).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    }
}

/// `/noop`'s answer to `body`.
pub fn noop_answer(body: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let request = review::decode(body)?;
    let mut response = ReviewResponse::allow(request.uid.clone());
    if let Some(raw) = request.object {
        if let Err(e) = serde_json::from_str::<Pod>(raw.get()) {
            let warning = Warning::new(WarningKind::Internal, format!("object is not a Pod: {e}"));
            response.warnings.push(warning.message);
        }
    }
    Ok(response.encode())
}

/// `/mutate`'s answer to `body` without the HTTP shell (no namespace lookup, no metrics), as
/// the handler decides it.
pub fn mutate_answer(body: &[u8], state: &AppState) -> Result<Vec<u8>, DecodeError> {
    let request = review::decode(body)?;
    let namespace = NamespaceInfo::new(request.namespace.as_deref().unwrap_or_default());
    let profiles = state.catalog.profiles();
    let admission = review::admit_cached(
        &request,
        &namespace,
        &profiles,
        &state.config,
        state.failure_mode,
        &state.decisions,
    );
    Ok(admission.response.encode())
}
