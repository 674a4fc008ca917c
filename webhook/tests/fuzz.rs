//! Property-based fuzzing of the webhook's decoders of outside input (issue #14): the
//! AdmissionReview body the `/mutate` handler reads ([`review::decode`], then the Pod in it
//! through [`review::admit`]) and the pod's Multus networks annotation. Mutations of the
//! recorded kube-apiserver review (and of a GPU training pod built on it) and raw bytes; no
//! panic, every rejection a clear error, every answer a valid AdmissionReview whose patch
//! applies to the pod and leaves a Pod.
//!
//! `RAILGUARD_FUZZ_CASES=1000000 cargo test --release -p railguard-webhook --test fuzz` is
//! the benchmark-style run of BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use std::sync::{Arc, OnceLock};

use fuzz_support::{
    check_error, config, json_dictionary, mutated, mutated_text, raw_bytes, raw_text, JSON_SYNTAX,
};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use railguard_webhook::decisions::{CacheLimits, DecisionCache};
use railguard_webhook::networks::{merge, NetworksAnnotation};
use railguard_webhook::review::{admit, admit_cached, decode};
use railguard_webhook::ProfileSet;
use railguard_webhook::{FailureMode, NamespaceInfo, WebhookConfig};
use serde_json::{json, Value};

const SAMPLE: &str = include_str!("../fixtures/admission-review-sample.json");
const H100: &str = include_str!("../../api/fixtures/profiles/dgx-h100-ndr.yaml");
const ROCE: &str = include_str!("../../api/fixtures/profiles/roce-cloud.yaml");

/// An AdmissionReview's own tokens, for [`REVIEW_TOKENS`] after [`JSON_SYNTAX`].
const POD_REVIEW_TOKENS: &[&str] = &[
    "false",
    "\"uid\":\"\"",
    "\"operation\":\"UPDATE\"",
    "\"operation\":\"CREATE\"",
    "\"subResource\":\"status\"",
    "\"apiVersion\":\"admission.k8s.io/v1beta1\"",
    "\"kind\":\"Pod\"",
    "\"object\":",
    "\"object\":null",
    "\"request\":null",
    "\"dryRun\":\"yes\"",
    "\"resources\":",
    "\"nvidia.com/gpu\":\"-8\"",
    "\"nvidia.com/gpu\":\"1e9\"",
    "\"limits\":",
    "\"env\":",
    "\"railguard.io/profile\":",
    "\"railguard.io/skip\":\"all\"",
    "\"volumes\":",
    "\"k8s.v1.cni.cncf.io/networks\":",
    "\"containers\":[]",
    "\"initContainers\":",
    "\"securityContext\":",
    "\"capabilities\":",
    "\"IPC_LOCK\"",
    "\"/dev/shm\"",
    "\"NCCL_IB_HCA\"",
    "\"NCCL_SOCKET_IFNAME\"",
    "\\u0000",
    "\\ud800",
];

const REVIEW_TOKENS: &[&str] =
    &json_dictionary::<{ JSON_SYNTAX.len() + POD_REVIEW_TOKENS.len() }>(POD_REVIEW_TOKENS);

const NETWORK_TOKENS: &[&str] = &[
    ",",
    "/",
    "@",
    "[",
    "]",
    "{",
    "}",
    "\"name\":",
    "\"namespace\":",
    "\"interface\":",
    "\"",
    "gpu-rdma/sriov-rdma-0",
    "net-a",
    "other-ns/net-b@eth1",
    " ",
    "null",
];

/// The recorded review, and the same review of a GPU training pod for the H100 profile with
/// its own NCCL env, networks and shm volume (so the mutation steps run on fuzzed input).
fn seeds() -> Vec<Vec<u8>> {
    let recorded: Value = serde_json::from_str(SAMPLE).unwrap();
    let mut training = recorded.clone();
    let pod = &mut training["request"]["object"];
    pod["metadata"]["annotations"] = json!({
        "railguard.io/profile": "h100-ndr",
        "k8s.v1.cni.cncf.io/networks": "gpu-rdma/sriov-rdma-0, other@eth1",
    });
    pod["metadata"]["namespace"] = json!("ml");
    pod["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": "8", "memory": "64Gi"}});
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_3"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "NCCL_NET_GDR_LEVEL", "value": "0"},
    ]);
    pod["spec"]["volumes"] = json!([{"name": "dshm", "emptyDir": {"medium": "Memory"}}]);
    pod["spec"]["initContainers"] = json!([{"name": "init", "image": "busybox"}]);
    vec![
        SAMPLE.as_bytes().to_vec(),
        serde_json::to_vec(&recorded).unwrap(),
        serde_json::to_vec(&training).unwrap(),
        serde_json::to_vec_pretty(&training).unwrap(),
    ]
}

/// The profiles, parsed once (not per case).
fn profiles() -> &'static ProfileSet {
    static PROFILES: OnceLock<ProfileSet> = OnceLock::new();
    PROFILES.get_or_init(|| {
        Arc::new(
            [H100, ROCE]
                .iter()
                .flat_map(|y| railguard_api::profiles_from_yaml(y).unwrap())
                .collect(),
        )
    })
}

/// One decision cache for every case, as the server keeps one for every review; small, so
/// entries are evicted and replaced as well as hit.
fn cache() -> &'static DecisionCache {
    static CACHE: OnceLock<DecisionCache> = OnceLock::new();
    CACHE.get_or_init(|| {
        DecisionCache::new(CacheLimits {
            max_entries: 8,
            ..CacheLimits::default()
        })
    })
}

/// Decodes a body as the `/mutate` handler does and decides it; the answer is a valid
/// AdmissionReview for the request's uid, its patch applies to the pod and leaves a Pod, and
/// deciding it through the decision cache answers the same.
fn review_property(
    body: &[u8],
    profiles: &ProfileSet,
    mode: FailureMode,
) -> Result<(), TestCaseError> {
    let request = match decode(body) {
        Ok(r) => r,
        Err(e) => return check_error(&e),
    };
    prop_assert!(!request.uid.is_empty());
    let namespace = NamespaceInfo::new(request.namespace.clone().unwrap_or_default());
    let admission = admit(
        &request,
        &namespace,
        profiles,
        &WebhookConfig::default(),
        mode,
    );
    let cached = admit_cached(
        &request,
        &namespace,
        profiles,
        &WebhookConfig::default(),
        mode,
        cache(),
    );
    prop_assert_eq!(&cached.response, &admission.response);
    prop_assert_eq!(
        (
            cached.outcome,
            &cached.profile,
            &cached.warning_kinds,
            &cached.error
        ),
        (
            admission.outcome,
            &admission.profile,
            &admission.warning_kinds,
            &admission.error
        )
    );
    let response = &admission.response;
    prop_assert_eq!(&response.uid, &request.uid);
    if let Some(e) = &admission.error {
        fuzz_support::check_message(e)?;
        prop_assert_eq!(response.allowed, mode == FailureMode::Open);
    }
    if let Some(denial) = &response.denial {
        prop_assert!(!denial.trim().is_empty());
        prop_assert!(!response.allowed);
    }
    let out: Value = serde_json::from_slice(&response.encode())
        .map_err(|e| TestCaseError::fail(format!("answer is not JSON: {e}")))?;
    prop_assert_eq!(&out["response"]["uid"], &json!(request.uid));
    if let Some(patch) = &response.patch {
        let patch: json_patch::Patch = serde_json::from_slice(patch)
            .map_err(|e| TestCaseError::fail(format!("patch is not a JSON patch: {e}")))?;
        let object = request.object.expect("a patch needs an object");
        // serde_json's RawValue (and a Pod's unknown fields) skip strings without checking
        // every escape, so a mutated object may not parse as a Value; kube-apiserver never
        // sends one, and the patch applies to the object it holds: nothing to check here.
        let Ok(mut doc) = serde_json::from_str::<Value>(object.get()) else {
            return Ok(());
        };
        // (A Pod object without `metadata` is covered too: see
        // `patch_for_a_pod_without_metadata_applies` below.)
        if doc.get("metadata").is_none_or(Value::is_object) {
            json_patch::patch(&mut doc, &patch).map_err(|e| {
                TestCaseError::fail(format!(
                    "patch does not apply: {e}; body {:?}",
                    String::from_utf8_lossy(body)
                ))
            })?;
            serde_json::from_value::<Pod>(doc)
                .map_err(|e| TestCaseError::fail(format!("patched object is not a Pod: {e}")))?;
        }
    }
    Ok(())
}

/// Parses a networks annotation; merging the profile's networks into it keeps it parseable,
/// lists every wanted network, and a second merge adds nothing.
fn networks_property(text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = NetworksAnnotation::parse(text) {
        return check_error(&e);
    }
    let wanted = vec![
        "gpu-rdma/sriov-rdma-0".to_string(),
        "gpu-rdma/sriov-rdma-1".to_string(),
    ];
    match merge(Some(text), &wanted, "ml") {
        Ok(Some(merged)) => {
            NetworksAnnotation::parse(&merged).map_err(|e| {
                TestCaseError::fail(format!("merged {merged:?} does not parse: {e}"))
            })?;
            let again = merge(Some(&merged), &wanted, "ml")
                .map_err(|e| TestCaseError::fail(format!("second merge of {merged:?}: {e}")))?;
            prop_assert_eq!(again, None, "second merge of {:?} added networks", merged);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => check_error(&e),
    }
}

proptest! {
    #![proptest_config(config(3_000))]

    #[test]
    fn admission_review_mutations(
        body in mutated(seeds(), REVIEW_TOKENS, 6),
        closed in any::<bool>(),
    ) {
        let mode = if closed { FailureMode::Closed } else { FailureMode::Open };
        review_property(&body, profiles(), mode)?;
    }

    #[test]
    fn admission_review_raw(body in prop_oneof![
        raw_bytes(1024),
        raw_text(REVIEW_TOKENS).prop_map(String::into_bytes),
    ]) {
        review_property(&body, profiles(), FailureMode::Closed)?;
    }

    #[test]
    fn networks_annotation(text in prop_oneof![
        mutated_text(
            &[
                "gpu-rdma/sriov-rdma-0, other-ns/net-b@eth1",
                r#"[{"name":"net-a","namespace":"gpu-rdma","interface":"eth1"},{"name":"b"}]"#,
            ],
            NETWORK_TOKENS,
            4,
        ),
        raw_text(NETWORK_TOKENS),
    ]) {
        networks_property(&text)?;
    }
}

#[test]
fn seeds_are_admitted() {
    let profiles = profiles();
    for seed in seeds() {
        review_property(&seed, profiles, FailureMode::Closed).unwrap();
    }
    // The compact and the pretty training seed are one pod: the second was answered from the
    // decision cache, so the comparison above ran on a hit.
    assert!(cache().counts().0 >= 1, "{:?}", cache().counts());
    // The training seed is configured (a patch), so the patch checks above ran on it.
    let training = seeds().remove(2);
    let request = decode(&training).unwrap();
    let admission = admit(
        &request,
        &NamespaceInfo::new("ml"),
        profiles,
        &WebhookConfig::default(),
        FailureMode::Closed,
    );
    assert!(admission.response.patch.is_some(), "{admission:?}");
}

/// Found by `admission_review_mutations`: the patch for a training pod whose object has no
/// `metadata` added under `/metadata/annotations`, a path the object does not have, so the
/// API server could not apply it; the mutation now adds `/metadata` itself.
#[test]
fn patch_for_a_pod_without_metadata_applies() {
    let mut review: Value = serde_json::from_slice(&seeds()[2]).unwrap();
    let object = review["request"]["object"].as_object_mut().unwrap();
    object.remove("metadata").unwrap();
    let body = serde_json::to_vec(&review).unwrap();
    let request = decode(&body).unwrap();
    let admission = admit(
        &request,
        &NamespaceInfo::new("ml"),
        profiles(),
        &WebhookConfig::default(),
        FailureMode::Closed,
    );
    let patch: json_patch::Patch =
        serde_json::from_slice(admission.response.patch.as_deref().unwrap()).unwrap();
    let mut doc: Value = serde_json::from_str(request.object.unwrap().get()).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
}
