//! End-to-end: the fleet controller runs with exactly the identity the chart gives it. The
//! chart's fleet ServiceAccount, ClusterRole and ClusterRoleBinding (default values) are
//! applied to a real kube-apiserver, and the real `railguard-prober` runs the chart's
//! container (its args and env; only the metrics address is moved to loopback and the
//! in-cluster credentials become a kubeconfig with a token of that ServiceAccount). Eight
//! certified nodes of one profile, one 6% slow on a rail but above the profile's threshold:
//! the controller marks that node (condition and Event) and writes `status.fleet`, without
//! a single refused request; the same identity may not touch a certificate or read Secrets;
//! and its `/metrics` exposes every name of `fleet::METRIC_NAMES`, the list the chart's
//! Grafana dashboard is checked against (tests/tests/chart_dashboard.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use kube::api::{Api, ListParams, PostParams};
use railguard_api::{keys, FabricProfile, Verdict};
use railguard_prober_cli::fleet::METRIC_NAMES;
use railguard_tests::chart_values::DEFAULT;
use railguard_tests::install::{is_fleet, ChartFleet};
use railguard_tests::{
    eventually, fixture_profile, labels, scrape_metrics, ControlPlane, KubeVersion,
};
use serde_json::{json, Value};

const SLOW: &str = "gpu-05";
const NODES: usize = 8;

/// The chart's objects with the default values, as `helm template` renders them for 1.20.
/// The chart as `helm install` renders it against the server the test runs on: on 1.37 the
/// server serves DRA, so the fleet controller's ClusterRole grants what its DRA part reads
/// and writes.
fn rendered(version: KubeVersion) -> Vec<Value> {
    match version {
        KubeVersion::V1_20 => DEFAULT
            .objects_1_20()
            .expect("helm template renders the chart"),
        KubeVersion::V1_37 => DEFAULT
            .render(
                &railguard_tests::dra::chart_api_versions(),
                railguard_tests::dra::CHART_KUBE_VERSION,
            )
            .expect("helm template renders the chart")
            .into_iter()
            .map(|d| d.obj)
            .collect(),
    }
}

/// Whether the exposition has `name`: a sample of it (a histogram's as `_bucket`, `_sum`,
/// `_count`), or its family's `# TYPE` line (a counter's without `_total`).
fn exposes(exposition: &str, name: &str) -> bool {
    let family = name.strip_suffix("_total").unwrap_or(name);
    exposition.lines().any(|l| {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            return t.split_whitespace().next() == Some(family);
        }
        let sample = l.split(['{', ' ']).next().unwrap_or_default();
        sample == name
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| sample.strip_suffix(s) == Some(name))
    })
}

#[test]
fn exposition_names_are_read_by_family_and_sample() {
    let text = "# TYPE a_seconds histogram\na_seconds_bucket{le=\"1\"} 2\n\
                # TYPE c counter\nc_total{outcome=\"ok\"} 1\ng{p=\"x\"} 3\n";
    assert!(exposes(text, "a_seconds"));
    assert!(exposes(text, "c_total"));
    assert!(exposes(text, "g"));
    assert!(!exposes(text, "gg"));
    assert!(!exposes(text, "a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_controller_needs_no_more_than_the_charts_rbac() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = ControlPlane::start().await.expect("control plane");
    cp.apply_fabricprofile_crd().await.unwrap();
    let admin = cp.client();
    let logs = cp.log_dir().to_path_buf();
    let docs = rendered(cp.kube_version());

    cp.create_namespace(DEFAULT.namespace, &labels(&[]))
        .await
        .unwrap();
    let deployment = docs
        .iter()
        .find(|d| is_fleet(d) && d["kind"] == "Deployment")
        .expect("the fleet Deployment");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "railguard-fleet"
    );

    // One profile, eight certified nodes; one rail of one node 6% slow, above 360 Gb/s.
    let profile = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    let profile_name = profile.name().to_string();
    Api::<FabricProfile>::all(admin.clone())
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let base: Node = serde_json::from_value(json!({"metadata": {}, "spec": {}})).unwrap();
    for i in 0..NODES {
        let name = format!("gpu-{i:02}");
        // Healthy nodes within half a percent of each other.
        let gbps = 395.0 + (i % 3) as f64;
        let mut cert = railguard_sim::certificates::certificate(
            &profile,
            Verdict::Certified,
            Timestamp::now(),
            gbps,
            380.0,
        );
        if name == SLOW {
            for r in cert.rails.iter_mut().filter(|r| r.hca == "mlx5_4") {
                r.write_bw_host_gbps = Some(372.0);
            }
        }
        let node = railguard_sim::certificates::node(&base, &name, Some(&cert), &[]);
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    // The chart's container, with the ServiceAccount's token for the in-cluster config.
    let mut controller = ChartFleet::start(&cp, &docs, DEFAULT.namespace, "railguard-fleet-rbac")
        .await
        .unwrap();
    let url = controller.url.clone();

    // Its writes go through: the condition, the Event and status.fleet.
    let condition = eventually(Duration::from_secs(90), "the slow node is marked", || {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get(SLOW).await?;
            Ok(n.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == keys::CONDITION_FLEET_OUTLIER && c.status == "True"))
        }
    })
    .await
    .unwrap();
    let message = condition.message.unwrap_or_default();
    assert!(message.contains("mlx5_4:1"), "{message}");
    for i in (0..NODES)
        .map(|i| format!("gpu-{i:02}"))
        .filter(|n| n != SLOW)
    {
        let n = nodes.get(&i).await.unwrap();
        let marked = n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .any(|c| c.type_ == keys::CONDITION_FLEET_OUTLIER && c.status == "True");
        assert!(!marked, "{i} is not an outlier");
    }
    let events: Api<Event> = Api::all(admin.clone());
    let event = eventually(Duration::from_secs(30), "the outlier Event", || {
        let events = events.clone();
        async move {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| e.involved_object.name.as_deref() == Some(SLOW)))
        }
    })
    .await
    .unwrap();
    assert!(
        event.message.unwrap_or_default().contains("mlx5_4:1"),
        "the Event names the rail"
    );
    let profiles: Api<FabricProfile> = Api::all(admin.clone());
    let fleet = eventually(Duration::from_secs(30), "status.fleet", || {
        let profiles = profiles.clone();
        let name = profile_name.clone();
        async move {
            Ok(profiles
                .get_status(&name)
                .await?
                .status
                .and_then(|s| s.fleet)
                .filter(|f| f.outliers == 1))
        }
    })
    .await
    .unwrap();
    assert_eq!(fleet.nodes, NODES as u32);
    assert!(!fleet.baseline.is_empty());

    // Nothing it asked for was refused.
    controller.daemon.assert_running(&logs);
    let log = std::fs::read_to_string(logs.join("railguard-fleet-rbac.log")).unwrap();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a request of the fleet controller was refused:\n{log}"
    );

    // Its metrics: every name the dashboard may use.
    let exposition = scrape_metrics(&url).await.unwrap();
    let missing: Vec<&&str> = METRIC_NAMES
        .iter()
        .filter(|m| !exposes(&exposition, m))
        .collect();
    assert!(missing.is_empty(), "{missing:?} not in\n{exposition}");
    assert!(
        exposition.contains(&format!(
            "railguard_fleet_outliers{{profile=\"{profile_name}\"}} 1"
        )),
        "{exposition}"
    );

    // And no more than that: no Secret, no deleting Nodes. (It may patch Nodes, for the
    // fabric-unhealthy taint and the expiry label; which of railguard's outputs it may
    // change is the node guard's to decide: node_guard_e2e.)
    let sa = controller.client().await.unwrap();
    let as_fleet: Api<Node> = Api::all(sa.clone());
    match as_fleet.delete(SLOW, &Default::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("the fleet identity deleted a Node: {other:?}"),
    }
    match Api::<Secret>::namespaced(sa.clone(), DEFAULT.namespace)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("the fleet identity listed Secrets: {other:?}"),
    }
    // It can read what it watches.
    let seen = as_fleet.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(seen.len(), NODES);
}
