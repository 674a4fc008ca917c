//! End-to-end: railguard-webhook in cluster mode (reflector caches on a real kube-apiserver
//! 1.20), registered through a v1 MutatingWebhookConfiguration with `clientConfig.url` on
//! loopback; pods created through the API server, assertions on the stored pods and on the
//! warnings the API server returns to the client.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use railguard_api::profile::{AdmissionMode, Enforcement};
use railguard_api::{profiles_from_yaml, FabricProfile};
use railguard_tests::{
    eventually, labels, pod_webhook_entry, workspace_root, ControlPlane, ServingCertificate,
};
use railguard_webhook::decisions::{CacheLimits, DecisionCache};
use railguard_webhook::{FailureMode, WebhookConfig};
use railguard_webhook_cli::catalog::Catalog;
use railguard_webhook_cli::metrics::Metrics;
use railguard_webhook_cli::server::{self, AppState, ServeOptions};
use railguard_webhook_cli::tls::CertReloader;
use serde_json::{json, Value};

fn fixture_profile(file: &str) -> FabricProfile {
    let text =
        std::fs::read_to_string(workspace_root().join("api/fixtures/profiles").join(file)).unwrap();
    profiles_from_yaml(&text).unwrap().remove(0)
}

/// What the API server answered to a pod create.
struct Created {
    status: u16,
    body: Value,
    warnings: Vec<String>,
}

impl Created {
    fn pod(&self) -> Pod {
        assert_eq!(self.status, 201, "create failed: {}", self.body);
        serde_json::from_value(self.body.clone()).unwrap()
    }
}

/// Creates a pod with a raw request so the `Warning` headers can be read.
async fn create_pod(client: &Client, namespace: &str, pod: Value) -> Created {
    let req = kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
        .create(
            &PostParams {
                field_manager: Some("railguard-e2e".into()),
                ..Default::default()
            },
            serde_json::to_vec(&pod).unwrap(),
        )
        .unwrap()
        .map(kube::client::Body::from);
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).to_string())
        .collect();
    let bytes = resp.into_body().collect_bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Created {
        status,
        body,
        warnings,
    }
}

fn gpu_pod(name: &str, gpus: u32, annotations: Value, env: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations,
            "labels": {"training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica-type": "worker"}},
        "spec": {
            "containers": [
                {"name": "pytorch", "image": "registry.invalid/pytorch:24.05",
                 "env": env,
                 "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}},
                {"name": "log-shipper", "image": "registry.invalid/fluent-bit:3.0"}
            ]
        }
    })
}

fn env_of(c: &Container) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn caps(c: &Container) -> Vec<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default()
}

fn annotation(p: &Pod, key: &str) -> Option<String> {
    p.metadata.annotations.as_ref()?.get(key).cloned()
}

fn has_shm(p: &Pod) -> bool {
    let spec = p.spec.as_ref().unwrap();
    spec.volumes
        .iter()
        .flatten()
        .any(|v| v.name == "railguard-shm")
        && spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/dev/shm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_configures_pods_created_through_the_api_server() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let client = cp.client();

    // Profiles: the default H100 pool (exemptions by namespace label), the RoCE pool
    // (networks, per-GPU RDMA) and a strict pool that denies unsafe NCCL settings.
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    let h100 = fixture_profile("dgx-h100-ndr.yaml");
    let mut strict = h100.clone();
    strict.metadata.name = Some("h100-strict".into());
    strict.spec.default = false;
    strict.spec.node_selector = BTreeMap::from([("railguard.io/pool".into(), "strict".into())]);
    strict.spec.policy.unsafe_nccl = Enforcement::Deny;
    // A pool still in Audit while the webhook enforces (a profile's own policy.mode).
    let mut audited = h100.clone();
    audited.metadata.name = Some("h100-audit".into());
    audited.spec.default = false;
    audited.spec.node_selector = BTreeMap::from([("railguard.io/pool".into(), "audit".into())]);
    audited.spec.policy.mode = Some(AdmissionMode::Audit);
    for p in [
        h100.clone(),
        fixture_profile("roce-cloud.yaml"),
        strict,
        audited,
    ] {
        profiles.create(&PostParams::default(), &p).await.unwrap();
    }
    for (ns, l) in [
        ("train", labels(&[])),
        (
            "train-exempt",
            labels(&[("railguard.io/exemptions", "allowed")]),
        ),
        (
            "train-baseline",
            labels(&[("pod-security.kubernetes.io/enforce", "baseline")]),
        ),
        ("railguard-system", labels(&[])),
    ] {
        cp.create_namespace(ns, &l).await.unwrap();
    }

    // The webhook in cluster mode on loopback.
    let tmp = tempfile::tempdir().unwrap();
    let tls = ServingCertificate::loopback("railguard-webhook-ca").unwrap();
    tls.write_pair(tmp.path()).unwrap();
    let metrics = Arc::new(Metrics::new());
    let catalog = Catalog::cluster(client.clone(), metrics.clone());
    let state = Arc::new(AppState {
        catalog: catalog.clone(),
        config: WebhookConfig {
            excluded_namespaces: vec!["kube-system".into(), "railguard-system".into()],
            ..WebhookConfig::default()
        },
        failure_mode: FailureMode::Closed,
        metrics,
        decisions: DecisionCache::new(CacheLimits::default()),
        node_guard: None,
    });
    let reloader =
        CertReloader::new(&tmp.path().join("tls.crt"), &tmp.path().join("tls.key")).unwrap();
    let srv = server::start(state, reloader, ServeOptions::default())
        .await
        .unwrap();
    let readyz = format!("http://{}/readyz", srv.metrics_addr);
    eventually(Duration::from_secs(30), "webhook caches synced", || async {
        let ready = reqwest_status(&readyz).await == Some(200);
        Ok((ready && catalog.profiles().len() == 4).then_some(()))
    })
    .await
    .unwrap();

    // Two entries calling the same endpoint: the second sees the pod the first mutated
    // and must return an empty patch (the reinvocation contract).
    let webhook = |name: &str| pod_webhook_entry(name, srv.addr.port());
    let mut mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "railguard"},
        "webhooks": [webhook("pods.railguard.io"), webhook("pods-again.railguard.io")],
    }))
    .unwrap();
    for w in mwc.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(ByteString(tls.ca_pem.as_bytes().to_vec()));
    }
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(
            &PostParams {
                field_manager: Some("railguard-e2e".into()),
                ..Default::default()
            },
            &mwc,
        )
        .await
        .unwrap();

    // The API server picks the configuration up asynchronously: probe until it calls us.
    let mut n = 0;
    eventually(
        Duration::from_secs(30),
        "API server calls the webhook",
        || {
            n += 1;
            let client = client.clone();
            async move {
                let c = create_pod(
                    &client,
                    "train",
                    gpu_pod(&format!("probe-{n}"), 1, json!({}), json!([])),
                )
                .await;
                Ok(annotation(&c.pod(), "railguard.io/profile").map(|_| ()))
            }
        },
    )
    .await
    .unwrap();

    // A PyTorchJob-style worker in a namespace without exemptions: fully configured.
    let c = create_pod(
        &client,
        "train",
        gpu_pod(
            "worker-0",
            8,
            json!({}),
            json!([{"name": "MASTER_ADDR", "value": "llama-master-0"}]),
        ),
    )
    .await;
    let pod = c.pod();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let spec = pod.spec.as_ref().unwrap();
    let env = env_of(&spec.containers[0]);
    assert_eq!(env["NCCL_IB_HCA"], h100.spec.nccl_ib_hca());
    assert_eq!(env["NCCL_SOCKET_IFNAME"], "=eth0");
    assert_eq!(env["MASTER_ADDR"], "llama-master-0");
    assert_eq!(caps(&spec.containers[0]), ["IPC_LOCK"]);
    assert!(has_shm(&pod));
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    let requests = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(limits["rdma/rdma_shared_device_a"].0, "1");
    assert_eq!(requests["rdma/rdma_shared_device_a"].0, "1");
    assert_eq!(
        spec.containers[1].env, None,
        "the non-GPU container is untouched"
    );
    assert!(spec.containers[1].security_context.is_none());
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    let keys: Vec<(&str, Vec<String>)> = terms[0]
        .match_expressions
        .iter()
        .flatten()
        .map(|e| (e.key.as_str(), e.values.clone().unwrap_or_default()))
        .collect();
    // The profile does not accept simulated certificates: a node certified by a simulated
    // engine or stand-in (railguard.io/simulated) is kept out too.
    assert_eq!(
        keys,
        vec![
            ("railguard.io/fabric", vec!["certified".to_string()]),
            ("railguard.io/profile", vec!["h100-ndr".to_string()]),
            ("railguard.io/simulated", vec![]),
        ]
    );
    let simulated = terms[0]
        .match_expressions
        .iter()
        .flatten()
        .find(|e| e.key == "railguard.io/simulated")
        .unwrap();
    assert_eq!(simulated.operator, "DoesNotExist");
    assert_eq!(
        annotation(&pod, "railguard.io/profile").as_deref(),
        Some("h100-ndr")
    );
    assert_eq!(
        annotation(&pod, "railguard.io/signature"),
        Some(h100.spec.signature())
    );
    assert_eq!(
        annotation(&pod, "railguard.io/mutations").as_deref(),
        Some("nccl-env,ipc-lock,shm,rdma,affinity")
    );

    // Exemptions where the profile does not allow them: ignored, and the client is told.
    let c = create_pod(
        &client,
        "train",
        gpu_pod(
            "skip-ignored",
            8,
            json!({"railguard.io/skip": "shm", "railguard.io/inject": "false"}),
            json!([]),
        ),
    )
    .await;
    let pod = c.pod();
    assert!(has_shm(&pod), "skip was ignored");
    assert!(
        c.warnings.iter().any(|w| w.contains(
            "railguard.io/skip ignored: namespace train may not use exemptions of profile h100-ndr"
        )),
        "{:?}",
        c.warnings
    );
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("railguard.io/inject=false ignored")));

    // The same annotations where the profile allows exemptions: honored, silently.
    let c = create_pod(
        &client,
        "train-exempt",
        gpu_pod(
            "skip-honored",
            8,
            json!({"railguard.io/skip": "shm"}),
            json!([]),
        ),
    )
    .await;
    let pod = c.pod();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert!(!has_shm(&pod));
    assert_eq!(
        caps(&pod.spec.as_ref().unwrap().containers[0]),
        ["IPC_LOCK"]
    );
    let c = create_pod(
        &client,
        "train-exempt",
        gpu_pod(
            "opted-out",
            8,
            json!({"railguard.io/inject": "false"}),
            json!([]),
        ),
    )
    .await;
    let pod = c.pod();
    assert_eq!(annotation(&pod, "railguard.io/profile"), None);
    assert_eq!(pod.spec.as_ref().unwrap().containers[0].env, None);

    // Unsafe NCCL settings: a warning through the API server.
    let c = create_pod(
        &client,
        "train",
        gpu_pod(
            "debug",
            8,
            json!({}),
            json!([{"name": "NCCL_DEBUG", "value": "INFO"}]),
        ),
    )
    .await;
    c.pod();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("container pytorch: NCCL_DEBUG=INFO persisted")),
        "{:?}",
        c.warnings
    );

    // ... and a denial where the profile says so.
    let c = create_pod(
        &client,
        "train",
        gpu_pod(
            "strict",
            8,
            json!({"railguard.io/profile": "h100-strict"}),
            json!([{"name": "NCCL_NET_GDR_LEVEL", "value": "SYS"}]),
        ),
    )
    .await;
    assert_eq!(c.status, 403, "{}", c.body);
    assert!(
        c.body["message"]
            .as_str()
            .unwrap()
            .contains("profile h100-strict denies unsafe NCCL settings: NCCL_NET_GDR_LEVEL"),
        "{}",
        c.body
    );

    // Pod Security baseline rejects IPC_LOCK: not injected, and the label is named.
    let c = create_pod(
        &client,
        "train-baseline",
        gpu_pod("psa", 8, json!({}), json!([])),
    )
    .await;
    let pod = c.pod();
    assert!(caps(&pod.spec.as_ref().unwrap().containers[0]).is_empty());
    assert!(has_shm(&pod));
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("pod-security.kubernetes.io/enforce=baseline")),
        "{:?}",
        c.warnings
    );

    // The RoCE pool, chosen by nodeSelector: per-GPU RDMA and merged JSON networks.
    let mut roce = gpu_pod(
        "roce",
        4,
        json!({"k8s.v1.cni.cncf.io/networks": r#"[{"name":"storage","interface":"st0"}]"#}),
        json!([]),
    );
    roce["spec"]["nodeSelector"] = json!({"node.kubernetes.io/instance-type": "gpu-8x-roce"});
    let pod = create_pod(&client, "train", roce).await.pod();
    assert_eq!(
        annotation(&pod, "railguard.io/profile").as_deref(),
        Some("roce-cloud")
    );
    let nets: Vec<Value> =
        serde_json::from_str(&annotation(&pod, "k8s.v1.cni.cncf.io/networks").unwrap()).unwrap();
    let names: Vec<&str> = nets.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["storage", "sriov-rdma-0", "sriov-rdma-1"]);
    let limits = pod.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .clone()
        .unwrap();
    assert_eq!(limits["nvidia.com/sriov_rdma"].0, "4");

    // Untouched: the webhook's own namespace, and an MPIJob launcher without GPUs.
    let pod = create_pod(
        &client,
        "railguard-system",
        gpu_pod("own", 8, json!({}), json!([])),
    )
    .await
    .pod();
    assert_eq!(annotation(&pod, "railguard.io/profile"), None);
    let mut launcher = gpu_pod("launcher", 0, json!({}), json!([]));
    launcher["spec"]["containers"][0]["resources"] = json!({});
    let pod = create_pod(&client, "train", launcher).await.pod();
    assert_eq!(annotation(&pod, "railguard.io/profile"), None);
    assert_eq!(pod.spec.as_ref().unwrap().containers[0].env, None);

    // Audit: the pod is stored as submitted but for the record of what railguard would
    // have applied; the client is told. The second entry finds the record in place.
    let mut audit_pod = gpu_pod("audited-0", 8, json!({}), json!([]));
    audit_pod["spec"]["nodeSelector"] = json!({"railguard.io/pool": "audit"});
    let c = create_pod(&client, "train", audit_pod.clone()).await;
    let pod = c.pod();
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.containers[0].env, None, "nothing applied in Audit");
    assert!(caps(&spec.containers[0]).is_empty() && !has_shm(&pod));
    assert!(spec.affinity.is_none());
    assert_eq!(annotation(&pod, "railguard.io/profile"), None);
    let record: Value =
        serde_json::from_str(&annotation(&pod, "railguard.io/audit").expect("audit record"))
            .unwrap();
    assert_eq!(record["profile"], "h100-audit");
    assert_eq!(record["would"], "mutate");
    // The recorded patch is what Enforce would have applied to the pod as admission saw it
    // (the stored pod without the record; the API server defaults requests from limits
    // before it calls a mutating webhook).
    let patch: json_patch::Patch = serde_json::from_value(record["patch"].clone()).unwrap();
    let mut submitted = serde_json::to_value(&pod).unwrap();
    let notes = submitted["metadata"]["annotations"]
        .as_object_mut()
        .unwrap();
    notes.remove("railguard.io/audit");
    if notes.is_empty() {
        submitted["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
    }
    json_patch::patch(&mut submitted, &patch).unwrap();
    let would: Pod = serde_json::from_value(submitted).unwrap();
    assert_eq!(
        env_of(&would.spec.as_ref().unwrap().containers[0])["NCCL_IB_HCA"],
        h100.spec.nccl_ib_hca()
    );
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("audit: profile h100-audit would apply nccl-env,")),
        "{:?}",
        c.warnings
    );
    // A pod that asks for another GPU product is not forced onto the default H100 profile.
    let mut h200 = gpu_pod("h200-0", 8, json!({}), json!([]));
    h200["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "NVIDIA-H200"});
    let c = create_pod(&client, "train", h200).await;
    let pod = c.pod();
    assert_eq!(pod.spec.as_ref().unwrap().containers[0].env, None);
    assert!(pod.spec.as_ref().unwrap().affinity.is_none());
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("rules out default profile h100-ndr")),
        "{:?}",
        c.warnings
    );

    // Every configured pod went through both entries: the second call changed nothing.
    let metrics = reqwest_text(&format!("http://{}/metrics", srv.metrics_addr)).await;
    let unchanged: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("railguard_webhook_admissions_total{outcome=\"unchanged\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        unchanged >= 7,
        "second-entry calls must be no-ops:\n{metrics}"
    );
    assert!(!metrics.contains("outcome=\"error\""), "{metrics}");

    // A job's pods from one template (generateName: the API server names them after
    // admission): the second is answered from the decision cache with the same
    // configuration; once the profile changes, the next pod of the template gets the new one.
    let mut template = gpu_pod("unused", 8, json!({}), json!([]));
    let meta = template["metadata"].as_object_mut().unwrap();
    meta.remove("name");
    meta.insert("generateName".into(), json!("llama-worker-"));
    let hits = || async {
        let metrics = reqwest_text(&format!("http://{}/metrics", srv.metrics_addr)).await;
        metrics
            .lines()
            .find(|l| {
                l.starts_with("railguard_webhook_decision_cache_lookups_total{result=\"hit\"}")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let hits_before = hits().await;
    let first = create_pod(&client, "train", template.clone()).await.pod();
    let second = create_pod(&client, "train", template.clone()).await.pod();
    assert_ne!(first.metadata.name, second.metadata.name);
    let trainer_env = |p: &Pod| env_of(&p.spec.as_ref().unwrap().containers[0]);
    assert_eq!(trainer_env(&first), trainer_env(&second));
    assert!(trainer_env(&first).contains_key("NCCL_IB_HCA"));
    assert!(hits().await > hits_before, "the second pod was a cache hit");
    profiles
        .patch(
            "h100-ndr",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nccl": {"env": {"NCCL_IB_RETRY_CNT": "13"}}}})),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the webhook sees the new profile",
        || async {
            let seen = catalog.profiles().iter().any(|p| {
                p.name() == "h100-ndr" && p.spec.nccl.env.contains_key("NCCL_IB_RETRY_CNT")
            });
            Ok(seen.then_some(()))
        },
    )
    .await
    .unwrap();
    let third = create_pod(&client, "train", template).await.pod();
    assert_eq!(
        trainer_env(&third)
            .get("NCCL_IB_RETRY_CNT")
            .map(String::as_str),
        Some("13"),
        "a pod admitted after the profile change gets it, not the cached answer"
    );

    srv.shutdown().await.unwrap();
}

async fn reqwest_status(url: &str) -> Option<u16> {
    http_get(url).await.map(|(s, _)| s)
}

async fn reqwest_text(url: &str) -> String {
    http_get(url).await.map(|(_, b)| b).unwrap_or_default()
}

/// A minimal plain HTTP/1.0 GET (the metrics port), so the test needs no HTTP client crate.
async fn http_get(url: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}")))?;
    let mut s = tokio::net::TcpStream::connect(host).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nhost: {host}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}
