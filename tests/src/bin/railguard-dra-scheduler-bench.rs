//! kube-scheduler 1.37 throughput with railguard's DRA device taints against no railguard at
//! all, the scheduler_perf way: a real kube-apiserver and kube-scheduler 1.37, N nodes of 8
//! GPU+NIC pairs published as dranet and NVIDIA's GPU driver publish them
//! (`railguard_tests::dra`), certified for `h100-ndr`, a share of them with one failed rail.
//! Per mode M pending pods are created while no scheduler runs, each claiming R aligned rails
//! from the chart's ResourceClaimTemplate `railguard-<profile>-<R>-rails` (per pair a GPU and
//! a NIC on one `resource.kubernetes.io/pcieRoot`); once kube-controller-manager made every
//! claim, kube-scheduler starts and the bench times the bindings on a watch.
//!
//! Modes: `none` (no railguard: no rules, no controller), `taints` (the real fleet controller
//! running, having written its DeviceTaintRules for the failed rails before the scheduler
//! starts), `extender` (no DRA: pods ask for `nvidia.com/gpu` and the RDMA resource and the
//! real railguard-extender filters and scores, the pre-DRA path, for comparison).
//!
//! The rate is taken over the pods every mode can place: with one failed rail on a node, an
//! R = 8 claim cannot land there, so `--nodes` minus the tainted ones.
//!
//!     cargo build --release -p railguard-prober-cli -p railguard-extender-cli --bins
//!     cargo run --release -p railguard-tests --bin railguard-dra-scheduler-bench

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use futures::TryStreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::Client;
use railguard_api::certificate::GpuAffinity;
use railguard_api::dra as api_dra;
use railguard_api::{profiles_from_yaml, FabricProfile, PathType, RailFault, RailVerdict, Verdict};
use railguard_sim::certificates as synth;
use railguard_tests::bench::{fan_out, until_none_left};
use railguard_tests::daemon::{Daemon, ANY_LOOPBACK_PORT};
use railguard_tests::dra::{self, NodeLayout, RailPair};
use railguard_tests::{workspace_root, ApiServerOptions, ControlPlane, KubeVersion};
use serde_json::json;

const PROFILE: &str = "h100-ndr";
const RDMA: &str = "rdma/rdma_shared_device_a";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// DRA claims, no railguard at all.
    None,
    /// DRA claims, railguard's fleet controller and its DeviceTaintRules.
    Taints,
    /// No DRA: extended resources through railguard-extender (filter + prioritize).
    Extender,
}

impl Mode {
    fn tag(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Taints => "taints",
            Mode::Extender => "extender",
        }
    }
    fn describe(self) -> &'static str {
        match self {
            Mode::None => "DRA claims, no railguard",
            Mode::Taints => "DRA claims, railguard DeviceTaintRules (fleet controller running)",
            Mode::Extender => "no DRA, railguard-extender (nodeCacheCapable)",
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "railguard-dra-scheduler-bench",
    about = "kube-scheduler 1.37 throughput with railguard's DRA device taints"
)]
struct Args {
    #[arg(long, env = "RAILGUARD_BENCH_NODES", default_value_t = 1000)]
    nodes: usize,
    /// Pending pods per mode, each claiming --rails aligned rails.
    #[arg(long, env = "RAILGUARD_BENCH_PODS", default_value_t = 1000)]
    pods: usize,
    #[arg(long, env = "RAILGUARD_BENCH_RAILS", default_value_t = 8)]
    rails: u32,
    /// Percent of nodes with one failed rail.
    #[arg(long, env = "RAILGUARD_BENCH_TAINTED_PERCENT", default_value_t = 5)]
    tainted_percent: usize,
    #[arg(
        long,
        env = "RAILGUARD_BENCH_MODES",
        value_delimiter = ',',
        default_value = "none,taints,extender,none,taints"
    )]
    modes: Vec<Mode>,
    /// Give up on a mode when its placeable pods are not bound after this many seconds.
    #[arg(long, env = "RAILGUARD_BENCH_TIMEOUT_SECS", default_value_t = 900)]
    timeout_secs: u64,
    /// Directory holding railguard-prober and railguard-extender (default: next to this
    /// binary).
    #[arg(long, env = "RAILGUARD_BIN_DIR")]
    bin_dir: Option<PathBuf>,
}

struct Run {
    mode: Mode,
    placed: usize,
    /// Scheduler start to the last placeable binding.
    start_to_last: Duration,
    /// First to last placeable binding.
    first_to_last: Duration,
}

impl Run {
    fn rate(&self) -> f64 {
        self.placed as f64 / self.start_to_last.as_secs_f64().max(1e-9)
    }
    fn rate_first(&self) -> f64 {
        (self.placed.saturating_sub(1)) as f64 / self.first_to_last.as_secs_f64().max(1e-9)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if args.nodes == 0
        || args.pods == 0
        || args.modes.is_empty()
        || args.rails == 0
        || args.rails > 8
    {
        bail!("--nodes, --pods and --modes must be non-empty, --rails 1..=8");
    }
    let tainted = args.nodes * args.tainted_percent / 100;
    // An R-rail claim of 8 / R per node; a tainted node still takes those fitting its 7.
    let per_node = (8 / args.rails) as usize;
    let per_tainted = (7 / args.rails) as usize;
    let placeable = ((args.nodes - tainted) * per_node + tainted * per_tainted).min(args.pods);
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .context("this binary has no directory")?,
    };
    for b in ["railguard-prober", "railguard-extender"] {
        if !bin_dir.join(b).is_file() {
            bail!("{} is missing: cargo build --release -p railguard-prober-cli -p railguard-extender-cli --bins", bin_dir.join(b).display());
        }
    }

    let mut cp =
        ControlPlane::start_version(KubeVersion::V1_37, &ApiServerOptions::default()).await?;
    let logs = cp.log_dir().to_path_buf();
    eprintln!("control plane 1.37 up; logs in {}", logs.display());
    // The resourceclaim controller makes each pod's claim from its template and frees the
    // claims of deleted pods.
    cp.start_controller_manager().await?;
    cp.apply_fabricprofile_crd().await?;
    let client = cp.client();
    let profile = fixture_profile()?;
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    // The chart's DeviceClasses and claim templates (one namespace per mode), as the real
    // Helm renders them for 1.37.
    let namespaces: Vec<String> = (0..args.modes.len())
        .map(|i| format!("bench-{i}-{}", args.modes[i].tag()))
        .collect();
    let ns_refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let chart = dra::chart_objects(&dra::chart_values(&ns_refs, None))?;
    let form = chart
        .iter()
        .find(|o| {
            o["metadata"]["name"] == api_dra::claim_template_name(PROFILE, args.rails).as_str()
        })
        .map(|t| {
            t["spec"]["spec"]["devices"]["requests"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .unwrap_or(0);
    eprintln!("claim template: {form} requests");
    let template = api_dra::claim_template_name(PROFILE, args.rails);
    if !chart
        .iter()
        .any(|o| o["metadata"]["name"] == template.as_str())
    {
        bail!("the chart ships no ResourceClaimTemplate {template} (spec.dra.claimRails)");
    }
    for ns in &namespaces {
        cp.create_namespace(ns, &BTreeMap::new()).await?;
    }
    for obj in &chart {
        dra::apply(&client, obj).await?;
    }
    let t = Instant::now();
    create_nodes(&cp, &profile, args.nodes, tainted).await?;
    eprintln!(
        "{} nodes ({tainted} with one failed rail), {} ResourceSlices in {:.1}s",
        args.nodes,
        args.nodes * 2,
        t.elapsed().as_secs_f64()
    );
    let extender = spawn_extender(&bin_dir, &cp, &logs).await?;

    let mut runs = Vec::new();
    for (i, &mode) in args.modes.iter().enumerate() {
        let ns = format!("bench-{i}-{}", mode.tag());
        cp.check_alive()?;
        let controller = match mode {
            Mode::Taints => Some(start_controller(&bin_dir, &cp, &logs, &ns, tainted).await?),
            Mode::None | Mode::Extender => {
                delete_rules(&client).await?;
                None
            }
        };
        let run = measure(&mut cp, &args, mode, &ns, placeable, &extender.1).await?;
        eprintln!(
            "{ns}: {} pods, start→last {:.1} pods/s, first→last {:.1} pods/s",
            run.placed,
            run.rate(),
            run.rate_first()
        );
        runs.push(run);
        if let Some(mut c) = controller {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
        cleanup(&client, &ns).await?;
    }
    print_report(&args, tainted, placeable, &runs);
    Ok(())
}

fn fixture_profile() -> Result<FabricProfile> {
    let path = workspace_root().join("api/fixtures/profiles/dgx-h100-ndr.yaml");
    let text = std::fs::read_to_string(&path)?;
    let p = profiles_from_yaml(&text)?
        .into_iter()
        .next()
        .context("no profile in the fixture")?;
    if p.name() != PROFILE {
        bail!("the fixture profile is {}, not {PROFILE}", p.name());
    }
    Ok(p)
}

/// Every node has the same DGX H100-like layout: pair i is GPU i and the ConnectX-7 of the
/// profile's rail i, under their own root complex.
fn layout(node: &str, profile: &FabricProfile) -> NodeLayout {
    const ROOTS: [u8; 8] = [0x15, 0x37, 0x48, 0x59, 0x97, 0xa8, 0xb8, 0xc8];
    let pairs = ROOTS
        .iter()
        .zip(&profile.spec.rails)
        .enumerate()
        .map(|(i, (&r, rail))| {
            RailPair::new(
                &rail.id(),
                i as u32,
                &format!("0000:{:02x}:00.0", r + 3),
                &format!("0000:{:02x}:00.0", r + 2),
                &rail.hca,
                &format!("ibp{}s0", r + 2),
                &format!("pci0000:{r:02x}"),
                i64::from(i >= 4),
            )
        })
        .collect();
    NodeLayout::new(node, pairs)
}

async fn create_nodes(
    cp: &ControlPlane,
    profile: &FabricProfile,
    n: usize,
    tainted: usize,
) -> Result<()> {
    let issued = Timestamp::now()
        .checked_sub(SignedDuration::from_secs(3600))
        .context("clock")?;
    let client = cp.client();
    fan_out(n, |i| {
        let client = client.clone();
        async move {
            let name = format!("node-{i:04}");
            let lay = layout(&name, profile);
            let mut cert = synth::certificate(profile, Verdict::Certified, issued, 392.0, 380.0);
            cert.node = Some(name.clone());
            for (rail, pair) in cert.rails.iter_mut().zip(&lay.pairs) {
                rail.pci_address = Some(pair.nic.pci_address.clone());
            }
            cert.gpus = lay
                .pairs
                .iter()
                .enumerate()
                .map(|(g, p)| GpuAffinity {
                    gpu: g as u32,
                    pci_bus_id: Some(p.gpu.pci_bus_id.clone()),
                    preferred_hca: p.nic.rdma_device.clone().unwrap_or_default(),
                    port: Some(1),
                    path: PathType::Pix,
                    numa: None,
                })
                .collect();
            // Spread the failed nodes over the fleet; rail i % 8 is the one down.
            if tainted > 0 && i % (n / tainted).max(1) == 0 && i / (n / tainted).max(1) < tainted {
                let r = &mut cert.rails[i % 8];
                r.verdict = RailVerdict::Failed;
                r.faults = vec![RailFault::LinkDown];
                r.reasons = vec![format!("rail {}: port state DOWN, expected ACTIVE", r.id())];
                cert.verdict = Verdict::Degraded;
                cert.usable_rails = Some(7);
                cert.reasons = vec!["7 of 8 rails usable".into()];
            }
            cp.create_node(
                &name,
                &BTreeMap::from([(
                    "nvidia.com/gpu.product".to_string(),
                    "NVIDIA-H100-80GB-HBM3".to_string(),
                )]),
                &[("nvidia.com/gpu", "8"), (RDMA, "1000")],
            )
            .await?;
            cp.publish_certificate(&name, &cert).await?;
            dra::publish_slices(&client, &lay).await?;
            Ok(())
        }
    })
    .await
}

async fn spawn_extender(bin: &Path, cp: &ControlPlane, logs: &Path) -> Result<(Daemon, String)> {
    let mut d = Daemon::spawn(
        "railguard-extender",
        Command::new(bin.join("railguard-extender"))
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
            .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}")),
        logs,
    );
    let addr = d.listen_addr("--listen").await;
    let metrics = d.listen_addr("--metrics-listen").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reqwest::get(format!("http://{metrics}/readyz"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        if Instant::now() > deadline {
            bail!("railguard-extender not ready; see {}", d.log.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((d, format!("http://{addr}")))
}

async fn start_controller(
    bin: &Path,
    cp: &ControlPlane,
    logs: &Path,
    tag: &str,
    tainted: usize,
) -> Result<Daemon> {
    // Daemon names its log after a static name; one per mode run, for the bench's lifetime.
    let name: &'static str = Box::leak(format!("railguard-fleet-{tag}").into_boxed_str());
    let d = Daemon::spawn(
        name,
        Command::new(bin.join("railguard-prober"))
            .arg("fleet")
            .env("RAILGUARD_FLEET_WATCH", "true")
            // Opt-in (the chart's dra.deviceTaints): these runs are about the rules.
            .env("RAILGUARD_DRA_TAINTS", "true")
            .env("RAILGUARD_KUBECONFIG", cp.kubeconfig_path())
            .env("RAILGUARD_METRICS_LISTEN", ANY_LOOPBACK_PORT)
            .env("POD_NAMESPACE", "default")
            .env("POD_NAME", name)
            .env("RAILGUARD_LOG", "info"),
        logs,
    );
    let t = Instant::now();
    let api = dra::taint_rules(&cp.client());
    loop {
        let n = api
            .list_metadata(&ListParams::default().labels(&format!(
                "{}={}",
                api_dra::LABEL_MANAGED_BY,
                api_dra::MANAGED_BY
            )))
            .await?
            .items
            .len();
        if n == tainted {
            eprintln!(
                "fleet controller: {n} DeviceTaintRules written {:.1}s after start",
                t.elapsed().as_secs_f64()
            );
            return Ok(d);
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!(
                "{n} rules after 300 s, want {tainted}; see {}",
                d.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn delete_rules(client: &Client) -> Result<()> {
    dra::taint_rules(client)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!(
                "{}={}",
                api_dra::LABEL_MANAGED_BY,
                api_dra::MANAGED_BY
            )),
        )
        .await?;
    Ok(())
}

async fn create_pods(client: &Client, ns: &str, mode: Mode, args: &Args) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let template = api_dra::claim_template_name(PROFILE, args.rails);
    let profile = fixture_profile()?;
    let signature = profile.spec.signature();
    fan_out(args.pods, |i| {
        let pods = pods.clone();
        let template = template.clone();
        let signature = signature.clone();
        async move {
            let name = format!("worker-{i:04}");
            let pod = match mode {
                Mode::None | Mode::Taints => json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "resourceClaims": [{"name": "rails", "resourceClaimTemplateName": template}],
                        "containers": [{"name": "train", "image": "registry.invalid/trainer:1",
                            "resources": {"claims": [{"name": "rails"}]}}],
                    },
                }),
                Mode::Extender => json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "annotations": {
                        "railguard.io/profile": PROFILE,
                        "railguard.io/signature": signature,
                    }},
                    "spec": {"containers": [{"name": "train", "image": "registry.invalid/trainer:1",
                        "resources": {"limits": {"nvidia.com/gpu": args.rails.to_string(), RDMA: "1"}}}]},
                }),
            };
            pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
                .await
                .with_context(|| format!("creating {ns}/{name}"))?;
            Ok(())
        }
    })
    .await?;
    if mode == Mode::Extender {
        return Ok(());
    }
    // Every claim made before the scheduler starts: its speed is what is measured.
    let t = Instant::now();
    loop {
        let n = dra::claims(client, ns)
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        if n == args.pods {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("{ns}: {n} of {} claims made after 600 s", args.pods);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn measure(
    cp: &mut ControlPlane,
    args: &Args,
    mode: Mode,
    ns: &str,
    placeable: usize,
    extender_url: &str,
) -> Result<Run> {
    let client = cp.client();
    create_pods(&client, ns, mode, args).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut events = Box::pin(watcher(pods, watcher::Config::default()));
    loop {
        match events.try_next().await? {
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => bail!("pod watch ended"),
        }
    }
    let extenders = match mode {
        Mode::Extender => format!(
            "- urlPrefix: \"{extender_url}\"\n  filterVerb: filter\n  prioritizeVerb: prioritize\n  weight: 1\n  enableHTTPS: false\n  nodeCacheCapable: true\n  ignorable: false\n"
        ),
        Mode::None | Mode::Taints => "[]".to_string(),
    };
    cp.start_scheduler(&extenders).await?;
    let started = Instant::now();
    let mut bound: HashSet<String> = HashSet::new();
    let mut first = None;
    let mut last = started;
    let deadline = Duration::from_secs(args.timeout_secs);
    while bound.len() < placeable {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            cp.stop_scheduler();
            bail!(
                "{ns}: {} of {placeable} pods bound after {deadline:?}",
                bound.len()
            );
        }
        match tokio::time::timeout(left, events.try_next()).await {
            Ok(Ok(Some(watcher::Event::Apply(p) | watcher::Event::InitApply(p)))) => {
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
                    && bound.insert(p.metadata.name.clone().unwrap_or_default())
                {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = now;
                }
            }
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => bail!("pod watch ended"),
            Ok(Err(e)) => bail!("pod watch: {e}"),
            Err(_) => {}
        }
    }
    cp.stop_scheduler();
    Ok(Run {
        mode,
        placed: bound.len(),
        start_to_last: last - started,
        first_to_last: last - first.unwrap_or(started),
    })
}

async fn cleanup(client: &Client, ns: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    pods.delete_collection(&now, &ListParams::default()).await?;
    let claims = dra::claims(client, ns);
    until_none_left(
        Duration::from_secs(300),
        || async {
            let pods_left = pods
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            let claims_left = claims
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            Ok(pods_left + claims_left)
        },
        |left| format!("{ns}: {left} pods and claims left after 300 s"),
    )
    .await
}

fn print_report(args: &Args, tainted: usize, placeable: usize, runs: &[Run]) {
    println!(
        "\nkube-scheduler 1.37, {} nodes x 8 GPU+NIC pairs ({} ResourceSlices), {tainted} with one failed rail; {} pods per mode claiming {} aligned rails (the chart's template); rates over the {placeable} placeable pods\n",
        args.nodes,
        args.nodes * 2,
        args.pods,
        args.rails,
    );
    println!("| # | mode | placed | start→last | pods/s (start→last) | pods/s (first→last) |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (i, r) in runs.iter().enumerate() {
        println!(
            "| {} | {} | {} | {:.1} s | {:.1} | {:.1} |",
            i + 1,
            r.mode.describe(),
            r.placed,
            r.start_to_last.as_secs_f64(),
            r.rate(),
            r.rate_first()
        );
    }
    let mean = |m: Mode| {
        let v: Vec<f64> = runs.iter().filter(|r| r.mode == m).map(Run::rate).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    if let (Some(none), Some(taints)) = (mean(Mode::None), mean(Mode::Taints)) {
        println!(
            "\ntaints ÷ none (mean pods/s, start→last): {:.3}",
            taints / none
        );
    }
    if let (Some(none), Some(ext)) = (mean(Mode::None), mean(Mode::Extender)) {
        println!(
            "extender ÷ none (DRA, mean pods/s, start→last): {:.3}",
            ext / none
        );
    }
}
