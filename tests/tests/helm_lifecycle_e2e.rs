//! The chart's life with the real Helm against the real kube-apiserver (1.20 by default, 1.37
//! with `RAILGUARD_KUBE_VERSION=1.37`): `helm install` of the previous release
//! (`tests/fixtures/charts/railguard-0.1.0.tgz`, see its SOURCE.md), `helm upgrade` to the
//! chart in the tree as `helm package` packs it, `helm rollback` to the previous release and
//! `helm uninstall`, keeping
//! every piece of state a cluster has by then: the campaign token, the extender's CA and
//! client pair, the webhook's self-managed CA and the caBundles it wrote, every Node's
//! certificate, every FabricProfile (the same object, not a recreated one).
//!
//! No kubelet or controller-manager runs here, so Helm runs with `--no-hooks` and the test
//! plays the hook's part: it renders the chart's pre-upgrade hook (`templates/crd-upgrade.yaml`),
//! creates its ServiceAccount and RBAC from that output, and runs the hook Job's container
//! (its args and env as rendered) with the real `railguard-prober` under that ServiceAccount's
//! token, before `helm upgrade`, as Helm orders it. The real node (`real_node_e2e`) runs the
//! hook as Helm does, on a kubelet. After `helm uninstall --no-hooks` it plays the
//! post-delete clean-up hook (`templates/cleanup.yaml`) the same way. The webhook's self-managed pass runs in-process as the
//! webhook runs it at start (`cert_sync::sync_once`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use railguard_kube::secret_fill::secret_data;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use railguard_api::{keys, Verdict};
use railguard_sim::certificates as synth;
use railguard_tests::helm::Helm;
use railguard_tests::{fixture_profile, labels, workspace_root, ControlPlane};
use railguard_webhook_cli::cert_sync::{self, SelfSignedOptions};
use railguard_webhook_cli::certs::{time, CertSpec};
use serde_json::{json, Value as Json};

const NS: &str = "railguard";
const RELEASE: &str = "rg";
const FULLNAME: &str = "rg-railguard";
const CRD: &str = "fabricprofiles.railguard.io";
/// A field of the current CRD that the test removes from the live CRD before the upgrade,
/// standing for "a field the new release added", which the upgraded values then use.
const NEW_FIELD: &str = "acceptSimulated";

/// Values for both releases: the previous release's schema must accept them too.
const VALUES: &str = "extender:\n  tls:\n    enabled: true\n";
/// The upgraded release's values: the profile uses [`NEW_FIELD`].
const UPGRADE_VALUES: &str = "fabricProfiles:\n  h100-ndr:\n    spec:\n      certification:\n        acceptSimulated: true\n";

struct Run<'a> {
    cp: &'a ControlPlane,
    helm: Helm,
    dir: tempfile::TempDir,
}

impl Run<'_> {
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `helm ARGS --namespace NS --kubeconfig K`, which must succeed; its stdout.
    fn helm(&self, args: &[&str]) -> String {
        let out = self
            .helm
            .command()
            .args(args)
            .args(["--namespace", NS, "--kubeconfig"])
            .arg(self.cp.kubeconfig_path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "helm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn previous_chart() -> PathBuf {
    workspace_root().join("tests/fixtures/charts/railguard-0.1.0.tgz")
}

fn current_chart() -> PathBuf {
    workspace_root().join("charts/railguard")
}

/// Everything an upgrade, a rollback or a re-render must not lose or re-roll.
#[derive(Debug, PartialEq)]
struct State {
    secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    ca_bundles: BTreeMap<String, Vec<Vec<u8>>>,
    node_certificates: BTreeMap<String, (BTreeMap<String, String>, Option<String>)>,
    profile_uids: BTreeMap<String, String>,
}

async fn state(client: &Client) -> State {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let mut kept = BTreeMap::new();
    for name in [
        format!("{FULLNAME}-peer-token"),
        format!("{FULLNAME}-extender-tls"),
        format!("{FULLNAME}-webhook-tls"),
    ] {
        let secret = secrets.get(&name).await.unwrap();
        let data = secret_data(&secret);
        assert!(!data.is_empty(), "Secret {name} has no data");
        kept.insert(name, data);
    }
    let mut ca_bundles = BTreeMap::new();
    for mwc in Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let bundles = mwc
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default())
            .collect();
        ca_bundles.insert(format!("mutating/{}", mwc.metadata.name.unwrap()), bundles);
    }
    for vwc in Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let bundles = vwc
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default())
            .collect();
        ca_bundles.insert(
            format!("validating/{}", vwc.metadata.name.unwrap()),
            bundles,
        );
    }
    State {
        secrets: kept,
        ca_bundles,
        node_certificates: state_of_nodes(client).await,
        profile_uids: profiles(client)
            .await
            .into_iter()
            .map(|p| (p.metadata.name.unwrap(), p.metadata.uid.unwrap()))
            .collect(),
    }
}

fn profile_api(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "railguard.io".into(),
        version: "v1alpha1".into(),
        api_version: "railguard.io/v1alpha1".into(),
        kind: "FabricProfile".into(),
        plural: "fabricprofiles".into(),
    };
    Api::all_with(client.clone(), &resource)
}

async fn profiles(client: &Client) -> Vec<DynamicObject> {
    profile_api(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// `--name=value` arguments of the live webhook Deployment's container.
async fn webhook_args(client: &Client) -> BTreeMap<String, String> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), NS)
        .get(&format!("{FULLNAME}-webhook"))
        .await
        .unwrap();
    let container = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    container
        .args
        .iter()
        .flatten()
        .filter_map(|a| a.strip_prefix("--")?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The webhook's start: its self-managed pass writes its CA and pair into the chart's
/// Secret and the CA into both configurations, named by the deployed arguments.
async fn webhook_provisions_itself(client: &Client, dir: &Path) {
    let args = webhook_args(client).await;
    let arg = |k: &str| {
        args.get(k)
            .unwrap_or_else(|| panic!("webhook args lack --{k}: {args:?}"))
            .clone()
    };
    let spec = CertSpec::new(
        &arg("service-name"),
        NS,
        arg("cert-validity-days").parse().unwrap(),
        arg("cert-rotate-before-days").parse().unwrap(),
    )
    .unwrap();
    let opts = SelfSignedOptions {
        secret_name: arg("self-signed-secret"),
        namespace: NS.into(),
        webhook_config_name: arg("webhook-config-name"),
        validating_webhook_config_name: args.get("node-guard-config-name").cloned(),
        spec,
        tls_cert: dir.join("tls.crt"),
        tls_key: dir.join("tls.key"),
    };
    cert_sync::sync_once(client, &opts, time::OffsetDateTime::now_utc())
        .await
        .unwrap();
}

/// The chart's pre-install/pre-upgrade hook as Helm would run it.
async fn run_crd_hook(run: &Run<'_>, values: &[&Path]) -> String {
    run_hook(
        run,
        values,
        "templates/crd-upgrade.yaml",
        "pre-install,pre-upgrade",
    )
    .await
}

/// One of the chart's hooks (`template`, annotated `hook`) as Helm would run it, under its
/// own ServiceAccount: rendered with this server's capabilities (on 1.37 its DRA kinds), the
/// ServiceAccount and RBAC are created, the Job's container runs as a child process.
/// Returns its stdout.
async fn run_hook(run: &Run<'_>, values: &[&Path], template: &str, hook: &str) -> String {
    let mut args = vec![
        "template".to_string(),
        RELEASE.into(),
        current_chart().display().to_string(),
        "--show-only".into(),
        template.into(),
    ];
    if run.cp.kube_version() == railguard_tests::KubeVersion::V1_37 {
        for v in railguard_tests::dra::chart_api_versions() {
            args.push("--api-versions".into());
            args.push(v);
        }
        args.push("--kube-version".into());
        args.push(railguard_tests::dra::CHART_KUBE_VERSION.into());
    }
    for v in values {
        args.push("-f".into());
        args.push(v.display().to_string());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let rendered = run.helm(&refs);
    let docs = railguard_tests::helm::documents(&rendered).unwrap();
    let client = run.cp.client();
    let mut job = None;
    for doc in docs {
        let obj = doc.obj;
        assert_eq!(
            obj["metadata"]["annotations"]["helm.sh/hook"], hook,
            "{obj}"
        );
        let kind = obj["kind"].as_str().unwrap().to_string();
        if kind == "Job" {
            job = Some(obj);
            continue;
        }
        let (group, version) = match obj["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                obj["apiVersion"].as_str().unwrap().to_string(),
            ),
        };
        let plural = format!("{}s", kind.to_lowercase());
        let resource = ApiResource {
            group,
            version,
            api_version: obj["apiVersion"].as_str().unwrap().into(),
            kind: kind.clone(),
            plural,
        };
        let api: Api<DynamicObject> = if kind == "ServiceAccount" {
            Api::namespaced_with(client.clone(), NS, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let name = obj["metadata"]["name"].as_str().unwrap();
        let object: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
        api.patch(
            name,
            &PatchParams::apply("helm-lifecycle-e2e").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap();
    }
    let job = job.expect("the hook renders a Job");
    let pod = &job["spec"]["template"]["spec"];
    let account = pod["serviceAccountName"].as_str().unwrap();
    let token = railguard_tests::service_account_token(&client, NS, account, None)
        .await
        .unwrap();
    let kubeconfig = run.file(
        "hook-kubeconfig",
        &std::fs::read_to_string(run.cp.kubeconfig_path())
            .unwrap()
            .replace(run.cp.admin_token(), &token),
    );
    let container = &pod["containers"][0];
    let mut cmd = Command::new(
        railguard_tests::workspace_binary("railguard-prober-cli", "railguard-prober").unwrap(),
    );
    for arg in container["args"].as_array().unwrap() {
        cmd.arg(arg.as_str().unwrap());
    }
    cmd.arg("--kubeconfig").arg(&kubeconfig);
    for env in container["env"].as_array().into_iter().flatten() {
        cmd.env(
            env["name"].as_str().unwrap(),
            env["value"].as_str().unwrap_or_default(),
        );
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "the {template} hook failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn schema_has_new_field(crd: &CustomResourceDefinition) -> bool {
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    !schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["certification"]["properties"]
        [NEW_FIELD]
        .is_null()
}

async fn profile_field(client: &Client, profile: &str) -> Json {
    let p = profile_api(client).get(profile).await.unwrap();
    p.data["spec"]["certification"][NEW_FIELD].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_installs_upgrades_rolls_back_and_uninstalls_keeping_every_secret_certificate_and_profile(
) {
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.client();
    let run = Run {
        cp: &cp,
        helm: Helm::new().unwrap(),
        dir: tempfile::tempdir().unwrap(),
    };
    // The release under test is the packaged chart, as users install it.
    let package_dir = run.dir.path().join("package");
    run.helm(&[
        "package",
        current_chart().to_str().unwrap(),
        "--destination",
        package_dir.to_str().unwrap(),
    ]);
    let packaged = package_dir.join(format!("railguard-{}.tgz", env!("CARGO_PKG_VERSION")));
    assert!(
        packaged.is_file(),
        "helm package names the chart railguard-<workspace version>.tgz"
    );
    let values = run.file("values.yaml", VALUES);
    let upgrade_values = run.file("upgrade.yaml", UPGRADE_VALUES);
    cp.create_namespace(NS, &labels(&[])).await.unwrap();

    // A certified GPU node, before the chart (its node guard answers only once the webhook
    // runs, and nothing here runs it as a server).
    let h100 = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    let product = h100.spec.node_selector["nvidia.com/gpu.product"].clone();
    cp.create_node(
        "gpu-0",
        &labels(&[("nvidia.com/gpu.product", &product)]),
        &[("nvidia.com/gpu", "8")],
    )
    .await
    .unwrap();
    let cert = synth::certificate(&h100, Verdict::Certified, Timestamp::now(), 392.0, 370.0);
    cp.publish_certificate("gpu-0", &cert).await.unwrap();

    // 1. The previous release, with its own generated token and extender CA; the webhook
    //    then provisions its CA as it does at start.
    run.helm(&[
        "install",
        RELEASE,
        previous_chart().to_str().unwrap(),
        "-f",
        values.to_str().unwrap(),
    ]);
    webhook_provisions_itself(&client, run.dir.path()).await;
    let installed = state(&client).await;
    assert!(
        installed.profile_uids.contains_key("h100-ndr"),
        "{installed:?}"
    );
    assert!(
        installed
            .ca_bundles
            .values()
            .flatten()
            .all(|b| !b.is_empty()),
        "every webhook has the CA the webhook wrote: {:?}",
        installed.ca_bundles.keys()
    );

    // 2. A cluster whose CRD predates a field the new release uses: the API server prunes it.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let path = format!(
        "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/certification/properties/{NEW_FIELD}"
    );
    crds.patch(
        CRD,
        &PatchParams::default(),
        &Patch::<()>::Json(
            serde_json::from_value(json!([{"op": "remove", "path": path}])).unwrap(),
        ),
    )
    .await
    .unwrap();
    assert!(!schema_has_new_field(&crds.get(CRD).await.unwrap()));
    railguard_tests::eventually(
        std::time::Duration::from_secs(30),
        "the field is pruned",
        || async {
            let pruned = profile_api(&client)
                .patch(
                    "h100-ndr",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"certification": {NEW_FIELD: true}}})),
                )
                .await
                .map(|p| p.data["spec"]["certification"][NEW_FIELD].is_null())
                .unwrap_or(false);
            Ok::<_, anyhow::Error>(pruned.then_some(()))
        },
    )
    .await
    .unwrap();

    // 3. helm upgrade: the hook brings the CRD to this release first (Helm runs it before it
    //    applies anything), then the chart applies.
    let hook = run_crd_hook(&run, &[&values]).await;
    assert!(
        hook.contains(&format!(
            "{CRD}: applied {} over",
            env!("CARGO_PKG_VERSION")
        )),
        "{hook}"
    );
    let crd = crds.get(CRD).await.unwrap();
    assert!(schema_has_new_field(&crd), "the hook restored {NEW_FIELD}");
    assert_eq!(
        crd.metadata.annotations.unwrap()[railguard_api::crd::ANNOTATION_CRD_VERSION],
        env!("CARGO_PKG_VERSION")
    );
    run.helm(&[
        "upgrade",
        RELEASE,
        packaged.to_str().unwrap(),
        "--no-hooks",
        "-f",
        values.to_str().unwrap(),
    ]);
    let upgraded = state(&client).await;
    assert_eq!(upgraded, installed, "helm upgrade lost or re-rolled state");

    // The operator then sets the new field in the chart's profile. Helm validates a
    // release's objects against the API server's OpenAPI before it runs any hook, so a field
    // the cluster's CRD lacks can only be set once the upgraded CRD is served; the server
    // publishes a CRD's OpenAPI a moment after Established, hence the retry.
    let set_field = || {
        run.helm
            .command()
            .args(["upgrade", RELEASE])
            .arg(&packaged)
            .args(["--no-hooks", "--reuse-values", "-f"])
            .arg(&upgrade_values)
            .args(["--namespace", NS, "--kubeconfig"])
            .arg(cp.kubeconfig_path())
            .output()
            .unwrap()
    };
    railguard_tests::eventually(
        std::time::Duration::from_secs(60),
        "helm upgrade setting the new field",
        || async {
            let out = set_field();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if out.status.success() {
                Ok(Some(()))
            } else if stderr.contains("unknown field") {
                Ok(None)
            } else {
                Err(anyhow::anyhow!("helm upgrade: {stderr}"))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        profile_field(&client, "h100-ndr").await,
        json!(true),
        "the profile keeps the field the upgraded CRD serves"
    );
    assert_eq!(
        state(&client).await,
        installed,
        "setting a field re-rolled state"
    );
    let history = run.helm(&["history", RELEASE, "-o", "json"]);
    let history: Json = serde_json::from_str(&history).unwrap();
    let chart = format!("railguard-{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(history.as_array().unwrap().len(), 3, "{history}");
    assert_eq!(history[1]["chart"], chart);
    assert_eq!(history[2]["chart"], chart);
    // The hook again (the same release): nothing to change, still applied and current.
    let again = run_crd_hook(&run, &[&values, &upgrade_values]).await;
    assert!(
        again.contains(&format!("applied {0} over {0}", env!("CARGO_PKG_VERSION"))),
        "{again}"
    );

    // 4. helm rollback to the previous release: state kept, the newer CRD stays.
    run.helm(&["rollback", RELEASE, "1", "--no-hooks"]);
    assert_eq!(
        state(&client).await,
        installed,
        "helm rollback lost or re-rolled state"
    );
    assert!(schema_has_new_field(&crds.get(CRD).await.unwrap()));
    let history: Json =
        serde_json::from_str(&run.helm(&["history", RELEASE, "-o", "json"])).unwrap();
    assert_eq!(history[3]["chart"], "railguard-0.1.0");

    // 5. helm uninstall: railguard's objects go; the CRD, the Nodes' certificates stay.
    run.helm(&["uninstall", RELEASE, "--no-hooks"]);
    railguard_tests::eventually(
        std::time::Duration::from_secs(30),
        "the release's Deployments and webhook configurations are deleted",
        || async {
            let deployments = Api::<Deployment>::namespaced(client.clone(), NS)
                .list(&ListParams::default())
                .await?;
            let configs = Api::<MutatingWebhookConfiguration>::all(client.clone())
                .list(&ListParams::default())
                .await?;
            Ok::<_, anyhow::Error>(
                (deployments.items.is_empty() && configs.items.is_empty()).then_some(()),
            )
        },
    )
    .await
    .unwrap();
    assert!(
        crds.get_opt(CRD).await.unwrap().is_some(),
        "Helm never deletes crds/"
    );
    assert_eq!(
        state_of_nodes(&client).await,
        installed.node_certificates,
        "uninstall without hooks touches no Node"
    );
    // 6. The post-delete hook: what railguard put on the Nodes goes (its taint, labels and
    //    conditions; on 1.37 its DeviceTaintRules), others' stay, and so do the certificates.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "gpu-0",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"taints": [
                {"key": keys::TAINT_FABRIC_UNHEALTHY, "value": "failed", "effect": "NoSchedule"},
                {"key": "example.com/theirs", "value": "x", "effect": "NoSchedule"},
            ]}})),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            "gpu-0",
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"status": {"conditions": [
                {"type": keys::CONDITION_FABRIC_READY, "status": "False", "reason": "Failed"},
            ]}})),
        )
        .await
        .unwrap();
    let rules = (run.cp.kube_version() == railguard_tests::KubeVersion::V1_37)
        .then(|| railguard_tests::dra::taint_rules(&client));
    if let Some(rules) = &rules {
        for (name, managed) in [("railguard-gpu-0-mlx5-0", true), ("someone-elses", false)] {
            let mut labels = serde_json::Map::new();
            if managed {
                labels.insert(
                    railguard_api::dra::LABEL_MANAGED_BY.into(),
                    railguard_api::dra::MANAGED_BY.into(),
                );
            }
            let rule: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "deviceSelector": {"driver": "dra.net", "pool": "gpu-0", "device": "pci-0000-1a-00-0"},
                    "taint": {"key": "railguard.io/rail", "value": "link-down", "effect": "NoSchedule"},
                },
            }))
            .unwrap();
            rules.create(&Default::default(), &rule).await.unwrap();
        }
    }
    let cleaned = run_hook(&run, &[&values], "templates/cleanup.yaml", "post-delete").await;
    assert!(cleaned.contains("node(s) cleaned"), "{cleaned}");
    let node = nodes.get("gpu-0").await.unwrap();
    let taints: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(
        taints,
        ["example.com/theirs"],
        "only railguard's taint goes"
    );
    let conditions: Vec<String> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert!(
        !conditions.iter().any(|c| c.starts_with("Railguard")),
        "{conditions:?}"
    );
    for (name, (labels, certificate)) in state_of_nodes(&client).await {
        assert!(
            labels.is_empty(),
            "{name} keeps railguard labels: {labels:?}"
        );
        assert_eq!(
            certificate, installed.node_certificates[&name].1,
            "{name}: the certificate stays"
        );
    }
    if let Some(rules) = &rules {
        let left: Vec<String> = rules
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|r| r.metadata.name)
            .collect();
        assert_eq!(left, ["someone-elses"], "only railguard's rules go");
        rules
            .delete("someone-elses", &Default::default())
            .await
            .unwrap();
    }
    // The same release installs again over what uninstall left.
    run.helm(&[
        "install",
        RELEASE,
        packaged.to_str().unwrap(),
        "--no-hooks",
        "-f",
        values.to_str().unwrap(),
    ]);
}

async fn state_of_nodes(
    client: &Client,
) -> BTreeMap<String, (BTreeMap<String, String>, Option<String>)> {
    let mut out = BTreeMap::new();
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let labels = node
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.starts_with("railguard.io/"))
            .collect();
        let annotation = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::ANNOTATION_CERTIFICATE).cloned());
        out.insert(node.metadata.name.unwrap(), (labels, annotation));
    }
    out
}
