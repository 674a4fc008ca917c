//! `railguard-prober daemon --node NAME`: the DaemonSet loop. Passive checks (link state,
//! error counters over a window) every passive interval; invasive certification when it is
//! due and no GPU pod runs on the node, or at once when the Node carries
//! `railguard.io/recertify`. The node is labelled `pending` while an invasive run is under
//! way. GPU pods on the node hold back every invasive run, a requested one too: the request
//! stays on the Node and is retried, with an Event saying why ([`invasive_decision`]).
//! Intervals are jittered, errors back off exponentially. SIGTERM/SIGINT stop the loop
//! between steps: a step under way finishes within `--shutdown-grace-secs`; one that does not
//! is abandoned and the Node given back the state its certificate describes, never left
//! `pending` by this daemon's own run. Prometheus metrics and health are served on a plain
//! port ([`metrics`]).

pub mod metrics;
pub mod profile_wait;
pub mod telemetry;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::certification::certify_with_state;
use crate::certification::{passive_once, NodeContext, PassiveOutcome};
use anyhow::Context;
use clap::{Args, ValueHint};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use railguard_api::upkeep::RunTaint;
use railguard_campaign::kube::gpu_pods_of;
use railguard_prober::certify::run::invasive_steps;
use railguard_prober::certify::slots::InvasiveSlots;
use railguard_prober::progress::NoProgress;
use railguard_prober::publish::{
    nccl_node_file, write_if_changed, NodeEvent, NodeFacts, NodePublisher, NodeState,
};
use railguard_prober::telemetry::grey::{GreyPolicy, GreyRailJudge};
use tokio_util::sync::CancellationToken;

pub use metrics::Metrics;

use crate::node_context::NodeArgs;

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
    /// No invasive run while a GPU pod is on the node.
    #[command(flatten)]
    pub gpu: crate::gpu_pods::GpuResourceArgs,
    /// Taints that hold invasive runs like the built-in holds (cordon, NoExecute,
    /// `karpenter.sh/disrupted`, the maintenance label): keys or `key=value`, `*` for any
    /// characters (`nvidia.com/gpu-health`, `*.example.com/quarantine=true`).
    #[arg(long, env = "RAILGUARD_HOLD_TAINTS", value_delimiter = ',')]
    pub hold_taints: Vec<String>,
    /// Metrics and health listener (plain HTTP).
    #[arg(long, env = "RAILGUARD_METRICS_LISTEN", default_value = "0.0.0.0:9464")]
    pub metrics_listen: SocketAddr,
    /// On SIGTERM, how long a check under way may take to finish and publish, seconds; one
    /// still running then is abandoned and the Node restored from its certificate (keep the
    /// pod's terminationGracePeriodSeconds above this).
    #[arg(long, env = "RAILGUARD_SHUTDOWN_GRACE_SECS", default_value_t = 60)]
    pub shutdown_grace_secs: u64,
    /// Write the NCCL environment plugin's node file here after every step, from the Node's
    /// certificate (atomically, only when it changed; e.g. /run/railguard/nccl.json on a
    /// hostPath); unset: no node file.
    #[arg(long, env = "RAILGUARD_NCCL_CONFIG_FILE", value_hint = ValueHint::FilePath)]
    pub nccl_config_file: Option<PathBuf>,
    /// At start, copy the NCCL environment plugin into this directory as
    /// libnccl-env-railguard.so (atomically, when it differs); unset: not installed.
    #[arg(long, env = "RAILGUARD_NCCL_PLUGIN_INSTALL_DIR", value_hint = ValueHint::DirPath)]
    pub nccl_plugin_install_dir: Option<PathBuf>,
    /// The plugin library to install (the prober image's).
    #[arg(
        long,
        env = "RAILGUARD_NCCL_PLUGIN_SOURCE",
        default_value = "/usr/lib/railguard/libnccl-env-railguard.so",
        value_hint = ValueHint::FilePath
    )]
    pub nccl_plugin_source: PathBuf,
    /// This daemon's own pod, `namespace/name` (the chart sets it from the downward API):
    /// it holds the profile's RDMA devices itself, so it never counts as a pod in use.
    #[arg(long, env = "RAILGUARD_OWN_POD")]
    pub own_pod: Option<String>,
    /// Namespace of the Leases that cap invasive runs cluster-wide (the chart sets the
    /// release namespace).
    #[arg(long, env = "RAILGUARD_LEASE_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// The node's test lock, shared with the peer endpoint's `--test-lock-file`: an invasive
    /// run holds it alone and waits (deferred, never queued) while a campaign pair test on
    /// this node's rails holds it. Unset: runs do not look.
    #[arg(long, env = "RAILGUARD_TEST_LOCK_FILE", value_hint = ValueHint::FilePath)]
    pub test_lock_file: Option<PathBuf>,
    /// Passive rail telemetry: every this many milliseconds, read each rail's `counters/`
    /// and `hw_counters/` from sysfs and publish per-rail rates as metrics
    /// (`railguard_prober_rail_*`); 0 turns it off.
    #[arg(long, env = "RAILGUARD_TELEMETRY_INTERVAL_MS", default_value_t = 1000)]
    pub telemetry_interval_ms: u64,
    /// The grey-rail judge over each telemetry tick (a rail the job uses that lags its
    /// siblings in throughput, or leads them in port_xmit_wait or retransmits; retransmit
    /// and error bursts; see docs/grey-rails.md): `off`, `observe` (log and
    /// railguard_prober_rail_grey only) or `enforce` (a grey rail fails at once with fault
    /// `grey`, which taints it).
    #[arg(long, env = "RAILGUARD_GREY_RAILS", value_enum, default_value_t = telemetry::GreyMode::Observe)]
    pub grey_rails: telemetry::GreyMode,
    /// Telemetry ticks in a row with evidence before a rail turns grey.
    #[arg(long, env = "RAILGUARD_GREY_FAIL_WINDOWS", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub grey_fail_windows: u32,
    /// Clean telemetry ticks in a row before a grey rail is lifted.
    #[arg(long, env = "RAILGUARD_GREY_LIFT_WINDOWS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub grey_lift_windows: u32,
    /// Retransmits (hw_counters: out_of_sequence, packet_seq_err, local_ack_timeout_err,
    /// completer_retry_err, ...) within one tick that are evidence on any rail.
    #[arg(long, env = "RAILGUARD_GREY_RETRANSMIT_BURST", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub grey_retransmit_burst: u64,
}

/// The counter window of a passive check the grey-rail judge asked for: the judge has
/// already watched the rail for several ticks, so the check itself need not wait long.
const GREY_CHECK_WINDOW: Duration = Duration::from_secs(1);

/// What the loop does about an invasive run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvasiveDecision {
    /// Neither due nor requested.
    NotDue,
    /// Run it.
    Run,
    /// Due or requested (`requested`: `railguard.io/recertify`), but GPU pods are on the node:
    /// no invasive test while they may be using the GPUs and rails. A request stays on the
    /// Node and is retried.
    Defer { requested: bool, pods: Vec<String> },
    /// Due or requested, but the node is out of service for tests (cordoned, draining, in a
    /// maintenance window): `reason` says which. A request stays and is retried.
    Unavailable { requested: bool, reason: String },
}

/// Pure: whether to run an invasive certification, given whether one is `due`, whether the
/// Node asks for one (`recertify`), why the node is out of service for tests (`unavailable`,
/// [`railguard_prober::publish::NodeState::unavailable_for_tests`]) and the pods holding
/// its GPUs, RDMA devices or DRA claims (listed only when one of them holds). A request
/// never overrides either.
pub fn invasive_decision(
    due: bool,
    recertify: bool,
    gpu_pods: &[String],
    unavailable: Option<&str>,
) -> InvasiveDecision {
    if !due && !recertify {
        return InvasiveDecision::NotDue;
    }
    if let Some(reason) = unavailable {
        return InvasiveDecision::Unavailable {
            requested: recertify,
            reason: reason.to_string(),
        };
    }
    if gpu_pods.is_empty() {
        InvasiveDecision::Run
    } else {
        InvasiveDecision::Defer {
            requested: recertify,
            pods: gpu_pods.to_vec(),
        }
    }
}

/// Pure: the first pods by name for an Event, and how many more.
fn pod_names(pods: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut names = pods
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if pods.len() > SHOWN {
        names.push_str(&format!(" and {} more", pods.len() - SHOWN));
    }
    names
}

/// Pure: the Event for a requested run held back by GPU pods, posted once per request.
pub fn recertify_deferred_event(pods: &[String], retry_in: Duration) -> NodeEvent {
    let names = pod_names(pods);
    NodeEvent {
        reason: "RecertifyDeferred",
        kind: "Normal",
        message: format!(
            "{} is kept: GPU pods on the node ({names}); an invasive run starts once none is left (checked every {} s)",
            railguard_api::keys::ANNOTATION_RECERTIFY,
            retry_in.as_secs().max(1)
        ),
    }
}

/// Pure: whether a Node read at the daemon's start needs [`Loop::restore`]: tainted
/// `testing` or labelled `pending` with no run under way (a predecessor killed mid-run), or
/// its fabric label is not what its certificate says (an uninstall's clean-up took it).
fn labels_need_restoring(state: &NodeState, now: jiff::Timestamp) -> bool {
    let pending = state.fabric_label.as_deref() == Some(railguard_api::keys::fabric::PENDING);
    let mismatched = state
        .certificate
        .as_ref()
        .is_some_and(|c| state.fabric_label.as_deref() != Some(c.fabric_label(now)));
    state.run_tainted || pending || mismatched
}

/// How often an invasive run looks for pods that arrived on the node.
pub const RUN_POD_CHECK: Duration = Duration::from_secs(2);

/// How an invasive run that was started ended.
#[derive(Debug)]
enum InvasiveEnd {
    /// It ran and published its certificate.
    Published,
    /// GPU pods came: after the taint, before the run (`during: false`), or while it ran.
    /// The Node is restored from its certificate and the taint lifted; nothing published.
    Abandoned { pods: Vec<String>, during: bool },
}

/// Pure: the Event for an invasive run abandoned because GPU pods came to the node.
pub fn invasive_abandoned_event(pods: &[String], during: bool, retry_in: Duration) -> NodeEvent {
    let names = pod_names(pods);
    let when = if during {
        "arrived during the invasive run"
    } else {
        "were bound before the testing taint took effect"
    };
    NodeEvent {
        reason: "InvasiveRunAbandoned",
        kind: "Warning",
        message: format!(
            "GPU pods {when} ({names}): the run stopped, the node is restored from its certificate and the testing taint lifted; retried once no GPU pod is left (checked every {} s)",
            retry_in.as_secs().max(1)
        ),
    }
}

/// Pure: the Event for a requested run held back because the node is out of service for
/// tests, posted once per request.
pub fn recertify_unavailable_event(reason: &str, retry_in: Duration) -> NodeEvent {
    NodeEvent {
        reason: "RecertifyDeferred",
        kind: "Normal",
        message: format!(
            "{} is kept: the node is {reason}; an invasive run starts once it is back in service (checked every {} s)",
            railguard_api::keys::ANNOTATION_RECERTIFY,
            retry_in.as_secs().max(1)
        ),
    }
}

/// Pure: how long after the daemon's start the first invasive run is due. A certificate
/// this node's prober issued for `profile` that is still valid at `now` is not redone at
/// every restart (a rollout of the DaemonSet would otherwise retest the whole fleet): the
/// run is due `interval` after it was issued, and never later than its expiry.
pub fn first_invasive_in(
    cert: Option<&railguard_api::Certificate>,
    node: &str,
    profile: &str,
    interval: Duration,
    now: jiff::Timestamp,
) -> Duration {
    let Some(c) = cert else {
        return Duration::ZERO;
    };
    let ours = c.node.as_deref() == Some(node) && c.profile == profile;
    if !ours || c.verdict != railguard_api::Verdict::Certified || c.is_expired(now) {
        return Duration::ZERO;
    }
    let interval = jiff::SignedDuration::try_from(interval).unwrap_or(jiff::SignedDuration::MAX);
    let due = c
        .issued_at
        .checked_add(interval)
        .unwrap_or(c.expires_at)
        .min(c.expires_at);
    Duration::try_from(now.duration_until(due)).unwrap_or(Duration::ZERO)
}

/// Pure: `namespace/name` of the pods on the node an invasive run would disturb
/// ([`gpu_pods_of`]), less the daemon's own pod (`own`, `namespace/name`), which holds the
/// rails' RDMA devices for the tests themselves.
pub fn pods_in_use(pods: &[Pod], resources: &[String], own: Option<&str>) -> Vec<String> {
    let mut in_use = gpu_pods_of(pods, resources);
    in_use.retain(|p| Some(p.as_str()) != own);
    in_use
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
    /// An invasive run has marked the Node pending and not yet published (or restored).
    invasive_in_flight: AtomicBool,
    /// `--nccl-config-file`.
    nccl_node_file: Option<NcclNodeFileSink>,
    /// This node, watched (a field selector on its name): each step reads it here instead of
    /// a GET every poll (2,000 nodes polling every 10 s are 200 requests a second).
    node_cache: Arc<railguard_kube::store::Store<k8s_openapi::api::core::v1::Node>>,
    /// The namespace of the invasive slot Leases.
    lease_namespace: String,
    /// The grey rails the telemetry task's judge holds (`--grey-rails enforce`) and the
    /// jobs' traffic since the last passive check.
    live: Arc<telemetry::LiveEvidence>,
}

/// Where the NCCL plugin's node file goes, and what it says about this machine.
struct NcclNodeFileSink {
    path: PathBuf,
    /// The daemon's start: a node without a certificate is `pending`, expired since then (a
    /// fixed instant, so the file does not change every step).
    started: jiff::Timestamp,
    /// Where the rails are (PCI address, netdev), discovered once: they do not move while
    /// the daemon runs. Retried each step while discovery fails.
    facts: Mutex<Option<NodeFacts>>,
    /// The profile's `status.fleet.consistentRailCount` as last read (`nccl.consistentRails`
    /// only): kept when a read fails, so one failed GET does not change what nodes answer.
    fleet_rail_count: Mutex<Option<u32>>,
}

impl NcclNodeFileSink {
    /// Reads the fleet controller's rail count for `profile` (one GET per step, off any
    /// request path). A failed read keeps the last count, logged.
    async fn refresh_fleet_rail_count(&self, client: &kube::Client, profile: &str) {
        let api = kube::Api::<railguard_api::FabricProfile>::all(client.clone());
        match api.get_opt(profile).await {
            Ok(p) => {
                let count = p
                    .and_then(|p| p.status)
                    .and_then(|s| s.fleet)
                    .and_then(|f| f.consistent_rail_count);
                let mut last = self
                    .fleet_rail_count
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if *last != count {
                    tracing::info!(profile, consistent_rail_count = ?count, "fleet rail count for the NCCL node file");
                    *last = count;
                }
            }
            Err(e) => {
                tracing::warn!(profile, error = %railguard_runtime::error_chain(&e), "cannot read the profile's fleet rail count; keeping the last one");
            }
        }
    }

    fn facts(&self, ctx: &NodeContext) -> NodeFacts {
        let mut cached = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = cached.as_ref() {
            return f.clone();
        }
        match railguard_prober::discover::discover(&ctx.setup.sysfs_root, ctx.setup.use_nvml) {
            Ok(d) => {
                let f = NodeFacts::of(&d);
                *cached = Some(f.clone());
                f
            }
            Err(e) => {
                // The rails are still named (from the certificate), only not located.
                tracing::warn!(error = %railguard_runtime::error_chain(&e), "cannot discover the rails' PCI addresses and netdevs for the NCCL node file; retrying next step");
                NodeFacts::default()
            }
        }
    }
}

/// A watched store of this one Node (`metadata.name` field selector), driven by a task the
/// caller aborts at shutdown. Watch errors are logged and retried with backoff; meanwhile
/// (and while it relists) the store keeps the last Node seen.
fn watch_own_node(
    client: &kube::Client,
    node: &str,
) -> (
    Arc<railguard_kube::store::Store<k8s_openapi::api::core::v1::Node>>,
    tokio::task::JoinHandle<()>,
) {
    use railguard_kube::store::Store;
    use railguard_kube::watch::{watch_into, Config};
    let store = Arc::new(Store::new("own-node"));
    let api = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let config = Config::default().fields(&format!("metadata.name={node}"));
    let fed = store.clone();
    let task = tokio::spawn(async move {
        watch_into(api, config, &fed, |n| Some(n.clone()), |_| {}, |_| {}).await;
    });
    (store, task)
}

/// The name NCCL's loader opens for `NCCL_ENV_PLUGIN=railguard`.
pub const NCCL_PLUGIN_FILE_NAME: &str = "libnccl-env-railguard.so";

/// Copies the plugin library into `dir` as [`NCCL_PLUGIN_FILE_NAME`] when it differs (temp
/// file and rename: a process that has the old one mapped keeps its inode). A missing source
/// is a warning, never fatal: the daemon certifies without it. Returns the installed path.
pub fn install_nccl_plugin(source: &Path, dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let bytes = match std::fs::read(source) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(source = %source.display(), dir = %dir.display(), error = %e, "cannot read the NCCL environment plugin (--nccl-plugin-source); it is not installed into --nccl-plugin-install-dir");
            return Ok(None);
        }
    };
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot create {} (--nccl-plugin-install-dir)",
            dir.display()
        )
    })?;
    let dest = dir.join(NCCL_PLUGIN_FILE_NAME);
    // Writable by its owner only; dlopen needs no execute bit.
    if write_if_changed(&dest, &bytes, 0o644)? {
        tracing::info!(source = %source.display(), path = %dest.display(), "NCCL environment plugin installed");
    }
    Ok(Some(dest))
}

/// What a daemon whose profile delivers NCCL settings through the plugin
/// (`nccl.delivery: Plugin`) lacks of it: `--nccl-plugin-install-dir` and/or
/// `--nccl-config-file`; empty when it has both or the profile does not use the plugin. The
/// chart gives both only to the probers of its Plugin profiles (`ncclPlugin.install: auto`),
/// so a profile switched to Plugin outside its values finds them missing.
pub fn nccl_plugin_missing(
    spec: &railguard_api::FabricProfileSpec,
    install_dir: Option<&Path>,
    config_file: Option<&Path>,
) -> Vec<&'static str> {
    if spec.nccl.delivery != railguard_api::profile::NcclDelivery::Plugin {
        return Vec::new();
    }
    let mut missing = Vec::new();
    if install_dir.is_none() {
        missing.push("--nccl-plugin-install-dir");
    }
    if config_file.is_none() {
        missing.push("--nccl-config-file");
    }
    missing
}

/// When the next checks are due.
struct Schedule {
    /// None until the first step has read the Node ([`first_invasive_in`]).
    next_invasive: Option<Instant>,
    next_passive: Instant,
    /// A requested run held back by GPU pods is looked at again then.
    next_recertify_check: Instant,
    /// The Event for the current held-back request was posted.
    deferral_reported: bool,
    /// When this daemon last wrote its `railguard.io/invasive-waiting` mark (held back by the
    /// cap); renewed every [`railguard_api::invasive::WAITING_RENEW`] while it waits.
    waiting_renewed: Option<Instant>,
    /// The last invasive run due was held back by GPU pods on the node (until one runs).
    busy: bool,
}

impl Loop {
    async fn gpu_pods(&self, client: &kube::Client) -> anyhow::Result<Vec<String>> {
        let pods: kube::Api<Pod> = kube::Api::all(client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.ctx.node));
        let list = pods
            .list(&lp)
            .await
            .context("cannot list pods on the node")?;
        let resources = self.args.gpu.in_use_resources(&self.ctx.profile);
        Ok(pods_in_use(
            &list.items,
            &resources,
            self.args.own_pod.as_deref(),
        ))
    }

    /// One invasive run, tainted `testing` (NoSchedule) whatever `certification.taints`
    /// says, so no scheduler (the default one, Kueue, KAI) places a pod on GPUs under test.
    /// The pods are checked again once the taint is on (one bound between the first check
    /// and the taint is caught), and every [`RUN_POD_CHECK`] during the run (a pod that
    /// tolerates the taint or names the node): either way the run is abandoned, the Node
    /// restored from its certificate and the taint lifted; the request stays.
    async fn invasive(
        &self,
        client: &kube::Client,
        state: &mut NodeState,
        recertify: bool,
    ) -> anyhow::Result<InvasiveEnd> {
        let tainting = self.ctx.profile.spec.certification.taints;
        // In flight from the taint on: a shutdown or an error from here restores and lifts.
        self.invasive_in_flight.store(true, Ordering::SeqCst);
        if let Err(e) = self.publisher.set_run_taint(RunTaint::Testing).await {
            self.invasive_in_flight.store(false, Ordering::SeqCst);
            return Err(e.into());
        }
        let bound = match self.gpu_pods(client).await {
            Ok(pods) => pods,
            Err(e) => {
                self.restore().await;
                return Err(e);
            }
        };
        if !bound.is_empty() {
            self.restore().await;
            return Ok(InvasiveEnd::Abandoned {
                pods: bound,
                during: false,
            });
        }
        let run = certify_with_state(&self.ctx, Some(state), true, Arc::new(NoProgress));
        let arrived = self.pods_arriving(client);
        let out = tokio::select! {
            run = run => match run {
                Ok(out) => out,
                Err(e) => {
                    // The run marked the node pending and will not publish: give it back.
                    self.restore().await;
                    return Err(e.into());
                }
            },
            pods = arrived => {
                // Dropping the run kills its NCCL children and stops the RDMA tests after
                // the rail under way.
                self.restore().await;
                return Ok(InvasiveEnd::Abandoned { pods, during: true });
            }
        };
        self.invasive_in_flight.store(false, Ordering::SeqCst);
        let ended = if tainting {
            RunTaint::Ended(out.certificate.verdict)
        } else {
            RunTaint::Lifted
        };
        self.publisher.set_run_taint(ended).await?;
        self.metrics.record(&out.certificate, "invasive");
        if recertify {
            self.publisher.clear_recertify().await?;
        }
        Ok(InvasiveEnd::Published)
    }

    /// Resolves with the pods in use once there are any (checked every [`RUN_POD_CHECK`]; a
    /// failed list is logged and retried, never taken for "no pods").
    async fn pods_arriving(&self, client: &kube::Client) -> Vec<String> {
        loop {
            tokio::time::sleep(RUN_POD_CHECK).await;
            match self.gpu_pods(client).await {
                Ok(pods) if !pods.is_empty() => return pods,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node = %self.ctx.node, error = %format!("{e:#}"), "cannot list the node's pods during the invasive run; retrying");
                }
            }
        }
    }

    /// After an invasive run that will not publish: labels and condition follow the
    /// certificate on the Node again, and the `testing` taint goes (best effort; logged when
    /// it fails).
    async fn restore(&self) {
        let spec = &self.ctx.profile.spec;
        let mut state = NodeState::default();
        match self
            .publisher
            .restore_after_interrupted_run(&mut state, self.ctx.profile.name(), &spec.signature())
            .await
        {
            Ok(cert) => {
                self.invasive_in_flight.store(false, Ordering::SeqCst);
                let ended = if spec.certification.taints {
                    RunTaint::Ended(
                        cert.as_ref()
                            .map_or(railguard_api::Verdict::Pending, |c| c.verdict),
                    )
                } else {
                    RunTaint::Lifted
                };
                if let Err(e) = self.publisher.set_run_taint(ended).await {
                    tracing::warn!(node = %self.ctx.node, error = %railguard_runtime::error_chain(&e), "interrupted run: cannot lift the testing taint");
                }
                tracing::info!(node = %self.ctx.node, verdict = %cert.as_ref().map(|c| c.verdict.as_label()).unwrap_or("none"), "interrupted run: node restored from its certificate");
            }
            Err(e) => {
                tracing::warn!(node = %self.ctx.node, error = %railguard_runtime::error_chain(&e), "interrupted run: cannot restore the node");
            }
        }
    }

    /// A passive check; `prompt`: the grey-rail judge asked for it (a short counter window);
    /// `busy`: GPU pods hold the invasive run back, so the jobs' traffic may renew the
    /// certificate (`--grey-rails enforce` only: a renewal rests on the judge's verdicts).
    async fn passive(&self, state: &mut NodeState, prompt: bool, busy: bool) -> anyhow::Result<()> {
        let mut window = Duration::from_millis(self.args.window_ms);
        if prompt {
            window = window.min(GREY_CHECK_WINDOW);
        }
        let grey = self.live.current();
        let traffic = self.live.take_traffic();
        let renew =
            (busy && self.args.grey_rails == telemetry::GreyMode::Enforce).then_some(&traffic);
        match passive_once(&self.ctx, state, window, &grey, renew).await? {
            // Nothing to update: only an invasive run can certify.
            PassiveOutcome::NothingToPublish => self.metrics.run("passive", "nothing-to-publish"),
            PassiveOutcome::Unchanged => self.metrics.run("passive", "unchanged"),
            PassiveOutcome::Published(cert) => self.metrics.record(&cert, "passive"),
        }
        Ok(())
    }

    fn intervals(&self) -> (Duration, Duration) {
        let cert = &self.ctx.profile.spec.certification;
        let interval =
            Duration::from_secs(self.args.interval_secs.unwrap_or(cert.interval_seconds));
        let passive_every = Duration::from_secs(
            self.args
                .passive_interval_secs
                .unwrap_or(cert.passive_interval_seconds),
        );
        (interval, passive_every)
    }

    /// One step: read the Node, then an invasive run, or a passive check, when due; then the
    /// NCCL plugin's node file from the certificate the step leaves on the Node.
    async fn step(&self, client: &kube::Client, plan: &mut Schedule) -> anyhow::Result<()> {
        // The Node is read once per step; the step's writes read it again before writing,
        // and keep `state` current.
        let cached = self.node_cache.get(&self.ctx.node);
        let mut state = match cached {
            Some(node) => NodeState::of(&node),
            // Until the watch has listed (or while it relists): a GET.
            None => self.publisher.read_state().await?,
        };
        let result = self.checks(client, plan, &mut state).await;
        // Whatever the checks did (a failed publish leaves the Node's certificate as it was).
        if let Some(sink) = &self.nccl_node_file {
            if self.ctx.profile.spec.nccl.consistent_rails {
                sink.refresh_fleet_rail_count(client, self.ctx.profile.name())
                    .await;
            }
        }
        self.sync_nccl_node_file(&state);
        result
    }

    /// The node file from the Node's certificate, rewritten only when it changed. A failure
    /// is logged with the path and tried again next step: never fatal, the plugin keeps the
    /// last file (and judges its expiry itself).
    fn sync_nccl_node_file(&self, state: &NodeState) {
        let Some(sink) = &self.nccl_node_file else {
            return;
        };
        let facts = sink.facts(&self.ctx);
        let fleet_rail_count = *sink
            .fleet_rail_count
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let file = nccl_node_file(
            &self.ctx.node,
            state.certificate.as_ref(),
            &self.ctx.profile,
            fleet_rail_count,
            &facts,
            sink.started,
        );
        let mut text = file.to_json();
        text.push('\n');
        // Never a file the plugin would reject (it would answer nothing at all).
        if let Err(e) = railguard_nccl_env::NodeFile::parse(&text) {
            tracing::warn!(path = %sink.path.display(), error = %railguard_runtime::error_chain(&e), "NCCL node file not written: the plugin would reject it");
            return;
        }
        if let Some(dir) = sink.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(path = %sink.path.display(), error = %e, "cannot create the NCCL node file's directory; retrying next step");
                return;
            }
        }
        match write_if_changed(&sink.path, text.as_bytes(), 0o644) {
            Ok(true) => {
                tracing::info!(path = %sink.path.display(), generation = file.certificate.generation, verdict = ?file.certificate.verdict, healthy_rails = file.rails.iter().filter(|r| r.health == railguard_nccl_env::RailHealth::Healthy).count(), "NCCL node file written");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(path = %sink.path.display(), error = %railguard_runtime::error_chain(&e), "cannot write the NCCL node file; retrying next step");
            }
        }
    }

    /// An invasive run, or a passive check, when due.
    async fn checks(
        &self,
        client: &kube::Client,
        plan: &mut Schedule,
        state: &mut NodeState,
    ) -> anyhow::Result<()> {
        let (interval, passive_every) = self.intervals();
        let jitter = self.args.jitter_percent;
        let recertify = state.recertify_requested;
        if !recertify {
            plan.deferral_reported = false;
        }
        let now = Instant::now();
        let next_invasive = *plan.next_invasive.get_or_insert_with(|| {
            let wait = first_invasive_in(
                state.certificate.as_ref(),
                &self.ctx.node,
                self.ctx.profile.name(),
                interval,
                jiff::Timestamp::now(),
            );
            if !wait.is_zero() {
                tracing::info!(node = %self.ctx.node, due_in_s = wait.as_secs(), "the certificate on the node is valid; no invasive run at start");
            }
            now + wait
        });
        let due = now >= next_invasive;
        let requested = recertify && now >= plan.next_recertify_check;
        let held =
            railguard_prober::publish::held_by_named_taint(&state.taints, &self.args.hold_taints);
        let unavailable = state.unavailable_for_tests.as_deref().or(held.as_deref());
        let pods = if (due || requested) && unavailable.is_none() {
            self.gpu_pods(client).await?
        } else {
            Vec::new()
        };
        match invasive_decision(due, requested, &pods, unavailable) {
            InvasiveDecision::Run => {
                plan.busy = false;
                // Not beside a campaign pair test on this node's rails: held for the run.
                let _node_lock = match &self.args.test_lock_file {
                    None => None,
                    Some(path) => {
                        match railguard_prober::test_lock::NodeTestLock::new(path)
                            .try_exclusive()?
                        {
                            Some(hold) => Some(hold),
                            None => {
                                let retry = jittered(passive_every, jitter.max(50));
                                self.metrics.run("invasive", "deferred-pair-test");
                                tracing::info!(node = %self.ctx.node, retry_s = retry.as_secs(), "invasive run held back: a campaign pair test is using the node's rails");
                                if requested {
                                    plan.next_recertify_check = Instant::now() + retry;
                                }
                                if due {
                                    plan.next_invasive = Some(Instant::now() + retry);
                                }
                                return Ok(());
                            }
                        }
                    }
                };
                // The cluster-wide cap: no slot, no run (an API error too: nothing starts on
                // a slot not proven held).
                let Some(slot) = self.take_slot(client, plan).await? else {
                    let retry = jittered(passive_every, jitter.max(50));
                    if requested {
                        plan.next_recertify_check = Instant::now() + retry;
                    }
                    if due {
                        plan.next_invasive = Some(Instant::now() + retry);
                    }
                    return Ok(());
                };
                tracing::info!(node = %self.ctx.node, recertify, slot = %slot.name(), "invasive certification");
                let keeping = tokio_util::sync::CancellationToken::new();
                let keep = {
                    let keeping = keeping.clone();
                    async move {
                        slot.keep(keeping).await;
                        slot
                    }
                };
                let (slot, ran) = tokio::join!(keep, async {
                    // The run's own traffic (one rail after another) is not a job's.
                    self.live.pause(true);
                    let ran = self.invasive(client, state, recertify).await;
                    self.live.pause(false);
                    keeping.cancel();
                    ran
                });
                let name = slot.name().to_string();
                if let Err(e) = slot.release().await {
                    tracing::warn!(node = %self.ctx.node, slot = %name, error = %railguard_runtime::error_chain(&e), "cannot give the invasive slot back; it frees itself when its Lease expires");
                }
                if let InvasiveEnd::Abandoned { pods, during } = ran? {
                    let retry = jittered(passive_every, jitter);
                    let outcome = if during {
                        "aborted-gpu-pods"
                    } else {
                        "deferred-gpu-pods"
                    };
                    self.metrics.run("invasive", outcome);
                    tracing::warn!(node = %self.ctx.node, pods = %pods.join(","), during, retry_s = retry.as_secs(), "invasive run abandoned: GPU pods on the node; node restored from its certificate, testing taint lifted");
                    let ev = invasive_abandoned_event(&pods, during, passive_every);
                    if let Err(e) = self.publisher.record_event(state, &ev).await {
                        tracing::warn!(node = %self.ctx.node, error = %railguard_runtime::error_chain(&e), "cannot post the InvasiveRunAbandoned event");
                    }
                    if requested {
                        plan.next_recertify_check = Instant::now() + retry;
                    }
                    if due {
                        plan.next_invasive = Some(Instant::now() + retry);
                    }
                    return Ok(());
                }
                plan.deferral_reported = false;
                plan.next_invasive = Some(Instant::now() + jittered(interval, jitter));
                plan.next_passive = Instant::now() + jittered(passive_every, jitter);
                return Ok(());
            }
            InvasiveDecision::Defer { requested, pods } => {
                plan.busy = true;
                self.clear_waiting_mark(plan).await;
                let retry = jittered(passive_every, jitter);
                if requested {
                    plan.next_recertify_check = Instant::now() + retry;
                    tracing::info!(node = %self.ctx.node, pods = %pods.join(","), "recertify requested but GPU pods are on the node; keeping the request");
                    self.metrics.run("invasive", "deferred-gpu-pods");
                    if !plan.deferral_reported {
                        let ev = recertify_deferred_event(&pods, passive_every);
                        self.publisher.record_event(state, &ev).await?;
                        plan.deferral_reported = true;
                    }
                }
                if due {
                    tracing::info!(node = %self.ctx.node, "invasive run due but a GPU pod is on the node; deferring");
                    plan.next_invasive = Some(Instant::now() + retry);
                }
            }
            InvasiveDecision::Unavailable { requested, reason } => {
                plan.busy = false;
                self.clear_waiting_mark(plan).await;
                let retry = jittered(passive_every, jitter);
                if requested {
                    plan.next_recertify_check = Instant::now() + retry;
                    self.metrics.run("invasive", "deferred-node-unavailable");
                    if !plan.deferral_reported {
                        let ev = recertify_unavailable_event(&reason, passive_every);
                        self.publisher.record_event(state, &ev).await?;
                        plan.deferral_reported = true;
                    }
                }
                if due {
                    plan.next_invasive = Some(Instant::now() + retry);
                }
                tracing::info!(node = %self.ctx.node, reason = %reason, requested, "invasive run held back: the node is out of service for tests");
            }
            InvasiveDecision::NotDue => {}
        }
        let grey_changed = self.live.take_changed();
        if grey_changed || Instant::now() >= plan.next_passive {
            if grey_changed {
                tracing::info!(node = %self.ctx.node, grey = ?self.live.current().keys().collect::<Vec<_>>(), "grey rails changed: passive check now");
            }
            self.passive(state, grey_changed, plan.busy).await?;
            plan.next_passive = Instant::now() + jittered(passive_every, jitter);
        }
        Ok(())
    }

    /// Takes one of the profile's invasive slots in this node's turn
    /// ([`railguard_api::invasive::slot_turn`]): `None` (the node marked waiting, so the fleet
    /// controller queues it) when it is not its turn or every slot is held.
    async fn take_slot(
        &self,
        client: &kube::Client,
        plan: &mut Schedule,
    ) -> anyhow::Result<Option<railguard_prober::certify::slots::HeldSlot>> {
        let cap = self.ctx.profile.spec.certification.max_concurrent_invasive;
        let now = jiff::Timestamp::now();
        let status = match self
            .publisher
            .invasive_status(self.ctx.profile.name())
            .await
        {
            Ok(s) => s,
            Err(e) => {
                // As without a fleet controller: never more slots than asked for.
                tracing::warn!(node = %self.ctx.node, error = %railguard_runtime::error_chain(&e), "cannot read the profile's invasive queue; taking slots first come, first served");
                None
            }
        };
        let turn = railguard_api::invasive::slot_turn(cap, status.as_ref(), &self.ctx.node, now);
        let held = if turn.may_take {
            let slots = InvasiveSlots::new(
                client,
                &self.lease_namespace,
                &self.ctx.profile.invasive_slot_leases(turn.slots),
                &self.ctx.node,
            );
            slots.acquire(now).await?
        } else {
            None
        };
        match held {
            Some(slot) => {
                self.clear_waiting_mark(plan).await;
                Ok(Some(slot))
            }
            None => {
                self.metrics.run("invasive", "deferred-concurrency-cap");
                let why = turn.why_not.unwrap_or_else(|| {
                    "every invasive slot of the profile is held by another node".into()
                });
                tracing::info!(node = %self.ctx.node, cap = %cap, slots = turn.slots, "invasive run held back: {why}");
                let renew = railguard_api::invasive::WAITING_RENEW.unsigned_abs();
                if plan.waiting_renewed.is_none_or(|at| at.elapsed() >= renew) {
                    match self.publisher.mark_invasive_waiting(Some(now)).await {
                        Ok(()) => plan.waiting_renewed = Some(Instant::now()),
                        Err(e) => {
                            tracing::warn!(node = %self.ctx.node, error = %railguard_runtime::error_chain(&e), "cannot mark the node waiting for an invasive slot; it is not queued")
                        }
                    }
                }
                Ok(None)
            }
        }
    }

    /// Takes the node out of the invasive queue: its run started, or it no longer waits.
    /// Read from the watched Node, so a mark left by a predecessor goes too.
    async fn clear_waiting_mark(&self, plan: &mut Schedule) {
        let marked = self.node_cache.values().iter().any(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(railguard_api::keys::ANNOTATION_INVASIVE_WAITING))
        });
        if !marked && plan.waiting_renewed.is_none() {
            return;
        }
        match self.publisher.mark_invasive_waiting(None).await {
            Ok(()) => plan.waiting_renewed = None,
            Err(e) => {
                tracing::warn!(node = %self.ctx.node, error = %railguard_runtime::error_chain(&e), "cannot clear the node's invasive-waiting mark; the fleet controller drops it when it ages")
            }
        }
    }

    async fn run(self, client: kube::Client, stop: CancellationToken) {
        // A predecessor killed mid-run (SIGKILL, OOM, a reboot) left the Node tainted
        // `testing` or `pending`, or an uninstall's clean-up took the labels of a certificate
        // that is still there: no run is under way now, so the Node follows its certificate
        // again before the first step (the next run is decided as usual).
        match self.publisher.read_state().await {
            Ok(state) if labels_need_restoring(&state, jiff::Timestamp::now()) => {
                tracing::info!(node = %self.ctx.node, run_tainted = state.run_tainted, label = ?state.fabric_label, "the node does not show its certificate (a run left unfinished, or labels cleaned): restoring it");
                self.restore().await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(node = %self.ctx.node, error = %railguard_runtime::error_chain(&e), "cannot read the node at start; an unfinished run is restored at the next run's end");
            }
        }
        let (_, passive_every) = self.intervals();
        let poll = Duration::from_millis(self.args.poll_ms.max(100));
        let grace = Duration::from_secs(self.args.shutdown_grace_secs);
        let mut plan = Schedule {
            next_invasive: None,
            next_passive: Instant::now() + jittered(passive_every, self.args.jitter_percent),
            next_recertify_check: Instant::now(),
            deferral_reported: false,
            waiting_renewed: None,
            busy: false,
        };
        let mut failures = 0u32;
        loop {
            self.metrics.heartbeat();
            let mut step = Box::pin(self.step(&client, &mut plan));
            let result = tokio::select! {
                r = &mut step => r,
                _ = stop.cancelled() => {
                    // Stop between steps: the one under way finishes (and publishes) first.
                    tracing::info!(node = %self.ctx.node, grace_s = grace.as_secs(), "shutdown: finishing the check under way");
                    match tokio::time::timeout(grace, &mut step).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::warn!(node = %self.ctx.node, error = %format!("{e:#}"), "check failed during shutdown");
                        }
                        Err(_) => {
                            drop(step);
                            tracing::warn!(node = %self.ctx.node, "shutdown grace period over; abandoning the check under way");
                            if self.invasive_in_flight.load(Ordering::SeqCst) {
                                self.restore().await;
                            }
                        }
                    }
                    break;
                }
            };
            drop(step);
            let wait = match result {
                Ok(()) => {
                    failures = 0;
                    poll
                }
                Err(e) => {
                    failures += 1;
                    self.metrics.run("step", "error");
                    let wait = backoff(failures);
                    tracing::warn!(node = %self.ctx.node, error = %format!("{e:#}"), retry_in_s = wait.as_secs(), "check failed");
                    wait
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
                // A rail turned grey or was lifted: check now, not at the next poll.
                _ = self.live.changed() => {}
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
        if let Some(dir) = &self.nccl_plugin_install_dir {
            // Before anything waits (the profile): training pods may need it at once.
            if let Err(e) = install_nccl_plugin(&self.nccl_plugin_source, dir) {
                tracing::warn!(error = %format!("{e:#}"), "NCCL environment plugin not installed");
            }
        }
        let client = self
            .node
            .client(true)
            .await?
            .context("the daemon needs a cluster client")?;
        // Until the profile (which bounds a run) is known, the wait loop beats every poll.
        let poll = Duration::from_millis(self.poll_ms.max(100));
        let metrics = Arc::new(Metrics::new(MAX_BACKOFF + poll));
        let stop = CancellationToken::new();
        // Health stays served while a check finishes after SIGTERM.
        let stop_serving = CancellationToken::new();
        let server = tokio::spawn(crate::health::serve(
            listener,
            metrics.clone(),
            stop_serving.clone(),
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
            profile_wait::wait_for_context(&self.node, &client, &metrics, poll, &stop).await?;
        let Some(ctx) = waited else {
            stop_serving.cancel();
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
        let missing = nccl_plugin_missing(
            &ctx.profile.spec,
            self.nccl_plugin_install_dir.as_deref(),
            self.nccl_config_file.as_deref(),
        );
        if !missing.is_empty() {
            tracing::warn!(node = %ctx.node, profile = ctx.profile.name(), missing = %missing.join(", "), "the profile delivers NCCL settings through the environment plugin (nccl.delivery: Plugin), but this daemon installs no plugin or writes no node file: its pods find neither. The chart gives both to the probers of profiles that are Plugin in its values; set ncclPlugin.install=always for a profile switched outside them");
        }
        let live = Arc::new(telemetry::LiveEvidence::default());
        let telemetry_task = telemetry::interval(self.telemetry_interval_ms).map(|every| {
            let judging =
                (self.grey_rails != telemetry::GreyMode::Off).then(|| telemetry::GreyJudging {
                    judge: GreyRailJudge::new(GreyPolicy {
                        fail_after_windows: self.grey_fail_windows,
                        lift_after_windows: self.grey_lift_windows,
                        retransmit_burst: self.grey_retransmit_burst,
                        ..GreyPolicy::default()
                    }),
                    enforce: self.grey_rails == telemetry::GreyMode::Enforce,
                    shared: live.clone(),
                });
            tokio::spawn(telemetry::run(
                ctx.setup.sysfs_root.clone(),
                ctx.profile.spec.rails.iter().map(Into::into).collect(),
                every,
                metrics.telemetry.clone(),
                live.clone(),
                judging,
                stop.clone(),
            ))
        });
        let (node_cache, node_watch) = watch_own_node(&client, &ctx.node);
        let l = Loop {
            lease_namespace: self.lease_namespace.clone(),
            node_cache,
            ctx,
            publisher,
            args: self.clone(),
            metrics,
            invasive_in_flight: AtomicBool::new(false),
            live,
            nccl_node_file: self.nccl_config_file.clone().map(|path| NcclNodeFileSink {
                path,
                started: jiff::Timestamp::now(),
                facts: Mutex::new(None),
                fleet_rail_count: Mutex::new(None),
            }),
        };
        l.run(client, stop.clone()).await;
        node_watch.abort();
        if let Some(t) = telemetry_task {
            t.abort();
        }
        stop.cancel();
        stop_serving.cancel();
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
    fn a_plugin_profile_without_the_plugins_paths_is_reported() {
        let mut profile = railguard_api::profiles_from_yaml(include_str!(
            "../../../../api/fixtures/profiles/dgx-h100-ndr.yaml"
        ))
        .unwrap()
        .remove(0);
        let (dir, file) = (
            Path::new("/opt/railguard/nccl"),
            Path::new("/run/railguard/nccl.json"),
        );
        assert!(
            nccl_plugin_missing(&profile.spec, None, None).is_empty(),
            "Env"
        );
        profile.spec.nccl.delivery = railguard_api::profile::NcclDelivery::Plugin;
        assert!(nccl_plugin_missing(&profile.spec, Some(dir), Some(file)).is_empty());
        assert_eq!(
            nccl_plugin_missing(&profile.spec, None, None),
            ["--nccl-plugin-install-dir", "--nccl-config-file"]
        );
        assert_eq!(
            nccl_plugin_missing(&profile.spec, Some(dir), None),
            ["--nccl-config-file"]
        );
    }

    #[test]
    fn a_node_that_does_not_show_its_certificate_is_restored_at_start() {
        let now = jiff::Timestamp::now();
        let profile = railguard_api::profiles_from_yaml(include_str!(
            "../../../../api/fixtures/profiles/dgx-h100-ndr.yaml"
        ))
        .unwrap()
        .remove(0);
        let cert = railguard_sim::certificates::certificate(
            &profile,
            railguard_api::Verdict::Certified,
            now,
            390.0,
            46.0,
        );
        let shown = NodeState {
            certificate: Some(cert),
            fabric_label: Some("certified".into()),
            ..NodeState::default()
        };
        assert!(!labels_need_restoring(&shown, now));
        let cleaned = NodeState {
            fabric_label: None,
            ..shown.clone()
        };
        assert!(
            labels_need_restoring(&cleaned, now),
            "labels taken by a clean-up"
        );
        let left = NodeState {
            run_tainted: true,
            ..shown.clone()
        };
        assert!(
            labels_need_restoring(&left, now),
            "a testing taint left behind"
        );
        assert!(
            !labels_need_restoring(&NodeState::default(), now),
            "a new node: nothing to restore"
        );
        let pending = NodeState {
            fabric_label: Some("pending".into()),
            ..NodeState::default()
        };
        assert!(labels_need_restoring(&pending, now));
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(0), Duration::from_secs(5));
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(10), MAX_BACKOFF);
    }

    #[test]
    fn busy_gpus_hold_back_every_invasive_run_a_requested_one_too() {
        let busy = vec!["ml/train-0".to_string()];
        assert_eq!(
            invasive_decision(false, false, &busy, None),
            InvasiveDecision::NotDue
        );
        assert_eq!(
            invasive_decision(false, false, &[], None),
            InvasiveDecision::NotDue
        );
        assert_eq!(
            invasive_decision(true, false, &[], None),
            InvasiveDecision::Run
        );
        assert_eq!(
            invasive_decision(false, true, &[], None),
            InvasiveDecision::Run
        );
        assert_eq!(
            invasive_decision(false, true, &busy, None),
            InvasiveDecision::Defer {
                requested: true,
                pods: busy.clone()
            }
        );
        assert_eq!(
            invasive_decision(true, false, &busy, None),
            InvasiveDecision::Defer {
                requested: false,
                pods: busy.clone()
            }
        );
    }

    #[test]
    fn the_daemons_own_pod_holding_the_rdma_devices_is_not_a_job_in_use() {
        let pod = |ns: &str, name: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": ns, "name": name},
                "spec": {"containers": [{"name": "c",
                    "resources": {"limits": {"rdma/hca": "8"}}}]}
            }))
            .unwrap()
        };
        let pods = vec![pod("railguard", "prober-x1"), pod("storage", "client")];
        let resources = vec!["nvidia.com/gpu".to_string(), "rdma/hca".to_string()];
        assert_eq!(
            pods_in_use(&pods, &resources, Some("railguard/prober-x1")),
            vec!["storage/client".to_string()]
        );
        assert_eq!(pods_in_use(&pods, &resources, None).len(), 2);
    }

    #[test]
    fn a_node_out_of_service_holds_back_every_run_before_its_pods_are_looked_at() {
        let cordoned = Some("cordoned (spec.unschedulable)");
        assert_eq!(
            invasive_decision(true, true, &[], cordoned),
            InvasiveDecision::Unavailable {
                requested: true,
                reason: "cordoned (spec.unschedulable)".into()
            }
        );
        assert_eq!(
            invasive_decision(false, false, &[], cordoned),
            InvasiveDecision::NotDue
        );
        let ev =
            recertify_unavailable_event("cordoned (spec.unschedulable)", Duration::from_secs(60));
        assert!(
            ev.message.contains("the node is cordoned"),
            "{}",
            ev.message
        );
    }

    #[test]
    fn a_restart_with_a_valid_certificate_does_not_retest() {
        let mut c = railguard_api::Certificate::from_annotation(
            &serde_json::json!({
                "version": 1, "generation": 2,
                "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-02T00:00:00Z",
                "profile": "h100", "signature": "v1-abc", "node": "gpu-a",
                "verdict": "certified", "reasons": [], "rails": [], "gpus": [],
            })
            .to_string(),
        )
        .unwrap();
        let six_hours = Duration::from_secs(6 * 3600);
        let at = |t: &str| t.parse::<jiff::Timestamp>().unwrap();
        let wait = |c: &railguard_api::Certificate, now: &str| {
            first_invasive_in(Some(c), "gpu-a", "h100", six_hours, at(now))
        };
        // Issued at midnight, every six hours: at 02:00 the next run is four hours away.
        assert_eq!(
            wait(&c, "2026-01-01T02:00:00Z"),
            Duration::from_secs(4 * 3600)
        );
        assert_eq!(wait(&c, "2026-01-01T07:00:00Z"), Duration::ZERO);
        // Another node's or another profile's certificate, a failed one, an expired one,
        // none: test now.
        assert_eq!(
            first_invasive_in(
                Some(&c),
                "gpu-b",
                "h100",
                six_hours,
                at("2026-01-01T02:00:00Z")
            ),
            Duration::ZERO
        );
        assert_eq!(
            first_invasive_in(
                Some(&c),
                "gpu-a",
                "b200",
                six_hours,
                at("2026-01-01T02:00:00Z")
            ),
            Duration::ZERO
        );
        assert_eq!(
            first_invasive_in(None, "gpu-a", "h100", six_hours, at("2026-01-01T02:00:00Z")),
            Duration::ZERO
        );
        assert_eq!(wait(&c, "2026-01-02T00:00:00Z"), Duration::ZERO);
        // An interval past the expiry: due at the expiry.
        let long = Duration::from_secs(48 * 3600);
        assert_eq!(
            first_invasive_in(Some(&c), "gpu-a", "h100", long, at("2026-01-01T23:00:00Z")),
            Duration::from_secs(3600)
        );
        c.verdict = railguard_api::Verdict::Failed;
        assert_eq!(wait(&c, "2026-01-01T02:00:00Z"), Duration::ZERO);
    }

    #[test]
    fn the_deferral_event_names_the_pods_and_the_retry() {
        let pods: Vec<String> = (0..7).map(|i| format!("ml/p{i}")).collect();
        let ev = recertify_deferred_event(&pods, Duration::from_secs(60));
        assert_eq!(ev.reason, "RecertifyDeferred");
        assert!(
            ev.message.contains("railguard.io/recertify is kept"),
            "{}",
            ev.message
        );
        assert!(ev.message.contains("ml/p0, ml/p1"), "{}", ev.message);
        assert!(ev.message.contains("and 2 more"), "{}", ev.message);
        assert!(ev.message.contains("every 60 s"), "{}", ev.message);
    }

    #[test]
    fn the_plugin_is_installed_when_it_differs_and_a_missing_source_is_no_error() {
        #![allow(clippy::unwrap_used)]
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("plugin.so");
        let dir = tmp.path().join("node/lib");
        assert_eq!(install_nccl_plugin(&source, &dir).unwrap(), None);
        std::fs::write(&source, b"v1").unwrap();
        let dest = install_nccl_plugin(&source, &dir).unwrap().unwrap();
        assert_eq!(dest, dir.join(NCCL_PLUGIN_FILE_NAME));
        let first = std::fs::metadata(&dest).unwrap();
        install_nccl_plugin(&source, &dir).unwrap();
        assert_eq!(std::fs::metadata(&dest).unwrap().ino(), first.ino());
        // A process with the old library open (mapped) keeps it.
        let mut held = std::fs::File::open(&dest).unwrap();
        std::fs::write(&source, b"v2").unwrap();
        install_nccl_plugin(&source, &dir).unwrap();
        assert_ne!(std::fs::metadata(&dest).unwrap().ino(), first.ino());
        assert_eq!(std::fs::read(&dest).unwrap(), b"v2");
        let mut old = Vec::new();
        std::io::Read::read_to_end(&mut held, &mut old).unwrap();
        assert_eq!(old, b"v1");
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
