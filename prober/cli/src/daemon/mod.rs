//! `railguard-prober daemon --node NAME`: the DaemonSet loop. Passive checks (link state,
//! error counters over a window) every passive interval; invasive certification when it is
//! due and no GPU pod runs on the node, or at once when the Node carries
//! `railguard.io/recertify`. The node is labelled `pending` while an invasive run is under
//! way. Intervals are jittered, errors back off exponentially, SIGTERM/SIGINT stop the loop
//! between steps. Prometheus metrics and health are served on a plain port.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use clap::Args;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use railguard_api::{keys, Certificate, Verdict};
use tokio_util::sync::CancellationToken;

use crate::certify::cli::{certify_once, NodeArgs, NodeContext};
use crate::certify::policy::assess_passive;
use crate::certify::record::{passive_certificate, Subject};
use crate::certify::run::{error_chain, gather_passive};
use crate::progress::NoProgress;
use crate::publish::NodePublisher;

/// `railguard-prober daemon`
#[derive(Args, Debug, Clone)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Seconds between passive checks (default: the profile's passiveIntervalSeconds).
    #[arg(long, env = "RAILGUARD_PASSIVE_INTERVAL_SECS")]
    pub passive_interval_secs: Option<u64>,
    /// Seconds between invasive runs (default: the profile's intervalSeconds).
    #[arg(long, env = "RAILGUARD_INTERVAL_SECS")]
    pub interval_secs: Option<u64>,
    /// Counter window of a passive check, milliseconds.
    #[arg(long, env = "RAILGUARD_WINDOW_MS", default_value_t = 5000)]
    pub window_ms: u64,
    /// How often the loop wakes to look for `railguard.io/recertify`, milliseconds.
    #[arg(long, env = "RAILGUARD_POLL_MS", default_value_t = 10000)]
    pub poll_ms: u64,
    /// Random spread added to every interval, percent.
    #[arg(long, env = "RAILGUARD_JITTER_PERCENT", default_value_t = 10)]
    pub jitter_percent: u32,
    /// Resources that make a pod a GPU pod (no invasive run while one is on the node).
    #[arg(
        long,
        env = "RAILGUARD_GPU_RESOURCES",
        value_delimiter = ',',
        default_value = "nvidia.com/gpu"
    )]
    pub gpu_resources: Vec<String>,
    /// Metrics and health listener (plain HTTP).
    #[arg(long, env = "RAILGUARD_METRICS_LISTEN", default_value = "0.0.0.0:9464")]
    pub metrics_listen: SocketAddr,
}

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

/// The daemon's metrics.
pub struct Metrics {
    registry: Registry,
    rail_bw: Family<RailLabels, Gauge<f64, AtomicU64>>,
    counter_delta: Family<CounterLabels, Gauge>,
    verdict: Family<VerdictLabels, Gauge>,
    busbw: Gauge<f64, AtomicU64>,
    runs: Family<RunLabels, Counter>,
    ready: AtomicBool,
    alive_at: Mutex<Instant>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("railguard_prober");
        let rail_bw = Family::<RailLabels, Gauge<f64, AtomicU64>>::default();
        let counter_delta = Family::<CounterLabels, Gauge>::default();
        let verdict = Family::<VerdictLabels, Gauge>::default();
        let busbw = Gauge::<f64, AtomicU64>::default();
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
        registry.register("runs", "Checks run, by kind and outcome", runs.clone());
        Metrics {
            registry,
            rail_bw,
            counter_delta,
            verdict,
            busbw,
            runs,
            ready: AtomicBool::new(false),
            alive_at: Mutex::new(Instant::now()),
        }
    }

    fn record(&self, cert: &Certificate, kind: &str) {
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
        self.run(kind, cert.verdict.as_label());
        self.ready.store(true, Ordering::Relaxed);
    }

    fn run(&self, kind: &str, outcome: &str) {
        self.runs
            .get_or_create(&RunLabels {
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    fn heartbeat(&self) {
        if let Ok(mut t) = self.alive_at.lock() {
            *t = Instant::now();
        }
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

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Adds up to `percent` of random spread to a duration.
pub fn jittered(d: Duration, percent: u32) -> Duration {
    use rand::Rng;
    let spread = d.as_secs_f64() * f64::from(percent.min(100)) / 100.0;
    let extra = if spread > 0.0 {
        rand::thread_rng().gen_range(0.0..spread)
    } else {
        0.0
    };
    d + Duration::from_secs_f64(extra)
}

/// Exponential backoff after failed steps: 5 s, 10 s, ... up to 5 min.
pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.min(6));
    Duration::from_secs(secs.min(300))
}

/// Whether a pod counts as a GPU pod on this node: not finished, asking for a GPU resource.
pub fn is_active_gpu_pod(pod: &Pod, gpu_resources: &[String]) -> bool {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if phase == "Succeeded" || phase == "Failed" {
        return false;
    }
    let Some(spec) = &pod.spec else { return false };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            let r = c.resources.as_ref();
            let has = |m: Option<
                &std::collections::BTreeMap<
                    String,
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity,
                >,
            >| {
                m.is_some_and(|m| {
                    gpu_resources
                        .iter()
                        .any(|g| m.get(g).is_some_and(|q| q.0.trim() != "0"))
                })
            };
            has(r.and_then(|r| r.limits.as_ref())) || has(r.and_then(|r| r.requests.as_ref()))
        })
}

async fn serve_metrics(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let m1 = metrics.clone();
    let m2 = metrics.clone();
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
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let m = m2.clone();
                async move {
                    if m.ready.load(Ordering::Relaxed) {
                        (StatusCode::OK, "ready").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "no check finished yet").into_response()
                    }
                }
            }),
        );
    let addr = listener.local_addr().context("metrics listener")?;
    let listener =
        tokio::net::TcpListener::from_std(listener).context("cannot serve the metrics port")?;
    tracing::info!(%addr, "metrics and health listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .context("metrics server failed")
}

struct Loop {
    ctx: NodeContext,
    publisher: NodePublisher,
    args: DaemonArgs,
    metrics: Arc<Metrics>,
}

impl Loop {
    async fn gpu_pod_running(&self) -> anyhow::Result<bool> {
        let client = self.ctx.client.clone().context("no cluster client")?;
        let pods: kube::Api<Pod> = kube::Api::all(client);
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.ctx.node));
        let list = pods
            .list(&lp)
            .await
            .context("cannot list pods on the node")?;
        Ok(list
            .items
            .iter()
            .any(|p| is_active_gpu_pod(p, &self.args.gpu_resources)))
    }

    async fn invasive(&self, recertify: bool) -> anyhow::Result<()> {
        let out = certify_once(&self.ctx, true, Arc::new(NoProgress)).await?;
        self.metrics.record(&out.certificate, "invasive");
        if recertify {
            self.publisher
                .clear_recertify()
                .await
                .map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
        }
        Ok(())
    }

    async fn passive(&self) -> anyhow::Result<()> {
        let spec = &self.ctx.profile.spec;
        let previous = self.ctx.previous().await;
        let exposure = self.ctx.exposure().await;
        let gathered = gather_passive(
            &self.ctx.setup,
            spec,
            Duration::from_millis(self.args.window_ms),
            exposure,
        )
        .await?;
        let assessment = assess_passive(
            spec,
            &gathered.evidence,
            previous.as_ref().map(|c| c.verdict),
            previous.as_ref().map(|c| c.rails.as_slice()).unwrap_or(&[]),
        );
        if previous.is_none() && assessment.verdict != Verdict::Failed {
            // Nothing to update: only an invasive run can certify.
            self.metrics.run("passive", "nothing-to-publish");
            return Ok(());
        }
        let profile_name = self.ctx.profile.name().to_string();
        let subject = Subject {
            node: &self.ctx.node,
            profile_name: &profile_name,
            profile: spec,
            signature: gathered.evidence.layout_signature.clone(),
            gpus: gathered.gpus,
        };
        let cert = passive_certificate(&subject, &assessment, previous.as_ref(), Timestamp::now());
        self.publisher
            .publish(&cert, previous.as_ref(), false)
            .await
            .map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
        if cert.verdict == Verdict::Failed {
            tracing::warn!(node = %self.ctx.node, reasons = ?cert.reasons, "passive check failed the node");
        }
        self.metrics.record(&cert, "passive");
        Ok(())
    }

    async fn recertify_requested(&self) -> anyhow::Result<bool> {
        let node = self
            .publisher
            .get_node()
            .await
            .map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
        Ok(node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::ANNOTATION_RECERTIFY))
            .is_some_and(|v| !v.trim().is_empty()))
    }

    async fn run(self, stop: CancellationToken) {
        let cert = &self.ctx.profile.spec.certification;
        let interval =
            Duration::from_secs(self.args.interval_secs.unwrap_or(cert.interval_seconds));
        let passive_every = Duration::from_secs(
            self.args
                .passive_interval_secs
                .unwrap_or(cert.passive_interval_seconds),
        );
        let poll = Duration::from_millis(self.args.poll_ms.max(100));
        let mut next_invasive = Instant::now();
        let mut next_passive = Instant::now() + jittered(passive_every, self.args.jitter_percent);
        let mut failures = 0u32;
        loop {
            self.metrics.heartbeat();
            let step = async {
                let recertify = self.recertify_requested().await?;
                let now = Instant::now();
                if recertify || now >= next_invasive {
                    if recertify || !self.gpu_pod_running().await? {
                        tracing::info!(node = %self.ctx.node, recertify, "invasive certification");
                        self.invasive(recertify).await?;
                        next_invasive =
                            Instant::now() + jittered(interval, self.args.jitter_percent);
                        next_passive =
                            Instant::now() + jittered(passive_every, self.args.jitter_percent);
                        return Ok::<_, anyhow::Error>(());
                    }
                    tracing::info!(node = %self.ctx.node, "invasive run due but a GPU pod is on the node; deferring");
                    next_invasive =
                        Instant::now() + jittered(passive_every, self.args.jitter_percent);
                }
                if Instant::now() >= next_passive {
                    self.passive().await?;
                    next_passive =
                        Instant::now() + jittered(passive_every, self.args.jitter_percent);
                }
                Ok(())
            };
            let wait = tokio::select! {
                _ = stop.cancelled() => break,
                r = step => match r {
                    Ok(()) => { failures = 0; poll }
                    Err(e) => {
                        failures += 1;
                        self.metrics.run("step", "error");
                        let wait = backoff(failures);
                        tracing::warn!(node = %self.ctx.node, error = %format!("{e:#}"), retry_in_s = wait.as_secs(), "check failed");
                        wait
                    }
                },
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!(node = %self.ctx.node, "daemon stopped");
    }
}

impl DaemonArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        // The port first: one in use fails before the node is touched.
        let listener = railguard_runtime::bind(
            self.metrics_listen,
            "metrics and health",
            "--metrics-listen",
        )?;
        let ctx = self.node.context(true).await?;
        let publisher = ctx
            .publisher()
            .context("the daemon needs a cluster client")?;
        let metrics = Arc::new(Metrics::new());
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_metrics(listener, metrics.clone(), stop.clone()));
        let signals = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut term =
                    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::error!(error = %e, "cannot watch SIGTERM");
                            return;
                        }
                    };
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                tracing::info!("shutdown requested");
                stop.cancel();
            })
        };
        tracing::info!(node = %ctx.node, profile = ctx.profile.name(), "daemon started");
        let l = Loop {
            ctx,
            publisher,
            args: self.clone(),
            metrics,
        };
        l.run(stop.clone()).await;
        stop.cancel();
        signals.abort();
        match server.await {
            Ok(r) => r,
            Err(e) => Err(anyhow::anyhow!("metrics server task failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(0), Duration::from_secs(5));
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(10), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_within_the_spread() {
        for _ in 0..100 {
            let j = jittered(Duration::from_secs(100), 10);
            assert!(j >= Duration::from_secs(100) && j < Duration::from_secs(110));
        }
        assert_eq!(jittered(Duration::from_secs(7), 0), Duration::from_secs(7));
    }

    #[test]
    fn gpu_pods_are_recognized() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let gpus = vec!["nvidia.com/gpu".to_string()];
        assert!(is_active_gpu_pod(&pod, &gpus));
        let mut done = pod.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(!is_active_gpu_pod(&done, &gpus));
        let cpu: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "8"}}}]}
        }))
        .unwrap();
        assert!(!is_active_gpu_pod(&cpu, &gpus));
    }
}
