//! The HTTP shell around the decisions: `POST /filter` and `POST /prioritize` on the
//! extender port (TLS optional), `/healthz`, `/readyz` and `/metrics` on a plain port.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use jiff::Timestamp;
use railguard_api::{FabricProfile, NodeFabric};

use crate::cache::{CachedNode, ClusterState, ProfileSet};
use crate::decision::{filter_by, prioritize, target_for, ExtenderConfig, NodeSlot, PodTarget};
use crate::error::{ExtenderError, ServeError, Unsynced};
use crate::metrics::{Metrics, ModeLabels, ReasonLabels};
use crate::pod::PodFacts;
use crate::wire::{
    decode_node, Candidates, ExtenderArgs, ExtenderFilterResult, HostPriority, NodeList, NodeName,
    Request,
};

/// Where node and profile state comes from.
#[derive(Debug)]
pub enum Source {
    /// No cluster: profiles from a file, nodes only as full objects in each request.
    Standalone { profiles: Arc<Vec<FabricProfile>> },
    /// Watches of the cluster.
    Cluster(Arc<ClusterState>),
}

/// Shared state of the handlers.
#[derive(Debug)]
pub struct AppState {
    pub source: Source,
    pub config: ExtenderConfig,
    /// Upper bound on candidate nodes per request.
    pub max_nodes: usize,
    pub metrics: Arc<Metrics>,
}

/// Default bound on candidates: above the largest clusters Kubernetes supports.
pub const DEFAULT_MAX_NODES: usize = 15_000;

/// The profiles a request is decided against.
enum Profiles {
    Standalone(Arc<Vec<FabricProfile>>),
    Cluster(Arc<ProfileSet>),
}

impl Profiles {
    fn list(&self) -> &[FabricProfile] {
        match self {
            Profiles::Standalone(p) => p,
            Profiles::Cluster(set) => &set.profiles,
        }
    }
}

impl AppState {
    fn profiles(&self) -> Profiles {
        match &self.source {
            Source::Standalone { profiles } => Profiles::Standalone(profiles.clone()),
            Source::Cluster(c) => Profiles::Cluster(c.profile_set()),
        }
    }

    /// `Err` names the caches still listing.
    pub fn ready(&self) -> Result<(), Unsynced> {
        match &self.source {
            Source::Standalone { .. } => Ok(()),
            Source::Cluster(c) => {
                let pending = c.unsynced();
                if pending.is_empty() {
                    Ok(())
                } else {
                    Err(Unsynced(pending))
                }
            }
        }
    }

    fn count_error(&self, e: &ExtenderError) {
        self.metrics
            .request_errors
            .get_or_create(&ReasonLabels {
                reason: metric_reason(e),
            })
            .inc();
    }
}

/// The `reason` label of the request error metric.
fn metric_reason(e: &ExtenderError) -> &'static str {
    match e {
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
        ExtenderError::Json { .. }
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
    format!("railguard: {}", railguard_runtime::error_chain(e))
}

/// The pod's target, with what the decision needs from the caches.
struct Prepared<'p> {
    facts: PodFacts,
    target: PodTarget<'p>,
}

fn prepare<'p>(state: &AppState, req: &Request<'_>, profiles: &'p [FabricProfile]) -> Prepared<'p> {
    let facts = PodFacts::from_pod(&req.pod, &state.config.job_label_keys);
    let ns_labels = match &state.source {
        Source::Cluster(c) => c.namespaces.get(&facts.namespace),
        Source::Standalone { .. } => None,
    };
    let target = target_for(&facts, profiles, ns_labels.as_deref(), &state.config);
    Prepared { facts, target }
}

/// Full Node objects interpreted at `now`.
fn interpret_nodes(
    items: &[Box<serde_json::value::RawValue>],
    now: Timestamp,
) -> Result<Vec<NodeFabric>, ExtenderError> {
    items
        .iter()
        .enumerate()
        .map(|(i, raw)| decode_node(raw, i).map(|n| NodeFabric::from_node(&n, now)))
        .collect()
}

/// Answers a decoded `/filter` request.
pub fn answer_filter<'a>(
    state: &AppState,
    req: Request<'a>,
    now: Timestamp,
) -> Result<ExtenderFilterResult<'a>, ExtenderError> {
    state.ready().map_err(ExtenderError::NotSynced)?;
    let profiles = state.profiles();
    let prepared = prepare(state, &req, profiles.list());
    let Request { candidates, .. } = req;
    match candidates {
        Candidates::Nodes(items) => {
            if matches!(prepared.target, PodTarget::PassThrough) {
                return Ok(ExtenderFilterResult {
                    nodes: Some(NodeList { items }),
                    ..ExtenderFilterResult::default()
                });
            }
            let fabrics = interpret_nodes(&items, now)?;
            let slots: Vec<NodeSlot<'_>> = fabrics
                .iter()
                .map(|f| NodeSlot::new(&f.name, Some(f)))
                .collect();
            let verdicts = filter_by(
                &prepared.target,
                &slots,
                now,
                |i| {
                    NodeName(Cow::Owned(
                        slots
                            .get(i)
                            .map_or_else(String::new, |s| s.name.to_string()),
                    ))
                },
                |m| m,
            );
            record_rejections(state, &verdicts.reasons);
            let mut keep = vec![false; items.len()];
            for &i in &verdicts.passed {
                keep[i] = true;
            }
            let items = items
                .into_iter()
                .zip(keep)
                .filter_map(|(item, k)| k.then_some(item))
                .collect();
            let (failed_nodes, failed_and_unresolvable_nodes) =
                failure_maps(&state.config, verdicts.failed, verdicts.unresolvable);
            Ok(ExtenderFilterResult {
                nodes: Some(NodeList { items }),
                node_names: None,
                failed_nodes,
                failed_and_unresolvable_nodes,
                error: String::new(),
            })
        }
        Candidates::Names(names) => {
            let Source::Cluster(cluster) = &state.source else {
                return Err(ExtenderError::NamesWithoutCache);
            };
            if matches!(prepared.target, PodTarget::PassThrough) {
                return Ok(ExtenderFilterResult {
                    node_names: Some(names),
                    ..ExtenderFilterResult::default()
                });
            }
            // Rejected names are the request's own (borrowed), messages the cache's (shared).
            let verdicts =
                with_cached_slots(cluster, &names, &profiles, &prepared.target, |slots| {
                    filter_by(
                        &prepared.target,
                        slots,
                        now,
                        |i| names.get(i).cloned().unwrap_or_default(),
                        |m| m,
                    )
                });
            record_rejections(state, &verdicts.reasons);
            let passed = keep_passed(names, &verdicts.passed);
            let (failed_nodes, failed_and_unresolvable_nodes) =
                failure_maps(&state.config, verdicts.failed, verdicts.unresolvable);
            Ok(ExtenderFilterResult {
                nodes: None,
                node_names: Some(passed),
                failed_nodes,
                failed_and_unresolvable_nodes,
                error: String::new(),
            })
        }
    }
}

/// `FailedNodes` and `FailedAndUnresolvableNodes` as the configured scheduler reads them.
fn failure_maps<K: Ord, V>(
    config: &ExtenderConfig,
    mut failed: BTreeMap<K, V>,
    unresolvable: BTreeMap<K, V>,
) -> (BTreeMap<K, V>, BTreeMap<K, V>) {
    if config.report_unresolvable_as_failed {
        failed.extend(unresolvable);
        (failed, BTreeMap::new())
    } else {
        (failed, unresolvable)
    }
}

/// Runs `decide` over slots for cached nodes, each with its precheck for the pod's profile
/// when the cache has one (the pod carries its profile's own signature and the profile set
/// is current). Reads the [`NodeIndex`](crate::cache::NodeIndex) when it reflects the node
/// cache and the profile set, and the node cache itself otherwise (same answers, slower).
fn with_cached_slots<T>(
    cluster: &ClusterState,
    names: &[NodeName<'_>],
    profiles: &Profiles,
    target: &PodTarget<'_>,
    decide: impl FnOnce(&[NodeSlot<'_>]) -> T,
) -> T {
    let (set, index) = match (profiles, target) {
        (
            Profiles::Cluster(set),
            PodTarget::Profile {
                profile, signature, ..
            },
        ) => (Some(&**set), set.index_of(profile.name(), signature)),
        (Profiles::Cluster(set), _) => (Some(&**set), None),
        (Profiles::Standalone(_), _) => (None, None),
    };
    let node_index = cluster.node_index();
    if let Some(set) = set {
        if node_index.is_current(cluster.nodes.version(), set.generation) {
            let slots: Vec<NodeSlot<'_>> =
                names.iter().map(|n| node_index.slot(n, index)).collect();
            return decide(&slots);
        }
    }
    let nodes = cluster.nodes.read();
    let slots = cached_slots(names, &nodes, set.zip(index));
    decide(&slots)
}

/// Slots read from the node cache map (the path while the index is being rebuilt).
fn cached_slots<'a>(
    names: &'a [NodeName<'_>],
    nodes: &'a HashMap<String, Arc<CachedNode>>,
    index: Option<(&'a ProfileSet, usize)>,
) -> Vec<NodeSlot<'a>> {
    names
        .iter()
        .map(|n| match nodes.get(n.as_str()) {
            Some(cached) => NodeSlot {
                name: n,
                fabric: Some(&cached.fabric),
                precheck: index.and_then(|(set, i)| cached.precheck(set, i)),
            },
            None => NodeSlot::new(n, None),
        })
        .collect()
}

/// The names at the `passed` indices (ascending), moved out of `names`.
fn keep_passed<'a>(names: Vec<NodeName<'a>>, passed: &[usize]) -> Vec<NodeName<'a>> {
    let mut next = passed.iter().peekable();
    names
        .into_iter()
        .enumerate()
        .filter_map(|(i, n)| {
            if next.peek() == Some(&&i) {
                next.next();
                Some(n)
            } else {
                None
            }
        })
        .collect()
}

fn record_rejections(
    state: &AppState,
    reasons: &std::collections::BTreeMap<crate::decision::RejectReason, u64>,
) {
    for (reason, n) in reasons {
        state
            .metrics
            .nodes_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc_by(*n);
    }
}

/// Answers a decoded `/prioritize` request with a score 0..=10 for every candidate, in
/// input order.
pub fn answer_prioritize(
    state: &AppState,
    req: &Request<'_>,
    now: Timestamp,
) -> Result<Vec<HostPriority>, ExtenderError> {
    state.ready().map_err(ExtenderError::NotSynced)?;
    let profiles = state.profiles();
    let prepared = prepare(state, req, profiles.list());
    let peers: Vec<Arc<NodeFabric>> = match (&state.source, &prepared.facts.job) {
        (Source::Cluster(c), Some(job)) => c.peers(&prepared.facts.namespace, job),
        _ => Vec::new(),
    };
    let peer_refs: Vec<&NodeFabric> = peers.iter().map(|p| &**p).collect();
    let scores = match &req.candidates {
        Candidates::Nodes(items) => {
            let fabrics = interpret_nodes(items, now)?;
            let slots: Vec<NodeSlot<'_>> = fabrics
                .iter()
                .map(|f| NodeSlot::new(&f.name, Some(f)))
                .collect();
            prioritize(&prepared.target, &slots, &peer_refs, now, &state.config)
        }
        Candidates::Names(names) => {
            let Source::Cluster(cluster) = &state.source else {
                return Err(ExtenderError::NamesWithoutCache);
            };
            with_cached_slots(cluster, names, &profiles, &prepared.target, |slots| {
                prioritize(&prepared.target, slots, &peer_refs, now, &state.config)
            })
        }
    };
    Ok(scores
        .into_iter()
        .map(|(host, score)| HostPriority { host, score })
        .collect())
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

async fn filter_handler(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let (mode, result) = match ExtenderArgs::decode(&body, state.max_nodes) {
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
            state.count_error(&e);
            let message = request_error_message(&e);
            tracing::warn!(error = %message, "filter request failed");
            let status = error_status(&e, Verb::Filter);
            json_response(status, &ExtenderFilterResult::error(message))
        }
    }
}

async fn prioritize_handler(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let (mode, result) = match ExtenderArgs::decode(&body, state.max_nodes) {
        Ok(req) => (
            mode_of(&req),
            answer_prioritize(&state, &req, Timestamp::now()),
        ),
        Err(e) => ("invalid", Err(e)),
    };
    state
        .metrics
        .prioritize_seconds
        .get_or_create(&ModeLabels { mode })
        .observe(start.elapsed().as_secs_f64());
    match result {
        Ok(r) => json_response(StatusCode::OK, &r),
        Err(e) => {
            state.count_error(&e);
            let status = error_status(&e, Verb::Prioritize);
            (status, format!("{}\n", request_error_message(&e))).into_response()
        }
    }
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
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

/// Router of the plain health and metrics port.
pub fn health_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
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

/// Serves the extender router on `listener`, with TLS when `tls` is given, until `handle`
/// is told to shut down.
pub async fn serve_extender(
    listener: std::net::TcpListener,
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
    router: Router,
    handle: axum_server::Handle,
) -> Result<(), ServeError> {
    let addr = listener.local_addr().map_err(|source| ServeError {
        addr: ([0, 0, 0, 0], 0).into(),
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ServeError { addr, source })?;
    let service = router.into_make_service();
    let result = match tls {
        Some(tls) => {
            axum_server::from_tcp_rustls(listener, tls)
                .handle(handle)
                .serve(service)
                .await
        }
        None => {
            axum_server::from_tcp(listener)
                .handle(handle)
                .serve(service)
                .await
        }
    };
    result.map_err(|source| ServeError { addr, source })
}
