//! Pod Security (issue #31, "Managed clusters"): the real Helm installs the chart with the
//! probers split into a `privileged` namespace the chart creates
//! ([`railguard_tests::chart_values::POD_SECURITY_SPLIT`]) next to a release namespace that
//! enforces `restricted`, and the API server's own Pod Security admission judges a Pod made
//! from every workload's pod template (server-side dry run, `dryRun=All`: no kubelet or
//! controller runs here, so no workload makes pods itself), hooks included.
//!
//! On Kubernetes 1.37 (`RAILGUARD_KUBE_VERSION=1.37`; Pod Security is GA from 1.25) every
//! Pod is admitted where the chart puts it, and the prober's Pod in the restricted release
//! namespace is refused with the violations, proving the check bites. Kubernetes 1.20 has no
//! Pod Security admission: the same install runs, every Pod is admitted where the chart puts
//! it, and the labels are inert (the prober's Pod is admitted in the restricted namespace
//! too), which is what the 1.20 pass asserts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::collections::BTreeMap;

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use railguard_tests::chart_values::{POD_SECURITY_SPLIT, SPLIT_PROBER_NAMESPACE};
use railguard_tests::helm::{self, Helm, HelmDoc};
use railguard_tests::{give_legacy_token, labels, ControlPlane, KubeVersion};
use serde_json::{json, Value as Json};

const RELEASE_NS: &str = POD_SECURITY_SPLIT.namespace;
const PROBER_NS: &str = SPLIT_PROBER_NAMESPACE;

/// One workload of the release and the Pod its template makes.
struct Workload {
    what: String,
    namespace: String,
    component: String,
    pod: Json,
}

/// The Pod a workload object would make: its template's labels and spec (a bare Pod: its
/// own).
fn pod_of(obj: &Json) -> Option<Json> {
    let template = match obj["kind"].as_str()? {
        "Deployment" | "DaemonSet" | "Job" => &obj["spec"]["template"],
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"],
        "Pod" => obj,
        _ => return None,
    };
    let name = obj["metadata"]["name"].as_str()?;
    Some(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{name}-psa"),
            "labels": template["metadata"]["labels"].clone(),
        },
        "spec": template["spec"].clone(),
    }))
}

/// The dynamic API of a rendered object's kind (the built-in workload kinds pluralise
/// regularly).
fn api_for(client: &kube::Client, obj: &Json) -> Api<DynamicObject> {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap());
    Api::namespaced_with(
        client.clone(),
        obj["metadata"]["namespace"].as_str().unwrap(),
        &ApiResource::from_gvk(&gvk),
    )
}

async fn dry_run_pod(client: &kube::Client, namespace: &str, pod: &Json) -> Result<(), String> {
    let pods: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Pod")),
    );
    let pp = PostParams {
        dry_run: true,
        field_manager: Some("railguard-pod-security-test".into()),
    };
    pods.create(&pp, &serde_json::from_value(pod.clone()).unwrap())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installs_the_probers_privileged_and_everything_else_restricted() {
    let cp = ControlPlane::start().await.unwrap();
    let version = cp.kube_version();
    let client = cp.client();
    let helm = Helm::new().unwrap();

    // The release namespace, labelled as README "Install" says; the probers' namespace is
    // the chart's to create. (kubernetes.io/metadata.name: 1.20 does not set it.)
    let restricted = [
        ("pod-security.kubernetes.io/enforce", "restricted"),
        ("pod-security.kubernetes.io/audit", "restricted"),
        ("pod-security.kubernetes.io/warn", "restricted"),
        ("kubernetes.io/metadata.name", RELEASE_NS),
    ];
    cp.create_namespace(RELEASE_NS, &labels(&restricted))
        .await
        .unwrap();
    // The prober's runtime class (values.yaml: nvidia), as the GPU Operator installs it:
    // RuntimeClass admission refuses a Pod naming one that does not exist.
    let runtime_classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("node.k8s.io", "v1", "RuntimeClass")),
    );
    runtime_classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"}, "handler": "nvidia",
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    // helm install with the real Helm. No kubelet or controller runs here: --no-hooks, and
    // the hooks' Pods are judged from their manifests below.
    let values = helm.write_values(POD_SECURITY_SPLIT.values).unwrap();
    let out = helm
        .command()
        .args(["install", POD_SECURITY_SPLIT.release])
        .arg(helm::chart_dir())
        .args(["--namespace", RELEASE_NS, "--no-hooks", "-f"])
        .arg(&values)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "helm install: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The release namespace warns on restricted, and Helm prints the API server's warnings
    // ("would violate PodSecurity ...", as the unsplit chart gets for its prober DaemonSets
    // on 1.37): no workload Helm created there would violate it.
    assert!(!stderr.contains("PodSecurity"), "helm install: {stderr}");

    // The chart's Namespace, with the privileged level.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let probers = namespaces.get(PROBER_NS).await.unwrap();
    let ns_labels = probers.metadata.labels.unwrap_or_default();
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            ns_labels
                .get(&format!("pod-security.kubernetes.io/{mode}"))
                .map(String::as_str),
            Some("privileged"),
            "{mode}: {ns_labels:?}"
        );
    }
    assert_eq!(
        ns_labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("Helm")
    );

    // Every workload the release created (read back from the API server) and every hook.
    let get = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--namespace", RELEASE_NS]);
        helm.on_cluster(cp.kubeconfig_path(), all).unwrap()
    };
    let release = helm::documents(&get(&["get", "manifest", POD_SECURITY_SPLIT.release])).unwrap();
    let hooks = helm::documents(&get(&["get", "hooks", POD_SECURITY_SPLIT.release])).unwrap();
    let mut workloads = Vec::new();
    for (doc, is_hook) in release
        .iter()
        .map(|d| (d, false))
        .chain(hooks.iter().map(|d| (d, true)))
    {
        let HelmDoc { obj, .. } = doc;
        if pod_of(obj).is_none() {
            continue;
        }
        let namespace = obj["metadata"]["namespace"].as_str().unwrap().to_string();
        let name = obj["metadata"]["name"].as_str().unwrap();
        let live = if is_hook {
            obj.clone()
        } else {
            let got = api_for(&client, obj)
                .get(name)
                .await
                .unwrap_or_else(|e| panic!("{} {name}: {e}", obj["kind"]));
            serde_json::to_value(got).unwrap()
        };
        workloads.push(Workload {
            what: format!("{}/{namespace}/{name}", obj["kind"].as_str().unwrap()),
            component: obj["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            pod: pod_of(&live).unwrap(),
            namespace,
        });
    }
    // A hook's ServiceAccount is a hook too (not created under --no-hooks): created here as
    // Helm would before its Pod, so ServiceAccount admission finds it.
    let accounts: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        RELEASE_NS,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ServiceAccount")),
    );
    for sa in hooks.iter().filter(|d| d.obj["kind"] == "ServiceAccount") {
        accounts
            .create(
                &PostParams::default(),
                &serde_json::from_value(sa.obj.clone()).unwrap(),
            )
            .await
            .unwrap();
    }
    for w in &workloads {
        if let Some(sa) = w.pod["spec"]["serviceAccountName"].as_str() {
            give_legacy_token(&client, version, &w.namespace, sa)
                .await
                .unwrap();
        }
    }

    // Where each is: the probers and the campaign in the privileged namespace, everything
    // else (webhook, extender, scheduler, fleet controller, CRD hook, helm test) restricted.
    let mut found: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for w in &workloads {
        found
            .entry(w.namespace.as_str())
            .or_default()
            .push(w.what.as_str());
        let privileged = matches!(w.component.as_str(), "prober" | "campaign");
        assert_eq!(
            w.namespace,
            if privileged { PROBER_NS } else { RELEASE_NS },
            "{}",
            w.what
        );
    }
    let kinds = |ns: &str| -> Vec<String> {
        let mut k: Vec<String> = found[ns]
            .iter()
            .map(|w| w.split('/').next().unwrap().to_string())
            .collect();
        k.sort();
        k
    };
    assert_eq!(
        kinds(PROBER_NS),
        ["CronJob", "CronJob", "DaemonSet", "DaemonSet"],
        "{found:?}"
    );
    // webhook, extender, scheduler, fleet; the CRD upgrade and uninstall clean-up Jobs and the helm test Pod.
    assert_eq!(
        kinds(RELEASE_NS),
        [
            "Deployment",
            "Deployment",
            "Deployment",
            "Deployment",
            "Job",
            "Job",
            "Pod"
        ],
        "{found:?}"
    );

    // Pod Security admission admits each Pod where the chart puts it.
    for w in &workloads {
        if let Err(e) = dry_run_pod(&client, &w.namespace, &w.pod).await {
            panic!("{}: its Pod is refused in {}: {e}", w.what, w.namespace);
        }
    }

    // And it bites: the prober's Pod in the restricted release namespace (under an account
    // of the same name there, so ServiceAccount admission, which runs first, passes it on).
    let prober = workloads
        .iter()
        .find(|w| w.what.starts_with("DaemonSet/"))
        .unwrap();
    let sa = prober.pod["spec"]["serviceAccountName"].as_str().unwrap();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let in_restricted = dry_run_pod(&client, RELEASE_NS, &prober.pod).await;
    match version {
        KubeVersion::V1_20 => {
            // No Pod Security admission on 1.20: the labels are inert.
            assert_eq!(in_restricted, Ok(()), "{}", prober.what);
        }
        KubeVersion::V1_37 => {
            let e = in_restricted.expect_err("the prober admitted in a restricted namespace");
            for says in [
                "violates PodSecurity \"restricted:latest\"",
                "use restricted volume type \"hostPath\"",
                "uses hostPort 7470",
                "runAsUser=0",
                "\"SYS_ADMIN\"",
            ] {
                assert!(e.contains(says), "{}: {e} lacks {says}", prober.what);
            }
        }
    }
}
