//! A real local Kubernetes control plane for railguard's end-to-end tests.
//!
//! [`ControlPlane::start`] runs etcd and kube-apiserver on free loopback ports in a temp dir:
//! token auth, RBAC, secure port only, generated certificates. It hands out a `kube::Client`
//! and a kubeconfig, can start kube-scheduler with an extenders stanza (and, on 1.37,
//! kube-controller-manager with the DRA controllers), creates fake Nodes and test
//! namespaces, and stops everything it started on drop — also when a test panics, in which
//! case the logs are kept and their path printed. [`dra`] publishes DRA ResourceSlices as
//! the dranet and NVIDIA GPU drivers do.
//!
//! Two Kubernetes versions ([`KubeVersion`], chosen by `RAILGUARD_KUBE_VERSION`): the 1.20
//! floor (the default; built from Debian's source package by `tests/scripts/control-plane.sh`,
//! with Debian's etcd 3.4) and a modern release, 1.37 (built from the Go module proxy by
//! `tests/scripts/control-plane-modern.sh` with the etcd it supports). Both are cached
//! outside the repo. `docs/kubernetes-versions.md` lists what differs between them.

pub mod answer;
pub mod bench;
pub mod chart_values;
pub mod chromium;
pub mod daemon;
pub mod dra;
pub mod helm;
pub mod install;
pub mod kueue;
pub mod node;
pub mod ports;
pub mod sim_prober;

pub use node::RealNode;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use serde_json::json;

/// `data` in standard base64 with padding (kubeconfig `*-data` fields, Secret data).
pub fn b64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Field manager the harness uses for its own writes.
pub const HARNESS_FIELD_MANAGER: &str = "railguard-tests";

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// The minor of the modern Kubernetes release (`tests/k8s-modern/go.mod` pins its patch).
pub const MODERN_KUBE_MINOR: &str = "1.37";

/// The Kubernetes version a [`ControlPlane`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KubeVersion {
    /// 1.20, the floor: kube-apiserver, kube-scheduler and the real node's binaries from
    /// Debian's source package, Debian's etcd 3.4.
    V1_20,
    /// 1.37 ([`MODERN_KUBE_MINOR`]): kube-apiserver, kube-scheduler,
    /// kube-controller-manager and etcd 3.7 from the Go module proxy.
    V1_37,
}

impl KubeVersion {
    /// The modern release.
    pub const MODERN: KubeVersion = KubeVersion::V1_37;

    /// From `RAILGUARD_KUBE_VERSION`: unset, empty, `1.20` or `floor` is 1.20; `1.37` or
    /// `modern` is 1.37; anything else is an error (a typo must not silently test 1.20).
    pub fn from_env() -> Result<KubeVersion> {
        match std::env::var("RAILGUARD_KUBE_VERSION") {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(KubeVersion::V1_20),
            Err(e) => bail!("RAILGUARD_KUBE_VERSION: {e}"),
        }
    }

    /// `1.20`/`floor` (or empty) or `1.37`/`modern`; a leading `v` and a patch (`v1.37.2`)
    /// are accepted.
    pub fn parse(s: &str) -> Result<KubeVersion> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let minor = match s.match_indices('.').nth(1) {
            Some((i, _)) => &s[..i],
            None => s,
        };
        match minor {
            "" | "1.20" | "floor" => Ok(KubeVersion::V1_20),
            "1.37" | "modern" => Ok(KubeVersion::V1_37),
            _ => bail!(
                "RAILGUARD_KUBE_VERSION={s:?}: expected 1.20 (or floor) or {MODERN_KUBE_MINOR} (or modern)"
            ),
        }
    }

    /// `"1.20"` or `"1.37"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeVersion::V1_20 => "1.20",
            KubeVersion::V1_37 => MODERN_KUBE_MINOR,
        }
    }

    /// The minor number: 20 or 37.
    pub fn minor(self) -> u32 {
        match self {
            KubeVersion::V1_20 => 20,
            KubeVersion::V1_37 => 37,
        }
    }

    /// Directory holding this version's control plane binaries (built on first use).
    pub fn binaries(self) -> Result<PathBuf> {
        match self {
            KubeVersion::V1_20 => control_plane_binaries(),
            KubeVersion::V1_37 => modern_control_plane_binaries(),
        }
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Directory holding the 1.20 `kube-apiserver` and `kube-scheduler` (and the real node's
/// kubelet, kube-proxy, kube-controller-manager), building them on first use.
/// `RAILGUARD_KUBE_BIN_DIR` overrides the location. Always 1.20, whatever
/// `RAILGUARD_KUBE_VERSION` says: see [`KubeVersion::binaries`].
pub fn control_plane_binaries() -> Result<PathBuf> {
    binaries_from(
        "RAILGUARD_KUBE_BIN_DIR",
        "tests/scripts/control-plane.sh",
        &["kube-apiserver", "kube-scheduler"],
    )
}

/// Directory holding the modern (1.37) `kube-apiserver`, `kube-scheduler`,
/// `kube-controller-manager` and `etcd`, building them on first use (about half an hour on
/// 2 cores; then cached). `RAILGUARD_KUBE_MODERN_BIN_DIR` overrides the location.
pub fn modern_control_plane_binaries() -> Result<PathBuf> {
    binaries_from(
        "RAILGUARD_KUBE_MODERN_BIN_DIR",
        "tests/scripts/control-plane-modern.sh",
        &["kube-apiserver", "kube-scheduler", "etcd"],
    )
}

/// Directory holding the real `helm` (v4) and `kubectl` (1.37) the chart tests run, building
/// them on first use (`tests/scripts/helm.sh`). `RAILGUARD_HELM_BIN_DIR` overrides the location.
pub fn helm_binaries() -> Result<PathBuf> {
    binaries_from(
        "RAILGUARD_HELM_BIN_DIR",
        "tests/scripts/helm.sh",
        &["helm", "kubectl"],
    )
}

fn binaries_from(env: &str, script: &str, needed: &[&str]) -> Result<PathBuf> {
    if let Ok(dir) = std::env::var(env) {
        let dir = PathBuf::from(dir);
        match needed.iter().find(|b| !dir.join(b).is_file()) {
            None => return Ok(dir),
            Some(b) => bail!(
                "{env}={} holds no {b} (`bash {script}` builds it and prints the directory)",
                dir.display()
            ),
        }
    }
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let script = workspace_root().join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}); see its output above",
            script.display(),
            out.status
        );
    }
    let dir = String::from_utf8(out.stdout)?
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let dir = PathBuf::from(dir);
    if needed.iter().any(|b| !dir.join(b).is_file()) {
        bail!(
            "{} printed {} but the binaries are not there",
            script.display(),
            dir.display()
        );
    }
    Ok(dir)
}

/// The repository root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// One MutatingWebhookConfiguration entry calling a webhook on loopback `port` for Pod
/// CREATE, as the chart registers it (fail closed, reinvoked, 10 s); the caller adds the CA.
pub fn pod_webhook_entry(name: &str, port: u16) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate")},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["pods"], "scope": "Namespaced"}],
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "reinvocationPolicy": "IfNeeded",
        "timeoutSeconds": 10,
    })
}

/// The Prometheus exposition a railguard metrics listener serves at `{base}/metrics`.
pub async fn scrape_metrics(base: &str) -> Result<String> {
    let response = reqwest::get(format!("{base}/metrics"))
        .await
        .with_context(|| format!("GET {base}/metrics"))?;
    let status = response.status();
    let text = response.text().await?;
    anyhow::ensure!(status.is_success(), "GET {base}/metrics: {status}: {text}");
    Ok(text)
}

/// The Rust sources below `dir`, recursively (build output directories skipped).
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "target") {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}

/// Where a control plane keeps its files: a temp dir for tests, a fixed dir for the demo.
enum Workdir {
    Temp(tempfile::TempDir),
    Fixed(PathBuf),
}

impl Workdir {
    fn path(&self) -> &Path {
        match self {
            Workdir::Temp(t) => t.path(),
            Workdir::Fixed(p) => p,
        }
    }
}

struct Proc {
    name: &'static str,
    child: Child,
}

/// How the API server is reached and who may call it, beyond the loopback defaults.
#[derive(Clone, Debug, Default)]
pub struct ApiServerOptions {
    /// Address the secure port binds and advertises (the Service `kubernetes` endpoint);
    /// a real node needs a non-loopback one. Default: 127.0.0.1.
    pub address: Option<std::net::IpAddr>,
    /// Extra IP SANs of the serving certificate (e.g. the `kubernetes` Service's ClusterIP).
    pub extra_ip_sans: Vec<std::net::IpAddr>,
    /// Extra static token users: (token, user name, group).
    pub extra_tokens: Vec<(String, String, String)>,
    /// Extra kube-apiserver flags.
    pub extra_args: Vec<String>,
}

/// Seconds a start-up step may take: generous, since a loaded 2-core machine is slow.
const ETCD_START_TIMEOUT: Duration = Duration::from_secs(120);
const APISERVER_START_TIMEOUT: Duration = Duration::from_secs(240);
const SCHEDULER_START_TIMEOUT: Duration = Duration::from_secs(120);
const CONTROLLER_MANAGER_START_TIMEOUT: Duration = Duration::from_secs(120);

/// The kube-controller-manager controllers [`ControlPlane::start_controller_manager`] runs
/// (names from `cmd/kube-controller-manager/names/controller_names.go`, k8s.io/kubernetes
/// v1.37.2): ResourceClaims from a pod's templates and their deallocation
/// (`resourceclaim-controller`), the eviction of pods whose claims hold a `NoExecute`
/// tainted device (`device-taint-eviction-controller`, `pkg/controller/devicetainteviction`),
/// and the collection of generated claims whose pod is gone (`garbage-collector-controller`).
pub const DRA_CONTROLLERS: &[&str] = &[
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "garbage-collector-controller",
];

/// A running etcd + kube-apiserver (+ optional kube-scheduler).
pub struct ControlPlane {
    dir: Workdir,
    version: KubeVersion,
    bin: PathBuf,
    procs: Vec<Proc>,
    client: Client,
    server: String,
    kubeconfig: PathBuf,
    token: String,
    ca_pem: String,
    /// Keep the logs on drop even without a panic (a failed start).
    keep_logs: bool,
    /// How kube-apiserver was started, to start it again ([`ControlPlane::restart_apiserver`]).
    apiserver_command: Option<(std::ffi::OsString, Vec<std::ffi::OsString>)>,
    /// The ports of the servers started, reserved until the control plane is dropped.
    ports: Vec<ports::PortLease>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("version", &self.version)
            .field("server", &self.server)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver of the version `RAILGUARD_KUBE_VERSION` names (1.20
    /// by default) and waits until the API answers.
    pub async fn start() -> Result<ControlPlane> {
        Self::start_with_options(&ApiServerOptions::default()).await
    }

    /// [`ControlPlane::start`] with API server options.
    pub async fn start_with_options(opts: &ApiServerOptions) -> Result<ControlPlane> {
        Self::start_version(KubeVersion::from_env()?, opts).await
    }

    /// Starts a control plane of the given version, whatever `RAILGUARD_KUBE_VERSION` says.
    pub async fn start_version(
        version: KubeVersion,
        opts: &ApiServerOptions,
    ) -> Result<ControlPlane> {
        let dir = tempfile::Builder::new().prefix("railguard-cp-").tempdir()?;
        Self::start_with(Workdir::Temp(dir), version, opts).await
    }

    /// Starts a control plane whose files live in `dir` and are kept (the demo uses this).
    pub async fn start_in(dir: &Path) -> Result<ControlPlane> {
        std::fs::create_dir_all(dir)?;
        Self::start_with(
            Workdir::Fixed(dir.to_path_buf()),
            KubeVersion::from_env()?,
            &ApiServerOptions::default(),
        )
        .await
    }

    async fn start_with(
        dir: Workdir,
        version: KubeVersion,
        opts: &ApiServerOptions,
    ) -> Result<ControlPlane> {
        // kube pulls ring and other crates may pull aws-lc-rs: pick one provider explicitly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let bin = version.binaries()?;
        let d = dir.path().to_path_buf();
        let mut cp = ControlPlane {
            client: placeholder_client()?,
            dir,
            version,
            bin,
            procs: Vec::new(),
            server: String::new(),
            kubeconfig: d.join("kubeconfig"),
            token: String::new(),
            ca_pem: String::new(),
            keep_logs: false,
            apiserver_command: None,
            ports: Vec::new(),
        };
        match cp.boot(opts).await {
            Ok(()) => Ok(cp),
            Err(e) => {
                // The caller only sees the error: keep what explains it.
                cp.keep_logs = true;
                Err(e.context(format!(
                    "the {version} control plane did not start; its logs are kept in {}",
                    d.display()
                )))
            }
        }
    }

    async fn boot(&mut self, opts: &ApiServerOptions) -> Result<()> {
        let d = self.dir.path().to_path_buf();
        let address = opts
            .address
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));

        // Certificates: one CA signing the serving certificate; a service-account key pair.
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "railguard-test-ca");
        let ca = ca_params.self_signed(&ca_key)?;
        let mut srv_params = rcgen::CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])?;
        let mut ips = vec!["127.0.0.1".parse()?, address];
        ips.extend(opts.extra_ip_sans.iter().copied());
        ips.dedup();
        for ip in ips {
            srv_params
                .subject_alt_names
                .push(rcgen::SanType::IpAddress(ip));
        }
        srv_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        let srv_key = rcgen::KeyPair::generate()?;
        let srv = srv_params.signed_by(&srv_key, &ca, &ca_key)?;
        // The API server's client identity towards kubelets (exec, logs).
        let mut kc_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        kc_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        kc_params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        kc_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let kc_key = rcgen::KeyPair::generate()?;
        let kc = kc_params.signed_by(&kc_key, &ca, &ca_key)?;
        let sa_key = rcgen::KeyPair::generate()?;
        std::fs::write(d.join("ca.crt"), ca.pem())?;
        std::fs::write(d.join("ca.key"), ca_key.serialize_pem())?;
        std::fs::write(d.join("apiserver.crt"), srv.pem())?;
        std::fs::write(d.join("apiserver.key"), srv_key.serialize_pem())?;
        std::fs::write(d.join("kubelet-client.crt"), kc.pem())?;
        std::fs::write(d.join("kubelet-client.key"), kc_key.serialize_pem())?;
        std::fs::write(d.join("sa.key"), sa_key.serialize_pem())?;
        std::fs::write(d.join("sa.pub"), sa_key.public_key_pem())?;
        let token =
            format!("railguard-{}", std::process::id()) + &hex_token(&srv_key.serialize_der());
        let mut tokens = format!("{token},admin,admin-uid,\"system:masters\"\n");
        for (i, (t, user, group)) in opts.extra_tokens.iter().enumerate() {
            tokens.push_str(&format!("{t},{user},uid-{i},\"{group}\"\n"));
        }
        std::fs::write(d.join("tokens.csv"), tokens)?;

        // 1.20: Debian's etcd 3.4 from PATH; the modern release: the etcd built beside it.
        let etcd = match self.version {
            KubeVersion::V1_20 => PathBuf::from("etcd"),
            KubeVersion::V1_37 => self.bin.join("etcd"),
        };
        let etcd_dir = d.join("etcd");
        let etcd_ports = self
            .spawn_on_ports("etcd", 2, ETCD_START_TIMEOUT, |p| {
                let etcd_url = format!("http://127.0.0.1:{}", p[0]);
                let peer_url = format!("http://127.0.0.1:{}", p[1]);
                // A start that failed may have written a member with the old peer URL.
                let _ = std::fs::remove_dir_all(&etcd_dir);
                let mut cmd = Command::new(&etcd);
                cmd.arg("--data-dir")
                    .arg(&etcd_dir)
                    .arg(format!("--listen-client-urls={etcd_url}"))
                    .arg(format!("--advertise-client-urls={etcd_url}"))
                    .arg(format!("--listen-peer-urls={peer_url}"))
                    .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                    .arg(format!("--initial-cluster=default={peer_url}"))
                    // The data is thrown away with the test: an fsync per write waiting on
                    // a disk shared with parallel builds and tests is what once made etcd
                    // answer "request timed out" (fleet_e2e), not anything under test.
                    .arg("--unsafe-no-fsync")
                    .arg("--log-level=warn");
                cmd
            })
            .await
            .context("etcd did not start")?;
        let etcd_url = format!("http://127.0.0.1:{}", etcd_ports[0]);
        let host = match address {
            std::net::IpAddr::V6(a) => format!("[{a}]"),
            a => a.to_string(),
        };
        let version = self.version;
        let bin = self.bin.clone();
        let build_api = |api_port: u16| {
            let mut api = Command::new(bin.join("kube-apiserver"));
            api.arg(format!("--etcd-servers={etcd_url}"))
                .arg(format!("--bind-address={address}"))
                .arg(format!("--advertise-address={address}"))
                .arg(format!("--secure-port={api_port}"));
            match version {
                // The insecure port is gone from 1.24 on (and with it the flag).
                KubeVersion::V1_20 => {
                    api.arg("--insecure-port=0");
                }
                // The modern endpoint reconciler refuses a loopback advertise address ("may
                // not be in the loopback range"); without one the `kubernetes` Service has no
                // endpoints, which only in-cluster clients (a real node's pods) would miss.
                KubeVersion::V1_37 if address.is_loopback() => {
                    api.arg("--endpoint-reconciler-type=none");
                }
                KubeVersion::V1_37 => {}
            }
            api.arg(format!("--cert-dir={}", d.join("certs").display()))
                .arg(format!(
                    "--tls-cert-file={}",
                    d.join("apiserver.crt").display()
                ))
                .arg(format!(
                    "--tls-private-key-file={}",
                    d.join("apiserver.key").display()
                ))
                .arg(format!("--client-ca-file={}", d.join("ca.crt").display()))
                .arg(format!(
                    "--token-auth-file={}",
                    d.join("tokens.csv").display()
                ))
                .arg(format!(
                    "--kubelet-client-certificate={}",
                    d.join("kubelet-client.crt").display()
                ))
                .arg(format!(
                    "--kubelet-client-key={}",
                    d.join("kubelet-client.key").display()
                ))
                .arg("--authorization-mode=Node,RBAC")
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!(
                    "--service-account-key-file={}",
                    d.join("sa.pub").display()
                ))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    d.join("sa.key").display()
                ))
                .arg("--service-cluster-ip-range=10.96.0.0/24")
                .arg("--allow-privileged=true")
                .arg("--enable-priority-and-fairness=false")
                .arg("--v=1")
                .args(&opts.extra_args);
            api
        };
        let api_ports = self
            .spawn_on_ports("kube-apiserver", 1, APISERVER_START_TIMEOUT, |p| {
                build_api(p[0])
            })
            .await
            .context("kube-apiserver did not start")?;
        let api = build_api(api_ports[0]);
        self.apiserver_command = Some((
            api.get_program().to_owned(),
            api.get_args().map(|a| a.to_owned()).collect(),
        ));
        self.server = format!("https://{host}:{}", api_ports[0]);
        self.token = token;
        self.ca_pem = ca.pem();
        self.write_kubeconfig()?;
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        self.client = Client::try_from(config)?;
        self.wait_ready(APISERVER_START_TIMEOUT).await
    }

    /// Starts `name` on `count` leased ports (`command` builds it for them) and waits until
    /// the process itself listens on all of them. A port another process took first makes it
    /// exit with "address already in use": then it starts again on new ports, at most
    /// [`ports::PORT_ATTEMPTS`] times, each retry logged. The leases stay with `self`.
    async fn spawn_on_ports(
        &mut self,
        name: &'static str,
        count: usize,
        timeout: Duration,
        mut command: impl FnMut(&[u16]) -> Command,
    ) -> Result<Vec<u16>> {
        let d = self.dir.path().to_path_buf();
        let log = d.join(format!("{name}.log"));
        for attempt in 1..=ports::PORT_ATTEMPTS {
            let leases = ports::lease_ports(count)?;
            let numbers: Vec<u16> = leases.iter().map(ports::PortLease::port).collect();
            let mut proc = spawn(name, &mut command(&numbers), &d)?;
            match ports::wait_bound(&mut proc.child, &numbers, &log, timeout).await {
                Ok(ports::Bound::Listening) => {
                    self.procs.push(proc);
                    self.ports.extend(leases);
                    return Ok(numbers);
                }
                Ok(ports::Bound::PortInUse(line)) => {
                    ports::log_port_retry(name, attempt, &numbers, &line);
                }
                Ok(ports::Bound::Exited(status)) => {
                    bail!("{name} exited with {status}; see {}", log.display())
                }
                Err(e) => {
                    terminate(&mut proc.child);
                    return Err(e.context(format!("{name} did not listen")));
                }
            }
        }
        bail!(
            "{name} found its ports in use {} times in a row; see {}",
            ports::PORT_ATTEMPTS,
            log.display()
        )
    }

    fn write_kubeconfig(&self) -> Result<()> {
        let ca_b64 = b64(self.ca_pem.as_bytes());
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: railguard-test\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    token: {}\ncontexts:\n- name: railguard-test\n  context:\n    cluster: railguard-test\n    user: admin\ncurrent-context: railguard-test\n",
            self.server, ca_b64, self.token
        );
        std::fs::write(&self.kubeconfig, yaml)?;
        Ok(())
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        loop {
            self.check_alive()?;
            // The default namespace exists once the bootstrap controllers have run.
            let last = match namespaces.get("default").await {
                Ok(_) if self.apis_registered().await => return Ok(()),
                Ok(_) => "the default namespace, not every API group yet".to_string(),
                Err(e) => format!("reading the default namespace: {e}"),
            };
            if start.elapsed() > timeout {
                bail!("kube-apiserver not ready after {timeout:?}; last seen: {last}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether discovery lists every built-in API group. 1.37 registers them (as local
    /// APIServices) a moment after the default namespace exists, so `/apis` can briefly
    /// miss some, e.g. resource.k8s.io; `/readyz` waits for that (autoregister-completion).
    /// 1.20's readiness stays the default namespace alone.
    async fn apis_registered(&self) -> bool {
        match self.version {
            KubeVersion::V1_20 => true,
            KubeVersion::V1_37 => {
                let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
                    return false;
                };
                matches!(self.client.request_text(req).await.as_deref(), Ok("ok"))
            }
        }
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 5 s), starts it again with the same
    /// flags and port, and waits until it answers; etcd and its data stay. Clients keep
    /// working across it, as against a real API server restart.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        let (program, args) = self
            .apiserver_command
            .clone()
            .context("kube-apiserver was never started")?;
        if let Some(i) = self.procs.iter().position(|p| p.name == "kube-apiserver") {
            let mut old = self.procs.remove(i);
            terminate(&mut old.child);
        }
        let d = self.dir.path().to_path_buf();
        let mut api = Command::new(program);
        api.args(args);
        self.procs.push(spawn("kube-apiserver", &mut api, &d)?);
        self.wait_ready(APISERVER_START_TIMEOUT).await
    }

    /// Process ids of everything the harness started (for the demo's `--down`).
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.child.id()).collect()
    }

    /// Fails if a process the harness started has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.child.try_wait()? {
                bail!(
                    "{} exited with {status}; see {}/{}.log",
                    p.name,
                    self.dir.path().display(),
                    p.name
                );
            }
        }
        Ok(())
    }

    /// The Kubernetes version this control plane runs (tests branch on it).
    pub fn kube_version(&self) -> KubeVersion {
        self.version
    }

    /// Directory of this control plane's binaries (kube-apiserver, kube-scheduler, ...).
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// An admin client (system:masters).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Path of an admin kubeconfig for child processes.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The CA that signed the API server's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The admin's bearer token (for raw HTTP where the kube client's retries would hide
    /// an answer, e.g. a 429 from the eviction API).
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// Where the processes' logs are written.
    pub fn log_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts kube-scheduler with a configuration whose `extenders:` list is `extenders_yaml`
    /// (a YAML sequence, may be empty `[]`): `kubescheduler.config.k8s.io/v1beta1` for 1.20,
    /// `kubescheduler.config.k8s.io/v1` for the modern release (which dropped v1beta*).
    pub async fn start_scheduler(&mut self, extenders_yaml: &str) -> Result<()> {
        let d = self.dir.path().to_path_buf();
        let extenders: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(extenders_yaml).context("extenders YAML")?;
        let config = json!({
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": { "kubeconfig": self.kubeconfig.display().to_string(), "qps": 500, "burst": 1000 },
            "leaderElection": { "leaderElect": false },
            "extenders": extenders,
        });
        let path = d.join("scheduler-config.yaml");
        let version = self.version;
        let bin = self.bin.clone();
        let kubeconfig = self.kubeconfig.clone();
        // 1.20 serves healthz and metrics on two plain ports, v1 both on its secure port.
        let count = match version {
            KubeVersion::V1_20 => 2,
            KubeVersion::V1_37 => 1,
        };
        let mut config_error = None;
        self.spawn_on_ports("kube-scheduler", count, SCHEDULER_START_TIMEOUT, |p| {
            let mut config = config.clone();
            let mut cmd = Command::new(bin.join("kube-scheduler"));
            cmd.arg(format!("--config={}", path.display()));
            match version {
                KubeVersion::V1_20 => {
                    merge_json(
                        &mut config,
                        json!({
                            "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
                            // With --config, 1.20 ignores --port=0 and would bind
                            // 0.0.0.0:10251; keep each scheduler on its own loopback ports so
                            // several can run side by side.
                            "healthzBindAddress": format!("127.0.0.1:{}", p[0]),
                            "metricsBindAddress": format!("127.0.0.1:{}", p[1]),
                        }),
                    );
                    cmd.arg("--port=0").arg("--secure-port=0");
                }
                KubeVersion::V1_37 => {
                    // v1 has no healthz/metricsBindAddress (nor the insecure port, nor
                    // --port): healthz and metrics are served on the secure port,
                    // authenticated and authorized through the API server. Serving means
                    // the configuration was accepted and the informers are starting.
                    merge_json(
                        &mut config,
                        json!({ "apiVersion": "kubescheduler.config.k8s.io/v1" }),
                    );
                    cmd.arg("--bind-address=127.0.0.1")
                        .arg(format!("--secure-port={}", p[0]))
                        .arg(format!(
                            "--cert-dir={}",
                            d.join("scheduler-certs").display()
                        ))
                        .args(delegated_auth_args(&kubeconfig));
                }
            }
            let written = serde_yaml_ng::to_string(&config)
                .map_err(anyhow::Error::from)
                .and_then(|y| Ok(std::fs::write(&path, y)?));
            if let Err(e) = written {
                config_error.get_or_insert(e);
            }
            cmd.arg("--v=2");
            cmd
        })
        .await
        .map_err(|e| match config_error.take() {
            Some(c) => c.context("writing the scheduler configuration"),
            None => e,
        })?;
        self.check_alive()
    }

    /// Stops kube-scheduler if running (so a test can restart it with another config).
    pub fn stop_scheduler(&mut self) {
        if let Some(i) = self.procs.iter().position(|p| p.name == "kube-scheduler") {
            let mut p = self.procs.remove(i);
            terminate(&mut p.child);
        }
    }

    /// Starts the modern (1.37) kube-controller-manager with [`DRA_CONTROLLERS`]: what turns
    /// a pod's ResourceClaimTemplate into its ResourceClaim, deallocates the claims of pods
    /// that are gone, evicts the pods of claims allocated a `NoExecute`-tainted device and
    /// collects the claims of deleted pods. See
    /// [`ControlPlane::start_controller_manager_with`].
    pub async fn start_controller_manager(&mut self) -> Result<()> {
        self.start_controller_manager_with(DRA_CONTROLLERS).await
    }

    /// Starts the 1.37 kube-controller-manager (from the same bin dir as kube-apiserver) with
    /// `controllers` (`--controllers`, names of `cmd/kube-controller-manager/names` of
    /// k8s.io/kubernetes v1.37.2; `*` for all on-by-default ones) under the admin
    /// kubeconfig, with the control plane's service-account key and CA, no leader election,
    /// and its secure port on a leased loopback port (authenticated and authorized through
    /// the API server, like the v1 scheduler's), which is how a start is seen to succeed.
    ///
    /// Not `*` by default: with it the node-lifecycle-controller would mark the harness's
    /// kubelet-less Nodes `Unknown` after `--node-monitor-grace-period` (50 s) and taint them
    /// unreachable, which is no part of what the DRA tests look at. The 1.20 control
    /// plane's real node starts its own kube-controller-manager ([`RealNode`]).
    pub async fn start_controller_manager_with(&mut self, controllers: &[&str]) -> Result<()> {
        if self.version != KubeVersion::V1_37 {
            bail!(
                "start_controller_manager runs the {MODERN_KUBE_MINOR} kube-controller-manager; \
                 this control plane is {}",
                self.version
            );
        }
        let d = self.dir.path().to_path_buf();
        let kcm = self.bin.join("kube-controller-manager");
        if !kcm.is_file() {
            bail!(
                "{} is missing (tests/scripts/control-plane-modern.sh builds it)",
                kcm.display()
            );
        }
        let kubeconfig = self.kubeconfig.clone();
        let controllers = controllers.join(",");
        self.spawn_on_ports(
            "kube-controller-manager",
            1,
            CONTROLLER_MANAGER_START_TIMEOUT,
            |p| {
                let mut cmd = Command::new(&kcm);
                cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
                    .arg(format!("--controllers={controllers}"))
                    .arg("--use-service-account-credentials=false")
                    .arg(format!(
                        "--service-account-private-key-file={}",
                        d.join("sa.key").display()
                    ))
                    .arg(format!("--root-ca-file={}", d.join("ca.crt").display()))
                    .arg("--leader-elect=false")
                    .arg("--bind-address=127.0.0.1")
                    .arg(format!("--secure-port={}", p[0]))
                    .arg(format!("--cert-dir={}", d.join("kcm-certs").display()))
                    .args(delegated_auth_args(&kubeconfig))
                    .arg("--v=2");
                cmd
            },
        )
        .await?;
        self.check_alive()
    }

    /// Stops kube-controller-manager if running.
    pub fn stop_controller_manager(&mut self) {
        if let Some(i) = self
            .procs
            .iter()
            .position(|p| p.name == "kube-controller-manager")
        {
            let mut p = self.procs.remove(i);
            terminate(&mut p.child);
        }
    }

    /// Applies the FabricProfile CRD from `charts/railguard/crds/` and waits until it is served.
    pub async fn apply_fabricprofile_crd(&self) -> Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let path = workspace_root().join("charts/railguard/crds/fabricprofile.yaml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text)?;
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(HARNESS_FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await?;
        self.wait_crd_established(&name, Duration::from_secs(30))
            .await?;
        // Discovery may lag the condition slightly.
        let profiles: Api<railguard_api::FabricProfile> = Api::all(self.client.clone());
        let start = Instant::now();
        while profiles.list(&Default::default()).await.is_err() {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("CRD {name} established but not served after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Waits until the CustomResourceDefinition `name` is Established.
    pub async fn wait_crd_established(&self, name: &str, timeout: Duration) -> Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let start = Instant::now();
        loop {
            let conditions = api.get(name).await?.status.and_then(|s| s.conditions);
            if conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!("CRD {name} not established after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates a schedulable fake Node: given labels and allocatable (plus cpu, memory and
    /// pods defaults), a Ready condition, and no `not-ready` taint.
    pub async fn create_node(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        allocatable: &[(&str, &str)],
    ) -> Result<Node> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut labels = labels.clone();
        labels
            .entry("kubernetes.io/hostname".into())
            .or_insert_with(|| name.to_string());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": name, "labels": labels },
            "spec": {},
        }))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {name}"))?;
        // The TaintNodesByCondition admission plugin adds not-ready on create; no kubelet clears it.
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "taints": null } })),
            )
            .await?;
        let mut alloc: BTreeMap<String, String> = [
            ("cpu", "64"),
            ("memory", "1024Gi"),
            ("pods", "110"),
            ("ephemeral-storage", "1Ti"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in allocatable {
            alloc.insert(k.to_string(), v.to_string());
        }
        let now = jiff::Timestamp::now().to_string();
        let status = json!({ "status": {
            "capacity": alloc, "allocatable": alloc,
            "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                              "message": "fake node from the railguard test harness",
                              "lastHeartbeatTime": now, "lastTransitionTime": now }],
        }});
        let node = nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await?;
        Ok(node)
    }

    /// Creates a namespace with labels and a `default` ServiceAccount that mounts no token
    /// (no controller-manager runs, so nobody else creates it).
    pub async fn create_namespace(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name, "labels": labels },
        }))?;
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        let sa: ServiceAccount = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "default" }, "automountServiceAccountToken": false,
        }))?;
        sas.create(&PostParams::default(), &sa).await?;
        Ok(())
    }

    /// A Node with eight H100 GPUs: the GPU product label and `nvidia.com/gpu: 8`.
    pub async fn create_h100_node(&self, name: &str) -> Result<Node> {
        self.create_node(
            name,
            &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
            &[("nvidia.com/gpu", "8")],
        )
        .await
    }

    /// Creates the FabricProfile of `api/fixtures/profiles/<file>` (its CRD applied first);
    /// the profile.
    pub async fn create_fixture_profile(&self, file: &str) -> Result<railguard_api::FabricProfile> {
        let profile = fixture_profile(file)?;
        Api::<railguard_api::FabricProfile>::all(self.client.clone())
            .create(&PostParams::default(), &profile)
            .await?;
        Ok(profile)
    }

    /// Says where `node`'s peer endpoint listens (the `railguard.io/peer-endpoint`
    /// annotation, set by whoever deploys the endpoint).
    pub async fn annotate_peer_endpoint(&self, node: &str, addr: &str) -> Result<()> {
        Api::<Node>::all(self.client.clone())
            .patch(
                node,
                &PatchParams::apply("railguard-tests").force(),
                &Patch::Apply(&json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": { "name": node, "annotations": { "railguard.io/peer-endpoint": addr } },
                })),
            )
            .await?;
        Ok(())
    }

    /// Publishes `cert` on a Node the way the prober does, in one server-side apply patch:
    /// the fabric, profile and signature labels and the certificate annotation.
    pub async fn publish_certificate(
        &self,
        node: &str,
        cert: &railguard_api::Certificate,
    ) -> Result<()> {
        use railguard_api::keys;
        let labels = labels(&[
            (keys::LABEL_FABRIC, cert.verdict.as_label()),
            (keys::LABEL_PROFILE, &cert.profile),
            (keys::LABEL_SIGNATURE, &cert.signature),
        ]);
        let annotations = BTreeMap::from([(
            keys::ANNOTATION_CERTIFICATE.to_string(),
            cert.to_annotation()?,
        )]);
        let patch = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": labels, "annotations": annotations},
        });
        Api::<Node>::all(self.client.clone())
            .patch(
                node,
                &PatchParams::apply(HARNESS_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .with_context(|| format!("publishing a certificate on {node}"))?;
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Scheduler first, then the API server, then etcd.
        while let Some(mut p) = self.procs.pop() {
            terminate(&mut p.child);
        }
        if self.keep_logs
            || std::thread::panicking()
            || std::env::var_os("RAILGUARD_KEEP_LOGS").is_some()
        {
            if let Workdir::Temp(_) = self.dir {
                let placeholder = Workdir::Fixed(PathBuf::new());
                if let Workdir::Temp(t) = std::mem::replace(&mut self.dir, placeholder) {
                    let path = t.keep();
                    eprintln!(
                        "railguard-tests: control plane logs kept in {}",
                        path.display()
                    );
                }
            }
        }
    }
}

/// Starts `cmd` with no stdin, its stdout and stderr both in a new file at `log`.
pub fn spawn_logging_to(cmd: &mut Command, log: &Path) -> std::io::Result<Child> {
    let file = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
}

fn spawn(name: &'static str, cmd: &mut Command, dir: &Path) -> Result<Proc> {
    spawn_logged(name, cmd, dir, dir)
}

/// Starts `cmd` with stdout and stderr in `log_dir/NAME.log` and its pid in
/// `pid_dir/NAME.pid`.
fn spawn_logged(
    name: &'static str,
    cmd: &mut Command,
    log_dir: &Path,
    pid_dir: &Path,
) -> Result<Proc> {
    let child = spawn_logging_to(cmd, &log_dir.join(format!("{name}.log"))).with_context(|| {
            format!("starting {name} (is it installed? tests/scripts/install-deps.sh and control-plane.sh install them)")
        })?;
    // For a teardown after a run that could not clean up (tests/scripts/real-node-teardown.sh).
    std::fs::write(pid_dir.join(format!("{name}.pid")), child.id().to_string())?;
    Ok(Proc { name, child })
}

fn terminate(child: &mut Child) {
    let pid = child.id().to_string();
    let _ = Command::new("kill").arg("-TERM").arg(&pid).status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn placeholder_client() -> Result<Client> {
    // A client that is replaced before use; building it needs no IO.
    let config = kube::Config::new("https://127.0.0.1:1".parse()?);
    Ok(Client::try_from(config)?)
}

pub(crate) fn hex_token(seed: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for b in seed.iter().rev().take(16) {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The flags of a component that authenticates and authorizes the requests to its secure
/// port through the API server of `kubeconfig` (the scheduler, the controller manager).
fn delegated_auth_args(kubeconfig: &Path) -> [String; 2] {
    [
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
    ]
}

/// Label map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A token of ServiceAccount `namespace/name` (an hour), bound to `pod` when given, as the
/// kubelet projects one into a pod.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    name: &str,
    pod: Option<&k8s_openapi::api::core::v1::Pod>,
) -> Result<String> {
    let bound = pod.map(|p| {
        serde_json::json!({"kind": "Pod", "apiVersion": "v1",
               "name": p.metadata.name, "uid": p.metadata.uid})
    });
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [], "expirationSeconds": 3600, "boundObjectRef": bound},
        }))?;
    let answer =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), namespace)
            .create_token_request(name, &kube::api::PostParams::default(), &request)
            .await
            .with_context(|| format!("token for {namespace}/{name}"))?;
    answer
        .status
        .map(|s| s.token)
        .with_context(|| format!("the token request for {namespace}/{name} has no status"))
}

/// Events about the object called `name` (in `default`, where Events about Nodes and other
/// cluster-scoped objects live): (type, reason, message).
pub async fn events_about(client: &Client, name: &str) -> Result<Vec<(String, String, String)>> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect())
}

/// What one poll of [`eventually`] saw: the value it waits for, or not yet.
pub trait Observation {
    type Value;
    /// The value, or what was seen instead (`None`: nothing worth saying).
    fn observed(self) -> std::result::Result<Self::Value, Option<String>>;
}

impl<T> Observation for Option<T> {
    type Value = T;
    fn observed(self) -> std::result::Result<T, Option<String>> {
        self.ok_or(None)
    }
}

/// A poll that saw something other than the awaited state; [`eventually`] prints the last one
/// when it times out.
#[derive(Clone, Debug)]
pub struct NotYet(pub String);

impl<T> Observation for std::result::Result<T, NotYet> {
    type Value = T;
    fn observed(self) -> std::result::Result<T, Option<String>> {
        self.map_err(|n| Some(n.0))
    }
}

/// Create parameters that ask the API server what it would store (admission webhooks
/// run) and persist nothing.
pub fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// Polls `check` until it returns the awaited value (`Some(v)` or `Ok(v)`), or fails after
/// `timeout` naming `what` and, where the check said it (`Err(NotYet(..))`), what it last saw.
/// An error of the check itself fails at once.
pub async fn eventually<O, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<O::Value>
where
    O: Observation,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<O>>,
{
    let start = Instant::now();
    let mut last = None;
    loop {
        match check().await?.observed() {
            Ok(v) => return Ok(v),
            Err(seen) => last = seen.or(last),
        }
        if start.elapsed() > timeout {
            match &last {
                Some(seen) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last seen: {seen}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Path of the workspace binary `name` from `package`. Uses `RAILGUARD_BIN_DIR` when set
/// (tests/scripts/test-all.sh builds every binary once, up front); otherwise builds it, so a
/// single test can be run on its own with `cargo test`.
pub fn workspace_binary(package: &str, name: &str) -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("RAILGUARD_BIN_DIR") {
        let path = PathBuf::from(dir).join(name);
        if !path.is_file() {
            bail!("{} is not built (RAILGUARD_BIN_DIR is set)", path.display());
        }
        return Ok(path);
    }
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", package, "--bin", name])
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("building {name}"))?;
    if !status.success() {
        bail!("cargo build -p {package} --bin {name} failed");
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"));
    Ok(target.join("debug").join(name))
}

/// A throwaway CA, a serving certificate and a client certificate it signed, all PEM.
#[derive(Clone, Debug)]
pub struct ServingCertificate {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// For clients a server authenticates (`--tls-client-ca`): the scheduler's.
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl ServingCertificate {
    /// A certificate for `127.0.0.1` (IP SAN) and `localhost`, as loopback servers under
    /// test present to the API server and kube-scheduler.
    pub fn loopback(ca_name: &str) -> Result<ServingCertificate> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, ca_name);
        let ca = ca_params.self_signed(&ca_key)?;
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()])?;
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse()?));
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        let mut client = rcgen::CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "railguard-scheduler");
        client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = rcgen::KeyPair::generate()?;
        let client_cert = client.signed_by(&client_key, &ca, &ca_key)?;
        Ok(ServingCertificate {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        })
    }

    /// Writes `ca.crt`, `client.crt` and `client.key` into `dir`; their paths.
    pub fn write_client(&self, dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
        let (ca, cert, key) = (
            dir.join("ca.crt"),
            dir.join("client.crt"),
            dir.join("client.key"),
        );
        std::fs::write(&ca, &self.ca_pem)?;
        std::fs::write(&cert, &self.client_cert_pem)?;
        std::fs::write(&key, &self.client_key_pem)?;
        Ok((ca, cert, key))
    }

    /// An HTTPS client that trusts only this CA and presents the scheduler's client
    /// certificate: how tests call the extender as kube-scheduler does.
    pub fn scheduler_https_client(&self) -> Result<reqwest::Client> {
        // reqwest takes the identity as one PEM: the certificate, then its key.
        let identity = format!("{}{}", self.client_cert_pem, self.client_key_pem);
        Ok(reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes())?)
            .identity(reqwest::Identity::from_pem(identity.as_bytes())?)
            .build()?)
    }

    /// Writes `tls.crt` and `tls.key` into `dir` and returns their paths.
    pub fn write_pair(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &self.cert_pem)?;
        std::fs::write(&key, &self.key_pem)?;
        Ok((cert, key))
    }
}

/// A TLS client that trusts `ca_pem` and presents `client` (PEM chain, PEM key) when given:
/// how tests call the webhook and the extender as the API server and the scheduler do.
pub fn tls_connector(
    ca_pem: &str,
    client: Option<(&str, &str)>,
) -> Result<tokio_rustls::TlsConnector> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => {
            let chain = rustls_pemfile::certs(&mut cert.as_bytes()).collect::<Result<_, _>>()?;
            let key = rustls_pemfile::private_key(&mut key.as_bytes())?
                .context("no private key in the client key PEM")?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config,
    )))
}

/// A FabricProfile from `api/fixtures/profiles/<file>`.
pub fn fixture_profile(file: &str) -> Result<railguard_api::FabricProfile> {
    let path = workspace_root().join("api/fixtures/profiles").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    railguard_api::profiles_from_yaml(&text)?
        .into_iter()
        .next()
        .with_context(|| format!("{} holds no profile", path.display()))
}

/// Merges `b` into `a` recursively (objects key by key; anything else replaced).
pub fn merge_json(a: &mut serde_json::Value, b: serde_json::Value) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge_json(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// The node a pod is bound to, if it exists and is bound.
pub async fn pod_node(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()
        .and_then(|p| p.spec)
        .and_then(|s| s.node_name)
}

/// Waits up to a minute for a pod to be bound; returns its node.
pub async fn wait_bound(client: &Client, ns: &str, name: &str) -> Result<String> {
    eventually(
        Duration::from_secs(60),
        &format!("pod {ns}/{name} bound"),
        || async {
            let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
            let pod = match pods.get(name).await {
                Ok(p) => p,
                Err(e) => return Ok(Err(NotYet(format!("reading it failed: {e}")))),
            };
            Ok(match pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                Some(node) => Ok(node),
                None => Err(NotYet(format!(
                    "unbound, conditions {:?}",
                    pod.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .map(|c| format!(
                            "{}={} {}",
                            c.type_,
                            c.status,
                            c.message.clone().unwrap_or_default()
                        ))
                        .collect::<Vec<_>>()
                ))),
            })
        },
    )
    .await
}

/// Messages of a pod's FailedScheduling events.
pub async fn failed_scheduling_messages(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Vec<String>> {
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .filter_map(|e| e.message)
        .collect())
}

/// Gives ServiceAccount `namespace/name` the legacy token Secret 1.20's ServiceAccount
/// admission looks for before it admits a Pod that mounts the account's token ("No API token
/// found for service account"): no token controller runs in these control planes. From 1.22
/// the kubelet projects a bound token instead and nothing is needed; this does nothing there.
pub async fn give_legacy_token(
    client: &Client,
    version: KubeVersion,
    namespace: &str,
    name: &str,
) -> Result<()> {
    if version != KubeVersion::V1_20 {
        return Ok(());
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account = accounts
        .get(name)
        .await
        .with_context(|| format!("ServiceAccount {namespace}/{name}"))?;
    let token = format!("{name}-token");
    if account
        .secrets
        .iter()
        .flatten()
        .any(|s| s.name.as_deref() == Some(token.as_str()))
    {
        return Ok(());
    }
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": token, "annotations": {
            "kubernetes.io/service-account.name": name,
            "kubernetes.io/service-account.uid": account.metadata.uid,
        }},
        "type": "kubernetes.io/service-account-token",
    }))?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("token Secret {namespace}/{token}"))?;
    accounts
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"secrets": [{"name": token}]})),
        )
        .await?;
    Ok(())
}
