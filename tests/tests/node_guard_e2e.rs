//! End-to-end: the node guard on a real kube-apiserver. The real `railguard-webhook` binary
//! runs with the node guard flags the chart renders, registered through the chart's own
//! ValidatingWebhookConfiguration (its `clientConfig` pointed at loopback). Requesters are
//! real identities: the chart's prober, campaign and fleet ServiceAccounts and RBAC, prober Pods
//! bound to nodes (`spec.nodeName`, no kubelet needed) and tokens from the TokenRequest API
//! bound to those pods; a tenant whose role may patch Nodes; a kubelet (`system:node:gpu-a`,
//! impersonated by the admin).
//!
//! The attacks — a tenant labelling a node certified, a kubelet certifying its own Node or
//! registering one certified, the prober of node B writing node A's certificate, a prober
//! token not bound to a pod — are refused with the guard's reason; the node's own prober,
//! the campaign's findings, `railguard.io/recertify` and every non-railguard change pass. The
//! fleet controller's `RailguardFleetOutlier` condition is its own: it sets and clears it
//! and may not touch a certificate; the prober, the campaign and a tenant may not set it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use railguard_api::keys;
use railguard_tests::answer::Answer;
use railguard_tests::chart_values::{
    render_for_server, ValuesSet, DEFAULT, POD_SECURITY_SPLIT, SPLIT_PROBER_NAMESPACE,
};
use railguard_tests::daemon::ANY_LOOPBACK_PORT;
use railguard_tests::helm::kube_1_20_api_versions;
use railguard_tests::install::apply_objects;
use railguard_tests::ports::logged_listen_addr;
use railguard_tests::{eventually, labels, workspace_binary, ControlPlane, ServingCertificate};
use serde_json::{json, Value};

const NS: &str = DEFAULT.namespace;
const FIELD_MANAGER: &str = "railguard-e2e";

/// The webhook process; killed on drop (its log is printed when the test failed).
struct Webhook {
    child: Child,
    log: std::path::PathBuf,
    addr: String,
    metrics: String,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- railguard-webhook log ---\n{log}");
        }
    }
}

/// The chart's objects (default values) as JSON.
fn rendered() -> Vec<Value> {
    rendered_with(&DEFAULT)
}

/// The chart's objects (default values) as `helm template` renders them against `cp`: on
/// 1.30+ servers the guard's registration carries its matchConditions.
async fn rendered_for(cp: &ControlPlane) -> Vec<Value> {
    render_for_server(&DEFAULT, &cp.client()).await.unwrap()
}

/// The chart's objects with `set`, as `helm template` renders them for 1.20.
fn rendered_with(set: &ValuesSet) -> Vec<Value> {
    set.objects_1_20().unwrap()
}

fn component(obj: &Value) -> &str {
    obj["metadata"]["labels"]["app.kubernetes.io/component"]
        .as_str()
        .unwrap_or_default()
}

/// The chart's prober, campaign and fleet identities: ServiceAccount, ClusterRole and
/// binding of each.
fn writer_identities(docs: &[Value]) -> Vec<Value> {
    let identities: Vec<Value> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ServiceAccount" | "ClusterRole" | "ClusterRoleBinding")
            ) && matches!(component(d), "prober" | "campaign" | "fleet")
        })
        .cloned()
        .collect();
    assert_eq!(identities.len(), 9, "SA, role and binding of each");
    identities
}

fn one<'a>(docs: &'a [Value], kind: &str, component_name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && component(d) == component_name)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} of {component_name}");
    found[0]
}

/// The node guard flags of the chart's webhook container (the self-managed certificate's
/// configuration name aside: this webhook serves a test pair).
fn chart_node_guard_args(docs: &[Value]) -> Vec<String> {
    let deployment = one(docs, "Deployment", "webhook");
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    let guard: Vec<String> = args
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| a.starts_with("--node-guard-") && !a.starts_with("--node-guard-config-name"))
        .map(str::to_string)
        .collect();
    assert!(
        guard
            .iter()
            .any(|a| a.starts_with("--node-guard-prober-service-account=")),
        "{guard:?}"
    );
    guard
}

/// The webhook with `guard_args`, in the release namespace `namespace`.
async fn start_webhook(
    cp: &ControlPlane,
    namespace: &str,
    guard_args: &[String],
    dir: &Path,
) -> Webhook {
    let tls = ServingCertificate::loopback("railguard-node-guard-ca").unwrap();
    tls.write_pair(dir).unwrap();
    std::fs::write(dir.join("ca.crt"), &tls.ca_pem).unwrap();
    let bin = workspace_binary("railguard-webhook-cli", "railguard-webhook").unwrap();
    let log = dir.join("webhook.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(bin)
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .arg(format!("--tls-cert={}", dir.join("tls.crt").display()))
        .arg(format!("--tls-key={}", dir.join("tls.key").display()))
        .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
        .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}"))
        .arg(format!("--namespace={namespace}"))
        .args(guard_args)
        .env("RAILGUARD_LOG", "info,railguard_webhook=debug")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let listen_timeout = Duration::from_secs(60);
    let addr = logged_listen_addr(&mut child, &log, "--listen", listen_timeout)
        .await
        .unwrap()
        .to_string();
    let metrics = logged_listen_addr(&mut child, &log, "--metrics-listen", listen_timeout)
        .await
        .unwrap()
        .to_string();
    let webhook = Webhook {
        child,
        log,
        addr,
        metrics,
    };
    // Ready only once the catalog and the node guard's caches have listed.
    let readyz = format!("http://{}/readyz", webhook.metrics);
    eventually(Duration::from_secs(60), "webhook ready", || async {
        let status = reqwest::get(&readyz)
            .await
            .ok()
            .map(|r| r.status().as_u16());
        Ok((status == Some(200)).then_some(()))
    })
    .await
    .unwrap();
    webhook
}

/// The chart's ValidatingWebhookConfiguration, calling the loopback webhook.
async fn register(client: &Client, docs: &[Value], webhook: &Webhook, dir: &Path) -> usize {
    let mut config = one(docs, "ValidatingWebhookConfiguration", "webhook").clone();
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let hooks = config["webhooks"].as_array_mut().unwrap();
    for hook in hooks.iter_mut() {
        let path = hook["clientConfig"]["service"]["path"]
            .as_str()
            .unwrap()
            .to_string();
        hook["clientConfig"] = json!({"url": format!("https://{}{path}", webhook.addr)});
    }
    let entries = hooks.len();
    let mut typed: ValidatingWebhookConfiguration = serde_json::from_value(config).unwrap();
    for hook in typed.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(ByteString(ca.clone()));
    }
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &typed)
        .await
        .unwrap();
    entries
}

/// A client authenticating with `token`.
async fn token_client(cp: &ControlPlane, token: &str) -> Client {
    let mut kubeconfig = Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    for user in &mut kubeconfig.auth_infos {
        if let Some(info) = user.auth_info.as_mut() {
            info.token = Some(token.to_string().into());
        }
    }
    config_client(kubeconfig).await
}

/// The admin, impersonating `user` in `groups`.
async fn impersonating(cp: &ControlPlane, user: &str, groups: &[&str]) -> Client {
    let mut kubeconfig = Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    for entry in &mut kubeconfig.auth_infos {
        if let Some(info) = entry.auth_info.as_mut() {
            info.impersonate = Some(user.to_string());
            info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
        }
    }
    config_client(kubeconfig).await
}

async fn config_client(kubeconfig: Kubeconfig) -> Client {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// A token of ServiceAccount `namespace/name`, bound to `pod` when given.
async fn token(client: &Client, namespace: &str, name: &str, pod: Option<&Pod>) -> String {
    railguard_tests::service_account_token(client, namespace, name, pod)
        .await
        .unwrap()
}

/// A prober pod of the chart's DaemonSet, bound to `node` (no kubelet runs it), in the
/// DaemonSet's namespace.
async fn prober_pod(client: &Client, daemonset: &Value, name: &str, node: &str) -> Pod {
    let namespace = daemonset["metadata"]["namespace"].as_str().unwrap();
    prober_pod_in(client, namespace, daemonset, name, node).await
}

/// A pod of the chart's prober DaemonSet template, bound to `node`, in `namespace`.
async fn prober_pod_in(
    client: &Client,
    namespace: &str,
    daemonset: &Value,
    name: &str,
    node: &str,
) -> Pod {
    let template = &daemonset["spec"]["template"];
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": template["metadata"]["labels"]},
        "spec": {
            "serviceAccountName": template["spec"]["serviceAccountName"],
            "automountServiceAccountToken": false,
            "nodeName": node,
            "containers": [{"name": "daemon", "image": "registry.invalid/railguard-prober"}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// Refusals by the node guard.
trait GuardAnswer {
    /// Refused by the node guard (not by RBAC), with `reason` in its message.
    fn assert_guarded(&self, what: &str, reason: &str);
}

impl GuardAnswer for Answer {
    #[track_caller]
    fn assert_guarded(&self, what: &str, reason: &str) {
        self.assert_refused_by("node guard", "railguard node guard", what, reason);
    }
}

/// The prober of gpu-a publishes `publish` (labels and certificate) on its Node, then its
/// condition: both allowed.
async fn own_prober_publishes(prober_a: &Client, publish: Value) {
    merge(prober_a, "gpu-a", publish)
        .await
        .assert_ok("prober of gpu-a certifies gpu-a");
    fabric_ready(prober_a, "gpu-a")
        .await
        .assert_ok("prober of gpu-a sets its condition");
}

async fn merge(client: &Client, node: &str, patch: Value) -> Answer {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    Answer::of(
        Api::<Node>::all(client.clone())
            .patch(node, &pp, &Patch::Merge(patch))
            .await,
    )
}

async fn label(client: &Client, node: &str, key: &str, value: &str) -> Answer {
    merge(client, node, json!({"metadata": {"labels": {key: value}}})).await
}

async fn condition(client: &Client, node: &str, type_: &str, status: &str) -> Answer {
    let now = jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{
        "type": type_, "status": status, "reason": "Test", "message": "node guard e2e",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    Answer::of(
        Api::<Node>::all(client.clone())
            .patch_status(node, &pp, &Patch::Strategic(patch))
            .await,
    )
}

/// FabricReady=True on `node`, as its prober sets it once certified.
async fn fabric_ready(client: &Client, node: &str) -> Answer {
    condition(client, node, keys::CONDITION_FABRIC_READY, "True").await
}

/// A patch of the certificate annotation alone: `node` certified.
fn certified_annotation(node: &str) -> Value {
    json!({"metadata": {"annotations": {
        keys::ANNOTATION_CERTIFICATE: certificate(node, "certified")}}})
}

fn certificate(node: &str, verdict: &str) -> String {
    json!({
        "version": 1, "generation": 1,
        "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2036-01-01T00:00:00Z",
        "profile": "h100-ndr", "signature": "sig-1", "node": node, "verdict": verdict,
        "reasons": [], "rails": [], "gpus": [],
    })
    .to_string()
}

async fn node_label(client: &Client, node: &str, key: &str) -> Option<String> {
    let n = Api::<Node>::all(client.clone()).get(node).await.unwrap();
    n.metadata.labels.unwrap_or_default().get(key).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_nodes_own_prober_the_campaign_and_the_fleet_controller_write_their_outputs() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.unwrap();
    let admin = cp.client();
    let docs = rendered_for(&cp).await;

    // The chart's prober, campaign and fleet identities: ServiceAccounts, ClusterRoles,
    // bindings.
    cp.create_namespace(NS, &labels(&[])).await.unwrap();
    let identities = writer_identities(&docs);
    apply_objects(&admin, NS, &identities).await.unwrap();
    let prober_sa = one(&docs, "ServiceAccount", "prober")["metadata"]["name"]
        .as_str()
        .unwrap();
    let campaign_sa = one(&docs, "ServiceAccount", "campaign")["metadata"]["name"]
        .as_str()
        .unwrap();
    let fleet_sa = one(&docs, "ServiceAccount", "fleet")["metadata"]["name"]
        .as_str()
        .unwrap();

    // A tenant whose role lets it patch Nodes (the premise of the attack).
    cp.create_namespace("ml", &labels(&[])).await.unwrap();
    let tenant_rbac = json!([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "trainer", "namespace": "ml"}, "automountServiceAccountToken": false},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "node-labeller"},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "nodes/status"],
                    "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "node-labeller"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "node-labeller"},
         "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": "ml"}]},
        // The chart's fleet role may patch Nodes (taints, the expiry label); bound here to
        // the tenants' role too, so that every refusal below is the guard's, not RBAC's.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "node-labeller-fleet"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "node-labeller"},
         "subjects": [{"kind": "ServiceAccount", "name": fleet_sa, "namespace": NS}]},
    ]);
    apply_objects(&admin, "ml", tenant_rbac.as_array().unwrap())
        .await
        .unwrap();

    let daemonset = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && component(d) == "prober")
        .unwrap();
    for n in ["gpu-a", "gpu-b"] {
        cp.create_node(n, &labels(&[]), &[]).await.unwrap();
    }
    // The chart mounts a bound token, not the legacy one.
    let pod_spec = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod_spec["automountServiceAccountToken"], false);
    let api_token = pod_spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "api-token")
        .unwrap();
    assert!(api_token["projected"]["sources"][0]["serviceAccountToken"].is_object());
    let pod_a = prober_pod(&admin, daemonset, "prober-a", "gpu-a").await;
    let pod_b = prober_pod(&admin, daemonset, "prober-b", "gpu-b").await;

    let dir = tempfile::tempdir().unwrap();
    let webhook = start_webhook(&cp, NS, &chart_node_guard_args(&docs), dir.path()).await;
    let entries = register(&admin, &docs, &webhook, dir.path()).await;
    assert_eq!(entries, 2, "nodes and nodes/status");

    let prober_a = token_client(&cp, &token(&admin, NS, prober_sa, Some(&pod_a)).await).await;
    let prober_b = token_client(&cp, &token(&admin, NS, prober_sa, Some(&pod_b)).await).await;
    let unbound = token_client(&cp, &token(&admin, NS, prober_sa, None).await).await;
    let campaign = token_client(&cp, &token(&admin, NS, campaign_sa, None).await).await;
    let fleet = token_client(&cp, &token(&admin, NS, fleet_sa, None).await).await;
    let tenant = token_client(&cp, &token(&admin, "ml", "trainer", None).await).await;
    let kubelet = impersonating(&cp, "system:node:gpu-a", &["system:nodes"]).await;

    // The API server picks the configuration up asynchronously: until the guard answers, a
    // tenant's label may pass (it is removed again before the real checks).
    eventually(
        Duration::from_secs(30),
        "the API server calls the node guard",
        || {
            let tenant = tenant.clone();
            let admin = admin.clone();
            async move {
                match label(&tenant, "gpu-b", keys::LABEL_FABRIC, "certified").await {
                    Answer::Refused { message, .. } if message.contains("railguard node guard") => {
                        Ok(Some(()))
                    }
                    _ => {
                        let undo = json!({"metadata": {"labels": {keys::LABEL_FABRIC: null}}});
                        merge(&admin, "gpu-b", undo)
                            .await
                            .assert_ok("admin removes it");
                        Ok(None)
                    }
                }
            }
        },
    )
    .await
    .unwrap();

    // A tenant labelling a node certified: refused, and the node stays uncertified.
    label(&tenant, "gpu-b", keys::LABEL_FABRIC, "certified")
        .await
        .assert_guarded(
            "tenant labels a node",
            "user \"system:serviceaccount:ml:trainer\" may not change",
        );
    assert_eq!(node_label(&admin, "gpu-b", keys::LABEL_FABRIC).await, None);
    let forged = certified_annotation("gpu-b");
    merge(&tenant, "gpu-b", forged.clone())
        .await
        .assert_guarded(
            "tenant forges a certificate",
            "annotation railguard.io/certificate",
        );
    fabric_ready(&tenant, "gpu-b").await.assert_guarded(
        "tenant sets the condition",
        "condition RailguardFabricReady",
    );
    // Its role works for everything else: the refusals above are the guard's, not RBAC's.
    label(&tenant, "gpu-b", "team", "ml")
        .await
        .assert_ok("tenant labels a node otherwise");
    merge(
        &tenant,
        "gpu-b",
        json!({"metadata": {"annotations": {keys::ANNOTATION_RECERTIFY: "please"}}}),
    )
    .await
    .assert_ok("an operator asks for a recertification");

    // A kubelet certifying its own Node, or registering one certified.
    label(&kubelet, "gpu-a", keys::LABEL_FABRIC, "certified")
        .await
        .assert_guarded(
            "kubelet labels its node",
            "user \"system:node:gpu-a\" may not change",
        );
    fabric_ready(&kubelet, "gpu-a")
        .await
        .assert_guarded("kubelet sets the condition", "may not change");
    label(&kubelet, "gpu-a", "topology.example.com/rack", "r1")
        .await
        .assert_ok("kubelet labels its node otherwise");
    condition(&kubelet, "gpu-a", "Ready", "True")
        .await
        .assert_ok("kubelet reports its status");
    let registered = |name: &str, fabric: Option<&str>| {
        let mut l = json!({"kubernetes.io/hostname": name});
        if let Some(f) = fabric {
            l[keys::LABEL_FABRIC] = json!(f);
        }
        serde_json::from_value::<Node>(json!({"metadata": {"name": name, "labels": l}})).unwrap()
    };
    let nodes_as_kubelet_c =
        Api::<Node>::all(impersonating(&cp, "system:node:gpu-c", &["system:nodes"]).await);
    Answer::of(
        nodes_as_kubelet_c
            .create(
                &PostParams::default(),
                &registered("gpu-c", Some("certified")),
            )
            .await,
    )
    .assert_guarded("kubelet registers certified", "never created with");
    Answer::of(
        nodes_as_kubelet_c
            .create(&PostParams::default(), &registered("gpu-c", None))
            .await,
    )
    .assert_ok("kubelet registers its node");

    // The prober of gpu-b writing gpu-a's certificate; a prober token bound to no pod.
    let publish = json!({"metadata": {
        "labels": {keys::LABEL_FABRIC: "certified", keys::LABEL_PROFILE: "h100-ndr",
                   keys::LABEL_SIGNATURE: "sig-1"},
        "annotations": {keys::ANNOTATION_CERTIFICATE: certificate("gpu-a", "certified")}}});
    merge(&prober_b, "gpu-a", publish.clone())
        .await
        .assert_guarded("prober of gpu-b certifies gpu-a", "gpu-b, not gpu-a");
    fabric_ready(&prober_b, "gpu-a")
        .await
        .assert_guarded("prober of gpu-b sets gpu-a's condition", "not gpu-a");
    merge(&unbound, "gpu-a", publish.clone())
        .await
        .assert_guarded("a prober token bound to no pod", "names no pod");
    assert_eq!(node_label(&admin, "gpu-a", keys::LABEL_FABRIC).await, None);

    // The node's own prober publishes: labels and certificate, then the condition.
    own_prober_publishes(&prober_a, publish).await;
    assert_eq!(
        node_label(&admin, "gpu-a", keys::LABEL_FABRIC)
            .await
            .as_deref(),
        Some("certified")
    );
    // Its own label changes are not the guard's business either way.
    label(&prober_b, "gpu-a", "team", "infra")
        .await
        .assert_ok("a non-railguard label by another prober");

    // The campaign records findings; it does not re-profile a node or certify one that has
    // no certificate.
    let finding = json!({"metadata": {
        "labels": {keys::LABEL_FABRIC: "degraded"},
        "annotations": {keys::ANNOTATION_CERTIFICATE: certificate("gpu-a", "degraded")}}});
    merge(&campaign, "gpu-a", finding)
        .await
        .assert_ok("campaign records a finding");
    condition(&campaign, "gpu-a", keys::CONDITION_FABRIC_READY, "False")
        .await
        .assert_ok("campaign sets the condition");
    label(&campaign, "gpu-a", keys::LABEL_PROFILE, "other")
        .await
        .assert_guarded(
            "campaign re-profiles a node",
            "not its label railguard.io/profile",
        );
    merge(&campaign, "gpu-b", forged)
        .await
        .assert_guarded("campaign issues a certificate", "has no certificate");

    // Break-glass: the admin (system:masters) may repair.
    label(&admin, "gpu-a", keys::LABEL_FABRIC, "failed")
        .await
        .assert_ok("admin repairs");

    // The fleet's outlier mark (under `outliers: Filter` it takes a node out of scheduling):
    // not the node's prober's, not the campaign's, not a tenant's to set.
    let outlier = keys::CONDITION_FLEET_OUTLIER;
    condition(&prober_a, "gpu-a", outlier, "True")
        .await
        .assert_guarded(
            "prober of gpu-a marks its node an outlier",
            "not its condition RailguardFleetOutlier",
        );
    condition(&campaign, "gpu-a", outlier, "True")
        .await
        .assert_guarded(
            "campaign marks an outlier",
            "not its condition RailguardFleetOutlier",
        );
    condition(&tenant, "gpu-b", outlier, "True")
        .await
        .assert_guarded(
            "tenant marks a node an outlier",
            &format!("only the fleet controller (system:serviceaccount:{NS}:{fleet_sa})"),
        );
    // The fleet controller marks and clears it, and nothing else.
    condition(&fleet, "gpu-a", outlier, "True")
        .await
        .assert_ok("fleet controller marks an outlier");
    condition(&fleet, "gpu-a", outlier, "False")
        .await
        .assert_ok("fleet controller clears the mark");
    merge(&fleet, "gpu-a", certified_annotation("gpu-a"))
        .await
        .assert_guarded(
            "fleet controller rewrites a certificate",
            "may change only the RailguardFleetOutlier condition",
        );
    fabric_ready(&fleet, "gpu-a").await.assert_guarded(
        "fleet controller sets the fabric condition",
        "not its condition RailguardFabricReady",
    );
    let conditions = Api::<Node>::all(admin.clone())
        .get("gpu-a")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap();
    let status_of = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.clone())
    };
    assert_eq!(status_of(outlier).as_deref(), Some("False"));
    assert_eq!(
        status_of(keys::CONDITION_FABRIC_READY).as_deref(),
        Some("False")
    );
    // Break-glass clears it too.
    condition(&admin, "gpu-a", outlier, "True")
        .await
        .assert_ok("admin sets the mark");

    // The fleet controller's one label change: an expired certification to pending. With
    // gpu-b's certificate valid (2036) it is refused; once an expired one is on the node it
    // is allowed, and never back.
    let expired = json!({"metadata": {
        "labels": {keys::LABEL_FABRIC: "certified", keys::LABEL_PROFILE: "h100-ndr",
                   keys::LABEL_SIGNATURE: "sig-1"},
        "annotations": {keys::ANNOTATION_CERTIFICATE: json!({
            "version": 1, "generation": 1,
            "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-02T00:00:00Z",
            "profile": "h100-ndr", "signature": "sig-1", "node": "gpu-b", "verdict": "certified",
            "reasons": [], "rails": [], "gpus": [],
        }).to_string()}}});
    merge(&admin, "gpu-b", certified_annotation("gpu-b"))
        .await
        .assert_ok("admin certifies gpu-b");
    label(&admin, "gpu-b", keys::LABEL_FABRIC, "certified")
        .await
        .assert_ok("admin labels gpu-b certified");
    label(&fleet, "gpu-b", keys::LABEL_FABRIC, "pending")
        .await
        .assert_guarded(
            "fleet controller takes a valid certification away",
            "expires at 2036-01-01T00:00:00Z",
        );
    merge(&admin, "gpu-b", expired)
        .await
        .assert_ok("admin puts an expired certificate on gpu-b");
    label(&fleet, "gpu-b", keys::LABEL_FABRIC, "pending")
        .await
        .assert_ok("fleet controller flips an expired certification to pending");
    label(&fleet, "gpu-b", keys::LABEL_FABRIC, "certified")
        .await
        .assert_guarded(
            "fleet controller certifies a node",
            "this changes it from pending to certified",
        );

    // Through every attack the webhook stays small (the issue's bound for the webhook).
    let status = std::fs::read_to_string(format!("/proc/{}/status", webhook.child.id())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(rss_kib < 300 * 1024, "peak RSS {rss_kib} KiB");

    // Every decision is counted on the metrics port.
    let text = reqwest::get(format!("http://{}/metrics", webhook.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"railguard_webhook_node_guard_decisions_total{outcome="denied",writer="other"}"#,
        r#"railguard_webhook_node_guard_decisions_total{outcome="denied",writer="prober"}"#,
        r#"railguard_webhook_node_guard_decisions_total{outcome="allowed",writer="prober"}"#,
        r#"railguard_webhook_node_guard_decisions_total{outcome="allowed",writer="campaign"}"#,
        r#"railguard_webhook_node_guard_decisions_total{outcome="allowed",writer="fleet"}"#,
        r#"railguard_webhook_node_guard_decisions_total{outcome="denied",writer="fleet"}"#,
        r#"railguard_webhook_node_guard_decisions_total{outcome="denied",writer="campaign"}"#,
        r#"railguard_webhook_node_guard_decisions_total{outcome="allowed",writer="allowed-group"}"#,
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    // Writes that change no output: on 1.30+ the server's matchConditions keep them from the
    // guard altogether; older servers send them, and the guard lets them through untouched.
    let untouched =
        r#"railguard_webhook_node_guard_decisions_total{outcome="untouched",writer=""}"#;
    let untouched_count = text
        .lines()
        .find_map(|l| l.strip_prefix(untouched))
        .map(|v| v.trim().parse::<f64>().unwrap());
    if cp.kube_version().minor() >= 30 {
        assert!(
            untouched_count.unwrap_or(0.0) == 0.0,
            "writes that change no output reached the guard on {}:\n{text}",
            cp.kube_version()
        );
    } else {
        assert!(
            untouched_count.unwrap_or(0.0) > 0.0,
            "{untouched} missing from:\n{text}"
        );
    }
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn webhook_args(docs: &[Value]) -> Vec<String> {
    one(docs, "Deployment", "webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_chart_registers_the_guard_with_a_tight_scope_and_can_turn_it_off() {
    let docs = rendered();
    let config = named(
        &docs,
        "ValidatingWebhookConfiguration",
        "railguard-webhook-node-guard",
    )
    .expect("the node guard's configuration");
    let hooks = config["webhooks"].as_array().unwrap();
    let scope: Vec<(Value, Value, Value)> = hooks
        .iter()
        .map(|h| {
            assert_eq!(h["sideEffects"], "None");
            assert_eq!(h["timeoutSeconds"], 5);
            assert_eq!(h["admissionReviewVersions"], json!(["v1"]));
            assert_eq!(h["clientConfig"]["service"]["path"], "/validate-nodes");
            assert_eq!(h["clientConfig"]["service"]["name"], "railguard-webhook");
            assert_eq!(h["rules"].as_array().unwrap().len(), 1);
            let rule = &h["rules"][0];
            assert_eq!(rule["apiGroups"], json!([""]));
            assert_eq!(rule["scope"], "Cluster");
            (
                rule["resources"].clone(),
                rule["operations"].clone(),
                h["failurePolicy"].clone(),
            )
        })
        .collect();
    assert_eq!(
        scope,
        [
            (json!(["nodes"]), json!(["CREATE", "UPDATE"]), json!("Fail")),
            (json!(["nodes/status"]), json!(["UPDATE"]), json!("Ignore")),
        ]
    );
    // The webhook trusts its CA there too, reads prober pods of its namespace and Nodes.
    let args = webhook_args(&docs);
    assert!(args.contains(&"--node-guard-config-name=railguard-webhook-node-guard".to_string()));
    assert!(args.contains(&"--node-guard-allowed-groups=system:masters".to_string()));
    // The fleet controller's identity, when it is installed: the ServiceAccount it runs as.
    let fleet_sa = one(&docs, "ServiceAccount", "fleet")["metadata"]["name"]
        .as_str()
        .unwrap();
    let fleet_deployment = one(&docs, "Deployment", "fleet");
    assert_eq!(
        fleet_deployment["spec"]["template"]["spec"]["serviceAccountName"],
        fleet_sa
    );
    assert!(
        args.contains(&format!("--node-guard-fleet-service-account={fleet_sa}")),
        "{args:?}"
    );
    let no_fleet = rendered_with(&ValuesSet {
        label: "no fleet controller",
        values: "prober:\n  fleet:\n    enabled: false\n",
        ..DEFAULT
    });
    assert!(webhook_args(&no_fleet)
        .iter()
        .all(|a| !a.starts_with("--node-guard-fleet-service-account")));
    let role = named(&docs, "ClusterRole", "railguard-webhook").unwrap();
    assert!(role["rules"].as_array().unwrap().iter().any(|r| {
        r["resources"] == json!(["validatingwebhookconfigurations"])
            && r["resourceNames"] == json!(["railguard-webhook-node-guard"])
    }));
    let pods = named(&docs, "Role", "railguard-webhook-node-guard").unwrap();
    assert_eq!(
        pods["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}])
    );
    assert_eq!(pods["metadata"]["namespace"], NS);
    let nodes = named(&docs, "ClusterRole", "railguard-webhook-node-guard").unwrap();
    assert_eq!(
        nodes["rules"],
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}])
    );

    let off = rendered_with(&ValuesSet {
        label: "node guard off",
        values: "webhook:\n  nodeGuard:\n    enabled: false\n",
        ..DEFAULT
    });
    assert!(off
        .iter()
        .all(|d| d["kind"] != "ValidatingWebhookConfiguration"
            && !d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .ends_with("node-guard")));
    assert!(webhook_args(&off)
        .iter()
        .all(|a| !a.starts_with("--node-guard")));
}

/// The chart's own objects of `kind` from the webhook, created as rendered.
async fn create_rendered<K>(client: &Client, docs: &[Value], kind: &str) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(one(docs, kind, "webhook").clone()).unwrap();
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &typed)
        .await
        .unwrap()
}

fn bundles(hooks: impl Iterator<Item = Option<ByteString>>) -> Vec<String> {
    hooks
        .map(|b| String::from_utf8(b.unwrap_or_default().0).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_managed_certificates_trust_the_ca_in_the_node_guard_configuration() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use railguard_webhook_cli::cert_sync::{self, SelfSignedOptions};
    use railguard_webhook_cli::certs::{time, CertSpec};

    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    cp.create_namespace(NS, &labels(&[])).await.unwrap();
    let docs = rendered();
    let webhook_name = one(&docs, "MutatingWebhookConfiguration", "webhook")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let guard_name = one(&docs, "ValidatingWebhookConfiguration", "webhook")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    // The flag the chart passes names the configuration it renders.
    assert!(webhook_args(&docs).contains(&format!("--node-guard-config-name={guard_name}")));
    create_rendered::<MutatingWebhookConfiguration>(&client, &docs, "MutatingWebhookConfiguration")
        .await;

    let dir = tempfile::tempdir().unwrap();
    let opts = SelfSignedOptions {
        secret_name: "railguard-webhook-tls".into(),
        namespace: NS.into(),
        webhook_config_name: webhook_name,
        validating_webhook_config_name: Some(guard_name.clone()),
        spec: CertSpec::new("railguard-webhook", NS, 365, 30).unwrap(),
        tls_cert: dir.path().join("tls.crt"),
        tls_key: dir.path().join("tls.key"),
    };
    let now = time::OffsetDateTime::now_utc();
    // The guard's configuration not applied yet (an install applies it after the
    // Deployment): the pass says so, so it is repeated soon.
    let first = cert_sync::sync_once(&client, &opts, now).await.unwrap();
    assert!(first.webhook_config_missing, "{first:?}");
    assert_eq!(
        first.bundles_patched, 2,
        "both mutating entries (opted in by namespace, by pod)"
    );

    create_rendered::<ValidatingWebhookConfiguration>(
        &client,
        &docs,
        "ValidatingWebhookConfiguration",
    )
    .await;
    let second = cert_sync::sync_once(&client, &opts, now).await.unwrap();
    assert!(!second.webhook_config_missing, "{second:?}");
    assert_eq!(second.bundles_patched, 2, "both node guard entries");
    let guard = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(&guard_name)
        .await
        .unwrap();
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(&opts.webhook_config_name)
        .await
        .unwrap();
    let guard_bundles = bundles(
        guard
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle),
    );
    let mutating_bundles = bundles(
        mutating
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle),
    );
    assert_eq!(guard_bundles.len(), 2);
    assert_eq!(mutating_bundles.len(), 2);
    assert!(guard_bundles
        .iter()
        .all(|b| b.contains("BEGIN CERTIFICATE")));
    assert!(
        guard_bundles
            .iter()
            .chain(&mutating_bundles)
            .all(|b| b == &mutating_bundles[0]),
        "the same CA as the mutating webhook"
    );
    let third = cert_sync::sync_once(&client, &opts, now).await.unwrap();
    assert_eq!(third.bundles_patched, 0, "nothing left to patch");
}

/// With railguard down (the webhook process gone, the chart's registration with
/// `failurePolicy: Fail` left in place): on a server with matchConditions (1.30+) only the
/// writes that change railguard's outputs are sent to the guard, so a Node is still
/// registered, cordoned and tainted, and a forged certification is still refused. On 1.20
/// every guarded Node write is refused during the outage (the chart's documented price).
/// The matchConditions the chart renders for 1.30+ servers name every output the guard
/// protects (`decision::PROTECTED`): a new protected output the expression missed would be
/// written past the guard unseen. 1.20 renders none.
#[test]
fn the_guards_match_conditions_name_every_protected_output() {
    use railguard_webhook::node_guard::decision::{Output, PROTECTED};
    let mut versions = kube_1_20_api_versions();
    versions.push("admissionregistration.k8s.io/v1".into());
    for (server, filtered) in [
        ("v1.20.2", false),
        ("v1.29.9", false),
        ("v1.30.0", true),
        ("v1.37.2", true),
    ] {
        let docs: Vec<Value> = DEFAULT
            .render(&versions, server)
            .unwrap()
            .into_iter()
            .map(|d| d.obj)
            .collect();
        let guard = one(&docs, "ValidatingWebhookConfiguration", "webhook");
        for hook in guard["webhooks"].as_array().unwrap() {
            let conditions = hook["matchConditions"].as_array();
            assert_eq!(conditions.is_some(), filtered, "{server}: {hook}");
            let Some(conditions) = conditions else {
                continue;
            };
            assert_eq!(conditions.len(), 1, "{hook}");
            let expr = conditions[0]["expression"].as_str().unwrap();
            for output in PROTECTED {
                let named = match output {
                    Output::Label(k) => format!("'{k}' in object.metadata.labels"),
                    Output::Annotation(k) => format!("'{k}' in object.metadata.annotations"),
                    Output::Condition(t) => format!("c.type == '{t}'"),
                };
                assert!(
                    expr.contains(&named),
                    "{server}: {output:?} is not in {expr}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_railguard_down_node_operations_work_and_certifications_stay_guarded() {
    let cp = ControlPlane::start().await.expect("control plane");
    // The webhook is ready only once its profile catalog has listed.
    cp.apply_fabricprofile_crd().await.unwrap();
    let client = cp.client();
    cp.create_namespace(NS, &labels(&[])).await.unwrap();
    let docs = rendered_for(&cp).await;
    let guard = one(&docs, "ValidatingWebhookConfiguration", "webhook");
    let filtered = cp.kube_version().minor() >= 30;
    for hook in guard["webhooks"].as_array().unwrap() {
        assert_eq!(
            hook["matchConditions"].is_array(),
            filtered,
            "{}: matchConditions on {}",
            hook["name"],
            cp.kube_version()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    cp.create_node("gpu-a", &labels(&[]), &[]).await.unwrap();
    // An operator who may write Nodes but is not in an allowed group (the admin is in
    // system:masters, which the guard lets change anything).
    let rbac = json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "node-operator"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"],
                    "verbs": ["get", "create", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "node-operator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "node-operator"},
         "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "ops"}]},
    ]);
    apply_objects(&client, NS, rbac.as_array().unwrap())
        .await
        .unwrap();
    let admin = client;
    let client = impersonating(&cp, "ops", &[]).await;
    // The authorizer sees the new binding through its own watch.
    eventually(Duration::from_secs(30), "ops may read Nodes", || async {
        Ok(Api::<Node>::all(client.clone()).get("gpu-a").await.ok())
    })
    .await
    .unwrap();
    {
        let webhook = start_webhook(&cp, NS, &chart_node_guard_args(&docs), dir.path()).await;
        register(&admin, &docs, &webhook, dir.path()).await;
        // The API server picks the configuration up asynchronously; a dry run (the guard
        // has no side effects, so it is called for one) shows when, and writes nothing.
        let forged = json!({"metadata": {"labels": {keys::LABEL_FABRIC: "certified"}}});
        eventually(
            Duration::from_secs(30),
            "the API server calls the node guard",
            || async {
                let pp = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    dry_run: true,
                    ..PatchParams::default()
                };
                let answer = Answer::of(
                    Api::<Node>::all(client.clone())
                        .patch("gpu-a", &pp, &Patch::Merge(&forged))
                        .await,
                );
                Ok(matches!(&answer, Answer::Refused { message, .. }
                    if message.contains("railguard node guard"))
                .then_some(()))
            },
        )
        .await
        .unwrap();
        // Up: a forged label is the guard's refusal.
        label(&client, "gpu-a", keys::LABEL_FABRIC, "certified")
            .await
            .assert_guarded(
                "a forged label while the guard is up",
                "label railguard.io/fabric",
            );
        // Dropped: the process is killed, nothing answers at its address.
    }

    let nodes = Api::<Node>::all(client.clone());
    let fresh: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-new"}}))
    .unwrap();
    let register_new = Answer::of(nodes.create(&PostParams::default(), &fresh).await);
    let cordon = merge(&client, "gpu-a", json!({"spec": {"unschedulable": true}})).await;
    let taint = merge(
        &client,
        "gpu-a",
        json!({"spec": {"taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}}),
    )
    .await;
    let relabel = label(&client, "gpu-a", "example.com/pool", "a").await;
    if filtered {
        register_new.assert_ok("registering a Node with railguard down");
        cordon.assert_ok("cordoning with railguard down");
        taint.assert_ok("tainting with railguard down");
        relabel.assert_ok("an unrelated label with railguard down");
    } else {
        for (what, answer) in [
            ("registering", &register_new),
            ("cordoning", &cordon),
            ("tainting", &taint),
        ] {
            assert!(
                matches!(answer, Answer::Refused { message, .. } if message.contains("node-guard.railguard.io")),
                "{what} on {} with the guard down: {answer:?}",
                cp.kube_version()
            );
        }
    }
    // Forgeries still reach the guard, which is down: failurePolicy Fail refuses them.
    for (what, answer) in [
        (
            "a forged label",
            label(&client, "gpu-a", keys::LABEL_FABRIC, "certified").await,
        ),
        (
            "a forged certificate",
            merge(
                &client,
                "gpu-a",
                json!({"metadata": {"annotations": {keys::ANNOTATION_CERTIFICATE: certificate("gpu-a", "certified")}}}),
            )
            .await,
        ),
        (
            "a forged profile label",
            label(&client, "gpu-a", keys::LABEL_PROFILE, "h100-ndr").await,
        ),
    ] {
        assert!(
            matches!(&answer, Answer::Refused { message, .. } if message.contains("nodes.node-guard.railguard.io")),
            "{what} with the guard down: {answer:?}"
        );
    }
    assert_eq!(node_label(&client, "gpu-a", keys::LABEL_FABRIC).await, None);
    // A Node registered already certified is a forgery too.
    let forged: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-forged", "labels": {keys::LABEL_FABRIC: "certified"}}}))
    .unwrap();
    let answer = Answer::of(nodes.create(&PostParams::default(), &forged).await);
    assert!(
        matches!(&answer, Answer::Refused { message, .. } if message.contains("nodes.node-guard.railguard.io")),
        "registering a certified Node with the guard down: {answer:?}"
    );
}

/// The chart's Pod Security split (`prober.namespace`, issue #31): the probers and the
/// campaign run in their own privileged namespace and the webhook, with the chart's
/// `--node-guard-prober-namespace`, knows them there. The node's prober (its pod there, a
/// token bound to it) certifies its node and the campaign records findings; the same account
/// names in the release namespace — a pod with the probers' labels, bound to the node, under
/// an account given the probers' ClusterRole so RBAC lets it patch — are refused by the
/// guard; the fleet controller stays in the release namespace and keeps its condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_probers_in_their_own_namespace_only_its_accounts_certify() {
    let set = &POD_SECURITY_SPLIT;
    let (release_ns, probers_ns) = (set.namespace, SPLIT_PROBER_NAMESPACE);
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.unwrap();
    let admin = cp.client();
    let docs = render_for_server(set, &admin).await.unwrap();
    for ns in [release_ns, probers_ns] {
        cp.create_namespace(ns, &labels(&[])).await.unwrap();
    }
    let identities = writer_identities(&docs);
    apply_objects(&admin, release_ns, &identities)
        .await
        .unwrap();
    let name_of = |c: &str| {
        one(&docs, "ServiceAccount", c)["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (prober_sa, campaign_sa, fleet_sa) =
        (name_of("prober"), name_of("campaign"), name_of("fleet"));
    for (c, ns) in [
        ("prober", probers_ns),
        ("campaign", probers_ns),
        ("fleet", release_ns),
    ] {
        assert_eq!(
            one(&docs, "ServiceAccount", c)["metadata"]["namespace"],
            ns,
            "{c}"
        );
    }
    // The impostors: the probers' and the campaign's account names in the release namespace,
    // bound to the probers' and the campaign's ClusterRoles (a refusal is then the guard's).
    let mut impostors = Vec::new();
    for (sa, role) in [(&prober_sa, &prober_sa), (&campaign_sa, &campaign_sa)] {
        impostors.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": release_ns},
            "automountServiceAccountToken": false}));
        impostors.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding", "metadata": {"name": format!("{sa}-impostor")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": release_ns}]}));
    }
    apply_objects(&admin, release_ns, &impostors).await.unwrap();

    cp.create_node("gpu-a", &labels(&[]), &[]).await.unwrap();
    let daemonset = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && component(d) == "prober")
        .unwrap();
    assert_eq!(daemonset["metadata"]["namespace"], probers_ns);
    let pod_a = prober_pod(&admin, daemonset, "prober-a", "gpu-a").await;
    let copy = prober_pod_in(&admin, release_ns, daemonset, "prober-copy", "gpu-a").await;

    let dir = tempfile::tempdir().unwrap();
    let guard_args = chart_node_guard_args(&docs);
    assert!(
        guard_args.contains(&format!("--node-guard-prober-namespace={probers_ns}")),
        "{guard_args:?}"
    );
    let webhook = start_webhook(&cp, release_ns, &guard_args, dir.path()).await;
    register(&admin, &docs, &webhook, dir.path()).await;

    let prober_a = token_client(
        &cp,
        &token(&admin, probers_ns, &prober_sa, Some(&pod_a)).await,
    )
    .await;
    let prober_copy = token_client(
        &cp,
        &token(&admin, release_ns, &prober_sa, Some(&copy)).await,
    )
    .await;
    let campaign = token_client(&cp, &token(&admin, probers_ns, &campaign_sa, None).await).await;
    let campaign_copy =
        token_client(&cp, &token(&admin, release_ns, &campaign_sa, None).await).await;
    let fleet = token_client(&cp, &token(&admin, release_ns, &fleet_sa, None).await).await;

    let publish = json!({"metadata": {
        "labels": {keys::LABEL_FABRIC: "certified", keys::LABEL_PROFILE: "h100-ndr",
                   keys::LABEL_SIGNATURE: "sig-1"},
        "annotations": {keys::ANNOTATION_CERTIFICATE: certificate("gpu-a", "certified")}}});
    // Until the API server calls the guard, the copy's write may pass: undone until refused.
    eventually(
        Duration::from_secs(30),
        "the API server calls the node guard",
        || {
            let (prober_copy, admin, publish) =
                (prober_copy.clone(), admin.clone(), publish.clone());
            async move {
                match merge(&prober_copy, "gpu-a", publish).await {
                    Answer::Refused { message, .. } if message.contains("railguard node guard") => {
                        Ok(Some(()))
                    }
                    _ => {
                        let undo = json!({"metadata": {
                            "labels": {keys::LABEL_FABRIC: null, keys::LABEL_PROFILE: null,
                                       keys::LABEL_SIGNATURE: null},
                            "annotations": {keys::ANNOTATION_CERTIFICATE: null}}});
                        merge(&admin, "gpu-a", undo)
                            .await
                            .assert_ok("admin undoes it");
                        Ok(None)
                    }
                }
            }
        },
    )
    .await
    .unwrap();
    let prober_user = format!("system:serviceaccount:{probers_ns}:{prober_sa}");
    merge(&prober_copy, "gpu-a", publish.clone())
        .await
        .assert_guarded(
            "the probers' account name in the release namespace",
            &format!("user \"system:serviceaccount:{release_ns}:{prober_sa}\" may not change"),
        );
    fabric_ready(&prober_copy, "gpu-a")
        .await
        .assert_guarded("its condition", &prober_user);
    assert_eq!(node_label(&admin, "gpu-a", keys::LABEL_FABRIC).await, None);

    // The node's own prober, from the prober namespace.
    own_prober_publishes(&prober_a, publish).await;

    // The campaign: its account there records findings, the release namespace's does not.
    let finding = json!({"metadata": {
        "labels": {keys::LABEL_FABRIC: "degraded"},
        "annotations": {keys::ANNOTATION_CERTIFICATE: certificate("gpu-a", "degraded")}}});
    merge(&campaign_copy, "gpu-a", finding.clone())
        .await
        .assert_guarded(
            "the campaign's account name in the release namespace",
            "may not change",
        );
    merge(&campaign, "gpu-a", finding)
        .await
        .assert_ok("campaign records a finding");
    assert_eq!(
        node_label(&admin, "gpu-a", keys::LABEL_FABRIC)
            .await
            .as_deref(),
        Some("degraded")
    );

    // The fleet controller, in the release namespace, marks an outlier.
    condition(&fleet, "gpu-a", keys::CONDITION_FLEET_OUTLIER, "True")
        .await
        .assert_ok("fleet controller marks an outlier");
}
