//! `railguard-prober daemon --node NAME`: the DaemonSet loop. Passive checks (link state,
//! error counters over a window) every passive interval; invasive certification when it is
//! due and no GPU pod runs on the node, or at once when the Node carries
//! `railguard.io/recertify`. The node is labelled `pending` while an invasive run is under
//! way. Intervals are jittered, errors back off exponentially, SIGTERM/SIGINT stop the loop
//! between steps. Prometheus metrics and health are served on a plain port ([`metrics`]).

pub mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use railguard_prober::certify::once::certify_with_state;
use railguard_prober::certify::run::invasive_steps;
use railguard_prober::certify::{passive_once, NodeContext, PassiveOutcome};
use railguard_prober::progress::NoProgress;
use railguard_prober::publish::{NodePublisher, NodeState};
use tokio_util::sync::CancellationToken;

pub use metrics::Metrics;

use crate::certify::NodeArgs;

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

/// Exponential backoff after failed steps: 5 s, 10 s, ... up to [`MAX_BACKOFF`].
pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.min(6));
    Duration::from_secs(secs).min(MAX_BACKOFF)
}

/// The longest wait between two steps (the backoff cap).
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long one loop iteration may take before `/healthz` calls the loop stuck: the longest
/// wait, a passive window, and an invasive run (every NCCL run to its timeout, plus time for
/// the rails).
fn stall_after(args: &DaemonArgs, ctx: &NodeContext) -> Duration {
    let steps = u32::try_from(invasive_steps(&ctx.profile.spec)).unwrap_or(u32::MAX);
    MAX_BACKOFF
        + Duration::from_millis(args.poll_ms.max(args.window_ms))
        + ctx.setup.nccl_timeout.saturating_mul(steps)
        + Duration::from_secs(300)
}

struct Loop {
    ctx: NodeContext,
    publisher: NodePublisher,
    args: DaemonArgs,
    metrics: Arc<Metrics>,
}

impl Loop {
    async fn gpu_pod_running(&self, client: &kube::Client) -> anyhow::Result<bool> {
        let pods: kube::Api<Pod> = kube::Api::all(client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.ctx.node));
        let list = pods
            .list(&lp)
            .await
            .context("cannot list pods on the node")?;
        Ok(list
            .items
            .iter()
            .any(|p| railguard_api::pod::holds_gpu(p, &self.args.gpu_resources)))
    }

    async fn invasive(&self, state: &mut NodeState, recertify: bool) -> anyhow::Result<()> {
        let out = certify_with_state(&self.ctx, Some(state), true, Arc::new(NoProgress)).await?;
        self.metrics.record(&out.certificate, "invasive");
        if recertify {
            self.publisher.clear_recertify().await?;
        }
        Ok(())
    }

    async fn passive(&self, state: &mut NodeState) -> anyhow::Result<()> {
        let window = Duration::from_millis(self.args.window_ms);
        match passive_once(&self.ctx, state, window).await? {
            // Nothing to update: only an invasive run can certify.
            PassiveOutcome::NothingToPublish => self.metrics.run("passive", "nothing-to-publish"),
            PassiveOutcome::Published(cert) => self.metrics.record(&cert, "passive"),
        }
        Ok(())
    }

    async fn run(self, client: kube::Client, stop: CancellationToken) {
        let cert = &self.ctx.profile.spec.certification;
        let interval =
            Duration::from_secs(self.args.interval_secs.unwrap_or(cert.interval_seconds));
        let passive_every = Duration::from_secs(
            self.args
                .passive_interval_secs
                .unwrap_or(cert.passive_interval_seconds),
        );
        let poll = Duration::from_millis(self.args.poll_ms.max(100));
        let jitter = self.args.jitter_percent;
        let mut next_invasive = Instant::now();
        let mut next_passive = Instant::now() + jittered(passive_every, jitter);
        let mut failures = 0u32;
        loop {
            self.metrics.heartbeat();
            let step = async {
                // The Node is read once per step; the step's writes keep the snapshot current.
                let mut state = self.publisher.read_state().await?;
                let recertify = state.recertify_requested;
                let now = Instant::now();
                if recertify || now >= next_invasive {
                    if recertify || !self.gpu_pod_running(&client).await? {
                        tracing::info!(node = %self.ctx.node, recertify, "invasive certification");
                        self.invasive(&mut state, recertify).await?;
                        next_invasive = Instant::now() + jittered(interval, jitter);
                        next_passive = Instant::now() + jittered(passive_every, jitter);
                        return Ok::<_, anyhow::Error>(());
                    }
                    tracing::info!(node = %self.ctx.node, "invasive run due but a GPU pod is on the node; deferring");
                    next_invasive = Instant::now() + jittered(passive_every, jitter);
                }
                if Instant::now() >= next_passive {
                    self.passive(&mut state).await?;
                    next_passive = Instant::now() + jittered(passive_every, jitter);
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
        let client = self
            .node
            .client(true)
            .await?
            .context("the daemon needs a cluster client")?;
        // Until the profile (which bounds a run) is known, the wait loop beats every poll.
        let poll = Duration::from_millis(self.poll_ms.max(100));
        let metrics = Arc::new(Metrics::new(MAX_BACKOFF + poll));
        let stop = CancellationToken::new();
        let server = tokio::spawn(metrics::serve_metrics(
            listener,
            metrics.clone(),
            stop.clone(),
        ));
        let signals = {
            let stop = stop.clone();
            tokio::spawn(async move {
                railguard_runtime::shutdown_signal().await;
                tracing::info!("shutdown requested");
                stop.cancel();
            })
        };
        // A profile this node cannot use is waited for with health served and the Node's
        // condition saying why, never a crash-loop (see `profile_source`).
        let waited =
            crate::profile_source::wait_for_context(&self.node, &client, &metrics, poll, &stop)
                .await?;
        let Some(ctx) = waited else {
            stop.cancel();
            signals.abort();
            return server
                .await
                .unwrap_or_else(|e| Err(anyhow::anyhow!("metrics server task failed: {e}")));
        };
        metrics.set_stall_after(stall_after(self, &ctx));
        let publisher = ctx
            .publisher
            .clone()
            .context("the daemon needs a cluster client")?;
        tracing::info!(node = %ctx.node, profile = ctx.profile.name(), "daemon started");
        let l = Loop {
            ctx,
            publisher,
            args: self.clone(),
            metrics,
        };
        l.run(client, stop.clone()).await;
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
        assert_eq!(backoff(10), MAX_BACKOFF);
    }

    #[test]
    fn jitter_stays_within_the_spread() {
        for _ in 0..100 {
            let j = jittered(Duration::from_secs(100), 10);
            assert!(j >= Duration::from_secs(100) && j < Duration::from_secs(110));
        }
        assert_eq!(jittered(Duration::from_secs(7), 0), Duration::from_secs(7));
    }
}
