//! End-to-end through every gate a training pod passes, with the real binaries: a user's pod
//! (no railguard annotations) is created through kube-apiserver 1.20, mutated by the
//! `railguard-webhook` binary (TLS, registered by a MutatingWebhookConfiguration), and placed
//! by kube-scheduler 1.20 calling the `railguard-extender` binary over mutual TLS
//! (`enableHTTPS`, `tlsConfig.caFile`/`certFile`/`keyFile`, nodeCacheCapable) with the set
//! `railguard-extender tls-bootstrap` issued into an empty Secret, as the chart's init
//! container does. Asserts gang locality across
//! topology labels, that a degraded node is never chosen however local it is, and that a
//! GPU + RDMA pod the webhook never saw is still held to the default profile, with the
//! degraded node's reason in its FailedScheduling event (`--report-unresolvable-as-failed`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::process::Command;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::Client;
use railguard_api::{keys, Certificate, FabricProfile, Verdict};
use railguard_sim::certificates as synth;
use railguard_tests::daemon::{spawn_extender, wait_ready, Daemon, ANY_LOOPBACK_PORT};
use railguard_tests::{
    eventually, failed_scheduling_messages, fixture_profile, labels, merge_json, pod_node,
    pod_webhook_entry, scrape_metrics, wait_bound, workspace_binary, ControlPlane,
    ServingCertificate,
};
use serde_json::{json, Value};

const LEAF: &str = "network.topology.nvidia.com/leaf";
const SPINE: &str = "network.topology.nvidia.com/spine";
const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
const H100: &str = "NVIDIA-H100-80GB-HBM3";
const RDMA: &str = "rdma/rdma_shared_device_a";
const JOB: &str = "training.kubeflow.org/job-name";

fn issued_an_hour_ago() -> Timestamp {
    Timestamp::now()
        .checked_sub(SignedDuration::from_hours(1))
        .unwrap()
}

/// A pod as a user submits it: GPUs, a job label, nothing railguard-specific.
fn user_pod(name: &str, job: &str, extra: Value) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {JOB: job}},
        "spec": {"containers": [{
            "name": "trainer", "image": "registry.invalid/trainer:1",
            "resources": {"limits": {"nvidia.com/gpu": "8"}},
        }]},
    });
    merge_json(&mut pod, extra);
    serde_json::from_value(pod).unwrap()
}

async fn create(client: &Client, ns: &str, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(
            &PostParams {
                field_manager: Some("railguard-e2e".into()),
                ..Default::default()
            },
            pod,
        )
        .await
        .unwrap()
}

fn env_value(pod: &Pod, name: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

async fn register_webhook(client: &Client, port: u16, ca_pem: &str) {
    let mut mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "railguard"},
        "webhooks": [pod_webhook_entry("pods.railguard.io", port)],
    }))
    .unwrap();
    for w in mwc.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
    }
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .unwrap();
    // The API server loads webhook configurations asynchronously: dry-run creates (the
    // webhook declares no side effects, so it is called) until one comes back mutated.
    let probe = user_pod("probe", "probe", json!({}));
    eventually(
        Duration::from_secs(30),
        "API server calls the webhook",
        || {
            let pods = Api::<Pod>::namespaced(client.clone(), "train");
            let probe = probe.clone();
            async move {
                let p = pods.create(&railguard_tests::dry_run(), &probe).await?;
                let annotated = p
                    .metadata
                    .annotations
                    .is_some_and(|a| a.contains_key(keys::ANNOTATION_PROFILE));
                Ok(annotated.then_some(()))
            }
        },
    )
    .await
    .unwrap();
}

/// Asks the extender itself, over HTTPS, to rank `nodes` for `pod`: their scores in order.
async fn extender_scores(
    https: &reqwest::Client,
    url: &str,
    pod: &Pod,
    nodes: &[&str],
) -> Vec<(String, i64)> {
    let args = json!({"Pod": pod, "Nodes": null, "NodeNames": nodes});
    let resp = https
        .post(format!("{url}/prioritize"))
        .json(&args)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let list: Vec<Value> = resp.json().await.unwrap();
    // The extender leaves out nodes that score 0 (the scheduler adds nothing for them).
    let listed: Vec<(String, i64)> = list
        .iter()
        .map(|h| {
            (
                h["Host"].as_str().unwrap().to_string(),
                h["Score"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(
        listed
            .iter()
            .all(|(host, score)| nodes.contains(&host.as_str()) && *score > 0),
        "{listed:?}"
    );
    nodes
        .iter()
        .map(|n| {
            let score = listed.iter().find(|(h, _)| h == n).map_or(0, |(_, s)| *s);
            (n.to_string(), score)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_mutated_pods_are_placed_by_the_extender_over_https_with_gang_locality() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let webhook_bin = workspace_binary("railguard-webhook-cli", "railguard-webhook").unwrap();
    let extender_bin = workspace_binary("railguard-extender-cli", "railguard-extender").unwrap();
    let mut cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let client = cp.client();
    let logs = cp.log_dir().to_path_buf();
    let h100 = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &h100)
        .await
        .unwrap();
    cp.create_namespace("train", &labels(&[])).await.unwrap();
    // Not seen by the webhook (--excluded-namespaces), as if it had been down with
    // failurePolicy Ignore.
    cp.create_namespace("ops", &labels(&[])).await.unwrap();

    // Two leaves under two spines. Leaf a's nodes have more bandwidth headroom (4 of the 5
    // headroom points) than leaf b's (0), so without gang locality the scheduler would always
    // prefer leaf a. n-b3 sits in leaf b but has a degraded rail.
    let alloc = [("nvidia.com/gpu", "8"), (RDMA, "1k")];
    let fleet: [(&str, &str, &str, f64); 6] = [
        ("n-a1", "leaf-a", "spine-2", 392.0),
        ("n-a2", "leaf-a", "spine-2", 392.0),
        ("n-a3", "leaf-a", "spine-2", 392.0),
        ("n-b1", "leaf-b", "spine-1", 362.0),
        ("n-b2", "leaf-b", "spine-1", 362.0),
        ("n-b3", "leaf-b", "spine-1", 362.0),
    ];
    for (name, leaf, spine, gbps) in fleet {
        cp.create_node(
            name,
            &labels(&[(GPU_PRODUCT, H100), (LEAF, leaf), (SPINE, spine)]),
            &alloc,
        )
        .await
        .unwrap();
        let mut cert: Certificate =
            synth::certificate(&h100, Verdict::Certified, issued_an_hour_ago(), gbps, gbps);
        if name == "n-b3" {
            synth::degrade_rail(&mut cert, "mlx5_3", 1, 196.0);
        }
        cp.publish_certificate(name, &cert).await.unwrap();
    }

    // The webhook presents a loopback certificate from a throwaway CA. The extender's set
    // (its CA, serving pair and the scheduler's client pair) is what the chart's init
    // container issues: `railguard-extender tls-bootstrap` fills an empty Secret and writes
    // the files the extender and the scheduler read.
    let tls = ServingCertificate::loopback("railguard-e2e-ca").unwrap();
    // Its own directory: spawn_extender writes the extender's pair into the log directory.
    let webhook_tls = logs.join("webhook-tls");
    std::fs::create_dir_all(&webhook_tls).unwrap();
    let (cert_path, key_path) = tls.write_pair(&webhook_tls).unwrap();
    let extender_tls = bootstrap_extender_tls(&cp, &extender_bin, &logs).await;
    let extender_set = ServingCertificate {
        ca_pem: read(&extender_tls, "ca.crt"),
        cert_pem: read(&extender_tls, "tls.crt"),
        key_pem: read(&extender_tls, "tls.key"),
        client_cert_pem: read(&extender_tls, "client.crt"),
        client_key_pem: read(&extender_tls, "client.key"),
    };
    // As the chart runs it for a 1.20 cluster (`reportUnresolvableAsFailed: auto`): this
    // scheduler reads only FailedNodes.
    let (mut extender, extender_url, extender_metrics) = spawn_extender(
        &extender_bin,
        cp.kubeconfig_path(),
        &extender_set,
        &logs,
        &["--report-unresolvable-as-failed"],
    )
    .await
    .unwrap();
    let mut webhook = Daemon::spawn(
        "railguard-webhook",
        Command::new(&webhook_bin)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
            .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}"))
            .arg("--tls-cert")
            .arg(&cert_path)
            .arg("--tls-key")
            .arg(&key_path)
            .arg("--failure-mode=closed")
            .arg("--excluded-namespaces=kube-system,ops"),
        &logs,
    );
    let wh_port = webhook.listen_addr("--listen").await.port();
    let wh_metrics = webhook.listen_addr("--metrics-listen").await.port();
    wait_ready(
        &format!("http://127.0.0.1:{wh_metrics}/readyz"),
        "railguard-webhook",
        &mut webhook,
        &logs,
    )
    .await;
    register_webhook(&client, wh_port, &tls.ca_pem).await;

    // The scheduler reads the set's files, as the chart's tlsConfig names them.
    cp.start_scheduler(&format!(
        "- urlPrefix: \"{extender_url}\"\n  filterVerb: filter\n  prioritizeVerb: prioritize\n  weight: 5\n  enableHTTPS: true\n  tlsConfig:\n    caFile: {}\n    certFile: {}\n    keyFile: {}\n  nodeCacheCapable: true\n  ignorable: false\n",
        extender_tls.join("ca.crt").display(),
        extender_tls.join("client.crt").display(),
        extender_tls.join("client.key").display()
    ))
    .await
    .unwrap();

    // Worker 0 is pinned by its user to n-b1. The webhook configures it for h100-ndr.
    let w0 = create(
        &client,
        "train",
        &user_pod(
            "llama-worker-0",
            "llama",
            json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "n-b1"}}}),
        ),
    )
    .await;
    let annotations = w0.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get(keys::ANNOTATION_PROFILE)
            .map(String::as_str),
        Some("h100-ndr")
    );
    assert_eq!(
        annotations.get(keys::ANNOTATION_SIGNATURE),
        Some(&h100.spec.signature())
    );
    assert_eq!(env_value(&w0, "NCCL_IB_HCA"), Some(h100.spec.nccl_ib_hca()));
    assert_eq!(
        wait_bound(&client, "train", "llama-worker-0")
            .await
            .unwrap(),
        "n-b1"
    );

    // The extender learns of the bound worker from its pod watch; until then it has no
    // peer to be local to. Ask it directly (over HTTPS, trusting only the test CA) until the
    // node sharing worker 0's leaf outranks the better-provisioned node in the other leaf.
    // It requires a client certificate, as from the scheduler: the test presents the same.
    let https = extender_set.scheduler_https_client().unwrap();
    let mut next = w0.clone();
    next.metadata.name = Some("llama-worker-1".into());
    next.spec.as_mut().unwrap().node_selector = None;
    next.spec.as_mut().unwrap().node_name = None;
    let scores = eventually(
        Duration::from_secs(30),
        "extender sees worker 0",
        || async {
            let s = extender_scores(&https, &extender_url, &next, &["n-a1", "n-b2", "n-b3"]).await;
            Ok((s[1].1 > s[0].1).then_some(s))
        },
    )
    .await
    .unwrap();
    // n-a1: 4 headroom points, no locality; n-b2: no headroom, 5 for sharing the leaf;
    // n-b3: locality only (a node that does not pass earns no headroom). The answer lowers
    // every score by the lowest (n-a1's 4), which keeps the ranking and leaves n-a1 out.
    assert_eq!(
        scores,
        vec![("n-a1".into(), 0), ("n-b2".into(), 1), ("n-b3".into(), 1)]
    );

    // Worker 1 follows worker 0 into leaf b.
    create(
        &client,
        "train",
        &user_pod("llama-worker-1", "llama", json!({})),
    )
    .await;
    assert_eq!(
        wait_bound(&client, "train", "llama-worker-1")
            .await
            .unwrap(),
        "n-b2"
    );

    // Leaf b's last node is degraded: worker 2 goes to leaf a instead.
    create(
        &client,
        "train",
        &user_pod("llama-worker-2", "llama", json!({})),
    )
    .await;
    let w2 = wait_bound(&client, "train", "llama-worker-2")
        .await
        .unwrap();
    assert!(
        ["n-a1", "n-a2", "n-a3"].contains(&w2.as_str()),
        "worker 2 on {w2}"
    );

    // A GPU + RDMA pod the webhook never saw is held to the default profile: pinned to the
    // degraded node it stays Pending; a pod without GPUs pinned there is placed at once.
    let to_b3 = json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "n-b3"}}});
    let mut raw = user_pod("unmutated", "ops-check", to_b3.clone());
    raw.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap()
        .insert(
            RDMA.into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        );
    let stored = create(&client, "ops", &raw).await;
    assert!(
        !stored
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(keys::ANNOTATION_PROFILE),
        "the webhook must not have seen namespace ops"
    );
    let mut plain: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/c:1"}]},
    }))
    .unwrap();
    merge_pod(&mut plain, to_b3);
    create(&client, "ops", &plain).await;
    assert_eq!(wait_bound(&client, "ops", "plain").await.unwrap(), "n-b3");
    let events = eventually(
        Duration::from_secs(60),
        "FailedScheduling for the unmutated pod",
        || async {
            let m = failed_scheduling_messages(&client, "ops", "unmutated").await?;
            Ok((!m.is_empty()).then_some(m))
        },
    )
    .await
    .unwrap();
    assert!(events[0].contains("0/6 nodes are available"), "{events:?}");
    // The degraded node's own reason reaches kube-scheduler 1.20's event.
    assert!(
        events[0].contains("railguard: ") && events[0].contains("mlx5_3:1"),
        "{events:?}"
    );
    assert_eq!(pod_node(&client, "ops", "unmutated").await, None);

    // The extender counted the degraded node's rejections.
    let metrics = scrape_metrics(&extender_metrics).await.unwrap();
    assert!(
        metrics.contains("railguard_extender_nodes_rejected_total{reason=\"degraded\"}"),
        "{metrics}"
    );
    extender.assert_running(&logs);
    webhook.assert_running(&logs);
    cp.check_alive().unwrap();
}

/// Runs `railguard-extender tls-bootstrap` as the chart's init container does, on an empty
/// Secret (the chart's), with the sidecar's names; the directory it wrote the set to.
async fn bootstrap_extender_tls(
    cp: &ControlPlane,
    extender_bin: &std::path::Path,
    logs: &std::path::Path,
) -> std::path::PathBuf {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "railguard-extender-tls"},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(cp.client(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let out = logs.join("extender-tls");
    let run = Command::new(extender_bin)
        .arg("tls-bootstrap")
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args([
            "--secret=railguard-extender-tls",
            "--namespace=default",
            "--server-ip=127.0.0.1",
            "--server-dns=localhost",
        ])
        .arg(format!("--out={}", out.display()))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "tls-bootstrap: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    out
}

fn read(dir: &std::path::Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap()
}

fn merge_pod(pod: &mut Pod, extra: Value) {
    let mut v = serde_json::to_value(&*pod).unwrap();
    merge_json(&mut v, extra);
    *pod = serde_json::from_value(v).unwrap();
}
