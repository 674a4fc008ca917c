//! The HTTP side: routers, handlers, how each request error is answered, and serving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use axum::Router;
use jiff::Timestamp;

use crate::metrics::{ModeLabels, ReasonLabels};
use crate::server::{answer_filter, answer_prioritize, AppState, Source};
use railguard_extender::error::ExtenderError;
use railguard_extender::wire::{Candidates, ExtenderArgs, ExtenderFilterResult, Request};

/// Counts a failed request by its metric reason.
fn count_error(state: &AppState, e: &ExtenderError) {
    state
        .metrics
        .request_errors
        .get_or_create(&ReasonLabels {
            reason: metric_reason(e),
        })
        .inc();
}

/// The `reason` label of the request error metric.
fn metric_reason(e: &ExtenderError) -> &'static str {
    match e {
        ExtenderError::BodyTooLarge { .. } => "body_too_large",
        ExtenderError::Body { .. } => "body",
        ExtenderError::Json { .. } => "json",
        ExtenderError::MissingPod | ExtenderError::PodJson { .. } => "pod",
        ExtenderError::NoNodes | ExtenderError::BothNodeForms => "node_form",
        ExtenderError::TooManyNodes { .. } => "too_many_nodes",
        ExtenderError::NodeJson { .. } | ExtenderError::NodeWithoutName { .. } => "node",
        ExtenderError::NamesWithoutCache => "names_without_cache",
        ExtenderError::NotSynced(_) => "not_synced",
    }
}

/// The two scheduler calls, which answer failures differently.
#[derive(Clone, Copy, Debug)]
enum Verb {
    Filter,
    Prioritize,
}

/// The HTTP status a failed request is answered with. Unparseable requests are the client's
/// fault (400). Otherwise `/filter` answers 200 with Error set, which fails the scheduling
/// cycle with our message; the scheduler ignores `/prioritize` failures, so there the
/// status says why for whoever looks.
fn error_status(e: &ExtenderError, verb: Verb) -> StatusCode {
    match e {
        ExtenderError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        ExtenderError::Body { .. }
        | ExtenderError::Json { .. }
        | ExtenderError::MissingPod
        | ExtenderError::PodJson { .. }
        | ExtenderError::NoNodes
        | ExtenderError::BothNodeForms
        | ExtenderError::TooManyNodes { .. }
        | ExtenderError::NodeJson { .. }
        | ExtenderError::NodeWithoutName { .. } => StatusCode::BAD_REQUEST,
        ExtenderError::NamesWithoutCache => match verb {
            Verb::Filter => StatusCode::OK,
            Verb::Prioritize => StatusCode::BAD_REQUEST,
        },
        ExtenderError::NotSynced(_) => match verb {
            Verb::Filter => StatusCode::OK,
            Verb::Prioritize => StatusCode::SERVICE_UNAVAILABLE,
        },
    }
}

/// The message a failed request is answered with: the error and its causes on one line.
fn request_error_message(e: &ExtenderError) -> String {
    format!("railguard: {}", railguard_api::error::error_chain(e))
}

fn json_response<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    json_body(status, serde_json::to_vec(value))
}

fn json_body(status: StatusCode, body: Result<Vec<u8>, serde_json::Error>) -> Response {
    match body {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode response");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode response").into_response()
        }
    }
}

/// The largest body [`extender_router`] accepts, for the error that names it.
#[derive(Clone, Copy, Debug)]
struct BodyLimit(usize);

/// The body, or why it could not be read: larger than the limit, cut off, malformed framing.
fn read_body(
    body: Result<Bytes, BytesRejection>,
    limit: BodyLimit,
) -> Result<Bytes, ExtenderError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ExtenderError::BodyTooLarge { max: limit.0 }
        } else {
            ExtenderError::Body {
                detail: rejection.body_text().to_lowercase(),
            }
        }
    })
}

/// The body as read, or an empty one and the reason it could not be read (which
/// [`decode`] then answers).
fn split_body(
    body: Result<Bytes, BytesRejection>,
    limit: BodyLimit,
) -> (Bytes, Option<ExtenderError>) {
    match read_body(body, limit) {
        Ok(body) => (body, None),
        Err(e) => (Bytes::new(), Some(e)),
    }
}

async fn filter_handler(
    State(state): State<Arc<AppState>>,
    Extension(limit): Extension<BodyLimit>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let start = Instant::now();
    let span = request_span("filter");
    let _entered = span.enter();
    let (body, unread) = split_body(body, limit);
    let decoded = decode(&body, unread, state.max_nodes, &span);
    let (mode, result) = match decoded {
        Ok(req) => (mode_of(&req), answer_filter(&state, req, Timestamp::now())),
        Err(e) => ("invalid", Err(e)),
    };
    state
        .metrics
        .filter_seconds
        .get_or_create(&ModeLabels { mode })
        .observe(start.elapsed().as_secs_f64());
    match result {
        Ok(r) => json_body(StatusCode::OK, r.to_json()),
        Err(e) => {
            count_error(&state, &e);
            let message = request_error_message(&e);
            tracing::warn!(error = %message, "filter request failed");
            let status = error_status(&e, Verb::Filter);
            json_response(status, &ExtenderFilterResult::error(message))
        }
    }
}

async fn prioritize_handler(
    State(state): State<Arc<AppState>>,
    Extension(limit): Extension<BodyLimit>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let start = Instant::now();
    let span = request_span("prioritize");
    let _entered = span.enter();
    let (body, unread) = split_body(body, limit);
    let decoded = decode(&body, unread, state.max_nodes, &span);
    let (mode, result) = match decoded {
        // Encoded while the request lives: the answer borrows its names.
        Ok(req) => (
            mode_of(&req),
            answer_prioritize(&state, &req, Timestamp::now())
                .map(|r| json_response(StatusCode::OK, &r)),
        ),
        Err(e) => ("invalid", Err(e)),
    };
    state
        .metrics
        .prioritize_seconds
        .get_or_create(&ModeLabels { mode })
        .observe(start.elapsed().as_secs_f64());
    match result {
        Ok(response) => response,
        Err(e) => {
            count_error(&state, &e);
            let status = error_status(&e, Verb::Prioritize);
            (status, format!("{}\n", request_error_message(&e))).into_response()
        }
    }
}

/// The span every scheduling call's log lines are in: `extender_request`, its verb, and
/// (once decoded) the request form and the number of candidate nodes.
fn request_span(verb: &'static str) -> tracing::Span {
    tracing::info_span!(
        "extender_request",
        verb,
        mode = tracing::field::Empty,
        nodes = tracing::field::Empty
    )
}

/// The request decoded from `body` (or the reason it could not be read), its form and size
/// recorded on `span`.
fn decode<'a>(
    body: &'a Bytes,
    unread: Option<ExtenderError>,
    max_nodes: usize,
    span: &tracing::Span,
) -> Result<Request<'a>, ExtenderError> {
    let req = match unread {
        Some(e) => return Err(e),
        None => ExtenderArgs::decode(body, max_nodes)?,
    };
    span.record("mode", mode_of(&req));
    let nodes = match &req.candidates {
        Candidates::Nodes(n) => n.len(),
        Candidates::Names(n) => n.len(),
    };
    span.record("nodes", nodes);
    Ok(req)
}

/// The metric label for the request form.
fn mode_of(req: &Request<'_>) -> &'static str {
    match req.candidates {
        Candidates::Nodes(_) => "nodes",
        Candidates::Names(_) => "names",
    }
}

/// Router of the extender port.
pub fn extender_router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/filter", post(filter_handler))
        .route("/prioritize", post(prioritize_handler))
        .layer(Extension(BodyLimit(max_body_bytes)))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

/// Router of the plain health and metrics port.
/// `/healthz`, `/readyz` and `/metrics`. Once `draining` is set `/readyz` answers 503, so
/// the extender's endpoint is taken out of its Service before the listener closes.
pub fn health_router(state: Arc<AppState>, draining: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move |s: State<Arc<AppState>>| readyz(s, draining.clone())),
        )
        .route("/metrics", get(metrics_handler))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AppState>>, draining: Arc<AtomicBool>) -> Response {
    if draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    match state.ready() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(pending) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("caches not synced: {pending}\n"),
        )
            .into_response(),
    }
}

async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    if let Source::Cluster(c) = &state.source {
        c.record(&state.metrics);
    }
    match state.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics").into_response(),
    }
}
