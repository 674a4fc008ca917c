//! End-to-end: invalid FabricProfiles on a real kube-apiserver (1.20 by default, 1.37 with
//! `RAILGUARD_KUBE_VERSION=1.37`) beside a valid one. Two kinds, both of which the API
//! server serves:
//!
//! - `legacy-bad`: written while the CRD schema had no bound on `port` (the schema before it
//!   was tightened; installed here by loosening the CRD, creating it, and restoring the
//!   chart's CRD: stored objects are not validated again), with `port: 4294967296`, which no
//!   `u32` holds, so a typed list of every FabricProfile fails;
//! - `interval-bad`: accepted by today's schema, rejected by `validate()`
//!   (`intervalSeconds` not below `ttlSeconds`).
//!
//! The webhook and the extender (cluster mode, in process) still serve the valid profile:
//! the webhook mutates a GPU pod for it, the extender filters nodes by it. Each invalid one
//! has the `fabric_profiles_invalid` metric on both, a `Valid=False` status condition naming
//! the field and one Warning Event `InvalidProfile` (not one per resync). Fixing
//! `legacy-bad` makes it served, its metric gone and its condition `True`. The prober daemon
//! whose only profile is invalid waits (health up, the Node's condition and its metric say
//! why) and certifies once the profile is fixed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use railguard_api::{FabricProfile, ProfileObject, Verdict};
use railguard_extender::ExtenderConfig;
use railguard_extender_cli::cache::ClusterState;
use railguard_extender_cli::server::{self as extender_server, AppState as ExtenderState, Source};
use railguard_sim::certificates as synth;
use railguard_tests::daemon::ANY_LOOPBACK_PORT;
use railguard_tests::{
    eventually, fixture_profile, labels, workspace_root, ControlPlane, ServingCertificate,
};
use railguard_webhook::decisions::{CacheLimits, DecisionCache};
use railguard_webhook::{FailureMode, WebhookConfig};
use railguard_webhook_cli::catalog::Catalog;
use railguard_webhook_cli::server::{self as webhook_server, AppState, ServeOptions};
use railguard_webhook_cli::tls::CertReloader;
use serde_json::{json, Value};

const MANAGER: &str = "railguard-e2e";
const WAIT: Duration = Duration::from_secs(30);

/// The chart's CRD as JSON.
fn chart_crd() -> Value {
    let path = workspace_root().join("charts/railguard/crds/fabricprofile.yaml");
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Applies a CRD and waits until FabricProfiles can be listed (as objects decoded one by
/// one: a typed list may fail on the objects this test stores).
async fn apply_crd(client: &Client, crd: &Value) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(crd.clone()).unwrap();
    crds.patch(
        "fabricprofiles.railguard.io",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let objects: Api<ProfileObject> = Api::all(client.clone());
    eventually(WAIT, "FabricProfile CRD served", || async {
        Ok(objects.list(&Default::default()).await.ok().map(|_| ()))
    })
    .await
    .unwrap();
}

fn raw_profiles(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<FabricProfile>(&()))
}

/// A copy of the valid profile as raw JSON, renamed, not default.
fn variant(base: &FabricProfile, name: &str) -> Value {
    let mut v = serde_json::to_value(base).unwrap();
    v["metadata"] = json!({ "name": name });
    v["spec"]["default"] = false.into();
    v["spec"]["nodeSelector"] = json!({ "railguard.io/pool": name });
    v
}

async fn create_raw(client: &Client, v: &Value) -> kube::Result<DynamicObject> {
    let obj: DynamicObject = serde_json::from_value(v.clone()).unwrap();
    raw_profiles(client)
        .create(
            &PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            },
            &obj,
        )
        .await
}

/// The `Valid` condition of a profile, as stored: `(status, reason, message)`.
async fn valid_condition(client: &Client, name: &str) -> Option<(String, String, String)> {
    let obj = raw_profiles(client).get(name).await.ok()?;
    let c = obj
        .data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Valid")?
        .clone();
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
        c["message"].as_str()?.to_string(),
    ))
}

/// Warning Events `InvalidProfile` about a profile.
async fn invalid_events(client: &Client, name: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("InvalidProfile")
                && e.type_.as_deref() == Some("Warning")
                && e.involved_object.name.as_deref() == Some(name)
        })
        .collect()
}

async fn get_text(url: &str) -> String {
    match reqwest::get(url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

fn invalid_metric(prefix: &str, name: &str) -> String {
    format!("{prefix}_fabric_profiles_invalid{{profile=\"{name}\"}} 1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_profiles_are_skipped_and_reported_and_the_valid_one_is_served() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    let h100 = fixture_profile("dgx-h100-ndr.yaml").unwrap();

    // legacy-bad, written under a schema without the port bound.
    let mut loose = chart_crd();
    let port = loose
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/rails/items/properties/port")
        .unwrap();
    port.as_object_mut().unwrap().remove("maximum");
    port["format"] = "int64".into();
    apply_crd(&client, &loose).await;
    let mut legacy = variant(&h100, "legacy-bad");
    legacy["spec"]["rails"][0]["port"] = 4294967296u64.into();
    eventually(WAIT, "legacy-bad stored under the loose schema", || async {
        Ok(create_raw(&client, &legacy).await.ok().map(|_| ()))
    })
    .await
    .unwrap();
    apply_crd(&client, &chart_crd()).await;
    // Today's schema refuses that port: legacy-bad is only there because it is older.
    let mut refused = variant(&h100, "refused");
    refused["spec"]["rails"][0]["port"] = 4294967296u64.into();
    eventually(WAIT, "the chart's schema enforced", || async {
        match create_raw(&client, &refused).await {
            Err(kube::Error::Api(s)) if s.code == 422 => Ok(Some(())),
            Ok(_) => {
                raw_profiles(&client)
                    .delete("refused", &Default::default())
                    .await
                    .unwrap();
                Ok(None)
            }
            Err(_) => Ok(None),
        }
    })
    .await
    .unwrap();
    // interval-bad: within today's schema, rejected by validate().
    let mut interval = variant(&h100, "interval-bad");
    interval["spec"]["certification"]["ttlSeconds"] = 3600.into();
    interval["spec"]["certification"]["intervalSeconds"] = 7200.into();
    create_raw(&client, &interval)
        .await
        .expect("the schema accepts interval-bad");
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &h100)
        .await
        .unwrap();
    // What used to stop every component: one object fails a typed list of them all.
    let typed = Api::<FabricProfile>::all(client.clone())
        .list(&Default::default())
        .await;
    assert!(typed.is_err(), "a typed list decodes legacy-bad: {typed:?}");

    cp.create_namespace("train", &labels(&[])).await.unwrap();
    let alloc = [("nvidia.com/gpu", "8"), ("rdma/rdma_shared_device_a", "1")];
    let product = "nvidia.com/gpu.product";
    let pool = h100.spec.node_selector[product].as_str();
    for node in ["n-certified", "n-none"] {
        cp.create_node(node, &labels(&[(product, pool)]), &alloc)
            .await
            .unwrap();
    }
    let issued = Timestamp::now()
        .checked_sub(SignedDuration::from_hours(1))
        .unwrap();
    let cert = synth::certificate(&h100, Verdict::Certified, issued, 392.0, 370.0);
    cp.publish_certificate("n-certified", &cert).await.unwrap();

    // The webhook, cluster mode.
    let tmp = tempfile::tempdir().unwrap();
    let tls = ServingCertificate::loopback("railguard-webhook-ca").unwrap();
    tls.write_pair(tmp.path()).unwrap();
    let webhook_metrics = Arc::new(railguard_webhook_cli::metrics::Metrics::new());
    let catalog = Catalog::cluster(client.clone(), webhook_metrics.clone());
    let state = Arc::new(AppState {
        catalog: catalog.clone(),
        config: WebhookConfig::default(),
        failure_mode: FailureMode::Closed,
        metrics: webhook_metrics,
        decisions: DecisionCache::new(CacheLimits::default()),
        node_guard: None,
    });
    let reloader =
        CertReloader::new(&tmp.path().join("tls.crt"), &tmp.path().join("tls.key")).unwrap();
    let webhook = webhook_server::start(state, reloader, ServeOptions::default())
        .await
        .unwrap();
    let webhook_metrics_url = format!("http://{}/metrics", webhook.metrics_addr);

    // The extender, cluster mode.
    let extender_metrics = Arc::new(railguard_extender_cli::metrics::Metrics::new());
    let cluster = Arc::new(ClusterState::new(ExtenderConfig::default()));
    let watches = tokio::spawn(
        cluster
            .clone()
            .run(client.clone(), extender_metrics.clone()),
    );
    let extender_state = Arc::new(ExtenderState {
        source: Source::Cluster(cluster.clone()),
        config: ExtenderConfig::default(),
        max_nodes: extender_server::DEFAULT_MAX_NODES,
        metrics: extender_metrics.clone(),
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let extender_url = format!("http://{}", listener.local_addr().unwrap());
    let extender = railguard_runtime::spawn_serve(
        listener,
        extender_server::extender_router(extender_state, 512 << 20),
        None,
        railguard_runtime::ServeLimits::default(),
    )
    .unwrap();

    eventually(WAIT, "both serve the valid profile alone", || async {
        let webhook: Vec<String> = catalog
            .profiles()
            .iter()
            .map(|p| p.name().to_string())
            .collect();
        let extender: Vec<String> = cluster
            .profile_set()
            .profiles
            .iter()
            .map(|p| p.name().to_string())
            .collect();
        let ready = catalog.is_ready() && cluster.unsynced().is_empty();
        Ok((ready && webhook == ["h100-ndr"] && extender == ["h100-ndr"]).then_some(()))
    })
    .await
    .unwrap();

    // The webhook mutates a GPU pod for the valid profile.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "train"},
        "spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/pytorch:1",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    });
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "e2e-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "train", "operation": "CREATE", "userInfo": {},
            "object": pod,
        },
    });
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(tls.ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let answer: Value = https
        .post(format!("https://127.0.0.1:{}/mutate", webhook.addr.port()))
        .json(&review)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().expect("a patch"))
        .unwrap();
    let patch = String::from_utf8(patch).unwrap();
    assert!(patch.contains("\"h100-ndr\""), "{patch}");

    // The extender filters by it: the certified node passes, the uncertified one does not.
    let annotated = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "train", "uid": "u-1",
            "annotations": {"railguard.io/profile": "h100-ndr",
                            "railguard.io/signature": h100.spec.signature()}},
        "spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/pytorch:1",
            "resources": {"limits": {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}}}]},
    });
    let filtered: Value = eventually(WAIT, "the extender filters by h100-ndr", || async {
        let r: Value = reqwest::Client::new()
            .post(format!("{extender_url}/filter"))
            .json(&json!({"Pod": annotated, "NodeNames": ["n-certified", "n-none"]}))
            .send()
            .await?
            .json()
            .await?;
        Ok((r["NodeNames"] == json!(["n-certified"])).then_some(r))
    })
    .await
    .unwrap();
    assert!(
        filtered["FailedAndUnresolvableNodes"]["n-none"]
            .as_str()
            .is_some_and(|m| m.contains("profile h100-ndr requires one")),
        "{filtered}"
    );

    // Each invalid profile: metric on both, condition, one Event.
    for (name, field) in [
        ("legacy-bad", "spec.rails[0].port"),
        ("interval-bad", "spec.certification.intervalSeconds"),
    ] {
        let last = std::sync::Mutex::new(String::new());
        let reported = eventually(WAIT, &format!("{name} reported"), || async {
            let webhook_text = get_text(&webhook_metrics_url).await;
            let extender_text = extender_metrics.encode().unwrap_or_default();
            let condition = valid_condition(&client, name).await;
            let events = invalid_events(&client, name).await.len();
            let seen = (
                webhook_text.contains(&invalid_metric("railguard_webhook", name)),
                extender_text.contains(&invalid_metric("railguard_extender", name)),
                condition.clone(),
                events,
            );
            *last.lock().unwrap() = format!("{seen:?}");
            // Before CRD validation ratcheting (1.30) an object that breaks today's schema
            // takes no write, its status neither: the Event and the metrics report it.
            let condition_ok = if name == "legacy-bad" && cp.kube_version().minor() < 30 {
                condition.is_none()
            } else {
                condition.as_ref().is_some_and(|(s, r, m)| {
                    s == "False" && r == "InvalidProfile" && m.contains(field)
                })
            };
            Ok((seen.0 && seen.1 && condition_ok && events == 1).then_some(()))
        })
        .await;
        assert!(reported.is_ok(), "{name}: {}", last.lock().unwrap());
    }
    eventually(WAIT, "h100-ndr marked valid", || async {
        Ok(valid_condition(&client, "h100-ndr")
            .await
            .filter(|(s, r, _)| s == "True" && r == "Accepted")
            .map(|_| ()))
    })
    .await
    .unwrap();
    let status = raw_profiles(&client).get("h100-ndr").await.unwrap().data["status"].clone();
    assert_eq!(status["rails"], 8, "{status}");
    assert_eq!(status["signature"], h100.spec.signature(), "{status}");

    // Another profile change makes both rebuild and resend every object: still one Event each.
    let other = variant(&h100, "h100-other");
    create_raw(&client, &other).await.unwrap();
    eventually(WAIT, "h100-other served and marked valid", || async {
        let served = catalog.profiles().len() == 2 && cluster.profile_set().profiles.len() == 2;
        let valid = valid_condition(&client, "h100-other")
            .await
            .is_some_and(|(s, _, _)| s == "True");
        Ok((served && valid).then_some(()))
    })
    .await
    .unwrap();
    for name in ["legacy-bad", "interval-bad"] {
        assert_eq!(
            invalid_events(&client, name).await.len(),
            1,
            "{name}: one Event"
        );
    }

    // Fixed: served by both, its metric gone, its condition True.
    let rails = serde_json::to_value(&h100.spec.rails).unwrap();
    raw_profiles(&client)
        .patch(
            "legacy-bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rails": rails}})),
        )
        .await
        .unwrap();
    eventually(WAIT, "legacy-bad served once fixed", || async {
        let webhook_has = catalog.profiles().iter().any(|p| p.name() == "legacy-bad");
        let extender_has = cluster
            .profile_set()
            .profiles
            .iter()
            .any(|p| p.name() == "legacy-bad");
        let webhook_text = get_text(&webhook_metrics_url).await;
        let extender_text = extender_metrics.encode().unwrap_or_default();
        let metric_gone = !webhook_text.contains("profile=\"legacy-bad\"")
            && !extender_text.contains("profile=\"legacy-bad\"");
        let valid = valid_condition(&client, "legacy-bad")
            .await
            .is_some_and(|(s, _, _)| s == "True");
        Ok((webhook_has && extender_has && metric_gone && valid).then_some(()))
    })
    .await
    .unwrap();
    // interval-bad is still skipped.
    assert!(catalog
        .profiles()
        .iter()
        .all(|p| p.name() != "interval-bad"));
    assert!(get_text(&webhook_metrics_url)
        .await
        .contains(&invalid_metric("railguard_webhook", "interval-bad")));

    extender.stop.cancel();
    watches.abort();
    drop(webhook);
}

/// The Node's `RailguardFabricReady` condition: `(status, reason, message)`.
async fn node_condition(client: &Client, node: &str) -> Option<(String, String, String)> {
    let n = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(node)
        .await
        .ok()?;
    let c = n
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == railguard_api::keys::CONDITION_FABRIC_READY)?;
    Some((c.status, c.reason?, c.message?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prober_whose_profile_is_invalid_waits_says_why_and_certifies_once_it_is_fixed() {
    // The node's only profile, broken by an edit the schema accepts.
    let cp = one_node_with_profile(|p| {
        p["spec"]["certification"]["ttlSeconds"] = 3600.into();
        p["spec"]["certification"]["intervalSeconds"] = 7200.into();
    })
    .await;
    let client = cp.client();

    let work = tempfile::tempdir().unwrap();
    let models = workspace_root().join("prober/models");
    let (mut daemon, metrics_port) = spawn_daemon(
        &cp,
        &work,
        &[
            "--sim".as_ref(),
            "dgx-h100".as_ref(),
            "--models-dir".as_ref(),
            models.as_os_str(),
        ],
    )
    .await;

    // It waits, says why on the Node and on its metrics port, and keeps /healthz up.
    let message = waiting_message(&client, "InvalidProfile").await;
    assert!(
        message.contains("FabricProfile \"h100-ndr\" is invalid")
            && message.contains("spec.certification.intervalSeconds"),
        "{message}"
    );
    let metrics = format!("http://127.0.0.1:{metrics_port}");
    eventually(WAIT, "the prober's metric", || async {
        let text = get_text(&format!("{metrics}/metrics")).await;
        Ok(text
            .contains(&invalid_metric("railguard_prober", "h100-ndr"))
            .then_some(()))
    })
    .await
    .unwrap();
    assert_still_serving(&mut daemon, metrics_port).await;

    // Fixed: the daemon starts and certifies the node.
    raw_profiles(&client)
        .patch(
            "h100-ndr",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"certification": {"ttlSeconds": 86400, "intervalSeconds": 21600}}}),
            ),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(120), "gpu-a certified", || async {
        Ok(node_condition(&client, "gpu-a")
            .await
            .filter(|(s, r, _)| s == "True" && r == "Certified")
            .map(|_| ()))
    })
    .await
    .unwrap();
    let text = get_text(&format!("{metrics}/metrics")).await;
    assert!(!text.contains("profile=\"h100-ndr\""), "{text}");
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon exited");
    daemon.start_kill().unwrap();
}

/// A control plane with the chart's CRD, the H100 profile as `edit` leaves it (created raw,
/// so the schema alone judges it) and GPU node `gpu-a` in its pool.
async fn one_node_with_profile(edit: impl FnOnce(&mut Value)) -> ControlPlane {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    apply_crd(&client, &chart_crd()).await;
    let h100 = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    let mut profile = serde_json::to_value(&h100).unwrap();
    edit(&mut profile);
    create_raw(&client, &profile).await.unwrap();
    let product = "nvidia.com/gpu.product";
    let pool = h100.spec.node_selector[product].as_str();
    cp.create_node(
        "gpu-a",
        &labels(&[(product, pool)]),
        &[("nvidia.com/gpu", "8"), ("rdma/rdma_shared_device_a", "1")],
    )
    .await
    .unwrap();
    cp
}

/// The message of `gpu-a`'s `RailguardFabricReady` once it is `Unknown` with `reason` (the
/// daemon waiting for its profile to be fixed).
async fn waiting_message(client: &Client, reason: &str) -> String {
    let what = format!("the Node says the prober waits ({reason})");
    let (_, _, message) = eventually(WAIT, &what, || async {
        Ok(node_condition(client, "gpu-a")
            .await
            .filter(|(s, r, _)| s == "Unknown" && r == reason))
    })
    .await
    .unwrap();
    message
}

/// The waiting daemon did not exit and keeps `/healthz` up.
async fn assert_still_serving(daemon: &mut tokio::process::Child, metrics_port: u16) {
    let health = reqwest::get(format!("http://127.0.0.1:{metrics_port}/healthz"))
        .await
        .unwrap();
    assert!(health.status().is_success(), "{}", health.status());
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon exited");
}

/// The built `railguard-prober`.
fn prober_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(
        std::env::var("RAILGUARD_BIN_DIR")
            .unwrap_or_else(|_| workspace_root().join("target/debug").display().to_string()),
    )
    .join("railguard-prober")
}

/// `railguard-prober daemon` for node `gpu-a` against `cp`, its sysfs tree and logs in
/// `work` (its own log in `work/daemon.log`), with `extra` arguments; returns it and its
/// metrics port (port 0 given, read back from its log).
async fn spawn_daemon(
    cp: &ControlPlane,
    work: &tempfile::TempDir,
    extra: &[&std::ffi::OsStr],
) -> (tokio::process::Child, u16) {
    let log = work.path().join("daemon.log");
    let mut child = tokio::process::Command::new(prober_bin())
        .args(["daemon", "--node", "gpu-a"])
        .args(extra)
        .arg("--sysfs-root")
        .arg(work.path().join("sysfs"))
        .arg("--log-dir")
        .arg(work.path().join("logs"))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args([
            "--poll-ms",
            "200",
            "--interval-secs",
            "3600",
            "--jitter-percent",
            "0",
        ])
        .arg("--metrics-listen")
        .arg(ANY_LOOPBACK_PORT)
        .env("RAILGUARD_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the daemon");
    let metrics = railguard_tests::ports::logged_listen_addr(
        &mut child,
        &log,
        "--metrics-listen",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    (child, metrics.port())
}

/// A profile edit that names an nccl-tests binary outside `--allowed-nccl-binaries` (on a
/// node without `--sim`, where the check applies) does not stop the daemon: it waits with
/// `RailguardFabricReady=Unknown`, reason `NcclBinaryNotAllowed`, and goes on once the
/// profile is fixed.
#[tokio::test(flavor = "multi_thread")]
async fn a_prober_whose_profile_names_a_binary_it_may_not_run_waits_and_goes_on_once_fixed() {
    // The check is nccl-tests' (the native runner, the default, runs no binary).
    let cp = one_node_with_profile(|p| {
        p["spec"]["certification"]["ncclRunner"] = json!("NcclTests");
        p["spec"]["certification"]["ncclTests"] = json!({"binary": "/tmp/payload"});
    })
    .await;
    let client = cp.client();

    // The node's sysfs tree, written by the prober's own `sim-sysfs`; the daemon reads it as
    // a real node's (no --sim, so no stand-in nccl-tests).
    let work = tempfile::tempdir().unwrap();
    let model = workspace_root().join("prober/models/dgx-h100.yaml");
    let written = std::process::Command::new(prober_bin())
        .arg("sim-sysfs")
        .arg("--model")
        .arg(&model)
        .arg("--out")
        .arg(work.path().join("sysfs"))
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    let (mut daemon, metrics_port) = spawn_daemon(&cp, &work, &[]).await;

    let message = waiting_message(&client, "NcclBinaryNotAllowed").await;
    assert!(
        message.contains("names ncclTests.binary /tmp/payload, which this prober may not run")
            && message.contains("--allowed-nccl-binaries"),
        "{message}"
    );
    assert_still_serving(&mut daemon, metrics_port).await;

    // Fixed (the default binary again): the daemon starts checking the node. Without RDMA
    // devices here the outcome is the daemon's own; what matters is that it left the wait.
    raw_profiles(&client)
        .patch(
            "h100-ndr",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "remove", "path": "/spec/certification/ncclTests/binary"}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(120),
        "the daemon leaves the wait",
        || async {
            Ok(node_condition(&client, "gpu-a")
                .await
                .filter(|(_, r, _)| r != "NcclBinaryNotAllowed")
                .map(|_| ()))
        },
    )
    .await
    .unwrap();
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon exited");
    daemon.start_kill().unwrap();
}

/// A profile written with the names before the unit rename (`busbwPlateauGbps` and
/// `ncclPair.minRailBusbwGbps`, both GB/s) is stored as written (the chart's CRD keeps the
/// old names, so the API server prunes nothing), served with its values, and its `Valid`
/// condition warns with each old name and its new one; a profile with neither name of the
/// required plateau is refused by the API server itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_with_the_old_unit_names_is_served_with_a_deprecation_warning() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    apply_crd(&client, &chart_crd()).await;
    let h100 = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    let mut old = variant(&h100, "old-names");
    let thresholds = old["spec"]["thresholds"].as_object_mut().unwrap();
    let plateau = thresholds.remove("busbwPlateauGBps").unwrap();
    thresholds.insert("busbwPlateauGbps".into(), plateau.clone());
    old["spec"]["certification"]["ncclPair"] = json!({ "minRailBusbwGbps": 45.5 });
    create_raw(&client, &old)
        .await
        .expect("the chart's schema takes the old names");
    let stored = raw_profiles(&client).get("old-names").await.unwrap();
    assert_eq!(
        stored.data["spec"]["thresholds"]["busbwPlateauGbps"].as_f64(),
        plateau.as_f64()
    );
    assert_eq!(
        stored.data["spec"]["certification"]["ncclPair"]["minRailBusbwGbps"].as_f64(),
        Some(45.5)
    );

    let mut neither = variant(&h100, "no-plateau");
    neither["spec"]["thresholds"]
        .as_object_mut()
        .unwrap()
        .remove("busbwPlateauGBps");
    match create_raw(&client, &neither).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("busbwPlateauGBps"), "{}", s.message);
        }
        other => panic!("a profile without a plateau threshold was stored: {other:?}"),
    }

    let metrics = Arc::new(railguard_webhook_cli::metrics::Metrics::new());
    let catalog = Catalog::cluster(client.clone(), metrics);
    let served = eventually(WAIT, "the webhook serves old-names", || async {
        Ok(catalog
            .profiles()
            .iter()
            .find(|p| p.name() == "old-names")
            .cloned())
    })
    .await
    .unwrap();
    assert_eq!(
        Some(served.spec.thresholds.busbw_plateau_gbps),
        plateau.as_f64()
    );
    assert_eq!(
        served
            .spec
            .certification
            .nccl_pair
            .unwrap()
            .min_rail_busbw_gbps,
        Some(45.5)
    );
    let (status, reason, message) =
        eventually(WAIT, "old-names carries its Valid condition", || async {
            Ok(valid_condition(&client, "old-names").await)
        })
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DeprecatedFields")
    );
    assert!(
        message.contains("spec.thresholds.busbwPlateauGbps is now busbwPlateauGBps")
            && message
                .contains("spec.certification.ncclPair.minRailBusbwGbps is now minRailBusbwGBps"),
        "{message}"
    );
}
