//! The plain metrics and health port of the prober's long-running modes (the node daemon,
//! the fleet controller): `/metrics`, `/healthz` (the loop made progress within its bound)
//! and `/readyz` (a first result exists).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

/// What the port reports on.
pub trait Observed: Send + Sync + 'static {
    /// The OpenMetrics text.
    fn encode(&self) -> String;
    /// The loop made progress within its bound.
    fn alive(&self) -> bool;
    /// A first result exists.
    fn ready(&self) -> bool;
    /// `/healthz` text when not alive.
    const STUCK: &'static str;
    /// `/readyz` text when not ready.
    const NOT_READY: &'static str;
}

/// Serves the port until `stop`.
pub async fn serve<O: Observed>(
    listener: std::net::TcpListener,
    observed: Arc<O>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let (m1, m2, m3) = (observed.clone(), observed.clone(), observed);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m1.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let m = m2.clone();
                async move {
                    if m.alive() {
                        (StatusCode::OK, "ok").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, O::STUCK).into_response()
                    }
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let m = m3.clone();
                async move {
                    if m.ready() {
                        (StatusCode::OK, "ready").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, O::NOT_READY).into_response()
                    }
                }
            }),
        );
    let addr = listener.local_addr().context("metrics listener")?;
    tracing::info!(%addr, "metrics and health listening");
    // The listener every railguard binary uses: header-read timeout, connection cap.
    let app = railguard_runtime::limit_requests(
        app,
        &railguard_runtime::RequestLimits {
            timeout: Duration::from_secs(10),
            max_in_flight: 16,
        },
    );
    railguard_runtime::serve(
        listener,
        app,
        None,
        railguard_runtime::ServeLimits::default(),
        // Scrapes need no drain: the listener closes when the prober stops.
        stop.clone(),
        stop.cancelled_owned(),
    )
    .await
    .context("metrics server failed")
}
