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
use kube::api::{Api, Patch, PatchParams};
use railguard_api::{
    keys, Certificate, FabricProfile, FabricState, NodeFabric, RailVerdict, Verdict,
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

/// A control plane holding the h100-ndr FabricProfile and the `railguard` namespace (where
/// the campaign's Lease lives); the profile.
async fn campaign_cluster() -> (ControlPlane, FabricProfile) {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let profile = cp
        .create_fixture_profile("dgx-h100-ndr.yaml")
        .await
        .unwrap();
    cp.create_namespace("railguard", &labels(&[]))
        .await
        .unwrap();
    (cp, profile)
}

/// The token every endpoint and the coordinator share, written to `dir/token`.
fn shared_token_file(dir: &Path) -> PathBuf {
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    token_file
}

/// `railguard-prober campaign` of the h100-ndr profile on `cp`, its Lease in `railguard`,
/// 20 s a test, holding the shared token in `token_file`.
fn campaign_command(bin: &Path, cp: &ControlPlane, token_file: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg("campaign")
        .args(["--profile", "h100-ndr", "--lease-namespace", "railguard"])
        .args(["--test-timeout-secs", "20"])
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .arg("--token-file")
        .arg(token_file)
        .env("RAILGUARD_LOG", "info");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_names_the_culprits_in_certificates_and_keeps_healthy_nodes_certified() {
    let bin = prober_bin();
    let (cp, profile) = campaign_cluster().await;
    let client = cp.client();

    let dir = tempfile::tempdir().unwrap();
    let token_file = shared_token_file(dir.path());
    let wrong_token = dir.path().join("wrong-token");
    std::fs::write(&wrong_token, "a-token-nobody-else-has-123").unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..9).map(|i| format!("node-{i}")).collect();
    let mut endpoints = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let model = if i == 2 {
            "h100-rate-downshift.yaml"
        } else {
            "dgx-h100.yaml"
        };
        let token = if i == 8 { &wrong_token } else { &token_file };
        let extra: &[&str] = if i == 4 {
            &["--sim-link", "node-5=dead@mlx5_0"]
        } else {
            &[]
        };
        let child =
            certified_node_with_endpoint(&cp, &bin, &profile, name, i, model, token, extra).await;
        endpoints.push(Some(child));
    }
    // (c) node-7 dies.
    endpoints[7] = None;

    let coordinator = |identity: &str| {
        let mut c = campaign_command(&bin, &cp, &token_file);
        c.args(["--lease-name", "railguard-campaign"]).args([
            "--identity",
            identity,
            "--iterations",
            "10",
        ]);
        c.output().unwrap()
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
    let assert_certified = |n: &str| {
        let (f, _) = &fabric[n];
        assert!(
            matches!(f.state, FabricState::Certified(_)),
            "{n}: {}",
            f.state
        );
    };

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
        assert_certified(n);
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
        assert_certified(n);
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

/// A certified node `name` (labels and certificate as the certifier publishes them) with its
/// `railguard-prober peer-endpoint` on 127.0.0.(50+i), simulated as `model`, holding
/// `token_file`, with `extra` arguments; its address in the node's annotation.
#[allow(clippy::too_many_arguments)]
async fn certified_node_with_endpoint(
    cp: &ControlPlane,
    bin: &Path,
    profile: &FabricProfile,
    name: &str,
    i: usize,
    model: &str,
    token_file: &Path,
    extra: &[&str],
) -> Proc {
    let nodes: Api<Node> = Api::all(cp.client());
    let models = workspace_root().join("prober/models");
    cp.create_h100_node(name).await.unwrap();
    // What the certifier would have published: certified, with labels that match.
    let cert = certificate(profile, name);
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
    // Port 0 on the node's own loopback address; the endpoint logs the port it got.
    let listen = format!("127.0.0.{}:0", 50 + i);
    let log = cp.log_dir().join(format!("endpoint-{name}.log"));
    let mut cmd = Command::new(bin);
    cmd.arg("peer-endpoint")
        .args(["--node", name, "--profile", "h100-ndr", "--listen", &listen])
        .arg("--token-file")
        .arg(token_file)
        .arg("--sim")
        .arg(models.join(model))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .env("RAILGUARD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    cmd.args(extra);
    let mut child = Proc(cmd.spawn().unwrap());
    let addr = logged_listen_addr(&mut child.0, &log, "--listen", Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("endpoint {name} did not start: {e:#}"))
        .to_string();
    cp.annotate_peer_endpoint(name, &addr).await.unwrap();
    child
}

/// The certificate node-8 started with (times and all), rebuilt from what it holds now: the
/// campaign must not have changed a single field.
fn certificate_without_times(now: &Certificate, profile: &FabricProfile) -> Certificate {
    let mut c = certificate(profile, "node-8");
    c.issued_at = now.issued_at;
    c.expires_at = now.expires_at;
    c
}

/// A campaign started while a node's own invasive run holds it (#44): node-1's endpoint
/// shares its test lock with the node's daemon (`--test-lock-file`, as the chart renders
/// both containers); the run's hold is taken with the daemon's own call
/// (`NodeTestLock::try_exclusive`). Every test on node-1's rails is refused as busy, so it is
/// inconclusive: node-1 is not blamed, nor are its peers, and no certificate loses a rail.
/// The run over, the next campaign tests node-1 as any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_started_mid_run_leaves_the_running_node_alone_and_blames_nobody() {
    let bin = prober_bin();
    let (cp, profile) = campaign_cluster().await;
    let client = cp.client();
    let dir = tempfile::tempdir().unwrap();
    let token_file = shared_token_file(dir.path());
    let lock_file = dir.path().join("rails.lock");
    let names = ["node-0", "node-1", "node-2", "node-3"];
    let mut endpoints = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let lock = lock_file.to_str().unwrap();
        let extra: &[&str] = if *name == "node-1" {
            &["--test-lock-file", lock]
        } else {
            &[]
        };
        endpoints.push(
            certified_node_with_endpoint(
                &cp,
                &bin,
                &profile,
                name,
                i,
                "dgx-h100.yaml",
                &token_file,
                extra,
            )
            .await,
        );
    }
    let campaign = || {
        campaign_command(&bin, &cp, &token_file)
            .args(["--iterations", "1"])
            .output()
            .unwrap()
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let verdicts = || async {
        let now = jiff::Timestamp::now();
        let mut v = BTreeMap::new();
        for n in names {
            let node = nodes.get(n).await.unwrap();
            let f = NodeFabric::from_node(&node, now);
            let c = f.state.certificate().cloned().unwrap();
            v.insert(
                n.to_string(),
                (
                    f.state.kind(),
                    c.rails
                        .iter()
                        .filter(|r| r.verdict != RailVerdict::Healthy)
                        .count(),
                ),
            );
        }
        v
    };

    // node-1 is under its own invasive run.
    let run = railguard_prober::test_lock::NodeTestLock::new(&lock_file)
        .try_exclusive()
        .unwrap()
        .expect("the node is free");
    let out = campaign();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "nobody is blamed:\n{stdout}\n{stderr}"
    );
    // node-1's endpoint refused every rail, saying why; nothing was written about node-1.
    let endpoint_log = std::fs::read_to_string(cp.log_dir().join("endpoint-node-1.log")).unwrap();
    assert!(
        endpoint_log.contains("the node's own invasive certification is running"),
        "the refusal says why:\n{endpoint_log}"
    );
    assert!(
        !stderr.contains("campaign findings written node=node-1"),
        "node-1 untouched:\n{stderr}"
    );
    for (n, (state, unhealthy)) in verdicts().await {
        assert_eq!((state, unhealthy), ("certified", 0), "{n}:\n{stdout}");
    }
    drop(run);

    // The run over: node-1 is tested like the others, and the lock is free again after.
    let out = campaign();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stderr.contains("campaign findings written node=node-1"),
        "node-1 tested after the run:\n{stderr}"
    );
    for (n, (state, unhealthy)) in verdicts().await {
        assert_eq!((state, unhealthy), ("certified", 0), "{n}:\n{stdout}");
    }
    let c1 = NodeFabric::from_node(&nodes.get("node-1").await.unwrap(), jiff::Timestamp::now())
        .state
        .certificate()
        .cloned()
        .unwrap();
    assert!(
        c1.rails.iter().any(|r| r.wire.iter().any(|w| w.ok)),
        "node-1's rails tested after the run: {:?}",
        c1.rails.iter().map(|r| &r.wire).collect::<Vec<_>>()
    );
    assert!(railguard_prober::test_lock::NodeTestLock::new(&lock_file)
        .try_exclusive()
        .unwrap()
        .is_some());
    drop(endpoints);
}
