//! Monitoring as operators wire it (`monitoring.serviceMonitors`, `monitoring.prometheusRule`):
//!
//! - every container port named `metrics` the chart renders (webhook, extender beside the
//!   scheduler or as a Deployment, fleet controller, probers) is scraped by one of its
//!   ServiceMonitors (through a Service that selects the pod and names the port) or its
//!   PodMonitor; the probers' targets carry the `profile` and `node` labels the alerts group by;
//! - Prometheus's own `promtool` accepts the PrometheusRule (`check rules`) and its unit tests
//!   (`test rules`, synthetic series below) show each alert firing on a fault and silent on a
//!   healthy cluster; every alert links an anchor that exists in `docs/runbooks.md`, and reads
//!   only metrics the components export;
//! - a real kube-apiserver with the Prometheus Operator's own CRDs (fixtures, source in
//!   `tests/fixtures/prometheus-operator/SOURCE.md`) accepts every monitoring object and
//!   refuses a malformed one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{ApiResource, Discovery, Scope};
use railguard_tests::helm::{self, kube_1_20_api_versions, KUBE_1_20_VERSION};
use railguard_tests::{eventually, workspace_root, ApiServerOptions, ControlPlane, KubeVersion};
use serde_json::{json, Value};

const RELEASE: &str = "railguard";
const NAMESPACE: &str = "railguard";

const MONITORING_ON: &str = "monitoring: {serviceMonitors: {enabled: true, labels: {release: kube-prometheus-stack}}, prometheusRule: {enabled: true}}";

/// `helm template` of the chart for 1.20 with `values` (YAML, each a `-f` file, in order).
fn render_values(values: &[&str]) -> Vec<Value> {
    let out = helm::shared()
        .template_values_output(
            RELEASE,
            NAMESPACE,
            values,
            &kube_1_20_api_versions(),
            KUBE_1_20_VERSION,
        )
        .unwrap();
    helm::documents_of(out, RELEASE)
        .unwrap()
        .into_iter()
        .map(|d| d.obj)
        .collect()
}

/// The chart with monitoring on, then `extra`.
fn render(extra: &[&str]) -> Vec<Value> {
    render_values(&[&[MONITORING_ON], extra].concat())
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

/// Whether every `selector` entry is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// (workload/container, pod labels) of every container port named `metrics`.
fn metrics_ports(docs: &[Value]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for d in docs {
        if !matches!(d["kind"].as_str(), Some("Deployment" | "DaemonSet")) {
            continue;
        }
        let template = &d["spec"]["template"];
        for c in template["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let has_metrics = c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["name"] == "metrics");
            if has_metrics {
                out.push((
                    format!("{}/{}", name(d), c["name"].as_str().unwrap_or_default()),
                    template["metadata"]["labels"].clone(),
                ));
            }
        }
    }
    out
}

/// The pods' labels each monitor scrapes on their `metrics` port.
fn scraped(docs: &[Value], pod_labels: &Value) -> Vec<String> {
    let mut by = Vec::new();
    for sm in of_kind(docs, "ServiceMonitor") {
        assert_eq!(
            sm["spec"]["endpoints"][0]["port"],
            "metrics",
            "{}",
            name(sm)
        );
        assert_eq!(
            sm["metadata"]["labels"]["release"], "kube-prometheus-stack",
            "the labels a Prometheus selects monitors by"
        );
        let through = of_kind(docs, "Service").into_iter().any(|svc| {
            selects(
                &sm["spec"]["selector"]["matchLabels"],
                &svc["metadata"]["labels"],
            ) && selects(&svc["spec"]["selector"], pod_labels)
                && svc["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == "metrics" && p["targetPort"] == "metrics")
        });
        if through {
            by.push(format!("ServiceMonitor {}", name(sm)));
        }
    }
    for pm in of_kind(docs, "PodMonitor") {
        assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
        if selects(&pm["spec"]["selector"]["matchLabels"], pod_labels) {
            by.push(format!("PodMonitor {}", name(pm)));
        }
    }
    by
}

#[test]
fn every_metrics_port_is_scraped_once() {
    for (placement, values) in [
        ("sidecar (the default)", ""),
        ("Deployment", "extender: {placement: deployment}"),
    ] {
        let docs = render(&[values]);
        let ports = metrics_ports(&docs);
        let containers: BTreeSet<String> = ports.iter().map(|(c, _)| c.clone()).collect();
        assert!(
            ["webhook", "extender", "fleet", "prober"]
                .iter()
                .all(|c| containers.iter().any(|n| n.contains(c))),
            "{placement}: metrics ports {containers:?}"
        );
        for (container, labels) in &ports {
            let by = scraped(&docs, labels);
            assert_eq!(by.len(), 1, "{placement}: {container} scraped by {by:?}");
        }
    }
    // The probers' targets are one per node, labelled with the pod's profile and node.
    let docs = render(&[]);
    let prober = of_kind(&docs, "ServiceMonitor")
        .into_iter()
        .find(|s| s["metadata"]["labels"]["app.kubernetes.io/component"] == "prober")
        .expect("the probers' ServiceMonitor");
    let relabel: BTreeMap<String, String> = prober["spec"]["endpoints"][0]["relabelings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["targetLabel"].as_str().unwrap().to_string(),
                r["sourceLabels"][0].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        relabel,
        BTreeMap::from([
            (
                "profile".into(),
                "__meta_kubernetes_pod_label_railguard_io_profile".into()
            ),
            ("node".into(), "__meta_kubernetes_pod_node_name".into()),
        ])
    );
    // Off by default: the CRDs may not exist.
    let plain = render_values(&[]);
    assert!(plain.iter().all(|d| {
        d.get("apiVersion")
            .and_then(|v| v.as_str())
            .is_none_or(|v| !v.starts_with("monitoring.coreos.com"))
    }));
}

/// The rule groups of the rendered PrometheusRule, as a Prometheus rule file.
fn rule_file(docs: &[Value]) -> Value {
    let rules = of_kind(docs, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    json!({"groups": rules[0]["spec"]["groups"]})
}

fn promtool(args: &[&str], dir: &std::path::Path) -> String {
    // tests/scripts/install-deps.sh installs Debian's prometheus package for promtool.
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool (Debian package prometheus) runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// Synthetic series for `promtool test rules`: each alert fires on its fault and a healthy
/// cluster (profile a100, node n1, the second webhook pod) fires nothing.
const RULE_TESTS: &str = r#"
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # h100: 2 of 4 nodes not certified; a100: all certified.
      - series: 'railguard_prober_verdict{verdict="certified",profile="h100",node="a"}'
        values: '1x40'
      - series: 'railguard_prober_verdict{verdict="certified",profile="h100",node="b"}'
        values: '1x40'
      - series: 'railguard_prober_verdict{verdict="certified",profile="h100",node="c"}'
        values: '0x40'
      - series: 'railguard_prober_verdict{verdict="certified",profile="h100",node="d"}'
        values: '0x40'
      - series: 'railguard_prober_verdict{verdict="certified",profile="a100",node="n1"}'
        values: '1x40'
      # Node a's certificate expires 1 h after the start; n1's in 20 h.
      - series: 'railguard_prober_certificate_expires_at_seconds{profile="h100",node="a"}'
        values: '3600x40'
      - series: 'railguard_prober_certificate_expires_at_seconds{profile="a100",node="n1"}'
        values: '72000x40'
      - series: 'railguard_fleet_outliers{profile="h100"}'
        values: '0x10 1x40'
      - series: 'railguard_fleet_outliers{profile="a100"}'
        values: '0x50'
      - series: 'railguard_webhook_internal_errors_total{namespace="railguard",pod="wh-0",mode="fail"}'
        values: '0+1x40'
      - series: 'railguard_webhook_internal_errors_total{namespace="railguard",pod="wh-1",mode="fail"}'
        values: '0x40'
      # Every admission in the 0.4 s bucket and above: p99 far past 0.25 s.
      - series: 'railguard_webhook_admission_duration_seconds_bucket{le="0.2048"}'
        values: '0x40'
      - series: 'railguard_webhook_admission_duration_seconds_bucket{le="0.4096"}'
        values: '0+10x40'
      - series: 'railguard_webhook_admission_duration_seconds_bucket{le="+Inf"}'
        values: '0+10x40'
      - series: 'railguard_webhook_node_guard_decisions_total{outcome="denied",writer="other"}'
        values: '0x5 1x40'
      - series: 'railguard_webhook_node_guard_decisions_total{outcome="allowed",writer="prober"}'
        values: '0+5x40'
      - series: 'railguard_extender_request_errors_total{reason="decode"}'
        values: '0+2x40'
    alert_rule_test:
      - eval_time: 20m
        alertname: RailguardUncertifiedNodes
        exp_alerts:
          - exp_labels: {severity: warning, profile: h100}
            exp_annotations:
              summary: "50% of profile h100's nodes are not certified"
              description: "More than 0.1 of the nodes of FabricProfile h100 have a failed, degraded or pending fabric certification: training jobs of the profile have that much less capacity."
              runbook_url: RUNBOOK#railguarduncertifiednodes
      - eval_time: 5m
        alertname: RailguardUncertifiedNodes
        exp_alerts: []
      - eval_time: 20m
        alertname: RailguardCertificateExpiringSoon
        exp_alerts:
          - exp_labels: {severity: warning, profile: h100, node: a}
            exp_annotations:
              summary: "The fabric certificate of node a expires within 7200 s"
              description: "The prober renews a certificate every certification.intervalSeconds; one this close to expiry means renewals fail or are held back (maintenance, a busy node, the invasive cap). At expiry the node leaves service."
              runbook_url: RUNBOOK#railguardcertificateexpiringsoon
      - eval_time: 39m
        alertname: RailguardFleetOutliers
        exp_alerts: []
      - eval_time: 42m
        alertname: RailguardFleetOutliers
        exp_alerts:
          - exp_labels: {severity: info, profile: h100}
            exp_annotations:
              summary: "1 node(s) of profile h100 are fleet outliers"
              description: "The fleet controller marked nodes whose measurements are far from the profile's fleet baseline (condition RailguardFleetOutlier)."
              runbook_url: RUNBOOK#railguardfleetoutliers
      - eval_time: 15m
        alertname: RailguardWebhookErrors
        exp_alerts:
          - exp_labels: {severity: critical, namespace: railguard, pod: wh-0}
            exp_annotations:
              summary: "railguard-webhook wh-0 fails to build patches"
              description: "Internal errors turn into denials or unmutated pods, per the webhook's failure mode."
              runbook_url: RUNBOOK#railguardwebhookerrors
      - eval_time: 20m
        alertname: RailguardWebhookSlow
        exp_alerts:
          - exp_labels: {severity: warning}
            exp_annotations:
              summary: "railguard-webhook p99 admission time 407.6ms"
              description: "Every pod creation in scope waits for the webhook; the API server gives up after its timeoutSeconds."
              runbook_url: RUNBOOK#railguardwebhookslow
      - eval_time: 10m
        alertname: RailguardNodeGuardRefusals
        exp_alerts:
          - exp_labels: {severity: warning, writer: other}
            exp_annotations:
              summary: "The node guard refused 1 change(s) of railguard's Node outputs asked by other"
              description: "Someone other than a node's own prober, the campaign or the fleet controller tried to write a certification, or a prober's write was refused (a simulated certificate, a pod the cache does not know)."
              runbook_url: RUNBOOK#railguardnodeguardrefusals
      - eval_time: 30m
        alertname: RailguardNodeGuardRefusals
        exp_alerts: []
      - eval_time: 15m
        alertname: RailguardExtenderErrors
        exp_alerts:
          - exp_labels: {severity: critical, reason: decode}
            exp_annotations:
              summary: "railguard-extender answers requests with errors (decode)"
              description: "The scheduler's calls to the extender fail; pods of railguard profiles are not placed (the extender is not ignorable) until it answers again."
              runbook_url: RUNBOOK#railguardextendererrors
"#;

/// The anchors GitHub gives `docs/runbooks.md`'s headings.
fn runbook_anchors() -> BTreeSet<String> {
    std::fs::read_to_string(workspace_root().join("docs/runbooks.md"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .collect()
}

#[test]
fn promtool_accepts_the_rules_and_each_alert_fires_on_its_fault() {
    let docs = render(&[]);
    let file = rule_file(&docs);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml_ng::to_string(&file).unwrap(),
    )
    .unwrap();
    let checked = promtool(&["check", "rules", "rules.yaml"], dir.path());
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");

    let base = "https://github.com/railguard/railguard/blob/main/docs/runbooks.md";
    let anchors = runbook_anchors();
    let mut alerts = BTreeSet::new();
    for group in file["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            let url = rule["annotations"]["runbook_url"].as_str().unwrap();
            let anchor = url
                .strip_prefix(&format!("{base}#"))
                .unwrap_or_else(|| panic!("{alert}: runbook_url {url}"));
            assert_eq!(anchor, alert.to_lowercase(), "{alert}");
            assert!(anchors.contains(anchor), "{alert}: no section {anchor}");
            alerts.insert(alert.to_string());
        }
    }
    // Every alert has a unit test below.
    for alert in &alerts {
        assert!(
            RULE_TESTS.contains(&format!("alertname: {alert}")),
            "{alert}"
        );
    }
    std::fs::write(
        dir.path().join("tests.yaml"),
        RULE_TESTS.replace("RUNBOOK", base),
    )
    .unwrap();
    promtool(&["test", "rules", "tests.yaml"], dir.path());
}

/// Every metric an alert reads is one a component exports (`_bucket`/`_total` series of
/// histograms and counters by their registered names).
#[test]
fn alerts_read_only_exported_metrics() {
    let exported: BTreeSet<&str> = [
        "railguard_prober_verdict",
        "railguard_prober_certificate_expires_at_seconds",
        "railguard_fleet_outliers",
        "railguard_webhook_internal_errors_total",
        "railguard_webhook_admission_duration_seconds_bucket",
        "railguard_webhook_node_guard_decisions_total",
        "railguard_extender_request_errors_total",
    ]
    .into();
    let file = rule_file(&render(&[]));
    let text = serde_json::to_string(&file).unwrap();
    let used: BTreeSet<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("railguard_"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        used,
        exported.iter().map(|s| s.to_string()).collect(),
        "metrics the alerts read"
    );
    // The components register these names (their metrics sources say so).
    for (file, names) in [
        (
            "prober/cli/src/daemon/metrics.rs",
            &[
                "\"railguard_prober\"",
                "\"verdict\"",
                "\"certificate_expires_at_seconds\"",
            ][..],
        ),
        (
            "webhook/cli/src/metrics.rs",
            &[
                "\"railguard_webhook\"",
                "\"internal_errors\"",
                "\"admission_duration_seconds\"",
                "\"node_guard_decisions\"",
            ][..],
        ),
        (
            "extender/cli/src/metrics.rs",
            &["\"railguard_extender\"", "\"request_errors\""][..],
        ),
    ] {
        let source = std::fs::read_to_string(workspace_root().join(file)).unwrap();
        for n in names {
            assert!(source.contains(n), "{file} registers {n}");
        }
    }
    assert!(railguard_prober_cli::fleet::METRIC_NAMES.contains(&"railguard_fleet_outliers"));
}

/// Applies a CRD from the fixtures and waits until its kind is served.
async fn install_crd(client: &kube::Client, file: &str) -> ApiResource {
    let path = workspace_root()
        .join("tests/fixtures/prometheus-operator")
        .join(file);
    let crd: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.patch(
        crd["metadata"]["name"].as_str().unwrap(),
        &PatchParams::apply("railguard-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let group = crd["spec"]["group"].as_str().unwrap().to_string();
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
    eventually(
        std::time::Duration::from_secs(60),
        &format!("{kind} served"),
        || {
            let (client, group, kind) = (client.clone(), group.clone(), kind.clone());
            async move {
                // Right after the CRD is created, discovery can list its group before the
                // group's own endpoint serves it (404 page not found): not yet.
                let d = match Discovery::new(client).run().await {
                    Ok(d) => d,
                    Err(e) => return Ok(Err(railguard_tests::NotYet(format!("discovery: {e}")))),
                };
                Ok(d.get(&group)
                    .and_then(|g| {
                        g.recommended_resources()
                            .into_iter()
                            .find(|(r, caps)| r.kind == kind && caps.scope == Scope::Namespaced)
                            .map(|(r, _)| r)
                    })
                    .ok_or_else(|| railguard_tests::NotYet(format!("{kind} not in discovery"))))
            }
        },
    )
    .await
    .unwrap()
}

/// On 1.37 whatever `RAILGUARD_KUBE_VERSION` says: the Operator's current CRDs need a
/// modern server (1.20 refuses their `default: ""` fields), as the Operator itself does.
#[tokio::test]
async fn the_operators_crds_accept_every_monitoring_object() {
    let cp = ControlPlane::start_version(KubeVersion::V1_37, &ApiServerOptions::default())
        .await
        .unwrap();
    let client = cp.client();
    let mut resources = BTreeMap::new();
    for file in [
        "monitoring.coreos.com_servicemonitors.yaml",
        "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ] {
        let r = install_crd(&client, file).await;
        resources.insert(r.kind.clone(), r);
    }
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
    )
    .await
    .unwrap();
    let mut created = BTreeSet::new();
    for values in ["", "extender: {placement: deployment}"] {
        for doc in render(&[values]) {
            let Some(r) = doc["kind"].as_str().and_then(|k| resources.get(k)) else {
                continue;
            };
            let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, r);
            api.patch(
                name(&doc),
                &PatchParams::apply("railguard-tests").force(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| panic!("{} {}: {e}", r.kind, name(&doc)));
            created.insert(format!("{}/{}", r.kind, name(&doc)));
        }
    }
    assert_eq!(
        created.len(),
        6,
        "4 ServiceMonitors (webhook, extender, fleet, probers), the sidecar extender's PodMonitor, the PrometheusRule: {created:?}"
    );
    // The schemas are enforced: a scrape interval that is not a duration is refused.
    let mut broken = render(&[])
        .into_iter()
        .find(|d| d["kind"] == "ServiceMonitor")
        .unwrap();
    broken["metadata"]["name"] = json!("broken");
    broken["spec"]["endpoints"][0]["interval"] = json!("every 30 seconds");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &resources["ServiceMonitor"]);
    let err = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(broken).unwrap(),
        )
        .await
        .expect_err("an interval that is not a duration");
    assert!(err.to_string().contains("interval"), "{err}");
}
