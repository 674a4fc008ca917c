//! Node identity in a campaign, against the real kube-apiserver: every endpoint runs in
//! coordinator mode and proves its node with a bound service-account token of a Pod whose
//! `spec.nodeName` is that node (TokenRequest with a Pod `boundObjectRef`, as the kubelet's
//! projected volume would mount it); the `railguard-prober campaign` coordinator reviews
//! those tokens (TokenReview) and proves itself to the endpoints with tokens of its own
//! account. An endpoint whose pod runs on node-1 but which claims node-3 is left out; a
//! holder of the shared token can neither act as the coordinator nor pose as a peer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use railguard_campaign::endpoint::request;
use railguard_campaign::wire::{AcceptPeerRequest, ControlRequest};
use railguard_prober::rdma::peer::{run_write_test_initiator, PairKey, PeerTestRequest};
use railguard_prober::rdma::{PeerConfig, RailLocks};
use railguard_tests::ports::logged_listen_addr;
use railguard_tests::{labels, workspace_root, ControlPlane};
use serde_json::json;

const TOKEN: &str = "e2e-identity-shared-token-42";
const NS: &str = "railguard";

fn prober_bin() -> PathBuf {
    std::env::var("RAILGUARD_PROBER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            railguard_tests::workspace_binary("railguard-prober-cli", "railguard-prober").unwrap()
        })
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn service_account(client: &kube::Client, name: &str) {
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": { "name": name }, "automountServiceAccountToken": false,
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

/// A prober Pod bound to `node`, and the token the kubelet would project into it.
async fn prober_pod_token(client: &kube::Client, node: &str) -> String {
    let name = format!("prober-{node}");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "serviceAccountName": "railguard-prober",
            "automountServiceAccountToken": false,
            "containers": [{ "name": "peer-endpoint", "image": "railguard/prober:test" }],
        },
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["railguard-campaign".into()],
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .create_token_request("railguard-prober", &PostParams::default(), &req)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_claiming_another_node_is_refused_and_the_shared_token_speaks_for_nobody() {
    let bin = prober_bin();
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let client = cp.client();
    let root = workspace_root();
    cp.create_fixture_profile("dgx-h100-ndr.yaml")
        .await
        .unwrap();
    cp.create_namespace(NS, &labels(&[])).await.unwrap();
    service_account(&client, "railguard-prober").await;
    service_account(&client, "railguard-campaign").await;

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let models = root.join("prober/models");
    let names: Vec<String> = (0..4).map(|i| format!("node-{i}")).collect();
    let mut tokens = Vec::new();
    for name in &names {
        cp.create_h100_node(name).await.unwrap();
        tokens.push(prober_pod_token(&client, name).await);
    }
    let mut endpoints = Vec::new();
    let mut addrs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        // node-3's endpoint holds the token of the pod on node-1.
        let identity = dir.path().join(format!("identity-{name}"));
        std::fs::write(&identity, &tokens[if i == 3 { 1 } else { i }]).unwrap();
        let child = Command::new(&bin)
            .arg("peer-endpoint")
            .args([
                "--node",
                name,
                "--profile",
                "h100-ndr",
                "--listen",
                // Port 0 on the node's own loopback address; the endpoint logs its port.
                &format!("127.0.0.{}:0", 120 + i),
            ])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--sim")
            .arg(models.join("dgx-h100.yaml"))
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .args([
                "--coordinator-service-account",
                "railguard/railguard-campaign",
            ])
            .arg("--identity-token-file")
            .arg(&identity)
            .env("RAILGUARD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(cp.log_dir(), name))
            .spawn()
            .unwrap();
        let mut endpoint = Proc(child);
        let log = cp.log_dir().join(format!("endpoint-id-{name}.log"));
        let addr = logged_listen_addr(&mut endpoint.0, &log, "--listen", Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{name} did not start: {e:#}"))
            .to_string();
        cp.annotate_peer_endpoint(name, &addr).await.unwrap();
        addrs.push(addr);
        endpoints.push(endpoint);
    }

    let out = Command::new(&bin)
        .arg("campaign")
        .args(["--profile", "h100-ndr", "--dry-run", "--json"])
        .args(["--test-timeout-secs", "20", "--iterations", "10"])
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .arg("--token-file")
        .arg(&token_file)
        .args([
            "--coordinator-service-account",
            "railguard/railguard-campaign",
        ])
        .args(["--endpoint-service-account", "railguard/railguard-prober"])
        .env("RAILGUARD_LOG", "info")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // The impostor is left out with the reason; the others were tested with each other.
    let reason = report["refused"]["node-3"].as_str().unwrap_or_default();
    assert!(
        reason.contains("runs on node node-1, the endpoint claims node node-3"),
        "{report:#}"
    );
    assert_eq!(report["nodes"], json!(["node-0", "node-1", "node-2"]));
    let tests = report["tests"].as_array().unwrap();
    assert!(!tests.is_empty());
    // Every test ran on pair keys (the endpoints take nothing else) and measured every rail.
    for t in tests {
        for r in t["rails"].as_array().unwrap() {
            assert_eq!(r["report"]["outcome"], "measured", "{t:#}");
        }
    }

    // The shared token no longer makes anyone the coordinator: node-0's endpoint takes no
    // pair key and gives no identity without the coordinator's token for the connection.
    let t = Duration::from_secs(5);
    let announce = ControlRequest::AcceptPeer(AcceptPeerRequest {
        peer_node: "node-1".into(),
        pair_key: PairKey::random().to_hex(),
        ttl_ms: 60_000,
    });
    for req in [announce, ControlRequest::Identify] {
        let e = request(&addrs[0], TOKEN.as_bytes(), &req, None, t, t)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("closed the control channel"), "{e}");
    }
    let log = std::fs::read_to_string(cp.log_dir().join("endpoint-id-node-0.log")).unwrap();
    assert!(log.contains("not the coordinator"), "{log}");

    // Nor a peer: holding the shared token, a node posing as node-1 cannot pass node-0's side
    // channel handshake (node-0 wants node-1's pair key).
    let impostor = PeerConfig::new("node-1", "h100-ndr", TOKEN).unwrap();
    let engine = railguard_sim::node::engine(
        &railguard_sim::NodeModel::load(&models.join("dgx-h100.yaml")).unwrap(),
        "node-1",
        &[],
        &[],
    )
    .unwrap();
    let addr0 = addrs[0].clone();
    let r = tokio::task::spawn_blocking(move || {
        run_write_test_initiator(
            &addr0,
            &impostor,
            &engine,
            &RailLocks::new(),
            &PeerTestRequest::host("mlx5_0", 1),
        )
    })
    .await
    .unwrap();
    let e = r.unwrap_err();
    assert!(
        e.to_string().contains("failed authentication") || e.to_string().contains("closed"),
        "{e}"
    );
    drop(endpoints);
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(format!("endpoint-id-{name}.log"))).unwrap()
}
