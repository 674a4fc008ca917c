//! Property-based fuzzing of the node guard's decoder of outside input (issue #14): the
//! AdmissionReview body `/validate-nodes` reads ([`review::decode`], then both Nodes and the
//! requester in it through [`admit_node`]). Mutations of Node reviews as the API server
//! sends them (a prober publishing, a tenant labelling, a kubelet registering, a status
//! update) and raw bytes: no panic, every rejection a clear error, every answer a valid
//! AdmissionReview for the request's uid, a denial always with its reason.
//!
//! `RAILGUARD_FUZZ_CASES=1000000 cargo test --release -p railguard-webhook --test
//! node_guard_fuzz` is the benchmark-style run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use fuzz_support::{
    check_error, check_message, config, json_dictionary, mutated, raw_bytes, raw_text, JSON_SYNTAX,
};
use proptest::prelude::*;
use railguard_webhook::node_guard::{admit_node, GuardPolicy, NodeView, PodLookup, ProberPod};
use railguard_webhook::review::decode;
use serde_json::{json, Value};

/// A Node review's own tokens, for [`TOKENS`] after [`JSON_SYNTAX`].
const NODE_REVIEW_TOKENS: &[&str] = &[
    "\"uid\":\"\"",
    "\"operation\":\"UPDATE\"",
    "\"operation\":\"CREATE\"",
    "\"operation\":\"DELETE\"",
    "\"subResource\":\"status\"",
    "\"kind\":\"Pod\"",
    "\"object\":null",
    "\"oldObject\":null",
    "\"userInfo\":null",
    "\"extra\":",
    "\"groups\":[\"system:masters\"]",
    "\"authentication.kubernetes.io/pod-name\":[]",
    "\"authentication.kubernetes.io/pod-name\":[\"a\",\"b\"]",
    "\"username\":\"system:serviceaccount:railguard:railguard-campaign\"",
    "\"username\":\"system:serviceaccount:railguard:railguard-fleet\"",
    "\"railguard.io/fabric\":\"certified\"",
    "\"railguard.io/profile\":",
    "\"railguard.io/certificate\":",
    "\"railguard.io/certificate\":\"{}\"",
    "\"type\":\"RailguardFabricReady\"",
    "\"type\":\"RailguardFleetOutlier\"",
    "\"conditions\":",
    "\"labels\":null",
    "\\u0000",
    "\\ud800",
];

const TOKENS: &[&str] =
    &json_dictionary::<{ JSON_SYNTAX.len() + NODE_REVIEW_TOKENS.len() }>(NODE_REVIEW_TOKENS);

fn policy() -> GuardPolicy {
    GuardPolicy {
        namespace: "railguard".into(),
        prober_namespace: "railguard".into(),
        prober_service_account: "railguard-prober".into(),
        campaign_service_account: Some("railguard-campaign".into()),
        fleet_service_account: Some("railguard-fleet".into()),
        allowed_groups: vec!["system:masters".into()],
    }
}

fn node(fabric: Option<&str>, condition: Option<&str>) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": "gpu-a"});
    let mut annotations = json!({});
    if let Some(f) = fabric {
        labels["railguard.io/fabric"] = json!(f);
        labels["railguard.io/profile"] = json!("h100-ndr");
        annotations["railguard.io/certificate"] = json!(json!({
            "version": 1, "generation": 1, "issuedAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2026-01-02T00:00:00Z", "profile": "h100-ndr", "signature": "s",
            "verdict": f, "rails": []
        })
        .to_string());
    }
    let mut conditions = vec![json!({"type": "Ready", "status": "True"})];
    if let Some(status) = condition {
        conditions.push(json!({"type": "RailguardFabricReady", "status": status,
                               "reason": "Certified", "message": "m"}));
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-a", "labels": labels, "annotations": annotations},
        "status": {"conditions": conditions},
    })
}

fn review(operation: &str, user: Value, object: Value, old: Value, sub: Option<&str>) -> Vec<u8> {
    let mut request = json!({
        "uid": "0b7d5a0e-6a36-4b8f-9b36-3c6a1d2f4e11",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": "gpu-a", "operation": operation, "userInfo": user,
        "object": object, "oldObject": old, "dryRun": false,
    });
    if let Some(s) = sub {
        request["subResource"] = json!(s);
    }
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request,
    }))
    .unwrap()
}

fn seeds() -> Vec<Vec<u8>> {
    let prober = json!({
        "username": "system:serviceaccount:railguard:railguard-prober",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prober-a"],
                  "authentication.kubernetes.io/pod-uid": ["uid-a"]},
    });
    let tenant = json!({"username": "alice", "groups": ["system:authenticated"]});
    let kubelet = json!({"username": "system:node:gpu-a", "groups": ["system:nodes"]});
    let campaign = json!({"username": "system:serviceaccount:railguard:railguard-campaign"});
    let fleet = json!({"username": "system:serviceaccount:railguard:railguard-fleet"});
    let mut outlier = node(Some("certified"), Some("True"));
    outlier["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "RailguardFleetOutlier", "status": "True",
                     "reason": "Outlier", "message": "m"}));
    vec![
        review(
            "UPDATE",
            prober,
            node(Some("certified"), None),
            node(None, None),
            None,
        ),
        review(
            "UPDATE",
            tenant,
            node(Some("certified"), None),
            node(None, None),
            None,
        ),
        review(
            "CREATE",
            kubelet.clone(),
            node(Some("certified"), None),
            Value::Null,
            None,
        ),
        review(
            "UPDATE",
            kubelet,
            node(None, Some("True")),
            node(None, Some("False")),
            Some("status"),
        ),
        review(
            "UPDATE",
            campaign,
            node(Some("degraded"), Some("False")),
            node(Some("certified"), Some("True")),
            None,
        ),
        review(
            "UPDATE",
            fleet,
            outlier,
            node(Some("certified"), Some("True")),
            Some("status"),
        ),
    ]
}

/// Decodes and decides a body as `/validate-nodes` does.
fn property(body: &[u8], pod_on_a: bool, cached: bool) -> Result<(), TestCaseError> {
    let request = match decode(body) {
        Ok(r) => r,
        Err(e) => return check_error(&e),
    };
    let lookup = |_: &str| {
        if pod_on_a {
            PodLookup::Found(ProberPod {
                uid: Some("uid-a".into()),
                node_name: Some("gpu-a".into()),
                service_account: Some("railguard-prober".into()),
            })
        } else {
            PodLookup::Missing
        }
    };
    let current =
        |_: &str| cached.then(|| serde_json::from_value::<NodeView>(node(None, None)).unwrap());
    let admission = admit_node(&request, &policy(), lookup, current, |_| None);
    let response = &admission.response;
    prop_assert_eq!(&response.uid, &request.uid);
    prop_assert_eq!(response.allowed, response.denial.is_none());
    if let Some(denial) = &response.denial {
        let reason = denial
            .strip_prefix("railguard node guard: ")
            .unwrap_or(denial);
        check_message(reason)?;
        prop_assert!(matches!(admission.outcome, "denied" | "malformed"));
    }
    let out: Value = serde_json::from_slice(&response.encode())
        .map_err(|e| TestCaseError::fail(format!("answer is not JSON: {e}")))?;
    prop_assert_eq!(&out["response"]["uid"], &json!(request.uid));
    prop_assert_eq!(&out["response"]["allowed"], &json!(response.allowed));
    Ok(())
}

proptest! {
    #![proptest_config(config(3_000))]

    #[test]
    fn node_review_mutations(
        body in mutated(seeds(), TOKENS, 6),
        pod_on_a in any::<bool>(),
        cached in any::<bool>(),
    ) {
        property(&body, pod_on_a, cached)?;
    }

    #[test]
    fn node_review_raw(body in prop_oneof![
        raw_bytes(1024),
        raw_text(TOKENS).prop_map(String::into_bytes),
    ]) {
        property(&body, true, false)?;
    }
}

#[test]
fn seeds_are_decided_as_the_contract_says() {
    let outcomes: Vec<&str> = seeds()
        .iter()
        .map(|body| {
            let request = decode(body).unwrap();
            let on_a = |_: &str| {
                PodLookup::Found(ProberPod {
                    uid: Some("uid-a".into()),
                    node_name: Some("gpu-a".into()),
                    service_account: Some("railguard-prober".into()),
                })
            };
            admit_node(&request, &policy(), on_a, |_| None, |_| None).outcome
        })
        .collect();
    // The prober publishes; a tenant and a registering kubelet are refused; a kubelet
    // changing railguard's condition is refused; the campaign records a finding; the fleet
    // controller marks an outlier.
    assert_eq!(
        outcomes,
        ["allowed", "denied", "denied", "denied", "allowed", "allowed"]
    );
}
