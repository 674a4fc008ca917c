//! Property-based fuzzing of the extender's decoder of outside input (issue #14):
//! `ExtenderArgs` in both modes, through [`ExtenderArgs::decode`] and on into the answers,
//! where full Nodes are decoded (`nodeCacheCapable: false`, a standalone extender) and names
//! are looked up in a synced cache (`nodeCacheCapable: true`). Mutations of the recorded
//! kube-scheduler requests (and of a railguard training pod over railguard nodes) and raw
//! bytes; no panic, every rejection a clear error, the `--max-nodes` bound held, and every
//! answer valid JSON that only names candidates.
//!
//! `RAILGUARD_FUZZ_CASES=1000000 cargo test --release -p railguard-extender --test fuzz` is
//! the benchmark-style run of BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

#[path = "../../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use common::*;
use fuzz_support::{
    check_error, config, json_dictionary, mutated, raw_bytes, raw_text, JSON_SYNTAX,
};
use proptest::prelude::*;
use railguard_extender::wire::{Candidates, ExtenderArgs, MAX_EXTENDER_PRIORITY};
use railguard_extender::{ExtenderConfig, ExtenderError};
use railguard_extender_cli::cache::ClusterState;
use railguard_extender_cli::metrics::Metrics;
use railguard_extender_cli::server::{answer_filter, answer_prioritize, AppState, Source};
use serde_json::Value;

/// `ExtenderArgs`'s own tokens, for [`ARGS_TOKENS`] after [`JSON_SYNTAX`].
const EXTENDER_ARGS_TOKENS: &[&str] = &[
    "false",
    "\"Pod\":",
    "\"pod\":",
    "\"Pod\":null",
    "\"Nodes\":",
    "\"nodes\":",
    "\"Nodes\":null",
    "\"Nodes\":{\"items\":null}",
    "\"items\":",
    "\"items\":[{}]",
    "\"NodeNames\":",
    "\"nodenames\":",
    "\"nodeNames\":",
    "\"NodeNames\":null",
    "\"NodeNames\":[\"\"]",
    "\"metadata\":",
    "\"name\":",
    "\"name\":\"\"",
    "\"labels\":",
    "\"annotations\":",
    "\"railguard.io/certificate\":",
    "\"railguard.io/profile\":",
    "\"railguard.io/fabric\":\"certified\"",
    "\"allocatable\":",
    "\"nvidia.com/gpu\":\"8\"",
    "\"nvidia.com/gpu\":\"-1\"",
    "\"resources\":",
    "\"limits\":",
    "\"containers\":",
    "\"initContainers\":",
    "\\u0000",
    "\\ud800",
    "\\\"",
];

const ARGS_TOKENS: &[&str] =
    &json_dictionary::<{ JSON_SYNTAX.len() + EXTENDER_ARGS_TOKENS.len() }>(EXTENDER_ARGS_TOKENS);

/// Candidate bounds: none allowed, one, the recorded request's size, the default.
const MAX_NODES: &[usize] = &[0, 1, 3, railguard_extender_cli::server::DEFAULT_MAX_NODES];

/// The recorded requests of both modes, and both modes with the training pod for the H100
/// profile over the six railguard nodes (certificates, labels, allocatable).
fn seeds() -> Vec<Vec<u8>> {
    let profiles = profiles();
    let pod = serde_json::to_value(training_pod(profile(&profiles, "h100-ndr"))).unwrap();
    let mut full: Value = serde_json::from_str(ARGS_FULL).unwrap();
    let nodes = six_node_objects(&profiles, now());
    full["Nodes"]["items"] = serde_json::to_value(&nodes).unwrap();
    full["Pod"] = pod.clone();
    let mut names: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    // The same six nodes by name, then one that no cache knows.
    let mut node_names: Vec<String> = nodes
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    node_names.push("n-unknown".into());
    names["NodeNames"] = serde_json::json!(node_names);
    names["Pod"] = pod;
    vec![
        ARGS_FULL.as_bytes().to_vec(),
        ARGS_NAMES.as_bytes().to_vec(),
        PRIORITIZE_NAMES.as_bytes().to_vec(),
        serde_json::to_vec(&full).unwrap(),
        serde_json::to_vec(&names).unwrap(),
    ]
}

fn state(source: Source) -> AppState {
    AppState {
        source,
        config: ExtenderConfig::default(),
        max_nodes: railguard_extender_cli::server::DEFAULT_MAX_NODES,
        metrics: Arc::new(Metrics::new()),
    }
}

/// A standalone extender (full Nodes only) and one with a synced cache of the six nodes,
/// built once.
fn states() -> &'static (AppState, AppState) {
    static STATES: OnceLock<(AppState, AppState)> = OnceLock::new();
    STATES.get_or_init(|| {
        let profiles = profiles();
        let cluster = Arc::new(ClusterState::new(ExtenderConfig::default()));
        cluster.replace_nodes(six_nodes(&profiles));
        cluster.pods.replace(HashMap::new());
        cluster.namespaces.replace(HashMap::from([(
            "default".to_string(),
            Arc::new(BTreeMap::new()),
        )]));
        cluster.replace_profiles(profiles.iter().cloned());
        (
            state(Source::Standalone {
                profiles: Arc::new(profiles),
            }),
            state(Source::Cluster(cluster)),
        )
    })
}

/// A Node's name, read the way the extender reads Nodes (the rest skipped, not validated).
#[derive(serde::Deserialize)]
struct Named {
    metadata: NamedMeta,
}

#[derive(serde::Deserialize)]
struct NamedMeta {
    name: Option<String>,
}

/// Decodes a body with a bound on candidates, answers `/filter` and `/prioritize` for it
/// (full Nodes standalone, names from the cache), and checks every outcome.
fn args_property(body: &[u8], max_nodes: usize) -> Result<(), TestCaseError> {
    let request = match ExtenderArgs::decode(body, max_nodes) {
        Ok(r) => r,
        Err(e) => {
            if let ExtenderError::TooManyNodes { count, max } = &e {
                prop_assert!(count > max, "{count} nodes rejected under a limit of {max}");
                prop_assert_eq!(*max, max_nodes);
            }
            return check_error(&e);
        }
    };
    prop_assert!(request.candidates.len() <= max_nodes);
    let (standalone, cached) = states();
    let state = match request.candidates {
        Candidates::Nodes(_) => standalone,
        Candidates::Names(_) => cached,
    };
    let candidates: BTreeSet<String> = match &request.candidates {
        Candidates::Names(names) => names.iter().map(|n| n.to_string()).collect(),
        Candidates::Nodes(items) => items
            .iter()
            .filter_map(|raw| serde_json::from_str::<Named>(raw.get()).ok())
            .filter_map(|n| n.metadata.name)
            .collect(),
    };
    let count = request.candidates.len();
    match answer_prioritize(state, &request, now()) {
        Ok(scores) => {
            // Only candidates that earn a score are listed.
            prop_assert!(scores.len() <= count);
            for s in &scores {
                prop_assert!((1..=MAX_EXTENDER_PRIORITY).contains(&s.score), "{s:?}");
                prop_assert!(
                    candidates.contains(&*s.host),
                    "scored {:?}, not a candidate",
                    s.host
                );
            }
        }
        Err(e) => check_error(&e)?,
    }
    match answer_filter(state, request, now()) {
        Ok(result) => {
            let json = result
                .to_json()
                .map_err(|e| TestCaseError::fail(format!("cannot encode the answer: {e}")))?;
            // Full Nodes are echoed as sent: the answer reads as JSON when the body does
            // (serde_json skips a lone surrogate in a field it ignores, and refuses it in a
            // Value).
            if serde_json::from_slice::<Value>(body).is_ok() {
                serde_json::from_slice::<Value>(&json)
                    .map_err(|e| TestCaseError::fail(format!("answer is not JSON: {e}")))?;
            }
            let passed = result.node_names.iter().flatten().count()
                + result.nodes.iter().flat_map(|l| &l.items).count();
            prop_assert!(passed <= count, "{passed} of {count} candidates passed");
            for name in result
                .failed_nodes
                .keys()
                .chain(result.failed_and_unresolvable_nodes.keys())
            {
                prop_assert!(
                    candidates.contains(name.as_str()),
                    "rejected {:?}, not a candidate",
                    name.as_str()
                );
            }
        }
        Err(e) => check_error(&e)?,
    }
    Ok(())
}

/// The failure with the body as text (proptest prints bytes as numbers).
fn with_body(e: TestCaseError, body: &[u8]) -> TestCaseError {
    TestCaseError::fail(format!("{e}; body: {}", String::from_utf8_lossy(body)))
}

proptest! {
    #![proptest_config(config(3_000))]

    #[test]
    fn extender_args_mutations(
        body in mutated(seeds(), ARGS_TOKENS, 6),
        max_nodes in prop::sample::select(MAX_NODES),
    ) {
        args_property(&body, max_nodes).map_err(|e| with_body(e, &body))?;
    }

    #[test]
    fn extender_args_raw(
        body in prop_oneof![
            raw_bytes(1024),
            raw_text(ARGS_TOKENS).prop_map(String::into_bytes),
        ],
        max_nodes in prop::sample::select(MAX_NODES),
    ) {
        args_property(&body, max_nodes)?;
    }
}

#[test]
fn seeds_are_answered_in_both_modes() {
    let seeds = seeds();
    for seed in &seeds {
        args_property(seed, railguard_extender_cli::server::DEFAULT_MAX_NODES).unwrap();
    }
    for (seed, names) in [(&seeds[3], false), (&seeds[4], true)] {
        let request = ExtenderArgs::decode(seed, 100).unwrap();
        assert_eq!(
            matches!(request.candidates, Candidates::Names(_)),
            names,
            "{request:?}"
        );
        let (standalone, cached) = states();
        let state = if names { cached } else { standalone };
        let result = answer_filter(state, request, now()).unwrap();
        // The training pod rejects the five nodes without a matching current certificate.
        assert!(
            !result.failed_nodes.is_empty() || !result.failed_and_unresolvable_nodes.is_empty(),
            "{result:?}"
        );
    }
}
