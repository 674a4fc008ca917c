//! Audit mode: the decision is recorded, not applied. A pod railguard would configure or
//! deny is admitted unchanged but for one annotation, `railguard.io/audit`, that holds what
//! would have happened (profile, mutations or denial, and the JSON patch itself), and a
//! warning that says so; the outcome (`audit-mutate`, `audit-deny`) is counted in
//! `railguard_webhook_admissions_total`. An operator reviews a week of that before
//! switching `webhook.mode` (or one profile's `policy.mode`) to Enforce.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use railguard_api::keys;
use railguard_api::profile::AdmissionMode;
use serde::Serialize;

use super::steps::annotation_ops;
use super::{Outcome, Plan, WarningKind};
use crate::error::MutateError;
use crate::patch::write_patch;

/// The value of `railguard.io/audit` (JSON, keys in this order).
#[derive(Serialize)]
struct AuditRecord<'a> {
    mode: &'static str,
    profile: &'a str,
    /// `mutate` or `deny`.
    would: &'static str,
    #[serde(skip_serializing_if = "<[&str]>::is_empty")]
    mutations: &'a [&'a str],
    #[serde(skip_serializing_if = "Option::is_none")]
    deny: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<serde_json::Value>,
}

/// `plan` as `mode` has it: unchanged under Enforce and for decisions that change nothing;
/// under Audit a mutation or denial becomes its record.
pub(super) fn apply_mode(
    plan: Plan,
    mode: AdmissionMode,
    metadata: &ObjectMeta,
) -> Result<Plan, MutateError> {
    let would = match plan.outcome {
        Outcome::Mutated => "mutate",
        Outcome::Denied => "deny",
        _ => return Ok(plan),
    };
    if mode == AdmissionMode::Enforce {
        return Ok(plan);
    }
    let profile = plan.profile.clone().unwrap_or_default();
    let mutations: Vec<&str> = plan.mutations.iter().map(|m| m.as_str()).collect();
    let serialize = |source| MutateError::Serialize {
        what: "the audit record",
        source,
    };
    let patch = if plan.ops.is_empty() {
        None
    } else {
        let mut text = String::new();
        write_patch(&plan.ops, &mut text);
        Some(serde_json::from_str(&text).map_err(serialize)?)
    };
    let record = AuditRecord {
        mode: AdmissionMode::Audit.as_str(),
        profile: &profile,
        would,
        mutations: &mutations,
        deny: plan.deny.as_deref(),
        patch,
    };
    let value = serde_json::to_string(&record).map_err(serialize)?;
    let summary = match &plan.deny {
        Some(reason) => format!("audit: profile {profile} would deny this pod: {reason}"),
        None => format!(
            "audit: profile {profile} would apply {}; admitted unchanged (see {})",
            mutations.join(","),
            keys::ANNOTATION_AUDIT
        ),
    };
    let mut audited = Plan::new(if plan.deny.is_some() {
        Outcome::AuditDeny
    } else {
        Outcome::AuditMutate
    });
    audited.profile = plan.profile;
    audited.warnings = plan.warnings;
    audited.warn(WarningKind::Audit, summary);
    let unchanged = metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_AUDIT))
        == Some(&value);
    if !unchanged {
        audited.ops = annotation_ops(
            metadata,
            &BTreeMap::from([(keys::ANNOTATION_AUDIT.to_string(), value)]),
        );
    }
    Ok(audited)
}
