//! The thin HTTP shell: `/mutate` over TLS, `/healthz`, `/readyz` and `/metrics` on a
//! separate plain port.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use railguard_runtime::{limit_requests, RequestLimits, ServeLimits, Served, TlsConfigSource};
use tokio::sync::watch;

use crate::catalog::Catalog;
use crate::metrics::{
    AdmissionLabels, KindLabels, Metrics, ModeLabels, NodeGuardLabels, ResultLabels,
};
use crate::tls::CertReloader;
use railguard_webhook::config::{FailureMode, WebhookConfig};
use railguard_webhook::decisions::DecisionCache;
use railguard_webhook::node_guard;
use railguard_webhook::review;

/// What the handlers share.
pub struct AppState {
    pub catalog: Arc<Catalog>,
    pub config: WebhookConfig,
    pub failure_mode: FailureMode,
    pub metrics: Arc<Metrics>,
    /// Recent decisions, so the pods of one job are decided once.
    pub decisions: DecisionCache,
    /// The node guard, when it is served: `/readyz` waits for its caches too, so no Node
    /// review reaches a replica that cannot yet tell who may write what.
    pub node_guard: Option<Arc<NodeGuardState>>,
}

/// Limits and addresses of a running server.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Requests taking longer (body read and queueing included) are answered 408.
    pub request_timeout: Duration,
    /// Connection limits of both listeners: header-read and TLS handshake timeout, the
    /// connection cap (its `shutdown_grace` is replaced by the one here).
    pub connections: ServeLimits,
    /// Most requests handled at once per listener.
    pub max_in_flight: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// How often the certificate files are checked.
    pub cert_poll_interval: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            // The API server caps objects near 3 MiB; a review carries one object.
            max_body_bytes: 6 << 20,
            request_timeout: Duration::from_secs(10),
            connections: ServeLimits::default(),
            max_in_flight: 64,
            shutdown_grace: Duration::from_secs(20),
            cert_poll_interval: Duration::from_secs(2),
        }
    }
}

/// The admission routes: `POST /mutate`. A caller that serves more (a benchmark's baseline
/// endpoint) adds its routes here and starts with [`start_routes`], so they share the TLS
/// listener, the limits and the state.
pub fn admission_routes() -> Router<Arc<AppState>> {
    Router::new().route("/mutate", post(mutate_handler))
}

/// What the node guard's handler shares: who may write railguard's Node outputs, the cache
/// of prober pods it checks requesters against, its own view of the Nodes' outputs, and the
/// metrics.
pub struct NodeGuardState {
    pub policy: node_guard::GuardPolicy,
    pub probers: crate::node_guard_cache::probers::ProberPods,
    pub nodes: crate::node_guard_cache::nodes::NodeOutputs,
    /// The FabricProfiles, for whether a simulated certificate may be stored.
    pub catalog: Arc<crate::catalog::Catalog>,
    pub metrics: Arc<Metrics>,
}

impl NodeGuardState {
    /// Whether both of the guard's caches have listed.
    pub fn is_synced(&self) -> bool {
        self.probers.is_synced() && self.nodes.is_synced()
    }
}

/// How long a prober's request waits for the first list of prober pods (the webhook just
/// started) before it is denied as not yet known; under the configuration's timeout.
const PROBER_CACHE_WAIT: Duration = Duration::from_secs(2);

/// The node guard's route, `POST /validate-nodes`, to merge into [`admission_routes`]
/// (`admission_routes().merge(node_guard_routes(guard))`) so it shares the TLS listener and
/// the limits.
pub fn node_guard_routes<S: Clone + Send + Sync + 'static>(
    guard: Arc<NodeGuardState>,
) -> Router<S> {
    Router::new()
        .route("/validate-nodes", post(node_guard_handler))
        .with_state(guard)
}

/// Always an AdmissionReview (HTTP 200): a body that is not one is denied with the reason.
async fn node_guard_handler(State(guard): State<Arc<NodeGuardState>>, body: Bytes) -> Response {
    let count = |outcome: &str, writer: &str| {
        guard
            .metrics
            .node_guard_decisions
            .get_or_create(&NodeGuardLabels {
                outcome: outcome.to_string(),
                writer: writer.to_string(),
            })
            .inc();
    };
    let request = match review::decode(&body) {
        Ok(r) => r,
        Err(e) => {
            let message = railguard_api::error::error_chain(&e);
            tracing::warn!(error = %message, "node guard: a body that is not an AdmissionReview");
            count("malformed", "");
            let mut response = review::ReviewResponse::allow("");
            response.allowed = false;
            response.denial = Some(format!("railguard node guard: {message}"));
            return json(response.encode());
        }
    };
    answer_node_admission(&guard, &request, count).await
}

/// One span per review: every line logged while answering it names the Node change.
#[tracing::instrument(
    name = "node_admission",
    skip_all,
    fields(
        uid = %request.uid,
        node = request.name.as_deref().unwrap_or(""),
        user = %request.user_info.username,
        operation = %request.operation,
    )
)]
async fn answer_node_admission(
    guard: &NodeGuardState,
    request: &review::AdmissionRequest<'_>,
    count: impl Fn(&str, &str),
) -> Response {
    if guard.policy.is_prober(&request.user_info) && !guard.probers.is_synced() {
        guard.probers.wait_synced(PROBER_CACHE_WAIT).await;
    }
    let admission = node_guard::admit_node(
        request,
        &guard.policy,
        |pod| guard.probers.lookup(pod),
        |node| guard.nodes.view(node),
        |profile| {
            guard
                .catalog
                .profiles()
                .iter()
                .find(|p| p.name() == profile)
                .map(|p| p.spec.certification.accept_simulated)
        },
    );
    count(admission.outcome, admission.writer);
    match admission.response.denial.as_deref() {
        Some(reason) => tracing::info!(
            subresource = request.sub_resource.as_deref().unwrap_or(""),
            dry_run = request.dry_run, %reason, "node guard denied a change"
        ),
        None => tracing::debug!(
            outcome = admission.outcome,
            writer = admission.writer,
            "node guard"
        ),
    }
    json(admission.response.encode())
}

/// `routes` behind the body limit, the request timeout and the concurrency limit, with the
/// state bound.
fn webhook_router(
    routes: Router<Arc<AppState>>,
    state: Arc<AppState>,
    opts: &ServeOptions,
) -> Router {
    limit_requests(
        routes
            .layer(DefaultBodyLimit::max(opts.max_body_bytes))
            .with_state(state),
        &request_limits(opts),
    )
}

fn request_limits(opts: &ServeOptions) -> RequestLimits {
    RequestLimits {
        timeout: opts.request_timeout,
        max_in_flight: opts.max_in_flight,
    }
}

/// Health, readiness and metrics (plain HTTP). `/readyz` answers 503 once `draining` is set,
/// so the pod leaves its Service's endpoints while the admission listener still serves.
fn metrics_router(state: Arc<AppState>, draining: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move |s: State<Arc<AppState>>| {
                let draining = draining.clone();
                async move {
                    if draining.load(Ordering::Relaxed) {
                        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
                    } else {
                        readyz(s).await
                    }
                }
            }),
        )
        .route("/metrics", get(metrics_handler))
        .with_state(state)
}

fn json(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn bad_request(state: &AppState, e: &railguard_webhook::error::DecodeError) -> Response {
    state.metrics.bad_requests.inc();
    let message = railguard_api::error::error_chain(e);
    tracing::warn!(error = %message, "rejected a body that is not an AdmissionReview");
    (StatusCode::BAD_REQUEST, format!("bad request: {message}\n")).into_response()
}

async fn mutate_handler(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let request = match review::decode(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&state, &e),
    };
    answer_admission(&state, &request, start).await
}

/// One span per admission: every line logged while answering it names the request.
#[tracing::instrument(
    name = "admission",
    skip_all,
    fields(
        uid = %request.uid,
        namespace = request.namespace.as_deref().unwrap_or(""),
        pod = request.name.as_deref().unwrap_or(""),
        user = %request.user_info.username,
    )
)]
async fn answer_admission(
    state: &AppState,
    request: &review::AdmissionRequest<'_>,
    start: Instant,
) -> Response {
    let ns_name = request.namespace.clone().unwrap_or_default();
    let namespace = state.catalog.namespace(&ns_name).await;
    let profiles = state.catalog.profiles();
    let admission = review::admit_cached(
        request,
        &namespace,
        &profiles,
        &state.config,
        state.failure_mode,
        &state.decisions,
    );
    let m = &state.metrics;
    if let Some(lookup) = admission.cache {
        m.decision_cache
            .get_or_create(&ResultLabels {
                result: lookup.as_str().to_string(),
            })
            .inc();
    }
    m.admissions
        .get_or_create(&AdmissionLabels {
            outcome: admission.outcome.to_string(),
            profile: admission.profile.clone().unwrap_or_default(),
        })
        .inc();
    for k in &admission.warning_kinds {
        m.warnings
            .get_or_create(&KindLabels {
                kind: k.as_str().to_string(),
            })
            .inc();
    }
    if let Some(error) = &admission.error {
        m.internal_errors
            .get_or_create(&ModeLabels {
                failure_mode: state.failure_mode.as_str().to_string(),
            })
            .inc();
        tracing::error!(
            %error, failure_mode = state.failure_mode.as_str(), "could not build a patch"
        );
    }
    let body = admission.response.encode();
    m.latency.observe(start.elapsed().as_secs_f64());
    tracing::debug!(
        outcome = admission.outcome,
        profile = admission.profile.as_deref().unwrap_or(""),
        warnings = admission.response.warnings.len(),
        allowed = admission.response.allowed,
        "admission"
    );
    json(body)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if !state.catalog.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n").into_response();
    }
    if let Some(guard) = &state.node_guard {
        if !guard.is_synced() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "node guard caches not synced\n",
            )
                .into_response();
        }
    }
    "ready".into_response()
}

async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// A started server.
pub struct RunningServer {
    /// Where the TLS webhook listens.
    pub addr: SocketAddr,
    /// Where health and metrics listen.
    pub metrics_addr: SocketAddr,
    webhook: Served,
    plain: Served,
    /// Stops the certificate reloader.
    stop: watch::Sender<bool>,
    draining: Arc<AtomicBool>,
}

/// Binds both ports and starts serving [`admission_routes`]; returns once both listen.
pub async fn start(
    state: Arc<AppState>,
    reloader: CertReloader,
    opts: ServeOptions,
) -> std::io::Result<RunningServer> {
    start_routes(admission_routes(), state, reloader, opts).await
}

/// Like [`start`], serving `routes` (built on [`admission_routes`]) over TLS instead.
pub async fn start_routes(
    routes: Router<Arc<AppState>>,
    state: Arc<AppState>,
    reloader: CertReloader,
    opts: ServeOptions,
) -> std::io::Result<RunningServer> {
    let listener = std::net::TcpListener::bind(opts.listen)?;
    let metrics = std::net::TcpListener::bind(opts.metrics_listen)?;
    serve_on(routes, state, reloader, opts, listener, metrics).await
}

/// Starts serving [`admission_routes`] on listeners bound already (the binary binds them
/// first, so a port in use fails before anything else starts); `opts.listen` and
/// `opts.metrics_listen` are not used.
pub async fn start_on(
    state: Arc<AppState>,
    reloader: CertReloader,
    opts: ServeOptions,
    listener: std::net::TcpListener,
    metrics_listener: std::net::TcpListener,
) -> std::io::Result<RunningServer> {
    serve_on(
        admission_routes(),
        state,
        reloader,
        opts,
        listener,
        metrics_listener,
    )
    .await
}

/// Like [`start_on`], serving `routes` (built on [`admission_routes`], e.g. with
/// [`node_guard_routes`] merged) instead.
pub async fn start_routes_on(
    routes: Router<Arc<AppState>>,
    state: Arc<AppState>,
    reloader: CertReloader,
    opts: ServeOptions,
    listener: std::net::TcpListener,
    metrics_listener: std::net::TcpListener,
) -> std::io::Result<RunningServer> {
    serve_on(routes, state, reloader, opts, listener, metrics_listener).await
}

async fn serve_on(
    routes: Router<Arc<AppState>>,
    state: Arc<AppState>,
    reloader: CertReloader,
    opts: ServeOptions,
    listener: std::net::TcpListener,
    metrics_listener: std::net::TcpListener,
) -> std::io::Result<RunningServer> {
    let (stop, stop_rx) = watch::channel(false);
    // Each new connection takes the config in service then, so a reload applies at once.
    let tls: TlsConfigSource = reloader.source();
    tokio::spawn(reloader.run(opts.cert_poll_interval, state.metrics.clone(), stop_rx));
    let limits = ServeLimits {
        shutdown_grace: opts.shutdown_grace,
        ..opts.connections.clone()
    };

    let app = webhook_router(routes, state.clone(), &opts);
    let webhook = railguard_runtime::spawn_serve(listener, app, Some(tls), limits.clone())?;
    let draining = Arc::new(AtomicBool::new(false));
    let plain_app = limit_requests(
        metrics_router(state, draining.clone()),
        &request_limits(&opts),
    );
    let plain = railguard_runtime::spawn_serve(metrics_listener, plain_app, None, limits)?;
    let (addr, metrics_addr) = (webhook.addr, plain.addr);
    tracing::info!(%addr, %metrics_addr, "railguard-webhook listening");
    Ok(RunningServer {
        addr,
        metrics_addr,
        webhook,
        plain,
        stop,
        draining,
    })
}

impl RunningServer {
    /// Marks the server not ready while it keeps serving admission requests: the API server
    /// stops picking this pod once the endpoint update reaches it. Call, wait a few
    /// seconds, then [`RunningServer::shutdown`]. From now on each response also closes its
    /// connection, so the API server's pooled connections move to a ready replica one by one,
    /// each right after an answer (never between two requests; see `railguard_runtime::serve`).
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        self.webhook.drain.cancel();
        self.plain.drain.cancel();
    }

    /// Stops accepting, lets in-flight requests finish (up to the grace period), then stops.
    pub async fn shutdown(self) -> std::io::Result<()> {
        self.webhook.stop.cancel();
        let _ = self.stop.send(true);
        let webhook = self.webhook.task.await.map_err(std::io::Error::other)?;
        self.plain.stop.cancel();
        let plain = self.plain.task.await.map_err(std::io::Error::other)?;
        webhook.and(plain)
    }
}
