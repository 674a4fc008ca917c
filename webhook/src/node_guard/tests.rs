#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use railguard_api::keys;
use serde_json::{json, Value};

use super::*;
use crate::review::{self, UserInfo};

const NS: &str = "railguard";
const PROBER: &str = "railguard-prober";
const CAMPAIGN: &str = "railguard-campaign";
const FLEET: &str = "railguard-fleet";

fn policy() -> GuardPolicy {
    GuardPolicy {
        namespace: NS.into(),
        prober_namespace: NS.into(),
        prober_service_account: PROBER.into(),
        campaign_service_account: Some(CAMPAIGN.into()),
        fleet_service_account: Some(FLEET.into()),
        allowed_groups: vec!["system:masters".into()],
    }
}

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        username: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..UserInfo::default()
    }
}

/// The prober's identity with a token bound to `pod`.
fn prober(pod: &str) -> UserInfo {
    let mut u = user(
        &format!("system:serviceaccount:{NS}:{PROBER}"),
        &["system:serviceaccounts", "system:authenticated"],
    );
    u.extra = BTreeMap::from([
        (decision::EXTRA_POD_NAME.into(), vec![pod.into()]),
        (decision::EXTRA_POD_UID.into(), vec![format!("uid-{pod}")]),
    ]);
    u
}

fn campaign() -> UserInfo {
    user(&format!("system:serviceaccount:{NS}:{CAMPAIGN}"), &[])
}

fn fleet() -> UserInfo {
    user(
        &format!("system:serviceaccount:{NS}:{FLEET}"),
        &["system:serviceaccounts", "system:authenticated"],
    )
}

fn pod_on(node: &str, pod: &str) -> PodLookup {
    PodLookup::Found(ProberPod {
        uid: Some(format!("uid-{pod}")),
        node_name: Some(node.into()),
        service_account: Some(PROBER.into()),
    })
}

fn certificate(profile: &str, signature: &str, verdict: &str) -> String {
    json!({
        "version": 1, "generation": 3,
        "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-02T00:00:00Z",
        "profile": profile, "signature": signature, "verdict": verdict,
        "reasons": [], "rails": [], "gpus": []
    })
    .to_string()
}

fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)], conditions: Value) -> NodeView {
    let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    serde_json::from_value(json!({
        "metadata": {"name": "gpu-a", "labels": map(labels), "annotations": map(annotations)},
        "status": {"conditions": conditions},
    }))
    .unwrap()
}

fn certified() -> NodeView {
    node(
        &[
            (keys::LABEL_FABRIC, "certified"),
            (keys::LABEL_PROFILE, "h100"),
            (keys::LABEL_SIGNATURE, "abc"),
            ("kubernetes.io/hostname", "gpu-a"),
        ],
        &[(
            keys::ANNOTATION_CERTIFICATE,
            &certificate("h100", "abc", "certified"),
        )],
        json!([{"type": "Ready", "status": "True"},
               {"type": keys::CONDITION_FABRIC_READY, "status": "True", "reason": "Certified"}]),
    )
}

fn bare() -> NodeView {
    node(
        &[("kubernetes.io/hostname", "gpu-a")],
        &[],
        json!([{"type": "Ready", "status": "True"}]),
    )
}

fn with_label(mut n: NodeView, k: &str, v: Option<&str>) -> NodeView {
    let labels = n.metadata.labels.get_or_insert_with(BTreeMap::new);
    match v {
        Some(v) => labels.insert(k.into(), v.into()),
        None => labels.remove(k),
    };
    n
}

/// `n` with its RailguardFleetOutlier condition set to `status` (None: removed).
fn with_outlier(mut n: NodeView, status: Option<&str>) -> NodeView {
    let conditions = n
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    conditions.retain(|c| c["type"] != keys::CONDITION_FLEET_OUTLIER);
    if let Some(status) = status {
        conditions.push(json!({
            "type": keys::CONDITION_FLEET_OUTLIER, "status": status, "reason": "Outlier",
            "message": "rail mlx5_3 host write 320 Gb/s, median 380 Gb/s",
        }));
    }
    n
}

fn with_annotation(mut n: NodeView, k: &str, v: &str) -> NodeView {
    n.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(k.into(), v.into());
    n
}

/// `who` updating gpu-a from `old` to `new`, within the test certificates' validity.
fn update_by<'a>(old: &'a NodeView, new: &'a NodeView, who: &'a UserInfo) -> NodeChange<'a> {
    NodeChange {
        node: "gpu-a",
        old: Some(old),
        new,
        user: who,
        now: before_expiry(),
    }
}

fn decide_update(old: &NodeView, new: &NodeView, who: &UserInfo, pods: PodLookup) -> Decision {
    decide(update_by(old, new, who), &policy(), |_| pods)
}

/// Within the test certificates' validity (they expire 2026-01-02).
fn before_expiry() -> jiff::Timestamp {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

fn no_cache(_: &str) -> Option<NodeView> {
    None
}

fn never(_: &str) -> PodLookup {
    panic!("no pod lookup expected")
}

fn no_profile(_: &str) -> Option<bool> {
    None
}

/// `body` admitted under [`policy`] where neither a pod, the cache nor a profile is asked.
fn admit_without_lookups(body: &[u8]) -> NodeAdmission {
    let request = review::decode(body).unwrap();
    admit_node(&request, &policy(), never, no_cache, no_profile)
}

fn denial(d: Decision) -> Denial {
    match d {
        Decision::Denied(d) => d,
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[test]
fn only_protected_outputs_count_as_changes() {
    let old = certified();
    assert!(changed_outputs(Some(&old), &old).is_empty());
    let relabelled = with_label(old.clone(), "team", Some("ml"));
    let recertify = with_annotation(old.clone(), keys::ANNOTATION_RECERTIFY, "now");
    let pool = with_label(old.clone(), "railguard.io/pool", Some("strict"));
    let endpoint = with_annotation(old.clone(), "railguard.io/peer-endpoint", "10.0.0.1:7470");
    for new in [relabelled, recertify, pool, endpoint] {
        assert!(changed_outputs(Some(&old), &new).is_empty(), "{new:?}");
    }
    let failed = with_label(old.clone(), keys::LABEL_FABRIC, Some("failed"));
    assert_eq!(
        changed_outputs(Some(&old), &failed),
        [Output::Label(keys::LABEL_FABRIC)]
    );
    let mut no_condition = old.clone();
    no_condition.status = None;
    assert_eq!(
        changed_outputs(Some(&old), &no_condition),
        [Output::Condition(keys::CONDITION_FABRIC_READY)]
    );
    let marked = with_outlier(old.clone(), Some("True"));
    assert_eq!(
        changed_outputs(Some(&old), &marked),
        [Output::Condition(keys::CONDITION_FLEET_OUTLIER)]
    );
    assert!(changed_outputs(Some(&marked), &marked.clone()).is_empty());
    // A CREATE: everything present is a change.
    let simulated = with_label(old.clone(), keys::LABEL_SIMULATED, Some("true"));
    assert_eq!(
        changed_outputs(None, &simulated),
        decision::PROBER_MAY_CHANGE
    );
    let marked = with_label(marked, keys::LABEL_SIMULATED, Some("true"));
    assert_eq!(changed_outputs(None, &marked), PROTECTED);
    assert!(changed_outputs(None, &bare()).is_empty());
}

#[test]
fn anyone_may_change_what_is_not_railguard_certification() {
    let old = certified();
    for who in [
        user("alice", &["system:authenticated"]),
        user("system:node:gpu-a", &["system:nodes"]),
        prober("prober-b"),
    ] {
        let new = with_annotation(old.clone(), keys::ANNOTATION_RECERTIFY, "1");
        let change = update_by(&old, &new, &who);
        assert_eq!(decide(change, &policy(), never), Decision::Untouched);
    }
}

#[test]
fn the_prober_of_the_node_may_publish_its_certificate() {
    let old = bare();
    let new = certified();
    let d = decide_update(&old, &new, &prober("p-a"), pod_on("gpu-a", "p-a"));
    assert_eq!(
        d,
        Decision::Allowed(Writer::OwnProber { pod: "p-a".into() })
    );
}

#[test]
fn the_prober_of_another_node_is_denied() {
    let d = denial(decide_update(
        &bare(),
        &certified(),
        &prober("p-b"),
        pod_on("gpu-b", "p-b"),
    ));
    assert!(matches!(d, Denial::ProberOfOtherNode { .. }), "{d:?}");
    let message = d.to_string();
    assert!(
        message.contains("runs on node gpu-b, not gpu-a"),
        "{message}"
    );
}

#[test]
fn a_prober_token_must_be_bound_to_a_known_pod_of_the_prober() {
    let mut unbound = prober("p-a");
    unbound.extra.clear();
    let d = denial(decide_update(
        &bare(),
        &certified(),
        &unbound,
        PodLookup::Missing,
    ));
    assert_eq!(d, Denial::ProberTokenNotBound);

    let d = denial(decide_update(
        &bare(),
        &certified(),
        &prober("p-a"),
        PodLookup::Missing,
    ));
    assert!(matches!(d, Denial::ProberPodUnknown { .. }), "{d:?}");
    let d = denial(decide_update(
        &bare(),
        &certified(),
        &prober("p-a"),
        PodLookup::NotSynced,
    ));
    assert!(d.to_string().contains("retry shortly"), "{d}");

    // A pod by that name but another uid (deleted and recreated), another service account
    // (labels copied by someone who may create pods there), or not scheduled yet.
    let recreated = PodLookup::Found(ProberPod {
        uid: Some("uid-other".into()),
        node_name: Some("gpu-a".into()),
        service_account: Some(PROBER.into()),
    });
    let d = denial(decide_update(
        &bare(),
        &certified(),
        &prober("p-a"),
        recreated,
    ));
    assert!(matches!(d, Denial::ProberPodUidMismatch { .. }), "{d:?}");
    let impostor = PodLookup::Found(ProberPod {
        uid: Some("uid-p-a".into()),
        node_name: Some("gpu-a".into()),
        service_account: Some("default".into()),
    });
    let d = denial(decide_update(
        &bare(),
        &certified(),
        &prober("p-a"),
        impostor,
    ));
    assert!(matches!(d, Denial::ProberPodServiceAccount { .. }), "{d:?}");
    let pending = PodLookup::Found(ProberPod {
        uid: Some("uid-p-a".into()),
        node_name: None,
        service_account: Some(PROBER.into()),
    });
    let d = denial(decide_update(
        &bare(),
        &certified(),
        &prober("p-a"),
        pending,
    ));
    assert!(matches!(d, Denial::ProberPodUnscheduled { .. }), "{d:?}");

    // 1.30+: the token names the pod's node as well.
    let mut elsewhere = prober("p-a");
    elsewhere
        .extra
        .insert(decision::EXTRA_NODE_NAME.into(), vec!["gpu-b".into()]);
    let d = denial(decide_update(
        &bare(),
        &certified(),
        &elsewhere,
        pod_on("gpu-a", "p-a"),
    ));
    assert!(matches!(d, Denial::TokenOfOtherNode { .. }), "{d:?}");
}

#[test]
fn tenants_kubelets_and_other_service_accounts_are_denied() {
    let old = bare();
    let labelled = with_label(old.clone(), keys::LABEL_FABRIC, Some("certified"));
    for who in [
        user("alice", &["system:authenticated"]),
        user("system:node:gpu-a", &["system:nodes"]),
        user(
            "system:serviceaccount:ml:default",
            &["system:serviceaccounts"],
        ),
        // The prober's service account name in another namespace.
        user(
            &format!("system:serviceaccount:ml:{PROBER}"),
            &["system:serviceaccounts"],
        ),
        user("", &[]),
    ] {
        let d = denial(decide_update(&old, &labelled, &who, PodLookup::Missing));
        let message = d.to_string();
        assert!(matches!(d, Denial::NotAWriter { .. }), "{d:?}");
        assert!(
            message.contains("label railguard.io/fabric") && message.contains("gpu-a"),
            "{message}"
        );
    }
}

#[test]
fn allowed_groups_may_repair_anything_and_nothing_else_creates_certified_nodes() {
    let admin = user("admin", &["system:masters"]);
    let change = NodeChange {
        node: "gpu-a",
        old: None,
        new: &certified(),
        user: &admin,
        now: before_expiry(),
    };
    assert_eq!(
        decide(change, &policy(), never),
        Decision::Allowed(Writer::AllowedGroup {
            group: "system:masters".into()
        })
    );
    for who in [
        user("system:node:gpu-a", &["system:nodes"]),
        prober("p-a"),
        campaign(),
    ] {
        let change = NodeChange {
            node: "gpu-a",
            old: None,
            new: &certified(),
            user: &who,
            now: before_expiry(),
        };
        let d = denial(decide(change, &policy(), never));
        assert!(matches!(d, Denial::CreatedCertified { .. }), "{d:?}");
    }
    // Without the default group, an admin is like anyone else.
    let strict = GuardPolicy {
        allowed_groups: Vec::new(),
        ..policy()
    };
    let old = certified();
    let new = with_label(old.clone(), keys::LABEL_FABRIC, Some("failed"));
    let change = update_by(&old, &new, &admin);
    assert!(matches!(
        decide(change, &strict, never),
        Decision::Denied(Denial::NotAWriter { .. })
    ));
}

#[test]
fn the_campaign_records_findings_but_not_what_a_node_is_certified_for() {
    let old = certified();
    let degraded = with_annotation(
        with_label(old.clone(), keys::LABEL_FABRIC, Some("degraded")),
        keys::ANNOTATION_CERTIFICATE,
        &certificate("h100", "abc", "degraded"),
    );
    assert_eq!(
        decide_update(&old, &degraded, &campaign(), PodLookup::Missing),
        Decision::Allowed(Writer::Campaign)
    );

    let other_profile = with_label(old.clone(), keys::LABEL_PROFILE, Some("a100"));
    let d = denial(decide_update(
        &old,
        &other_profile,
        &campaign(),
        PodLookup::Missing,
    ));
    assert!(matches!(d, Denial::CampaignBeyondFindings { .. }), "{d:?}");

    let relaid = with_annotation(
        old.clone(),
        keys::ANNOTATION_CERTIFICATE,
        &certificate("h100", "zzz", "certified"),
    );
    let d = denial(decide_update(
        &old,
        &relaid,
        &campaign(),
        PodLookup::Missing,
    ));
    assert!(d.to_string().contains("signature (abc to zzz)"), "{d}");

    // No certificate to record findings in: the campaign does not issue one.
    let issued = with_annotation(
        bare(),
        keys::ANNOTATION_CERTIFICATE,
        &certificate("h100", "abc", "certified"),
    );
    let d = denial(decide_update(
        &bare(),
        &issued,
        &campaign(),
        PodLookup::Missing,
    ));
    assert!(
        d.to_string().contains("current node has no certificate"),
        "{d}"
    );

    let garbage = with_annotation(old.clone(), keys::ANNOTATION_CERTIFICATE, "{not json");
    let d = denial(decide_update(
        &old,
        &garbage,
        &campaign(),
        PodLookup::Missing,
    ));
    assert!(d.to_string().contains("does not parse"), "{d}");
}

/// The chart's split install (`prober.namespace.name`): the probers and the campaign in a
/// `privileged` Pod Security namespace of their own, the fleet controller with the webhook
/// in the (restricted) release namespace.
const PROBER_NS: &str = "railguard-probers";

fn split_policy() -> GuardPolicy {
    GuardPolicy {
        prober_namespace: PROBER_NS.into(),
        ..policy()
    }
}

fn decide_split(old: &NodeView, new: &NodeView, who: &UserInfo, pods: PodLookup) -> Decision {
    decide(update_by(old, new, who), &split_policy(), |_| pods)
}

/// `who` under another name, with the same groups and token attributes.
fn renamed(who: UserInfo, username: String) -> UserInfo {
    UserInfo { username, ..who }
}

#[test]
fn with_the_probers_in_their_own_namespace_only_its_accounts_certify() {
    let policy = split_policy();
    assert_eq!(
        policy.prober_user(),
        format!("system:serviceaccount:{PROBER_NS}:{PROBER}")
    );
    assert_eq!(
        policy.campaign_user(),
        Some(format!("system:serviceaccount:{PROBER_NS}:{CAMPAIGN}"))
    );
    // The fleet controller stays in the release namespace.
    assert_eq!(
        policy.fleet_user(),
        Some(format!("system:serviceaccount:{NS}:{FLEET}"))
    );

    let split_prober = |pod: &str| {
        renamed(
            prober(pod),
            format!("system:serviceaccount:{PROBER_NS}:{PROBER}"),
        )
    };
    let (old, new) = (bare(), certified());
    assert_eq!(
        decide_split(&old, &new, &split_prober("p-a"), pod_on("gpu-a", "p-a")),
        Decision::Allowed(Writer::OwnProber { pod: "p-a".into() })
    );
    // The same account name in the release namespace is not the prober any more: a pod of
    // the restricted namespace, whatever its labels and token, certifies nothing.
    let release_prober = prober("p-a");
    assert!(!policy.is_prober(&release_prober));
    let d = denial(decide_split(
        &old,
        &new,
        &release_prober,
        pod_on("gpu-a", "p-a"),
    ));
    assert!(matches!(d, Denial::NotAWriter { .. }), "{d:?}");
    let message = d.to_string();
    assert!(
        message.contains(&format!(
            "only the node's own railguard prober (system:serviceaccount:{PROBER_NS}:{PROBER} \
             in a pod on gpu-a)"
        )),
        "{message}"
    );
    // A pod the cache of the prober namespace does not hold is named in that namespace.
    let d = denial(decide_split(
        &old,
        &new,
        &split_prober("p-a"),
        PodLookup::Missing,
    ));
    assert_eq!(
        d,
        Denial::ProberPodUnknown {
            namespace: PROBER_NS.into(),
            pod: "p-a".into()
        }
    );
    assert!(d.to_string().contains(&format!("{PROBER_NS}/p-a")), "{d}");

    // The campaign likewise: its account in the prober namespace records findings, the
    // release namespace's does not.
    let degraded = with_annotation(
        with_label(new.clone(), keys::LABEL_FABRIC, Some("degraded")),
        keys::ANNOTATION_CERTIFICATE,
        &certificate("h100", "abc", "degraded"),
    );
    let split_campaign = user(
        &format!("system:serviceaccount:{PROBER_NS}:{CAMPAIGN}"),
        &[],
    );
    assert_eq!(
        decide_split(&new, &degraded, &split_campaign, PodLookup::Missing),
        Decision::Allowed(Writer::Campaign)
    );
    let d = denial(decide_split(
        &new,
        &degraded,
        &campaign(),
        PodLookup::Missing,
    ));
    assert!(matches!(d, Denial::NotAWriter { .. }), "{d:?}");

    // The fleet controller's account is the release namespace's, not the prober one's.
    let marked = with_outlier(new.clone(), Some("True"));
    assert_eq!(
        decide_split(&new, &marked, &fleet(), PodLookup::Missing),
        Decision::Allowed(Writer::Fleet)
    );
    let moved_fleet = user(&format!("system:serviceaccount:{PROBER_NS}:{FLEET}"), &[]);
    let d = denial(decide_split(
        &new,
        &marked,
        &moved_fleet,
        PodLookup::Missing,
    ));
    assert!(matches!(d, Denial::NotAWriter { .. }), "{d:?}");
}

#[test]
fn every_protected_output_has_one_writer_besides_break_glass() {
    // The prober's certification and the fleet's outlier mark split the protected outputs;
    // the campaign's findings are part of the certification. The one overlap is the fabric
    // label, which the fleet controller may only flip to pending on expiry (tested above).
    let shared = decision::Output::Label(keys::LABEL_FABRIC);
    for o in PROTECTED {
        let prober = decision::PROBER_MAY_CHANGE.contains(o);
        let fleet = decision::FLEET_MAY_CHANGE.contains(o);
        assert!(prober != fleet || (*o == shared && prober), "{o}");
    }
    for o in decision::PROBER_MAY_CHANGE
        .iter()
        .chain(decision::CAMPAIGN_MAY_CHANGE)
        .chain(decision::FLEET_MAY_CHANGE)
    {
        assert!(PROTECTED.contains(o), "{o}");
    }
    assert!(decision::CAMPAIGN_MAY_CHANGE
        .iter()
        .all(|o| decision::PROBER_MAY_CHANGE.contains(o)));
}

#[test]
fn the_fleet_controller_marks_and_clears_outliers_and_nothing_else() {
    let old = certified();
    let marked = with_outlier(old.clone(), Some("True"));
    assert_eq!(
        decide_update(&old, &marked, &fleet(), PodLookup::Missing),
        Decision::Allowed(Writer::Fleet)
    );
    // Cleared: the status turns False, or the condition goes.
    for cleared in [with_outlier(old.clone(), Some("False")), old.clone()] {
        assert_eq!(
            decide_update(&marked, &cleared, &fleet(), PodLookup::Missing),
            Decision::Allowed(Writer::Fleet)
        );
    }
    assert_eq!(Writer::Fleet.as_str(), "fleet");

    // Not the certificate, the labels or the fabric condition, not even along with its own.
    let failed = with_annotation(
        with_label(marked.clone(), keys::LABEL_FABRIC, Some("failed")),
        keys::ANNOTATION_CERTIFICATE,
        &certificate("h100", "abc", "failed"),
    );
    let mut not_ready = old.clone();
    not_ready.status = None;
    for new in [
        failed,
        with_label(old.clone(), keys::LABEL_SIGNATURE, None),
        not_ready,
    ] {
        let d = denial(decide_update(&old, &new, &fleet(), PodLookup::Missing));
        assert!(matches!(d, Denial::FleetBeyondOutlier { .. }), "{d:?}");
        let message = d.to_string();
        assert!(
            message.contains("only the RailguardFleetOutlier condition of node gpu-a"),
            "{message}"
        );
        assert!(
            !message.contains("condition RailguardFleetOutlier"),
            "{message}"
        );
    }
}

#[test]
fn only_the_fleet_controller_and_break_glass_change_the_outlier_mark() {
    let old = certified();
    let marked = with_outlier(old.clone(), Some("True"));
    // The node's own prober (hiding its node's outlier mark or marking it): refused before
    // its pod is even looked up.
    for (before, after) in [(&old, &marked), (&marked, &old)] {
        let d = denial(decide(
            NodeChange {
                node: "gpu-a",
                old: Some(before),
                new: after,
                user: &prober("p-a"),
                now: before_expiry(),
            },
            &policy(),
            never,
        ));
        assert!(
            matches!(d, Denial::ProberBeyondCertification { .. }),
            "{d:?}"
        );
        assert!(
            d.to_string()
                .contains("not its condition RailguardFleetOutlier"),
            "{d}"
        );
    }
    let d = denial(decide_update(
        &marked,
        &old,
        &campaign(),
        PodLookup::Missing,
    ));
    assert!(matches!(d, Denial::CampaignBeyondFindings { .. }), "{d:?}");

    let tenant = user("alice", &["system:authenticated"]);
    let d = denial(decide_update(&old, &marked, &tenant, PodLookup::Missing));
    assert!(matches!(d, Denial::NotAWriter { .. }), "{d:?}");
    let message = d.to_string();
    assert!(
        message.contains(&format!(
            "only the fleet controller (system:serviceaccount:{NS}:{FLEET}) writes the \
             RailguardFleetOutlier condition"
        )),
        "{message}"
    );
    // Only the fleet's output changed: the certification's writers are not named.
    assert!(!message.contains("prober"), "{message}");
    // Both changed: both named.
    let both = with_label(marked.clone(), keys::LABEL_FABRIC, Some("failed"));
    let message = denial(decide_update(&old, &both, &tenant, PodLookup::Missing)).to_string();
    assert!(
        message.contains("own railguard prober") && message.contains("fleet controller"),
        "{message}"
    );

    // The fleet's name in another namespace, or no fleet controller installed.
    let elsewhere = user(&format!("system:serviceaccount:ml:{FLEET}"), &[]);
    let d = denial(decide_update(&old, &marked, &elsewhere, PodLookup::Missing));
    assert!(matches!(d, Denial::NotAWriter { .. }), "{d:?}");
    let without = GuardPolicy {
        fleet_service_account: None,
        ..policy()
    };
    let change = NodeChange {
        node: "gpu-a",
        old: Some(&old),
        new: &marked,
        user: &fleet(),
        now: before_expiry(),
    };
    let d = denial(decide(change, &without, never));
    assert!(
        d.to_string()
            .contains("fleet controller (none is configured)"),
        "{d}"
    );

    let admin = user("admin", &["system:masters"]);
    assert_eq!(
        decide_update(&marked, &old, &admin, PodLookup::Missing),
        Decision::Allowed(Writer::AllowedGroup {
            group: "system:masters".into()
        })
    );
}

fn review_body(operation: &str, object: Value, old: Value, who: &UserInfo) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "name": "gpu-a",
            "operation": operation,
            "userInfo": {"username": who.username, "groups": who.groups, "extra": who.extra},
            "object": object,
            "oldObject": old,
        }
    }))
    .unwrap()
}

fn node_json(fabric: Option<&str>) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": "gpu-a"});
    if let Some(f) = fabric {
        labels[keys::LABEL_FABRIC] = json!(f);
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a", "labels": labels}})
}

#[test]
fn reviews_are_answered_for_their_uid_with_the_reason() {
    let tenant = user("alice", &["system:authenticated"]);
    let body = review_body(
        "UPDATE",
        node_json(Some("certified")),
        node_json(None),
        &tenant,
    );
    let request = review::decode(&body).unwrap();
    let a = admit_node(&request, &policy(), never, no_cache, no_profile);
    assert_eq!((a.outcome, a.writer), ("denied", "other"));
    assert!(!a.response.allowed);
    let encoded: Value = serde_json::from_slice(&a.response.encode()).unwrap();
    assert_eq!(encoded["response"]["uid"], "u-1");
    assert_eq!(encoded["response"]["status"]["code"], 403);
    let message = encoded["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("railguard node guard: user \"alice\" may not change"),
        "{message}"
    );

    let body = review_body(
        "UPDATE",
        node_json(Some("x")),
        node_json(Some("x")),
        &tenant,
    );
    let a = admit_without_lookups(&body);
    assert_eq!(a.outcome, "untouched");
    assert!(a.response.allowed);

    // The API server sends `"oldObject": null` on CREATE.
    let kubelet = user("system:node:gpu-a", &["system:nodes"]);
    let body = review_body(
        "CREATE",
        node_json(Some("certified")),
        Value::Null,
        &kubelet,
    );
    let a = admit_without_lookups(&body);
    assert_eq!(a.outcome, "denied");
    let body = review_body("CREATE", node_json(None), Value::Null, &kubelet);
    let a = admit_without_lookups(&body);
    assert_eq!(a.outcome, "untouched");

    let body = review_body(
        "UPDATE",
        node_json(Some("certified")),
        node_json(None),
        &prober("p-a"),
    );
    let a = admit_node(
        &review::decode(&body).unwrap(),
        &policy(),
        |name| {
            assert_eq!(name, "p-a");
            pod_on("gpu-a", "p-a")
        },
        no_cache,
        no_profile,
    );
    assert_eq!((a.outcome, a.writer), ("allowed", "prober"));

    // The fleet controller, marking an outlier and then labelling the node.
    let mut marked = node_json(None);
    marked["status"] = json!({"conditions": [
        {"type": keys::CONDITION_FLEET_OUTLIER, "status": "True", "reason": "Outlier"}]});
    let body = review_body("UPDATE", marked, node_json(None), &fleet());
    let a = admit_without_lookups(&body);
    assert_eq!((a.outcome, a.writer), ("allowed", "fleet"));
    let body = review_body(
        "UPDATE",
        node_json(Some("certified")),
        node_json(None),
        &fleet(),
    );
    let a = admit_without_lookups(&body);
    assert_eq!((a.outcome, a.writer), ("denied", "fleet"));
}

#[test]
fn malformed_reviews_are_denied_with_a_clear_reason() {
    let tenant = user("alice", &[]);
    for (object, old, operation, expect) in [
        (
            json!({"metadata": "nope"}),
            node_json(None),
            "UPDATE",
            "object is not a Node",
        ),
        (
            node_json(None),
            json!([1]),
            "UPDATE",
            "oldObject is not a Node",
        ),
        (Value::Null, node_json(None), "UPDATE", "has no object"),
        (node_json(None), Value::Null, "UPDATE", "without oldObject"),
    ] {
        let body = review_body(operation, object, old, &tenant);
        let a = admit_without_lookups(&body);
        assert_eq!(a.outcome, "malformed");
        let reason = a.response.denial.unwrap();
        assert!(reason.contains(expect), "{reason}");
    }
    // Not a Node, or a DELETE: the registration is wrong; allowed with a warning.
    let mut v: Value = serde_json::from_slice(&review_body(
        "DELETE",
        Value::Null,
        node_json(None),
        &tenant,
    ))
    .unwrap();
    let a = admit_without_lookups(&serde_json::to_vec(&v).unwrap());
    assert_eq!((a.outcome, a.response.allowed), ("ignored", true));
    v["request"]["kind"]["kind"] = json!("Pod");
    v["request"]["operation"] = json!("UPDATE");
    let a = admit_without_lookups(&serde_json::to_vec(&v).unwrap());
    assert_eq!(a.outcome, "ignored");
    assert!(a.response.warnings[0].contains("Node CREATE and UPDATE only"));
}

#[test]
fn an_old_object_identical_to_the_object_is_taken_from_the_cache() {
    // What the 1.20 API server of the harness sends for every update: the new Node twice.
    let tenant = user("alice", &["system:authenticated"]);
    let certified_json = node_json(Some("certified"));
    let body = review_body("UPDATE", certified_json.clone(), certified_json, &tenant);
    let request = review::decode(&body).unwrap();
    let uncertified = |name: &str| {
        assert_eq!(name, "gpu-a");
        Some(serde_json::from_value::<NodeView>(node_json(None)).unwrap())
    };
    let a = admit_node(&request, &policy(), never, uncertified, no_profile);
    assert_eq!(a.outcome, "denied", "{a:?}");
    // Not cached (yet): the review is all there is.
    let a = admit_node(&request, &policy(), never, no_cache, no_profile);
    assert_eq!(a.outcome, "untouched");
    // Distinct old and new objects are believed as sent.
    let body = review_body(
        "UPDATE",
        node_json(Some("certified")),
        node_json(Some("certified")).tap_label("team", "ml"),
        &tenant,
    );
    let a = admit_node(
        &review::decode(&body).unwrap(),
        &policy(),
        never,
        |_| panic!("no cache lookup expected"),
        no_profile,
    );
    assert_eq!(a.outcome, "untouched");
}

#[test]
fn cached_nodes_keep_only_the_outputs_and_compare_equal_to_the_review() {
    let mut node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "gpu-a",
            "labels": {keys::LABEL_FABRIC: "certified", "team": "ml"},
            "annotations": {keys::ANNOTATION_CERTIFICATE: "{}", "other": "x"},
            "managedFields": [{"manager": "m", "operation": "Update"}]},
        "spec": {"unschedulable": true},
        "status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": keys::CONDITION_FABRIC_READY, "status": "True", "reason": "Certified",
             "message": "ok", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
            {"type": keys::CONDITION_FLEET_OUTLIER, "status": "True", "reason": "Outlier",
             "message": "slow", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]},
    }))
    .unwrap();
    keep_outputs(&mut node);
    assert_eq!(node.metadata.labels.as_ref().unwrap().len(), 1);
    assert_eq!(node.metadata.annotations.as_ref().unwrap().len(), 1);
    assert!(node.spec.is_none());
    let conditions = node.status.as_ref().unwrap().conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 2);
    let cached: NodeView = serde_json::from_value(serde_json::to_value(&node).unwrap()).unwrap();
    // The same outputs as the review's JSON, whose heartbeat moved on.
    let reviewed = node_view(json!({
        "metadata": {"name": "gpu-a",
            "labels": {keys::LABEL_FABRIC: "certified", "team": "ml"},
            "annotations": {keys::ANNOTATION_CERTIFICATE: "{}"}},
        "status": {"conditions": [
            {"type": keys::CONDITION_FABRIC_READY, "status": "True", "reason": "Certified",
             "message": "ok", "lastHeartbeatTime": "2026-01-02T00:00:00Z"},
            {"type": keys::CONDITION_FLEET_OUTLIER, "status": "True", "reason": "Outlier",
             "message": "slow", "lastHeartbeatTime": "2026-01-02T00:00:00Z"}]},
    }));
    assert!(changed_outputs(Some(&cached), &reviewed).is_empty());
}

fn node_view(v: Value) -> NodeView {
    serde_json::from_value(v).unwrap()
}

trait TapLabel {
    fn tap_label(self, k: &str, v: &str) -> Self;
}

impl TapLabel for Value {
    fn tap_label(mut self, k: &str, v: &str) -> Self {
        self["metadata"]["labels"][k] = json!(v);
        self
    }
}

#[test]
fn the_fleet_controller_may_only_take_an_expired_certification_out_of_service() {
    let old = certified();
    let pending = with_label(old.clone(), keys::LABEL_FABRIC, Some("pending"));
    fn at(now: &str, old: &NodeView, new: &NodeView) -> Decision {
        decide(
            NodeChange {
                node: "gpu-a",
                old: Some(old),
                new,
                user: &fleet(),
                now: now.parse().unwrap(),
            },
            &policy(),
            never,
        )
    }
    let after_expiry = |old: &NodeView, new: &NodeView| at("2026-01-02T00:00:01Z", old, new);
    assert_eq!(
        after_expiry(&old, &pending),
        Decision::Allowed(Writer::Fleet)
    );
    // Before expiry the same flip would take a valid certification away.
    let d = denial(at("2026-01-01T23:59:59Z", &old, &pending));
    assert!(matches!(d, Denial::FleetLabelNotExpiry { .. }), "{d:?}");
    assert!(
        d.to_string().contains("expires at 2026-01-02T00:00:00Z"),
        "{d}"
    );
    // Never to certified, failed or away, and never with the certificate changed.
    for value in [Some("failed"), Some("degraded"), None] {
        let d = denial(after_expiry(
            &old,
            &with_label(old.clone(), keys::LABEL_FABRIC, value),
        ));
        assert!(matches!(d, Denial::FleetLabelNotExpiry { .. }), "{d:?}");
    }
    let d = denial(after_expiry(&pending, &old));
    assert!(d.to_string().contains("from pending to certified"), "{d}");
    // Before expiry, a run's pending mark goes back to the valid certificate's label (a
    // prober that died mid-run), and to nothing else.
    assert_eq!(
        at("2026-01-01T12:00:00Z", &pending, &old),
        Decision::Allowed(Writer::Fleet)
    );
    for value in [Some("failed"), Some("degraded"), None] {
        let d = denial(at(
            "2026-01-01T12:00:00Z",
            &pending,
            &with_label(old.clone(), keys::LABEL_FABRIC, value),
        ));
        assert!(
            d.to_string().contains("its certificate gives certified"),
            "{d}"
        );
    }
    let rewritten = with_annotation(
        pending.clone(),
        keys::ANNOTATION_CERTIFICATE,
        &certificate("h100", "abc", "failed"),
    );
    let d = denial(after_expiry(&old, &rewritten));
    assert!(matches!(d, Denial::FleetBeyondOutlier { .. }), "{d:?}");
    // A degraded certificate's label is the prober's, expired or not.
    let degraded = with_annotation(
        with_label(old.clone(), keys::LABEL_FABRIC, Some("degraded")),
        keys::ANNOTATION_CERTIFICATE,
        &certificate("h100", "abc", "degraded"),
    );
    let d = denial(after_expiry(
        &degraded,
        &with_label(degraded.clone(), keys::LABEL_FABRIC, Some("pending")),
    ));
    assert!(d.to_string().contains("from degraded to pending"), "{d}");
    // Anybody else flipping it is refused as before.
    let tenant = user("alice", &["system:authenticated"]);
    let d = denial(decide_update(&old, &pending, &tenant, PodLookup::Missing));
    assert!(matches!(d, Denial::NotAWriter { .. }), "{d:?}");
}

/// A simulated certificate (`simulated: true`, made with `--sim`) is stored only for a
/// profile that accepts simulation; its own prober is refused otherwise, and a profile the
/// cache does not know is a retry. Unchanged certificates are not read, measured ones pass,
/// and a break-glass group is not held to it.
#[test]
fn simulated_certificates_are_stored_only_for_profiles_that_accept_them() {
    let simulated = {
        let mut c: Value = serde_json::from_str(&certificate("h100", "abc", "certified")).unwrap();
        c["simulated"] = json!(true);
        c.to_string()
    };
    let old = bare();
    let new = with_label(
        with_annotation(certified(), keys::ANNOTATION_CERTIFICATE, &simulated),
        keys::LABEL_SIMULATED,
        Some("true"),
    );
    let who = prober("p-a");
    let change = update_by(&old, &new, &who);
    // The writer itself is allowed: the refusal is the simulation's.
    assert_eq!(
        decide(change, &policy(), |_| pod_on("gpu-a", "p-a")),
        Decision::Allowed(Writer::OwnProber { pod: "p-a".into() })
    );
    let asked = std::cell::RefCell::new(Vec::new());
    let refused = check_simulated(change, |p| {
        asked.borrow_mut().push(p.to_string());
        Some(false)
    })
    .unwrap_err();
    assert_eq!(asked.borrow().as_slice(), ["h100"]);
    assert_eq!(
        refused,
        Denial::SimulatedCertificate {
            node: "gpu-a".into(),
            profile: "h100".into()
        }
    );
    let message = refused.to_string();
    assert!(
        message.contains("acceptSimulated") && message.contains("--sim"),
        "{message}"
    );
    assert_eq!(check_simulated(change, |_| Some(true)), Ok(()));
    assert!(matches!(
        check_simulated(change, |_| None),
        Err(Denial::SimulatedCertificateUnknownProfile { .. })
    ));
    // The same certificate already on the node (a pending mark, a kubelet update): not read.
    let again = NodeChange {
        old: Some(&new),
        ..change
    };
    assert_eq!(
        check_simulated(again, |_| panic!("no profile lookup expected")),
        Ok(())
    );
    // A measured certificate passes without a lookup.
    let measured = certified();
    let change_measured = NodeChange {
        new: &measured,
        ..change
    };
    assert_eq!(
        check_simulated(change_measured, |_| panic!("no profile lookup expected")),
        Ok(())
    );

    // Through admit_node: the prober is denied, a break-glass member is not.
    let to_json = |v: &NodeView| {
        let mut n = node_json(None);
        n["metadata"]["labels"] = json!(v.metadata.labels);
        n["metadata"]["annotations"] = json!(v.metadata.annotations);
        n
    };
    let body = review_body("UPDATE", to_json(&new), to_json(&old), &who);
    let a = admit_node(
        &review::decode(&body).unwrap(),
        &policy(),
        |_| pod_on("gpu-a", "p-a"),
        no_cache,
        |_| Some(false),
    );
    assert_eq!((a.outcome, a.writer), ("denied", "prober"));
    assert!(
        a.response
            .denial
            .as_deref()
            .unwrap()
            .contains("simulated engine"),
        "{a:?}"
    );
    let admin = user("admin", &["system:masters"]);
    let body = review_body("UPDATE", to_json(&new), to_json(&old), &admin);
    let a = admit_node(
        &review::decode(&body).unwrap(),
        &policy(),
        never,
        no_cache,
        |_| panic!("break-glass is not held to the profile"),
    );
    assert_eq!((a.outcome, a.writer), ("allowed", "allowed-group"));
}

/// Passive healing's state in a certificate (a rail's `passiveHold`, the node's
/// `passiveHold`): the prober stores it and a heal's write, and the campaign, which parses
/// both certificates, records findings in one that carries it.
#[test]
fn certificates_with_passive_holds_are_stored_like_any_other() {
    let held = |verdict: &str, rail: &str, clean: u32| {
        json!({
            "version": 1, "generation": 4,
            "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-02T00:00:00Z",
            "profile": "h100", "signature": "abc", "verdict": verdict,
            "rails": [{"hca": "mlx5_0", "port": 1, "state": "ACTIVE", "verdict": rail,
                       "faults": if rail == "failed" { json!(["errors"]) } else { json!([]) },
                       "passiveHold": {"cleanWindows": clean, "flaps": 1,
                                       "before": {"verdict": "healthy"}}}],
            "passiveHold": {"before": {"verdict": "certified"}},
        })
        .to_string()
    };
    let failed = with_annotation(
        with_label(certified(), keys::LABEL_FABRIC, Some("degraded")),
        keys::ANNOTATION_CERTIFICATE,
        &held("degraded", "failed", 0),
    );
    let d = decide_update(
        &certified(),
        &failed,
        &prober("p-a"),
        pod_on("gpu-a", "p-a"),
    );
    assert_eq!(
        d,
        Decision::Allowed(Writer::OwnProber { pod: "p-a".into() })
    );
    let healed = with_annotation(
        certified(),
        keys::ANNOTATION_CERTIFICATE,
        &held("certified", "healthy", 10),
    );
    let d = decide_update(&failed, &healed, &prober("p-a"), pod_on("gpu-a", "p-a"));
    assert_eq!(
        d,
        Decision::Allowed(Writer::OwnProber { pod: "p-a".into() })
    );
    let counted = with_annotation(
        failed.clone(),
        keys::ANNOTATION_CERTIFICATE,
        &held("degraded", "failed", 1),
    );
    assert_eq!(
        decide_update(&failed, &counted, &campaign(), PodLookup::Missing),
        Decision::Allowed(Writer::Campaign)
    );
}
