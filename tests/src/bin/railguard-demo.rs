//! The railguard demo: a real kube-apiserver and kube-scheduler (with the railguard
//! extender), the railguard webhook, and simulated probers certifying a fleet of six
//! DGX-H100-like nodes; then a four-worker training job is admitted, mutated and placed.
//!
//! Run it through `./demo.sh` (which builds everything first). `--down` stops a demo left
//! running; Ctrl-C stops this one.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use railguard_api::{FabricProfile, FabricState, NodeFabric};
use railguard_tests::daemon::ANY_LOOPBACK_PORT;
use railguard_tests::{labels, workspace_root, ControlPlane, ServingCertificate};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(
    name = "railguard-demo",
    about = "railguard on a local control plane with simulated GPU nodes"
)]
struct Args {
    /// Stop a demo left running (its processes are listed in DIR/pids) and remove DIR.
    #[arg(long, env = "RAILGUARD_DEMO_DOWN")]
    down: bool,
    /// Working directory for the cluster's files, logs and kubeconfig.
    #[arg(long, env = "RAILGUARD_DEMO_DIR", default_value = ".demo")]
    dir: PathBuf,
    /// Exit after the story instead of keeping the cluster up until Ctrl-C.
    #[arg(long, env = "RAILGUARD_DEMO_NO_WAIT")]
    no_wait: bool,
}

/// The six demo nodes: name, node model, what the fleet has wrong there, leaf switch.
const FLEET: &[(&str, &str, &str, &str)] = &[
    ("dgx-a01", "dgx-h100.yaml", "healthy", "leaf-a"),
    ("dgx-a02", "dgx-h100.yaml", "healthy", "leaf-a"),
    (
        "dgx-a03",
        "h100-rate-downshift.yaml",
        "degraded rail (mlx5_4 trained at 200 Gb/s)",
        "leaf-a",
    ),
    (
        "dgx-b01",
        "demo-socket-fallback.yaml",
        "NCCL falls back to sockets",
        "leaf-b",
    ),
    (
        "dgx-b02",
        "dgx-h100.yaml",
        "certificate expired (prober stopped renewing)",
        "leaf-b",
    ),
    (
        "dgx-b03",
        "h100-pcie-x8.yaml",
        "PCIe x8 link on mlx5_3",
        "leaf-b",
    ),
];

const NAMESPACE: &str = "ml-team";
const JOB: &str = "llama-70b";

struct Style {
    color: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn step(&self, s: &str) {
        println!("\n{}", self.paint("1;36", &format!("==> {s}")));
    }
    fn good(&self, s: &str) -> String {
        self.paint("32", s)
    }
    fn bad(&self, s: &str) -> String {
        self.paint("31", s)
    }
    fn warn(&self, s: &str) -> String {
        self.paint("33", s)
    }
    fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
}

/// Child processes of the demo, stopped on drop (normal exit, error or Ctrl-C).
struct Children {
    procs: Vec<(String, Child)>,
}

impl Children {
    fn spawn(&mut self, name: &str, cmd: &mut Command, log_dir: &Path) -> Result<u32> {
        let child = railguard_tests::spawn_logging_to(cmd, &log_dir.join(format!("{name}.log")))
            .with_context(|| format!("starting {name}"))?;
        let pid = child.id();
        self.procs.push((name.to_string(), child));
        Ok(pid)
    }

    /// Where the last child spawned listens for `flag` (given port 0), from its log.
    async fn listen_addr(&mut self, log_dir: &Path, flag: &str) -> Result<std::net::SocketAddr> {
        let (name, child) = self.procs.last_mut().context("nothing was started")?;
        let log = log_dir.join(format!("{name}.log"));
        railguard_tests::ports::logged_listen_addr(child, &log, flag, Duration::from_secs(60)).await
    }

    fn check_alive(&mut self, log_dir: &Path) -> Result<()> {
        for (name, c) in &mut self.procs {
            if let Some(status) = c.try_wait()? {
                bail!(
                    "{name} exited with {status}; see {}/{name}.log",
                    log_dir.display()
                );
            }
        }
        Ok(())
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
        }
        for (_, c) in &mut self.procs {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .map(Path::to_path_buf)
        .context("the demo binary has no directory")
}

fn bin(name: &str) -> Result<PathBuf> {
    let p = bin_dir()?.join(name);
    if !p.is_file() {
        bail!(
            "{} is not built; run ./demo.sh (it builds the workspace first)",
            p.display()
        );
    }
    Ok(p)
}

/// Whether a process is alive (signal 0).
fn alive(pid: &str) -> bool {
    Command::new("kill")
        .args(["-0", pid])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn down(dir: &Path) -> Result<()> {
    // A running demo stops its own processes when asked (SIGTERM) and exits 0.
    if let Ok(pid) = std::fs::read_to_string(dir.join("demo.pid")) {
        let pid = pid.trim().to_string();
        // Only a demo: the pid may have been reused since.
        let is_demo = std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("railguard-demo"));
        if !pid.is_empty() && pid != std::process::id().to_string() && is_demo {
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while alive(&pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
            if !alive(&pid) {
                println!("railguard demo: stopped the demo (pid {pid})");
                if dir.exists() {
                    std::fs::remove_dir_all(dir)
                        .with_context(|| format!("removing {}", dir.display()))?;
                }
                return Ok(());
            }
        }
    }
    let pids = dir.join("pids");
    if let Ok(text) = std::fs::read_to_string(&pids) {
        let mut stopped = 0;
        for pid in text.lines().filter(|l| !l.trim().is_empty()) {
            if Command::new("kill")
                .arg("-TERM")
                .arg(pid.trim())
                .stderr(Stdio::null())
                .status()?
                .success()
            {
                stopped += 1;
            }
        }
        println!("railguard demo: stopped {stopped} process(es)");
        std::thread::sleep(Duration::from_millis(500));
    } else {
        println!("railguard demo: nothing running in {}", dir.display());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

fn record_pids(dir: &Path, pids: &[u32]) -> Result<()> {
    let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(dir.join("pids"), text)?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let dir = if args.dir.is_absolute() {
        args.dir.clone()
    } else {
        std::env::current_dir()?.join(&args.dir)
    };
    if args.down {
        return down(&dir);
    }
    if dir.join("pids").exists() {
        println!(
            "railguard demo: stopping the previous demo in {}",
            dir.display()
        );
        down(&dir)?;
    } else if dir.exists() {
        // A finished demo's cluster state and logs: every demo starts from an empty cluster.
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the previous demo's {}", dir.display()))?;
    }
    let style = Style {
        color: std::io::stdout().is_terminal(),
    };
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("demo.pid"), std::process::id().to_string())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch for SIGTERM")?;
    let outcome = tokio::select! {
        r = run(&args, &dir, &style) => r,
        _ = tokio::signal::ctrl_c() => {
            println!("\nrailguard demo: Ctrl-C, cleaning up");
            Ok(())
        }
        _ = term.recv() => {
            println!("railguard demo: stop requested (./demo.sh --down), cleaning up");
            Ok(())
        }
    };
    // Everything started is owned by `run`'s locals and stopped when they drop.
    let _ = std::fs::remove_file(dir.join("pids"));
    let _ = std::fs::remove_file(dir.join("demo.pid"));
    outcome
}

async fn run(args: &Args, dir: &Path, s: &Style) -> Result<()> {
    let log_dir = dir.join("logs");
    std::fs::create_dir_all(&log_dir)?;

    s.step("Starting etcd and kube-apiserver 1.20 (real, from Debian's source package)");
    let mut cp = ControlPlane::start_in(&dir.join("cluster")).await?;
    let client = cp.client();
    cp.apply_fabricprofile_crd().await?;
    let profile_path = workspace_root().join("api/fixtures/profiles/dgx-h100-ndr.yaml");
    let mut profile =
        railguard_api::profiles_from_yaml(&std::fs::read_to_string(&profile_path)?)?.remove(0);
    // The demo's nodes are simulated: their certificates say so, and count only here.
    profile.spec.certification.accept_simulated = true;
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    println!(
        "  API server {}  FabricProfile {} (signature {})",
        cp.server_url(),
        profile.name(),
        profile.spec.signature()
    );

    let mut children = Children { procs: Vec::new() };
    let mut pids = cp.pids();
    record_pids(dir, &pids)?;

    s.step("Starting railguard-extender and kube-scheduler with the extender (nodeCacheCapable)");
    pids.push(
        children.spawn(
            "railguard-extender",
            Command::new(bin("railguard-extender")?)
                .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
                .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}"))
                .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display())),
            &log_dir,
        )?,
    );
    record_pids(dir, &pids)?;
    let ext_port = children.listen_addr(&log_dir, "--listen").await?.port();
    let ext_metrics = children
        .listen_addr(&log_dir, "--metrics-listen")
        .await?
        .port();
    wait_http_ok(
        &format!("http://127.0.0.1:{ext_metrics}/readyz"),
        Duration::from_secs(30),
    )
    .await?;
    let extenders = format!(
        "- urlPrefix: http://127.0.0.1:{ext_port}\n  filterVerb: filter\n  prioritizeVerb: prioritize\n  weight: 5\n  nodeCacheCapable: true\n  ignorable: false\n  managedResources:\n  - name: nvidia.com/gpu\n    ignoredByScheduler: false\n"
    );
    cp.start_scheduler(&extenders).await?;
    pids = cp
        .pids()
        .into_iter()
        .chain(children.procs.iter().map(|(_, c)| c.id()))
        .collect();
    record_pids(dir, &pids)?;

    s.step("Starting railguard-webhook (TLS, generated CA) and registering it");
    let tls = ServingCertificate::loopback("railguard-demo-ca")?;
    std::fs::write(dir.join("webhook.crt"), &tls.cert_pem)?;
    std::fs::write(dir.join("webhook.key"), &tls.key_pem)?;
    pids.push(
        children.spawn(
            "railguard-webhook",
            Command::new(bin("railguard-webhook")?)
                .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
                .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}"))
                .arg(format!("--tls-cert={}", dir.join("webhook.crt").display()))
                .arg(format!("--tls-key={}", dir.join("webhook.key").display()))
                .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display())),
            &log_dir,
        )?,
    );
    record_pids(dir, &pids)?;
    let wh_port = children.listen_addr(&log_dir, "--listen").await?.port();
    let wh_metrics = children
        .listen_addr(&log_dir, "--metrics-listen")
        .await?
        .port();
    wait_http_ok(
        &format!("http://127.0.0.1:{wh_metrics}/readyz"),
        Duration::from_secs(30),
    )
    .await?;
    register_webhook(&client, wh_port, &tls.ca_pem).await?;
    println!("  webhook https://127.0.0.1:{wh_port}/mutate, extender http://127.0.0.1:{ext_port}");

    s.step("Creating six DGX-H100-like nodes and running a simulated prober on each");
    cp.create_namespace(NAMESPACE, &labels(&[("team", "llm")]))
        .await?;
    let models = write_demo_models(dir)?;
    let expired_profile = dir.join("profile-short-ttl.yaml");
    write_short_ttl_profile(&profile_path, &expired_profile)?;
    for (name, _, _, leaf) in FLEET {
        cp.create_node(
            name,
            &labels(&[
                ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                ("network.topology.nvidia.com/leaf", leaf),
                ("network.topology.nvidia.com/spine", "spine-1"),
            ]),
            &[("nvidia.com/gpu", "8"), ("rdma/rdma_shared_device_a", "1k")],
        )
        .await?;
    }
    // One after the other keeps the two cores for the real processes; each run takes ~1 s.
    for (name, model, _, _) in FLEET {
        let profile_file = if *name == "dgx-b02" {
            &expired_profile
        } else {
            &profile_path
        };
        certify(
            name,
            &models.join(model),
            profile_file,
            cp.kubeconfig_path(),
            &log_dir,
        )
        .await?;
    }
    // dgx-b02's certificate had a 2-second lifetime: let it lapse.
    tokio::time::sleep(Duration::from_secs(3)).await;
    print_fleet(&client, s).await?;

    s.step(&format!(
        "Submitting a four-worker training job ({JOB}) in namespace {NAMESPACE}"
    ));
    let mut warnings = Vec::new();
    let original = defaulted_without_railguard(&client, &worker_pod(0)).await?;
    for i in 0..4 {
        warnings.extend(create_pod(&client, &worker_pod(i)).await?);
    }
    warnings.sort();
    warnings.dedup();
    let stored: Pod = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{JOB}-worker-0"))
        .await?;
    println!("  What the webhook injected into {JOB}-worker-0 (- submitted, + stored):");
    print_diff(&original, &serde_json::to_value(&stored)?, s);
    if warnings.is_empty() {
        println!("  admission warnings: none");
    } else {
        println!("  admission warnings returned to the client:");
        for w in &warnings {
            println!("    {}", s.warn(w));
        }
    }

    s.step("Placement by kube-scheduler with the railguard extender");
    wait_placement(&client, 2, Duration::from_secs(60)).await?;
    print_placement(&client, s).await?;
    print_extender_reasons(ext_port, &client, s).await?;

    s.step("Repairing dgx-a03 (the degraded rail retrained at 400 Gb/s) and recertifying it");
    certify(
        "dgx-a03",
        &models.join("dgx-h100.yaml"),
        &profile_path,
        cp.kubeconfig_path(),
        &log_dir,
    )
    .await?;
    print_fleet(&client, s).await?;
    wait_placement(&client, 3, Duration::from_secs(60)).await?;
    print_placement(&client, s).await?;
    cp.check_alive()?;
    children.check_alive(&log_dir)?;

    s.step("The cluster is yours");
    println!("  export KUBECONFIG={}", cp.kubeconfig_path().display());
    println!("  kubectl get nodes -L railguard.io/fabric,railguard.io/profile");
    println!("  kubectl get pods -n {NAMESPACE} -o wide");
    println!(
        "  kubectl get node dgx-a01 -o jsonpath='{{.metadata.annotations.railguard\\.io/certificate}}'"
    );
    println!(
        "  logs: {}  and {}",
        log_dir.display(),
        cp.log_dir().display()
    );
    if args.no_wait {
        println!("  (--no-wait: stopping now)");
        return Ok(());
    }
    println!("  Ctrl-C here (or ./demo.sh --down from another terminal) stops everything.");
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Err(e) = cp
            .check_alive()
            .and_then(|_| children.check_alive(&log_dir))
        {
            bail!("a demo process stopped: {e}");
        }
    }
}

async fn wait_http_ok(url: &str, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let addr = url.trim_start_matches("http://");
    let (hostport, path) = addr
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((addr, "/".into()));
    loop {
        if let Ok(text) = http_get(hostport, &path).await {
            if text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200") {
                return Ok(());
            }
        }
        if start.elapsed() > timeout {
            bail!("{url} did not answer 200 within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn http_get(hostport: &str, path: &str) -> Result<String> {
    http_request(hostport, "GET", path, None).await
}

/// A minimal HTTP/1.1 client for the demo's loopback calls (readiness and one /filter).
async fn http_request(
    hostport: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(hostport).await?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await??;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

async fn register_webhook(client: &Client, port: u16, ca_pem: &str) -> Result<()> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::ByteString;
    let mut cfg: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": { "name": "railguard" },
        "webhooks": [{
            "name": "pods.railguard.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "reinvocationPolicy": "IfNeeded",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": { "url": format!("https://127.0.0.1:{port}/mutate") },
            "rules": [{ "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                        "resources": ["pods"], "scope": "Namespaced" }],
            "namespaceSelector": { "matchExpressions": [{ "key": "kubernetes.io/metadata.name",
                                   "operator": "NotIn", "values": ["kube-system"] }] },
        }]
    }))?;
    cfg.webhooks
        .as_mut()
        .and_then(|w| w.first_mut())
        .context("webhook entry")?
        .client_config
        .ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &cfg)
        .await?;
    // The API server picks up new webhook configurations asynchronously.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

fn write_demo_models(dir: &Path) -> Result<PathBuf> {
    let src = workspace_root().join("prober/models");
    let out = dir.join("models");
    std::fs::create_dir_all(&out)?;
    for entry in std::fs::read_dir(&src)? {
        let entry = entry?;
        std::fs::copy(entry.path(), out.join(entry.file_name()))?;
    }
    // A node whose NCCL cannot use IB (for example the RDMA device is not exposed to the
    // container): NCCL falls back to NET/Socket and the bus bandwidth collapses.
    std::fs::write(
        out.join("demo-socket-fallback.yaml"),
        "base: dgx-h100.yaml\nname: demo-socket-fallback\ndescription: DGX H100 whose NCCL falls back to sockets\nnccl:\n  busbw_gbps: 11.2\n  transport: Socket\n  gdr: false\n  wrong: 0\n  nccl_version: \"2.21.5\"\n",
    )?;
    Ok(out)
}

fn write_short_ttl_profile(src: &Path, dst: &Path) -> Result<()> {
    let mut p = railguard_api::profiles_from_yaml(&std::fs::read_to_string(src)?)?.remove(0);
    p.spec.certification.ttl_seconds = 2;
    p.spec.certification.interval_seconds = 1;
    std::fs::write(dst, serde_yaml_ng::to_string(&p)?)?;
    Ok(())
}

async fn certify(
    node: &str,
    model: &Path,
    profile: &Path,
    kubeconfig: &Path,
    log_dir: &Path,
) -> Result<()> {
    let out = tokio::process::Command::new(bin("railguard-prober")?)
        .arg("certify")
        .arg(format!("--node={node}"))
        .arg(format!("--sim={}", model.display()))
        .arg(format!("--profile-file={}", profile.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--log-dir={}",
            log_dir.join(format!("nccl-{node}")).display()
        ))
        .arg("--publish")
        .output()
        .await?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    std::fs::write(log_dir.join(format!("prober-{node}.log")), &text)?;
    // Exit 1 means "certified: no" — a verdict, not an error.
    match out.status.code() {
        Some(0) | Some(1) => Ok(()),
        _ => bail!(
            "railguard-prober certify for {node} failed ({}): {}",
            out.status,
            text.trim()
        ),
    }
}

async fn print_fleet(client: &Client, s: &Style) -> Result<()> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let now = Timestamp::now();
    println!(
        "  {:<9} {:<11} {:>8} {:>7}  REASON",
        "NODE", "VERDICT", "BUSBW", "RAILS"
    );
    let mut rows: Vec<NodeFabric> = nodes
        .items
        .iter()
        .map(|n| NodeFabric::from_node(n, now))
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    for nf in rows {
        let cert = nf.state.certificate();
        let busbw = cert
            .and_then(|c| c.nccl.as_ref())
            .and_then(|n| n.busbw_plateau_gbps)
            .map(|b| format!("{b:.1}"))
            .unwrap_or_else(|| "-".into());
        let rails = cert
            .map(|c| {
                let ok = c
                    .rails
                    .iter()
                    .filter(|r| r.verdict == railguard_api::RailVerdict::Healthy)
                    .count();
                format!("{ok}/{}", c.rails.len())
            })
            .unwrap_or_else(|| "-".into());
        let verdict = match &nf.state {
            FabricState::Certified(_) => s.good(&format!("{:<11}", "certified")),
            FabricState::Expired { .. } | FabricState::Pending { .. } => {
                s.warn(&format!("{:<11}", nf.state.kind()))
            }
            _ => s.bad(&format!("{:<11}", nf.state.kind())),
        };
        let reason = match &nf.state {
            FabricState::Certified(_) => String::new(),
            // The most specific reason first: one that names a rail beats a summary.
            FabricState::Failed(c) | FabricState::Degraded(c) => c
                .reasons
                .iter()
                .find(|r| r.starts_with("rail "))
                .or(c.reasons.first())
                .cloned()
                .unwrap_or_default(),
            other => other.to_string(),
        };
        println!(
            "  {:<9} {} {:>8} {:>7}  {}",
            nf.name,
            verdict,
            busbw,
            rails,
            truncate(&reason, 90)
        );
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

fn worker_pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{JOB}-worker-{i}"),
            "labels": {
                "training.kubeflow.org/job-name": JOB,
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": i.to_string(),
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "pytorch",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["torchrun", "--nnodes=4", "--nproc-per-node=8", "train.py"],
                    "env": [{ "name": "NCCL_DEBUG", "value": "INFO" }],
                    "resources": { "limits": { "nvidia.com/gpu": "8" } },
                },
                {
                    "name": "log-shipper",
                    "image": "fluent/fluent-bit:3.0",
                    "resources": { "limits": { "cpu": "100m", "memory": "128Mi" } },
                }
            ],
        }
    })
}

/// The pod as the API server would store it without railguard: a server-side dry run in
/// kube-system, which the webhook registration excludes. Diffing against it leaves only
/// railguard's changes, not the API server's defaults.
async fn defaulted_without_railguard(client: &Client, pod: &Value) -> Result<Value> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
    if sas.get_opt("default").await?.is_none() {
        let sa: ServiceAccount = serde_json::from_value(json!({
            "metadata": { "name": "default" }, "automountServiceAccountToken": false
        }))?;
        sas.create(&PostParams::default(), &sa).await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let stored = pods
        .create(&dry, &serde_json::from_value(pod.clone())?)
        .await?;
    Ok(serde_json::to_value(stored)?)
}

/// Creates a pod with a raw request so the API server's `Warning` headers can be shown.
async fn create_pod(client: &Client, pod: &Value) -> Result<Vec<String>> {
    let body = serde_json::to_vec(pod)?;
    let req = http::Request::post(format!("/api/v1/namespaces/{NAMESPACE}/pods"))
        .header("content-type", "application/json")
        .body(body)?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    let status = resp.status();
    let warnings: Vec<String> = resp
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|w| w.trim_start_matches("299 - ").trim_matches('"').to_string())
        .collect();
    if !status.is_success() {
        bail!("creating pod: HTTP {status}");
    }
    Ok(warnings)
}

/// Prints the lines of the stored pod's YAML that differ from what was submitted.
fn print_diff(before: &Value, after: &Value, s: &Style) {
    let clean = |v: &Value| -> String {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "managedFields",
                "namespace",
                "selfLink",
            ] {
                m.remove(k);
            }
        }
        if let Some(o) = v.as_object_mut() {
            o.remove("status");
        }
        serde_yaml_ng::to_string(&v).unwrap_or_default()
    };
    let a = clean(before);
    let b = clean(after);
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    let diff = line_diff(&a, &b);
    // Show each change with the nearest enclosing key lines above it, so a reader knows
    // where `+ rdma/...: '1'` sits (under which container's `limits`).
    let mut last_printed: Option<usize> = None;
    for (idx, line) in diff.iter().enumerate() {
        let text = match line {
            DiffLine::Same(_) => continue,
            DiffLine::Removed(l) => s.bad(&format!("- {l}")),
            DiffLine::Added(l) => s.good(&format!("+ {l}")),
        };
        let first = match line {
            DiffLine::Removed(l) | DiffLine::Added(l) | DiffLine::Same(l) => *l,
        };
        let mut want_indent = indent_of(first);
        let mut context = Vec::new();
        for j in (0..idx).rev() {
            if want_indent == 0 || last_printed.is_some_and(|p| j <= p) {
                break;
            }
            if let DiffLine::Same(l) = diff[j] {
                let ind = indent_of(l);
                if ind < want_indent && !l.trim_start().starts_with("- ")
                    || ind < want_indent.saturating_sub(2)
                {
                    context.push((j, l));
                    want_indent = ind;
                }
            }
        }
        for (_, l) in context.into_iter().rev() {
            println!("    {}", s.dim(&format!("  {l}")));
        }
        println!("    {text}");
        last_printed = Some(idx);
    }
}

fn indent_of(l: &str) -> usize {
    l.len() - l.trim_start_matches([' ', '-']).len()
}

enum DiffLine<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// Longest-common-subsequence line diff (pods are a few hundred lines at most).
fn line_diff<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<DiffLine<'a>> {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n && j < m {
        if a[i] == b[j] {
            out.push(DiffLine::Same(a[i]));
            i += 1;
            j += 1;
        } else if lcs[i + 1][j] >= lcs[i][j + 1] {
            out.push(DiffLine::Removed(a[i]));
            i += 1;
        } else {
            out.push(DiffLine::Added(b[j]));
            j += 1;
        }
    }
    out.extend(a[i..].iter().map(|l| DiffLine::Removed(l)));
    out.extend(b[j..].iter().map(|l| DiffLine::Added(l)));
    out
}

async fn wait_placement(client: &Client, bound: usize, timeout: Duration) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let start = Instant::now();
    loop {
        let list = pods
            .list(&ListParams::default().labels(&format!("training.kubeflow.org/job-name={JOB}")))
            .await?;
        let n = list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count();
        if n >= bound {
            // Give the scheduler a moment to record FailedScheduling for the rest.
            tokio::time::sleep(Duration::from_secs(2)).await;
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("only {n} of the expected {bound} pods were placed within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn print_placement(client: &Client, s: &Style) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(&format!("training.kubeflow.org/job-name={JOB}")))
        .await?;
    let evs = events.list(&ListParams::default()).await?;
    let mut items = list.items;
    items.sort_by_key(|p| p.metadata.name.clone());
    for p in items {
        let name = p.metadata.name.clone().unwrap_or_default();
        match p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            Some(node) => println!("  {:<22} -> {}", name, s.good(&node)),
            None => {
                let reason = evs
                    .items
                    .iter()
                    .filter(|e| {
                        e.involved_object.name.as_deref() == Some(&name)
                            && e.reason.as_deref() == Some("FailedScheduling")
                    })
                    .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0))
                    .and_then(|e| e.message.clone())
                    .unwrap_or_else(|| "waiting for the scheduler".into());
                println!(
                    "  {:<22} -> {} {}",
                    name,
                    s.warn("Pending"),
                    s.dim(&truncate(&reason, 200))
                );
            }
        }
    }
    Ok(())
}

/// Asks the extender directly why it rejects each node for a pending worker.
async fn print_extender_reasons(port: u16, client: &Client, s: &Style) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(&format!("training.kubeflow.org/job-name={JOB}")))
        .await?;
    let Some(pending) = list
        .items
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
    else {
        return Ok(());
    };
    let names: Vec<&str> = FLEET.iter().map(|f| f.0).collect();
    let args = json!({ "Pod": pending, "NodeNames": names });
    let resp = http_request(
        &format!("127.0.0.1:{port}"),
        "POST",
        "/filter",
        Some(&args.to_string()),
    )
    .await?;
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let body = decode_chunked(body);
    let result: Value =
        serde_json::from_str(&body).with_context(|| format!("extender answer: {body}"))?;
    println!(
        "  The extender's reasons for {}:",
        pending.metadata.name.unwrap_or_default()
    );
    let mut reasons: BTreeMap<String, (String, &str)> = BTreeMap::new();
    for (key, kind) in [
        ("FailedNodes", "may recover"),
        ("FailedAndUnresolvableNodes", "unresolvable"),
    ] {
        if let Some(m) = result.get(key).and_then(Value::as_object) {
            for (node, msg) in m {
                reasons.insert(
                    node.clone(),
                    (msg.as_str().unwrap_or_default().to_string(), kind),
                );
            }
        }
    }
    for (node, (msg, kind)) in reasons {
        println!(
            "    {:<9} {} {}",
            node,
            s.bad(&truncate(&msg, 100)),
            s.dim(&format!("({kind})"))
        );
    }
    Ok(())
}

/// Undoes HTTP/1.1 chunked transfer encoding when present.
fn decode_chunked(body: &str) -> String {
    let trimmed = body.trim_start();
    if trimmed.starts_with('{') {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
