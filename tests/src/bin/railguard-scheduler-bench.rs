//! Scheduler throughput with and without railguard-extender, the scheduler_perf way: a real
//! kube-apiserver 1.20, N fake 8-GPU nodes certified for `h100-ndr`, and for each mode M
//! pending training pods created while no scheduler runs; then kube-scheduler 1.20 starts
//! with that mode's configuration and the bench times the bindings it sees on a watch.
//!
//! Modes: `none` (no extender), `cache` (extender with `nodeCacheCapable: true`), `full`
//! (`nodeCacheCapable: false`, full Node objects on the wire). The extender is the real
//! `railguard-extender` binary in cluster mode, one process for the whole run.
//!
//!     cargo build --release -p railguard-extender-cli --bin railguard-extender
//!     cargo run --release -p railguard-tests --bin railguard-scheduler-bench
//!
//! `--profile-seconds N --dir D` also writes a kube-scheduler CPU profile (`go tool pprof -top`)
//! and a `perf record` of the extender per mode into `D/logs`.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use futures::TryStreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::Client;
use railguard_api::{profiles_from_yaml, FabricProfile, Verdict};
use railguard_sim::certificates as synth;
use railguard_tests::bench::{fan_out, until_none_left};
use railguard_tests::daemon::ANY_LOOPBACK_PORT;
use railguard_tests::{control_plane_binaries, ports, workspace_root, ControlPlane};
use serde_json::json;

const MANAGER: &str = "railguard-scheduler-bench";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// kube-scheduler alone.
    None,
    /// railguard-extender with `nodeCacheCapable: true` (node names on the wire).
    Cache,
    /// railguard-extender with `nodeCacheCapable: false` (full Nodes on the wire).
    Full,
}

impl Mode {
    fn describe(self) -> &'static str {
        match self {
            Mode::None => "no extender",
            Mode::Cache => "extender, nodeCacheCapable: true",
            Mode::Full => "extender, nodeCacheCapable: false (full Nodes)",
        }
    }
    fn tag(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Cache => "cache",
            Mode::Full => "full",
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "railguard-scheduler-bench",
    about = "kube-scheduler 1.20 throughput with and without railguard-extender"
)]
struct Args {
    /// Fake nodes (8 GPUs each, all certified for h100-ndr).
    #[arg(long, env = "RAILGUARD_BENCH_NODES", default_value_t = 1000)]
    nodes: usize,
    /// Pending pods (1 GPU each) scheduled per mode.
    #[arg(long, env = "RAILGUARD_BENCH_PODS", default_value_t = 1000)]
    pods: usize,
    /// Modes in the order they run; a mode may repeat (`none` first and last shows drift).
    #[arg(
        long,
        env = "RAILGUARD_BENCH_MODES",
        value_delimiter = ',',
        default_value = "none,cache,full,none"
    )]
    modes: Vec<Mode>,
    /// Runs of the whole mode list.
    #[arg(long, env = "RAILGUARD_BENCH_REPEAT", default_value_t = 1)]
    repeat: usize,
    /// Give up on a mode when its pods are not all bound after this many seconds.
    #[arg(long, env = "RAILGUARD_BENCH_TIMEOUT_SECS", default_value_t = 600)]
    timeout_secs: u64,
    /// kube-scheduler client QPS and burst (high, so the client limiter is not what is measured).
    #[arg(long, env = "RAILGUARD_BENCH_SCHEDULER_QPS", default_value_t = 5000)]
    scheduler_qps: u32,
    /// kube-scheduler log verbosity (`--v`).
    #[arg(long, env = "RAILGUARD_BENCH_SCHEDULER_V", default_value_t = 1)]
    scheduler_v: u8,
    /// Directory holding `railguard-extender` (default: next to this binary).
    #[arg(long, env = "RAILGUARD_BIN_DIR")]
    bin_dir: Option<PathBuf>,
    /// Pods carry no job label, so the extender's prioritize skips gang locality (isolates
    /// its cost: by default all pods are one job, whose bound pods grow to --pods).
    #[arg(long, env = "RAILGUARD_BENCH_NO_GANG")]
    no_gang: bool,
    /// Keep the control plane's files and logs here (default: a temp dir removed at exit).
    #[arg(long, env = "RAILGUARD_BENCH_DIR")]
    dir: Option<PathBuf>,
    /// Profile each mode for this many seconds, from 2 s after the scheduler starts: a Go CPU
    /// profile of kube-scheduler (its /debug/pprof, `go tool pprof`) and, for extender modes,
    /// `perf record -g` of the extender, both written to the log dir. 0: no profiles (the
    /// profilers cost CPU, so ratios are taken from runs without them).
    #[arg(long, env = "RAILGUARD_BENCH_PROFILE_SECONDS", default_value_t = 0)]
    profile_seconds: u64,
}

/// One mode's measurement.
#[derive(Debug)]
struct Run {
    mode: Mode,
    pods: usize,
    /// Scheduler process start to last binding seen.
    start_to_last: Duration,
    /// First to last binding seen.
    first_to_last: Duration,
    /// Mean of kube-scheduler's `scheduler_scheduling_algorithm_duration_seconds`.
    algorithm_mean: Option<Duration>,
    /// Extender `/filter` latency in the server over this mode: mean and bucket bound at p99.
    filter: Option<Latency>,
    /// Extender `/prioritize` latency in the server over this mode.
    prioritize: Option<Latency>,
    load_after: String,
}

impl Run {
    fn rate_first_to_last(&self) -> f64 {
        // n bindings span n-1 intervals.
        rate(self.pods.saturating_sub(1), self.first_to_last)
    }
    fn rate_start_to_last(&self) -> f64 {
        rate(self.pods, self.start_to_last)
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        return f64::NAN;
    }
    n as f64 / d.as_secs_f64()
}

#[derive(Debug, Clone, Copy)]
struct Latency {
    calls: u64,
    mean: Duration,
    p99_le: Duration,
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if args.nodes == 0 || args.pods == 0 || args.modes.is_empty() || args.repeat == 0 {
        bail!("--nodes, --pods, --modes and --repeat must be non-empty and non-zero");
    }
    // 8 GPUs per node, 1 per pod; pods are deleted between modes.
    if args.pods > args.nodes * 8 {
        bail!(
            "--pods {} do not fit on --nodes {} (8 GPUs each)",
            args.pods,
            args.nodes
        );
    }
    let extender_bin = extender_binary(args.bin_dir.as_deref())?;
    let scheduler_bin = control_plane_binaries()?.join("kube-scheduler");

    let mut cp = match &args.dir {
        Some(d) => ControlPlane::start_in(d).await?,
        None => ControlPlane::start().await?,
    };
    let logs = cp.log_dir().to_path_buf();
    eprintln!("control plane up; logs in {}", logs.display());
    cp.apply_fabricprofile_crd().await?;
    let client = cp.client();
    let profile = fixture_profile()?;
    Api::<FabricProfile>::all(client.clone())
        .create(&post_params(), &profile)
        .await
        .context("creating FabricProfile h100-ndr")?;

    let t = Instant::now();
    create_nodes(&cp, &profile, args.nodes).await?;
    eprintln!(
        "{} certified nodes in {:.1}s",
        args.nodes,
        t.elapsed().as_secs_f64()
    );

    let extender = Extender::start(&extender_bin, &cp).await?;
    eprintln!("railguard-extender ready at {}", extender.url);

    let mut runs = Vec::new();
    for round in 0..args.repeat {
        for (i, &mode) in args.modes.iter().enumerate() {
            let ns = format!("bench-{round}-{i}-{}", mode.tag());
            cp.check_alive()?;
            let run = measure(&cp, &scheduler_bin, &extender, &args, mode, &ns).await?;
            eprintln!(
                "{ns}: {} pods, first→last {:.1} pods/s, start→last {:.1} pods/s",
                run.pods,
                run.rate_first_to_last(),
                run.rate_start_to_last()
            );
            runs.push(run);
            delete_pods(&client, &ns, args.pods).await?;
        }
    }
    print_report(&args, &runs);
    Ok(())
}

fn fixture_profile() -> Result<FabricProfile> {
    let path = workspace_root().join("api/fixtures/profiles/dgx-h100-ndr.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    profiles_from_yaml(&text)?
        .into_iter()
        .next()
        .with_context(|| format!("{} holds no FabricProfile", path.display()))
}

fn extender_binary(dir: Option<&Path>) -> Result<PathBuf> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .context("this binary has no directory")?,
    };
    let bin = dir.join("railguard-extender");
    if !bin.is_file() {
        bail!(
            "{} is not built; run `cargo build --release -p railguard-extender-cli --bin railguard-extender` (or set RAILGUARD_BIN_DIR)",
            bin.display()
        );
    }
    Ok(bin)
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// Nodes `node-0000`…: 8 GPUs, a shared RDMA device, leaf/spine topology labels, and a
/// certificate for the profile published as the prober does (labels + annotation).
/// Busbw varies per node so prioritize's headroom score is not flat.
async fn create_nodes(cp: &ControlPlane, profile: &FabricProfile, n: usize) -> Result<()> {
    let issued = Timestamp::now()
        .checked_sub(SignedDuration::from_secs(3600))
        .context("clock before 1970")?;
    let nodes: Api<Node> = Api::all(cp.client());
    let alloc = [
        ("nvidia.com/gpu", "8"),
        ("rdma/rdma_shared_device_a", "1000"),
    ];
    fan_out(n, |i| {
        let nodes = nodes.clone();
        async move {
            let name = format!("node-{i:04}");
            let busbw = 365.0 + (i % 30) as f64;
            let cert = synth::certificate(profile, Verdict::Certified, issued, 392.0, busbw);
            let labels: BTreeMap<String, String> = [
                ("railguard.io/fabric", cert.verdict.as_label().to_string()),
                ("railguard.io/profile", cert.profile.clone()),
                ("railguard.io/signature", cert.signature.clone()),
                (
                    "nvidia.com/gpu.product",
                    "NVIDIA-H100-80GB-HBM3".to_string(),
                ),
                (
                    "network.topology.nvidia.com/leaf",
                    format!("leaf-{}", i / 32),
                ),
                (
                    "network.topology.nvidia.com/spine",
                    format!("spine-{}", i / 256),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            cp.create_node(&name, &labels, &alloc).await?;
            let patch = json!({"metadata": {"annotations": {
                "railguard.io/certificate": cert.to_annotation()?,
            }}});
            nodes
                .patch(
                    &name,
                    &PatchParams {
                        field_manager: Some(MANAGER.into()),
                        ..Default::default()
                    },
                    &Patch::Merge(patch),
                )
                .await
                .with_context(|| format!("publishing the certificate on {name}"))?;
            Ok(())
        }
    })
    .await
}

/// Training pods as the webhook leaves them, all of one job (so gang scoring has work)
/// unless `gang` is false.
async fn create_pods(
    client: &Client,
    ns: &str,
    profile: &FabricProfile,
    n: usize,
    gang: bool,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let signature = profile.spec.signature();
    let labels = if gang {
        json!({"training.kubeflow.org/job-name": "bench"})
    } else {
        json!({})
    };
    fan_out(n, |i| {
        let pods = pods.clone();
        let signature = signature.clone();
        let labels = labels.clone();
        async move {
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("worker-{i:04}"),
                    "labels": labels,
                    "annotations": {
                        "railguard.io/profile": profile.name(),
                        "railguard.io/signature": signature,
                    }},
                "spec": {"containers": [{
                    "name": "trainer", "image": "registry.invalid/trainer:1",
                    "resources": {"limits": {
                        "nvidia.com/gpu": "1",
                        "rdma/rdma_shared_device_a": "1",
                    }},
                }]},
            }))?;
            pods.create(&post_params(), &pod)
                .await
                .with_context(|| format!("creating pod {ns}/worker-{i:04}"))?;
            Ok(())
        }
    })
    .await
}

/// One mode: pending pods, then a scheduler, then bindings timed off a watch.
async fn measure(
    cp: &ControlPlane,
    scheduler_bin: &Path,
    extender: &Extender,
    args: &Args,
    mode: Mode,
    ns: &str,
) -> Result<Run> {
    let client = cp.client();
    cp.create_namespace(ns, &BTreeMap::new()).await?;
    create_pods(&client, ns, &fixture_profile()?, args.pods, !args.no_gang).await?;

    // Watch first, so no binding is missed; count the pending pods the initial list shows.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut events = Box::pin(watcher(pods, watcher::Config::default()));
    let mut bound: HashSet<String> = HashSet::new();
    let mut listed = 0usize;
    loop {
        match events.try_next().await? {
            Some(watcher::Event::InitApply(p)) => {
                listed += 1;
                if node_name(&p).is_some() {
                    bail!("{ns}: a pod is bound before the scheduler started");
                }
            }
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => bail!("{ns}: pod watch ended"),
        }
    }
    if listed != args.pods {
        bail!("{ns}: listed {listed} pods, created {}", args.pods);
    }

    let filter_before = extender.histograms().await?;
    let mut scheduler = Scheduler::start(cp, scheduler_bin, extender, args, mode, ns).await?;
    let started = Instant::now();
    let profiling = (args.profile_seconds > 0).then(|| {
        let extender_pid = (mode != Mode::None).then(|| extender.child.id());
        let out = cp.log_dir().join(ns);
        tokio::spawn(profile_mode(
            scheduler
                .metrics_url
                .trim_end_matches("/metrics")
                .to_string(),
            extender_pid,
            out,
            args.profile_seconds,
        ))
    });
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut first: Option<Instant> = None;
    let mut last = started;
    let mut progress = tokio::time::interval(Duration::from_secs(5));
    progress.tick().await;
    while bound.len() < args.pods {
        tokio::select! {
            ev = events.try_next() => {
                match ev? {
                    Some(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        if node_name(&p).is_some() {
                            let name = p.metadata.name.unwrap_or_default();
                            if bound.insert(name) {
                                let now = Instant::now();
                                first.get_or_insert(now);
                                last = now;
                            }
                        }
                    }
                    Some(_) => {}
                    None => bail!("{ns}: pod watch ended after {} bindings", bound.len()),
                }
            }
            _ = progress.tick() => {
                eprintln!("{ns}: {} of {} bound after {:.0}s", bound.len(), args.pods, started.elapsed().as_secs_f64());
                if let Some(status) = scheduler.child.try_wait()? {
                    bail!("{ns}: kube-scheduler exited ({status}) with {} of {} pods bound; see {}", bound.len(), args.pods, scheduler.log.display());
                }
                if started.elapsed() > timeout {
                    bail!(
                        "{ns} ({}): only {} of {} pods bound after {timeout:?}; see {}",
                        mode.describe(), bound.len(), args.pods, scheduler.log.display()
                    );
                }
            }
        }
    }
    if let Some(task) = profiling {
        match task.await {
            Ok(Ok(files)) => eprintln!("{ns}: profiles in {}", files.join(", ")),
            Ok(Err(e)) => eprintln!("{ns}: profiling failed: {e:#}"),
            Err(e) => eprintln!("{ns}: profiling task failed: {e}"),
        }
    }
    let algorithm_mean = scheduler.algorithm_mean().await;
    drop(scheduler);
    let filter_after = extender.histograms().await?;
    let (filter, prioritize) = match mode {
        Mode::None => (None, None),
        Mode::Cache | Mode::Full => {
            let wire = if mode == Mode::Cache {
                "names"
            } else {
                "nodes"
            };
            (
                filter_after.latency("filter", wire, &filter_before),
                filter_after.latency("prioritize", wire, &filter_before),
            )
        }
    };
    Ok(Run {
        mode,
        pods: args.pods,
        start_to_last: last.duration_since(started),
        first_to_last: last.duration_since(first.unwrap_or(started)),
        algorithm_mean,
        filter,
        prioritize,
        load_after: loadavg(),
    })
}

/// Profiles one mode (see `--profile-seconds`); returns the files written, `out` + suffix.
async fn profile_mode(
    scheduler_base: String,
    extender_pid: Option<u32>,
    out: PathBuf,
    seconds: u64,
) -> Result<Vec<String>> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut files = Vec::new();
    let perf = match extender_pid {
        Some(pid) => {
            let path = PathBuf::from(format!("{}-extender.perf", out.display()));
            let child = tokio::process::Command::new("perf")
                .args(["record", "-g", "-F", "499", "-o"])
                .arg(&path)
                .args(["-p", &pid.to_string(), "--", "sleep", &seconds.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting perf record (apt-get install linux-perf)")?;
            Some((child, path))
        }
        None => None,
    };
    let url = format!("{scheduler_base}/debug/pprof/profile?seconds={seconds}");
    let profile = reqwest::get(&url)
        .await?
        .error_for_status()
        .with_context(|| format!("GET {url}"))?
        .bytes()
        .await?;
    let path = PathBuf::from(format!("{}-kube-scheduler.pprof", out.display()));
    std::fs::write(&path, &profile)?;
    files.push(path.display().to_string());
    if let Some((mut child, path)) = perf {
        let status = child.wait().await?;
        if !status.success() {
            bail!("perf record exited with {status}");
        }
        files.push(path.display().to_string());
    }
    Ok(files)
}

fn node_name(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// Deletes a mode's pods at once (no kubelet runs to finish a graceful delete) and waits
/// until they are gone, so the next mode starts with free GPUs and a quiet apiserver.
async fn delete_pods(client: &Client, ns: &str, n: usize) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    fan_out(n, |i| {
        let pods = pods.clone();
        async move {
            pods.delete(
                &format!("worker-{i:04}"),
                &DeleteParams::default().grace_period(0),
            )
            .await
            .with_context(|| format!("deleting {ns}/worker-{i:04}"))?;
            Ok(())
        }
    })
    .await?;
    until_none_left(
        Duration::from_secs(120),
        || async {
            Ok(pods
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len())
        },
        |left| format!("{ns}: {left} pods still present 120s after deletion"),
    )
    .await
}

/// The real `railguard-extender` binary in cluster mode.
struct Extender {
    child: Child,
    url: String,
    metrics_url: String,
    http: reqwest::Client,
}

impl Extender {
    async fn start(bin: &Path, cp: &ControlPlane) -> Result<Extender> {
        let log_path = cp.log_dir().join("railguard-extender.log");
        let log = std::fs::File::create(&log_path)?;
        let mut child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .arg("--listen")
            .arg(ANY_LOOPBACK_PORT)
            .arg("--metrics-listen")
            .arg(ANY_LOOPBACK_PORT)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let listen = Duration::from_secs(60);
        let addr = ports::logged_listen_addr(&mut child, &log_path, "--listen", listen).await?;
        let metrics =
            ports::logged_listen_addr(&mut child, &log_path, "--metrics-listen", listen).await?;
        let mut ext = Extender {
            child,
            url: format!("http://{addr}"),
            metrics_url: format!("http://{metrics}"),
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = ext.child.try_wait()? {
                bail!(
                    "railguard-extender exited ({status}); see {}",
                    log_path.display()
                );
            }
            let ready = ext
                .http
                .get(format!("{}/readyz", ext.metrics_url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(ext);
            }
            if Instant::now() > deadline {
                bail!(
                    "railguard-extender not ready after 60s; see {}",
                    log_path.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn histograms(&self) -> Result<Histograms> {
        let text = self
            .http
            .get(format!("{}/metrics", self.metrics_url))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(Histograms(text))
    }
}

impl Drop for Extender {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Prometheus text exposition, read for histogram series.
struct Histograms(String);

impl Histograms {
    /// Sum of the series `name` whose labels contain every `label="value"` in `matching`.
    fn value(&self, name: &str, matching: &[&str]) -> f64 {
        self.0
            .lines()
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
                (metric == name && matching.iter().all(|m| labels.contains(m)))
                    .then(|| value.parse::<f64>().ok())?
            })
            .sum()
    }

    /// Buckets `(le, cumulative count)` of a histogram series, ascending.
    fn buckets(&self, name: &str, matching: &[&str]) -> Vec<(f64, f64)> {
        let bucket = format!("{name}_bucket");
        let mut out: Vec<(f64, f64)> = self
            .0
            .lines()
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (metric, labels) = series.split_once('{')?;
                if metric != bucket || !matching.iter().all(|m| labels.contains(m)) {
                    return None;
                }
                let le = labels.split("le=\"").nth(1)?.split('"').next()?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, value.parse().ok()?))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }

    /// The extender's `verb` latency between `before` and `self` for wire mode `wire`.
    fn latency(&self, verb: &str, wire: &str, before: &Histograms) -> Option<Latency> {
        let name = format!("railguard_extender_{verb}_duration_seconds");
        let mode = format!("mode=\"{wire}\"");
        let m = [mode.as_str()];
        let count =
            self.value(&format!("{name}_count"), &m) - before.value(&format!("{name}_count"), &m);
        let sum = self.value(&format!("{name}_sum"), &m) - before.value(&format!("{name}_sum"), &m);
        if count < 1.0 {
            return None;
        }
        let prev = before.buckets(&name, &m);
        let target = 0.99 * count;
        let p99_le = self
            .buckets(&name, &m)
            .into_iter()
            .find(|(le, c)| {
                let was = prev.iter().find(|(l, _)| l == le).map_or(0.0, |(_, c)| *c);
                c - was >= target
            })
            .map(|(le, _)| le)?;
        Some(Latency {
            calls: count as u64,
            mean: Duration::from_secs_f64(sum / count),
            p99_le: Duration::try_from_secs_f64(p99_le).unwrap_or(Duration::MAX),
        })
    }
}

/// kube-scheduler 1.20 with its own config: client limiter out of the way, health and
/// metrics on free loopback ports (1.20 binds 0.0.0.0:10251 otherwise).
struct Scheduler {
    child: Child,
    log: PathBuf,
    metrics_url: String,
    /// Its healthz and metrics ports, reserved while it runs.
    _ports: Vec<ports::PortLease>,
}

impl Scheduler {
    async fn start(
        cp: &ControlPlane,
        bin: &Path,
        extender: &Extender,
        args: &Args,
        mode: Mode,
        tag: &str,
    ) -> Result<Scheduler> {
        let extenders = match mode {
            Mode::None => json!([]),
            Mode::Cache | Mode::Full => json!([{
                "urlPrefix": extender.url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 1,
                "enableHTTPS": false,
                "nodeCacheCapable": mode == Mode::Cache,
                "ignorable": false,
            }]),
        };
        let path = cp.log_dir().join(format!("scheduler-{tag}.yaml"));
        let log = cp.log_dir().join(format!("kube-scheduler-{tag}.log"));
        // Its two plain ports come on the command line: leased, and the start retried on new
        // ones if another process bound one first.
        for attempt in 1..=ports::PORT_ATTEMPTS {
            let leases = ports::lease_ports(2)?;
            let numbers: Vec<u16> = leases.iter().map(ports::PortLease::port).collect();
            let config = json!({
                "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {
                    "kubeconfig": cp.kubeconfig_path().display().to_string(),
                    "qps": args.scheduler_qps, "burst": args.scheduler_qps,
                },
                "leaderElection": {"leaderElect": false},
                "healthzBindAddress": format!("127.0.0.1:{}", numbers[0]),
                "metricsBindAddress": format!("127.0.0.1:{}", numbers[1]),
                "extenders": extenders,
            });
            std::fs::write(&path, serde_yaml_ng::to_string(&config)?)?;
            let file = std::fs::File::create(&log)?;
            let mut child = Command::new(bin)
                .arg(format!("--config={}", path.display()))
                .arg("--secure-port=0")
                .arg(format!("--v={}", args.scheduler_v))
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            match ports::wait_bound(&mut child, &numbers, &log, Duration::from_secs(120)).await? {
                ports::Bound::Listening => {
                    return Ok(Scheduler {
                        child,
                        log,
                        metrics_url: format!("http://127.0.0.1:{}/metrics", numbers[1]),
                        _ports: leases,
                    })
                }
                ports::Bound::PortInUse(line) => {
                    ports::log_port_retry("kube-scheduler", attempt, &numbers, &line)
                }
                ports::Bound::Exited(status) => {
                    bail!("kube-scheduler exited with {status}; see {}", log.display())
                }
            }
        }
        bail!(
            "kube-scheduler found its ports in use {} times; see {}",
            ports::PORT_ATTEMPTS,
            log.display()
        )
    }

    /// Mean scheduling-algorithm time (filter + score, extender calls included).
    async fn algorithm_mean(&self) -> Option<Duration> {
        let text = reqwest::get(&self.metrics_url)
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let h = Histograms(text);
        let name = "scheduler_scheduling_algorithm_duration_seconds";
        let count = h.value(&format!("{name}_count"), &[]);
        let sum = h.value(&format!("{name}_sum"), &[]);
        (count >= 1.0).then(|| Duration::from_secs_f64(sum / count))
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn latency_cell(l: Option<Latency>) -> String {
    match l {
        Some(l) => format!("{} / ≤{} ({} calls)", ms(l.mean), ms(l.p99_le), l.calls),
        None => "–".into(),
    }
}

fn print_report(args: &Args, runs: &[Run]) {
    let baseline: Vec<f64> = runs
        .iter()
        .filter(|r| r.mode == Mode::None)
        .map(Run::rate_first_to_last)
        .collect();
    let baseline =
        (!baseline.is_empty()).then(|| baseline.iter().sum::<f64>() / baseline.len() as f64);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "\nkube-scheduler 1.20, {} nodes × 8 GPUs, {} pods × 1 GPU per mode ({}); {} CPUs; {}",
        args.nodes,
        args.pods,
        if args.no_gang {
            "no job label"
        } else {
            "one job"
        },
        cpus,
        Timestamp::now().strftime("%Y-%m-%d %H:%M UTC")
    );
    println!();
    println!("| # | mode | pods | start→last bind | pods/s | first→last bind | pods/s | % of no-extender | scheduler algorithm mean | extender /filter mean / p99 | extender /prioritize mean / p99 | load after |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, r) in runs.iter().enumerate() {
        let pct = baseline.map_or("–".into(), |b| {
            format!("{:.0}%", 100.0 * r.rate_first_to_last() / b)
        });
        println!(
            "| {} | {} | {} | {:.2} s | {:.0} | {:.2} s | {:.0} | {} | {} | {} | {} | {} |",
            i + 1,
            r.mode.describe(),
            r.pods,
            r.start_to_last.as_secs_f64(),
            r.rate_start_to_last(),
            r.first_to_last.as_secs_f64(),
            r.rate_first_to_last(),
            pct,
            r.algorithm_mean.map_or("–".into(), ms),
            latency_cell(r.filter),
            latency_cell(r.prioritize),
            r.load_after,
        );
    }
    println!("\n% of no-extender: first→last rate over the mean first→last rate of the no-extender runs.");
}
