//! End-to-end multi-node rail campaign: `railguard-prober peer-endpoint` processes on loopback
//! addresses (127.0.0.x), each a simulated node (node model + simulated RDMA engine), talking
//! over real TCP side channels; the `railguard-prober campaign` coordinator process against
//! the real kube-apiserver (profile from the API, endpoints from node annotations, Lease for
//! leader election, server-side apply of the findings into each node's certificate).
//!
//! Injected: (a) node-2 with a degraded rail (mlx5_4 trained at 200 instead of 400), (b) a
//! dead path between node-4 and node-5 on mlx5_0, (c) node-7 dead, and a bad input: node-8's
//! endpoint holds the wrong token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use railguard_api::{
    keys, profiles_from_yaml, Certificate, FabricProfile, FabricState, NodeFabric, RailVerdict,
    Verdict,
};
use railguard_tests::ports::logged_listen_addr;
use railguard_tests::{labels, workspace_root, ControlPlane};
use serde_json::json;

const TOKEN: &str = "e2e-campaign-shared-token-42";

/// The prober binary: `RAILGUARD_PROBER_BIN`, else built next to this test binary.
fn prober_bin() -> PathBuf {
    if let Ok(p) = std::env::var("RAILGUARD_PROBER_BIN") {
        return PathBuf::from(p);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "-p",
            "railguard-prober-cli",
            "--bin",
            "railguard-prober",
        ])
        .status()
        .expect("run cargo build for the prober");
    assert!(status.success(), "building railguard-prober failed");
    // target/debug/deps/campaign_e2e-* -> target/debug/railguard-prober
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("railguard-prober");
    assert!(bin.is_file(), "{} is missing", bin.display());
    bin
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn certificate(profile: &FabricProfile, node: &str) -> Certificate {
    let now = jiff::Timestamp::now();
    let mut c =
        railguard_sim::certificates::certificate(profile, Verdict::Certified, now, 384.0, 0.0);
    c.expires_at = now + jiff::SignedDuration::from_hours(6);
    c.node = Some(node.to_string());
    for r in &mut c.rails {
        r.write_bw_gpu_gbps = None;
        r.latency_us = Some(2.5);
    }
    c.nccl = None;
    c.software = BTreeMap::from([("driver".to_string(), "550.54.15".to_string())]);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_names_the_culprits_in_certificates_and_keeps_healthy_nodes_certified() {
    let bin = prober_bin();
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let client = cp.client();
    let root = workspace_root();
    let profile_yaml =
        std::fs::read_to_string(root.join("api/fixtures/profiles/dgx-h100-ndr.yaml")).unwrap();
    let profile = profiles_from_yaml(&profile_yaml).unwrap().remove(0);
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    cp.create_namespace("railguard", &labels(&[]))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let wrong_token = dir.path().join("wrong-token");
    std::fs::write(&wrong_token, "a-token-nobody-else-has-123").unwrap();
    let models = root.join("prober/models");

    let nodes: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..9).map(|i| format!("node-{i}")).collect();
    let mut endpoints = Vec::new();
    for (i, name) in names.iter().enumerate() {
        cp.create_node(
            name,
            &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
            &[("nvidia.com/gpu", "8")],
        )
        .await
        .unwrap();
        // What the certifier would have published: certified, with labels that match.
        let cert = certificate(&profile, name);
        let patch = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    keys::LABEL_FABRIC: "certified",
                    keys::LABEL_PROFILE: profile.name(),
                    keys::LABEL_SIGNATURE: profile.spec.signature(),
                },
                "annotations": {
                    keys::ANNOTATION_CERTIFICATE: cert.to_annotation().unwrap(),
                },
            }
        });
        nodes
            .patch(
                name,
                &PatchParams::apply(keys::PROBER_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .unwrap();
        let model = if i == 2 {
            "h100-rate-downshift.yaml"
        } else {
            "dgx-h100.yaml"
        };
        // Port 0 on the node's own loopback address; the endpoint logs the port it got.
        let listen = format!("127.0.0.{}:0", 50 + i);
        let log = cp.log_dir().join(format!("endpoint-{name}.log"));
        let mut cmd = Command::new(&bin);
        cmd.arg("peer-endpoint")
            .args(["--node", name, "--profile", "h100-ndr", "--listen", &listen])
            .arg("--token-file")
            .arg(if i == 8 { &wrong_token } else { &token_file })
            .arg("--sim")
            .arg(models.join(model))
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .env("RAILGUARD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if i == 4 {
            cmd.args(["--sim-link", "node-5=dead@mlx5_0"]);
        }
        let mut child = Proc(cmd.spawn().unwrap());
        let addr = logged_listen_addr(&mut child.0, &log, "--listen", Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("endpoint {name} did not start: {e:#}"))
            .to_string();
        // Where the node's peer endpoint listens (set by whoever deploys the endpoint).
        nodes
            .patch(
                name,
                &PatchParams::apply("railguard-tests").force(),
                &Patch::Apply(&json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": { "name": name, "annotations": { "railguard.io/peer-endpoint": addr } },
                })),
            )
            .await
            .unwrap();
        endpoints.push(Some(child));
    }
    // (c) node-7 dies.
    endpoints[7] = None;

    let coordinator = |identity: &str| {
        Command::new(&bin)
            .arg("campaign")
            .args([
                "--profile",
                "h100-ndr",
                "--lease-name",
                "railguard-campaign",
                "--lease-namespace",
                "railguard",
            ])
            .args([
                "--identity",
                identity,
                "--test-timeout-secs",
                "20",
                "--iterations",
                "10",
            ])
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .arg("--token-file")
            .arg(&token_file)
            .env("RAILGUARD_LOG", "info")
            .output()
            .unwrap()
    };
    let out = coordinator("coordinator-a");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Faults were found: exit status 1 (a failed verdict), not 2 (an error).
    assert_eq!(
        out.status.code(),
        Some(1),
        "campaign did not report its findings:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("node node-2: rail mlx5_4:1 degraded"),
        "{stdout}"
    );

    let now = jiff::Timestamp::now();
    let mut fabric = BTreeMap::new();
    for name in &names {
        let node = nodes.get(name).await.unwrap();
        fabric.insert(name.clone(), (NodeFabric::from_node(&node, now), node));
    }
    let cert_of = |n: &str| fabric[n].0.state.certificate().cloned().unwrap();

    // (a) the degraded rail is node-2's, named with its healthy peers and values.
    let (f2, node2) = &fabric["node-2"];
    assert!(
        matches!(f2.state, FabricState::Degraded(_)),
        "{}: {:?}",
        f2.state,
        node2.metadata
    );
    let c2 = cert_of("node-2");
    let rail = c2.rail("mlx5_4", 1).unwrap();
    assert_eq!(rail.verdict, RailVerdict::Degraded);
    assert!(
        rail.reasons[0].contains("node-1")
            && rail.reasons[0].contains("node-3")
            && rail.reasons[0].contains("Gb/s"),
        "{:?}",
        rail.reasons
    );
    assert!(
        rail.wire
            .iter()
            .all(|w| !w.ok && w.write_bw_gbps.unwrap() < 200.0),
        "{:?}",
        rail.wire
    );
    assert_eq!(c2.rail("mlx5_0", 1).unwrap().verdict, RailVerdict::Healthy);
    assert_eq!(
        c2.software["driver"], "550.54.15",
        "the rest of the certificate is kept"
    );
    let cond = node2
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == keys::CONDITION_FABRIC_READY)
        .unwrap();
    assert_eq!(cond.status, "False");
    assert!(cond
        .message
        .as_deref()
        .unwrap_or_default()
        .contains("mlx5_4:1"));

    // (c) the dead node is the node.
    let (f7, _) = &fabric["node-7"];
    assert!(matches!(f7.state, FabricState::Failed(_)), "{}", f7.state);
    assert!(cert_of("node-7")
        .reasons
        .iter()
        .any(|r| r.contains("every rail")));

    // (b) the link is the link: both ends stay certified, their certificates name it.
    for n in ["node-4", "node-5"] {
        let (f, _) = &fabric[n];
        assert!(
            matches!(f.state, FabricState::Certified(_)),
            "{n}: {}",
            f.state
        );
        let c = cert_of(n);
        assert!(
            c.reasons
                .iter()
                .any(|r| r.contains("link node-4<->node-5 on mlx5_0:1")
                    && r.contains("cable or switch port")),
            "{n}: {:?}",
            c.reasons
        );
        let peer = if n == "node-4" { "node-5" } else { "node-4" };
        let w = c
            .rail("mlx5_0", 1)
            .unwrap()
            .wire
            .iter()
            .find(|w| w.peer == peer)
            .cloned()
            .unwrap();
        assert!(
            !w.ok && w.note.as_deref().unwrap_or_default().contains("retry"),
            "{w:?}"
        );
        assert!(c
            .rail("mlx5_3", 1)
            .unwrap()
            .wire
            .iter()
            .any(|w| w.peer == peer && w.ok));
    }

    // Healthy nodes stay certified, with passing wire entries from at least two peers.
    for n in ["node-0", "node-1", "node-3", "node-6"] {
        let (f, _) = &fabric[n];
        assert!(
            matches!(f.state, FabricState::Certified(_)),
            "{n}: {}",
            f.state
        );
        let c = cert_of(n);
        assert!(c.reasons.is_empty(), "{n}: {:?}", c.reasons);
        let peers: std::collections::BTreeSet<&str> = c
            .rails
            .iter()
            .flat_map(|r| r.wire.iter())
            .filter(|w| w.ok)
            .map(|w| w.peer.as_str())
            .collect();
        assert!(peers.len() >= 2, "{n} passed with {peers:?}");
    }
    // Bad input: node-8's endpoint has the wrong token. It proves nothing and is not blamed;
    // its certificate is untouched.
    let (f8, _) = &fabric["node-8"];
    assert!(
        matches!(f8.state, FabricState::Certified(_)),
        "{}",
        f8.state
    );
    assert_eq!(
        cert_of("node-8"),
        certificate_without_times(&cert_of("node-8"), &profile)
    );
    assert!(stdout.contains("authentication"), "{stdout}");

    // The Lease names the leader; a second coordinator leaves everything alone.
    let lease = Api::<Lease>::namespaced(client.clone(), "railguard")
        .get("railguard-campaign")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("coordinator-a")
    );
    let before: Vec<String> = {
        let mut v = Vec::new();
        for n in &names {
            let node = nodes.get(n).await.unwrap();
            v.push(node.metadata.resource_version.unwrap_or_default());
        }
        v
    };
    let out = coordinator("coordinator-b");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("held by another coordinator"));
    for (n, rv) in names.iter().zip(before) {
        assert_eq!(
            nodes
                .get(n)
                .await
                .unwrap()
                .metadata
                .resource_version
                .unwrap_or_default(),
            rv,
            "{n} changed"
        );
    }
    drop(endpoints);
}

/// The certificate node-8 started with (times and all), rebuilt from what it holds now: the
/// campaign must not have changed a single field.
fn certificate_without_times(now: &Certificate, profile: &FabricProfile) -> Certificate {
    let mut c = certificate(profile, "node-8");
    c.issued_at = now.issued_at;
    c.expires_at = now.expires_at;
    c
}
