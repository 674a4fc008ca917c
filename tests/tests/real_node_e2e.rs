//! railguard as an operator deploys it: a real node (kubelet, containerd, kube-proxy,
//! kube-controller-manager 1.20), the component images built with buildah and imported into
//! containerd, and `charts/railguard` installed by the real Helm (`helm upgrade --install`,
//! `tests/scripts/helm.sh`'s binary from `RAILGUARD_HELM_BIN_DIR`) with
//! `tests/values/real-node.yaml` and a values file of this run's paths. Nothing the
//! components run with is written here: args and env come from the chart, binaries from the
//! images.
//!
//! The flow, on running pods:
//! - the webhook provisions its own certificate and caBundle; a pod created through the API
//!   is mutated by the in-cluster webhook through its Service;
//! - the prober DaemonSet, the default image with the shipped h100-ndr profile (the native
//!   NCCL loopback), certifies the node from its simulated hardware (a sysfs tree on the
//!   node) and the CUDA and NCCL test doubles the chart mounts as the node's GPU libraries,
//!   and publishes labels, condition and certificate;
//! - a training pod is placed by the chart's scheduler through its extender sidecar and
//!   runs, with NCCL_IB_HCA, NCCL_SOCKET_IFNAME, a /dev/shm of the profile's size and
//!   IPC_LOCK in the running container;
//! - a port taken down in the node's sysfs makes the prober fail the node: new training
//!   pods stay Pending (the extender's reason in the events of one that skipped the
//!   injected affinity), while a pod without GPUs still runs;
//! - the disruption series (issue #43): dry-run training pod creates at 64/s over 8
//!   clients while the webhook goes through 20 disruptions (`helm upgrade` with a changed
//!   pod template, `helm rollback`, a deleted pod, an evicted pod, SIGKILL of one of two
//!   replicas; four of each): no admission fails outside a SIGKILL window, and those inside
//!   are of the kinds kube-apiserver does not retry; then the scheduler with its extender
//!   sidecar is rolled three times while training pods are placed, none hitting an
//!   extender error;
//! - webhook pods evicted one at a time: the PodDisruptionBudget refuses the second while
//!   the first is replaced, and admission keeps answering throughout;
//! - `helm uninstall` removes railguard's workloads, webhook registrations and the chart's
//!   FabricProfiles; its post-delete hook Job runs on the kubelet and takes railguard's
//!   labels, condition and any railguard taint off the Node; the FabricProfile CRD and the
//!   Node's certificate stay (README, "Install").
//!
//! One test: only one real node fits on a machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::Client;
use railguard_api::{keys, FabricProfile};
use railguard_tests::helm::{chart_dir, documents, Helm};
use railguard_tests::install::wait_workloads_ready;
use railguard_tests::node::{wait_service_account, REAL_NODE_NAME};
use railguard_tests::{
    eventually, failed_scheduling_messages, workspace_binary, workspace_root, RealNode,
};
use serde_json::{json, Value};
use sha2::Digest as _;

const RELEASE: &str = "railguard";
const NAMESPACE: &str = "railguard";
const TRAINING: &str = "training";
/// A namespace that has not opted in: its GPU pods are never sent to the webhook.
const INFERENCE: &str = "inference";
const PROFILE: &str = "h100-ndr";
const TESTBOX: &str = "localhost/railguard-testbox:dev";
/// The rail the fault takes down (a rail of the h100-ndr profile).
const FAULT_RAIL: &str = "mlx5_3";

fn bin_dir() -> Result<PathBuf> {
    let prober = workspace_binary("railguard-prober-cli", "railguard-prober")?;
    for (pkg, name) in [
        ("railguard-webhook-cli", "railguard-webhook"),
        ("railguard-extender-cli", "railguard-extender"),
    ] {
        workspace_binary(pkg, name)?;
    }
    Ok(prober.parent().context("binary dir")?.to_path_buf())
}

/// The images the node runs: the components' default images (no prober-sim: the prober's
/// default image certifies the simulated node), the chart's scheduler, the sandbox and the
/// test's own pods.
const IMAGES: [&str; 6] = [
    "webhook",
    "extender",
    "prober",
    "kube-scheduler",
    "pause",
    "testbox",
];

/// Builds the images with tests/scripts/build-images.sh and returns their archives.
fn build_images(out: &Path, bins: &Path, kube_bin: &Path) -> Result<Vec<PathBuf>> {
    let t0 = Instant::now();
    let status = Command::new("bash")
        .arg(workspace_root().join("tests/scripts/build-images.sh"))
        .arg(out)
        .args(IMAGES)
        .env("RAILGUARD_BIN_DIR", bins)
        .env("RAILGUARD_KUBE_BIN_DIR", kube_bin)
        .status()
        .context("running build-images.sh")?;
    ensure!(status.success(), "build-images.sh failed ({status})");
    eprintln!("images built in {:.1}s", t0.elapsed().as_secs_f64());
    let list = std::fs::read_to_string(out.join("images.txt"))?;
    Ok(list
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(PathBuf::from)
        .collect())
}

/// The CUDA and NCCL test doubles in `dir` (mounted into the prober pods through the chart's
/// `prober.gpuLibraries`), with the simulated node's GPUs as the CUDA double's devices: the
/// prober then allocates every rail's GPU memory through the real driver-loading code.
fn gpu_libraries(bins: &Path, sim_node: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    railguard_gpu::doubles::build(dir)?;
    let out = Command::new(bins.join("railguard-prober"))
        .args(["discover", "--json", "--sysfs-root"])
        .arg(sim_node)
        .output()?;
    let found: Value = serde_json::from_slice(&out.stdout).context("discover --json")?;
    let ids: Vec<&str> = found["gpus"]
        .as_array()
        .context("discovered GPUs")?
        .iter()
        .filter_map(|g| g["pciBusId"].as_str())
        .collect();
    ensure!(ids.len() == 8, "the simulated node has {} GPUs", ids.len());
    std::fs::write(dir.join("railguard-cuda-double.pci"), ids.join("\n"))?;
    Ok(())
}

/// The values of this run, over tests/values/real-node.yaml: the node's simulated tree and
/// GPU libraries, the NCCL plugin and the node file in the test's own directory (not the
/// host's /opt, /run).
fn run_values(sim_node: &Path, gpu_libs: &Path, nccl_dirs: (&Path, &Path)) -> Result<String> {
    Ok(serde_yaml_ng::to_string(&json!({
        "prober": {
            "simulation": {"hostPath": sim_node.display().to_string()},
            "gpuLibraries": {"hostPath": gpu_libs.display().to_string()},
        },
        "ncclPlugin": {
            "hostDir": nccl_dirs.0.display().to_string(),
            "configDir": nccl_dirs.1.display().to_string(),
        },
    }))?)
}

/// `helm upgrade --install` of the chart into [`NAMESPACE`] with tests/values/real-node.yaml
/// and `values_file`, against the node's control plane; returns the release's objects
/// (`helm get manifest`).
fn helm_install(helm: &Helm, kubeconfig: &Path, values_file: &Path) -> Result<Vec<Value>> {
    let real_node = workspace_root().join("tests/values/real-node.yaml");
    let out = helm.on_cluster(
        kubeconfig,
        [
            "upgrade".as_ref(),
            "--install".as_ref(),
            RELEASE.as_ref(),
            chart_dir().as_os_str(),
            "--namespace".as_ref(),
            NAMESPACE.as_ref(),
            "-f".as_ref(),
            real_node.as_os_str(),
            "-f".as_ref(),
            values_file.as_os_str(),
        ] as [&std::ffi::OsStr; 10],
    )?;
    eprintln!("{}", out.trim());
    let manifest = helm.on_cluster(kubeconfig, ["get", "manifest", RELEASE, "-n", NAMESPACE])?;
    Ok(documents(&manifest)?.into_iter().map(|d| d.obj).collect())
}

/// Namespaces as 1.21+ labels them: the chart's webhook excludes namespaces by
/// `kubernetes.io/metadata.name`, which 1.20 does not set by itself.
async fn create_namespace(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("kubernetes.io/metadata.name".into(), name.into());
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": l},
    }))?;
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("railguard-tests").force(),
            &Patch::Apply(&ns),
        )
        .await
        .with_context(|| format!("namespace {name}"))?;
    wait_service_account(client, name).await
}

fn training_pod(name: &str, annotations: &[(&str, &str)], gpus: Option<u32>) -> Result<Pod> {
    let resources = match gpus {
        Some(n) => json!({"limits": {"nvidia.com/gpu": n.to_string()}}),
        None => json!({}),
    };
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}, "annotations": annotations},
        "spec": {
            "schedulerName": "railguard-scheduler",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "trainer",
                "image": TESTBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c",
                    "env | sort; grep CapEff /proc/self/status; df -k /dev/shm; echo railguard-ready; exec sleep 3600"],
                "resources": resources,
            }],
        },
    }))?)
}

/// A training pod of a `delivery: Plugin` profile that runs `railguard-prober nccl-env` (the
/// prober image), once per container start, seeing `visible_gpus` and the node's simulated
/// RDMA devices as its own (`--sysfs-root`: the container has no HCA here). It restarts
/// after each run, so every run is a new process in the same pod, with the pod's mounts and
/// environment, as a new NCCL process would be.
fn plugin_pod(name: &str, sim_node: &Path, visible_gpus: &[u64]) -> Result<Pod> {
    let visible: Vec<String> = visible_gpus.iter().map(u64::to_string).collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "schedulerName": "railguard-scheduler",
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Always",
            "containers": [{
                "name": "trainer",
                "image": "localhost/railguard-prober:dev",
                "imagePullPolicy": "Never",
                "args": ["nccl-env", "--sysfs-root", "/sim"],
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": visible.join(",")}],
                // The simulated tree is in the test's private directory.
                "securityContext": {"runAsUser": 0},
                "resources": {"limits": {"nvidia.com/gpu": "2"}},
                "volumeMounts": [{"name": "sim", "mountPath": "/sim", "readOnly": true}],
            }],
            "volumes": [{"name": "sim", "hostPath": {"path": sim_node.display().to_string(), "type": "Directory"}}],
        },
    }))?)
}

/// The `NCCL_IB_HCA` a run of [`plugin_pod`] printed, as a set of `hca:port`, and the log.
async fn plugin_answer(pods: &Api<Pod>, name: &str) -> Result<(Option<Vec<String>>, String)> {
    let text = pods
        .logs(name, &LogParams::default())
        .await
        .unwrap_or_default();
    let hca = env_line(&text, "NCCL_IB_HCA").map(|v| {
        let mut rails: Vec<String> = v
            .trim_start_matches('=')
            .split(',')
            .map(str::to_string)
            .collect();
        rails.sort();
        rails
    });
    Ok((hca, text))
}

async fn wait_running(pods: &Api<Pod>, name: &str, timeout: Duration) -> Result<Pod> {
    eventually(timeout, &format!("pod {name} Running"), || async {
        let p = pods.get(name).await?;
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase == "Failed" || phase == "Succeeded" {
            bail!("pod {name} ended: {:?}", p.status);
        }
        Ok((phase == "Running").then_some(p))
    })
    .await
}

async fn logs_until(pods: &Api<Pod>, name: &str, marker: &str) -> Result<String> {
    eventually(
        Duration::from_secs(60),
        &format!("{marker} in {name}'s log"),
        || async {
            let text = pods
                .logs(name, &LogParams::default())
                .await
                .unwrap_or_default();
            Ok(text.contains(marker).then_some(text))
        },
    )
    .await
}

/// A memory quantity as kubelet reports it (`24632384Ki`, `64Gi`, bytes), in KiB.
fn kib(q: &str) -> Option<u64> {
    let (num, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "" => n / 1024,
        "Ki" => n,
        "Mi" => n << 10,
        "Gi" => n << 20,
        "Ti" => n << 30,
        _ => return None,
    })
}

fn env_line<'a>(log: &'a str, var: &str) -> Option<&'a str> {
    log.lines().find_map(|l| l.strip_prefix(&format!("{var}=")))
}

/// The node's labels, condition and certificate as the prober published them.
async fn fabric_state(
    nodes: &Api<Node>,
) -> Result<(Option<String>, Option<String>, Option<Value>)> {
    let n = nodes.get(REAL_NODE_NAME).await?;
    let label = n
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::LABEL_FABRIC).cloned());
    let cond = n
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == keys::CONDITION_FABRIC_READY)
        .map(|c| format!("{} {}", c.status, c.reason.unwrap_or_default()));
    let cert = n
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_CERTIFICATE))
        .and_then(|c| serde_json::from_str(c).ok());
    Ok((label, cond, cert))
}

/// Evicts a pod through the policy/v1beta1 Eviction subresource (1.20's); returns the
/// HTTP status (201 evicted, 429 refused by a PodDisruptionBudget). Plain HTTP: the kube
/// client retries a 429 until the budget allows it, which would hide the refusal.
async fn evict(node: &RealNode, ns: &str, name: &str) -> Result<u16> {
    let cp = node.control_plane();
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cp.ca_pem().as_bytes())?)
        .build()?;
    let body = json!({
        "apiVersion": "policy/v1beta1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns},
    });
    let resp = http
        .post(format!(
            "{}/api/v1/namespaces/{ns}/pods/{name}/eviction",
            cp.server_url()
        ))
        .bearer_auth(cp.admin_token())
        .json(&body)
        .send()
        .await
        .context("eviction request")?;
    Ok(resp.status().as_u16())
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mutated(p: &Pod) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(keys::ANNOTATION_MUTATIONS))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_runs_on_a_real_node() -> Result<()> {
    let bins = bin_dir()?;
    let mut node = RealNode::start().await?;
    let result = scenario(&node, &bins).await;
    if result.is_err() {
        node.keep_logs();
        eprintln!("logs of the failed run: {}", node.dir().display());
    }
    result
}

async fn scenario(node: &RealNode, bins: &Path) -> Result<()> {
    let client = node.client();
    let dir = node.dir().to_path_buf();
    eprintln!("real node up in {:.1}s", node.startup_time().as_secs_f64());

    // The node's simulated hardware, as the prober will read it through its hostPath.
    let sim_node = dir.join("sim-node");
    let out = Command::new(bins.join("railguard-prober"))
        .args(["sim-sysfs", "--model"])
        .arg(workspace_root().join("prober/models/dgx-h100.yaml"))
        .arg("--out")
        .arg(&sim_node)
        .output()?;
    ensure!(
        out.status.success(),
        "sim-sysfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let gpu_libs = dir.join("gpu-libs");
    gpu_libraries(bins, &sim_node, &gpu_libs)?;

    let kube_bin = railguard_tests::control_plane_binaries()?;
    let archives = build_images(&dir.join("images"), bins, &kube_bin)?;
    node.import_images(&archives)?;

    // What GPU Feature Discovery and the device plugins would say about this node.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            REAL_NODE_NAME,
            &PatchParams::apply("railguard-tests").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": REAL_NODE_NAME, "labels": {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                }},
            })),
        )
        .await?;
    node.advertise(&[
        ("nvidia.com/gpu", "8"),
        ("rdma/rdma_shared_device_a", "100"),
    ])
    .await?;

    // Install: the namespaces, then the chart with Helm (the FabricProfile CRD comes with
    // it); wait for the workloads.
    create_namespace(&client, "kube-system", &[]).await?;
    create_namespace(&client, NAMESPACE, &[]).await?;
    // The chart's default scope is opt-in: the training namespace carries the label.
    create_namespace(
        &client,
        TRAINING,
        &[
            ("railguard.io/exemptions", "allowed"),
            (keys::LABEL_INJECT, "true"),
        ],
    )
    .await?;
    create_namespace(&client, INFERENCE, &[]).await?;
    let (plugin_dir, config_dir) = (dir.join("nccl-plugin"), dir.join("nccl-config"));
    let values_file = dir.join("run-values.yaml");
    std::fs::write(
        &values_file,
        run_values(&sim_node, &gpu_libs, (&plugin_dir, &config_dir))?,
    )?;
    let helm = Helm::new()?;
    let kubeconfig = node.control_plane().kubeconfig_path();
    let t_install = Instant::now();
    let objects = helm_install(&helm, kubeconfig, &values_file)?;
    wait_workloads_ready(&client, NAMESPACE, &objects, Duration::from_secs(300)).await?;
    eprintln!("chart ready in {:.1}s", t_install.elapsed().as_secs_f64());

    // The webhook's self-managed CA is in its MutatingWebhookConfiguration.
    let hooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(client.clone());
    let hook = hooks.list(&ListParams::default()).await?.items;
    let hook = hook
        .iter()
        .find(|h| {
            h.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(RELEASE))
        })
        .context("the chart's MutatingWebhookConfiguration")?;
    for w in hook.webhooks.iter().flatten() {
        let ca = w
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.len())
            .unwrap_or(0);
        ensure!(ca > 0, "webhook {} has no caBundle", w.name);
    }

    // The prober certifies the node. Its condition goes through the status subresource
    // right after the labels and annotation: wait for both, not the labels alone.
    let (cond, cert) = eventually(
        Duration::from_secs(240),
        "the prober's certificate and condition",
        || async {
            let (label, cond, cert) = fabric_state(&nodes).await?;
            let published = label.as_deref() == Some(keys::fabric::CERTIFIED)
                && cond.as_deref().is_some_and(|c| c.starts_with("True"));
            Ok(published.then_some(cert.map(|c| (cond, c))).flatten())
        },
    )
    .await?;
    ensure!(
        cond.as_deref().is_some_and(|c| c.starts_with("True")),
        "condition {:?}",
        cond
    );
    ensure!(
        cert["profile"] == PROFILE,
        "certificate profile {}",
        cert["profile"]
    );
    ensure!(
        cert["verdict"] == "certified",
        "certificate verdict {}",
        cert["verdict"]
    );
    let rails = cert["rails"].as_array().map(Vec::len).unwrap_or(0);
    ensure!(rails == 8, "certificate has {rails} rails");
    // The shipped profile's NCCL loopback, native: one rank per GPU over every rail, through
    // the NCCL library the chart's gpuLibraries chose over the image's (its sha256 and the
    // version its ncclGetVersion answered), at the simulated fabric's bus bandwidth.
    let nccl = &cert["nccl"];
    ensure!(
        nccl["ranks"] == 8
            && nccl["transport"] == "IB"
            && nccl["gdr"] == true
            && nccl["hcas"].as_array().map(Vec::len) == Some(8)
            && nccl["busbwPlateauGBps"].as_f64().is_some_and(|b| b >= 40.0),
        "the native NCCL loopback: {nccl}"
    );
    let double = sha2::Sha256::digest(std::fs::read(gpu_libs.join("libnccl.so.2"))?);
    ensure!(
        cert["software"]["libnccl"] == hex_string(&double) && cert["software"]["nccl"] == "2.21.5",
        "the chosen NCCL (the double, 2.21.5) in the certificate: {}",
        cert["software"]
    );
    // GPU memory on every rail came through the driver library the chart mounted: the CUDA
    // double reports no DMA-BUF support, so Auto registered by peermem and says why.
    for r in cert["rails"].as_array().into_iter().flatten() {
        let g = &r["gpuMemory"];
        ensure!(
            g["registration"] == "peermem"
                && g["unavailable"][0]
                    .as_str()
                    .is_some_and(|u| u.contains("does not support DMA-BUF export"))
                && r["writeBwGpuGbps"].as_f64().is_some_and(|bw| bw > 0.0),
            "rail {} GPU memory: {r}",
            r["hca"]
        );
    }

    // A training pod: mutated through the Service, placed through the extender, running.
    let pods: Api<Pod> = Api::namespaced(client.clone(), TRAINING);
    pods.create(
        &PostParams::default(),
        &training_pod("trainer-0", &[], Some(1))?,
    )
    .await
    .context("creating trainer-0")?;
    let p = wait_running(&pods, "trainer-0", Duration::from_secs(120)).await?;
    ensure!(
        mutated(&p),
        "trainer-0 was not mutated: {:?}",
        p.metadata.annotations
    );
    // The same pod where nobody opted in: admitted as submitted (a dry run returns the
    // object every admission webhook made of it).
    let untouched = Api::<Pod>::namespaced(client.clone(), INFERENCE)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &training_pod("server-0", &[], Some(1))?,
        )
        .await
        .context("dry-run pod in a namespace that did not opt in")?;
    ensure!(
        !mutated(&untouched)
            && untouched
                .spec
                .as_ref()
                .is_some_and(|s| s.affinity.is_none()),
        "a GPU pod outside the opt-in scope was changed: {:?}",
        untouched.metadata.annotations
    );
    let profile: FabricProfile = Api::<FabricProfile>::all(client.clone())
        .get(PROFILE)
        .await?;
    let log = logs_until(&pods, "trainer-0", "railguard-ready").await?;
    let hca = env_line(&log, "NCCL_IB_HCA").context("NCCL_IB_HCA in the container")?;
    ensure!(
        hca == profile.spec.nccl_ib_hca(),
        "NCCL_IB_HCA={hca}, profile says {}",
        profile.spec.nccl_ib_hca()
    );
    ensure!(
        env_line(&log, "NCCL_SOCKET_IFNAME") == Some("=eth0"),
        "NCCL_SOCKET_IFNAME in {log}"
    );
    let cap_eff = log
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .context("CapEff in the log")?;
    ensure!(
        cap_eff & (1 << 14) != 0,
        "no CAP_IPC_LOCK in CapEff {cap_eff:x}"
    );
    let shm_kib = log
        .lines()
        .find(|l| l.trim_end().ends_with("/dev/shm"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .context("df of /dev/shm in the log")?;
    // kubelet sizes a memory-backed emptyDir at its sizeLimit, capped by the memory the pod
    // may use (here the node's allocatable: the test machine has less than 64Gi), instead
    // of tmpfs' default of half the RAM.
    let alloc_kib = nodes
        .get(REAL_NODE_NAME)
        .await?
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get("memory").map(|q| q.0.clone()))
        .as_deref()
        .and_then(kib)
        .context("the node's allocatable memory")?;
    let want_kib = (64u64 << 20).min(alloc_kib);
    ensure!(
        shm_kib == want_kib,
        "/dev/shm is {shm_kib} KiB; the profile's 64Gi capped by allocatable {alloc_kib} KiB is {want_kib}"
    );
    let shm_limit = p
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| {
            v.iter()
                .find_map(|v| v.empty_dir.as_ref()?.size_limit.clone())
        });
    ensure!(
        shm_limit.as_ref().map(|q| q.0.as_str()) == Some("64Gi"),
        "the injected /dev/shm sizeLimit is {shm_limit:?}"
    );
    pods.delete("trainer-0", &DeleteParams::default()).await?;

    // delivery: Plugin. The prober installed the plugin and writes the node file; a pod of
    // the profile gets NCCL_ENV_PLUGIN, the node file's path and both directories mounted
    // instead of NCCL_IB_HCA, and the plugin's rules in it answer the healthy rails that
    // serve the GPUs it sees.
    ensure!(
        plugin_dir.join("libnccl-env-railguard.so").is_file(),
        "the prober did not install the plugin into {}",
        plugin_dir.display()
    );
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    profiles
        .patch(
            PROFILE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nccl": {"delivery": "Plugin"}}})),
        )
        .await
        .context("switching the profile to delivery: Plugin")?;
    // The pod sees two GPUs: one the fault rail serves, and one another rail serves.
    let gpu_rails: Vec<(u64, String)> = cert["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| {
            Some((
                g["gpu"].as_u64()?,
                format!(
                    "{}:{}",
                    g["preferredHca"].as_str()?,
                    g["port"].as_u64().unwrap_or(1)
                ),
            ))
        })
        .collect();
    let on_fault = gpu_rails
        .iter()
        .find(|(_, r)| r.starts_with(&format!("{FAULT_RAIL}:")))
        .with_context(|| format!("no GPU served by {FAULT_RAIL}: {gpu_rails:?}"))?;
    let elsewhere = gpu_rails
        .iter()
        .find(|(_, r)| *r != on_fault.1)
        .with_context(|| format!("every GPU served by {FAULT_RAIL}: {gpu_rails:?}"))?;
    let visible = [on_fault.0, elsewhere.0];
    let mut served = vec![on_fault.1.clone(), elsewhere.1.clone()];
    served.sort();
    // The webhook sees the edit through its watch: a dry-run create shows when.
    let probe = plugin_pod("plugin-probe", &sim_node, &visible)?;
    eventually(
        Duration::from_secs(60),
        "the webhook's Plugin delivery",
        || async {
            let p = pods.create(&railguard_tests::dry_run(), &probe).await?;
            let env: Vec<String> = p
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.env.iter().flatten())
                .map(|e| e.name.clone())
                .collect();
            Ok(if env.iter().any(|e| e == "NCCL_ENV_PLUGIN") {
                Ok(())
            } else {
                Err(railguard_tests::NotYet(format!("env {env:?}")))
            })
        },
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &plugin_pod("plugin-0", &sim_node, &visible)?,
    )
    .await
    .context("creating plugin-0")?;
    // restartPolicy Always: the phase stays Running between runs.
    wait_running(&pods, "plugin-0", Duration::from_secs(120)).await?;
    let answered = eventually(Duration::from_secs(120), "plugin-0's answer", || async {
        let (hca, text) = plugin_answer(&pods, "plugin-0").await?;
        Ok(hca.ok_or_else(|| railguard_tests::NotYet(format!("log {text:?}"))))
    })
    .await?;
    ensure!(
        answered == served,
        "plugin-0 answered NCCL_IB_HCA {answered:?}; the rails serving GPUs {visible:?} are {served:?}"
    );
    let hook = pods.get("plugin-0").await?;
    let c = &hook.spec.as_ref().context("plugin-0 spec")?.containers[0];
    let env_of = |n: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == n)
            .and_then(|e| e.value.clone())
    };
    ensure!(
        env_of("NCCL_IB_HCA").is_none()
            && env_of("NCCL_ENV_PLUGIN").as_deref()
                == Some(
                    plugin_dir
                        .join("libnccl-env-railguard.so")
                        .display()
                        .to_string()
                        .as_str()
                ),
        "plugin-0's env: {:?}",
        c.env
    );

    // `helm test`: the chart's verify-install Pod asks the webhook through its Service with
    // the CA it serves and finds the certified node.
    let t_test = Instant::now();
    let out = helm.on_cluster(
        kubeconfig,
        ["test", RELEASE, "-n", NAMESPACE, "--timeout", "5m"],
    )?;
    // The Pod exits 0 only when the webhook answered and a node is certified; Helm deletes
    // it on success (kept on failure, for its log), so uninstall leaves nothing behind.
    ensure!(
        out.contains("verify-install") && out.contains("Succeeded") && !out.contains("Failed"),
        "helm test: {out}"
    );
    eprintln!("helm test passed in {:.1}s", t_test.elapsed().as_secs_f64());

    // The disruption series (issue #43): admission load runs throughout (dry-run training
    // pod creates, ~64/s over 8 connections' worth of concurrent clients, failurePolicy
    // Fail), while the webhook is rolled by `helm upgrade` with a changed pod template,
    // rolled back by `helm rollback`, has a pod deleted, a pod evicted as a drain does, and
    // one of its two replicas SIGKILLed, four times each. Not one admission may fail except
    // inside a SIGKILL window; nothing generated is re-rolled, the Node's certificate and the
    // profiles stay the same objects.
    let kept_before = kept_state(&client).await?;
    disruption_series(node, &helm, kubeconfig, &client, &objects).await?;
    // The extender: the chart's scheduler (with its extender sidecar) is rolled while
    // training pods are placed through it.
    scheduler_rollout(&helm, kubeconfig, &client, &pods, &objects).await?;
    let kept_after = kept_state(&client).await?;
    ensure!(
        kept_after == kept_before,
        "helm upgrade and rollback changed generated secrets, caBundles, the Node's certificate or the profiles:\n{kept_before:?}\n->\n{kept_after:?}"
    );

    // A port goes down: the prober fails that rail, and the node, its other rails passing,
    // is `degraded` (partial certification: usableRails one short).
    let port = sim_node.join(format!("sys/class/infiniband/{FAULT_RAIL}/ports/1"));
    std::fs::write(port.join("state"), "1: DOWN\n")?;
    std::fs::write(port.join("phys_state"), "3: Disabled\n")?;
    nodes
        .patch(
            REAL_NODE_NAME,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {keys::ANNOTATION_RECERTIFY: "true"}}}),
            ),
        )
        .await?;
    // Labels first, then the condition: wait until the condition no longer says True.
    let failed = eventually(Duration::from_secs(240), "the node degraded", || async {
        let (label, cond, cert) = fabric_state(&nodes).await?;
        let published = label.as_deref() == Some(keys::fabric::DEGRADED)
            && cond.as_deref().is_some_and(|c| !c.starts_with("True"));
        Ok(published.then_some((cond, cert)))
    })
    .await?;
    ensure!(
        failed.0.as_deref().is_some_and(|c| c.starts_with("False")),
        "condition {:?}",
        failed.0
    );
    let reasons = failed
        .1
        .as_ref()
        .map(|c| c["reasons"].to_string())
        .unwrap_or_default();
    ensure!(
        reasons.contains(FAULT_RAIL),
        "certificate reasons {reasons}"
    );
    let cert = failed.1.clone().unwrap_or_default();
    let rails = cert["rails"].as_array().map(Vec::len).unwrap_or(0);
    ensure!(
        rails > 1 && cert["usableRails"] == json!(rails - 1),
        "usableRails {} of {rails} rails",
        cert["usableRails"]
    );
    let fault_rail = cert["rails"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["hca"] == FAULT_RAIL)
        .cloned()
        .unwrap_or_default();
    ensure!(
        fault_rail["verdict"] == "failed" && fault_rail["faults"][0] == "link-down",
        "the faulty rail {fault_rail}"
    );
    // The next run in plugin-0 (a new process in the same pod) reads the rewritten node
    // file: the failed rail is no longer answered, the healthy one still is.
    // kubelet restarts the finished container after a back-off that doubles from 10 s up
    // to 5 min: the next run comes within one back-off.
    let unhealthy = eventually(
        Duration::from_secs(330),
        "plugin-0 without the failed rail",
        || async {
            let (hca, text) = plugin_answer(&pods, "plugin-0").await?;
            Ok(match hca {
                // The run in between may see the invasive run's `pending`.
                Some(h) if h == [elsewhere.1.clone()] => Ok(text),
                _ => Err(railguard_tests::NotYet(format!("log {text:?}"))),
            })
        },
    )
    .await?;
    eprintln!("plugin-0 after the fault: {}", unhealthy.trim());
    pods.delete("plugin-0", &DeleteParams::default()).await?;

    // New training pods stay Pending; the extender says why for one that skipped the
    // injected affinity (its namespace allows exemptions); a CPU pod still runs.
    pods.create(
        &PostParams::default(),
        &training_pod("trainer-1", &[], Some(1))?,
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &training_pod("trainer-2", &[(keys::ANNOTATION_SKIP, "affinity")], Some(1))?,
    )
    .await?;
    pods.create(&PostParams::default(), &training_pod("cpu-0", &[], None)?)
        .await?;
    wait_running(&pods, "cpu-0", Duration::from_secs(120)).await?;
    let msgs = eventually(
        Duration::from_secs(90),
        "the extender's reason for trainer-2",
        || async {
            let m = failed_scheduling_messages(&client, TRAINING, "trainer-2").await?;
            Ok(m.iter()
                .any(|m| m.contains("railguard") && m.contains(FAULT_RAIL))
                .then_some(m))
        },
    )
    .await?;
    eprintln!("trainer-2 FailedScheduling: {msgs:?}");
    let m1 = eventually(
        Duration::from_secs(90),
        "trainer-1 FailedScheduling",
        || async {
            let m = failed_scheduling_messages(&client, TRAINING, "trainer-1").await?;
            Ok((!m.is_empty()).then_some(m))
        },
    )
    .await?;
    eprintln!("trainer-1 FailedScheduling: {m1:?}");
    for name in ["trainer-1", "trainer-2"] {
        let p = pods.get(name).await?;
        ensure!(
            p.spec.and_then(|s| s.node_name).is_none(),
            "{name} was placed on the degraded node (the extender and the webhook's affinity keep node-level rules)"
        );
    }

    // Webhook replicas: one may go, the PodDisruptionBudget keeps the other; admission keeps
    // answering (failurePolicy Fail: an outage would fail the creates).
    let sys_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let hook_pods: Vec<String> = sys_pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=webhook"))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    ensure!(hook_pods.len() == 2, "webhook pods {hook_pods:?}");
    let pdb_api = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        NAMESPACE,
        &kube::api::ApiResource {
            group: "policy".into(),
            version: "v1beta1".into(),
            api_version: "policy/v1beta1".into(),
            kind: "PodDisruptionBudget".into(),
            plural: "poddisruptionbudgets".into(),
        },
    );
    let pdb_name = format!("{RELEASE}-webhook");
    eventually(
        Duration::from_secs(60),
        "the webhook PDB to allow one disruption",
        || async {
            let pdb = pdb_api.get(&pdb_name).await?;
            let st = &pdb.data["status"];
            Ok((st["currentHealthy"] == 2 && st["disruptionsAllowed"] == 1).then_some(()))
        },
    )
    .await?;
    ensure!(
        evict(node, NAMESPACE, &hook_pods[0]).await? == 201,
        "first eviction refused"
    );
    let second = evict(node, NAMESPACE, &hook_pods[1]).await?;
    let status = pdb_api.get(&pdb_name).await?.data["status"].clone();
    ensure!(
        second == 429,
        "second eviction answered {second}, the PDB should refuse it (PDB status {status})"
    );
    let t = Instant::now();
    let mut i = 0;
    while t.elapsed() < Duration::from_secs(20) {
        let name = format!("during-eviction-{i}");
        let p = pods
            .create(&PostParams::default(), &training_pod(&name, &[], Some(1))?)
            .await
            .with_context(|| format!("admission failed for {name} after a webhook eviction"))?;
        ensure!(mutated(&p), "{name} was not mutated");
        pods.delete(&name, &DeleteParams::default()).await?;
        i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("{i} pods admitted and mutated while a webhook replica was replaced");
    wait_workloads_ready(&client, NAMESPACE, &objects, Duration::from_secs(180)).await?;

    // Uninstall: railguard's workloads, its webhook registrations and the chart's profiles
    // go; the CRD stays (deleting it would delete every profile anyone made with it). The
    // post-delete hook runs on the kubelet: railguard's labels, condition and taint leave the
    // Node, its certificate stays.
    let (label, cond, cert) = fabric_state(&nodes).await?;
    ensure!(
        label.is_some() && cond.is_some() && cert.is_some(),
        "before uninstall the Node carries railguard's label, condition and certificate: {label:?} {cond:?}"
    );
    nodes
        .patch(
            REAL_NODE_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": keys::TAINT_FABRIC_UNHEALTHY, "value": "degraded", "effect": "NoSchedule"}
            ]}})),
        )
        .await?;
    let t_uninstall = Instant::now();
    let out = helm.on_cluster(kubeconfig, ["uninstall", RELEASE, "-n", NAMESPACE])?;
    eprintln!(
        "{} ({:.1}s with the clean-up hook)",
        out.trim(),
        t_uninstall.elapsed().as_secs_f64()
    );
    uninstalled(&client, &objects).await?;
    let (label_after, cond_after, cert_after) = fabric_state(&nodes).await?;
    ensure!(
        label_after.is_none() && cond_after.is_none(),
        "helm uninstall left railguard's label or condition: {label_after:?} {cond_after:?}"
    );
    ensure!(cert_after == cert, "helm uninstall changed the certificate");
    let node = nodes.get(REAL_NODE_NAME).await?;
    let left: Vec<String> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| k.starts_with("railguard.io/"))
        .collect();
    ensure!(
        left.is_empty(),
        "helm uninstall left railguard taints: {left:?}"
    );
    Ok(())
}

/// After `helm uninstall`: none of the release's workloads, pods, webhook configurations,
/// namespaces or FabricProfiles is left, in any namespace; the FabricProfile CRD is.
async fn uninstalled(client: &Client, objects: &[Value]) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject};
    let of_release = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let names = |kind: &str| -> Vec<String> {
        objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    };
    ensure!(
        !names("Deployment").is_empty() && !names("DaemonSet").is_empty(),
        "the release had no workloads to remove: {:?}",
        objects
            .iter()
            .map(railguard_tests::install::object_ref)
            .collect::<Vec<_>>()
    );
    // What the release ran, by (group, version, kind, plural), 1.20's versions; listed in
    // every namespace (the probers may live in a namespace of their own).
    let resource = |group: &str, version: &str, kind: &str, plural: &str| ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    };
    let kinds = [
        resource("apps", "v1", "Deployment", "deployments"),
        resource("apps", "v1", "DaemonSet", "daemonsets"),
        resource("batch", "v1beta1", "CronJob", "cronjobs"),
        resource("batch", "v1", "Job", "jobs"),
        resource("", "v1", "Pod", "pods"),
        resource(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
        ),
        resource(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
        ),
    ];
    // A namespace the chart created goes too (the namespace controller empties it first).
    let release_namespaces = names("Namespace");
    eventually(
        Duration::from_secs(180),
        "railguard's workloads, pods, webhooks and namespaces gone",
        || async {
            let mut left = Vec::new();
            for ar in &kinds {
                let found = Api::<DynamicObject>::all_with(client.clone(), ar)
                    .list(&of_release)
                    .await?;
                left.extend(found.items.into_iter().map(|o| {
                    format!(
                        "{} {}/{}",
                        ar.kind,
                        o.metadata.namespace.unwrap_or_default(),
                        o.metadata.name.unwrap_or_default()
                    )
                }));
            }
            for ns in &release_namespaces {
                if Api::<Namespace>::all(client.clone())
                    .get_opt(ns)
                    .await?
                    .is_some()
                {
                    left.push(format!("Namespace {ns}"));
                }
            }
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(railguard_tests::NotYet(format!("left: {left:?}")))
            })
        },
    )
    .await?;
    Api::<CustomResourceDefinition>::all(client.clone())
        .get("fabricprofiles.railguard.io")
        .await
        .context("the FabricProfile CRD after helm uninstall")?;
    let profiles = names("FabricProfile");
    ensure!(
        profiles.contains(&PROFILE.to_string()),
        "the release rendered no {PROFILE} profile: {profiles:?}"
    );
    let api = Api::<FabricProfile>::all(client.clone());
    eventually(
        Duration::from_secs(60),
        "the chart's FabricProfiles gone",
        || async {
            let left: Vec<String> = api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .filter(|n| profiles.contains(n))
                .collect();
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(railguard_tests::NotYet(format!("left: {left:?}")))
            })
        },
    )
    .await?;
    eprintln!(
        "helm uninstall removed the workloads, webhooks and profiles {profiles:?}; the CRD stays"
    );
    Ok(())
}

/// What admission saw while the chart was upgraded: each create's latency, or its error.
/// One admission of the load: when it began (since the series began), how long it took,
/// and its error.
struct Admission {
    at: Duration,
    latency_ms: f64,
    error: Option<String>,
}

/// Creates per second the load offers (in all), and how many clients it spreads them over.
const LOAD_RATE: u32 = 64;
const LOAD_CLIENTS: u32 = 8;

/// Training pods created with `dryRun=All` (the webhooks run, sideEffects None; nothing is
/// stored or scheduled) at [`LOAD_RATE`] until `stop`; each must come back mutated.
async fn admission_load(
    pods: Api<Pod>,
    client_id: u32,
    began: Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<Admission> {
    let interval = Duration::from_secs_f64(f64::from(LOAD_CLIENTS) / f64::from(LOAD_RATE));
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut out = Vec::new();
    let mut next = Instant::now();
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let name = format!("load-{client_id}-{i}");
        i += 1;
        let at = began.elapsed();
        let t = Instant::now();
        let error = match training_pod(&name, &[], Some(1)) {
            Err(e) => Some(format!("{e:#}")),
            Ok(pod) => match pods.create(&params, &pod).await {
                Ok(p) if mutated(&p) => None,
                Ok(_) => Some("admitted unmutated".into()),
                Err(e) => Some(e.to_string()),
            },
        };
        out.push(Admission {
            at,
            latency_ms: t.elapsed().as_secs_f64() * 1e3,
            error: error.map(|e| format!("{name}: {e}")),
        });
        next += interval;
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        } else {
            next = now;
        }
    }
    out
}

/// The webhook pods not terminating.
async fn live_webhook_pods(client: &Client) -> Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/component=webhook"))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The webhook pods, (name, uid), not terminating.
async fn webhook_pods(client: &Client) -> Result<Vec<(String, String)>> {
    Ok(live_webhook_pods(client)
        .await?
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect())
}

/// Until both webhook replicas are ready, no webhook pod is terminating, and the Service
/// has both and only both as ready endpoints.
async fn webhook_settled(client: &Client) -> Result<()> {
    use k8s_openapi::api::core::v1::Endpoints;
    eventually(
        Duration::from_secs(180),
        "two ready webhook replicas behind the Service",
        || async {
            let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
                .list(&ListParams::default().labels("app.kubernetes.io/component=webhook"))
                .await?
                .items;
            let ready = pods
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                })
                .count();
            let ep = Api::<Endpoints>::namespaced(client.clone(), NAMESPACE)
                .get(&format!("{RELEASE}-webhook"))
                .await?;
            let subsets = ep.subsets.unwrap_or_default();
            let addresses: usize = subsets
                .iter()
                .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
                .sum();
            let not_ready: usize = subsets
                .iter()
                .map(|s| s.not_ready_addresses.as_ref().map_or(0, Vec::len))
                .sum();
            Ok((pods.len() == 2 && ready == 2 && addresses == 2 && not_ready == 0).then_some(()))
        },
    )
    .await
}

/// The host pid of the `railguard-webhook` process in pod `uid` (cgroupfs paths name the
/// pod, `pod<uid>`).
fn webhook_host_pid(uid: &str) -> Result<u32> {
    let underscored = uid.replace('-', "_");
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if !String::from_utf8_lossy(argv0).ends_with("railguard-webhook") {
            continue;
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cgroup.contains(&format!("pod{uid}")) || cgroup.contains(&format!("pod{underscored}")) {
            return Ok(pid);
        }
    }
    bail!("no railguard-webhook process in pod {uid}")
}

/// How a SIGKILLed replica's admissions fail (kube-apiserver calls a webhook once, with no
/// retry: k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go; client-go's
/// `Request.Do` retries a POST only on a 429 or 5xx answer with Retry-After, never on a
/// connection error: k8s.io/client-go/rest/request.go, `IsRetryableFunc` limited to GET).
fn sigkill_failure_kind(error: &str) -> &'static str {
    if error.contains("connection refused") {
        "dialed the dead replica before its endpoint was removed (connection refused)"
    } else if error.contains("EOF") || error.contains("connection reset") {
        "in flight on the killed process (EOF / connection reset)"
    } else if error.contains("timeout") || error.contains("deadline") {
        "sent to the killed process and never answered (timeout)"
    } else {
        "other"
    }
}

/// `helm upgrade --reuse-values` with the `railguard.io/e2e-rollout` pod annotation of
/// `component` (`webhook`, `scheduler`) set to `round`: a changed pod template, so it rolls.
fn roll_with_annotation(
    helm: &Helm,
    kubeconfig: &Path,
    component: &str,
    round: usize,
) -> Result<()> {
    let chart = chart_dir();
    let chart = chart.to_str().context("chart path")?;
    let annotation = format!("{component}.podAnnotations.railguard\\.io/e2e-rollout={round}");
    let out = tokio::task::block_in_place(|| {
        helm.on_cluster(
            kubeconfig,
            [
                "upgrade",
                RELEASE,
                chart,
                "-n",
                NAMESPACE,
                "--reuse-values",
                "--set-string",
                &annotation,
                "--wait",
                "--timeout",
                "5m",
            ],
        )
    })?;
    eprintln!("{}", out.trim());
    Ok(())
}

async fn disruption_series(
    node: &RealNode,
    helm: &Helm,
    kubeconfig: &Path,
    client: &Client,
    objects: &[Value],
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), TRAINING);
    webhook_settled(client).await?;
    let began = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..LOAD_CLIENTS)
        .map(|c| tokio::spawn(admission_load(pods.clone(), c, began, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // (kind, began, ended) of each disruption; SIGKILL windows end once both replicas are
    // ready behind the Service again.
    let mut disruptions: Vec<(&'static str, Duration, Duration)> = Vec::new();
    for round in 0..4 {
        // helm upgrade with a changed pod template: both replicas roll (maxSurge 1).
        let t = began.elapsed();
        roll_with_annotation(helm, kubeconfig, "webhook", round)?;
        webhook_settled(client).await?;
        let rolled = webhook_pods_with_rollout_annotation(client).await?;
        ensure!(
            rolled.len() == 2,
            "the upgrade rolled both webhook replicas: {rolled:?}"
        );
        disruptions.push(("helm upgrade", t, began.elapsed()));

        // helm rollback to the revision before: the replicas roll back.
        let t = began.elapsed();
        let out = tokio::task::block_in_place(|| {
            helm.on_cluster(
                kubeconfig,
                [
                    "rollback",
                    RELEASE,
                    "-n",
                    NAMESPACE,
                    "--wait",
                    "--timeout",
                    "5m",
                ],
            )
        })?;
        eprintln!("{}", out.trim());
        webhook_settled(client).await?;
        let rolled = webhook_pods_with_rollout_annotation(client).await?;
        ensure!(
            rolled.is_empty(),
            "the rollback restored the template of the revision before: {rolled:?}"
        );
        disruptions.push(("helm rollback", t, began.elapsed()));

        // A webhook pod deleted (its terminationGracePeriodSeconds applies).
        let t = began.elapsed();
        let hooks = webhook_pods(client).await?;
        Api::<Pod>::namespaced(client.clone(), NAMESPACE)
            .delete(&hooks[0].0, &DeleteParams::default())
            .await?;
        webhook_settled(client).await?;
        disruptions.push(("pod deleted", t, began.elapsed()));

        // A webhook pod evicted, as `kubectl drain` does (the PDB allows one).
        let t = began.elapsed();
        let hooks = webhook_pods(client).await?;
        let status = evict(node, NAMESPACE, &hooks[1].0).await?;
        ensure!(
            status == 201,
            "eviction of {} answered {status}",
            hooks[1].0
        );
        webhook_settled(client).await?;
        disruptions.push(("pod evicted", t, began.elapsed()));

        // SIGKILL of one of the two replicas' process; the kubelet restarts its container.
        let hooks = webhook_pods(client).await?;
        let pid = webhook_host_pid(&hooks[round % 2].1)?;
        let t = began.elapsed();
        let killed = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        ensure!(killed.success(), "kill -KILL {pid}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        webhook_settled(client).await?;
        // kube-proxy's rules follow the endpoints within its sync period.
        tokio::time::sleep(Duration::from_secs(2)).await;
        disruptions.push(("SIGKILL", t, began.elapsed()));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut admissions = Vec::new();
    for task in load {
        admissions.extend(task.await.context("admission load task")?);
    }
    wait_workloads_ready(client, NAMESPACE, objects, Duration::from_secs(300)).await?;
    let secs = began.elapsed().as_secs_f64();

    let in_sigkill = |a: &Admission| {
        disruptions.iter().any(|(kind, from, to)| {
            *kind == "SIGKILL"
                && a.at + Duration::from_millis(a.latency_ms as u64) >= *from
                && a.at <= *to
        })
    };
    let mut latencies: Vec<f64> = admissions
        .iter()
        .filter(|a| a.error.is_none())
        .map(|a| a.latency_ms)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        latencies
            .get((latencies.len().saturating_sub(1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let failed: Vec<&Admission> = admissions.iter().filter(|a| a.error.is_some()).collect();
    let outside: Vec<&str> = failed
        .iter()
        .filter(|a| !in_sigkill(a))
        .filter_map(|a| a.error.as_deref())
        .collect();
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for a in failed.iter().filter(|a| in_sigkill(a)) {
        *by_kind
            .entry(sigkill_failure_kind(a.error.as_deref().unwrap_or_default()))
            .or_default() += 1;
    }
    let mut kinds: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for (kind, from, to) in &disruptions {
        let e = kinds.entry(kind).or_default();
        e.0 += 1;
        e.1 = e.1.max((*to - *from).as_secs_f64());
    }
    eprintln!(
        "disruption series: {:.0} s, {} admissions ({:.1}/s) over {LOAD_CLIENTS} clients, {} disruptions {:?}",
        secs,
        admissions.len(),
        admissions.len() as f64 / secs,
        disruptions.len(),
        kinds
    );
    eprintln!(
        "| admissions | failed outside SIGKILL | failed in SIGKILL windows | p50 ms | p99 ms | max ms |"
    );
    eprintln!(
        "| {} | {} | {} | {:.1} | {:.1} | {:.1} |",
        admissions.len(),
        outside.len(),
        failed.len() - outside.len(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    for (kind, n) in &by_kind {
        eprintln!("SIGKILL failures, {kind}: {n}");
    }
    for a in failed.iter().take(20) {
        eprintln!(
            "failed at {:.1}s: {}",
            a.at.as_secs_f64(),
            a.error.as_deref().unwrap_or_default()
        );
    }
    ensure!(
        outside.is_empty(),
        "{} admissions failed outside SIGKILL windows: {:?}",
        outside.len(),
        &outside[..outside.len().min(10)]
    );
    ensure!(
        !by_kind.contains_key("other"),
        "a SIGKILL window saw a failure of no known kind: {:?}",
        failed
            .iter()
            .filter_map(|a| a.error.as_deref())
            .collect::<Vec<_>>()
    );
    ensure!(disruptions.len() >= 20, "{} disruptions", disruptions.len());
    ensure!(
        admissions.len() >= 5000 && admissions.len() as f64 / secs >= 50.0,
        "load too light: {} admissions in {secs:.0} s",
        admissions.len()
    );
    Ok(())
}

/// Reasons kube-scheduler gives when an extender call fails (v1.20
/// pkg/scheduler/core/generic_scheduler.go wraps the extender's error into the FitError's
/// event; the error names the extender's URL).
fn extender_error(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("extender") && (m.contains("eof") || m.contains("connection") || m.contains("post "))
}

/// The chart's scheduler rolled three times (`helm upgrade` with a changed pod template,
/// its extender a sidecar) while training pods are created one after another: each is
/// placed, none gets a FailedScheduling from an extender error.
async fn scheduler_rollout(
    helm: &Helm,
    kubeconfig: &Path,
    client: &Client,
    pods: &Api<Pod>,
    objects: &[Value],
) -> Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let placing = {
        let (pods, client, stop) = (pods.clone(), client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut waits = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let name = format!("through-scheduler-rollout-{i}");
                i += 1;
                let t = Instant::now();
                pods.create(&PostParams::default(), &training_pod(&name, &[], Some(1))?)
                    .await?;
                let placed = eventually(
                    Duration::from_secs(120),
                    &format!("{name} to be placed"),
                    || async {
                        let p = pods.get(&name).await?;
                        Ok::<_, anyhow::Error>(p.spec.and_then(|s| s.node_name).map(|_| ()))
                    },
                )
                .await;
                let events = failed_scheduling_messages(&client, TRAINING, &name).await?;
                placed?;
                waits.push(t.elapsed());
                let extender: Vec<_> = events.iter().filter(|m| extender_error(m)).collect();
                ensure!(
                    extender.is_empty(),
                    "{name} waited on an extender error: {extender:?}"
                );
                // Gone from the API at once (the kubelet stops its container later), so its
                // GPU is free for the next pod.
                pods.delete(
                    &name,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    },
                )
                .await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok::<_, anyhow::Error>(waits)
        })
    };
    for round in 0..3 {
        roll_with_annotation(helm, kubeconfig, "scheduler", round)?;
        wait_workloads_ready(client, NAMESPACE, objects, Duration::from_secs(300)).await?;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let waits = placing.await.context("placing task")??;
    let max = waits.iter().max().copied().unwrap_or_default();
    eprintln!(
        "scheduler rollouts: {} pods placed through 3 rollouts of the scheduler and its extender, longest wait {:.1} s, no extender error",
        waits.len(),
        max.as_secs_f64()
    );
    ensure!(waits.len() >= 3, "only {} pods placed", waits.len());
    Ok(())
}

/// The generated Secrets' data, the webhooks' caBundles, the Node's certificate and the
/// FabricProfiles' UIDs: what an upgrade must keep.
async fn kept_state(client: &Client) -> Result<BTreeMap<String, String>> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    let mut out = BTreeMap::new();
    for secret in Api::<Secret>::all(client.clone())
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")))
        .await?
    {
        let key = format!(
            "secret/{}/{}",
            secret.metadata.namespace.unwrap_or_default(),
            secret.metadata.name.unwrap_or_default()
        );
        let data: BTreeMap<String, String> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, hex_string(&sha2::Sha256::digest(&v.0))))
            .collect();
        out.insert(key, format!("{data:?}"));
    }
    ensure!(
        out.len() >= 3,
        "the release's generated Secrets (peer token, extender TLS, webhook TLS): {:?}",
        out.keys()
    );
    for mwc in Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&ListParams::default())
        .await?
    {
        for w in mwc.webhooks.unwrap_or_default() {
            let ca = w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default();
            out.insert(
                format!("caBundle/{}", w.name),
                hex_string(&sha2::Sha256::digest(&ca)),
            );
        }
    }
    let node = Api::<Node>::all(client.clone()).get(REAL_NODE_NAME).await?;
    out.insert(
        "node/certificate".into(),
        node.metadata
            .annotations
            .unwrap_or_default()
            .get(keys::ANNOTATION_CERTIFICATE)
            .cloned()
            .unwrap_or_default(),
    );
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    for p in profiles.list(&ListParams::default()).await? {
        out.insert(
            format!("profile/{}", p.metadata.name.unwrap_or_default()),
            p.metadata.uid.unwrap_or_default(),
        );
    }
    Ok(out)
}

/// The running (not terminating) webhook pods that carry the upgrade's rollout annotation.
async fn webhook_pods_with_rollout_annotation(client: &Client) -> Result<Vec<String>> {
    Ok(live_webhook_pods(client)
        .await?
        .into_iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("railguard.io/e2e-rollout"))
        })
        .filter_map(|p| p.metadata.name)
        .collect())
}
