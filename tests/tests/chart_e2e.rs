//! The Helm chart (`charts/railguard`): rendered by the real Helm (`helm template`, with
//! `--kube-version` and `--api-versions` for the Capabilities of the cluster in question:
//! `railguard_tests::helm::KUBE_1_20_API_VERSIONS` unless a test says otherwise) for several
//! values sets, each of which also passes `helm lint --strict`; checked structurally, then
//! every object dry-run against the real kube-apiserver of the pass (1.20, or 1.37 under
//! `RAILGUARD_KUBE_VERSION=1.37`), rendered for that server's own Capabilities: with the real
//! `kubectl apply --dry-run=server --validate=strict`, and through the kube client with
//! `dryRun=All`. helm and kubectl come from `tests/scripts/helm.sh`
//! (`RAILGUARD_HELM_BIN_DIR`): without them these tests fail.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use kube::ResourceExt;
use railguard_tests::chart_values::{
    ValuesSet, ALL_PROFILES, ALL_SETS, CERT_MANAGER_CONFIG_ONLY, CERT_MANAGER_ISSUER, DEFAULT,
    DRY_RUN_SETS, FLEET_DASHBOARD, PCI_CONFIG_SPACE, POD_SECURITY_SPLIT,
    POD_SECURITY_SPLIT_EXISTING, REAL_NODE, ROCE, SPLIT_PROBER_NAMESPACE,
};
use railguard_tests::helm::{
    assert_server_dry_run, kube_1_20_api_versions, Helm, KUBE_1_20_VERSION,
};
use railguard_tests::{b64, labels, workspace_root, ControlPlane, KubeVersion};
use serde_json::{json, Value as Json};

/// One rendered object with the template it came from.
#[derive(Debug, Clone)]
struct Doc {
    source: String,
    obj: Json,
}

impl Doc {
    fn kind(&self) -> &str {
        self.obj["kind"].as_str().unwrap_or_default()
    }
    fn name(&self) -> &str {
        self.obj["metadata"]["name"].as_str().unwrap_or_default()
    }
}

/// `helm template` of the chart with `set` for a cluster at `kube_version` serving
/// `api_versions`; where it renders, `helm lint --strict` of the same values passes too
/// (checked once per set and version in a run).
fn render_with(
    set: &ValuesSet,
    api_versions: &[String],
    kube_version: &str,
) -> anyhow::Result<Vec<Doc>> {
    let docs = helm().template_docs(set, api_versions, kube_version)?;
    lint_once(set, kube_version);
    Ok(docs
        .into_iter()
        .map(|d| Doc {
            source: d.source,
            obj: d.obj,
        })
        .collect())
}

/// `helm lint --strict` passes for `set` at `kube_version`.
fn lint_once(set: &ValuesSet, kube_version: &str) {
    static LINTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let key = format!(
        "{}\0{}\0{}\0{kube_version}",
        set.release, set.namespace, set.values
    );
    if !LINTED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key)
    {
        return;
    }
    let lint = helm().lint(set, kube_version).unwrap();
    assert!(
        lint.status.success(),
        "{} ({kube_version}): helm lint --strict:\n{}{}",
        set.label,
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
}

/// The real Helm and kubectl, built by tests/scripts/helm.sh.
/// `helm template` of `set` for 1.20: whether it rendered, and what Helm printed on stderr.
fn template_1_20(set: &ValuesSet) -> (bool, String) {
    let out = helm()
        .template_output(set, &kube_1_20_api_versions(), KUBE_1_20_VERSION)
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Container `c`'s liveness and readiness probes ask its metrics port.
#[track_caller]
fn assert_health_probes_on_metrics_port(c: &Json) {
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "metrics"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "metrics"})
    );
}

fn helm() -> &'static Helm {
    railguard_tests::helm::shared()
}

fn render(set: &ValuesSet) -> Vec<Doc> {
    render_with(set, &kube_1_20_api_versions(), KUBE_1_20_VERSION)
        .unwrap_or_else(|e| panic!("{}: {e:#}", set.label))
}

fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Json {
    &docs
        .iter()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| {
            let have: Vec<String> = docs
                .iter()
                .map(|d| format!("{}/{}", d.kind(), d.name()))
                .collect();
            panic!("no {kind}/{name} in {have:?}")
        })
        .obj
}

fn all<'a>(docs: &'a [Doc], kind: &str) -> Vec<&'a Json> {
    docs.iter()
        .filter(|d| d.kind() == kind)
        .map(|d| &d.obj)
        .collect()
}

fn strs(v: &Json) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| {
            x.as_str()
                .unwrap_or_else(|| panic!("not a string: {x}"))
                .to_string()
        })
        .collect()
}

/// The rule of a Role/ClusterRole that covers `resource` in `group`.
fn rule_for<'a>(role: &'a Json, group: &str, resource: &str) -> Option<&'a Json> {
    role["rules"].as_array()?.iter().find(|r| {
        strs(&r["apiGroups"]).iter().any(|g| g == group)
            && strs(&r["resources"]).iter().any(|x| x == resource)
    })
}

fn verbs(role: &Json, group: &str, resource: &str) -> BTreeSet<String> {
    role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            strs(&r["apiGroups"]).iter().any(|g| g == group)
                && strs(&r["resources"]).iter().any(|x| x == resource)
        })
        .flat_map(|r| strs(&r["verbs"]))
        .collect()
}

fn container_args(c: &Json) -> Vec<String> {
    strs(&c["args"])
}

#[test]
fn default_values_render_the_webhook_configuration_the_issue_asks_for() {
    let docs = render(&DEFAULT);
    let mwc = find(&docs, "MutatingWebhookConfiguration", "railguard-webhook");
    let w = &mwc["webhooks"][0];
    assert_eq!(w["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(w["sideEffects"], "None");
    assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    assert_eq!(w["timeoutSeconds"], 10);
    assert_eq!(w["failurePolicy"], "Ignore");
    assert_eq!(
        w["clientConfig"]["service"],
        json!({"name": "railguard-webhook", "namespace": "railguard", "path": "/mutate", "port": 443})
    );
    assert!(
        w["clientConfig"].get("caBundle").is_none(),
        "no cluster: the webhook writes the caBundle"
    );
    assert_eq!(
        w["rules"],
        json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}])
    );
    let exprs = &w["namespaceSelector"]["matchExpressions"];
    assert_eq!(exprs[0]["key"], "kubernetes.io/metadata.name");
    assert_eq!(exprs[0]["operator"], "NotIn");
    assert_eq!(strs(&exprs[0]["values"]), ["kube-system", "railguard"]);
    // Opt-in by default: pods of namespaces labelled railguard.io/inject=true, and pods so
    // labelled in any other namespace.
    assert_eq!(
        exprs[1],
        json!({"key": "railguard.io/inject", "operator": "In", "values": ["true"]})
    );
    assert!(w.get("objectSelector").is_none());
    let w2 = &mwc["webhooks"][1];
    assert_eq!(w2["name"], "opted-in-pods.webhook.railguard.io");
    assert_eq!(
        w2["namespaceSelector"]["matchExpressions"][1],
        json!({"key": "railguard.io/inject", "operator": "NotIn", "values": ["true"]})
    );
    assert_eq!(
        w2["objectSelector"],
        json!({"matchLabels": {"railguard.io/inject": "true"}})
    );
    assert_eq!(w2["clientConfig"], w["clientConfig"]);
    assert_eq!(mwc["webhooks"].as_array().unwrap().len(), 2);

    // Deployment: two replicas spread over nodes, probes on the metrics port.
    let dep = find(&docs, "Deployment", "railguard-webhook");
    assert_eq!(dep["spec"]["replicas"], 2);
    let pod = &dep["spec"]["template"]["spec"];
    let anti = &pod["affinity"]["podAntiAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        anti["labelSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "webhook"
    );
    let c = &pod["containers"][0];
    assert_health_probes_on_metrics_port(c);
    assert_eq!(
        c["image"],
        format!(
            "ghcr.io/railguard/railguard-webhook:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    let args = container_args(c);
    for want in [
        "--listen=0.0.0.0:8443",
        "--metrics-listen=0.0.0.0:9090",
        "--tls-cert=/etc/railguard/tls/tls.crt",
        "--tls-key=/etc/railguard/tls/tls.key",
        "--failure-mode=open",
        "--mode=Audit",
        "--excluded-namespaces=kube-system,railguard",
        "--self-signed-secret=railguard-webhook-tls",
        "--webhook-config-name=railguard-webhook",
        &format!(
            "--prober-image=ghcr.io/railguard/railguard-prober:{}",
            env!("CARGO_PKG_VERSION")
        ),
    ] {
        assert!(
            args.contains(&want.to_string()),
            "webhook args lack {want}: {args:?}"
        );
    }
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    // Self-managed mode: writable in-memory dir for the generated pair, the Secret exists.
    assert_eq!(pod["volumes"][0]["emptyDir"]["medium"], "Memory");
    assert_eq!(
        find(&docs, "Secret", "railguard-webhook-tls")["type"],
        "Opaque"
    );

    // PDB in the API the 1.20 server has.
    let pdb = find(&docs, "PodDisruptionBudget", "railguard-webhook");
    assert_eq!(pdb["apiVersion"], "policy/v1beta1");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
}

/// The webhook's configuration as the binary builds it from the Deployment's arguments.
fn webhook_config_of(docs: &[Doc]) -> railguard_webhook::WebhookConfig {
    use clap::Parser;
    let dep = find(docs, "Deployment", "railguard-webhook");
    let mut argv = vec!["railguard-webhook".to_string()];
    argv.extend(container_args(
        &dep["spec"]["template"]["spec"]["containers"][0],
    ));
    let cli = railguard_webhook_cli::Cli::try_parse_from(argv).unwrap();
    railguard_webhook_cli::settings::webhook_config(&cli, Some("railguard")).unwrap()
}

/// Whether an entry of the MutatingWebhookConfiguration sends a pod with `pod` labels in a
/// namespace with `ns` labels (its selectors are ANDed; the entries ORed).
fn entries_send(mwc: &Json, ns: &BTreeMap<String, String>, pod: &BTreeMap<String, String>) -> bool {
    use railguard_api::selector::LabelSelector;
    let matches = |sel: &Json, labels: &BTreeMap<String, String>| {
        sel.is_null()
            || serde_json::from_value::<LabelSelector>(sel.clone())
                .unwrap()
                .matches(labels)
    };
    mwc["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| matches(&w["namespaceSelector"], ns) && matches(&w["objectSelector"], pod))
}

#[test]
fn the_charts_opt_in_entries_and_the_webhooks_scope_agree() {
    let label = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let kueue = ValuesSet {
        values: r#"
webhook:
  optIn:
    enabled: true
    namespaceLabel: {key: team.example/gpu, value: enabled}
    podSelector:
      matchExpressions: [{key: kueue.x-k8s.io/podset, operator: Exists}]
  objectSelector:
    matchExpressions: [{key: railguard.io/opt-out, operator: DoesNotExist}]
"#,
        ..DEFAULT
    };
    let everyone = ValuesSet {
        values: "webhook: {mode: Enforce, optIn: {enabled: false}}",
        ..DEFAULT
    };
    for set in [&DEFAULT, &kueue, &everyone] {
        let docs = render(set);
        let config = webhook_config_of(&docs);
        let mwc = find(&docs, "MutatingWebhookConfiguration", "railguard-webhook");
        for ns_name in ["ml", "research"] {
            for ns_extra in [
                vec![],
                vec![("railguard.io/inject", "true")],
                vec![("railguard.io/inject", "false")],
                vec![("team.example/gpu", "enabled")],
            ] {
                let mut ns = label(&ns_extra);
                ns.insert("kubernetes.io/metadata.name".into(), ns_name.into());
                for pod in [
                    label(&[]),
                    label(&[("railguard.io/inject", "true")]),
                    label(&[("kueue.x-k8s.io/podset", "team-a")]),
                    label(&[
                        ("kueue.x-k8s.io/podset", "team-a"),
                        ("railguard.io/opt-out", ""),
                    ]),
                ] {
                    let sent = entries_send(mwc, &ns, &pod);
                    let opted_out = pod.contains_key("railguard.io/opt-out");
                    // The API server may send more than the scope only where the user's own
                    // objectSelector filters (the webhook never sees those pods).
                    assert_eq!(
                        sent,
                        config.scope.admits(&ns, &pod)
                            && !(opted_out && set.values.contains("opt-out")),
                        "{}: namespace {ns:?}, pod {pod:?}",
                        set.values
                    );
                }
            }
        }
    }
    let mode = |set: &ValuesSet| webhook_config_of(&render(set)).mode;
    use railguard_api::profile::AdmissionMode;
    assert_eq!(
        mode(&DEFAULT),
        AdmissionMode::Audit,
        "the chart starts in Audit"
    );
    assert_eq!(
        mode(&everyone),
        AdmissionMode::Enforce,
        "one value enforces"
    );
    assert!(!webhook_config_of(&render(&everyone)).scope.is_opt_in());
    assert_eq!(
        find(
            &render(&everyone),
            "MutatingWebhookConfiguration",
            "railguard-webhook"
        )["webhooks"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn rbac_is_least_privilege_per_component() {
    let docs = render(&DEFAULT);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();

    let webhook = find(&docs, "ClusterRole", "railguard-webhook");
    assert_eq!(
        verbs(webhook, "railguard.io", "fabricprofiles"),
        set(&["get", "list", "watch"])
    );
    assert_eq!(
        verbs(webhook, "", "namespaces"),
        set(&["get", "list", "watch"])
    );
    let mwc = rule_for(
        webhook,
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
    )
    .expect("caBundle rule");
    assert_eq!(strs(&mwc["resourceNames"]), ["railguard-webhook"]);
    assert!(verbs(webhook, "", "pods").is_empty() && verbs(webhook, "", "secrets").is_empty());
    let certs = find(&docs, "Role", "railguard-webhook-certs");
    let secret_rule = rule_for(certs, "", "secrets").expect("secret rule");
    assert_eq!(
        strs(&secret_rule["resourceNames"]),
        ["railguard-webhook-tls"]
    );
    assert_eq!(strs(&secret_rule["verbs"]), ["get", "update", "patch"]);

    let extender = find(&docs, "ClusterRole", "railguard-extender");
    for r in ["nodes", "pods", "namespaces"] {
        assert_eq!(
            verbs(extender, "", r),
            set(&["get", "list", "watch"]),
            "extender {r}"
        );
    }
    assert_eq!(
        verbs(extender, "railguard.io", "fabricprofiles"),
        set(&["get", "list", "watch"])
    );
    assert_eq!(
        extender["rules"].as_array().unwrap().len(),
        2,
        "nothing else"
    );

    // Its own Node only, which RBAC cannot say: the node guard enforces it
    // (tests/tests/node_guard_e2e.rs).
    let prober = find(&docs, "ClusterRole", "railguard-prober");
    // list and watch: it watches its own Node (a field selector on its name) instead of
    // polling it.
    assert_eq!(
        verbs(prober, "", "nodes"),
        set(&["get", "list", "watch", "patch"])
    );
    assert_eq!(verbs(prober, "", "nodes/status"), set(&["patch"]));
    assert_eq!(verbs(prober, "", "events"), set(&["create", "patch"]));
    assert_eq!(verbs(prober, "", "pods"), set(&["list"]));
    assert_eq!(
        verbs(prober, "railguard.io", "fabricprofiles"),
        set(&["get", "list", "watch"])
    );
    assert!(verbs(prober, "", "secrets").is_empty());

    // The fleet controller reads certificates and profiles and writes only its condition,
    // Events and the profiles' status.fleet.
    let fleet = find(&docs, "ClusterRole", "railguard-fleet");
    // patch: the fabric-unhealthy taint and an expired certification's pending label.
    assert_eq!(
        verbs(fleet, "", "nodes"),
        set(&["get", "list", "watch", "patch"])
    );
    assert_eq!(verbs(fleet, "", "nodes/status"), set(&["patch"]));
    for group in ["", "events.k8s.io"] {
        assert_eq!(verbs(fleet, group, "events"), set(&["create", "patch"]));
    }
    assert_eq!(
        verbs(fleet, "railguard.io", "fabricprofiles"),
        set(&["get", "list", "watch"])
    );
    assert_eq!(
        verbs(fleet, "railguard.io", "fabricprofiles/status"),
        set(&["get", "patch"])
    );
    assert_eq!(fleet["rules"].as_array().unwrap().len(), 5, "nothing else");
    let binding = find(&docs, "ClusterRoleBinding", "railguard-fleet");
    assert_eq!(binding["roleRef"]["name"], "railguard-fleet");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "railguard-fleet", "namespace": "railguard"}])
    );

    // The Secrets the pods fill themselves: get and update of that one name, bound to the
    // service accounts of the pods that fill it (the extender's set: the scheduler's pods,
    // whose sidecar is the extender; the token: the probers and the campaign).
    let filled = |docs: &[Doc], secret: &str, writers: &[&str]| {
        let role = find(docs, "Role", secret);
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get", "update"]}]),
            "{secret}"
        );
        let binding = find(docs, "RoleBinding", secret);
        assert_eq!(binding["roleRef"]["name"], secret);
        let subjects: BTreeSet<String> = binding["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(subjects, set(writers), "{secret}");
    };
    filled(&docs, "railguard-extender-tls", &["railguard-scheduler"]);
    filled(
        &docs,
        "railguard-peer-token",
        &["railguard-prober", "railguard-campaign"],
    );
    // With the extender in its own Deployment (a config-only scheduler), its pods fill it.
    let own = render(&CERT_MANAGER_CONFIG_ONLY);
    filled(
        &own,
        "rg-railguard-extender-tls",
        &["rg-railguard-extender"],
    );
    let ext_pod = &find(&own, "Deployment", "rg-railguard-extender")["spec"]["template"]["spec"];
    assert_eq!(ext_pod["initContainers"][0]["name"], "extender-tls");
    // Nothing else in the chart reads or writes Secrets but the webhook's certificates.
    for (kind, role) in all(&docs, "ClusterRole")
        .into_iter()
        .map(|r| ("ClusterRole", r))
        .chain(all(&docs, "Role").into_iter().map(|r| ("Role", r)))
    {
        let name = role["metadata"]["name"].as_str().unwrap();
        if [
            "railguard-webhook-certs",
            "railguard-extender-tls",
            "railguard-peer-token",
        ]
        .contains(&name)
        {
            continue;
        }
        for r in role["rules"].as_array().unwrap() {
            let resources = strs(&r["resources"]);
            assert!(
                !resources.iter().any(|x| x == "secrets" || x == "*"),
                "{kind}/{name}: {r}"
            );
        }
    }

    // The secondary scheduler: the built-in roles plus its own lease.
    let bound: BTreeSet<String> = all(&docs, "ClusterRoleBinding")
        .iter()
        .filter(|b| b["subjects"][0]["name"] == "railguard-scheduler")
        .map(|b| b["roleRef"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        bound,
        set(&[
            "system:kube-scheduler",
            "system:volume-scheduler",
            "railguard-scheduler"
        ])
    );
    let lease = find(&docs, "Role", "railguard-scheduler-leader-election");
    assert_eq!(
        strs(&lease["rules"][1]["resourceNames"]),
        ["railguard-scheduler"]
    );

    // No component may touch RBAC or escalate.
    for role in all(&docs, "ClusterRole")
        .into_iter()
        .chain(all(&docs, "Role"))
    {
        for r in role["rules"].as_array().unwrap() {
            let v = strs(&r["verbs"]);
            assert!(
                !v.contains(&"*".to_string())
                    && !v.contains(&"escalate".to_string())
                    && !v.contains(&"bind".to_string()),
                "{role}"
            );
            assert!(
                !strs(&r["apiGroups"]).contains(&"rbac.authorization.k8s.io".to_string()),
                "{role}"
            );
        }
    }
}

#[test]
fn secondary_scheduler_points_at_the_extender_and_fails_closed() {
    let docs = render(&DEFAULT);
    let cm = find(&docs, "ConfigMap", "railguard-scheduler");
    let config: Json =
        serde_yaml_ng::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        config["apiVersion"], "kubescheduler.config.k8s.io/v1beta1",
        "1.20 scheduler"
    );
    assert_eq!(config["kind"], "KubeSchedulerConfiguration");
    assert_eq!(
        config["profiles"][0]["schedulerName"],
        "railguard-scheduler"
    );
    assert_eq!(
        config["leaderElection"]["resourceName"],
        "railguard-scheduler"
    );
    let e = &config["extenders"][0];
    // The extender runs beside the scheduler (placement auto with a secondary scheduler),
    // over TLS with the chart's CA, the scheduler authenticated by its client certificate.
    assert_eq!(e["urlPrefix"], "https://127.0.0.1:8888");
    assert_eq!(e["enableHTTPS"], true);
    assert_eq!(
        e["tlsConfig"],
        json!({
            "caFile": "/etc/railguard/extender-tls/ca.crt",
            "certFile": "/etc/railguard/extender-tls/client.crt",
            "keyFile": "/etc/railguard/extender-tls/client.key",
        })
    );
    // The Secret is the chart's, empty: the extender-tls init container of the first pod
    // to start fills it (railguard-extender tls-bootstrap) and every pod that mounts the
    // set writes it from there into its in-memory volume.
    let secret = find(&docs, "Secret", "railguard-extender-tls");
    assert!(secret.get("data").is_none(), "nothing generated: {secret}");
    assert_eq!(e["filterVerb"], "filter");
    assert_eq!(e["prioritizeVerb"], "prioritize");
    assert_eq!(e["nodeCacheCapable"], true);
    assert_eq!(e["ignorable"], false);
    assert_eq!(e["weight"], 5);
    assert_eq!(
        e["managedResources"],
        json!([{"name": "nvidia.com/gpu", "ignoredByScheduler": false}])
    );
    let dep = find(&docs, "Deployment", "railguard-scheduler");
    // The set is written by the init container into an in-memory volume that the scheduler
    // and the extender mount, with the names kube-scheduler dials (the sidecar's loopback
    // and the Service's names, as the chart's genSignedCert had them).
    let pod = &dep["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], "extender-tls");
    assert_eq!(
        container_args(init),
        [
            "tls-bootstrap",
            "--secret=railguard-extender-tls",
            "--namespace=railguard",
            "--out=/etc/railguard/extender-tls",
            "--server-ip=127.0.0.1",
            "--server-dns=localhost,railguard-extender.railguard.svc,railguard-extender.railguard.svc.cluster.local",
            "--server-cn=railguard-extender",
            "--client-cn=railguard-scheduler",
            "--ca-cn=railguard-extender-ca",
            "--validity-days=3650",
            "--log-format=json",
        ]
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "extender-tls")
        .unwrap();
    assert_eq!(volume["emptyDir"]["medium"], "Memory");
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["image"], "registry.k8s.io/kube-scheduler:v1.20.2",
        "matches the cluster"
    );
    // Managed clusters report versions no registry has as a tag: the upstream release is
    // the default, and an explicit tag wins.
    for (server, tag) in [
        ("v1.30.4-eks-a737599", "v1.30.4"),
        ("v1.31.1-gke.1146000", "v1.31.1"),
        ("v1.30.4+k3s1", "v1.30.4"),
        ("1.29.3", "v1.29.3"),
    ] {
        let docs = render_with(&DEFAULT, &kube_1_20_api_versions(), server).unwrap();
        let dep = find(&docs, "Deployment", "railguard-scheduler");
        assert_eq!(
            dep["spec"]["template"]["spec"]["containers"][0]["image"],
            format!("registry.k8s.io/kube-scheduler:{tag}"),
            "{server}"
        );
    }
    let pinned = ValuesSet {
        label: "pinned scheduler tag",
        values: "scheduler: {image: {tag: v1.30.9}}\n",
        ..DEFAULT
    };
    let docs = render_with(&pinned, &kube_1_20_api_versions(), "v1.30.4-eks-a737599").unwrap();
    assert_eq!(
        find(&docs, "Deployment", "railguard-scheduler")["spec"]["template"]["spec"]["containers"]
            [0]["image"],
        "registry.k8s.io/kube-scheduler:v1.30.9"
    );
    assert!(
        strs(&c["command"]).contains(&"--config=/etc/railguard-scheduler/config.yaml".to_string())
    );
    // Its sidecar listens where the URL points, on loopback only; no Service or
    // Deployment of its own, and the scheduler's service account may read what it caches.
    let containers = dep["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let ext = containers
        .iter()
        .find(|c| c["name"] == "extender")
        .expect("extender sidecar");
    let args = container_args(ext);
    assert!(args.contains(&"--tls-client-ca=/etc/railguard/extender-tls/ca.crt".to_string()));
    assert!(
        args.contains(&"--listen=127.0.0.1:8888".to_string())
            && args.contains(&"--metrics-listen=0.0.0.0:9090".to_string()),
        "{args:?}"
    );
    assert!(docs.iter().all(|d| !(d.name() == "railguard-extender"
        && (d.kind() == "Service" || d.kind() == "Deployment"))));
    let binding = find(&docs, "ClusterRoleBinding", "railguard-extender");
    assert!(binding["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == "railguard-scheduler"));
    // kube-scheduler 1.20 ignores FailedAndUnresolvableNodes: `auto` reports them as failed.
    assert!(
        args.contains(&"--report-unresolvable-as-failed".to_string()),
        "{args:?}"
    );

    // A newer cluster gets the matching configuration version and PDB API.
    let mut newer = kube_1_20_api_versions();
    newer.extend([
        "policy/v1".to_string(),
        "policy/v1/PodDisruptionBudget".into(),
        "batch/v1/CronJob".into(),
    ]);
    let docs = render_with(&DEFAULT, &newer, "v1.29.3").unwrap();
    let cm = find(&docs, "ConfigMap", "railguard-scheduler");
    let config: Json =
        serde_yaml_ng::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(config["apiVersion"], "kubescheduler.config.k8s.io/v1");
    assert_eq!(
        find(&docs, "PodDisruptionBudget", "railguard-webhook")["apiVersion"],
        "policy/v1"
    );
    assert!(all(&docs, "CronJob")
        .iter()
        .all(|c| c["apiVersion"] == "batch/v1"));
    let sched = find(&docs, "Deployment", "railguard-scheduler");
    let ext = sched["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "extender")
        .expect("extender sidecar");
    let args = container_args(ext);
    assert!(
        !args.contains(&"--report-unresolvable-as-failed".to_string()),
        "a 1.29 scheduler reads FailedAndUnresolvableNodes: {args:?}"
    );
}

#[test]
fn cert_manager_mode_and_config_only_scheduler() {
    let docs = render(&CERT_MANAGER_CONFIG_ONLY);
    let mwc = find(
        &docs,
        "MutatingWebhookConfiguration",
        "rg-railguard-webhook",
    );
    assert_eq!(
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "railguard-cm/rg-railguard-webhook"
    );
    assert_eq!(mwc["webhooks"][0]["failurePolicy"], "Fail");
    let cert = find(&docs, "Certificate", "rg-railguard-webhook");
    assert_eq!(cert["spec"]["secretName"], "rg-railguard-webhook-tls");
    assert_eq!(
        strs(&cert["spec"]["dnsNames"])[0],
        "rg-railguard-webhook.railguard-cm.svc"
    );
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({"name": "rg-railguard-webhook-ca", "kind": "Issuer"})
    );
    assert_eq!(
        find(&docs, "Certificate", "rg-railguard-webhook-ca")["spec"]["isCA"],
        true
    );
    assert!(
        find(&docs, "Issuer", "rg-railguard-webhook-selfsigned")["spec"]["selfSigned"].is_object()
    );
    // The Secret is cert-manager's; the webhook mounts it and has no certificate RBAC.
    assert!(!docs
        .iter()
        .any(|d| d.kind() == "Secret" && d.name() == "rg-railguard-webhook-tls"));
    assert!(!docs
        .iter()
        .any(|d| d.kind() == "Role" && d.name() == "rg-railguard-webhook-certs"));
    let webhook_role = find(&docs, "ClusterRole", "rg-railguard-webhook");
    assert!(rule_for(
        webhook_role,
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations"
    )
    .is_none());
    let dep = find(&docs, "Deployment", "rg-railguard-webhook");
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        "rg-railguard-webhook-tls"
    );
    assert!(!container_args(&pod["containers"][0])
        .iter()
        .any(|a| a.starts_with("--self-signed-secret")));

    // Config only: the extenders stanza for the main scheduler, no second scheduler.
    let cm = find(&docs, "ConfigMap", "rg-railguard-scheduler");
    let ext: Json =
        serde_yaml_ng::from_str(cm["data"]["extenders.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(ext[0]["urlPrefix"], "http://10.96.0.50:8888");
    assert_eq!(ext[0]["ignorable"], false);
    assert!(cm["data"].get("config.yaml").is_none());
    assert!(!docs
        .iter()
        .any(|d| d.kind() == "Deployment" && d.name() == "rg-railguard-scheduler"));
    assert!(!docs
        .iter()
        .any(|d| d.obj["subjects"][0]["name"] == "rg-railguard-scheduler"));

    // An existing issuer replaces the generated chain.
    let docs = render(&CERT_MANAGER_ISSUER);
    assert!(all(&docs, "Issuer").is_empty());
    assert_eq!(
        find(&docs, "Certificate", "rg-railguard-webhook")["spec"]["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer"})
    );
}

#[test]
fn roce_set_with_custom_namespaces_uses_the_profile_for_rdma_and_shm() {
    let docs = render(&ROCE);
    let profiles: Vec<&str> = all(&docs, "FabricProfile")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(profiles, ["roce-cloud"]);
    let w = &find(
        &docs,
        "MutatingWebhookConfiguration",
        "fabric-railguard-webhook",
    )["webhooks"][0];
    assert_eq!(w["failurePolicy"], "Ignore");
    assert_eq!(
        strs(&w["namespaceSelector"]["matchExpressions"][0]["values"]),
        ["kube-system", "gpu-infra", "monitoring", "gpu-operator"]
    );
    assert_eq!(
        w["objectSelector"]["matchExpressions"][0]["operator"],
        "DoesNotExist"
    );
    let dep = find(&docs, "Deployment", "fabric-railguard-webhook");
    let args = container_args(&dep["spec"]["template"]["spec"]["containers"][0]);
    assert!(args.contains(&"--failure-mode=closed".to_string()));
    assert!(args.contains(
        &"--excluded-namespaces=kube-system,gpu-infra,monitoring,gpu-operator".to_string()
    ));

    // One DaemonSet, for the RoCE pool: the profile's selector, RDMA resource and shm size.
    let ds = all(&docs, "DaemonSet");
    // The prober runs on nodes railguard tainted (it renews what lifts the taint), with the
    // values' tolerations after it.
    for d in &ds {
        let tolerations = &d["spec"]["template"]["spec"]["tolerations"];
        assert_eq!(
            tolerations[0],
            json!({"key": railguard_api::keys::TAINT_FABRIC_UNHEALTHY, "operator": "Exists", "effect": "NoSchedule"}),
            "{tolerations}"
        );
        assert_eq!(tolerations[1]["key"], "nvidia.com/gpu", "{tolerations}");
    }
    assert_eq!(ds.len(), 1);
    let pod = &ds[0]["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"],
        json!({"node.kubernetes.io/instance-type": "gpu-8x-roce", "nvidia.com/gpu.present": "true"})
    );
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(pod["runtimeClassName"], "nvidia");
    let daemon = &pod["containers"][0];
    assert_eq!(container_args(daemon), ["daemon", "--node", "$(NODE_NAME)"]);
    // A PerGpu profile: one VF per rail, so every rail can be tested.
    assert_eq!(daemon["resources"]["limits"]["nvidia.com/sriov_rdma"], "8");
    assert_eq!(
        daemon["resources"]["requests"]["nvidia.com/sriov_rdma"],
        "8"
    );
    assert_eq!(
        daemon["securityContext"]["capabilities"],
        json!({"drop": ["ALL"], "add": ["IPC_LOCK"]})
    );
    assert_eq!(
        daemon["env"][0],
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    );
    let sys = daemon["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "host-sys")
        .unwrap();
    assert_eq!(sys["readOnly"], true);
    let vol = |name: &str| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(vol("host-sys")["hostPath"]["path"], "/sys");
    assert_eq!(
        vol("dshm")["emptyDir"],
        json!({"medium": "Memory", "sizeLimit": "64Gi"})
    );
    let peer = &pod["containers"][1];
    assert_eq!(
        container_args(peer),
        [
            "peer-endpoint",
            "--node",
            "$(NODE_NAME)",
            "--profile",
            "roce-cloud"
        ]
    );
    assert_eq!(peer["ports"][0]["hostPort"], 7470);

    // The given token is used; campaign Role for MPIJobs sits in the NCCL namespace.
    let token = find(&docs, "Secret", "fabric-railguard-peer-token");
    assert_eq!(
        token["data"]["token"],
        json!(b64(b"a-given-token-of-sufficient-length"))
    );
    assert_eq!(
        find(&docs, "Role", "fabric-railguard-campaign-mpijobs")["metadata"]["namespace"],
        "nccl-tests"
    );
    let cron = find(&docs, "CronJob", "fabric-railguard-campaign-roce-cloud");
    assert_eq!(
        cron["apiVersion"], "batch/v1beta1",
        "1.20 has CronJob only in v1beta1"
    );
    let c = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container_args(c), ["campaign", "--profile", "roce-cloud"]);
    let env: BTreeMap<String, Json> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect();
    assert_eq!(
        env["RAILGUARD_LEASE_NAME"]["value"],
        "fabric-railguard-campaign-roce-cloud"
    );
    assert_eq!(env["RAILGUARD_NCCL_NAMESPACE"]["value"], "nccl-tests");
    assert_eq!(
        env["RAILGUARD_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );

    // The custom scheduler name flows into the configuration and its lease RBAC.
    let cm = find(&docs, "ConfigMap", "fabric-railguard-scheduler");
    let config: Json =
        serde_yaml_ng::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(config["profiles"][0]["schedulerName"], "fabric-aware");
    assert_eq!(config["extenders"][0]["weight"], 10);
}

#[test]
fn chart_profiles_are_the_repository_fixtures() {
    let docs = render(&DEFAULT);
    let fixtures_dir = workspace_root().join("api/fixtures/profiles");
    let mut fixtures = BTreeMap::new();
    for f in std::fs::read_dir(&fixtures_dir).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for p in railguard_api::profiles_from_yaml(&text).unwrap() {
            fixtures.insert(p.metadata.name.clone().unwrap(), p);
        }
    }
    // Every example in values.yaml, enabled or not.
    let rendered = all(&render(&ALL_PROFILES), "FabricProfile")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(rendered.len(), 5);
    assert_eq!(
        rendered.len(),
        fixtures.len(),
        "one fixture per chart profile"
    );
    for obj in rendered {
        let p: railguard_api::FabricProfile = serde_json::from_value(obj).expect("a FabricProfile");
        let name = p.metadata.name.clone().unwrap();
        assert_eq!(
            p.spec, fixtures[&name].spec,
            "chart profile {name} differs from its fixture"
        );
        p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert_eq!(
        all(&docs, "FabricProfile").len(),
        2,
        "h100 and a100 enabled by default"
    );
    assert_eq!(
        all(&docs, "DaemonSet").len(),
        2,
        "one prober DaemonSet per enabled profile"
    );
}

#[test]
fn mpijob_template_is_the_probers_own() {
    let chart = std::fs::read_to_string(
        workspace_root().join("charts/railguard/files/mpijob-nccl-pair.yaml"),
    )
    .unwrap();
    let prober =
        std::fs::read_to_string(workspace_root().join("campaign/templates/mpijob-nccl-pair.yaml"))
            .unwrap();
    assert_eq!(
        chart, prober,
        "copy campaign/templates/mpijob-nccl-pair.yaml into the chart"
    );
    let docs = render(&DEFAULT);
    let cm = find(&docs, "ConfigMap", "railguard-campaign-mpijob");
    assert_eq!(
        cm["data"]["mpijob-nccl-pair.yaml"]
            .as_str()
            .unwrap()
            .trim_end(),
        prober.trim_end(),
        "placeholders pass through Helm untouched"
    );
}

/// The campaign's peer token is never generated by the chart: without `prober.peerToken`
/// (and nothing to keep, as under `helm template`) the Secret renders without data, and the
/// pods that read the token fill it themselves (`railguard-prober peer-token`, an init
/// container writing the token file into an in-memory volume); a given token renders as
/// given.
#[test]
fn peer_token_is_filled_by_the_pods_unless_given() {
    let docs = render(&DEFAULT);
    let secret = find(&docs, "Secret", "railguard-peer-token");
    assert!(secret.get("data").is_none(), "no token rendered: {secret}");
    let given = render(&ROCE);
    let secret = find(&given, "Secret", "fabric-railguard-peer-token");
    assert_eq!(
        secret["data"]["token"],
        b64(b"a-given-token-of-sufficient-length")
    );
    // Every pod that reads the token runs the init container first, which writes it where
    // the containers read it (RAILGUARD_TOKEN_FILE), in memory.
    let mut readers = 0;
    for kind in ["DaemonSet", "CronJob"] {
        for obj in all(&docs, kind) {
            let pod = if kind == "CronJob" {
                &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            } else {
                &obj["spec"]["template"]["spec"]
            };
            let reads_token = pod["containers"].as_array().unwrap().iter().any(|c| {
                c["env"].as_array().into_iter().flatten().any(|e| {
                    e["name"] == "RAILGUARD_TOKEN_FILE" && e["value"] == "/etc/railguard/peer/token"
                })
            });
            if !reads_token {
                continue;
            }
            readers += 1;
            let name = obj["metadata"]["name"].as_str().unwrap();
            let init = pod["initContainers"]
                .as_array()
                .and_then(|i| i.iter().find(|c| c["name"] == "peer-token"))
                .unwrap_or_else(|| panic!("{name}: no peer-token init container"));
            assert_eq!(
                container_args(init)[..2],
                [
                    "peer-token".to_string(),
                    "--secret=railguard-peer-token".to_string()
                ],
                "{name}"
            );
            let volume = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "peer-token")
                .unwrap();
            assert_eq!(volume["emptyDir"]["medium"], "Memory", "{name}");
            assert!(volume.get("secret").is_none(), "{name}");
        }
    }
    assert!(readers >= 2, "the probers' peer endpoints and the campaign");
}

/// `helm template` twice with the same values gives byte-identical output, for every values
/// set: nothing random is rendered. The campaign's peer token and the extender's CA and
/// pairs are generated by the pods that use them (filled into the chart's empty Secrets),
/// never by the templates, so Argo CD-style rendering (no `lookup`) is stable too.
#[test]
fn helm_template_twice_is_byte_identical_for_every_values_set() {
    for set in ALL_SETS {
        let render = || {
            let out = helm()
                .template_output(set, &kube_1_20_api_versions(), KUBE_1_20_VERSION)
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                set.label,
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        let first = render();
        assert!(
            first == render(),
            "{}: helm template rendered different output twice",
            set.label
        );
        // Neither generated Secret carries data the templates made up.
        for doc in railguard_tests::helm::documents(&String::from_utf8(first).unwrap()).unwrap() {
            let obj = &doc.obj;
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            if obj["kind"] == "Secret"
                && (name.ends_with("-extender-tls") || name.ends_with("-peer-token"))
            {
                let keys: Vec<&String> = obj["data"]
                    .as_object()
                    .map(|d| d.keys().collect())
                    .unwrap_or_default();
                let given = name.ends_with("-peer-token") && set.values.contains("peerToken");
                assert_eq!(
                    keys,
                    if given { vec!["token"] } else { vec![] },
                    "{}: {name}",
                    set.label
                );
            }
        }
    }
}

/// The fleet controller: one Deployment for every profile (Recreate), its metrics Service,
/// the values that reach it, and the Grafana dashboard ConfigMap only when asked for.
#[test]
fn fleet_controller_runs_once_for_every_profile_and_ships_the_dashboard_on_request() {
    let env_of = |c: &Json| -> BTreeMap<String, String> {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                // A downward-API value as `fieldRef:<path>`.
                let value = match e["value"].as_str() {
                    Some(v) => v.to_string(),
                    None => format!(
                        "fieldRef:{}",
                        e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap()
                    ),
                };
                (e["name"].as_str().unwrap().to_string(), value)
            })
            .collect()
    };
    let docs = render(&DEFAULT);
    let deployment = find(&docs, "Deployment", "railguard-fleet");
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"], json!({"type": "Recreate"}));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "railguard-fleet");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(pod.get("nodeSelector").is_none() && pod.get("tolerations").is_none());
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert!(
        c["image"]
            .as_str()
            .unwrap()
            .starts_with("ghcr.io/railguard/railguard-prober:"),
        "{}",
        c["image"]
    );
    // No --profile: every valid profile, read from the cluster.
    assert_eq!(container_args(c), ["fleet", "--watch"]);
    assert_eq!(
        env_of(c),
        BTreeMap::from(
            [
                ("RAILGUARD_FLEET_INTERVAL_SECS", "60"),
                ("RAILGUARD_FLEET_SETTLE_SECS", "5"),
                // Device taints are opt-in (dra.deviceTaints), and there is no DRA on 1.20.
                ("RAILGUARD_DRA_TAINTS", "false"),
                // The probers' namespace, where their slot Leases are (orphaned runs).
                ("RAILGUARD_LEASE_NAMESPACE", "railguard"),
                ("RAILGUARD_METRICS_LISTEN", "0.0.0.0:9464"),
                ("RAILGUARD_LOG_FORMAT", "json"),
                // The leader-election Lease's namespace and this replica's identity.
                ("POD_NAMESPACE", "fieldRef:metadata.namespace"),
                ("POD_NAME", "fieldRef:metadata.name"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        )
    );
    assert_eq!(
        c["ports"],
        json!([{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}])
    );
    assert_health_probes_on_metrics_port(c);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    // The metrics Service selects the controller's pod, on the port the others use.
    let service = find(&docs, "Service", "railguard-fleet");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}])
    );
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v, "selector {k}");
    }
    assert_eq!(
        service["spec"]["selector"]["app.kubernetes.io/component"],
        "fleet"
    );
    assert!(
        !docs
            .iter()
            .any(|d| d.kind() == "ConfigMap" && d.name() == "railguard-fleet-dashboard"),
        "the dashboard is off by default"
    );

    // Tuned, on its own nodes, with the dashboard for Grafana's sidecar.
    let docs = render(&FLEET_DASHBOARD);
    let pod = &find(&docs, "Deployment", "railguard-fleet")["spec"]["template"]["spec"];
    let env = env_of(&pod["containers"][0]);
    assert_eq!(env["RAILGUARD_FLEET_INTERVAL_SECS"], "300");
    assert_eq!(env["RAILGUARD_FLEET_SETTLE_SECS"], "20");
    assert_eq!(env["RAILGUARD_METRICS_LISTEN"], "0.0.0.0:9465");
    assert_eq!(
        pod["nodeSelector"],
        json!({"node-role.kubernetes.io/infra": ""})
    );
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    let cm = find(&docs, "ConfigMap", "railguard-fleet-dashboard");
    assert_eq!(cm["metadata"]["namespace"], "railguard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["labels"]["team"], "fabric");
    assert_eq!(
        cm["metadata"]["labels"]["app.kubernetes.io/component"],
        "fleet"
    );
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "railguard");
    let file =
        std::fs::read_to_string(workspace_root().join("charts/railguard/files/grafana-fleet.json"))
            .unwrap();
    let shipped = cm["data"]["railguard-fleet.json"].as_str().unwrap();
    assert_eq!(shipped.trim_end(), file.trim_end(), "the file, verbatim");
    let dashboard: Json = serde_json::from_str(shipped).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "railguard-fleet");

    // Another namespace for the ConfigMap (where the sidecar looks), another sidecar label
    // instead of the default one (null drops it); nothing with the prober off.
    let elsewhere = ValuesSet {
        label: "dashboard in monitoring",
        values: "prober:\n  fleet:\n    dashboard:\n      enabled: true\n      namespace: monitoring\n      labels: {grafana_dashboard: null, dashboards: fleet}\n",
        ..DEFAULT
    };
    let docs = render(&elsewhere);
    let cm = find(&docs, "ConfigMap", "railguard-fleet-dashboard");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["dashboards"], "fleet");
    assert!(cm["metadata"]["labels"].get("grafana_dashboard").is_none());
    for values in [
        "prober:\n  fleet:\n    enabled: false\n    dashboard: {enabled: true}\n",
        "prober:\n  enabled: false\n",
    ] {
        let docs = render(&ValuesSet {
            label: values,
            values,
            ..DEFAULT
        });
        let left: Vec<String> = docs
            .iter()
            .filter(|d| d.name().starts_with("railguard-fleet"))
            .map(|d| format!("{}/{}", d.kind(), d.name()))
            .collect();
        assert!(left.is_empty(), "{values}: {left:?}");
    }
}

/// The pod spec of a workload, if it has one.
fn workload_pod(obj: &Json) -> Option<&Json> {
    let spec = match obj["kind"].as_str()? {
        "Deployment" | "DaemonSet" => &obj["spec"]["template"]["spec"],
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => return None,
    };
    spec.is_object().then_some(spec)
}

/// `logFormat` reaches every railguard container: webhook and extender (Deployment or the
/// scheduler's sidecar) as `--log-format`, prober DaemonSets and campaign CronJobs as
/// `RAILGUARD_LOG_FORMAT`; the old per-component keys are gone.
#[test]
fn one_log_format_for_every_railguard_container() {
    let text = ValuesSet {
        label: "logFormat text, extender Deployment",
        values: "logFormat: text\nextender:\n  placement: deployment\n",
        ..DEFAULT
    };
    for (set, want) in [
        (&DEFAULT, "json"),
        (&CERT_MANAGER_CONFIG_ONLY, "json"),
        (&text, "text"),
    ] {
        let docs = render(set);
        let mut seen = BTreeMap::new();
        for d in &docs {
            let Some(pod) = workload_pod(&d.obj) else {
                continue;
            };
            for c in pod["containers"].as_array().into_iter().flatten() {
                let image = c["image"].as_str().unwrap_or_default();
                let name = format!(
                    "{}/{} {}",
                    d.kind(),
                    d.name(),
                    c["name"].as_str().unwrap_or_default()
                );
                let format = if image.contains("railguard-webhook")
                    || image.contains("railguard-extender")
                {
                    let args = container_args(c);
                    let flags: Vec<&String> =
                        args.iter().filter(|a| a.starts_with("--log-")).collect();
                    assert_eq!(flags.len(), 1, "{}: {name}: {args:?}", set.label);
                    flags[0].strip_prefix("--log-format=").map(str::to_string)
                } else if image.contains("railguard-prober") {
                    c["env"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|e| e["name"] == "RAILGUARD_LOG_FORMAT")
                        .and_then(|e| e["value"].as_str())
                        .map(str::to_string)
                } else {
                    continue;
                };
                assert_eq!(format.as_deref(), Some(want), "{}: {name}", set.label);
                *seen
                    .entry(
                        image
                            .rsplit('/')
                            .next()
                            .unwrap_or_default()
                            .split(':')
                            .next()
                            .unwrap_or_default()
                            .to_string(),
                    )
                    .or_insert(0) += 1;
            }
        }
        for component in [
            "railguard-webhook",
            "railguard-extender",
            "railguard-prober",
        ] {
            assert!(
                seen.contains_key(component),
                "{}: no {component} container: {seen:?}",
                set.label
            );
        }
        // Two DaemonSet containers per enabled profile and one CronJob per profile.
        assert!(seen["railguard-prober"] >= 3, "{}: {seen:?}", set.label);
    }
}

#[test]
fn bad_values_are_rejected_by_the_schema_with_the_path() {
    // Helm validates the values against values.schema.json before rendering (so does
    // `helm lint`): its message names the path as a JSON pointer with what is wrong there,
    // or the additional property.
    let cases = [
        (
            "webhook:\n  failurePolicy: Sometimes\n",
            "at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'",
        ),
        (
            "webhok:\n  replicas: 2\n",
            "additional properties 'webhok' not allowed",
        ),
        (
            "webhook:\n  certificates:\n    mode: vault\n",
            "at '/webhook/certificates/mode': value must be one of 'selfManaged', 'certManager'",
        ),
        (
            "scheduler:\n  mode: both\n",
            "at '/scheduler/mode': value must be one of 'secondary', 'configOnly', 'none'",
        ),
        (
            "prober:\n  peerToken: short\n",
            "at '/prober/peerToken': minLength: got 5, want 16",
        ),
        (
            "extender:\n  port: 70000\n",
            "at '/extender/port': maximum: got 70,000, want 65,535",
        ),
        (
            "fabricProfiles:\n  empty: {enabled: true, spec: {rails: []}}\n",
            "at '/fabricProfiles/empty/spec/rails': minItems: got 0, want 1",
        ),
        (
            "logFormat: yaml\n",
            "at '/logFormat': value must be one of 'text', 'json'",
        ),
        // Replaced by the top-level logFormat.
        (
            "webhook:\n  logJson: true\n",
            "additional properties 'logJson' not allowed",
        ),
        (
            "extender:\n  logFormat: json\n",
            "additional properties 'logFormat' not allowed",
        ),
        (
            "prober:\n  fleet:\n    intervalSeconds: 0\n",
            "at '/prober/fleet/intervalSeconds': minimum: got 0, want 1",
        ),
        (
            "prober:\n  fleet:\n    dashboard:\n      label: {grafana_dashboard: \"1\"}\n",
            "additional properties 'label' not allowed",
        ),
        // `null` deletes a key only where the defaults set it (Helm's coalescing); elsewhere
        // it stays and the schema refuses it, so a profile without spec is caught too.
        (
            "fabricProfiles:\n  custom: {enabled: true, spec: null}\n",
            "at '/fabricProfiles/custom/spec': got null, want object",
        ),
    ];
    for (values, says) in cases {
        let set = ValuesSet { values, ..DEFAULT };
        let (rendered, stderr) = template_1_20(&set);
        assert!(
            !rendered
                && stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(says),
            "{values}: helm template: {stderr} lacks {says}"
        );
        let lint = helm().lint(&set, KUBE_1_20_VERSION).unwrap();
        assert!(!lint.status.success(), "{values}: helm lint passes");
    }
}

/// Pod Security split (`prober.namespace`): everything that runs privileged — the prober
/// DaemonSets, their ServiceAccount, RBAC and metrics Service, the campaign CronJobs, their
/// account, Leases and MPIJob Role, the peer-token Secret and its Role — and the webhook's
/// Role to watch the prober pods are in the prober namespace; everything else namespaced
/// stays in the release namespace; every reference across them names the right one; the
/// webhook excludes and guards by the prober namespace. Unset, nothing moves.
#[test]
fn the_probers_move_to_their_own_privileged_namespace_and_everything_else_stays() {
    let probers = SPLIT_PROBER_NAMESPACE;
    let release_ns = POD_SECURITY_SPLIT.namespace;
    for set in [&POD_SECURITY_SPLIT, &POD_SECURITY_SPLIT_EXISTING] {
        let docs = render(set);
        let label = set.label;
        // The Namespace, only when the chart creates it, with the privileged level.
        let namespaces = all(&docs, "Namespace");
        if set.label == POD_SECURITY_SPLIT.label {
            assert_eq!(namespaces.len(), 1, "{label}");
            let ns = namespaces[0];
            assert_eq!(ns["metadata"]["name"], probers);
            let labels = &ns["metadata"]["labels"];
            for mode in ["enforce", "audit", "warn"] {
                assert_eq!(
                    labels[format!("pod-security.kubernetes.io/{mode}")],
                    "privileged",
                    "{label}: {mode}"
                );
            }
            assert_eq!(labels["kubernetes.io/metadata.name"], probers);
            assert_eq!(labels["app.kubernetes.io/instance"], set.release);
        } else {
            assert!(namespaces.is_empty(), "{label}: {namespaces:?}");
        }
        // Where every namespaced object is.
        let mut moved = BTreeSet::new();
        for d in &docs {
            let Some(ns) = d.obj["metadata"]["namespace"].as_str() else {
                continue;
            };
            let component = d.obj["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap_or_default();
            // The node guard's and the fleet controller's reads of the probers' namespace
            // (the probers' pods, their slot Leases) are Roles there.
            let privileged = matches!(component, "prober" | "campaign")
                || (d.kind().starts_with("Role")
                    && (d.name().ends_with("-webhook-node-guard")
                        || d.name().ends_with("-fleet-invasive-slots")));
            if d.kind() == "RoleBinding" && ns == "kube-system" {
                continue; // the scheduler's extension-apiserver-authentication-reader
            }
            let want = if privileged { probers } else { release_ns };
            assert_eq!(
                ns,
                want,
                "{label}: {}/{} from {}",
                d.kind(),
                d.name(),
                d.source
            );
            if privileged {
                moved.insert(format!("{}/{}", d.kind(), d.name()));
            }
        }
        for want in [
            "DaemonSet/rg-railguard-prober-h100-ndr",
            "DaemonSet/rg-railguard-prober-a100-hdr",
            "ServiceAccount/rg-railguard-prober",
            "Service/rg-railguard-prober-metrics",
            "Role/rg-railguard-prober-invasive-slots",
            "RoleBinding/rg-railguard-prober-invasive-slots",
            "Secret/rg-railguard-peer-token",
            "Role/rg-railguard-peer-token",
            "RoleBinding/rg-railguard-peer-token",
            "CronJob/rg-railguard-campaign-h100-ndr",
            "ServiceAccount/rg-railguard-campaign",
            "ConfigMap/rg-railguard-campaign-mpijob",
            "Role/rg-railguard-campaign-lease",
            "Role/rg-railguard-campaign-mpijobs",
            "Role/rg-railguard-webhook-node-guard",
            "RoleBinding/rg-railguard-webhook-node-guard",
        ] {
            assert!(
                moved.contains(want),
                "{label}: {want} not in {probers}: {moved:?}"
            );
        }
        // Bindings name each account in its own namespace.
        let subject_ns = |kind: &str, name: &str| -> BTreeMap<String, String> {
            find(&docs, kind, name)["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    (
                        s["name"].as_str().unwrap().to_string(),
                        s["namespace"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        for (kind, name) in [
            ("ClusterRoleBinding", "rg-railguard-prober"),
            ("ClusterRoleBinding", "rg-railguard-campaign"),
            ("RoleBinding", "rg-railguard-peer-token"),
            ("RoleBinding", "rg-railguard-campaign-lease"),
        ] {
            assert!(
                subject_ns(kind, name).values().all(|ns| ns == probers),
                "{label}: {kind}/{name}"
            );
        }
        assert_eq!(
            subject_ns("RoleBinding", "rg-railguard-webhook-node-guard"),
            BTreeMap::from([("rg-railguard-webhook".to_string(), release_ns.to_string())])
        );
        assert_eq!(
            subject_ns("ClusterRoleBinding", "rg-railguard-fleet"),
            BTreeMap::from([("rg-railguard-fleet".to_string(), release_ns.to_string())])
        );
        // The pods' own references: the token Secret's namespace, the coordinator's and the
        // endpoints' accounts, the campaign's Leases and MPIJobs.
        let env_value = |c: &Json, name: &str| -> Option<String> {
            c["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"]
                .as_str()
                .map(str::to_string)
        };
        let ds = find(&docs, "DaemonSet", "rg-railguard-prober-h100-ndr");
        let pod = &ds["spec"]["template"]["spec"];
        assert!(
            container_args(&pod["initContainers"][0]).contains(&format!("--namespace={probers}")),
            "{label}"
        );
        let endpoint = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "peer-endpoint")
            .unwrap();
        assert_eq!(
            env_value(endpoint, "RAILGUARD_COORDINATOR_SERVICE_ACCOUNT").as_deref(),
            Some(format!("{probers}/rg-railguard-campaign").as_str()),
            "{label}"
        );
        let cron = find(&docs, "CronJob", "rg-railguard-campaign-h100-ndr");
        let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert!(
            container_args(&pod["initContainers"][0]).contains(&format!("--namespace={probers}"))
        );
        let campaign = &pod["containers"][0];
        for (var, want) in [
            ("RAILGUARD_LEASE_NAMESPACE", probers.to_string()),
            ("RAILGUARD_NCCL_NAMESPACE", probers.to_string()),
            (
                "RAILGUARD_COORDINATOR_SERVICE_ACCOUNT",
                format!("{probers}/rg-railguard-campaign"),
            ),
            (
                "RAILGUARD_ENDPOINT_SERVICE_ACCOUNT",
                format!("{probers}/rg-railguard-prober"),
            ),
        ] {
            assert_eq!(env_value(campaign, var), Some(want), "{label}: {var}");
        }
        // The webhook: never mutates there, and knows the probers by that namespace.
        let webhook = find(&docs, "Deployment", "rg-railguard-webhook");
        let args = container_args(&webhook["spec"]["template"]["spec"]["containers"][0]);
        for want in [
            format!("--excluded-namespaces=kube-system,{release_ns},{probers}"),
            format!("--namespace={release_ns}"),
            format!("--node-guard-prober-namespace={probers}"),
            "--node-guard-prober-service-account=rg-railguard-prober".to_string(),
            "--node-guard-campaign-service-account=rg-railguard-campaign".to_string(),
        ] {
            assert!(
                args.contains(&want),
                "{label}: webhook args lack {want}: {args:?}"
            );
        }
        let mwc = find(
            &docs,
            "MutatingWebhookConfiguration",
            "rg-railguard-webhook",
        );
        for w in mwc["webhooks"].as_array().unwrap() {
            let not_in = &w["namespaceSelector"]["matchExpressions"][0];
            assert_eq!(not_in["key"], "kubernetes.io/metadata.name");
            assert_eq!(
                strs(&not_in["values"]),
                ["kube-system", release_ns, probers],
                "{label}"
            );
        }
        // What stays is what meets `restricted`: every pod in the release namespace runs as
        // non-root under RuntimeDefault, drops every capability and adds none, never
        // escalates, and mounts no host path (the API server's own Pod Security admission
        // judges the same pods in tests/pod_security_e2e.rs).
        for d in &docs {
            let Some(pod) = workload_pod(&d.obj) else {
                continue;
            };
            if d.obj["metadata"]["namespace"] != release_ns {
                continue;
            }
            let what = format!("{label}: {}/{}", d.kind(), d.name());
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{what}"
            );
            assert!(pod.get("hostNetwork").is_none_or(|h| h == false), "{what}");
            for v in pod["volumes"].as_array().into_iter().flatten() {
                assert!(v.get("hostPath").is_none(), "{what}: {v}");
            }
            for c in pod["containers"]
                .as_array()
                .into_iter()
                .chain(pod["initContainers"].as_array())
                .flatten()
            {
                let sc = &c["securityContext"];
                assert_eq!(
                    sc["allowPrivilegeEscalation"], false,
                    "{what}: {}",
                    c["name"]
                );
                assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
                assert!(sc["capabilities"].get("add").is_none(), "{what}");
                for port in c["ports"].as_array().into_iter().flatten() {
                    assert!(port.get("hostPort").is_none(), "{what}: {port}");
                }
            }
        }
    }

    // The probers' ServiceMonitor goes with their metrics Service.
    let monitored = ValuesSet {
        label: "split with ServiceMonitors",
        values: "prober:\n  namespace: {name: railguard-probers}\nmonitoring:\n  serviceMonitors: {enabled: true}\n",
        ..POD_SECURITY_SPLIT
    };
    let docs = render(&monitored);
    for sm in all(&docs, "ServiceMonitor") {
        let component = sm["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap();
        let want = if component == "prober" {
            probers
        } else {
            release_ns
        };
        assert_eq!(sm["metadata"]["namespace"], want, "{component}");
        assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], json!([want]));
    }
    // The extender is the scheduler's sidecar here: its PodMonitor stays with the scheduler.
    assert_eq!(all(&docs, "ServiceMonitor").len(), 3);
    assert_eq!(
        find(&docs, "PodMonitor", "rg-railguard-extender")["metadata"]["namespace"],
        release_ns
    );

    // Unset: one namespace, as before (the flag names it), and no Namespace object.
    let docs = render(&DEFAULT);
    assert!(all(&docs, "Namespace").is_empty());
    for d in &docs {
        if let Some(ns) = d.obj["metadata"]["namespace"].as_str() {
            assert!(
                ns == "railguard" || ns == "kube-system",
                "{}/{}",
                d.kind(),
                d.name()
            );
        }
    }
    let args = container_args(
        &find(&docs, "Deployment", "railguard-webhook")["spec"]["template"]["spec"]["containers"]
            [0],
    );
    assert!(args.contains(&"--node-guard-prober-namespace=railguard".to_string()));

    // create needs a name, and not the release namespace (Helm does not create that one).
    for (values, says) in [
        (
            "prober:\n  namespace: {create: true}\n",
            "prober.namespace.create needs prober.namespace.name",
        ),
        (
            "prober:\n  namespace: {name: railguard, create: true}\n",
            "prober.namespace.name \"railguard\" is the release namespace",
        ),
        (
            "prober:\n  namespace: {name: Probers}\n",
            "at '/prober/namespace/name': 'Probers' does not match pattern",
        ),
    ] {
        let (rendered, stderr) = template_1_20(&ValuesSet { values, ..DEFAULT });
        assert!(
            !rendered && stderr.contains(says),
            "{values}: helm template: {stderr} lacks {says}"
        );
    }
}

// ---------------------------------------------------------------- against the API server

/// Minimal cert-manager CRDs (no schema: cert-manager is not installed here), so the
/// Issuer/Certificate objects can be dry-run; their fields are asserted structurally above.
fn cert_manager_crds() -> Vec<Json> {
    ["Issuer", "Certificate"]
        .iter()
        .map(|kind| {
            let plural = format!("{}s", kind.to_lowercase());
            json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": { "name": format!("{plural}.cert-manager.io") },
                "spec": {
                    "group": "cert-manager.io", "scope": "Namespaced",
                    "names": { "kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List") },
                    "versions": [{ "name": "v1", "served": true, "storage": true,
                        "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } } }]
                }
            })
        })
        .collect()
}

fn manifest_file(dir: &std::path::Path, label: &str, docs: &[Doc]) -> PathBuf {
    let path = dir.join(format!(
        "{}.yaml",
        label.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    ));
    let text: String = docs
        .iter()
        .map(|d| {
            format!(
                "---\n# Source: {}\n{}",
                d.source,
                serde_yaml_ng::to_string(&d.obj).unwrap()
            )
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn kubectl_dry_run(cp: &ControlPlane, file: &std::path::Path) -> std::process::Output {
    helm().kubectl_dry_run(cp.kubeconfig_path(), file).unwrap()
}

/// Dry-runs every object through the kube client; returns the failures.
async fn client_dry_run(client: &kube::Client, discovery: &Discovery, docs: &[Doc]) -> Vec<String> {
    let mut failures = Vec::new();
    for d in docs {
        let obj: DynamicObject = serde_json::from_value(d.obj.clone()).expect("object");
        let tm = obj.types.clone().expect("apiVersion and kind");
        let Some((ar, caps)) = discovery.resolve_typemeta(&tm) else {
            failures.push(format!(
                "{}/{}: the server has no {} {}",
                d.kind(),
                d.name(),
                tm.api_version,
                tm.kind
            ));
            continue;
        };
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or("default"),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let pp = PostParams {
            dry_run: true,
            field_manager: Some("railguard-chart-test".into()),
        };
        let result = match api.create(&pp, &obj).await {
            // What the test created for real beforehand (a Namespace the chart creates, a
            // hook Pod's ServiceAccount: see `create_what_pods_need`) is applied instead,
            // which validates it the same way.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let pp = PatchParams::apply("railguard-chart-test").dry_run();
                api.patch(obj.name_any().as_str(), &pp, &Patch::Apply(&obj))
                    .await
            }
            other => other,
        };
        if let Err(e) = result {
            failures.push(format!("{}/{} from {}: {e}", d.kind(), d.name(), d.source));
        }
    }
    failures
}

/// Creates for real what a Pod of `docs` needs before the API server admits it and that a
/// dry run of the rest cannot provide (it creates nothing): the ServiceAccount of each bare
/// Pod (the `helm test` hook, which Helm creates after the release's objects exist;
/// ServiceAccount admission refuses a Pod whose account is missing), from the chart's own
/// object; on 1.20, whose ServiceAccount admission mounts a legacy token Secret and no
/// token controller runs here, that account's token Secret too. The namespaces exist already.
async fn create_what_pods_need(client: &kube::Client, version: KubeVersion, docs: &[Doc]) {
    for pod in docs.iter().filter(|d| d.kind() == "Pod") {
        let ns = pod.obj["metadata"]["namespace"].as_str().unwrap();
        let Some(sa) = pod.obj["spec"]["serviceAccountName"].as_str() else {
            continue;
        };
        let account = docs
            .iter()
            .find(|d| {
                d.kind() == "ServiceAccount"
                    && d.name() == sa
                    && d.obj["metadata"]["namespace"] == ns
            })
            .unwrap_or_else(|| panic!("Pod {} runs as {sa}, which the chart lacks", pod.name()));
        let api: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), ns);
        match api
            .create(
                &PostParams::default(),
                &serde_json::from_value(account.obj.clone()).unwrap(),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("ServiceAccount {ns}/{sa}: {e}"),
        }
        railguard_tests::give_legacy_token(client, version, ns, sa)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rendered_object_passes_a_server_side_dry_run() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd()
        .await
        .expect("FabricProfile CRD");
    let client = cp.client();
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>(&()),
    );
    for crd in cert_manager_crds() {
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .expect("cert-manager CRD");
    }
    for ns in [
        "railguard",
        "railguard-cm",
        "gpu-infra",
        "nccl-tests",
        POD_SECURITY_SPLIT.namespace,
        SPLIT_PROBER_NAMESPACE,
    ] {
        cp.create_namespace(ns, &labels(&[]))
            .await
            .expect("namespace");
    }
    // Helm's Capabilities are the server's own (group/versions and kinds).
    let api_versions = railguard_tests::chart_values::server_api_versions(&client)
        .await
        .expect("discovery");
    let version = cp.kube_version();
    // The server's own version, as `helm install` would take it (not a constant: a 1.37
    // pass renders for 1.37).
    let kube_version = client.apiserver_version().await.unwrap().git_version;
    assert!(
        kube_version.starts_with(&format!("v{}.", version.as_str())),
        "{kube_version} on the {version} pass"
    );
    let kube_version = kube_version.as_str();
    if version == KubeVersion::V1_20 {
        assert!(api_versions.contains(&"policy/v1beta1/PodDisruptionBudget".to_string()));
        assert!(
            !api_versions.contains(&"policy/v1".to_string()),
            "a 1.20 server"
        );
    } else {
        // The modern branches of the chart: policy/v1, batch/v1, scheduler config v1.
        assert!(api_versions.contains(&"policy/v1/PodDisruptionBudget".to_string()));
        assert!(!api_versions.contains(&"policy/v1beta1".to_string()));
    }
    let discovery = railguard_tests::eventually(
        std::time::Duration::from_secs(30),
        "CRDs in discovery",
        || async {
            let d = Discovery::new(cp.client()).run().await?;
            Ok(d.has_group("cert-manager.io").then_some(d))
        },
    )
    .await
    .expect("discovery");

    let dir = tempfile::tempdir().unwrap();
    for set in DRY_RUN_SETS {
        let docs = render_with(set, &api_versions, kube_version)
            .unwrap_or_else(|e| panic!("{}: {e:#}", set.label));
        assert!(docs.len() > 20, "{}: {} objects", set.label, docs.len());
        create_what_pods_need(&client, version, &docs).await;
        // kubectl dry-runs what Helm renders, verbatim.
        let manifest = helm().template(set, &api_versions, kube_version).unwrap();
        let objects = railguard_tests::helm::documents(&manifest).unwrap().len();
        let file = dir.path().join(format!("{}-helm.yaml", set.release));
        std::fs::write(&file, &manifest).unwrap();
        let out = kubectl_dry_run(&cp, &file);
        assert_server_dry_run(&out, objects, &format!("{}: ", set.label));
        let failures = client_dry_run(&client, &discovery, &docs).await;
        assert!(failures.is_empty(), "{}: {failures:#?}", set.label);
    }
    // Nothing was created by the dry runs.
    let webhooks: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<
            k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
        >(&()),
    );
    assert!(webhooks
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());

    // The dry run does reject what this server cannot serve: the chart rendered for the
    // other end of the supported range fails here.
    if version == KubeVersion::V1_20 {
        dry_run_rejects_a_newer_clusters_chart(
            &cp,
            &client,
            &discovery,
            &api_versions,
            kube_version,
            dir.path(),
        )
        .await;
    } else {
        let docs = render_with(&DEFAULT, &kube_1_20_api_versions(), KUBE_1_20_VERSION).unwrap();
        let failures = client_dry_run(&client, &discovery, &docs).await;
        assert!(
            failures
                .iter()
                .any(|f| f.contains("policy/v1beta1 PodDisruptionBudget")),
            "{failures:#?}"
        );
    }
    // kubectl validates against the server's schema: an unknown field fails.
    {
        let mut docs = render(&DEFAULT);
        let i = docs.iter().position(|d| d.kind() == "Deployment").unwrap();
        docs[i].obj["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]
            ["pathh"] = json!("/typo");
        let out = kubectl_dry_run(&cp, &manifest_file(dir.path(), "typo", &docs[i..=i]));
        assert!(!out.status.success(), "unknown field accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("pathh"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // And an invalid object is refused by the server, not just by our asserts.
    let mut docs = render(&DEFAULT);
    let i = docs
        .iter()
        .position(|d| d.kind() == "MutatingWebhookConfiguration")
        .unwrap();
    docs[i].obj["webhooks"][0]["sideEffects"] = json!("Sometimes");
    let failures = client_dry_run(&client, &discovery, &docs[i..=i]).await;
    assert!(
        failures.len() == 1 && failures[0].contains("sideEffects"),
        "{failures:#?}"
    );
}

#[test]
fn dockerfiles_build_the_binaries_the_chart_runs() {
    let root = workspace_root();
    let values: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root.join("charts/railguard/values.yaml")).unwrap(),
    )
    .unwrap();
    for (component, ports) in [
        ("webhook", vec!["webhook.port", "webhook.metricsPort"]),
        ("extender", vec!["extender.port", "extender.metricsPort"]),
        ("prober", vec!["prober.peerPort", "prober.metricsPort"]),
    ] {
        let bin = format!("railguard-{component}");
        // The binary is built by the component's shell crate, `railguard-COMPONENT-cli`.
        let shell = format!("railguard-{component}-cli");
        let text =
            std::fs::read_to_string(root.join(format!("docker/{component}.Dockerfile"))).unwrap();
        let cargo =
            std::fs::read_to_string(root.join(format!("{component}/cli/Cargo.toml"))).unwrap();
        assert!(
            cargo.contains(&format!("name = \"{shell}\""))
                && cargo.contains(&format!("name = \"{bin}\"")),
            "{component}/cli/Cargo.toml declares {shell} with the binary {bin}"
        );
        assert!(
            text.contains(&format!("-p {shell} --bin {bin}")),
            "{component}: builds {bin} from {shell}"
        );
        assert!(
            text.matches("\nFROM ").count() >= 2,
            "{component}: multi-stage"
        );
        assert!(
            text.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{bin}\"]")),
            "{component}: entrypoint"
        );
        let last_user = text.lines().rfind(|l| l.starts_with("USER ")).unwrap();
        assert_eq!(last_user, "USER 65532:65532", "{component}: non-root");
        let exposed: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("EXPOSE "))
            .flat_map(|l| l.split_whitespace())
            .collect();
        for key in ports {
            let (a, b) = key.split_once('.').unwrap();
            let port = values[a][b].as_u64().unwrap().to_string();
            assert!(
                exposed.contains(&port.as_str()),
                "{component}: EXPOSE {port} ({key})"
            );
        }
    }
    let prober = std::fs::read_to_string(root.join("docker/prober.Dockerfile")).unwrap();
    for needle in ["nccl-tests", "perftest", "NCCL_VERSION", "libibverbs1"] {
        assert!(
            prober.contains(needle),
            "prober Dockerfile documents {needle}"
        );
    }
}

/// The prober's view of its host: /sys and /proc read-only by default; ACS readable only
/// when asked (CAP_SYS_ADMIN on the daemon alone); a simulated node's tree instead of both
/// in the real-node values.
#[test]
fn prober_reads_host_sys_and_proc_and_capabilities_follow_the_values() {
    let env_of = |c: &Json| -> BTreeMap<String, String> {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_string(),
                    e["value"].as_str()?.to_string(),
                ))
            })
            .collect()
    };
    let mounts_of = |c: &Json| -> BTreeMap<String, Json> {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["mountPath"].as_str().unwrap().to_string(),
                    m["readOnly"].clone(),
                )
            })
            .collect()
    };
    let docs = render(&DEFAULT);
    let pod = &find(&docs, "DaemonSet", "railguard-prober-h100-ndr")["spec"]["template"]["spec"];
    let daemon = &pod["containers"][0];
    assert_eq!(env_of(daemon)["RAILGUARD_SYSFS_ROOT"], "/host");
    assert_eq!(env_of(daemon)["RAILGUARD_PROFILE"], "h100-ndr");
    // The daemon's own pod holds the rails' RDMA devices: named so it is not a job in use
    // (the kubelet expands the two downward-API variables before it).
    assert_eq!(
        env_of(daemon)["RAILGUARD_OWN_POD"],
        "$(POD_NAMESPACE)/$(POD_NAME)"
    );
    let m = mounts_of(daemon);
    assert_eq!(m["/host/sys"], true);
    assert_eq!(m["/host/proc"], true);
    let proc = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "host-proc")
        .unwrap();
    assert_eq!(proc["hostPath"]["path"], "/proc");
    assert_eq!(
        daemon["securityContext"]["capabilities"]["add"],
        json!(["IPC_LOCK"])
    );
    // A shared RDMA device: one is enough for every rail.
    assert_eq!(
        daemon["resources"]["limits"]["rdma/rdma_shared_device_a"],
        "1"
    );

    let docs = render(&PCI_CONFIG_SPACE);
    let pod = &find(&docs, "DaemonSet", "railguard-prober-h100-ndr")["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["add"],
        json!(["IPC_LOCK", "SYS_ADMIN"])
    );
    assert_eq!(
        pod["containers"][1]["securityContext"]["capabilities"]["add"],
        json!(["IPC_LOCK"])
    );

    let docs = render(&REAL_NODE);
    let pod = &find(&docs, "DaemonSet", "railguard-prober-h100-ndr")["spec"]["template"]["spec"];
    for c in pod["containers"].as_array().unwrap() {
        let env = env_of(c);
        assert_eq!(env["RAILGUARD_SIM_ROOT"], "/host", "{}", c["name"]);
        assert!(!env.contains_key("RAILGUARD_SYSFS_ROOT"), "{}", c["name"]);
        assert_eq!(
            mounts_of(c)["/host"],
            Json::Null,
            "read-write: the stand-in grows counters"
        );
    }
    let names: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        names.contains(&"sim-node")
            && !names.contains(&"host-sys")
            && !names.contains(&"host-proc"),
        "{names:?}"
    );
    assert!(pod.get("runtimeClassName").is_none());
}

/// On 1.20: the same chart rendered for a newer cluster (policy/v1 PDBs, batch/v1
/// CronJobs) fails the server-side dry run.
async fn dry_run_rejects_a_newer_clusters_chart(
    cp: &ControlPlane,
    client: &kube::Client,
    discovery: &Discovery,
    api_versions: &[String],
    kube_version: &str,
    dir: &std::path::Path,
) {
    let mut newer = api_versions.to_vec();
    newer.extend([
        "policy/v1".to_string(),
        "policy/v1/PodDisruptionBudget".into(),
        "batch/v1/CronJob".into(),
    ]);
    let docs = render_with(&DEFAULT, &newer, kube_version).unwrap();
    let failures = client_dry_run(client, discovery, &docs).await;
    assert!(
        failures
            .iter()
            .any(|f| f.contains("policy/v1 PodDisruptionBudget")),
        "{failures:#?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("batch/v1 CronJob")),
        "{failures:#?}"
    );
    {
        let out = kubectl_dry_run(cp, &manifest_file(dir, "newer", &docs));
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("PodDisruptionBudget") && stderr.contains("policy/v1"),
            "{stderr}"
        );
    }
}

/// The prober may take and renew exactly the invasive-slot Leases the binary names for each
/// rendered profile (`FabricProfile::all_invasive_slot_leases`), with the default cap and a
/// profile's own, and nothing else in the namespace.
#[test]
fn the_probers_lease_role_names_the_slots_the_binary_takes() {
    const OWN_CAP: ValuesSet = ValuesSet {
        label: "roce-cloud with maxConcurrentInvasive 2",
        values: "fabricProfiles:\n  roce-cloud:\n    enabled: true\n    spec:\n      certification:\n        maxConcurrentInvasive: 2\n",
        ..DEFAULT
    };
    // The default is a percentage: every Lease a profile's slots can resolve to.
    const ALL: usize = railguard_api::invasive::MAX_CONCURRENT_INVASIVE as usize;
    // ALL_PROFILES: h100-ndr, h200-ndr, b200-ndr, a100-hdr and roce-cloud.
    for (set, slots) in [(&ALL_PROFILES, 5 * ALL), (&OWN_CAP, 2 * ALL + 2)] {
        let docs = render(set);
        let mut wanted = BTreeSet::new();
        for obj in all(&docs, "FabricProfile") {
            let p: railguard_api::FabricProfile = serde_json::from_value(obj.clone()).unwrap();
            wanted.extend(p.all_invasive_slot_leases());
        }
        assert_eq!(wanted.len(), slots, "{}", set.label);
        let role = find(&docs, "Role", "railguard-prober-invasive-slots");
        let rules = role["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2, "{}", set.label);
        assert_eq!(rules[0]["verbs"], json!(["create"]));
        assert!(rules[0].get("resourceNames").is_none_or(Json::is_null));
        assert_eq!(rules[1]["verbs"], json!(["get", "update"]));
        let named: BTreeSet<String> = rules[1]["resourceNames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
        assert_eq!(named, wanted, "{}", set.label);
        let binding = find(&docs, "RoleBinding", "railguard-prober-invasive-slots");
        assert_eq!(
            binding["roleRef"]["name"],
            "railguard-prober-invasive-slots"
        );
        assert_eq!(binding["subjects"][0]["name"], "railguard-prober");
    }
}
