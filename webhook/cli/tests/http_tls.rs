//! The webhook over real TLS and real HTTP: AdmissionReview round trips (including the
//! review recorded from kube-apiserver 1.20), bad bodies, health and metrics, certificate
//! rotation through a Secret-volume `..data` swap, and graceful shutdown mid-request.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use railguard_webhook::node_guard::GuardPolicy;
use railguard_webhook::FailureMode;
use railguard_webhook_cli::metrics::Metrics;
use railguard_webhook_cli::node_guard_cache::nodes::NodeOutputs;
use railguard_webhook_cli::node_guard_cache::probers::ProberPods;
use railguard_webhook_cli::server::{self, NodeGuardState};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::*;

#[tokio::test]
async fn recorded_review_and_gpu_review_round_trip_over_tls() {
    let ca = Ca::new("railguard-test-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    let srv = start(&volume, FailureMode::Open).await;
    let c = client(&ca.pem());

    // The review exactly as kube-apiserver 1.20 sent it: a pod without GPUs, untouched.
    let (status, body) = post(&c, srv.addr, "/mutate", SAMPLE.as_bytes().to_vec()).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], "6e62712e-3efc-42bc-9d89-135571712f9f");
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none());

    // The same review with GPUs: a JSON patch that applies to the object.
    let review = gpu_sample();
    let (status, body) = post_json(&c, srv.addr, "/mutate", &review).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    let patch_bytes = base64::engine::general_purpose::STANDARD
        .decode(v["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch_bytes).unwrap();
    let mut object = review["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).unwrap();
    let pod: Pod = serde_json::from_value(object).unwrap();
    let ann = pod.metadata.annotations.unwrap();
    assert_eq!(ann["railguard.io/profile"], "h100-ndr");
    let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "NCCL_IB_HCA"
        && e.value
            .as_deref()
            .is_some_and(|v| v.starts_with("=mlx5_0:1,"))));

    // The next pod of the same job (another uid, managedFields a second later) is answered
    // from the decision cache: the same patch for its own uid.
    let mut next = review.clone();
    next["request"]["uid"] = json!("0d5b9a8e-2f31-4c57-9e0b-6a7f3c2d1e40");
    next["request"]["object"]["metadata"]["managedFields"][0]["time"] =
        json!("2026-11-29T07:15:40Z");
    let (status, body) = post_json(&c, srv.addr, "/mutate", &next).await;
    assert_eq!(status, 200, "{body}");
    let again: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        again["response"]["uid"],
        "0d5b9a8e-2f31-4c57-9e0b-6a7f3c2d1e40"
    );
    assert_eq!(again["response"]["patch"], v["response"]["patch"]);

    // Production serves no benchmark endpoint.
    let (status, _) = post_json(&c, srv.addr, "/noop", &review).await;
    assert_eq!(status, 404);

    // Health, readiness and metrics on the plain port.
    let plain = reqwest::Client::new();
    let base = format!("http://{}", srv.metrics_addr);
    for path in ["/healthz", "/readyz"] {
        let r = plain.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let metrics = metrics(srv.metrics_addr).await;
    assert!(
        metrics.contains(
            r#"railguard_webhook_admissions_total{outcome="mutated",profile="h100-ndr"} 2"#
        ),
        "{metrics}"
    );
    assert!(metrics
        .contains(r#"railguard_webhook_admissions_total{outcome="not-training",profile=""} 1"#));
    assert!(metrics.contains("railguard_webhook_admission_duration_seconds_count 3"));
    assert!(
        metrics.contains(r#"railguard_webhook_decision_cache_lookups_total{result="hit"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"railguard_webhook_decision_cache_lookups_total{result="miss"} 2"#));
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_bodies_get_clear_answers() {
    let ca = Ca::new("railguard-test-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    let srv = start(&volume, FailureMode::Open).await;
    let c = client(&ca.pem());

    let truncated = SAMPLE.as_bytes()[..SAMPLE.len() / 2].to_vec();
    let (status, body) = post(&c, srv.addr, "/mutate", truncated).await;
    assert_eq!(status, 400);
    assert!(
        body.contains("not an AdmissionReview JSON object"),
        "{body}"
    );

    let (status, body) = post(&c, srv.addr, "/mutate", Vec::new()).await;
    assert_eq!(status, 400);
    assert!(body.contains("empty"), "{body}");

    let mut wrong_kind = sample();
    wrong_kind["kind"] = json!("ConversionReview");
    let (status, body) = post_json(&c, srv.addr, "/mutate", &wrong_kind).await;
    assert_eq!(status, 400);
    assert!(body.contains("kind is \"ConversionReview\""), "{body}");

    let mut v1beta1 = sample();
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let (status, body) = post_json(&c, srv.addr, "/mutate", &v1beta1).await;
    assert_eq!(status, 400);
    assert!(body.contains("admission.k8s.io/v1beta1"), "{body}");

    // A non-Pod object is allowed unchanged, with a warning that names it.
    let mut deployment = sample();
    deployment["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    deployment["request"]["object"] =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}});
    let (status, body) = post_json(&c, srv.addr, "/mutate", &deployment).await;
    assert_eq!(status, 200);
    assert!(allowed_warning(&body).contains("only Pods, got apps/v1/Deployment"));

    // An object that claims to be a Pod but is not one: fail open, with a warning.
    let mut broken = gpu_sample();
    broken["request"]["object"]["spec"]["containers"] = json!("not-a-list");
    let (status, body) = post_json(&c, srv.addr, "/mutate", &broken).await;
    assert_eq!(status, 200);
    assert!(allowed_warning(&body).contains("not a valid Pod"));

    // Unicode names and 200 containers.
    let mut big = gpu_sample();
    big["request"]["name"] = json!("训练-🚀");
    big["request"]["object"]["metadata"]["name"] = json!("训练-🚀");
    let c0 = big["request"]["object"]["spec"]["containers"][0].clone();
    big["request"]["object"]["spec"]["containers"] = Value::Array(
        (0..200)
            .map(|i| {
                let mut c = c0.clone();
                c["name"] = json!(format!("wörker-{i}"));
                c
            })
            .collect(),
    );
    let (status, body) = post_json(&c, srv.addr, "/mutate", &big).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"]["patch"].as_str().unwrap().len() > 10_000);

    // Over the body limit.
    let (status, _) = post(&c, srv.addr, "/mutate", vec![b' '; 2 << 20]).await;
    assert_eq!(status, 413);

    let metrics = metrics(srv.metrics_addr).await;
    assert!(
        metrics.contains("railguard_webhook_bad_requests_total 4"),
        "{metrics}"
    );
    assert!(metrics.contains(r#"railguard_webhook_internal_errors_total{failure_mode="open"} 1"#));
    assert!(metrics.contains(r#"railguard_webhook_warnings_total{kind="not-pod"} 1"#));
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn failure_mode_closed_denies_on_internal_errors() {
    let ca = Ca::new("railguard-test-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    let srv = start(&volume, FailureMode::Closed).await;
    let c = client(&ca.pem());
    let mut no_spec = gpu_sample();
    no_spec["request"]["object"]
        .as_object_mut()
        .unwrap()
        .remove("spec");
    let (status, body) = post_json(&c, srv.addr, "/mutate", &no_spec).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 403);
    assert!(v["response"]["status"]["message"]
        .as_str()
        .unwrap()
        .contains("pod has no spec"));
    srv.shutdown().await.unwrap();
}

async fn handshake_ok(ca_pem: &str, addr: std::net::SocketAddr) -> bool {
    let c = client(ca_pem);
    c.post(format!("https://127.0.0.1:{}/mutate", addr.port()))
        .body(SAMPLE)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..100 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn metric(addr: std::net::SocketAddr, needle: &str) -> bool {
    metrics(addr).await.contains(needle)
}

#[tokio::test]
async fn certificate_rotation_through_a_secret_volume_swap() {
    let old_ca = Ca::new("old-ca");
    let new_ca = Ca::new("new-ca");
    let (cert, key) = old_ca.serving_pair();
    let mut volume = SecretVolume::new(&cert, &key);
    let srv = start(&volume, FailureMode::Open).await;
    assert!(handshake_ok(&old_ca.pem(), srv.addr).await);
    assert!(!handshake_ok(&new_ca.pem(), srv.addr).await);

    // The kubelet swaps ..data to a new version with a certificate from another CA.
    let (cert2, key2) = new_ca.serving_pair();
    volume.publish(&cert2, &key2);
    wait_for("the new certificate", async || {
        handshake_ok(&new_ca.pem(), srv.addr).await
    })
    .await;
    assert!(!handshake_ok(&old_ca.pem(), srv.addr).await);

    // A broken pair (key of another certificate) is rejected; the good one stays.
    let (cert3, _) = old_ca.serving_pair();
    volume.publish(&cert3, &key2);
    wait_for("the rejection", async || {
        metric(
            srv.metrics_addr,
            r#"railguard_webhook_tls_reloads_total{result="rejected"} 1"#,
        )
        .await
    })
    .await;
    assert!(handshake_ok(&new_ca.pem(), srv.addr).await);
    assert!(!handshake_ok(&old_ca.pem(), srv.addr).await);

    // Garbage instead of PEM: rejected as well.
    volume.publish("not a certificate", "not a key");
    wait_for("the second rejection", async || {
        metric(
            srv.metrics_addr,
            r#"railguard_webhook_tls_reloads_total{result="rejected"} 2"#,
        )
        .await
    })
    .await;
    assert!(handshake_ok(&new_ca.pem(), srv.addr).await);
    assert!(
        metric(
            srv.metrics_addr,
            r#"railguard_webhook_tls_reloads_total{result="ok"} 1"#
        )
        .await
    );
    srv.shutdown().await.unwrap();
}

/// Reads one HTTP/1.1 response (headers and a Content-Length body).
async fn read_response<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "connection closed early: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk).await.unwrap();
                assert!(n > 0);
                buf.extend_from_slice(&chunk[..n]);
            }
            return (head, buf[end + 4..end + 4 + len].to_vec());
        }
    }
}

#[tokio::test]
async fn graceful_shutdown_finishes_a_request_in_flight() {
    let ca = Ca::new("railguard-test-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    let srv = start(&volume, FailureMode::Open).await;

    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();

    // Send the headers and half the body, then ask the server to stop.
    let body = serde_json::to_vec(&gpu_sample()).unwrap();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body[..body.len() / 2]).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let shutdown = tokio::spawn(srv.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !shutdown.is_finished(),
        "shutdown must wait for the request in flight"
    );
    tls.write_all(&body[body.len() / 2..]).await.unwrap();
    tls.flush().await.unwrap();
    let (head, resp) = read_response(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let v: Value = serde_json::from_slice(&resp).unwrap();
    assert!(v["response"]["patch"].is_string());
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .expect("shutdown finishes after the last request")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn draining_reports_not_ready_and_still_admits() {
    let ca = Ca::new("railguard-test-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    let srv = start(&volume, FailureMode::Open).await;
    let c = client(&ca.pem());
    let ready = |addr: std::net::SocketAddr| async move {
        reqwest::get(format!("http://{addr}/readyz"))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(ready(srv.metrics_addr).await, 200);

    // SIGTERM's first step: out of the Service's endpoints, but reviews still answered
    // (the API server may pick this pod until the endpoint update reaches it).
    srv.begin_drain();
    assert_eq!(ready(srv.metrics_addr).await, 503);
    let (status, body) = post(&c, srv.addr, "/mutate", SAMPLE.as_bytes().to_vec()).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn extra_routes_share_the_tls_listener_and_the_limits() {
    let ca = Ca::new("railguard-test-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    // What the HTTP load bench does with its `/noop` baseline.
    let routes = server::admission_routes().route(
        "/extra",
        axum::routing::post(|_body: axum::body::Bytes| async { "extra" }),
    );
    let srv = start_routes(&volume, FailureMode::Open, routes, None).await;
    let c = client(&ca.pem());
    assert_eq!(
        post(&c, srv.addr, "/extra", Vec::new()).await,
        (200, "extra".to_string())
    );
    let (status, _) = post(&c, srv.addr, "/extra", vec![b' '; 2 << 20]).await;
    assert_eq!(status, 413);
    let (status, body) = post(&c, srv.addr, "/mutate", SAMPLE.as_bytes().to_vec()).await;
    assert_eq!(status, 200, "{body}");
    srv.shutdown().await.unwrap();
}

/// With the node guard served, `/readyz` waits for its caches as well as the catalog's: a
/// replica whose prober-pod and Node watches have not listed (here: an API server that is
/// not there) is not ready, so no Node review reaches it.
#[tokio::test]
async fn readyz_waits_for_the_node_guard_caches() {
    let ca = Ca::new("railguard-test-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    let nowhere = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = kube::Client::try_from(nowhere).unwrap();
    let guard = Arc::new(NodeGuardState {
        policy: GuardPolicy {
            namespace: "railguard-system".into(),
            prober_namespace: "railguard-system".into(),
            prober_service_account: "railguard-prober".into(),
            campaign_service_account: None,
            fleet_service_account: None,
            allowed_groups: vec!["system:masters".into()],
        },
        probers: ProberPods::watch(client.clone(), "railguard-system", "app=prober"),
        nodes: NodeOutputs::watch(client),
        catalog: railguard_webhook_cli::catalog::Catalog::standalone(Vec::new()),
        metrics: Arc::new(Metrics::new()),
    });
    let routes = server::admission_routes().merge(server::node_guard_routes(guard.clone()));
    let srv = start_routes(&volume, FailureMode::Open, routes, Some(guard)).await;
    let readyz = format!("http://{}/readyz", srv.metrics_addr);
    for _ in 0..3 {
        let r = reqwest::get(&readyz).await.unwrap();
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(r.text().await.unwrap(), "node guard caches not synced\n");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    srv.shutdown().await.unwrap();
}
