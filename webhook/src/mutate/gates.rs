//! Whether and how a pod is configured, before any step runs: opt-in and opt-out, the
//! profile, exemptions (`inject: "false"`, `skip`, `allow-uncertified`) where the profile's
//! policy allows them, unsafe NCCL settings and Pod Security versus IPC_LOCK. The result is
//! either the final plan (nothing to configure, or a denial) or the [`Ctx`] the steps read.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use railguard_api::pod::container_gpu_count;
use railguard_api::profile::{derive_ib_hca, Enforcement};
use railguard_api::{keys, FabricProfile, FabricProfileSpec, RailSpec};

use super::container::has_ipc_lock;
use super::rail_claims::{claimed_profile, rail_claims, uses_claim};
use super::{Ctx, Mutation, Outcome, Plan, Warning, WarningKind, PREFLIGHT_CONTAINER};
use crate::config::{NamespaceInfo, WebhookConfig};
use crate::{runbook, selection};

static NO_ANNOTATIONS: BTreeMap<String, String> = BTreeMap::new();

/// What the gates decided.
#[derive(Debug)]
pub(super) enum Gate<'a> {
    /// Configure the pod: the context for the steps and the plan so far (profile, warnings).
    Open(Ctx<'a>, Plan),
    /// Nothing to configure, or a denial: the final plan.
    Closed(Plan),
}

/// Runs the gates for `pod`.
pub(super) fn open<'a>(
    pod: &'a Pod,
    spec: &'a PodSpec,
    namespace: &'a NamespaceInfo,
    profiles: &'a [FabricProfile],
    config: &'a WebhookConfig,
) -> Gate<'a> {
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&NO_ANNOTATIONS);
    let mut plan = Plan::new(Outcome::NotTraining);

    let inject = annotations.get(keys::ANNOTATION_INJECT).map(|s| s.trim());
    let (inject_true, inject_false) = match inject {
        None => (false, false),
        Some("true") => (true, false),
        Some("false") => (false, true),
        Some(other) => {
            plan.warn(
                WarningKind::InvalidAnnotation,
                format!(
                    "railguard.io/inject must be \"true\" or \"false\", not {other:?}; ignored"
                ),
            );
            (false, false)
        }
    };
    // Claims of railguard's aligned rails (DRA): their GPUs come with the claim, not as an
    // extended resource, and they make the pod a training pod too.
    let rail_claims = rail_claims(spec, profiles);
    let gpu_containers: Vec<usize> = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            container_gpu_count(c, &config.gpu_resources) > 0 || uses_claim(c, &rail_claims)
        })
        .map(|(i, _)| i)
        .collect();
    if gpu_containers.is_empty() && !inject_true && rail_claims.is_empty() {
        return Gate::Closed(plan);
    }
    // A pod opted in without GPUs gets the configuration in every container.
    let targets: Vec<usize> = if gpu_containers.is_empty() {
        (0..spec.containers.len()).collect()
    } else {
        gpu_containers
    };

    // A pod that says nothing about its nodes but claims one profile's aligned rails is that
    // profile's (as if it named it), default or none.
    let claimed = claimed_profile(&rail_claims, profiles);
    let chosen = match (selection::choose(pod, spec, profiles), claimed) {
        (Ok((_, selection::Choice::Default)) | Err(selection::NoProfile::NoMatch), Some(c)) => {
            Ok((c, selection::Choice::Default, "claimed"))
        }
        (Ok((p, choice)), _) => Ok((p, choice, "default")),
        (Err(why), _) => Err(why),
    };
    let profile = match chosen {
        // The default profile is for pods that say nothing about their nodes: one whose own
        // placement asks for another pool (an H200 pod under an H100 default) is not forced
        // onto it.
        Ok((p, selection::Choice::Default, what)) => {
            match selection::pod_excludes(spec, &p.spec.node_selector) {
                Some(key) => {
                    plan.warn(
                        WarningKind::ProfileMismatch,
                        format!(
                            "pod's own {key} rules out {what} profile {}: not configured \
                             (set railguard.io/profile)",
                            p.name()
                        ),
                    );
                    plan.outcome = Outcome::NoProfile;
                    return Gate::Closed(plan);
                }
                None => p,
            }
        }
        Ok((p, _, _)) => p,
        Err(why) => {
            plan.outcome = if inject_false {
                Outcome::OptedOut
            } else {
                plan.warn(WarningKind::NoProfile, why.message());
                Outcome::NoProfile
            };
            return Gate::Closed(plan);
        }
    };
    let name = profile.name();
    plan.profile = Some(name.to_string());
    let exemptions_allowed = profile
        .spec
        .exemptions
        .allows(&namespace.name, &namespace.labels);
    let ignored = |what: &str| {
        format!(
            "{what} ignored: namespace {} may not use exemptions of profile {name}",
            namespace.name
        )
    };

    if inject_false {
        if exemptions_allowed {
            plan.outcome = Outcome::OptedOut;
            return Gate::Closed(plan);
        }
        plan.warn(
            WarningKind::ExemptionIgnored,
            ignored("railguard.io/inject=false"),
        );
    }
    let mut skip = skip_parts(annotations, &mut plan);
    if !skip.is_empty() && !exemptions_allowed {
        plan.warn(WarningKind::ExemptionIgnored, ignored("railguard.io/skip"));
        skip.clear();
    }
    if let Some(value) = annotations.get(keys::ANNOTATION_ALLOW_UNCERTIFIED) {
        if value.trim() == "true" {
            if exemptions_allowed {
                // The pod may land on uncertified nodes: the certified-node affinity would
                // contradict the exemption the extender honors.
                skip.insert(Mutation::Affinity);
            } else {
                plan.warn(
                    WarningKind::ExemptionIgnored,
                    ignored("railguard.io/allow-uncertified"),
                );
            }
        }
    }

    // Aligned rails of this profile are DRA's to place; another profile's are not (the pod
    // is configured for this one, and told).
    let dra = rail_claims
        .iter()
        .find(|c| c.profile == name)
        .map(|c| Box::new(c.clone()));
    if let Some(other) = rail_claims.iter().find(|c| c.profile != name) {
        plan.warn(
            WarningKind::ProfileMismatch,
            format!(
                "claim {} is profile {}'s rails but profile {name} applies: not left to DRA",
                other.source, other.profile
            ),
        );
    }

    let RailLayout { signature, ib_hca } = rail_layout(&profile.spec);
    // The profile's own NCCL_IB_HCA wins over the one its rails give.
    let ib_hca = profile.spec.nccl.ib_hca.clone().unwrap_or(ib_hca);
    let mut ctx = Ctx {
        pod,
        spec,
        annotations,
        namespace,
        profile,
        signature,
        ib_hca,
        config,
        targets,
        skip,
        ipc_lock: false,
        dra,
    };
    if let Some(reason) = unsafe_nccl(&ctx, &mut plan) {
        return Gate::Closed(plan.deny(reason));
    }
    match ipc_lock_allowed(&ctx, &mut plan) {
        Ok(allowed) => ctx.ipc_lock = allowed,
        Err(reason) => return Gate::Closed(plan.deny(reason)),
    }
    Gate::Open(ctx, plan)
}

/// The parts `railguard.io/skip` names; unknown parts are warned about.
fn skip_parts(annotations: &BTreeMap<String, String>, plan: &mut Plan) -> BTreeSet<Mutation> {
    let mut skip = BTreeSet::new();
    let Some(value) = annotations.get(keys::ANNOTATION_SKIP) else {
        return skip;
    };
    let mut unknown = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match Mutation::from_skip_part(part) {
            Some(m) => {
                skip.insert(m);
            }
            None => unknown.push(part),
        }
    }
    if !unknown.is_empty() {
        plan.warn(
            WarningKind::InvalidAnnotation,
            format!(
                "railguard.io/skip: unknown parts {:?}; known: {}",
                unknown.join(","),
                keys::SKIP_PARTS.join(",")
            ),
        );
    }
    skip
}

/// Runbook findings in the user's containers: warnings, and the denial reason when the
/// profile denies them.
fn unsafe_nccl(ctx: &Ctx<'_>, plan: &mut Plan) -> Option<String> {
    let own_and_user = ctx
        .spec
        .containers
        .iter()
        .chain(ctx.spec.init_containers.iter().flatten())
        .filter(|c| c.name != PREFLIGHT_CONTAINER);
    let findings = runbook::scan(own_and_user);
    plan.warnings.extend(
        findings
            .iter()
            .map(|f| Warning::new(WarningKind::UnsafeNccl, &f.message)),
    );
    if findings.is_empty() || ctx.profile.spec.policy.unsafe_nccl != Enforcement::Deny {
        return None;
    }
    let vars: BTreeSet<&str> = findings.iter().map(|f| f.variable).collect();
    Some(format!(
        "profile {} denies unsafe NCCL settings: {}",
        ctx.profile.name(),
        vars.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Whether IPC_LOCK is added: Pod Security Admission runs after mutation, and its
/// `baseline` and `restricted` levels reject the capability (a warning and no IPC_LOCK, or
/// the denial reason when the profile asks for one).
fn ipc_lock_allowed(ctx: &Ctx<'_>, plan: &mut Plan) -> Result<bool, String> {
    let wanted = ctx.profile.spec.ipc_lock && !ctx.skip.contains(&Mutation::IpcLock);
    if !wanted
        || ctx
            .targets
            .iter()
            .all(|&i| has_ipc_lock(&ctx.spec.containers[i]))
    {
        return Ok(wanted);
    }
    let Some(level) = ctx
        .namespace
        .labels
        .get(keys::LABEL_POD_SECURITY_ENFORCE)
        .filter(|l| matches!(l.as_str(), "baseline" | "restricted"))
    else {
        return Ok(true);
    };
    let msg = format!(
        "namespace {} has {}={level}, which rejects IPC_LOCK",
        ctx.namespace.name,
        keys::LABEL_POD_SECURITY_ENFORCE
    );
    if ctx.profile.spec.policy.pod_security_conflict == Enforcement::Deny {
        let name = ctx.profile.name();
        return Err(format!("profile {name} needs IPC_LOCK but {msg}"));
    }
    plan.warn(WarningKind::PodSecurity, format!("{msg}: not added"));
    Ok(false)
}

/// What a profile's rail list alone decides: its signature and the `NCCL_IB_HCA` value
/// derived from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RailLayout {
    pub(super) signature: String,
    pub(super) ib_hca: String,
}

/// The profile's [`RailLayout`], memoized per thread: hashing the canonical layout costs
/// more than the rest of a mutation, and a cluster has a handful of layouts. The key is the
/// full rail list, so an edited profile never gets a stale layout.
pub(super) fn rail_layout(spec: &FabricProfileSpec) -> RailLayout {
    const MEMO_SIZE: usize = 32;
    thread_local! {
        static MEMO: RefCell<Vec<(Vec<RailSpec>, RailLayout)>> = const { RefCell::new(Vec::new()) };
    }
    MEMO.with(|memo| {
        if let Some((_, layout)) = memo.borrow().iter().find(|(rails, _)| *rails == spec.rails) {
            return layout.clone();
        }
        let layout = RailLayout {
            signature: spec.signature(),
            ib_hca: derive_ib_hca(&spec.rails),
        };
        let mut memo = memo.borrow_mut();
        if memo.len() >= MEMO_SIZE {
            memo.remove(0);
        }
        memo.push((spec.rails.clone(), layout.clone()));
        layout
    })
}
