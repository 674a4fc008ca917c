//! `railguard-extender-bench`: extender latency and decode cost, printed as a table.
//!
//! 1. Cache mode (`nodeCacheCapable: true`): 5,000 certified nodes in the cache, a training
//!    pod, all 5,000 names per request. Reports the in-server time (decode, filter, encode)
//!    and the round trip over loopback HTTP, p50/p99; and `/prioritize` for a pod of a job
//!    already running on 1,000 of the nodes.
//! 2. Full-Node mode: a 5,000-node `ExtenderArgs` built from the Node kube-scheduler 1.20
//!    sent (managedFields included), decoded, filtered and encoded, as a ratio to a plain
//!    `serde_json::from_slice::<Value>` of the same bytes.
//!
//! Usage: `cargo bench -p railguard-extender --bench railguard-extender-bench [-- ROUNDS]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, Pod};
use railguard_api::{NodeFabric, Verdict};
use railguard_extender::cache::{BoundPod, CachedNode, NodeIndex};
use railguard_extender::wire::ExtenderArgs;
use railguard_extender::ExtenderConfig;
use railguard_extender_cli::cache::ClusterState;
use railguard_extender_cli::metrics::Metrics;
use railguard_extender_cli::server::{self, AppState, Source};
use railguard_sim::certificates as synth;
use serde_json::json;

const NODES: usize = 5_000;
const ARGS_FULL: &str = include_str!("../../fixtures/extender-args-sample.json");
const H100: &str = include_str!("../../../api/fixtures/profiles/dgx-h100-ndr.yaml");

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Time this thread has spent on a CPU (Linux schedstat), so the table can separate the
/// work from waiting for a core on a loaded machine. `None` where it is not available.
fn thread_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Any failure ends the bench with its message (a measuring tool, not a service).
type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> BenchResult<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `cargo bench` adds `--bench`: the rounds are the first other argument.
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(|s| s.parse())
        .transpose()
        .map_err(|e| format!("ROUNDS must be a number: {e}"))?
        .unwrap_or(1000);
    let profiles = railguard_api::profiles_from_yaml(H100)?;
    let h100 = profiles[0].clone();
    let sample: serde_json::Value = serde_json::from_str(ARGS_FULL)?;
    let base: Node = serde_json::from_value(sample["Nodes"]["items"][0].clone())?;
    let mut pod: Pod = serde_json::from_value(sample["Pod"].clone())?;
    let ann = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    ann.insert("railguard.io/profile".into(), h100.name().into());
    ann.insert("railguard.io/signature".into(), h100.spec.signature());

    let now = Timestamp::now();
    let issued = now.checked_sub(SignedDuration::from_hours(1))?;
    // Every tenth node is degraded, so the filter does real rejecting work.
    let nodes: Vec<Node> = (0..NODES)
        .map(|i| {
            let mut cert = synth::certificate(&h100, Verdict::Certified, issued, 392.0, 370.0);
            if i % 10 == 0 {
                synth::degrade_rail(&mut cert, "mlx5_3", 1, 196.0);
            }
            synth::node(
                &base,
                &format!("gpu-{i:05}"),
                Some(&cert),
                &[(
                    "network.topology.nvidia.com/leaf",
                    &format!("leaf-{}", i / 32),
                )],
            )
        })
        .collect();

    // 1. Cache mode.
    let cluster = Arc::new(ClusterState::new(ExtenderConfig::default()));
    cluster.replace_nodes(nodes.iter().map(|n| NodeFabric::from_node(n, now)));
    cluster.pods.replace(Default::default());
    cluster.namespaces.replace(Default::default());
    cluster.replace_profiles(profiles.iter().cloned());
    let state = Arc::new(AppState {
        source: Source::Cluster(cluster),
        config: ExtenderConfig::default(),
        max_nodes: server::DEFAULT_MAX_NODES,
        metrics: Arc::new(Metrics::new()),
    });
    let names: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let body = serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": names}))?;

    let mut in_server = Vec::with_capacity(rounds);
    let (mut decode, mut answer, mut encode) = (Vec::new(), Vec::new(), Vec::new());
    let mut passed = 0;
    let cpu_start = thread_cpu_time();
    let wall_start = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let req = ExtenderArgs::decode(&body, state.max_nodes)?;
        let t1 = Instant::now();
        let result = server::answer_filter(&state, req, Timestamp::now())?;
        let t2 = Instant::now();
        let out = result.to_json()?;
        let t3 = Instant::now();
        in_server.push(t3 - t);
        decode.push(t1 - t);
        answer.push(t2 - t1);
        encode.push(t3 - t2);
        passed = result.node_names.map_or(0, |n| n.len());
        std::hint::black_box(out);
    }
    let wall_total = wall_start.elapsed();
    let cpu_total = thread_cpu_time()
        .zip(cpu_start)
        .map(|(end, start)| end - start);
    // The floor on this machine: the same 5,000 node-index lookups and nothing else.
    let mut lookups = Vec::with_capacity(rounds);
    if let Source::Cluster(cluster) = &state.source {
        for _ in 0..rounds {
            let t = Instant::now();
            let index = cluster.node_index();
            let found = names.iter().filter_map(|n| index.lookup(n)).count();
            lookups.push(t.elapsed());
            std::hint::black_box(found);
        }
    }
    lookups.sort();
    // What node and profile changes cost the watch task: the node index built (a relist, a
    // node added or removed, a profile change), and one indexed node's slot replaced (a
    // kubelet status write, a new certificate: most node events).
    let mut rebuilds = Vec::new();
    let mut replaces = Vec::new();
    if let Source::Cluster(cluster) = &state.source {
        let set = cluster.profile_set();
        let previous = cluster.node_index();
        let changed = {
            let nodes = cluster.nodes.read();
            let some = nodes.get(&names[NODES / 2]).ok_or("bench node missing")?;
            let mut fabric = (*some.fabric).clone();
            fabric
                .labels
                .insert("railguard.io/bench".into(), "changed".into());
            CachedNode::new(Arc::new(fabric), &set)
        };
        for _ in 0..(rounds / 20).max(5) {
            let nodes = cluster.nodes.read();
            let version = cluster.nodes.version();
            let t = Instant::now();
            let index = NodeIndex::build(&nodes, version, &set);
            rebuilds.push(t.elapsed());
            std::hint::black_box(index);
        }
        for _ in 0..rounds {
            let t = Instant::now();
            let index = previous.with_node(&changed, cluster.nodes.version() + 1, &set);
            replaces.push(t.elapsed());
            std::hint::black_box(index.ok_or("the bench node is indexed")?);
        }
    }
    rebuilds.sort();
    replaces.sort();
    // `/prioritize` for a pod of a job already running on 1,000 of the nodes (gang locality
    // over the interned topology), decode + score + encode.
    let job_key = "training.kubeflow.org/job-name".to_string();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    if let Source::Cluster(cluster) = &state.source {
        for node in names.iter().step_by(NODES / 1000) {
            cluster.jobs.update(
                None,
                Some(&BoundPod {
                    namespace: namespace.clone(),
                    node: node.clone(),
                    job: (job_key.clone(), "llama".into()),
                }),
            );
        }
    }
    let mut gang_pod = pod.clone();
    gang_pod
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(job_key, "llama".into());
    let gang_body =
        serde_json::to_vec(&json!({"Pod": gang_pod, "Nodes": null, "NodeNames": names}))?;
    let mut prioritized = Vec::with_capacity(rounds);
    let mut scored = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let req = ExtenderArgs::decode(&gang_body, state.max_nodes)?;
        let list = server::answer_prioritize(&state, &req, Timestamp::now())?;
        let out = serde_json::to_vec(&list)?;
        prioritized.push(t.elapsed());
        scored = list.len();
        std::hint::black_box(out);
    }
    prioritized.sort();
    for v in [&mut in_server, &mut decode, &mut answer, &mut encode] {
        v.sort();
    }

    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let served = railguard_runtime::spawn_serve(
        listener,
        server::extender_router(state.clone(), 512 << 20),
        None,
        railguard_runtime::ServeLimits::default(),
    )?;
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/filter");
    let mut round_trip = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let resp = client.post(&url).body(body.clone()).send().await?;
        let bytes = resp.bytes().await?;
        round_trip.push(t.elapsed());
        std::hint::black_box(bytes);
    }
    round_trip.sort();
    served.stop.cancel();

    // 2. Full-Node mode.
    let full = serde_json::to_vec(
        &json!({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": null}),
    )?;
    let standalone = AppState {
        source: Source::Standalone {
            profiles: Arc::new(profiles.clone()),
        },
        config: ExtenderConfig::default(),
        max_nodes: server::DEFAULT_MAX_NODES,
        metrics: Arc::new(Metrics::new()),
    };
    let full_rounds = (rounds / 50).max(5);
    let mut plain = Vec::new();
    let mut ours = Vec::new();
    for _ in 0..full_rounds {
        let t = Instant::now();
        let v: serde_json::Value = serde_json::from_slice(&full)?;
        plain.push(t.elapsed());
        std::hint::black_box(v);
        let t = Instant::now();
        let req = ExtenderArgs::decode(&full, standalone.max_nodes)?;
        let result = server::answer_filter(&standalone, req, Timestamp::now())?;
        let out = result.to_json()?;
        ours.push(t.elapsed());
        std::hint::black_box(out);
    }
    plain.sort();
    ours.sort();

    let median = |v: &[Duration]| percentile(v, 0.5);
    println!("railguard-extender bench: {NODES} nodes, h100-ndr pod, every 10th node degraded");
    println!();
    println!("| measurement | rounds | p50 | p99 |");
    println!("|---|---|---|---|");
    println!(
        "| cache mode, in server (decode + filter + encode), {passed} of {NODES} pass | {rounds} | {} | {} |",
        us(median(&in_server)),
        us(percentile(&in_server, 0.99))
    );
    for (what, v) in [
        ("decode (pod + 5,000 names)", &decode),
        (
            "filter (node-index lookups + prechecks + rejections)",
            &answer,
        ),
        ("encode", &encode),
        ("only the 5,000 node-index lookups (floor)", &lookups),
    ] {
        println!(
            "| cache mode, in server: {what} | {rounds} | {} | {} |",
            us(median(v)),
            us(percentile(v, 0.99))
        );
    }
    println!(
        "| cache mode, in server: `/prioritize` for a job on 1,000 nodes (decode + score + encode), {scored} of {NODES} scored | {rounds} | {} | {} |",
        us(median(&prioritized)),
        us(percentile(&prioritized, 0.99))
    );
    for (what, v) in [
        (
            "built whole (relist, node added or removed, profile change)",
            &rebuilds,
        ),
        (
            "one indexed node replaced (status write, new certificate)",
            &replaces,
        ),
    ] {
        println!(
            "| node index ({NODES} nodes, {} profile): {what} | {} | {} | {} |",
            profiles.len(),
            v.len(),
            us(median(v)),
            us(percentile(v, 0.99))
        );
    }
    if let Some(cpu) = cpu_total {
        println!(
            "| cache mode, in server: mean on-CPU time per request (schedstat); the thread had a core {:.0}% of the loop's wall time | {rounds} | {} (mean) | – |",
            100.0 * cpu.as_secs_f64() / wall_total.as_secs_f64(),
            us(cpu / u32::try_from(rounds).unwrap_or(u32::MAX)),
        );
    }
    println!(
        "| cache mode, HTTP round trip over loopback | {rounds} | {} | {} |",
        us(median(&round_trip)),
        us(percentile(&round_trip, 0.99))
    );
    println!(
        "| full-Node mode, plain serde_json::Value parse ({:.1} MB) | {full_rounds} | {} | {} |",
        full.len() as f64 / 1e6,
        us(median(&plain)),
        us(percentile(&plain, 0.99))
    );
    println!(
        "| full-Node mode, decode + filter + encode | {full_rounds} | {} | {} |",
        us(median(&ours)),
        us(percentile(&ours, 0.99))
    );
    println!();
    println!(
        "full-Node mode ratio (decode + filter + encode / plain parse, medians): {:.2}",
        median(&ours).as_secs_f64() / median(&plain).as_secs_f64()
    );
    Ok(())
}
