//! The extender over real HTTP and TLS: recorded kube-scheduler 1.20 requests in both
//! nodeCacheCapable modes, malformed requests, fail-closed readiness and metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use common::serving::*;
use common::*;
use railguard_extender::wire::{ExtenderFilterResult, HostPriority};
use railguard_extender::ExtenderConfig;
use railguard_extender_cli::cache::ClusterState;
use railguard_extender_cli::server::Source;
use serde_json::{json, Value};

/// A synced cluster cache holding the six nodes, namespaces and profiles.
fn synced_cluster() -> Arc<ClusterState> {
    let cluster = Arc::new(ClusterState::new(ExtenderConfig::default()));
    let profiles = profiles();
    cluster.replace_nodes(six_nodes_at(&profiles, jiff::Timestamp::now()));
    cluster.pods.replace(HashMap::new());
    cluster.namespaces.replace(HashMap::from([(
        "default".to_string(),
        Arc::new(BTreeMap::new()),
    )]));
    cluster.replace_profiles(profiles);
    cluster
}

/// The recorded full-mode request, its nodes replaced by the six railguard nodes
/// (certificates dated relative to the real clock).
fn full_args(pod: Value) -> String {
    let mut args: Value = serde_json::from_str(ARGS_FULL).unwrap();
    let nodes = six_node_objects(&profiles(), jiff::Timestamp::now());
    args["Nodes"]["items"] = serde_json::to_value(nodes).unwrap();
    args["Pod"] = pod;
    args.to_string()
}

/// The Prometheus text the extender's health listener serves.
async fn metrics_text(r: &Running) -> String {
    reqwest::get(format!("{}/metrics", r.health))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn full_node_mode_returns_the_schedulers_own_node_objects() {
    let r = start(standalone()).await;
    let body = full_args(h100_pod());
    let (status, text) = post(&r, "/filter", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(result.error, "");
    assert!(result.node_names.is_none(), "full mode answers with Nodes");
    let items = result.nodes.unwrap().items;
    assert_eq!(items.len(), 1);
    // Byte-for-byte the object the scheduler sent.
    let sent: Value = serde_json::from_str(&body).unwrap();
    let sent_node = serde_json::to_string(&sent["Nodes"]["items"][0]).unwrap();
    assert_eq!(items[0].get(), sent_node);
    assert_eq!(
        result.failed_nodes.keys().collect::<Vec<_>>(),
        ["n-expired"]
    );
    assert!(result.failed_nodes["n-expired"].starts_with("railguard: certificate expired 2h10m"));
    assert_eq!(result.failed_and_unresolvable_nodes.len(), 4);

    // Prioritize in full mode: only the certified node earns a score; the five that score 0
    // are left out (the scheduler adds nothing for a host the list does not name).
    let (status, text) = post(&r, "/prioritize", body).await;
    assert_eq!(status, 200, "{text}");
    let scores: Vec<HostPriority> = serde_json::from_str(&text).unwrap();
    assert_eq!(scores.len(), 1, "{scores:?}");
    assert_eq!(scores[0].host, "n-certified");
    assert!((1..=10).contains(&scores[0].score));
}

#[tokio::test]
async fn unresolvable_nodes_are_reported_as_failed_for_old_schedulers_when_asked() {
    let body = full_args(h100_pod());
    let decide = |config| {
        let body = body.clone();
        async move {
            let r = start_with(standalone(), config).await;
            let (status, text) = post(&r, "/filter", body).await;
            assert_eq!(status, 200, "{text}");
            serde_json::from_str::<Value>(&text).unwrap()
        }
    };
    let split = decide(ExtenderConfig::default()).await;
    let merged = decide(ExtenderConfig {
        report_unresolvable_as_failed: true,
        ..ExtenderConfig::default()
    })
    .await;
    let map = |v: &Value, key: &str| v[key].as_object().cloned().unwrap_or_default();
    assert_eq!(map(&split, "FailedAndUnresolvableNodes").len(), 4);
    assert!(map(&merged, "FailedAndUnresolvableNodes").is_empty());
    // Every rejected node, each with the same one-line reason, now in FailedNodes.
    let mut all = map(&split, "FailedNodes");
    all.extend(map(&split, "FailedAndUnresolvableNodes"));
    assert_eq!(all.len(), 5);
    assert_eq!(map(&merged, "FailedNodes"), all);
    // The passing node is unaffected.
    assert_eq!(merged["Nodes"], split["Nodes"]);
}

#[tokio::test]
async fn recorded_requests_pass_through_for_pods_railguard_does_not_gate() {
    let r = start(Source::Cluster(synced_cluster())).await;
    // The recorded full-mode request, untouched: its pod requests no GPU.
    let (status, text) = post(&r, "/filter", ARGS_FULL).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(result.nodes.unwrap().items.len(), 3);
    // The recorded cache-mode request names nodes the cache does not know: still untouched.
    let (_, text) = post(&r, "/filter", ARGS_NAMES).await;
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(
        result.node_names.unwrap(),
        ["fake-node-1", "fake-node-2", "fake-node-3"]
    );
    assert!(result.nodes.is_none());
    let (status, text) = post(&r, "/prioritize", PRIORITIZE_NAMES).await;
    assert_eq!(status, 200);
    // A pod railguard does not gate scores 0 everywhere: an empty list.
    assert_eq!(text.trim(), "[]");
}

#[tokio::test]
async fn cache_mode_filters_names_from_the_cache_and_returns_only_input_names() {
    let r = start(Source::Cluster(synced_cluster())).await;
    let mut args: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    args["Pod"] = h100_pod();
    // The scheduler's own filters may already have removed some nodes; "n-unknown" is new.
    args["NodeNames"] = json!([
        "n-degraded",
        "n-certified",
        "n-expired",
        "n-unknown",
        "n-none"
    ]);
    let (status, text) = post(&r, "/filter", args.to_string()).await;
    assert_eq!(status, 200, "{text}");
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert!(result.nodes.is_none());
    let names = result.node_names.unwrap();
    assert_eq!(names, ["n-certified"]);
    assert_eq!(
        &*result.failed_nodes["n-unknown"],
        "railguard: node is not in the extender's cache yet"
    );
    assert_eq!(
        &*result.failed_nodes["n-expired"],
        "railguard: certificate expired 2h10m ago"
    );
    assert!(result
        .failed_and_unresolvable_nodes
        .contains_key("n-degraded"));
    assert!(result.failed_and_unresolvable_nodes.contains_key("n-none"));
    let all: Vec<&str> = names
        .iter()
        .map(|n| n.as_str())
        .chain(result.failed_nodes.keys().map(|n| n.as_str()))
        .chain(
            result
                .failed_and_unresolvable_nodes
                .keys()
                .map(|n| n.as_str()),
        )
        .collect();
    assert_eq!(all.len(), 5, "every input node is answered exactly once");

    let metrics = metrics_text(&r).await;
    assert!(
        metrics.contains("railguard_extender_nodes_rejected_total{reason=\"not_cached\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("railguard_extender_filter_duration_seconds_count{mode=\"names\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("railguard_extender_cache_objects{cache=\"nodes\"} 6"),
        "{metrics}"
    );
    assert!(metrics.contains("railguard_extender_cache_age_seconds{cache=\"nodes\"}"));
}

#[tokio::test]
async fn unsynced_caches_fail_closed_and_are_not_ready() {
    let cluster = Arc::new(ClusterState::new(ExtenderConfig::default()));
    let r = start(Source::Cluster(cluster.clone())).await;
    let ready = reqwest::get(format!("{}/readyz", r.health)).await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    assert!(ready
        .text()
        .await
        .unwrap()
        .contains("nodes, pods, namespaces, fabricprofiles"));

    let (status, text) = post(&r, "/filter", ARGS_NAMES).await;
    assert_eq!(status, 200);
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(
        result.error,
        "railguard: extender caches are not synced yet (nodes, pods, namespaces, fabricprofiles); failing closed"
    );
    assert!(result.node_names.is_none() && result.nodes.is_none());
    let (status, _) = post(&r, "/prioritize", ARGS_NAMES).await;
    assert_eq!(status, 503);

    // Once every cache has listed, the same request is answered.
    cluster.nodes.replace(HashMap::new());
    cluster.pods.replace(HashMap::new());
    cluster.namespaces.replace(HashMap::new());
    cluster.profiles.replace(HashMap::new());
    let ready = reqwest::get(format!("{}/readyz", r.health)).await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let (_, text) = post(&r, "/filter", ARGS_NAMES).await;
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(result.error, "");
    assert_eq!(result.node_names.unwrap().len(), 3);
}

#[tokio::test]
async fn malformed_requests_get_clear_errors_and_the_server_keeps_serving() {
    let r = start(Source::Cluster(synced_cluster())).await;
    let truncated = &ARGS_FULL[..ARGS_FULL.len() / 2];
    let mut no_pod: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    no_pod.as_object_mut().unwrap().remove("Pod");
    let mut null_pod: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    null_pod["Pod"] = Value::Null;
    let mut no_nodes: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    no_nodes["NodeNames"] = Value::Null;
    let mut both: Value = serde_json::from_str(ARGS_FULL).unwrap();
    both["NodeNames"] = json!(["fake-node-1"]);
    let mut many: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    many["Pod"] = h100_pod();
    many["NodeNames"] = Value::Array((0..50_000).map(|i| json!(format!("node-{i}"))).collect());
    let mut bad_node: Value = serde_json::from_str(ARGS_FULL).unwrap();
    bad_node["Pod"] = h100_pod();
    bad_node["Nodes"]["items"][1]["metadata"]["labels"] = json!(["not", "a", "map"]);
    let mut bad_pod: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    bad_pod["Pod"]["spec"]["containers"] = json!("nope");

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "truncated",
            truncated.to_string(),
            "railguard: ExtenderArgs is not valid JSON: EOF while parsing",
        ),
        (
            "no pod",
            no_pod.to_string(),
            "railguard: ExtenderArgs has no Pod",
        ),
        (
            "null pod",
            null_pod.to_string(),
            "railguard: ExtenderArgs has no Pod",
        ),
        (
            "no nodes",
            no_nodes.to_string(),
            "railguard: ExtenderArgs has neither Nodes nor NodeNames",
        ),
        (
            "both",
            both.to_string(),
            "railguard: ExtenderArgs has both Nodes and NodeNames",
        ),
        (
            "50k names",
            many.to_string(),
            "railguard: ExtenderArgs lists 50000 nodes, more than the limit of 15000 (--max-nodes)",
        ),
        (
            "bad node",
            bad_node.to_string(),
            "railguard: ExtenderArgs.Nodes.items[1] is not a valid Node",
        ),
        (
            "bad pod",
            bad_pod.to_string(),
            "railguard: ExtenderArgs.Pod is not a valid Pod",
        ),
        (
            "not json",
            "<html>".to_string(),
            "railguard: ExtenderArgs is not valid JSON",
        ),
        (
            "empty",
            String::new(),
            "railguard: ExtenderArgs is not valid JSON",
        ),
    ];
    for (what, body, want) in cases {
        let (status, text) = post(&r, "/filter", body.clone()).await;
        assert_eq!(status, 400, "{what}: {text}");
        let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
        assert!(result.error.starts_with(want), "{what}: {}", result.error);
        assert!(
            result.nodes.is_none() && result.node_names.is_none(),
            "{what}"
        );
        let (status, text) = post(&r, "/prioritize", body).await;
        assert_eq!(status, 400, "{what}: {text}");
        assert!(text.starts_with(want), "{what}: {text}");
    }
    // The cause is in the message, once.
    let (_, text) = post(&r, "/filter", "<html>".to_string()).await;
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert_eq!(
        result.error,
        "railguard: ExtenderArgs is not valid JSON: expected value at line 1 column 1"
    );
    // Still serving.
    let (status, _) = post(&r, "/filter", ARGS_NAMES).await;
    assert_eq!(status, 200);
    let metrics = r.state.metrics.encode().unwrap();
    assert!(
        metrics.contains("railguard_extender_request_errors_total{reason=\"too_many_nodes\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn standalone_mode_refuses_node_names_with_a_clear_error() {
    let r = start(standalone()).await;
    let mut args: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    args["Pod"] = h100_pod();
    let (status, text) = post(&r, "/filter", args.to_string()).await;
    assert_eq!(status, 200);
    let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
    assert!(
        result.error.contains("runs --standalone without a node cache; configure the extender with nodeCacheCapable: false"),
        "{}",
        result.error
    );
    let ready = reqwest::get(format!("{}/readyz", r.health)).await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
}

/// Three certified H100 nodes: `n-fast` (full headroom), `n-thin` (none) and `n-outlier`
/// (full headroom, marked by the fleet controller); certificates dated relative to the clock.
fn fleet_nodes() -> Vec<k8s_openapi::api::core::v1::Node> {
    let profiles = profiles();
    let h100 = profile(&profiles, "h100-ndr");
    let at = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_hours(1))
        .unwrap();
    let cert = |gbps: f64| {
        railguard_sim::certificates::certificate(
            h100,
            railguard_api::Verdict::Certified,
            at,
            gbps,
            gbps,
        )
    };
    let base = sample_node();
    let node = |name: &str, gbps: f64| {
        railguard_sim::certificates::node(&base, name, Some(&cert(gbps)), &[])
    };
    let mut outlier = node("n-outlier", 400.0);
    mark_outlier(&mut outlier, "True", FLEET_MARK);
    vec![node("n-fast", 400.0), node("n-thin", 361.0), outlier]
}

const FLEET_MARK: &str =
    "rail mlx5_3:1 writeBwHost 326.4 Gb/s is 15.0% below the fleet median 384.0 Gb/s (12.3 spreads)";

/// A synced cluster cache holding `nodes` and `profiles`.
fn cluster_of(
    nodes: &[k8s_openapi::api::core::v1::Node],
    profiles: &[railguard_api::FabricProfile],
) -> Arc<ClusterState> {
    let cluster = Arc::new(ClusterState::new(ExtenderConfig::default()));
    cluster.pods.replace(HashMap::new());
    cluster.namespaces.replace(HashMap::new());
    cluster.replace_profiles(profiles.iter().cloned());
    let now = jiff::Timestamp::now();
    cluster.replace_nodes(
        nodes
            .iter()
            .map(|n| railguard_api::NodeFabric::from_node(n, now)),
    );
    cluster
}

/// `spec.fleet.outliers` of the H100 profile decides the filter; for a job's pod the outlier
/// scores last either way. Both request forms: full Nodes (the mark read from the Node's
/// conditions in the request) and names (from the cache).
#[tokio::test]
async fn fleet_outliers_are_filtered_or_ranked_last_as_the_profile_says() {
    use railguard_api::fleet::OutlierAction;
    let nodes = fleet_nodes();
    let names = ["n-fast", "n-thin", "n-outlier"];
    let mut job_pod = h100_pod();
    job_pod["metadata"]["labels"]["training.kubeflow.org/job-name"] = json!("llm");
    for action in [OutlierAction::Score, OutlierAction::Filter] {
        let mut profiles = profiles();
        for p in &mut profiles {
            p.spec.fleet.outliers = action;
        }
        let sources = [
            Source::Standalone {
                profiles: Arc::new(profiles.clone()),
            },
            Source::Cluster(cluster_of(&nodes, &profiles)),
        ];
        for source in sources {
            let cache = matches!(source, Source::Cluster(_));
            let r = start(source).await;
            let body = |pod: &Value| {
                let mut args: Value = serde_json::from_str(ARGS_FULL).unwrap();
                args["Pod"] = pod.clone();
                if cache {
                    args.as_object_mut().unwrap().remove("Nodes");
                    args["NodeNames"] = json!(names);
                } else {
                    args["Nodes"]["items"] = serde_json::to_value(&nodes).unwrap();
                }
                args.to_string()
            };
            let (status, text) = post(&r, "/filter", body(&job_pod)).await;
            assert_eq!(status, 200, "{text}");
            let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
            let passed: Vec<String> = match result.node_names {
                Some(n) => n.iter().map(|n| n.to_string()).collect(),
                None => (result.nodes.unwrap().items.iter())
                    .map(|i| serde_json::from_str::<Value>(i.get()).unwrap())
                    .map(|v| v["metadata"]["name"].as_str().unwrap().to_string())
                    .collect(),
            };
            let metrics = metrics_text(&r).await;
            let counted = "railguard_extender_nodes_rejected_total{reason=\"fleet_outlier\"} 1";
            match action {
                OutlierAction::Score => {
                    assert_eq!(passed, names, "cache {cache}");
                    assert!(result.failed_and_unresolvable_nodes.is_empty());
                    assert!(!metrics.contains("fleet_outlier"), "{metrics}");
                }
                OutlierAction::Filter => {
                    assert_eq!(passed, ["n-fast", "n-thin"], "cache {cache}");
                    // Another repair, not preemption, makes it eligible: unresolvable.
                    assert!(result.failed_nodes.is_empty());
                    assert_eq!(
                        &*result.failed_and_unresolvable_nodes["n-outlier"],
                        format!("railguard: fleet outlier: {FLEET_MARK}")
                    );
                    assert!(metrics.contains(counted), "{metrics}");
                }
            }

            // Scores: a job's pod ranks the outlier below every other candidate (left out),
            // and the node without headroom is lifted to 1 above it. A pod of no job is
            // ranked by headroom alone.
            let scores = |text: &str| -> Vec<(String, i64)> {
                let list: Vec<HostPriority> = serde_json::from_str(text).unwrap();
                list.into_iter()
                    .map(|h| (h.host.into_owned(), h.score))
                    .collect()
            };
            let (status, text) = post(&r, "/prioritize", body(&job_pod)).await;
            assert_eq!(status, 200, "{text}");
            assert_eq!(
                scores(&text),
                [("n-fast".to_string(), 5), ("n-thin".to_string(), 1)],
                "cache {cache}, {action:?}"
            );
            let (status, text) = post(&r, "/prioritize", body(&h100_pod())).await;
            assert_eq!(status, 200, "{text}");
            let want = match action {
                // The profile filters it, so it earns no headroom either.
                OutlierAction::Filter => vec![("n-fast".to_string(), 5)],
                OutlierAction::Score => {
                    vec![("n-fast".to_string(), 5), ("n-outlier".to_string(), 5)]
                }
            };
            assert_eq!(scores(&text), want, "cache {cache}, {action:?}");
        }
    }
}
