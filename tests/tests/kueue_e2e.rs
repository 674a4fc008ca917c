//! railguard under the real Kueue (issue #44, item 7): Kueue v0.17.0's controller manager
//! (built from the Go module proxy, `tests/scripts/kueue.sh`; how it runs beside the
//! harness: `railguard_tests::kueue`) on the real 1.37 kube-apiserver, with the real
//! kube-scheduler and kube-controller-manager's Job controller, and railguard as the chart
//! renders it with `docs/examples/kueue.values.yaml` and `webhook.mode: Enforce`: the chart's
//! FabricProfile (with `certification.taints`), its fleet controller under the chart's RBAC,
//! and the webhook with the chart's arguments behind the chart's MutatingWebhookConfiguration.
//!
//! One topology-aware (TAS) batch Job of two 8-GPU pods that requires one leaf:
//! - it never lands on the node railguard tainted before it was queued (Kueue's TAS skips
//!   untolerated `NoSchedule` taints: `pkg/cache/scheduler/tas_flavor_snapshot.go`);
//! - its pods, opted in by the `kueue.x-k8s.io/podset` label alone, are configured by the
//!   webhook in Enforce mode (profile annotation, NCCL environment, IPC_LOCK), while a GPU
//!   pod without the label in the same namespace is left alone;
//! - a node railguard taints mid-run is replaced. With `TASReplaceNodeOnNodeTaints` and
//!   `TASFailedNodeReplacement` (and `TASReplaceNodeOnPodTermination`, all on by default in
//!   v0.17), Kueue's TAS node controller (`pkg/controller/tas/node_controller.go`) treats a
//!   node whose untolerated `NoSchedule`/`NoExecute` taint appears under a workload as
//!   failed once that workload's pods there stop progressing: here the pod fails, as a
//!   training process does when NCCL aborts on a broken rail (the kubelet's report is
//!   written by the test: these Nodes have no kubelet). Kueue then moves the workload's
//!   topology assignment off the node, in place (the workload is not evicted), and the Job's
//!   replacement pod lands on the leaf's last healthy free node, never on a tainted one.
//!
//! Always against 1.37, whatever `RAILGUARD_KUBE_VERSION` says: Kueue v0.17 needs a modern
//! API server (its CRDs validate with CEL), so there is no 1.20 variant.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::ByteString;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::Client;
use railguard_api::{keys, Certificate, FabricProfile, Verdict};
use railguard_tests::chart_values::{render_for_server, ValuesSet};
use railguard_tests::daemon::{wait_ready, Daemon, ANY_LOOPBACK_PORT};
use railguard_tests::install::{apply_objects, container_args, container_env, ChartFleet};
use railguard_tests::kueue::KUEUE_API;
use railguard_tests::{
    eventually, labels, workspace_binary, ApiServerOptions, ControlPlane, KubeVersion, NotYet,
    ServingCertificate,
};
use serde_json::{json, Value};

const NS: &str = "railguard";
const TRAIN: &str = "train";
const LEAF: &str = "network.topology.nvidia.com/leaf";
const HOSTNAME: &str = "kubernetes.io/hostname";
const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
const H100: &str = "NVIDIA-H100-80GB-HBM3";
const RDMA: &str = "rdma/rdma_shared_device_a";
const PODSET_LABEL: &str = "kueue.x-k8s.io/podset";
const JOB: &str = "trainer";
/// Leaf a holds four nodes, the first tainted before the job is queued; leaf b one node, too
/// few for the two pods, so the required leaf is a.
const TAINTED_FIRST: &str = "gpu-a1";
const LEAF_A: [&str; 4] = ["gpu-a1", "gpu-a2", "gpu-a3", "gpu-a4"];
const LEAF_B: &str = "gpu-b1";

/// The chart as an operator installs it for Kueue: the documented opt-in file, Enforce, and
/// the H100 profile keeping railguard's taint on unhealthy nodes.
fn values() -> &'static str {
    let path = railguard_tests::workspace_root().join("docs/examples/kueue.values.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: Value = serde_yaml_ng::from_str(&text).unwrap();
    railguard_tests::merge_json(
        &mut v,
        json!({
            "webhook": {"mode": "Enforce"},
            "fabricProfiles": {"h100-ndr": {"spec": {"certification": {"taints": true}}}},
        }),
    );
    Box::leak(serde_yaml_ng::to_string(&v).unwrap().into_boxed_str())
}

fn certificate(profile: &FabricProfile, node: &str, verdict: Verdict) -> Certificate {
    let now = jiff::Timestamp::now();
    let mut c = railguard_sim::certificates::certificate(profile, verdict, now, 384.0, 380.0);
    c.node = Some(node.to_string());
    if verdict != Verdict::Certified {
        c.reasons = vec![format!("rail mlx5_3:1 is {verdict} (test)")];
    }
    c
}

async fn railguard_taint(nodes: &Api<Node>, name: &str) -> Result<Option<String>> {
    Ok(nodes
        .get(name)
        .await?
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .find(|t| t.key == keys::TAINT_FABRIC_UNHEALTHY)
        .map(|t| format!("{}:{}", t.value.unwrap_or_default(), t.effect)))
}

async fn wait_tainted(nodes: &Api<Node>, name: &str) -> Result<()> {
    eventually(
        Duration::from_secs(60),
        &format!("railguard taints {name}"),
        || async move {
            Ok(match railguard_taint(nodes, name).await?.as_deref() {
                Some("failed:NoSchedule") => Ok(()),
                other => Err(NotYet(format!("{other:?}"))),
            })
        },
    )
    .await
}

fn kueue_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: KUEUE_API.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Kueue's side of the cluster as its TAS docs set it up: a Topology of leaf and host, an
/// H100 flavor bound to it, a ClusterQueue with quota for every GPU, a LocalQueue in TRAIN.
fn kueue_objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": KUEUE_API, "kind": "Topology", "metadata": {"name": "gpu-fabric"},
               "spec": {"levels": [{"nodeLabel": LEAF}, {"nodeLabel": HOSTNAME}]}}),
        json!({"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "h100"},
               "spec": {"nodeLabels": {GPU_PRODUCT: H100}, "topologyName": "gpu-fabric"}}),
        json!({"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": "gpus"},
               "spec": {"namespaceSelector": {}, "resourceGroups": [{
                   "coveredResources": ["nvidia.com/gpu"],
                   "flavors": [{"name": "h100", "resources": [
                       {"name": "nvidia.com/gpu", "nominalQuota": 40}]}]}]}}),
        json!({"apiVersion": KUEUE_API, "kind": "LocalQueue",
               "metadata": {"name": "training", "namespace": TRAIN},
               "spec": {"clusterQueue": "gpus"}}),
    ]
}

/// A batch Job as Kueue's docs write one for TAS, suspended as Kueue's Job webhook would
/// leave it (`railguard_tests::kueue`: that webhook is not registered here): two 8-GPU
/// pods, one leaf required, nothing railguard-specific.
fn training_job() -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": TRAIN,
                     "labels": {"kueue.x-k8s.io/queue-name": "training"}},
        "spec": {
            "suspend": true, "parallelism": 2, "completions": 2, "backoffLimit": 6,
            "template": {
                "metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": LEAF}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": "registry.invalid/trainer:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                },
            },
        },
    })
}

/// The Job's pods that are not finished: (name, node, the hostname Kueue selected).
async fn live_pods(pods: &Api<Pod>) -> Result<Vec<(String, Option<String>, Option<String>)>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={JOB}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            p.metadata.deletion_timestamp.is_none()
                && !matches!(phase.as_deref(), Some("Failed" | "Succeeded"))
        })
        .map(|p| {
            let spec = p.spec.unwrap_or_default();
            let selected = spec
                .node_selector
                .as_ref()
                .and_then(|s| s.get(HOSTNAME).cloned());
            (
                p.metadata.name.unwrap_or_default(),
                spec.node_name,
                selected,
            )
        })
        .collect())
}

/// Waits until the Job has two live pods, both bound; their nodes.
async fn two_bound(pods: &Api<Pod>, what: &str) -> Result<BTreeSet<String>> {
    eventually(Duration::from_secs(180), what, || async move {
        let live = live_pods(pods).await?;
        let nodes: BTreeSet<String> = live.iter().filter_map(|p| p.1.clone()).collect();
        Ok(if live.len() == 2 && nodes.len() == 2 {
            Ok(nodes)
        } else {
            Err(NotYet(format!("{live:?}")))
        })
    })
    .await
}

fn env_of(pod: &Pod, name: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .clone()
}

fn is_configured(pod: &Pod) -> bool {
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_PROFILE))
        .is_some_and(|p| p == "h100-ndr");
    let ipc_lock = pod.spec.as_ref().is_some_and(|s| {
        s.containers[0]
            .security_context
            .as_ref()
            .and_then(|c| c.capabilities.as_ref())
            .and_then(|c| c.add.as_ref())
            .is_some_and(|a| a.iter().any(|c| c == "IPC_LOCK"))
    });
    annotated && ipc_lock && env_of(pod, "NCCL_IB_HCA").is_some()
}

/// The webhook with the chart's arguments, but for where it listens and which pair it
/// serves: the chart's self-managed certificate (and the caBundles it keeps, the node
/// guard's too) names the Service, which this API server cannot reach; it calls the
/// loopback URL instead.
async fn start_webhook(
    docs: &[Value],
    cp: &ControlPlane,
    tls: &ServingCertificate,
) -> (Daemon, u16) {
    let logs = cp.log_dir();
    let deployment = docs
        .iter()
        .find(|d| {
            d["kind"] == "Deployment"
                && d["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
        })
        .expect("the chart renders the webhook Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    const SERVING: &[&str] = &[
        "--listen",
        "--metrics-listen",
        "--tls-cert",
        "--tls-key",
        "--self-signed-secret",
        "--webhook-config-name",
        "--service-name",
        "--cert-validity-days",
        "--cert-rotate-before-days",
        "--node-guard-config-name",
        "--log-format",
    ];
    let args: Vec<String> = container_args(container)
        .unwrap()
        .into_iter()
        .filter(|a| !SERVING.contains(&a.split('=').next().unwrap_or_default()))
        .collect();
    assert!(
        args.iter().any(|a| a == "--mode=Enforce")
            && args
                .iter()
                .any(|a| a.starts_with("--opt-in-pod-selector=") && a.contains(PODSET_LABEL)),
        "{args:?}"
    );
    let dir = logs.join("webhook-tls");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = tls.write_pair(&dir).unwrap();
    let bin = workspace_binary("railguard-webhook-cli", "railguard-webhook").unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(&args)
        .envs(container_env(container, NS, "railguard-webhook-0").unwrap())
        .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
        .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}"))
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .env("RAILGUARD_KUBECONFIG", cp.kubeconfig_path())
        .env("RAILGUARD_LOG", "info");
    let mut daemon = Daemon::spawn("railguard-webhook", &mut cmd, logs);
    let port = daemon.listen_addr("--listen").await.port();
    let metrics = daemon.listen_addr("--metrics-listen").await;
    wait_ready(
        &format!("http://{metrics}/readyz"),
        "webhook",
        &mut daemon,
        logs,
    )
    .await;
    (daemon, port)
}

/// The chart's pod MutatingWebhookConfiguration, every entry pointed at the loopback webhook.
async fn register_webhook(client: &Client, docs: &[Value], port: u16, ca_pem: &str) {
    let rendered = docs
        .iter()
        .find(|d| d["kind"] == "MutatingWebhookConfiguration")
        .expect("the chart renders a MutatingWebhookConfiguration")
        .clone();
    let mut mwc: MutatingWebhookConfiguration = serde_json::from_value(rendered).unwrap();
    let entries = mwc.webhooks.as_mut().expect("webhook entries");
    assert_eq!(
        entries.len(),
        2,
        "a namespace entry and an opted-in-pods entry"
    );
    for w in entries.iter_mut() {
        let path = w.client_config.service.take().and_then(|s| s.path).unwrap();
        w.client_config.url = Some(format!("https://127.0.0.1:{port}{path}"));
        w.client_config.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
    }
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .unwrap();
}

/// A GPU pod as a user writes one, optionally with Kueue's podset label.
fn gpu_pod(name: &str, podset: bool) -> Pod {
    let mut meta = json!({"name": name});
    if podset {
        meta["labels"] = json!({PODSET_LABEL: "main"});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"containers": [{"name": "trainer", "image": "registry.invalid/trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    }))
    .unwrap()
}

async fn dry_run(pods: &Api<Pod>, pod: &Pod) -> Result<Pod> {
    Ok(pods
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            pod,
        )
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_tas_workloads_avoid_and_replace_nodes_railguard_taints_and_their_pods_are_configured(
) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut cp =
        ControlPlane::start_version(KubeVersion::V1_37, &ApiServerOptions::default()).await?;
    cp.apply_fabricprofile_crd().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    cp.create_namespace(NS, &labels(&[])).await?;
    cp.create_namespace(TRAIN, &labels(&[])).await?;

    let set = ValuesSet {
        label: "kueue",
        release: "railguard",
        namespace: NS,
        values: values(),
    };
    let docs = render_for_server(&set, &client).await?;
    let profiles: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] == "FabricProfile")
        .cloned()
        .collect();
    apply_objects(&client, NS, &profiles).await?;
    let profile: FabricProfile = Api::<FabricProfile>::all(client.clone())
        .get("h100-ndr")
        .await?;
    assert!(
        profile.spec.certification.taints,
        "the values turn the taint on"
    );

    let alloc = [("nvidia.com/gpu", "8"), (RDMA, "1k")];
    for (name, leaf) in LEAF_A
        .iter()
        .map(|n| (*n, "leaf-a"))
        .chain([(LEAF_B, "leaf-b")])
    {
        cp.create_node(name, &labels(&[(GPU_PRODUCT, H100), (LEAF, leaf)]), &alloc)
            .await?;
        let verdict = if name == TAINTED_FIRST {
            Verdict::Failed
        } else {
            Verdict::Certified
        };
        cp.publish_certificate(name, &certificate(&profile, name, verdict))
            .await?;
    }
    let mut fleet = ChartFleet::start(&cp, &docs, NS, "railguard-fleet").await?;
    wait_tainted(&nodes, TAINTED_FIRST).await?;

    let tls = ServingCertificate::loopback("railguard-kueue-e2e").unwrap();
    let (mut webhook, port) = start_webhook(&docs, &cp, &tls).await;
    register_webhook(&client, &docs, port, &tls.ca_pem).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), TRAIN);
    // The API server loads webhook configurations asynchronously: dry-run a podset pod until
    // it comes back configured.
    eventually(
        Duration::from_secs(30),
        "the API server calls the webhook",
        || {
            let pods = pods.clone();
            async move {
                Ok(is_configured(&dry_run(&pods, &gpu_pod("probe", true)).await?).then_some(()))
            }
        },
    )
    .await?;
    let plain = dry_run(&pods, &gpu_pod("not-opted-in", false)).await?;
    assert!(
        plain
            .metadata
            .annotations
            .unwrap_or_default()
            .keys()
            .all(|k| !k.starts_with("railguard.io/")),
        "a GPU pod without Kueue's podset label is not railguard's (opt-in)"
    );

    cp.start_scheduler("[]").await?;
    cp.start_controller_manager_with(&["job-controller"])
        .await?;
    cp.start_kueue().await?;
    apply_objects(&client, TRAIN, &kueue_objects()).await?;
    apply_objects(&client, TRAIN, &[training_job()]).await?;

    // Admitted, ungated to a leaf-a host each, bound: never the tainted node.
    let placed = two_bound(&pods, "the Job's two pods bound").await?;
    let healthy: BTreeSet<String> = LEAF_A[1..].iter().map(|s| s.to_string()).collect();
    assert!(
        placed.is_subset(&healthy),
        "{placed:?} must be two of {healthy:?}"
    );
    for (name, node, selected) in live_pods(&pods).await? {
        assert_eq!(node, selected, "{name}: bound where Kueue's TAS put it");
        let pod = pods.get(&name).await?;
        let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
        assert!(
            pod_labels.contains_key(PODSET_LABEL),
            "{name}: {pod_labels:?}"
        );
        assert!(
            is_configured(&pod),
            "{name} is configured by the webhook in Enforce: {pod:?}"
        );
        assert_eq!(
            env_of(&pod, "NCCL_IB_HCA")
                .as_deref()
                .map(|h| h.contains("mlx5_0")),
            Some(true)
        );
    }
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        TRAIN,
        &kueue_resource("Workload", "workloads"),
    );
    let workload = workloads
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .next()
        .context("a Workload")?;
    let workload_name = workload.metadata.name.clone().context("its name")?;

    // Mid-run, one of its nodes fails certification: railguard taints it; the pod there
    // fails; Kueue replaces the node in place.
    let failing = placed.iter().next().unwrap().clone();
    let spare = healthy.difference(&placed).next().unwrap().clone();
    cp.publish_certificate(&failing, &certificate(&profile, &failing, Verdict::Failed))
        .await?;
    wait_tainted(&nodes, &failing).await?;
    let victim = live_pods(&pods)
        .await?
        .into_iter()
        .find(|p| p.1.as_deref() == Some(failing.as_str()))
        .context("a pod on the failing node")?
        .0;
    let now = jiff::Timestamp::now().to_string();
    pods.patch_status(
        &victim,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed", "containerStatuses": [{
            "name": "trainer", "image": "registry.invalid/trainer:1", "imageID": "", "ready": false,
            "restartCount": 0, "started": false,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now,
                                      "message": "NCCL error: remote process exited or there was a network error"}}}]}})),
    )
    .await?;
    let replaced = two_bound(&pods, "the Job's pods bound again after the replacement").await?;
    let survivor = placed.iter().find(|n| **n != failing).unwrap().clone();
    assert_eq!(
        replaced,
        BTreeSet::from([survivor, spare.clone()]),
        "the spare took the failed node's place"
    );
    for (name, node, selected) in live_pods(&pods).await? {
        assert_eq!(node, selected, "{name}");
        assert!(
            is_configured(&pods.get(&name).await?),
            "{name}, the replacement too, is configured"
        );
    }
    let workload = workloads.get(&workload_name).await?;
    let conditions = workload.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let condition = |t: &str| {
        conditions
            .iter()
            .find(|c| c["type"] == t)
            .map(|c| c["status"].clone())
    };
    assert_eq!(condition("Admitted"), Some(json!("True")), "{conditions:?}");
    assert_ne!(
        condition("Evicted"),
        Some(json!("True")),
        "replaced in place, not requeued: {conditions:?}"
    );
    assert_eq!(
        railguard_taint(&nodes, TAINTED_FIRST).await?.as_deref(),
        Some("failed:NoSchedule")
    );

    fleet.daemon.assert_running(cp.log_dir());
    webhook.assert_running(cp.log_dir());
    cp.check_alive()?;
    Ok(())
}
