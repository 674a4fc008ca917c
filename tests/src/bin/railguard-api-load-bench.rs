//! The API load that railguard's node daemons put on the real kube-apiserver, counted by the
//! apiserver itself (its audit log, one event per request), for one or more builds of the
//! prober side by side: each build runs `--nodes` real `railguard-prober daemon` processes
//! on simulated nodes with the shipped defaults (passive interval, poll, jitter) for
//! `--minutes`, under a token of its own, so every request is attributed to its build.
//!
//! Requests per second and Node writes per second are reported for the whole window and
//! for the steady state (after the first `--warmup-minutes`, when start-up certification is
//! over), per node and scaled to `--fleet` nodes. A daemon only talks about its own Node
//! (its Node, its pods, its Events, the profile's Leases), so its rate does not depend on how
//! many other nodes there are: the fleet figure is the per-node rate times the fleet size.
//! What it leaves out: the fan-out of each Node write to every Node watcher.
//!
//!     cargo build -p railguard-prober-cli -p railguard-sim -p railguard-tests --bins
//!     git worktree add /tmp/rg-before ae91fe6 && (cd /tmp/rg-before && cargo build -p railguard-prober-cli -p railguard-sim --bins)
//!     cargo run -p railguard-tests --bin railguard-api-load-bench -- \
//!         --build after=. --build before=/tmp/rg-before
//!
//! A build is `NAME=CHECKOUT`: its binaries in `CHECKOUT/target/debug`, its simulated models
//! and the DGX H100 profile from the same checkout, so an older build runs with its own files.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use jiff::Timestamp;
use railguard_tests::daemon::ANY_LOOPBACK_PORT;
use railguard_tests::{workspace_root, ApiServerOptions, ControlPlane};

#[derive(Debug, Parser)]
#[command(about = "API requests and Node writes of railguard's node daemons, per build")]
struct Args {
    /// A build to measure, `NAME=CHECKOUT` (repeatable); default: this checkout as `after`.
    #[arg(long = "build")]
    builds: Vec<String>,
    /// Simulated nodes (daemons) per build.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// Minutes the daemons run.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// Minutes at the start left out of the steady-state figures.
    #[arg(long, default_value_t = 2)]
    warmup_minutes: u64,
    /// Fleet size the per-node rates are scaled to.
    #[arg(long, default_value_t = 2000)]
    fleet: usize,
}

struct Build {
    name: String,
    checkout: PathBuf,
    token: String,
}

impl Build {
    fn parse(spec: &str, index: usize) -> Result<Build> {
        let (name, dir) = spec
            .split_once('=')
            .with_context(|| format!("--build {spec:?}: want NAME=CHECKOUT"))?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            bail!("--build {spec:?}: the name must be lowercase letters and digits");
        }
        let checkout = std::fs::canonicalize(dir).with_context(|| format!("--build {spec:?}"))?;
        let prober = checkout.join("target/debug/railguard-prober");
        if !prober.is_file() {
            bail!("--build {spec:?}: no {} (build it first)", prober.display());
        }
        Ok(Build {
            name: name.to_string(),
            checkout,
            token: format!("api-load-bench-{index}-{}", std::process::id()),
        })
    }

    fn user(&self) -> String {
        format!("bench-{}", self.name)
    }

    fn node(&self, i: usize) -> String {
        format!("{}-{i:03}", self.name)
    }
}

/// Every request once (the audit log has a line per stage), for the policy below.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

#[derive(Debug, serde::Deserialize)]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    user: AuditUser,
    #[serde(rename = "objectRef")]
    object_ref: Option<AuditObject>,
    #[serde(rename = "requestReceivedTimestamp")]
    received: Timestamp,
}

#[derive(Debug, serde::Deserialize)]
struct AuditUser {
    username: String,
}

#[derive(Debug, serde::Deserialize)]
struct AuditObject {
    resource: Option<String>,
    subresource: Option<String>,
}

/// One request as counted: who, what, when.
struct Request {
    user: String,
    verb: String,
    resource: String,
    received: Timestamp,
}

impl Request {
    fn is_node_write(&self) -> bool {
        (self.resource == "nodes" || self.resource.starts_with("nodes/"))
            && matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete")
    }
}

/// The audit log's requests, each once (by audit ID), whatever stages it was logged at.
fn read_audit_log(path: &Path) -> Result<Vec<Request>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: AuditEvent = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not an audit event", path.display(), n + 1))?;
        if !seen.insert(e.audit_id) {
            continue;
        }
        let resource = match &e.object_ref {
            Some(AuditObject {
                resource: Some(r),
                subresource: Some(s),
            }) => format!("{r}/{s}"),
            Some(AuditObject {
                resource: Some(r), ..
            }) => r.clone(),
            _ => "(non-resource)".to_string(),
        };
        out.push(Request {
            user: e.user.username,
            verb: e.verb,
            resource,
            received: e.received,
        });
    }
    Ok(out)
}

/// Requests and Node writes of one build within `[from, to)`.
#[derive(Default)]
struct Tally {
    requests: u64,
    node_writes: u64,
    by_kind: BTreeMap<String, u64>,
}

fn tally(requests: &[Request], user: &str, from: Timestamp, to: Timestamp) -> Tally {
    let mut t = Tally::default();
    for r in requests
        .iter()
        .filter(|r| r.user == user && r.received >= from && r.received < to)
    {
        t.requests += 1;
        if r.is_node_write() {
            t.node_writes += 1;
        }
        *t.by_kind
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
    }
    t
}

fn kubeconfig_with_token(admin: &Path, token: &str, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(admin)?;
    let mut replaced = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.trim_start().strip_prefix("token: ") {
            Some(_) => {
                replaced = true;
                format!("    token: {token}")
            }
            None => l.to_string(),
        })
        .collect();
    if !replaced {
        bail!("{}: no token line", admin.display());
    }
    std::fs::write(out, lines.join("\n") + "\n")?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let specs = if args.builds.is_empty() {
        vec![format!("after={}", workspace_root().display())]
    } else {
        args.builds.clone()
    };
    let builds: Vec<Build> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| Build::parse(s, i))
        .collect::<Result<_>>()?;
    if args.nodes == 0 || args.minutes <= args.warmup_minutes {
        bail!("--nodes must be positive and --minutes longer than --warmup-minutes");
    }

    let work = tempfile::Builder::new()
        .prefix("railguard-api-load-")
        .tempdir()?;
    let policy = work.path().join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY)?;
    let audit_log = work.path().join("audit.log");
    let opts = ApiServerOptions {
        extra_tokens: builds
            .iter()
            .map(|b| (b.token.clone(), b.user(), "system:masters".to_string()))
            .collect(),
        extra_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-format=json".to_string(),
            "--audit-log-mode=blocking".to_string(),
        ],
        ..Default::default()
    };
    let cp = ControlPlane::start_with_options(&opts).await?;
    let gpu_product = ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3");
    let labels: BTreeMap<String, String> =
        [(gpu_product.0.to_string(), gpu_product.1.to_string())].into();

    let mut daemons = Vec::new();
    for b in &builds {
        let kubeconfig = work.path().join(format!("kubeconfig-{}", b.name));
        kubeconfig_with_token(cp.kubeconfig_path(), &b.token, &kubeconfig)?;
        let dir = work.path().join(&b.name);
        std::fs::create_dir_all(dir.join("logs"))?;
        for i in 0..args.nodes {
            let node = b.node(i);
            cp.create_node(&node, &labels, &[("rdma/rdma_shared_device_a", "1k")])
                .await?;
            let log = std::fs::File::create(dir.join(format!("{node}.log")))?;
            let child =
                tokio::process::Command::new(b.checkout.join("target/debug/railguard-prober"))
                    .args(["daemon", "--node", &node, "--sim", "dgx-h100"])
                    .arg("--profile-file")
                    .arg(b.checkout.join("api/fixtures/profiles/dgx-h100-ndr.yaml"))
                    .arg("--models-dir")
                    .arg(b.checkout.join("prober/models"))
                    .arg("--sysfs-root")
                    .arg(dir.join(format!("sysfs-{node}")))
                    .arg("--log-dir")
                    .arg(dir.join("logs"))
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--metrics-listen", ANY_LOOPBACK_PORT])
                    .env("RAILGUARD_LOG", "info")
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .kill_on_drop(true)
                    .spawn()
                    .with_context(|| format!("starting the {} daemon for {node}", b.name))?;
            daemons.push((node, child));
        }
    }
    let started = Timestamp::now();
    eprintln!(
        "{} daemons ({} per build) running for {} min; load average {}",
        daemons.len(),
        args.nodes,
        args.minutes,
        loadavg()
    );
    let run = Duration::from_secs(args.minutes * 60);
    let mut waited = Duration::ZERO;
    while waited < run {
        let step = Duration::from_secs(30).min(run - waited);
        tokio::time::sleep(step).await;
        waited += step;
        for (node, child) in daemons.iter_mut() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the daemon of {node} exited early ({status}); logs in {}",
                    work.path().display()
                );
            }
        }
    }
    let ended = Timestamp::now();
    let load_after = loadavg();
    for (_, child) in daemons.iter_mut() {
        let _ = child.kill().await;
    }

    let requests = read_audit_log(&audit_log)?;
    let warm_end =
        started + jiff::SignedDuration::from_secs(i64::try_from(args.warmup_minutes * 60)?);
    let whole_s = ended.duration_since(started).as_secs_f64();
    let steady_s = ended.duration_since(warm_end).as_secs_f64();

    println!(
        "| build | window | requests/s per node | Node writes/s per node | requests/s at {} nodes | Node writes/s at {} nodes |",
        args.fleet, args.fleet
    );
    println!("|---|---|---|---|---|---|");
    let mut kinds: HashMap<String, Tally> = HashMap::new();
    for b in &builds {
        for (window, from, secs) in [("whole", started, whole_s), ("steady", warm_end, steady_s)] {
            let t = tally(&requests, &b.user(), from, ended);
            let rps = t.requests as f64 / secs / args.nodes as f64;
            let wps = t.node_writes as f64 / secs / args.nodes as f64;
            println!(
                "| {} | {window} ({:.0} s) | {rps:.4} | {wps:.4} | {:.1} | {:.1} |",
                b.name,
                secs,
                rps * args.fleet as f64,
                wps * args.fleet as f64,
            );
            if window == "steady" {
                kinds.insert(b.name.clone(), t);
            }
        }
    }
    println!();
    println!("Steady-state requests by kind, per node per minute:");
    println!();
    println!("| build | request | per node per minute |");
    println!("|---|---|---|");
    for b in &builds {
        if let Some(t) = kinds.get(&b.name) {
            for (kind, n) in &t.by_kind {
                println!(
                    "| {} | {kind} | {:.2} |",
                    b.name,
                    *n as f64 / args.nodes as f64 / (steady_s / 60.0)
                );
            }
        }
    }
    eprintln!("load average after: {load_after}");
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}
