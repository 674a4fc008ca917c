//! Fault tests of the prober's writes against a real kube-apiserver: what must survive when
//! things go wrong.
//!
//! - The node's prober and the campaign coordinator write one Node's certificate at once,
//!   many rounds: neither loses the other's results (the writers' own code, `publish` and
//!   `campaign::kube::write_findings`).
//! - A coordinator whose Lease is taken by another holder mid-campaign stops and writes
//!   nothing (the real `railguard-prober campaign` binary).
//! - SIGTERM in the middle of the daemon's invasive run (a slowed all_reduce_perf stand-in):
//!   within the grace period the run finishes and publishes; past it the run is abandoned and
//!   the Node restored from its certificate. Never `pending`, never a lost certificate.
//! - A Node GET the prober may not make (403 through RBAC, writes allowed) is an error, never
//!   "no certificate": the certificate, its generation and its history stay.
//! - A `railguard.io/recertify` request on a node whose GPUs a pod holds runs nothing
//!   invasive: it is kept, an Event says why, and it is honoured once the pod is gone.
//! - Nor does one on a node that is cordoned, in a maintenance window or used by a pod of the
//!   profile's RDMA resource; once it is free the run goes, tainted `testing` meanwhile.
//! - Every invasive run is tainted `testing`, `certification.taints` off too; a GPU pod (a
//!   MIG slice) that arrives during the run stops it: the stand-in is killed, the Node is
//!   restored from its certificate, the taint lifted, the request kept and honoured once
//!   the pod is gone.
//! - A busy node keeps its certificate through ten TTLs from its jobs' traffic
//!   (`--grey-rails enforce`), until one rail falls behind its siblings and turns grey.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use railguard_api::campaign_findings::campaign_findings;
use railguard_api::campaign_findings::{NodeFindings, RailBlame};
use railguard_api::certificate::WireResult;
use railguard_api::{keys, profiles_from_yaml, Certificate, FabricProfile, RailVerdict, Verdict};
use railguard_campaign::kube::write_findings;
use railguard_prober::publish::NodePublisher;
use railguard_tests::daemon::ANY_LOOPBACK_PORT;
use railguard_tests::ports::logged_listen_addr;
use railguard_tests::sim_prober::{h100_profile_file, prober_bin_dir, Prober};
use railguard_tests::{eventually, labels, workspace_root, ApiServerOptions, ControlPlane};
use serde_json::json;

const GPU_PRODUCT: (&str, &str) = ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3");
const RDMA: &str = "rdma/rdma_shared_device_a";
/// The simulated machine every node of these tests is: it certifies against the profile.
const MODEL: &str = "dgx-h100";

fn profile() -> FabricProfile {
    profiles_from_yaml(&std::fs::read_to_string(h100_profile_file()).unwrap())
        .unwrap()
        .remove(0)
}

/// The directory of the built binaries (tests/scripts/test-all.sh builds them first).
fn bin_dir() -> PathBuf {
    prober_bin_dir().unwrap()
}

fn certified(profile: &FabricProfile, node: &str, generation: u64) -> Certificate {
    let now = jiff::Timestamp::now();
    let mut c =
        railguard_sim::certificates::certificate(profile, Verdict::Certified, now, 384.0, 0.0);
    c.expires_at = now + jiff::SignedDuration::from_hours(6);
    c.node = Some(node.to_string());
    c.generation = generation;
    c.software = BTreeMap::from([("round".to_string(), generation.to_string())]);
    c
}

/// Round `n` of the campaign: a wire entry naming the round on the first rail, and on odd
/// rounds the second rail blamed (degraded).
fn findings(profile: &FabricProfile, node: &str, n: u64) -> NodeFindings {
    let rail = |i: usize| {
        let r = &profile.spec.rails[i];
        format!("{}:{}", r.hca, r.port)
    };
    let mut f = NodeFindings {
        node: node.to_string(),
        wire: BTreeMap::from([(
            rail(0),
            vec![WireResult {
                peer: format!("round-{n}"),
                write_bw_gbps: Some(390.0),
                latency_us: Some(2.0),
                ok: true,
                tested_at: None,
                note: None,
            }],
        )]),
        ..NodeFindings::default()
    };
    if n % 2 == 1 {
        f.blamed_rails.insert(
            rail(1),
            RailBlame {
                verdict: RailVerdict::Degraded,
                reason: format!("rail {} slow with every peer in round {n}", rail(1)),
            },
        );
    }
    f
}

/// The campaign round a certificate carries (its wire entry), 0 when none.
fn campaign_round(c: &Certificate) -> u64 {
    campaign_findings(c)
        .and_then(|f| f.wire.values().flatten().next().map(|w| w.peer.clone()))
        .and_then(|p| p.strip_prefix("round-")?.parse().ok())
        .unwrap_or(0)
}

async fn node_certificate(nodes: &Api<Node>, name: &str) -> Result<(Certificate, Node)> {
    let node = nodes.get(name).await?;
    let raw = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_CERTIFICATE))
        .context("no certificate annotation")?;
    Ok((Certificate::from_annotation(raw)?, node))
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn condition(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == keys::CONDITION_FABRIC_READY)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn managers(node: &Node) -> Vec<String> {
    node.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_prober_and_the_campaign_writing_at_once_lose_nothing() -> Result<()> {
    // Odd: the campaign's last round blames a rail.
    const ROUNDS: u64 = 31;
    let cp = ControlPlane::start().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let profile = profile();
    let name = "gpu-w";
    cp.create_node(name, &labels(&[GPU_PRODUCT]), &[(RDMA, "1k")])
        .await?;
    let publisher = NodePublisher::new(client.clone(), name);
    let mut state = publisher.read_state().await?;
    publisher
        .publish(&mut state, &certified(&profile, name, 1), true)
        .await?;

    // What each writer has finished: the other's later writes must carry it.
    let prober_done = Arc::new(AtomicU64::new(1));
    let campaign_done = Arc::new(AtomicU64::new(0));
    let prober = {
        let (prober_done, campaign_done, profile) =
            (prober_done.clone(), campaign_done.clone(), profile.clone());
        async move {
            for generation in 2..=ROUNDS + 1 {
                let seen = campaign_done.load(Ordering::SeqCst);
                let mut state = publisher.read_state().await?;
                let published = publisher
                    .publish(
                        &mut state,
                        &certified(&profile, name, generation),
                        generation % 2 == 0,
                    )
                    .await?;
                assert_eq!(published.generation, generation);
                assert!(
                    campaign_round(&published) >= seen,
                    "the prober's write dropped campaign round {seen}: carries {}",
                    campaign_round(&published)
                );
                prober_done.store(generation, Ordering::SeqCst);
            }
            anyhow::Ok(())
        }
    };
    let campaign = {
        let (client, prober_done, campaign_done, profile) = (
            client.clone(),
            prober_done.clone(),
            campaign_done.clone(),
            profile.clone(),
        );
        async move {
            for round in 1..=ROUNDS {
                let seen = prober_done.load(Ordering::SeqCst);
                let written = write_findings(&client, name, &findings(&profile, name, round), None)
                    .await?
                    .context("the node has a certificate")?;
                assert!(
                    written.generation >= seen,
                    "the campaign's write dropped the prober's generation {seen}: carries {}",
                    written.generation
                );
                assert_eq!(campaign_round(&written), round);
                campaign_done.store(round, Ordering::SeqCst);
            }
            anyhow::Ok(())
        }
    };
    let (p, c) = tokio::join!(tokio::spawn(prober), tokio::spawn(campaign));
    p??;
    c??;

    // Both writers' last results are on the Node, merged: the prober's last certificate
    // and the campaign's last findings (an odd round: the second rail degraded).
    let (cert, node) = node_certificate(&nodes, name).await?;
    assert_eq!(cert.generation, ROUNDS + 1);
    assert_eq!(cert.software["round"], (ROUNDS + 1).to_string());
    assert_eq!(campaign_round(&cert), ROUNDS);
    let blamed = &profile.spec.rails[1];
    assert_eq!(
        cert.rail(&blamed.hca, blamed.port).unwrap().verdict,
        RailVerdict::Degraded
    );
    assert_eq!(cert.verdict, Verdict::Degraded);
    assert_eq!(
        label(&node, keys::LABEL_FABRIC),
        Some(keys::fabric::DEGRADED)
    );
    assert_eq!(condition(&node).map(|c| c.0).as_deref(), Some("False"));
    let m = managers(&node);
    assert!(m.iter().any(|m| m == keys::PROBER_FIELD_MANAGER), "{m:?}");
    assert!(m.iter().any(|m| m == keys::CAMPAIGN_FIELD_MANAGER), "{m:?}");

    // The next campaign clears the node: the prober's own verdict comes back.
    write_findings(&client, name, &findings(&profile, name, ROUNDS + 1), None).await?;
    let (cert, node) = node_certificate(&nodes, name).await?;
    assert_eq!(cert.verdict, Verdict::Certified);
    assert_eq!(
        label(&node, keys::LABEL_FABRIC),
        Some(keys::fabric::CERTIFIED)
    );
    Ok(())
}

/// A listener that accepts connections and never answers: a peer endpoint that hangs.
fn black_hole() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_whose_lease_is_taken_writes_nothing_more() -> Result<()> {
    let bin = bin_dir().join("railguard-prober");
    let cp = ControlPlane::start().await?;
    let client = cp.client();
    cp.create_namespace("railguard", &labels(&[])).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "railguard");
    let profile = profile();
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("token");
    std::fs::write(&token, "fault-test-campaign-shared-token\n")?;
    // Three nodes: the fewest a campaign runs on.
    let names = ["node-a", "node-b", "node-c"];
    let mut holes = Vec::new();
    let mut endpoints = Vec::new();
    for n in names {
        cp.create_node(n, &labels(&[GPU_PRODUCT]), &[]).await?;
        cp.publish_certificate(n, &certified(&profile, n, 1))
            .await?;
        let (l, addr) = black_hole();
        holes.push(l);
        endpoints.push(format!("{n}={addr}"));
    }
    let before: Vec<Certificate> = {
        let mut v = Vec::new();
        for n in names {
            v.push(node_certificate(&nodes, n).await?.0);
        }
        v
    };
    let coordinator = |identity: &str, endpoints: &[String]| {
        let mut c = tokio::process::Command::new(&bin);
        c.arg("campaign")
            .args(["--profile", "h100-ndr"])
            .arg("--profile-file")
            .arg(h100_profile_file())
            .args([
                "--lease-name",
                "railguard-campaign",
                "--lease-namespace",
                "railguard",
            ])
            .args(["--identity", identity, "--lease-duration-secs", "6"])
            .args(["--test-timeout-secs", "5", "--iterations", "10"])
            .arg("--endpoint")
            .arg(endpoints.join(","))
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .arg("--token-file")
            .arg(&token)
            .env("RAILGUARD_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    };

    // The leader runs; its lease is taken by another holder while its tests hang.
    let leader = coordinator("coordinator-a", &endpoints).spawn()?;
    eventually(
        Duration::from_secs(60),
        "coordinator-a holds the lease",
        || async {
            Ok(leases
                .get_opt("railguard-campaign")
                .await?
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| h == "coordinator-a")
                .map(|_| ()))
        },
    )
    .await?;
    let mut lease = leases.get("railguard-campaign").await?;
    let spec = lease.spec.get_or_insert_with(Default::default);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    spec.holder_identity = Some("thief".into());
    spec.renew_time = Some(now.clone());
    spec.acquire_time = Some(now);
    spec.lease_duration_seconds = Some(3600);
    leases
        .replace("railguard-campaign", &PostParams::default(), &lease)
        .await
        .context("taking the lease as another holder")?;
    let out = tokio::time::timeout(Duration::from_secs(180), leader.wait_with_output())
        .await
        .context("coordinator-a did not stop")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a lost lease is an error:\n{stderr}"
    );
    assert!(
        stderr.contains("the lease was lost") || stderr.contains("no longer the leader"),
        "{stderr}"
    );
    for (n, was) in names.iter().zip(&before) {
        let (cert, node) = node_certificate(&nodes, n).await?;
        assert_eq!(
            &cert, was,
            "{n}: the old leader wrote after losing the lease"
        );
        let m = managers(&node);
        assert!(
            !m.iter().any(|m| m == keys::CAMPAIGN_FIELD_MANAGER),
            "{n}: {m:?}"
        );
    }
    assert_eq!(
        leases
            .get("railguard-campaign")
            .await?
            .spec
            .and_then(|s| s.holder_identity)
            .as_deref(),
        Some("thief"),
        "the old leader did not take the lease back"
    );

    // The same campaign with the lease free and endpoints that answer (simulated nodes)
    // writes its findings: the check above was not vacuous.
    leases
        .delete("railguard-campaign", &Default::default())
        .await?;
    let mut answering = Vec::new();
    let mut live = Vec::new();
    let endpoint_logs = tempfile::tempdir()?;
    for n in names {
        let log = endpoint_logs.path().join(format!("{n}.log"));
        let mut child = tokio::process::Command::new(&bin)
            .arg("peer-endpoint")
            .args(["--node", n, "--profile", "h100-ndr", "--listen"])
            .arg(ANY_LOOPBACK_PORT)
            .arg("--token-file")
            .arg(&token)
            .arg("--sim")
            .arg(workspace_root().join("prober/models/dgx-h100.yaml"))
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()?;
        let addr =
            logged_listen_addr(&mut child, &log, "--listen", Duration::from_secs(30)).await?;
        live.push(child);
        answering.push(format!("{n}={addr}"));
    }
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        coordinator("coordinator-b", &answering).output(),
    )
    .await
    .context("coordinator-b did not finish")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "the campaign ran:\n{stderr}");
    for n in names {
        let (cert, node) = node_certificate(&nodes, n).await?;
        assert!(
            campaign_findings(&cert).is_some(),
            "{n}: no findings written\n{stderr}"
        );
        assert!(cert.rails.iter().any(|r| !r.wire.is_empty()), "{n}");
        assert!(managers(&node)
            .iter()
            .any(|m| m == keys::CAMPAIGN_FIELD_MANAGER));
    }
    drop(live);
    drop(holes);
    Ok(())
}

/// The real prober on simulated nodes under `work`, publishing to `cp`.
fn sim_prober<'a>(cp: &'a ControlPlane, work: &'a Path) -> Prober<'a> {
    Prober {
        bin: bin_dir(),
        kubeconfig: cp.kubeconfig_path(),
        work,
        profile_file: h100_profile_file(),
    }
}

/// A GPU node `name` on `cp`, certified once by `certify --publish`.
async fn certified_node(prober: &Prober<'_>, cp: &ControlPlane, name: &str) -> Result<()> {
    cp.create_node(
        name,
        &labels(&[GPU_PRODUCT]),
        &[(RDMA, "1k"), ("nvidia.com/gpu", "8")],
    )
    .await?;
    let (code, stderr) = certify_with(prober, name, prober.kubeconfig).await?;
    assert_eq!(code, 0, "{stderr}");
    Ok(())
}

/// `certify --publish` with `kubeconfig`: the exit code and stderr.
async fn certify_with(prober: &Prober<'_>, node: &str, kubeconfig: &Path) -> Result<(i32, String)> {
    let out = prober.certify_output(node, MODEL, kubeconfig).await?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The Node as a certified node shows it: its fabric label and its condition.
#[track_caller]
fn assert_shows_certified(node: &Node) {
    assert_eq!(
        label(node, keys::LABEL_FABRIC),
        Some(keys::fabric::CERTIFIED)
    );
    assert_eq!(
        condition(node),
        Some(("True".to_string(), "Certified".to_string()))
    );
}

/// Sends SIGTERM to `child`, as the kubelet stops a pod.
fn sigterm(child: &tokio::process::Child) -> Result<()> {
    let pid = child.id().context("the child has exited")?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -TERM {pid}: {status}");
    }
    Ok(())
}

/// An all_reduce_perf that waits `secs` before running the stand-in: an invasive run that is
/// under way long enough to be interrupted (one-second sleeps: killed, it leaves nothing
/// running for long).
fn slow_all_reduce_perf(dir: &Path, bin: &Path, secs: u64) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("all_reduce_perf_slow_{secs}"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ni=0\nwhile [ $i -lt {secs} ]; do sleep 1; i=$((i+1)); done\nexec {} \"$@\"\n",
            bin.join("all_reduce_perf_sim").display()
        ),
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_mid_run_publishes_or_restores_and_never_leaves_pending() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let nodes: Api<Node> = Api::all(cp.client());
    let work = tempfile::tempdir()?;
    let prober = sim_prober(&cp, work.path());
    let name = "gpu-t";
    certified_node(&prober, &cp, name).await?;

    // The daemon with an all_reduce_perf that takes `nccl_secs`, sent SIGTERM once its run
    // has marked the node pending; it must exit cleanly within `stop_within`. The Node then.
    let interrupted_run = async |nccl_secs: u64,
                                 grace: u64,
                                 stop_within: Duration,
                                 not_stopped: &'static str|
           -> Result<(Certificate, Node)> {
        // The certificate on the node is valid, so the daemon would not retest at start:
        // ask for a run.
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                    keys::ANNOTATION_RECERTIFY: "e2e"}}})),
            )
            .await?;
        let slow = slow_all_reduce_perf(work.path(), &prober.bin, nccl_secs)?;
        let mut d = slow_run_daemon(&prober, name, &slow)
            .arg("--shutdown-grace-secs")
            .arg(grace.to_string())
            .spawn()
            .context("starting the daemon")?;
        eventually(
            Duration::from_secs(60),
            "the daemon's run marks the node pending",
            || async {
                let node = nodes.get(name).await?;
                Ok((label(&node, keys::LABEL_FABRIC) == Some(keys::fabric::PENDING)).then_some(()))
            },
        )
        .await?;
        sigterm(&d)?;
        let status = tokio::time::timeout(stop_within, d.wait())
            .await
            .context(not_stopped)??;
        assert!(status.success(), "{status}");
        node_certificate(&nodes, name).await
    };

    // 1. Within the grace period the run under way finishes and publishes.
    let (cert, node) =
        interrupted_run(4, 300, Duration::from_secs(300), "the daemon did not stop").await?;
    assert_eq!(
        cert.generation, 2,
        "the interrupted run finished and published"
    );
    assert_eq!(cert.history.len(), 2);
    assert_eq!(cert.verdict, Verdict::Certified);
    assert_shows_certified(&node);

    // 2. Past the grace period the run is abandoned; the Node is what its certificate says.
    let (after, node) = interrupted_run(
        600,
        1,
        Duration::from_secs(60),
        "the daemon did not stop within its grace period",
    )
    .await?;
    assert_eq!(after, cert, "the certificate survives unchanged");
    assert_shows_certified(&node);
    Ok(())
}

/// A kubeconfig for the API server of `cp` with a bearer `token`.
fn kubeconfig_with_token(cp: &ControlPlane, dir: &Path, token: &str) -> Result<PathBuf> {
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, cp.ca_pem())?;
    let path = dir.join(format!("kubeconfig-{}", &token[..8]));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            cp.server_url(),
            ca.display()
        ),
    )?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_read_that_fails_is_never_taken_for_no_certificate() -> Result<()> {
    const TOKEN: &str = "no-get-prober-token-0123456789";
    let cp = ControlPlane::start_with_options(&ApiServerOptions {
        extra_tokens: vec![(
            TOKEN.to_string(),
            "prober-without-get".to_string(),
            "railguard-faults".to_string(),
        )],
        ..ApiServerOptions::default()
    })
    .await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let work = tempfile::tempdir()?;
    let prober = sim_prober(&cp, work.path());
    let name = "gpu-f";
    certified_node(&prober, &cp, name).await?;
    let (before, _) = node_certificate(&nodes, name).await?;
    assert_eq!(before.history.len(), 1);

    // Everything a publish writes is allowed; reading the Node is not (403).
    let rbac = json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "prober-writes-only"},
         "rules": [
            {"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["patch", "update"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "prober-writes-only"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "prober-writes-only"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "prober-without-get"}]},
    ]);
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let role: ClusterRole = serde_json::from_value(rbac[0].clone())?;
    let binding: ClusterRoleBinding = serde_json::from_value(rbac[1].clone())?;
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let forbidden = kubeconfig_with_token(&cp, work.path(), TOKEN)?;
    // RBAC answers from its informers: wait until the binding is in force for writes.
    eventually(
        Duration::from_secs(30),
        "the binding allows node patches",
        || {
            let forbidden = forbidden.clone();
            async move {
                let config = kube::Config::from_custom_kubeconfig(
                    kube::config::Kubeconfig::read_from(&forbidden)?,
                    &Default::default(),
                )
                .await?;
                let c = kube::Client::try_from(config)?;
                let patch = json!({"metadata": {"labels": {"fault-test": "writable"}}});
                Ok(Api::<Node>::all(c)
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                    .then_some(()))
            }
        },
    )
    .await?;

    let (code, stderr) = certify_with(&prober, name, &forbidden).await?;
    assert_eq!(code, 2, "a failed read is an error:\n{stderr}");
    assert!(stderr.contains("cannot read node"), "{stderr}");
    let (after, node) = node_certificate(&nodes, name).await?;
    assert_eq!(after, before, "the certificate survives");
    assert_eq!(after.history.len(), 1, "history is not reset");
    assert_eq!(
        label(&node, keys::LABEL_FABRIC),
        Some(keys::fabric::CERTIFIED)
    );

    // Allowed to read again, the next run continues the same history.
    let (code, stderr) = certify_with(&prober, name, cp.kubeconfig_path()).await?;
    assert_eq!(code, 0, "{stderr}");
    let (next, _) = node_certificate(&nodes, name).await?;
    assert_eq!(next.generation, before.generation + 1);
    assert_eq!(next.history.len(), 2);
    if next.history[0] != before.history[0] {
        bail!(
            "history rewritten: {:?} vs {:?}",
            next.history,
            before.history
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recertify_request_waits_for_busy_gpus_and_is_kept() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let work = tempfile::tempdir()?;
    let prober = sim_prober(&cp, work.path());
    let name = "gpu-r";
    certified_node(&prober, &cp, name).await?;
    let (before, _) = node_certificate(&nodes, name).await?;

    // A training pod holds the node's GPUs (bound, never run: no kubelet), and an operator
    // asks for a recertification.
    let pods = training_pod(&cp, name).await?;
    ask_recertify(&nodes, name).await?;

    let (mut d, metrics) = spawn_with_metrics(
        on_request_daemon(&prober, name),
        &work.path().join("daemon.log"),
    )
    .await?;
    let deferred = node_event(&client, name, "RecertifyDeferred", Duration::from_secs(60)).await?;
    assert!(
        deferred.message.unwrap_or_default().contains("ml/train-0"),
        "the event names the pod"
    );
    // Several retries later (the daemon counts each deferral): no invasive run, the request
    // is kept.
    let deferrals = "railguard_prober_runs_total{kind=\"invasive\",outcome=\"deferred-gpu-pods\"}";
    eventually(
        Duration::from_secs(60),
        "three deferred retries",
        || async { Ok((metric_value(metrics, deferrals).await? >= 3.0).then_some(())) },
    )
    .await?;
    let (cert, node) = node_certificate(&nodes, name).await?;
    assert_eq!(cert.history.len(), before.history.len(), "no invasive run");
    assert_ne!(
        label(&node, keys::LABEL_FABRIC),
        Some(keys::fabric::PENDING)
    );
    assert!(recertify_asked(&node), "the request is kept");

    // The pod is gone: the request is honoured and cleared.
    delete_now(&pods, "train-0").await?;
    requested_run_done(&nodes, name, before.history.len(), Duration::from_secs(60)).await?;
    stop_daemon(&mut d).await?;
    Ok(())
}

/// The value of `metric` (a whole series name with its labels) at the daemon's `/metrics`.
async fn metric_value(metrics: std::net::SocketAddr, metric: &str) -> Result<f64> {
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(metric))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0))
}

/// Waits until the requested run on `name` has ended: one run more in the certificate's
/// history than `runs_before`, and the `railguard.io/recertify` request gone. The Node then.
async fn requested_run_done(
    nodes: &Api<Node>,
    name: &str,
    runs_before: usize,
    timeout: Duration,
) -> Result<Node> {
    eventually(timeout, "the requested run", || async {
        let (cert, node) = node_certificate(nodes, name).await?;
        let done = cert.history.len() == runs_before + 1 && !recertify_asked(&node);
        Ok(done.then_some(node))
    })
    .await
}

/// Whether `node` carries a `railguard.io/recertify` request.
fn recertify_asked(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(keys::ANNOTATION_RECERTIFY))
}

/// Asks for a recertification of `name`, as an operator does.
async fn ask_recertify(nodes: &Api<Node>, name: &str) -> Result<()> {
    let ask = json!({"metadata": {"annotations": {keys::ANNOTATION_RECERTIFY: "now"}}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&ask))
        .await?;
    Ok(())
}

/// `railguard-prober daemon` on `name` that runs invasively only on request: passive checks
/// every second (100 ms windows), polls every 200 ms without jitter, metrics on a port of
/// its own choosing.
fn on_request_daemon(prober: &Prober<'_>, name: &str) -> tokio::process::Command {
    let mut c = prober.command("daemon", name, MODEL);
    c.args(["--interval-secs", "3600", "--passive-interval-secs", "1"])
        .args([
            "--window-ms",
            "100",
            "--poll-ms",
            "200",
            "--jitter-percent",
            "0",
        ])
        .arg("--metrics-listen")
        .arg(ANY_LOOPBACK_PORT);
    c
}

/// `railguard-prober daemon` on `name` that neither checks nor runs on its own for an hour
/// (polls every 200 ms without jitter), its NCCL step run by `nccl_binary`.
fn slow_run_daemon(prober: &Prober<'_>, name: &str, nccl_binary: &Path) -> tokio::process::Command {
    let mut c = prober.command("daemon", name, MODEL);
    c.args(["--interval-secs", "3600", "--passive-interval-secs", "3600"])
        .args(["--poll-ms", "200", "--jitter-percent", "0"])
        .arg("--metrics-listen")
        .arg(ANY_LOOPBACK_PORT)
        .arg("--nccl-binary")
        .arg(nccl_binary)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    c
}

/// Starts `daemon` with its stderr in `log`; the child and its metrics address, read back
/// from the log.
async fn spawn_with_metrics(
    mut daemon: tokio::process::Command,
    log: &Path,
) -> Result<(tokio::process::Child, std::net::SocketAddr)> {
    let mut d = daemon
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()?;
    let metrics =
        logged_listen_addr(&mut d, log, "--metrics-listen", Duration::from_secs(60)).await?;
    Ok((d, metrics))
}

/// SIGTERM to the daemon `d`: it must exit cleanly within a minute.
async fn stop_daemon(d: &mut tokio::process::Child) -> Result<()> {
    sigterm(d)?;
    let status = tokio::time::timeout(Duration::from_secs(60), d.wait()).await??;
    assert!(status.success(), "{status}");
    Ok(())
}

/// Waits up to `timeout` for an Event about node `name` with `reason` (in `default`).
async fn node_event(
    client: &kube::Client,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> Result<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually(
        timeout,
        &format!("an Event {reason} about {name}"),
        || async {
            Ok(events
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some(name)
                        && e.reason.as_deref() == Some(reason)
                }))
        },
    )
    .await
}

/// Pod `pod` in a new namespace `ns`, bound to `node` (named in its spec, as a scheduler
/// binds it; no kubelet runs it) with `limits`. The namespace's pods.
async fn bound_pod(
    cp: &ControlPlane,
    ns: &str,
    pod: &str,
    node: &str,
    image: &str,
    limits: serde_json::Value,
) -> Result<Api<Pod>> {
    cp.create_namespace(ns, &labels(&[])).await?;
    let pods: Api<Pod> = Api::namespaced(cp.client(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": image,
            "resources": {"limits": limits}}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    Ok(pods)
}

/// The training pod `ml/train-0` holding all 8 GPUs of `node` (bound, never run).
async fn training_pod(cp: &ControlPlane, node: &str) -> Result<Api<Pod>> {
    bound_pod(
        cp,
        "ml",
        "train-0",
        node,
        "trainer",
        json!({"nvidia.com/gpu": "8"}),
    )
    .await
}

/// Deletes `pod` at once: no kubelet confirms a graceful deletion.
async fn delete_now(pods: &Api<Pod>, pod: &str) -> Result<()> {
    pods.delete(pod, &kube::api::DeleteParams::default().grace_period(0))
        .await?;
    Ok(())
}

/// `sim_prober` with `profile` in place of the shipped one (written under `work` as `file`).
fn sim_prober_with<'a>(
    cp: &'a ControlPlane,
    work: &'a Path,
    profile: &FabricProfile,
    file: &str,
) -> Result<Prober<'a>> {
    let profile_file = work.join(file);
    std::fs::write(&profile_file, serde_yaml_ng::to_string(profile)?)?;
    Ok(Prober {
        profile_file,
        ..sim_prober(cp, work)
    })
}

/// Our taint's value on `node`, if it carries it.
fn railguard_taint(node: &Node) -> Option<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|t| {
            t.iter()
                .find(|t| t.key == keys::TAINT_FABRIC_UNHEALTHY)
                .map(|t| t.value.clone().unwrap_or_default())
        })
}

/// A requested run on a node out of service (cordoned, then in a maintenance window) and
/// then in use by a storage client of the profile's RDMA resource starts nothing invasive,
/// read through the daemon's watch of its Node; once the node is back and free the run goes,
/// with the node tainted `testing` for its length (a profile with `certification.taints`)
/// and the taint lifted when it certifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invasive_runs_wait_for_a_node_in_service_and_free_and_taint_it_while_they_run(
) -> Result<()> {
    let cp = ControlPlane::start().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let work = tempfile::tempdir()?;
    let mut tainting = profile();
    tainting.spec.certification.taints = true;
    let prober = sim_prober_with(&cp, work.path(), &tainting, "profile-taints.yaml")?;
    let name = "gpu-m";
    certified_node(&prober, &cp, name).await?;
    let (before, _) = node_certificate(&nodes, name).await?;

    // Cordoned and in a maintenance window, a storage client on the HCAs, and a request.
    let pods = bound_pod(
        &cp,
        "storage",
        "lustre-client",
        name,
        "lustre",
        json!({RDMA: "1"}),
    )
    .await?;
    let out_of_service = json!({
        "spec": {"unschedulable": true},
        "metadata": {"labels": {keys::LABEL_MAINTENANCE: "window-42"},
                     "annotations": {keys::ANNOTATION_RECERTIFY: "now"}},
    });
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&out_of_service),
        )
        .await?;

    let log_path = work.path().join("daemon.log");
    let mut daemon = on_request_daemon(&prober, name);
    daemon
        .arg("--nccl-binary")
        .arg(slow_all_reduce_perf(work.path(), &prober.bin, 3)?);
    let (mut d, metrics) = spawn_with_metrics(daemon, &log_path).await?;
    let unavailable =
        "railguard_prober_runs_total{kind=\"invasive\",outcome=\"deferred-node-unavailable\"}";
    let in_use = "railguard_prober_runs_total{kind=\"invasive\",outcome=\"deferred-gpu-pods\"}";

    // 1. Cordoned: held back, once said in an Event.
    let deferred = node_event(&client, name, "RecertifyDeferred", Duration::from_secs(60)).await?;
    let message = deferred.message.unwrap_or_default();
    assert!(message.contains("the node is cordoned"), "{message}");

    // 2. Uncordoned, still in the window: held back for that, seen through the watch.
    let uncordon = json!({"spec": {"unschedulable": null}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&uncordon))
        .await?;
    eventually(
        Duration::from_secs(60),
        "held back for the maintenance window",
        || async {
            let log = std::fs::read_to_string(&log_path)?;
            Ok(log
                .contains("in a maintenance window (label railguard.io/maintenance=window-42)")
                .then_some(()))
        },
    )
    .await?;
    assert!(metric_value(metrics, unavailable).await? >= 2.0);
    assert_eq!(metric_value(metrics, in_use).await?, 0.0);

    // 3. The window ends; the storage client still uses the profile's RDMA resource.
    let window_over = json!({"metadata": {"labels": {keys::LABEL_MAINTENANCE: null}}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&window_over))
        .await?;
    eventually(
        Duration::from_secs(60),
        "held back for the RDMA user",
        || async { Ok((metric_value(metrics, in_use).await? >= 2.0).then_some(())) },
    )
    .await?;
    let (cert, node) = node_certificate(&nodes, name).await?;
    assert_eq!(cert.history.len(), before.history.len(), "no invasive run");
    assert_eq!(
        railguard_taint(&node),
        None,
        "no testing taint before a run"
    );
    assert!(recertify_asked(&node));

    // 4. Free: the run goes, tainted `testing` while the (slowed) NCCL step runs.
    delete_now(&pods, "lustre-client").await?;
    eventually(
        Duration::from_secs(60),
        "the testing taint during the run",
        || async {
            let node = nodes.get(name).await?;
            Ok(
                (railguard_taint(&node).as_deref() == Some(keys::taint_reason::TESTING))
                    .then_some(()),
            )
        },
    )
    .await?;
    let node =
        requested_run_done(&nodes, name, before.history.len(), Duration::from_secs(90)).await?;
    assert_shows_certified(&node);
    assert_eq!(railguard_taint(&node), None, "lifted when it certified");
    stop_daemon(&mut d).await?;
    Ok(())
}

/// With `certification.maxConcurrentInvasive: 1`, two nodes asked to recertify at once run
/// one after the other: the second waits for the first's slot (a Lease), never both pending
/// together, and the slot is given back after each run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_invasive_cap_runs_one_node_at_a_time() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let cp = ControlPlane::start().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let work = tempfile::tempdir()?;
    let mut capped = profile();
    capped.spec.certification.max_concurrent_invasive =
        railguard_api::invasive::MaxConcurrentInvasive::Count(1);
    let slot = capped.invasive_slot_leases(1).remove(0);
    let prober = sim_prober_with(&cp, work.path(), &capped, "profile-cap-1.yaml")?;
    let names = ["gpu-s1", "gpu-s2"];
    let mut before = Vec::new();
    for name in names {
        certified_node(&prober, &cp, name).await?;
        before.push(node_certificate(&nodes, name).await?.0.history.len());
        ask_recertify(&nodes, name).await?;
    }
    let slow = slow_all_reduce_perf(work.path(), &prober.bin, 4)?;
    let mut daemons = Vec::new();
    let mut metrics = Vec::new();
    for name in names {
        let log = work.path().join(format!("daemon-{name}.log"));
        let mut daemon = on_request_daemon(&prober, name);
        daemon.arg("--nccl-binary").arg(&slow);
        let (d, m) = spawn_with_metrics(daemon, &log).await?;
        metrics.push(m);
        daemons.push(d);
    }

    // Watch both nodes until both have run: never both pending at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut seen_pending = [false, false];
    loop {
        let mut pending = [false, false];
        let mut done = [false, false];
        for (i, name) in names.iter().enumerate() {
            let (cert, node) = node_certificate(&nodes, name).await?;
            pending[i] = label(&node, keys::LABEL_FABRIC) == Some(keys::fabric::PENDING);
            done[i] = cert.history.len() == before[i] + 1 && !recertify_asked(&node) && !pending[i];
        }
        assert!(
            !(pending[0] && pending[1]),
            "both nodes test at once under a cap of 1"
        );
        seen_pending[0] |= pending[0];
        seen_pending[1] |= pending[1];
        if done == [true, true] {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("both requested runs did not finish: done {done:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen_pending, [true, true], "each node was seen under test");
    let capped_runs =
        "railguard_prober_runs_total{kind=\"invasive\",outcome=\"deferred-concurrency-cap\"}";
    let mut waited = 0.0;
    for m in &metrics {
        waited += metric_value(*m, capped_runs).await?;
    }
    assert!(waited >= 1.0, "one node waited for the slot");
    // Given back after the last run.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = leases.get(&slot).await?;
    assert_eq!(
        lease.spec.unwrap_or_default().holder_identity,
        None,
        "the slot is free"
    );
    for d in &daemons {
        sigterm(d)?;
    }
    for mut d in daemons {
        let status = tokio::time::timeout(Duration::from_secs(60), d.wait()).await??;
        assert!(status.success(), "{status}");
    }
    Ok(())
}

/// A profile without `certification.taints` (the default): the daemon's invasive run still
/// taints the node `testing`; a pod asking for a MIG slice (`nvidia.com/mig-1g.10gb`, one of
/// the default GPU patterns) bound to the node mid-run stops it within the pod check's
/// period: the Node shows its certificate again with no new run in its history, the taint is lifted, an `InvasiveRunAbandoned` Event says why
/// and the request stays. With the pod gone the run goes again and certifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_pod_arriving_mid_run_stops_it_and_the_node_is_restored() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let work = tempfile::tempdir()?;
    // The shipped profile (no certification.taints), its NCCL step run by nccl-tests'
    // all_reduce_perf so the slowed stand-in keeps the run under way.
    let mut slowed = profile();
    assert!(!slowed.spec.certification.taints, "the default profile");
    slowed.spec.certification.nccl_runner = railguard_api::profile::NcclRunner::NcclTests;
    let prober = sim_prober_with(&cp, work.path(), &slowed, "profile-nccl-tests.yaml")?;
    let name = "gpu-r";
    certified_node(&prober, &cp, name).await?;
    let (before, _) = node_certificate(&nodes, name).await?;
    ask_recertify(&nodes, name).await?;

    let slow = slow_all_reduce_perf(work.path(), &prober.bin, 20)?;
    let mut daemon = on_request_daemon(&prober, name);
    daemon.arg("--nccl-binary").arg(&slow);
    let (mut d, metrics) = spawn_with_metrics(daemon, &work.path().join("daemon.log")).await?;
    // The stand-in as the kernel runs a script: `/bin/sh PATH ARGS` (the daemon's own
    // command line names the path too, after --nccl-binary).
    let running = || -> Result<bool> {
        let out = std::process::Command::new("pgrep")
            .arg("-f")
            .arg(format!("^/bin/sh {}", slow.to_str().context("a path")?))
            .output()?;
        Ok(out.status.success())
    };
    // The run is under way: tainted `testing` though the profile keeps no taints, the
    // slowed NCCL step running.
    eventually(
        Duration::from_secs(60),
        "the testing taint and the slowed NCCL step",
        || async {
            let node = nodes.get(name).await?;
            Ok(
                (railguard_taint(&node).as_deref() == Some(keys::taint_reason::TESTING)
                    && label(&node, keys::LABEL_FABRIC) == Some(keys::fabric::PENDING)
                    && running()?)
                .then_some(()),
            )
        },
    )
    .await?;

    // A MIG slice's pod is bound to the node (it names the node, as a scheduler that
    // tolerates every taint would bind it).
    let pods = bound_pod(
        &cp,
        "ml",
        "infer-0",
        name,
        "vllm",
        json!({"nvidia.com/mig-1g.10gb": "1"}),
    )
    .await?;
    let aborted = "railguard_prober_runs_total{kind=\"invasive\",outcome=\"aborted-gpu-pods\"}";
    eventually(Duration::from_secs(30), "the run abandoned", || async {
        Ok((metric_value(metrics, aborted).await? >= 1.0).then_some(()))
    })
    .await?;
    let (after, node) = node_certificate(&nodes, name).await?;
    assert_eq!(after.generation, before.generation, "nothing published");
    assert_eq!(after.history.len(), before.history.len(), "no run recorded");
    assert_shows_certified(&node);
    assert_eq!(railguard_taint(&node), None, "the testing taint lifted");
    assert!(recertify_asked(&node), "the request stays");
    // Dropped with the run: killed (kill_on_drop), not left running on the GPUs.
    eventually(Duration::from_secs(5), "the stand-in killed", || async {
        Ok((!running()?).then_some(()))
    })
    .await?;
    let event = node_event(
        &client,
        name,
        "InvasiveRunAbandoned",
        Duration::from_secs(30),
    )
    .await?;
    let message = event.message.unwrap_or_default();
    assert!(message.contains("ml/infer-0"), "{message}");
    assert!(
        message.contains("arrived during the invasive run"),
        "{message}"
    );

    // The pod goes: the kept request runs to its end, and the taint goes with it.
    delete_now(&pods, "infer-0").await?;
    let node =
        requested_run_done(&nodes, name, before.history.len(), Duration::from_secs(120)).await?;
    assert_shows_certified(&node);
    assert_eq!(railguard_taint(&node), None, "lifted when it ended");
    stop_daemon(&mut d).await?;
    Ok(())
}

/// The other side of the exclusion with the campaign (#44): while a pair test holds the
/// node's test lock shared (the peer endpoint's hold, taken with its own call), a requested
/// invasive run does not start: no `testing` taint, no `pending`, outcome
/// `deferred-pair-test`, the request kept. The pair test over, the run goes and certifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_invasive_run_waits_for_the_pair_test_on_its_rails() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let nodes: Api<Node> = Api::all(cp.client());
    let work = tempfile::tempdir()?;
    let prober = sim_prober(&cp, work.path());
    let name = "gpu-p";
    certified_node(&prober, &cp, name).await?;
    let (before, _) = node_certificate(&nodes, name).await?;
    let lock_file = work.path().join("rails.lock");
    let pair_test = railguard_prober::test_lock::NodeTestLock::new(&lock_file)
        .try_shared()?
        .context("the lock is free")?;
    ask_recertify(&nodes, name).await?;
    let mut daemon = on_request_daemon(&prober, name);
    daemon.arg("--test-lock-file").arg(&lock_file);
    let (mut d, metrics) = spawn_with_metrics(daemon, &work.path().join("daemon.log")).await?;
    let deferred = "railguard_prober_runs_total{kind=\"invasive\",outcome=\"deferred-pair-test\"}";
    eventually(Duration::from_secs(60), "held back twice", || async {
        Ok((metric_value(metrics, deferred).await? >= 2.0).then_some(()))
    })
    .await?;
    let (cert, node) = node_certificate(&nodes, name).await?;
    assert_eq!(cert.history.len(), before.history.len(), "no run");
    assert_shows_certified(&node);
    assert_eq!(railguard_taint(&node), None, "not tainted while held back");

    drop(pair_test);
    let node =
        requested_run_done(&nodes, name, before.history.len(), Duration::from_secs(90)).await?;
    assert_shows_certified(&node);
    assert_eq!(railguard_taint(&node), None);
    stop_daemon(&mut d).await?;
    Ok(())
}

/// A prober killed mid-run (SIGKILL: no shutdown, no restore) never leaves its Node marked
/// longer than its slot Lease: the fleet controller, as the chart runs it
/// (`RAILGUARD_LEASE_NAMESPACE`), leaves the Node alone while the run's Lease is renewed,
/// and once the Lease expires gives it back its certificate's state — `certified`, the
/// `testing` taint lifted — with an `InvasiveRunOrphaned` Event. The daemon also takes its
/// slot in the queue the controller keeps: `status.invasive` names the profile's slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prober_killed_mid_run_never_leaves_its_node_pending_longer_than_its_lease() -> Result<()>
{
    use railguard_prober::certify::slots::SLOT_LEASE_SECONDS;
    use railguard_tests::daemon::Daemon;
    let cp = ControlPlane::start().await?;
    cp.apply_fabricprofile_crd().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let work = tempfile::tempdir()?;
    let mut slowed = profile();
    slowed.spec.certification.nccl_runner = railguard_api::profile::NcclRunner::NcclTests;
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &slowed)
        .await?;
    let prober = sim_prober_with(&cp, work.path(), &slowed, "profile-nccl-tests.yaml")?;
    let name = "gpu-k";
    certified_node(&prober, &cp, name).await?;
    let (before, _) = node_certificate(&nodes, name).await?;
    let logs = cp.log_dir().to_path_buf();
    let mut fleet = Daemon::spawn(
        "railguard-fleet",
        std::process::Command::new(prober.bin.join("railguard-prober"))
            .arg("fleet")
            .env("RAILGUARD_FLEET_WATCH", "true")
            .env("RAILGUARD_KUBECONFIG", cp.kubeconfig_path())
            .env("RAILGUARD_FLEET_INTERVAL_SECS", "2")
            .env("RAILGUARD_FLEET_SETTLE_SECS", "1")
            .env("RAILGUARD_LEADER_ELECT", "false")
            .env("RAILGUARD_LEASE_NAMESPACE", "default")
            .env("RAILGUARD_METRICS_LISTEN", ANY_LOOPBACK_PORT)
            .env("RAILGUARD_LOG", "info"),
        &logs,
    );
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    let status = eventually(
        Duration::from_secs(60),
        "the fleet controller's status.invasive",
        || async {
            Ok(profiles
                .get_status(slowed.name())
                .await?
                .status
                .and_then(|s| s.invasive))
        },
    )
    .await?;
    // The default 5% of one node: one slot, nobody waiting.
    assert_eq!((status.nodes, status.slots, status.waiting), (1, 1, 0));

    ask_recertify(&nodes, name).await?;
    let slow = slow_all_reduce_perf(work.path(), &prober.bin, 600)?;
    let mut d = slow_run_daemon(&prober, name, &slow).spawn()?;
    let marked = |node: &Node| {
        railguard_taint(node).as_deref() == Some(keys::taint_reason::TESTING)
            && label(node, keys::LABEL_FABRIC) == Some(keys::fabric::PENDING)
    };
    eventually(Duration::from_secs(60), "the run under way", || async {
        Ok(marked(&nodes.get(name).await?).then_some(()))
    })
    .await?;
    // While the prober renews its slot, the controller leaves the run alone.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(marked(&nodes.get(name).await?), "a live run is left alone");
    fleet.assert_running(&logs);

    d.start_kill()?;
    d.wait().await?;
    let killed = std::time::Instant::now();
    let node = eventually(
        Duration::from_secs(u64::from(SLOT_LEASE_SECONDS.unsigned_abs()) + 30),
        "the orphaned run's node restored",
        || async {
            let node = nodes.get(name).await?;
            Ok((!marked(&node) && railguard_taint(&node).is_none()).then_some(node))
        },
    )
    .await?;
    let took = killed.elapsed();
    assert_eq!(
        label(&node, keys::LABEL_FABRIC),
        Some(keys::fabric::CERTIFIED)
    );
    let (after, _) = node_certificate(&nodes, name).await?;
    assert_eq!(after, before, "the certificate is untouched");
    // Not before the Lease could expire (its last renewal was at most a third of it ago).
    assert!(
        took >= Duration::from_secs(u64::from(SLOT_LEASE_SECONDS.unsigned_abs()) * 2 / 3 - 5),
        "restored after {took:?}: before the Lease expired"
    );
    node_event(
        &client,
        name,
        "InvasiveRunOrphaned",
        Duration::from_secs(30),
    )
    .await?;
    // The stand-in the killed daemon left behind.
    let _ = std::process::Command::new("pkill")
        .arg("-f")
        .arg(format!("^/bin/sh {}", slow.display()))
        .status();
    fleet.assert_running(&logs);
    Ok(())
}

/// A stand-in job's traffic in a simulated node's sysfs tree: every 20 ms each rail's
/// `port_xmit_data` and `port_rcv_data` grow by `gbytes_per_second` a side (in the 4-octet
/// words the IB counters count), a tenth of it on the rail `slow` names. Small steps, so a
/// telemetry tick that falls between two rails' writes sees one step of ten missing, never
/// half a rail's traffic (the kernel's counters move together; these files do not).
/// A counter that does not read as a number stops the job with an error.
async fn job_traffic(
    infiniband: PathBuf,
    rails: Vec<railguard_api::RailSpec>,
    gbytes_per_second: f64,
    slow: Arc<std::sync::Mutex<Option<String>>>,
) -> Result<()> {
    let step = Duration::from_millis(20);
    loop {
        let slow_rail = slow.lock().unwrap().clone();
        for r in &rails {
            let share = if slow_rail.as_deref() == Some(r.id().as_str()) {
                0.1
            } else {
                1.0
            };
            let words = (gbytes_per_second * 1e9 * share * step.as_secs_f64() / 4.0) as u64;
            for c in ["port_xmit_data", "port_rcv_data"] {
                let path = infiniband.join(format!("{}/ports/{}/counters/{c}", r.hca, r.port));
                let now: u64 = std::fs::read_to_string(&path)?.trim().parse()?;
                // In place and never shorter (zero-padded), as a counter attribute reads:
                // a truncating write would show the daemon an empty file now and then.
                let file = std::fs::OpenOptions::new().write(true).open(&path)?;
                std::os::unix::fs::FileExt::write_all_at(
                    &file,
                    format!("{:020}\n", now + words).as_bytes(),
                    0,
                )?;
            }
        }
        tokio::time::sleep(step).await;
    }
}

/// A busy node keeps a living certificate from its jobs' own traffic (`--grey-rails
/// enforce`): a training pod holds its GPUs, so every invasive run that falls due waits,
/// while a stand-in job drives every rail alike; the passive checks renew the certificate
/// before it expires, through ten TTLs, with no invasive run. Then one rail carries a tenth
/// of its siblings' bytes: the judge turns it grey within seconds, the passive check it wakes
/// fails the rail with fault `grey`, the node turns degraded and renewals stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_node_keeps_its_certificate_by_its_traffic_until_a_rail_goes_grey() -> Result<()> {
    const TTL: u64 = 10;
    let cp = ControlPlane::start().await?;
    let nodes: Api<Node> = Api::all(cp.client());
    let work = tempfile::tempdir()?;
    let mut short = profile();
    short.spec.certification.ttl_seconds = TTL;
    short.spec.certification.interval_seconds = 4;
    let prober = sim_prober_with(&cp, work.path(), &short, "profile-short-ttl.yaml")?;
    let name = "gpu-t";
    certified_node(&prober, &cp, name).await?;
    let (first, _) = node_certificate(&nodes, name).await?;
    let _pods = training_pod(&cp, name).await?;
    let slow = Arc::new(std::sync::Mutex::new(None));
    let job = tokio::spawn(job_traffic(
        work.path()
            .join(format!("sysfs-{name}/sys/class/infiniband")),
        short.spec.rails.clone(),
        5.0,
        slow.clone(),
    ));
    let mut daemon = prober.command("daemon", name, MODEL);
    daemon
        .args(["--passive-interval-secs", "1", "--window-ms", "100"])
        .args(["--poll-ms", "200", "--jitter-percent", "0"])
        .args(["--telemetry-interval-ms", "200", "--grey-rails", "enforce"])
        .arg("--metrics-listen")
        .arg(ANY_LOOPBACK_PORT);
    let log = work.path().join("daemon.log");
    let (mut d, _) = spawn_with_metrics(daemon, &log).await?;

    let ten_ttls = std::time::Instant::now() + Duration::from_secs(10 * TTL);
    let mut renewed = None;
    while std::time::Instant::now() < ten_ttls {
        let (cert, _) = node_certificate(&nodes, name).await?;
        let now = jiff::Timestamp::now();
        let daemon_log = || std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !cert.is_expired(now),
            "expired at {now} (expiresAt {}):\n{}",
            cert.expires_at,
            daemon_log()
        );
        assert_eq!(
            cert.verdict,
            Verdict::Certified,
            "{:?}\n{}",
            cert.reasons,
            daemon_log()
        );
        assert_eq!(
            cert.history.len(),
            first.history.len(),
            "no invasive run while the pod holds the GPUs"
        );
        assert_eq!(
            cert.issued_at, first.issued_at,
            "issuedAt stays the invasive pass"
        );
        renewed = cert.renewal.clone().or(renewed);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let renewal = renewed.context("never renewed")?;
    assert!(renewal.renewals >= 10, "{renewal:?}");
    assert_eq!(renewal.renewed_by, railguard_api::RenewedBy::Traffic);
    assert_eq!(renewal.bytes_per_rail.len(), short.spec.rails.len());
    assert!(
        renewal.bytes_per_rail.values().all(|b| *b >= 1 << 30),
        "{renewal:?}"
    );
    assert!(renewal
        .not_proven
        .iter()
        .any(|n| n.contains("GPU-memory path")));

    // One rail falls behind its siblings.
    *slow.lock().unwrap() = Some("mlx5_4:1".to_string());
    let greyed = std::time::Instant::now();
    let degraded = eventually(Duration::from_secs(30), "the grey rail failed", || async {
        let (cert, _) = node_certificate(&nodes, name).await?;
        Ok((cert.verdict == Verdict::Degraded).then_some(cert))
    })
    .await?;
    // Three 200 ms ticks, a 100 ms check, one patch: well within the 10 s target.
    assert!(
        greyed.elapsed() < Duration::from_secs(10),
        "{:?}",
        greyed.elapsed()
    );
    let rail = degraded.rail("mlx5_4", 1).context("rail mlx5_4:1")?;
    assert_eq!(rail.verdict, RailVerdict::Failed);
    assert_eq!(rail.faults, vec![railguard_api::RailFault::Grey]);
    assert!(
        degraded
            .reasons
            .iter()
            .any(|r| r.starts_with("rail mlx5_4:1: grey for 3 windows in a row: throughput")),
        "{:?}",
        degraded.reasons
    );
    assert_eq!(
        degraded.usable_rails,
        Some(short.spec.rails.len() as u32 - 1)
    );
    stop_daemon(&mut d).await?;
    job.abort();
    Ok(())
}
