//! End-to-end: the FabricProfile CRD and a certificate on a Node, against a real
//! kube-apiserver (and kube-scheduler) from the harness: 1.20 by default, the modern release
//! with `RAILGUARD_KUBE_VERSION=1.37`.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use railguard_api::*;
use railguard_tests::{labels, ControlPlane, KubeVersion};
use serde_json::json;

fn h100_yaml() -> std::io::Result<String> {
    std::fs::read_to_string(
        railguard_tests::workspace_root().join("api/fixtures/profiles/dgx-h100-ndr.yaml"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_profiles_and_certificates_round_trip_through_the_api_server() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.expect("CRD");
    let client = cp.client();
    let profiles: Api<FabricProfile> = Api::all(client.clone());

    // A valid profile is accepted by the structural schema and reads back equal.
    let valid = profiles_from_yaml(&h100_yaml().unwrap()).unwrap().remove(0);
    profiles
        .create(&PostParams::default(), &valid)
        .await
        .expect("create valid profile");
    let stored = profiles.get("h100-ndr").await.unwrap();
    assert_eq!(
        stored.spec, valid.spec,
        "defaults and field names survive the API server"
    );
    assert!(
        stored.metadata.namespace.is_none(),
        "FabricProfile is cluster-scoped"
    );

    // What the schema cannot see (a duplicate rail) passes it, and validate() names the field.
    let mut invalid = valid.clone();
    invalid.metadata.name = Some("broken".into());
    invalid.metadata.resource_version = None;
    invalid.spec.rails[6].hca = "mlx5_0".into();
    profiles
        .create(&PostParams::default(), &invalid)
        .await
        .expect("schema accepts it");
    let listed = profiles.list(&Default::default()).await.unwrap();
    assert_eq!(listed.items.len(), 2);
    let broken = listed.items.iter().find(|p| p.name() == "broken").unwrap();
    let err = broken.validate().unwrap_err();
    assert_eq!(err.fields(), vec!["spec.rails[6]"]);
    assert!(err.to_string().contains("duplicate rail mlx5_0:1"), "{err}");

    // Bounds the Rust model enforces are in the schema too, so the apiserver refuses a profile
    // the webhook, extender and prober could not read (one such object would fail their
    // whole list): a rate of 0, and a port beyond u32.
    let raw_profiles: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<FabricProfile>(&()),
    );
    for (name, rail) in [
        (
            "zero-rate",
            json!({ "hca": "mlx5_0", "port": 1, "linkLayer": "InfiniBand", "rateGbps": 0, "gpus": [0] }),
        ),
        (
            "huge-port",
            json!({ "hca": "mlx5_0", "port": 4294967296u64, "linkLayer": "InfiniBand", "rateGbps": 400, "gpus": [0] }),
        ),
    ] {
        let obj = json!({
            "apiVersion": "railguard.io/v1alpha1", "kind": "FabricProfile",
            "metadata": { "name": name },
            "spec": { "rails": [rail], "thresholds": { "writeBwHostGbps": 1, "busbwPlateauGBps": 1 } }
        });
        match raw_profiles
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
        {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 422, "{name}: {status:?}"),
            other => panic!("{name}: the schema should refuse it, got {other:?}"),
        }
    }

    // The schema itself rejects wrong types: a string rate and an unknown link layer.
    let bad_type = json!({
        "apiVersion": "railguard.io/v1alpha1", "kind": "FabricProfile",
        "metadata": { "name": "bad-type" },
        "spec": { "rails": [{ "hca": "mlx5_0", "port": 1, "linkLayer": "Ethernet", "rateGbps": "fast", "gpus": [0] }],
                  "thresholds": { "writeBwHostGbps": 1, "busbwPlateauGBps": 1 } }
    });
    let raw: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<FabricProfile>(&()),
    );
    let rejected = raw
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad_type).unwrap(),
        )
        .await
        .expect_err("schema must reject");
    let msg = rejected.to_string();
    assert!(
        msg.contains("rateGbps") && msg.contains("linkLayer"),
        "{msg}"
    );

    // A node, certified by a server-side apply with the prober's field manager.
    let node_name = "gpu-node-1";
    cp.create_node(
        node_name,
        &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
        &[("nvidia.com/gpu", "8")],
    )
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let before = NodeFabric::from_node(&nodes.get(node_name).await.unwrap(), Timestamp::now());
    assert_eq!(before.state, FabricState::Absent);

    let issued = Timestamp::now();
    let ttl = valid.spec.certification.ttl_seconds as i64;
    let mut cert =
        railguard_sim::certificates::certificate(&valid, Verdict::Certified, issued, 391.0, 372.0);
    cert.node = Some(node_name.into());
    cert.expires_at = issued + SignedDuration::from_secs(ttl);
    let apply = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": node_name,
            "labels": {
                keys::LABEL_FABRIC: "certified",
                keys::LABEL_PROFILE: "h100-ndr",
                keys::LABEL_SIGNATURE: cert.signature,
            },
            "annotations": { keys::ANNOTATION_CERTIFICATE: cert.to_annotation().unwrap() },
        }
    });
    nodes
        .patch(
            node_name,
            &PatchParams::apply(keys::PROBER_FIELD_MANAGER).force(),
            &Patch::Apply(&apply),
        )
        .await
        .expect("server-side apply");
    let stored = nodes.get(node_name).await.unwrap();
    let managers: Vec<String> = stored
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "railguard-prober"),
        "{managers:?}"
    );
    // The harness's labels survive the apply: the prober owns only its own fields.
    assert_eq!(
        stored.metadata.labels.as_ref().unwrap()["nvidia.com/gpu.product"],
        "NVIDIA-H100-80GB-HBM3"
    );

    let now = NodeFabric::from_node(&stored, Timestamp::now());
    match &now.state {
        FabricState::Certified(c) => assert_eq!(**c, cert),
        other => panic!("expected certified, got {other:?}"),
    }
    assert_eq!(
        now.signature.as_deref(),
        Some(valid.spec.signature().as_str())
    );
    assert_eq!(
        now.allocatable.get("nvidia.com/gpu").map(String::as_str),
        Some("8")
    );

    let later = NodeFabric::from_node(&stored, issued + SignedDuration::from_secs(ttl + 7800));
    assert_eq!(later.state.kind(), "expired");
    assert_eq!(later.state.to_string(), "certificate expired 2h10m ago");

    // A later apply by the same manager that omits fields removes them (it owns them).
    let relabel = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": node_name, "labels": { keys::LABEL_FABRIC: "pending" } }
    });
    nodes
        .patch(
            node_name,
            &PatchParams::apply(keys::PROBER_FIELD_MANAGER).force(),
            &Patch::Apply(&relabel),
        )
        .await
        .unwrap();
    let pending = NodeFabric::from_node(&nodes.get(node_name).await.unwrap(), Timestamp::now());
    assert_eq!(pending.state, FabricState::Pending { previous: None });
    assert_eq!(pending.profile, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_binds_pods_to_fake_nodes() {
    let mut cp = ControlPlane::start().await.expect("control plane");
    cp.start_scheduler("[]").await.expect("scheduler");
    cp.create_namespace("train", &labels(&[("team", "a")]))
        .await
        .unwrap();
    cp.create_node("node-a", &labels(&[]), &[("nvidia.com/gpu", "8")])
        .await
        .unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(cp.client(), "train");
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "worker-0" },
        "spec": { "containers": [{ "name": "main", "image": "busybox",
                  "resources": { "limits": { "nvidia.com/gpu": "8" } } }] }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let node =
        railguard_tests::eventually(std::time::Duration::from_secs(60), "pod binding", || {
            let pods = pods.clone();
            async move { Ok(pods.get("worker-0").await?.spec.and_then(|s| s.node_name)) }
        })
        .await
        .expect("pod bound by the real kube-scheduler");
    assert_eq!(node, "node-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_runs_the_chosen_version_and_its_api_groups() {
    let version = KubeVersion::from_env().unwrap();
    let cp = ControlPlane::start().await.expect("control plane");
    assert_eq!(cp.kube_version(), version);
    let info = cp.client().apiserver_version().await.unwrap();
    assert_eq!(
        (info.major.as_str(), info.minor.trim_end_matches('+')),
        ("1", version.minor().to_string().as_str()),
        "{info:?}"
    );
    assert!(
        info.git_version
            .starts_with(&format!("v{}.", version.as_str())),
        "{info:?}"
    );

    // What each version serves that railguard may come to rely on.
    let client = cp.client();
    let groups = client.list_api_groups().await.unwrap();
    let versions = |group: &str| -> Vec<String> {
        groups
            .groups
            .iter()
            .find(|g| g.name == group)
            .map(|g| g.versions.iter().map(|v| v.version.clone()).collect())
            .unwrap_or_default()
    };
    let kinds = |group_version: &'static str| {
        let client = client.clone();
        async move {
            client
                .list_api_group_resources(group_version)
                .await
                .map(|l| l.resources.into_iter().map(|r| r.kind).collect::<Vec<_>>())
                .unwrap_or_default()
        }
    };
    match version {
        KubeVersion::V1_20 => {
            assert!(versions("resource.k8s.io").is_empty(), "no DRA in 1.20");
            assert!(
                !kinds("admissionregistration.k8s.io/v1")
                    .await
                    .contains(&"ValidatingAdmissionPolicy".to_string()),
                "no ValidatingAdmissionPolicy in 1.20"
            );
        }
        KubeVersion::V1_37 => {
            // Dynamic Resource Allocation, device taints included, is served as
            // resource.k8s.io/v1 with no feature gate or runtime-config.
            assert_eq!(versions("resource.k8s.io"), vec!["v1".to_string()]);
            let dra = kinds("resource.k8s.io/v1").await;
            for kind in [
                "DeviceClass",
                "DeviceTaintRule",
                "ResourceClaim",
                "ResourceClaimTemplate",
                "ResourceSlice",
            ] {
                assert!(dra.contains(&kind.to_string()), "{kind} not in {dra:?}");
            }
            assert!(
                kinds("admissionregistration.k8s.io/v1")
                    .await
                    .contains(&"ValidatingAdmissionPolicy".to_string()),
                "ValidatingAdmissionPolicy is GA"
            );
        }
    }
}

#[test]
fn kube_versions_parse_as_the_environment_names_them() {
    for (s, v) in [
        ("", KubeVersion::V1_20),
        ("1.20", KubeVersion::V1_20),
        ("v1.20.2", KubeVersion::V1_20),
        ("floor", KubeVersion::V1_20),
        ("1.37", KubeVersion::V1_37),
        ("v1.37.2", KubeVersion::V1_37),
        ("modern", KubeVersion::MODERN),
    ] {
        assert_eq!(KubeVersion::parse(s).unwrap(), v, "{s:?}");
    }
    for s in ["1.2", "1.36", "latest", "1.370"] {
        let err = KubeVersion::parse(s).unwrap_err().to_string();
        assert!(err.contains(&format!("{s:?}")), "{err}");
    }
    assert_eq!(
        KubeVersion::MODERN.as_str(),
        railguard_tests::MODERN_KUBE_MINOR
    );
    assert_eq!(KubeVersion::V1_37.to_string(), "1.37");
    assert!(KubeVersion::V1_20 < KubeVersion::V1_37);
    assert_eq!(KubeVersion::V1_20.minor(), 20);
}
