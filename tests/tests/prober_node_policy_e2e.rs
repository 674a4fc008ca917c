//! Least privilege for the per-node identity (docs/least-privilege.md): the chart's
//! ValidatingAdmissionPolicy `<release>-railguard-prober-own-node` lets the probers'
//! ServiceAccount write only the Node its pod-bound token names
//! (`userInfo.extra["authentication.kubernetes.io/node-name"]`).
//!
//! - Rendering (no cluster): the policy and its binding exist where the server serves
//!   `admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy` (what `helm install`
//!   sees in `.Capabilities.APIVersions`, `helm template --api-versions`), never on 1.20 or
//!   without that kind, nor with `prober.nodeWritePolicy.enabled: false`; they match the
//!   probers' ServiceAccount alone, the one the prober DaemonSets run as and the node guard
//!   is told about, in the prober namespace.
//! - On the real 1.37 kube-apiserver: the chart's RBAC and the policy applied, two Nodes, a
//!   prober pod bound to node A (no kubelet: `spec.nodeName`) and a TokenRequest token bound
//!   to it. With that token the prober patches node A (labels, status) and records Events
//!   about it; node B, its status and Events about it are refused (403, the policy's
//!   message); a token bound to no pod, or to a pod on no node, is refused every Node write;
//!   the campaign coordinator and the fleet controller (cluster-wide identities, RBAC that
//!   patches Nodes) and the admin are unaffected. Against 1.20 the chart, rendered for that
//!   server, has no policy.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use railguard_tests::answer::Answer;
use railguard_tests::chart_values::{
    render_for_server, ValuesSet, DEFAULT, POD_SECURITY_SPLIT, SPLIT_PROBER_NAMESPACE,
};
use railguard_tests::install::apply_objects;
use railguard_tests::{eventually, labels, ControlPlane, KubeVersion, NotYet};
use railguard_webhook::node_guard::decision::EXTRA_NODE_NAME;
use serde_json::{json, Value};

const NS: &str = DEFAULT.namespace;
const POLICY_KIND: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";
/// Every message of the policy starts so.
const POLICY_MARK: &str = "railguard: system:serviceaccount:";

/// What a 1.37 server adds to Helm's list, as far as the chart asks: the DRA kinds
/// (`railguard_tests::dra`) and, with `policy`, ValidatingAdmissionPolicy and its binding.
fn api_versions(policy: bool) -> Vec<String> {
    let mut v = railguard_tests::dra::chart_api_versions();
    if policy {
        v.push(POLICY_KIND.into());
        v.push(format!("{POLICY_KIND}Binding"));
    }
    v
}

fn render(set: &ValuesSet, versions: &[String], server: &str) -> Vec<Value> {
    set.render(versions, server)
        .unwrap_or_else(|e| panic!("{}: {e:#}", set.label))
        .into_iter()
        .map(|d| d.obj)
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The policy and its binding of `docs`, when rendered (exactly one of each, or none).
fn policy_of(docs: &[Value]) -> Option<(&Value, &Value)> {
    let policies = of_kind(docs, "ValidatingAdmissionPolicy");
    let bindings = of_kind(docs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(policies.len(), bindings.len(), "a policy without binding");
    assert!(policies.len() <= 1, "{policies:?}");
    Some((*policies.first()?, *bindings.first()?))
}

/// The `--name=value` of the webhook's container in `docs`.
fn webhook_flag(docs: &[Value], name: &str) -> String {
    let webhook = docs
        .iter()
        .find(|d| {
            d["kind"] == "Deployment"
                && d["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
        })
        .expect("the webhook Deployment");
    webhook["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix(&format!("--{name}=")))
        .unwrap_or_else(|| panic!("no --{name}"))
        .to_string()
}

#[test]
fn the_policy_is_rendered_where_the_server_serves_it_for_the_probers_account_alone() {
    for (set, prober_ns) in [
        (&DEFAULT, NS),
        (&POD_SECURITY_SPLIT, SPLIT_PROBER_NAMESPACE),
    ] {
        let docs = render(set, &api_versions(true), "v1.37.2");
        let (policy, binding) =
            policy_of(&docs).unwrap_or_else(|| panic!("{}: no policy rendered", set.label));
        let name = policy["metadata"]["name"].as_str().unwrap();
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert!(
            binding["spec"].get("matchResources").is_none()
                && binding["spec"].get("paramRef").is_none(),
            "{binding}"
        );
        let spec = &policy["spec"];
        assert_eq!(spec["failurePolicy"], "Fail");

        // Its only subject: the account every prober DaemonSet runs as, the one the node
        // guard knows as the prober, in the prober namespace. No other account the chart
        // creates (campaign, fleet, webhook, ...) is named.
        let accounts: Vec<&str> = of_kind(&docs, "DaemonSet")
            .iter()
            .map(|d| {
                assert_eq!(d["metadata"]["namespace"], prober_ns, "{}", set.label);
                d["spec"]["template"]["spec"]["serviceAccountName"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert!(!accounts.is_empty());
        assert!(accounts.iter().all(|a| *a == accounts[0]), "{accounts:?}");
        assert_eq!(name, format!("{}-own-node", accounts[0]));
        assert_eq!(
            webhook_flag(&docs, "node-guard-prober-service-account"),
            accounts[0]
        );
        assert_eq!(
            webhook_flag(&docs, "node-guard-prober-namespace"),
            prober_ns
        );
        let user = format!("system:serviceaccount:{prober_ns}:{}", accounts[0]);
        assert_eq!(
            spec["matchConditions"],
            json!([{"name": "prober-service-account",
                    "expression": format!("request.userInfo.username == '{user}'")}]),
            "{}",
            set.label
        );
        let others: Vec<&Value> = of_kind(&docs, "ServiceAccount")
            .into_iter()
            .filter(|sa| sa["metadata"]["name"] != accounts[0])
            .collect();
        assert!(others.len() >= 4, "campaign, fleet, webhook, extender, ...");
        let text = spec.to_string();
        for sa in others {
            let other = format!(
                "system:serviceaccount:{}:{}",
                sa["metadata"]["namespace"].as_str().unwrap(),
                sa["metadata"]["name"].as_str().unwrap()
            );
            assert!(!text.contains(&format!("{other}'")), "{other} is matched");
        }

        // What it guards: Nodes and their status, whatever the operation, and Events.
        let rules = spec["matchConstraints"]["resourceRules"]
            .as_array()
            .unwrap();
        let covers = |group: &str, resource: &str, op: &str| {
            rules.iter().any(|r| {
                r["apiGroups"].as_array().unwrap().contains(&json!(group))
                    && r["resources"]
                        .as_array()
                        .unwrap()
                        .contains(&json!(resource))
                    && r["operations"].as_array().unwrap().contains(&json!(op))
                    && r["apiVersions"] == json!(["*"])
            })
        };
        for resource in ["nodes", "nodes/status"] {
            for op in ["CREATE", "UPDATE", "DELETE"] {
                assert!(covers("", resource, op), "{resource} {op}");
            }
        }
        for group in ["", "events.k8s.io"] {
            for op in ["CREATE", "UPDATE"] {
                assert!(covers(group, "events", op), "{group} events {op}");
            }
        }
        // The node comes from the key the node guard reads too.
        assert!(
            spec["variables"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == "tokenNode"
                    && v["expression"]
                        .as_str()
                        .unwrap()
                        .contains(&format!("'{EXTRA_NODE_NAME}'"))),
            "{spec}"
        );
        // Every refusal is a 403 (Forbidden) with the policy's own words.
        for v in spec["validations"].as_array().unwrap() {
            assert_eq!(v["reason"], "Forbidden", "{v}");
            assert!(
                v["messageExpression"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("'{POLICY_MARK}")),
                "{v}"
            );
        }
        assert_eq!(
            policy["metadata"]["labels"]["app.kubernetes.io/component"],
            "prober"
        );
    }

    // Not where the server lacks the kind: 1.20, a 1.37 list without it, `helm template`'s
    // own list (group/versions, never a kind).
    let off = |set: &ValuesSet, versions: &[String], server: &str| {
        assert!(
            policy_of(&render(set, versions, server)).is_none(),
            "{}: {server}",
            set.label
        );
    };
    off(
        &DEFAULT,
        &railguard_tests::helm::kube_1_20_api_versions(),
        railguard_tests::helm::KUBE_1_20_VERSION,
    );
    off(&DEFAULT, &api_versions(false), "v1.37.2");
    off(&DEFAULT, &[], "v1.37.2");
    // Nor when switched off, nor without probers.
    off(
        &ValuesSet {
            label: "prober.nodeWritePolicy.enabled false",
            values: "prober: {nodeWritePolicy: {enabled: false}}\n",
            ..DEFAULT
        },
        &api_versions(true),
        "v1.37.2",
    );
    off(
        &ValuesSet {
            label: "no probers",
            values: "prober: {enabled: false}\n",
            ..DEFAULT
        },
        &api_versions(true),
        "v1.37.2",
    );
    // The schema knows the value.
    let out = railguard_tests::helm::shared()
        .template_output(
            &ValuesSet {
                label: "nodeWritePolicy typo",
                values: "prober: {nodeWritePolicy: {enable: false}}\n",
                ..DEFAULT
            },
            &api_versions(true),
            "v1.37.2",
        )
        .unwrap();
    assert!(!out.status.success(), "a misspelt key rendered");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nodeWritePolicy"), "{err}");
}

/// Refusals by the prober's policy.
trait PolicyAnswer {
    /// Refused by the policy (403, its own message, `words` in it), not by RBAC.
    fn assert_refused(&self, what: &str, words: &str);
}

impl PolicyAnswer for Answer {
    #[track_caller]
    fn assert_refused(&self, what: &str, words: &str) {
        self.assert_refused_by("policy", POLICY_MARK, what, words);
    }
}

/// A client authenticating with `token` alone.
async fn token_client(cp: &ControlPlane, token: &str) -> Client {
    let mut kubeconfig = Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    for user in &mut kubeconfig.auth_infos {
        if let Some(info) = user.auth_info.as_mut() {
            info.token = Some(token.to_string().into());
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// A pod of the chart's prober DaemonSet template in `namespace`, bound to `node` when
/// given (no kubelet runs it).
async fn prober_pod(
    client: &Client,
    namespace: &str,
    daemonset: &Value,
    name: &str,
    node: Option<&str>,
) -> Pod {
    let template = &daemonset["spec"]["template"];
    let mut spec = json!({
        "serviceAccountName": template["spec"]["serviceAccountName"],
        "automountServiceAccountToken": false,
        "containers": [{"name": "daemon", "image": "registry.invalid/railguard-prober"}],
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": template["metadata"]["labels"]},
        "spec": spec,
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

async fn label(client: &Client, node: &str, value: &str) -> Answer {
    let pp = PatchParams {
        field_manager: Some("railguard-e2e".into()),
        ..Default::default()
    };
    Answer::of(
        Api::<Node>::all(client.clone())
            .patch(
                node,
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {"railguard.io/e2e": value}}})),
            )
            .await,
    )
}

async fn condition(client: &Client, node: &str) -> Answer {
    let now = jiff::Timestamp::now().to_string();
    let pp = PatchParams {
        field_manager: Some("railguard-e2e".into()),
        ..Default::default()
    };
    Answer::of(
        Api::<Node>::all(client.clone())
            .patch_status(
                node,
                &pp,
                &Patch::Strategic(json!({"status": {"conditions": [{
                    "type": "RailguardE2e", "status": "True", "reason": "E2e",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}]}})),
            )
            .await,
    )
}

/// A core/v1 Event in `default` (where Events about cluster-scoped objects go, as the
/// prober records them) about `kind` `name`.
async fn event(client: &Client, kind: &str, name: &str) -> Answer {
    let now = jiff::Timestamp::now().to_string();
    let ev: Event = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{name}.railguard-"), "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name},
        "reason": "E2e", "message": "prober_node_policy_e2e", "type": "Normal",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": "railguard-prober"},
    }))
    .unwrap();
    Answer::of(
        Api::<Event>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &ev)
            .await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probers_token_writes_only_the_node_it_names() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client();
    // The chart as `helm install` renders it against this server.
    let docs = render_for_server(&DEFAULT, &admin).await.unwrap();
    if cp.kube_version() == KubeVersion::V1_20 {
        assert!(
            policy_of(&docs).is_none(),
            "1.20 serves no ValidatingAdmissionPolicy: the chart renders none"
        );
        return;
    }
    let (policy, _) = policy_of(&docs).expect("1.37 serves ValidatingAdmissionPolicy");
    let policy_name = policy["metadata"]["name"].as_str().unwrap().to_string();

    // The chart's prober, campaign and fleet identities and the policy.
    cp.create_namespace(NS, &labels(&[])).await.unwrap();
    let component = |d: &Value| {
        d["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let applied: Vec<Value> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "ValidatingAdmissionPolicy"
                        | "ValidatingAdmissionPolicyBinding"
                )
            ) && matches!(component(d).as_str(), "prober" | "campaign" | "fleet")
        })
        .cloned()
        .collect();
    assert_eq!(
        applied.len(),
        11,
        "SA, role and binding of each; policy and binding"
    );
    apply_objects(&admin, NS, &applied).await.unwrap();
    let account = |c: &str| {
        docs.iter()
            .find(|d| d["kind"] == "ServiceAccount" && component(d) == c)
            .unwrap()["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let prober_sa = account("prober");

    for n in ["gpu-a", "gpu-b"] {
        cp.create_node(n, &labels(&[]), &[]).await.unwrap();
    }
    let daemonset = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && component(d) == "prober")
        .unwrap();
    let on_a = prober_pod(&admin, NS, daemonset, "prober-on-a", Some("gpu-a")).await;
    let prober_a = token_client(
        &cp,
        &railguard_tests::service_account_token(&admin, NS, &prober_sa, Some(&on_a))
            .await
            .unwrap(),
    )
    .await;

    // The policy is in force once the API server's admission has loaded it; node B is the
    // one a prober on node A may not write.
    let refusal = eventually(
        Duration::from_secs(60),
        "the policy refuses the prober of gpu-a a write of gpu-b",
        || {
            let prober_a = prober_a.clone();
            async move {
                Ok(match label(&prober_a, "gpu-b", "from-a").await {
                    Answer::Ok => Err(NotYet("gpu-b was patched: not in force yet".into())),
                    Answer::Refused { code, message } => Ok((code, message)),
                })
            }
        },
    )
    .await
    .unwrap();
    let (code, message) = refusal;
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains(&policy_name)
            && message.contains(&format!(
                "railguard: system:serviceaccount:{NS}:{prober_sa} on node gpu-a may write only its own Node, not nodes gpu-b"
            )),
        "{message}"
    );

    // Its own Node: labels, status, Events about it.
    label(&prober_a, "gpu-a", "own")
        .await
        .assert_ok("labels of its own Node");
    condition(&prober_a, "gpu-a")
        .await
        .assert_ok("a condition on its own Node");
    event(&prober_a, "Node", "gpu-a")
        .await
        .assert_ok("an Event about its own Node");
    // Another Node's status, Events about another Node or anything else.
    condition(&prober_a, "gpu-b")
        .await
        .assert_refused("gpu-b's status", "not nodes/status gpu-b");
    event(&prober_a, "Node", "gpu-b").await.assert_refused(
        "an Event about gpu-b",
        "only about its own Node, not about Node gpu-b",
    );
    event(&prober_a, "Pod", "gpu-a")
        .await
        .assert_refused("an Event about a pod", "not about Pod gpu-a");

    // A token that names no node: bound to nothing, or to a prober pod not on a node.
    let unbound = token_client(
        &cp,
        &railguard_tests::service_account_token(&admin, NS, &prober_sa, None)
            .await
            .unwrap(),
    )
    .await;
    let pending = prober_pod(&admin, NS, daemonset, "prober-pending", None).await;
    let unscheduled = token_client(
        &cp,
        &railguard_tests::service_account_token(&admin, NS, &prober_sa, Some(&pending))
            .await
            .unwrap(),
    )
    .await;
    for (what, client) in [("unbound", &unbound), ("unscheduled pod", &unscheduled)] {
        label(client, "gpu-a", "unbound")
            .await
            .assert_refused(what, "this token names no node");
        condition(client, "gpu-a")
            .await
            .assert_refused(what, "this token names no node");
        event(client, "Node", "gpu-a")
            .await
            .assert_refused(what, "this token names no node");
    }

    // Nothing else is matched: the cluster-wide campaign coordinator and fleet controller
    // (whose roles patch Nodes) with tokens bound to nothing, and the admin.
    for c in ["campaign", "fleet"] {
        let client = token_client(
            &cp,
            &railguard_tests::service_account_token(&admin, NS, &account(c), None)
                .await
                .unwrap(),
        )
        .await;
        label(&client, "gpu-b", c)
            .await
            .assert_ok(&format!("the {c} identity labels gpu-b"));
    }
    label(&admin, "gpu-b", "admin")
        .await
        .assert_ok("the admin labels gpu-b");
    condition(&admin, "gpu-b")
        .await
        .assert_ok("the admin writes gpu-b's status");

    let own = Api::<Node>::all(admin.clone()).get("gpu-a").await.unwrap();
    assert_eq!(
        own.metadata.labels.unwrap_or_default()["railguard.io/e2e"],
        "own",
        "only the prober's own write reached gpu-a"
    );
}
