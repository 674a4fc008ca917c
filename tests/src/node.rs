//! A real local Kubernetes node for end-to-end tests: the harness's control plane (with a
//! non-loopback API address, endpoint routing for webhook Services, kubelet client
//! credentials) plus kube-controller-manager, the default kube-scheduler, containerd with
//! the CNI bridge, kubelet and kube-proxy, all 1.20 from `tests/scripts/control-plane.sh`.
//!
//! Pods really run. Only one real node fits on a machine (kubelet and containerd use fixed
//! host paths), so [`RealNode::start`] takes a host-wide lock and first takes down a node an
//! earlier run left behind. Drop stops everything and puts the host back
//! (`tests/scripts/real-node-teardown.sh`: processes, containers, mounts, network
//! namespaces, the bridge, iptables rules, sysctls, cgroups, host directories), also after a
//! panic, keeping the logs then.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::{eventually, workspace_root, ApiServerOptions, ControlPlane, KubeVersion, NotYet};

/// Name the node registers under (the Node authorizer ties the kubelet's identity to it).
pub const REAL_NODE_NAME: &str = "railguard-node";
/// Pod network of the CNI bridge.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The `kubernetes` Service's ClusterIP (first address of the harness's service range).
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

const HOST_LOCK: &str = "/run/railguard-real-node.lock";
const HOST_ACTIVE: &str = "/run/railguard-real-node.active";
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(240);

/// Sysctls kubelet, kube-proxy and the CNI bridge change; restored on teardown.
const SYSCTLS: &[&str] = &[
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.bridge.bridge-nf-call-iptables",
];

/// Host directories kubelet, containerd and CNI create at fixed paths; removed on teardown
/// when they did not exist before.
const HOST_DIRS: &[&str] = &[
    "/run/containerd",
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/netns",
];

/// A running single-node cluster with a real kubelet.
pub struct RealNode {
    // Dropped after `Drop::drop` took the node down: stops the control plane last.
    cp: ControlPlane,
    procs: Vec<crate::Proc>,
    ip: IpAddr,
    _lock: File,
    started: Duration,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("ip", &self.ip)
            .field("dir", &self.cp.log_dir())
            .finish()
    }
}

/// Binaries of the node, next to kube-apiserver in the control plane cache.
fn node_binary(bin: &Path, name: &str) -> Result<PathBuf> {
    let p = bin.join(name);
    if !p.is_file() {
        bail!(
            "{} is missing: run tests/scripts/control-plane.sh (it builds kubelet, kube-proxy and kube-controller-manager too)",
            p.display()
        );
    }
    Ok(p)
}

/// The address of the default route's interface: the node IP pods reach the API server at.
pub fn host_ip() -> Result<IpAddr> {
    let out = Command::new("ip")
        .args(["-4", "route", "get", "1.1.1.1"])
        .output()
        .context("running `ip route get` (iproute2)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "src" {
            if let Some(ip) = words.next() {
                return ip
                    .parse()
                    .with_context(|| format!("bad source address {ip:?}"));
            }
        }
    }
    // No default route: any global IPv4 address.
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        if let Some(cidr) = line.split_whitespace().nth(3) {
            if let Some(ip) = cidr.split('/').next() {
                return Ok(ip.parse()?);
            }
        }
    }
    bail!("this machine has no non-loopback IPv4 address for the node")
}

fn teardown_script() -> PathBuf {
    workspace_root().join("tests/scripts/real-node-teardown.sh")
}

fn run_teardown(dir: &Path, all: bool) {
    let mut c = Command::new("bash");
    c.arg(teardown_script()).arg(dir);
    if all {
        c.arg("--all");
    }
    match c.status() {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!(
            "railguard-tests: real-node teardown of {} ended {s}",
            dir.display()
        ),
        Err(e) => eprintln!("railguard-tests: cannot run the real-node teardown: {e}"),
    }
}

fn sh(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Records what teardown must restore: iptables rules, sysctls, absent host directories.
fn save_host_state(state: &Path) -> Result<()> {
    std::fs::create_dir_all(state)?;
    // Listing a table makes iptables-nft create it, so the saved rules name every table
    // the node will touch and restoring them undoes every rule it adds.
    for table in ["filter", "nat", "mangle"] {
        let _ = sh("iptables", &["-t", table, "-S"]);
    }
    std::fs::write(state.join("iptables.rules"), sh("iptables-save", &[])?)?;
    if let Ok(rules) = sh("ip6tables-save", &[]) {
        std::fs::write(state.join("ip6tables.rules"), rules)?;
    }
    let mut sysctl = String::new();
    for key in SYSCTLS {
        let path = Path::new("/proc/sys").join(key.replace('.', "/"));
        if let Ok(v) = std::fs::read_to_string(&path) {
            sysctl.push_str(&format!("{key} {}\n", v.trim()));
        }
    }
    std::fs::write(state.join("sysctl"), sysctl)?;
    let absent: String = HOST_DIRS
        .iter()
        .filter(|d| !Path::new(d).exists())
        .map(|d| format!("{d}\n"))
        .collect();
    std::fs::write(state.join("absent-dirs"), absent)?;
    Ok(())
}

impl RealNode {
    /// Starts the control plane and the node, waits until the Node is Ready, untainted and
    /// the `default` ServiceAccount exists (kube-controller-manager runs).
    pub async fn start() -> Result<RealNode> {
        let t0 = Instant::now();
        let lock = File::create(HOST_LOCK).with_context(|| format!("creating {HOST_LOCK}"))?;
        lock.lock()
            .with_context(|| format!("locking {HOST_LOCK} (one real node per machine)"))?;
        if let Ok(stale) = std::fs::read_to_string(HOST_ACTIVE) {
            let stale = PathBuf::from(stale.trim());
            if stale.is_dir() {
                eprintln!(
                    "railguard-tests: taking down the real node an earlier run left in {}",
                    stale.display()
                );
                run_teardown(&stale, true);
            }
            let _ = std::fs::remove_file(HOST_ACTIVE);
        }
        let ip = host_ip()?;
        let node_token = format!("node-{}", crate::hex_token(ip.to_string().as_bytes()));
        let proxy_token = format!("proxy-{}", crate::hex_token(b"kube-proxy-token-seed"));
        let opts = ApiServerOptions {
            address: Some(ip),
            extra_ip_sans: vec![KUBERNETES_SERVICE_IP.parse()?],
            extra_tokens: vec![
                (
                    node_token.clone(),
                    format!("system:node:{REAL_NODE_NAME}"),
                    "system:nodes".into(),
                ),
                (
                    proxy_token.clone(),
                    "system:kube-proxy".into(),
                    "system:node-proxier".into(),
                ),
            ],
            // The API server dials webhook Services through their endpoints (no cluster DNS).
            extra_args: vec![
                "--enable-aggregator-routing=true".into(),
                "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            ],
        };
        // kubelet and kube-proxy exist for 1.20 only; the modern kubelet would also refuse
        // this cgroup v1 host unless configured to accept it.
        let cp = ControlPlane::start_version(KubeVersion::V1_20, &opts).await?;
        let dir = cp.log_dir().to_path_buf();
        let mut node = RealNode {
            cp,
            procs: Vec::new(),
            ip,
            _lock: lock,
            started: Duration::ZERO,
        };
        std::fs::create_dir_all(dir.join("node"))?;
        save_host_state(&dir.join("host-state"))?;
        std::fs::write(HOST_ACTIVE, dir.display().to_string())?;
        if let Err(e) = node.boot(&node_token, &proxy_token).await {
            node.cp.keep_logs = true;
            return Err(e.context(format!(
                "the real node did not start; logs kept in {}",
                dir.display()
            )));
        }
        node.started = t0.elapsed();
        eprintln!(
            "railguard-tests: real node {REAL_NODE_NAME} ({ip}) Ready in {:.1}s; logs in {}",
            node.started.as_secs_f64(),
            dir.display()
        );
        Ok(node)
    }

    async fn boot(&mut self, node_token: &str, proxy_token: &str) -> Result<()> {
        let dir = self.cp.log_dir().to_path_buf();
        let bin = crate::control_plane_binaries()?;
        let ca = dir.join("ca.crt");
        let kubeconfig_for = |user: &str, token: &str| -> Result<PathBuf> {
            let path = dir.join(format!("{user}.kubeconfig"));
            let yaml = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: {user}\ncurrent-context: local\n",
                self.cp.server_url(),
                ca.display()
            );
            std::fs::write(&path, yaml)?;
            Ok(path)
        };
        let node_kc = kubeconfig_for("kubelet", node_token)?;
        let proxy_kc = kubeconfig_for("kube-proxy", proxy_token)?;
        let admin_kc = self.cp.kubeconfig_path().to_path_buf();

        // kube-controller-manager: service-account tokens, the not-ready taint, Endpoints.
        let mut kcm = Command::new(node_binary(&bin, "kube-controller-manager")?);
        kcm.arg(format!("--kubeconfig={}", admin_kc.display()))
            .arg(format!(
                "--authentication-kubeconfig={}",
                admin_kc.display()
            ))
            .arg(format!("--authorization-kubeconfig={}", admin_kc.display()))
            .arg(format!(
                "--service-account-private-key-file={}",
                dir.join("sa.key").display()
            ))
            .arg(format!("--root-ca-file={}", ca.display()))
            .arg(format!("--cluster-signing-cert-file={}", ca.display()))
            .arg(format!(
                "--cluster-signing-key-file={}",
                dir.join("ca.key").display()
            ))
            .arg("--use-service-account-credentials=false")
            .arg("--leader-elect=false")
            .arg(format!(
                "--flex-volume-plugin-dir={}",
                dir.join("kcm-flexvolume").display()
            ))
            .arg("--bind-address=127.0.0.1")
            // Nothing here reads the controller-manager's health port: serve none, so no
            // port is chosen at all (0 turns secure serving off; it is not `Required`).
            .arg("--secure-port=0")
            .arg("--port=0")
            .arg("--v=1");
        self.spawn("kube-controller-manager", &mut kcm, &dir, false)?;
        self.cp.start_scheduler("[]").await?;

        // containerd with the CNI bridge.
        let cd = dir.join("containerd");
        std::fs::create_dir_all(&cd)?;
        std::fs::create_dir_all(dir.join("cni/net.d"))?;
        std::fs::create_dir_all(dir.join("cni/ipam"))?;
        let sock = cd.join("containerd.sock");
        std::fs::write(
            cd.join("config.toml"),
            containerd_config(&cd, &dir.join("cni/net.d")),
        )?;
        std::fs::write(
            dir.join("cni/net.d/10-railguard-bridge.conflist"),
            cni_config(&dir.join("cni/ipam")).to_string(),
        )?;
        let mut containerd = Command::new("containerd");
        containerd.arg("--config").arg(cd.join("config.toml"));
        self.spawn("containerd", &mut containerd, &dir, true)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while sh("ctr", &["-a", &sock.display().to_string(), "version"]).is_err() {
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("containerd did not answer on {} after 60s", sock.display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }

        // kubelet.
        let kl = dir.join("kubelet");
        for sub in ["pki", "volume-plugins"] {
            std::fs::create_dir_all(kl.join(sub))?;
        }
        let mut kubelet = Command::new(node_binary(&bin, "kubelet")?);
        kubelet
            .arg(format!("--kubeconfig={}", node_kc.display()))
            .arg(format!("--hostname-override={REAL_NODE_NAME}"))
            .arg(format!("--node-ip={}", self.ip))
            .arg("--register-node=true")
            .arg("--container-runtime=remote")
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                sock.display()
            ))
            .arg("--runtime-request-timeout=5m")
            .arg("--cgroup-driver=cgroupfs")
            .arg("--fail-swap-on=false")
            .arg("--pod-infra-container-image=k8s.gcr.io/pause:3.2")
            .arg(format!("--root-dir={}", kl.display()))
            .arg(format!("--cert-dir={}", kl.join("pki").display()))
            .arg(format!(
                "--volume-plugin-dir={}",
                kl.join("volume-plugins").display()
            ))
            .arg("--image-gc-high-threshold=100")
            .arg("--image-gc-low-threshold=99")
            .arg("--eviction-hard=memory.available<50Mi,nodefs.available<1%,imagefs.available<1%")
            .arg(format!("--client-ca-file={}", ca.display()))
            .arg("--anonymous-auth=false")
            .arg("--authorization-mode=Webhook")
            .arg("--read-only-port=0")
            // A memory-backed emptyDir gets its sizeLimit as the tmpfs size (/dev/shm).
            .arg("--feature-gates=SizeMemoryBackedVolumes=true")
            .arg("--v=1");
        let kubelet_started = Instant::now();
        self.spawn("kubelet", &mut kubelet, &dir, true)?;

        let mut proxy = Command::new(node_binary(&bin, "kube-proxy")?);
        proxy
            .arg(format!("--kubeconfig={}", proxy_kc.display()))
            .arg("--proxy-mode=iptables")
            .arg(format!("--hostname-override={REAL_NODE_NAME}"))
            .arg("--cluster-cidr=10.244.0.0/16")
            // root here may lack CAP_SYS_RESOURCE.
            .arg("--oom-score-adj=0")
            .arg("--conntrack-max-per-core=0")
            .arg("--metrics-bind-address=127.0.0.1:10249")
            .arg("--healthz-bind-address=127.0.0.1:10256")
            .arg("--v=1");
        self.spawn("kube-proxy", &mut proxy, &dir, true)?;

        let nodes: Api<Node> = Api::all(self.client());
        let start = Instant::now();
        let mut last = String::from("no Node yet");
        loop {
            self.check_alive()?;
            let seen = nodes.get(REAL_NODE_NAME).await.ok();
            if let Some(n) = &seen {
                last = format!(
                    "conditions {:?}, taints {:?}",
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .map(|cs| cs
                            .iter()
                            .map(|c| format!("{}={}", c.type_, c.status))
                            .collect::<Vec<_>>()),
                    n.spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .map(|ts| ts.iter().map(|t| t.key.clone()).collect::<Vec<_>>())
                );
            }
            let ready = seen.is_some_and(|n| {
                let ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let tainted = n.spec.and_then(|s| s.taints).is_some_and(|t| !t.is_empty());
                ready && !tainted
            });
            if ready {
                break;
            }
            if start.elapsed() > NODE_READY_TIMEOUT {
                bail!("node {REAL_NODE_NAME} not Ready and untainted after {NODE_READY_TIMEOUT:?}; last seen: {last}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "railguard-tests: node Ready {:.1}s after kubelet started",
            kubelet_started.elapsed().as_secs_f64()
        );
        self.wait_service_account("default").await
    }

    fn spawn(
        &mut self,
        name: &'static str,
        cmd: &mut Command,
        dir: &Path,
        node_side: bool,
    ) -> Result<()> {
        let pid_dir = if node_side {
            dir.join("node")
        } else {
            dir.to_path_buf()
        };
        self.procs
            .push(crate::spawn_logged(name, cmd, dir, &pid_dir)?);
        Ok(())
    }

    /// Fails if a process of the node or the control plane has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for crate::Proc { name, child } in &mut self.procs {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{name} exited with {status}; see {}/{name}.log",
                    self.cp.log_dir().display()
                );
            }
        }
        self.cp.check_alive()
    }

    /// Waits until kube-controller-manager has created a ServiceAccount and its token in
    /// the `default` namespace (pods are rejected before).
    async fn wait_service_account(&self, namespace: &str) -> Result<()> {
        wait_service_account(&self.client(), namespace).await
    }

    /// Keep the logs when this node is dropped (a test that failed without panicking).
    pub fn keep_logs(&mut self) {
        self.cp.keep_logs = true;
    }

    /// The control plane (clients, kubeconfig, logs).
    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    /// An admin client.
    pub fn client(&self) -> kube::Client {
        self.cp.client()
    }

    /// The node's IP (the API server's advertised address too).
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// Start-up time, from the lock to a Ready node.
    pub fn startup_time(&self) -> Duration {
        self.started
    }

    /// Where logs and the node's files live.
    pub fn dir(&self) -> &Path {
        self.cp.log_dir()
    }

    fn containerd_socket(&self) -> PathBuf {
        self.dir().join("containerd/containerd.sock")
    }

    /// Imports OCI archives into containerd's `k8s.io` namespace (where kubelet looks).
    pub fn import_images(&self, archives: &[PathBuf]) -> Result<()> {
        let sock = self.containerd_socket().display().to_string();
        for a in archives {
            sh(
                "ctr",
                &[
                    "-a",
                    &sock,
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    &a.display().to_string(),
                ],
            )
            .with_context(|| format!("importing {}", a.display()))?;
        }
        Ok(())
    }

    /// Advertises extended resources the documented way (a PATCH of the Node's status
    /// capacity; kubelet copies them to allocatable), e.g. `nvidia.com/gpu: 8`.
    pub async fn advertise(&self, resources: &[(&str, &str)]) -> Result<()> {
        let capacity: BTreeMap<String, String> = resources
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let nodes: Api<Node> = Api::all(self.client());
        nodes
            .patch_status(
                REAL_NODE_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "capacity": capacity } })),
            )
            .await
            .context("patching the node's capacity")?;
        eventually(
            Duration::from_secs(60),
            "kubelet to copy the advertised capacity to allocatable",
            || async {
                let n = nodes.get(REAL_NODE_NAME).await?;
                let alloc = n.status.and_then(|s| s.allocatable).unwrap_or_default();
                let copied = resources
                    .iter()
                    .all(|(k, v)| alloc.get(*k).is_some_and(|q| q.0 == *v));
                Ok(if copied {
                    Ok(())
                } else {
                    Err(NotYet(format!("allocatable {alloc:?}")))
                })
            },
        )
        .await
    }
}

/// Waits until the namespace's `default` ServiceAccount has its token Secret.
pub async fn wait_service_account(client: &kube::Client, namespace: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    eventually(
        Duration::from_secs(120),
        &format!("ServiceAccount {namespace}/default with a token"),
        || async {
            Ok(sas
                .get_opt("default")
                .await?
                .and_then(|sa| sa.secrets)
                .filter(|s| !s.is_empty())
                .map(|_| ()))
        },
    )
    .await
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.cp.keep_logs = true;
        }
        run_teardown(self.dir(), false);
        for crate::Proc { child, .. } in &mut self.procs {
            // The script stopped them; collect the exit statuses.
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(HOST_ACTIVE);
    }
}

fn containerd_config(dir: &Path, cni_conf: &Path) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{dir}/containerd.sock"
[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "k8s.gcr.io/pause:3.2"
  # root here may lack CAP_SYS_RESOURCE: the sandbox's oom_score_adj -998 would make runc fail.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  # With a remote runtime the CNI configuration is containerd's, not kubelet's.
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        dir = dir.display(),
        cni = cni_conf.display(),
    )
}

fn cni_config(ipam_dir: &Path) -> serde_json::Value {
    json!({
        "cniVersion": "0.4.0",
        "name": "railguard-pods",
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local", "dataDir": ipam_dir.display().to_string(),
                    "ranges": [[{ "subnet": POD_CIDR }]], "routes": [{ "dst": "0.0.0.0/0" }],
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    })
}
