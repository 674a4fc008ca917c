//! The node guard: a validating admission endpoint (`POST /validate-nodes`) for Node CREATE
//! and UPDATE (`nodes` and `nodes/status`) that keeps railguard's certification of a node in
//! the hands of the component that measured it.
//!
//! RBAC cannot say "its own Node": the probers' ClusterRole patches every Node, so a prober
//! pod (which also listens on the network) could certify any node, and whoever else may
//! patch Nodes — a tenant with a broad role, a kubelet (`system:node:*`, which may label its
//! own Node) — could certify one by labelling it. This endpoint closes that gap.
//!
//! **Protected outputs** ([`decision::PROTECTED`]): the labels `railguard.io/fabric`,
//! `railguard.io/profile`, `railguard.io/signature` and `railguard.io/simulated`, the annotation
//! `railguard.io/certificate` and the `RailguardFabricReady` condition — what the prober and
//! the campaign publish and what the extender and the injected node affinity read — and the
//! fleet controller's `RailguardFleetOutlier` condition (under a profile's
//! `spec.fleet.outliers: Filter` it takes a node out of scheduling). Every
//! other key stays free, including railguard's operator inputs: `railguard.io/recertify`
//! (ask for a run), `railguard.io/peer-endpoint` and pool labels a profile's nodeSelector
//! names.
//!
//! **Who may change them** ([`decision::decide`]):
//! - the prober of that node: user `system:serviceaccount:<prober ns>:<prober SA>` (the
//!   release namespace, unless the chart moves the probers into a `privileged` Pod Security
//!   namespace of their own: `--node-guard-prober-namespace`) whose token is bound to a pod
//!   (`userInfo.extra["authentication.kubernetes.io/pod-name"]`, which only a bound token
//!   carries) that the webhook's cache of prober pods (of that namespace) holds, with the
//!   prober's service account and `spec.nodeName` = the Node changed. A pod missing from the
//!   cache is a denial that says so (a webhook that just started, a pod just created: the
//!   prober retries);
//! - the campaign coordinator's service account (in the prober namespace too): the fabric
//!   label, the certificate and the condition of a node that has a certificate, keeping the
//!   certificate's profile, signature and node (findings change a verdict, never what the
//!   node is certified for);
//! - the fleet controller's service account: the `RailguardFleetOutlier` condition (the
//!   prober and the campaign may not change that one), and the fabric label only from
//!   `certified` to `pending` on expiry or from a dead prober's `pending` back to what the
//!   node's certificate says;
//! - members of the allowed groups (`--node-guard-allowed-groups`, `system:masters` by
//!   default: they bypass RBAC and can delete this webhook's configuration anyway, so
//!   denying them would only slow down a repair);
//! - nobody else, and nobody creates a Node with an output set (a kubelet's
//!   `--node-labels`).
//!
//! **Simulated certificates** ([`decision::check_simulated`]): a writer other than an
//! allowed group may store a certificate with `simulated: true` only for a profile with
//! `certification.acceptSimulated` (read from the webhook's profile cache).
//!
//! A change that touches no protected output is allowed without a lookup, so kubelet status
//! updates cost a comparison. Handlers read the pod cache only (the shell's `node_guard_cache::probers::ProberPods`),
//! never the API server.

pub mod decision;

use serde_json::value::RawValue;

pub use decision::{
    changed_outputs, check_simulated, decide, keep_outputs, Decision, Denial, GuardPolicy,
    NodeChange, NodeView, Output, PodLookup, ProberPod, Writer, PROTECTED,
};

use crate::review::{AdmissionRequest, ReviewResponse};

/// The decision on one AdmissionReview, with its metrics labels.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeAdmission {
    pub response: ReviewResponse,
    /// `untouched`, `allowed`, `denied`, `ignored` (not a Node CREATE/UPDATE) or `malformed`.
    pub outcome: &'static str,
    /// [`Writer::as_str`] of an allowed change; `prober`, `campaign`, `fleet` or `other` for a denial
    /// (who asked); empty otherwise.
    pub writer: &'static str,
}

/// Decides a decoded request (pure; `lookup` is [`decide`]'s, `profile_accepts`
/// [`check_simulated`]'s; `cached` gives the guard's own view of a Node, used when
/// `oldObject` is byte-identical to `object`, see `railguard_webhook_cli::node_guard_cache::nodes`). A request that is not a Node
/// CREATE or UPDATE is allowed with a warning (the webhook configuration is wrong); a Node
/// that does not decode is denied with the reason.
pub fn admit_node(
    request: &AdmissionRequest<'_>,
    policy: &GuardPolicy,
    lookup: impl FnOnce(&str) -> PodLookup,
    cached: impl FnOnce(&str) -> Option<NodeView>,
    profile_accepts: impl FnOnce(&str) -> Option<bool>,
) -> NodeAdmission {
    let mut response = ReviewResponse::allow(request.uid.clone());
    let k = &request.kind;
    let is_node = k.group.is_empty() && k.version == "v1" && k.kind == "Node";
    let operation = request.operation.as_str();
    if !is_node || !matches!(operation, "CREATE" | "UPDATE") {
        response.warnings.push(format!(
            "railguard node guard checks Node CREATE and UPDATE only, got {operation} of \
             {}/{}/{}; allowed unchanged",
            k.group, k.version, k.kind
        ));
        return NodeAdmission {
            response,
            outcome: "ignored",
            writer: "",
        };
    }
    let malformed = |mut response: ReviewResponse, message: String| {
        response.allowed = false;
        response.denial = Some(format!("railguard node guard: {message}"));
        NodeAdmission {
            response,
            outcome: "malformed",
            writer: "",
        }
    };
    let new = match parse(request.object, "object") {
        Ok(Some(n)) => n,
        Ok(None) => return malformed(response, "the request has no object".to_string()),
        Err(e) => return malformed(response, e),
    };
    let old = match parse(request.old_object, "oldObject") {
        Ok(old) => old,
        Err(e) => return malformed(response, e),
    };
    if operation == "UPDATE" && old.is_none() {
        return malformed(response, "an UPDATE without oldObject".to_string());
    }
    let node = new
        .metadata
        .name
        .clone()
        .or_else(|| request.name.clone())
        .unwrap_or_default();
    let old = match operation {
        "CREATE" => None,
        _ if request.old_object.map(RawValue::get) == request.object.map(RawValue::get) => {
            cached(&node).or(old)
        }
        _ => old,
    };
    let user = &request.user_info;
    let change = NodeChange {
        node: &node,
        old: old.as_ref(),
        new: &new,
        user,
        now: jiff::Timestamp::now(),
    };
    let asked_by = if policy.is_prober(user) {
        "prober"
    } else if policy.is_campaign(user) {
        "campaign"
    } else if policy.is_fleet(user) {
        "fleet"
    } else {
        "other"
    };
    let decision = match decide(change, policy, lookup) {
        // Break-glass groups repair by hand; every other writer is held to the profile.
        Decision::Allowed(writer) if !matches!(writer, Writer::AllowedGroup { .. }) => {
            match check_simulated(change, profile_accepts) {
                Ok(()) => Decision::Allowed(writer),
                Err(denial) => Decision::Denied(denial),
            }
        }
        other => other,
    };
    match decision {
        Decision::Untouched => NodeAdmission {
            response,
            outcome: "untouched",
            writer: "",
        },
        Decision::Allowed(writer) => NodeAdmission {
            response,
            outcome: "allowed",
            writer: writer.as_str(),
        },
        Decision::Denied(denial) => {
            response.allowed = false;
            response.denial = Some(format!("railguard node guard: {denial}"));
            NodeAdmission {
                response,
                outcome: "denied",
                writer: asked_by,
            }
        }
    }
}

fn parse(raw: Option<&RawValue>, what: &str) -> Result<Option<NodeView>, String> {
    let Some(raw) = raw.filter(|r| r.get() != "null") else {
        return Ok(None);
    };
    serde_json::from_str(raw.get())
        .map(Some)
        .map_err(|e| format!("{what} is not a Node: {e}"))
}

#[cfg(test)]
mod tests;
