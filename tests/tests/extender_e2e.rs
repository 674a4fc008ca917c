//! End-to-end: railguard-extender (cluster mode, watches on a real kube-apiserver 1.20) called
//! by a real kube-scheduler 1.20 configured with `kubescheduler.config.k8s.io/v1beta1`
//! extenders, in both nodeCacheCapable modes. Six fake nodes in the six fabric states; pods
//! annotated as the webhook would; assertions on bindings and FailedScheduling events.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use railguard_api::{FabricProfile, Verdict};
use railguard_extender::ExtenderConfig;
use railguard_extender_cli::cache::ClusterState;
use railguard_extender_cli::metrics::Metrics;
use railguard_extender_cli::server::{self, AppState, Source};
use railguard_sim::certificates as synth;
use railguard_tests::{
    eventually, failed_scheduling_messages, fixture_profile, labels, merge_json, pod_node,
    wait_bound, ControlPlane,
};
use serde_json::{json, Value};

const MANAGER: &str = "railguard-e2e";

fn hours_ago(h: f64) -> Timestamp {
    Timestamp::now()
        .checked_sub(SignedDuration::from_secs_f64(h * 3600.0))
        .unwrap()
}

async fn set_fabric_label(client: &Client, node: &str, value: &str) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .patch(
            node,
            &PatchParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"metadata": {"labels": {"railguard.io/fabric": value}}})),
        )
        .await
        .unwrap();
}

/// A training pod as the webhook leaves it: profile and signature annotations, GPUs and RDMA.
fn training_pod(name: &str, profile: &FabricProfile, gpus: u32, extra: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name,
            "labels": {"training.kubeflow.org/job-name": "llama"},
            "annotations": {
                "railguard.io/profile": profile.name(),
                "railguard.io/signature": profile.spec.signature(),
            }},
        "spec": {"containers": [{
            "name": "trainer", "image": "registry.invalid/trainer:1",
            "resources": {"limits": {
                "nvidia.com/gpu": gpus.to_string(),
                "rdma/rdma_shared_device_a": "1",
            }},
        }]},
    });
    merge_json(&mut pod, extra);
    pod
}

async fn create_pod(client: &Client, ns: &str, pod: Value) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    pods.create(
        &PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        },
        &pod,
    )
    .await
    .unwrap();
}

struct Extender {
    url: String,
    health: String,
    state: Arc<AppState>,
    served: Vec<railguard_runtime::Served>,
    watches: tokio::task::JoinHandle<()>,
}

impl Drop for Extender {
    fn drop(&mut self) {
        self.served.iter().for_each(|s| s.stop.cancel());
        self.watches.abort();
    }
}

async fn start_extender(client: Client) -> Extender {
    let config = ExtenderConfig::default();
    let metrics = Arc::new(Metrics::new());
    let cluster = Arc::new(ClusterState::new(config.clone()));
    let watches = tokio::spawn(cluster.clone().run(client, metrics.clone()));
    let state = Arc::new(AppState {
        source: Source::Cluster(cluster),
        config,
        max_nodes: server::DEFAULT_MAX_NODES,
        metrics,
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let limits = railguard_runtime::ServeLimits::default();
    let extender = railguard_runtime::spawn_serve(
        listener,
        server::extender_router(state.clone(), 512 << 20),
        None,
        limits.clone(),
    )
    .unwrap();
    let health = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let health_port = health.local_addr().unwrap().port();
    let health = railguard_runtime::spawn_serve(
        health,
        server::health_router(state.clone(), Default::default()),
        None,
        limits,
    )
    .unwrap();
    Extender {
        url: format!("http://127.0.0.1:{port}"),
        health: format!("http://127.0.0.1:{health_port}"),
        state,
        served: vec![extender, health],
        watches,
    }
}

async fn scenario(node_cache_capable: bool) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let client = cp.client();
    let h100 = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    let a100 = fixture_profile("dgx-a100-hdr.yaml").unwrap();
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    for p in [&h100, &a100] {
        profiles.create(&PostParams::default(), p).await.unwrap();
    }
    cp.create_namespace("train", &labels(&[])).await.unwrap();
    cp.create_namespace(
        "sandbox",
        &labels(&[("railguard.io/exemptions", "allowed")]),
    )
    .await
    .unwrap();

    // Six nodes with 8 GPUs each, in the six fabric states, each in the pool of the profile
    // it was built for (the GPU product label GPU Feature Discovery sets).
    let alloc = [("nvidia.com/gpu", "8"), ("rdma/rdma_shared_device_a", "1")];
    let product = "nvidia.com/gpu.product";
    for name in [
        "n-certified",
        "n-other-profile",
        "n-expired",
        "n-degraded",
        "n-failed",
        "n-none",
    ] {
        let pool = match name {
            "n-other-profile" => &a100,
            _ => &h100,
        };
        let value = pool.spec.node_selector[product].as_str();
        cp.create_node(name, &labels(&[(product, value)]), &alloc)
            .await
            .unwrap();
    }
    let good = synth::certificate(&h100, Verdict::Certified, hours_ago(1.0), 392.0, 370.0);
    cp.publish_certificate("n-certified", &good).await.unwrap();
    let other = synth::certificate(&a100, Verdict::Certified, hours_ago(1.0), 195.0, 190.0);
    cp.publish_certificate("n-other-profile", &other)
        .await
        .unwrap();
    // TTL 24h, issued 26h10m ago: expired 2h10m ago.
    let expired = synth::certificate(
        &h100,
        Verdict::Certified,
        hours_ago(26.0 + 10.0 / 60.0),
        392.0,
        370.0,
    );
    cp.publish_certificate("n-expired", &expired).await.unwrap();
    let mut degraded = good.clone();
    synth::degrade_rail(&mut degraded, "mlx5_3", 1, 196.0);
    cp.publish_certificate("n-degraded", &degraded)
        .await
        .unwrap();
    let mut failed = synth::certificate(&h100, Verdict::Failed, hours_ago(1.0), 392.0, 100.0);
    failed.reasons = vec!["NCCL fell back to Socket transport".into()];
    cp.publish_certificate("n-failed", &failed).await.unwrap();

    let ext = start_extender(client.clone()).await;
    eventually(Duration::from_secs(30), "extender ready", || async {
        let r = reqwest::get(format!("{}/readyz", ext.health)).await;
        Ok(r.ok().filter(|r| r.status().is_success()).map(|_| ()))
    })
    .await
    .unwrap();
    cp.start_scheduler(&format!(
        "- urlPrefix: \"{}\"\n  filterVerb: filter\n  prioritizeVerb: prioritize\n  weight: 1\n  enableHTTPS: false\n  nodeCacheCapable: {node_cache_capable}\n  ignorable: false\n",
        ext.url
    ))
    .await
    .unwrap();

    // Each profile's pods land on the one node certified for it.
    create_pod(
        &client,
        "train",
        training_pod("h100-a", &h100, 8, json!({})),
    )
    .await;
    create_pod(
        &client,
        "train",
        training_pod("a100-a", &a100, 8, json!({})),
    )
    .await;
    // A pod railguard does not gate is placed by the scheduler alone.
    create_pod(
        &client,
        "train",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
               "spec": {"containers": [{"name": "c", "image": "registry.invalid/c:1"}]}}),
    )
    .await;
    assert_eq!(
        wait_bound(&client, "train", "h100-a").await.unwrap(),
        "n-certified"
    );
    assert_eq!(
        wait_bound(&client, "train", "a100-a").await.unwrap(),
        "n-other-profile"
    );
    wait_bound(&client, "train", "plain").await.unwrap();

    // The only certified h100 node is full: the next pod has no eligible node. It stays
    // Pending and its scheduling event carries the extender's reason for the node that may
    // become eligible (kube-scheduler 1.20 reports FailedNodes; it ignores
    // FailedAndUnresolvableNodes, which later versions keep out of preemption).
    create_pod(
        &client,
        "train",
        training_pod("h100-b", &h100, 8, json!({})),
    )
    .await;
    let messages = eventually(
        Duration::from_secs(60),
        "FailedScheduling for h100-b",
        || async {
            let m = failed_scheduling_messages(&client, "train", "h100-b").await?;
            Ok((!m.is_empty()).then_some(m))
        },
    )
    .await
    .unwrap();
    let msg = &messages[0];
    assert!(
        msg.contains("railguard: certificate expired 2h1"),
        "extender reason missing from the event: {msg}"
    );
    assert!(msg.contains("0/6 nodes are available"), "{msg}");
    assert!(msg.contains("Insufficient nvidia.com/gpu"), "{msg}");
    // The event is written by the scheduling cycle that failed: that cycle bound nothing.
    assert_eq!(
        pod_node(&client, "train", "h100-b").await,
        None,
        "must stay Pending"
    );

    // allow-uncertified: ignored in a namespace the profile does not allow, honored where it does.
    let to_none = json!({
        "metadata": {"annotations": {"railguard.io/allow-uncertified": "true"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "n-none"}},
    });
    create_pod(
        &client,
        "train",
        training_pod("exempt-denied", &h100, 0, to_none.clone()),
    )
    .await;
    create_pod(
        &client,
        "sandbox",
        training_pod("exempt-allowed", &h100, 0, to_none),
    )
    .await;
    assert_eq!(
        wait_bound(&client, "sandbox", "exempt-allowed")
            .await
            .unwrap(),
        "n-none"
    );
    eventually(
        Duration::from_secs(60),
        "FailedScheduling for exempt-denied",
        || async {
            let m = failed_scheduling_messages(&client, "train", "exempt-denied").await?;
            Ok((!m.is_empty()).then_some(m))
        },
    )
    .await
    .unwrap();
    assert_eq!(pod_node(&client, "train", "exempt-denied").await, None);
    // The exemption is h100-ndr's: it does not reach the A100 pool's node.
    create_pod(
        &client,
        "sandbox",
        training_pod(
            "exempt-borrowed",
            &h100,
            0,
            json!({
                "metadata": {"annotations": {"railguard.io/allow-uncertified": "true"}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": "n-other-profile"}},
            }),
        ),
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "FailedScheduling for exempt-borrowed",
        || async {
            let m = failed_scheduling_messages(&client, "sandbox", "exempt-borrowed").await?;
            Ok((!m.is_empty()).then_some(m))
        },
    )
    .await
    .unwrap();
    assert_eq!(pod_node(&client, "sandbox", "exempt-borrowed").await, None);

    // The expired node is recertified the way the prober renews: pending, then certified.
    set_fabric_label(&client, "n-expired", "pending").await;
    let renewed = synth::certificate(&h100, Verdict::Certified, hours_ago(0.0), 394.0, 372.0);
    cp.publish_certificate("n-expired", &renewed).await.unwrap();
    // The scheduler retries the pod on the Node update, possibly before the extender's own
    // watch has delivered it; 1.20 then retries unschedulable pods within a minute, 1.37
    // only after five. A pod update requeues it at once, as a user's edit would.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "train");
    let mut nudges = 0u32;
    let node = eventually(
        Duration::from_secs(90),
        "h100-b bound after renewal",
        || {
            nudges += 1;
            let pods = pods.clone();
            let client = client.clone();
            let n = nudges;
            async move {
                if let Some(node) = pod_node(&client, "train", "h100-b").await {
                    return Ok(Some(node));
                }
                if n.is_multiple_of(25) {
                    let patch = serde_json::json!({"metadata": {"annotations": {"railguard-tests/requeue": n.to_string()}}});
                    pods.patch("h100-b", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                        .await?;
                }
                Ok(None)
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(node, "n-expired");

    // The extender saw the scheduler's calls in the expected form.
    let metrics = ext.state.metrics.encode().unwrap();
    let mode = if node_cache_capable { "names" } else { "nodes" };
    assert!(
        metrics.contains(&format!(
            "railguard_extender_filter_duration_seconds_count{{mode=\"{mode}\"}}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("railguard_extender_nodes_rejected_total{reason=\"expired\"}"));
    assert!(metrics.contains("railguard_extender_nodes_rejected_total{reason=\"other_profile\"}"));
    // Fails if kube-scheduler, the API server or etcd exited.
    cp.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_places_training_pods_through_the_extender_with_node_cache() {
    scenario(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_places_training_pods_through_the_extender_with_full_nodes() {
    scenario(false).await;
}
