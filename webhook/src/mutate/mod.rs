//! The pure admission decision: which pods are training pods, which profile they get, and
//! the typed patch that configures them for it.
//!
//! [`mutate()`] first runs the gates ([`gates`]: opt-in, profile, exemptions, runbook, Pod
//! Security), then one step per part of the configuration ([`steps`]), each reading the
//! same [`Ctx`] and adding to the same [`Draft`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use railguard_api::profile::AdmissionMode;
use railguard_api::{keys, FabricProfile};

use crate::config::{NamespaceInfo, WebhookConfig};
use crate::error::MutateError;
use crate::json_text::{JsonText, Object};
use crate::patch::{pointer, PatchOp};

mod audit;
mod container;
mod gates;
mod plan;
mod rail_claims;
mod steps;

pub use plan::{Mutation, Outcome, Plan, Warning, WarningKind, MAX_WARNING_CHARS};

/// Name of the memory-backed volume railguard mounts at `/dev/shm`.
pub const SHM_VOLUME: &str = "railguard-shm";
/// Name of the hostPath volume of the NCCL environment plugin's directory.
pub const NCCL_PLUGIN_VOLUME: &str = "railguard-nccl-plugin";
/// Name of the hostPath volume of the directory of the plugin's node file.
pub const NCCL_CONFIG_VOLUME: &str = "railguard-nccl-config";
/// Name of the preflight init container.
pub const PREFLIGHT_CONTAINER: &str = "railguard-preflight";

/// What every step reads: the pod, its namespace, the chosen profile, the configuration, and
/// what the gates decided.
#[derive(Clone, Debug)]
pub(crate) struct Ctx<'a> {
    pub(crate) pod: &'a Pod,
    pub(crate) spec: &'a PodSpec,
    /// The pod's annotations (empty when it has none).
    pub(crate) annotations: &'a BTreeMap<String, String>,
    pub(crate) namespace: &'a NamespaceInfo,
    pub(crate) profile: &'a FabricProfile,
    /// The profile's rail-layout signature.
    pub(crate) signature: String,
    /// The `NCCL_IB_HCA` the profile sets (`FabricProfileSpec::nccl_ib_hca`, memoized).
    pub(crate) ib_hca: String,
    pub(crate) config: &'a WebhookConfig,
    /// Indexes of the containers configured: the GPU containers (every container of a pod
    /// opted in without GPUs).
    pub(crate) targets: Vec<usize>,
    /// Parts the pod opted out of, where its namespace may.
    pub(crate) skip: BTreeSet<Mutation>,
    /// Whether IPC_LOCK is added (the profile wants it, no skip, Pod Security allows it).
    pub(crate) ipc_lock: bool,
    /// The pod's claim of the profile's aligned rails (DRA), if any: `affinity` and `rdma`
    /// leave placement and the RDMA devices to DRA.
    pub(crate) dra: Option<Box<rail_claims::RailClaim>>,
}

/// What the steps build: the plan, the target containers as the steps so far left them, the
/// annotations to set and the mutations applied.
#[derive(Clone, Debug)]
pub(crate) struct Draft {
    pub(crate) plan: Plan,
    /// One per target, in `Ctx::targets` order.
    pub(crate) containers: Vec<container::Shadow>,
    /// Annotation values to set, written by the last step.
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) done: BTreeSet<Mutation>,
    /// Whether `/spec/volumes` exists in the pod as patched so far (its own, or one an
    /// earlier step created): a second `add /spec/volumes` would replace the first one's.
    volumes_exist: bool,
}

impl Draft {
    pub(crate) fn new(ctx: &Ctx<'_>, plan: Plan) -> Self {
        Self {
            plan,
            containers: ctx
                .targets
                .iter()
                .map(|&i| container::Shadow::new(i, &ctx.spec.containers[i]))
                .collect(),
            annotations: BTreeMap::new(),
            done: BTreeSet::new(),
            volumes_exist: ctx.spec.volumes.is_some(),
        }
    }

    /// Adds a pod volume that `write` writes: every step adds volumes here, so the first one
    /// creates the array and the others append to it.
    pub(crate) fn add_volume(&mut self, write: impl FnOnce(&mut Object<'_>)) {
        let op = if self.volumes_exist {
            PatchOp::add(pointer(["spec", "volumes", "-"]), JsonText::object(write))
        } else {
            PatchOp::add(
                pointer(["spec", "volumes"]),
                JsonText::array(|a| {
                    a.object(write);
                }),
            )
        };
        self.volumes_exist = true;
        self.plan.ops.push(op);
    }

    fn finish(mut self) -> Plan {
        self.plan.mutations = self.done.into_iter().collect();
        self.plan.outcome = if self.plan.ops.is_empty() {
            Outcome::Unchanged
        } else {
            Outcome::Mutated
        };
        self.plan
    }
}

/// Decides what to do with `pod`, created in `namespace`, given the profiles (in priority
/// order for selector matches) and the webhook's configuration. No IO.
pub fn mutate(
    pod: &Pod,
    namespace: &NamespaceInfo,
    profiles: &[FabricProfile],
    config: &WebhookConfig,
) -> Result<Plan, MutateError> {
    if config.excluded_namespaces.contains(&namespace.name) {
        return Ok(Plan::new(Outcome::Excluded));
    }
    if !config.scope.admits(
        &namespace.labels,
        pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
    ) {
        return Ok(Plan::new(Outcome::OutOfScope));
    }
    // A pod audited before (reinvocation, a re-created copy) is decided as if it were not,
    // so its record comes out the same and is left alone.
    let audited = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(keys::ANNOTATION_AUDIT));
    let (plan, mode) = if audited {
        let mut bare = pod.clone();
        if let Some(a) = bare.metadata.annotations.as_mut() {
            a.remove(keys::ANNOTATION_AUDIT);
            if a.is_empty() {
                bare.metadata.annotations = None;
            }
        }
        decide(&bare, namespace, profiles, config)?
    } else {
        decide(pod, namespace, profiles, config)?
    };
    audit::apply_mode(plan, mode, &pod.metadata)
}

/// The decision under Enforce, and the mode that applies to it.
fn decide(
    pod: &Pod,
    namespace: &NamespaceInfo,
    profiles: &[FabricProfile],
    config: &WebhookConfig,
) -> Result<(Plan, AdmissionMode), MutateError> {
    let spec = pod.spec.as_ref().ok_or(MutateError::NoSpec)?;
    Ok(match gates::open(pod, spec, namespace, profiles, config) {
        gates::Gate::Open(ctx, plan) => {
            let mode = mode_of(ctx.profile, config);
            let mut draft = Draft::new(&ctx, plan);
            for step in steps::ALL {
                step(&ctx, &mut draft)?;
            }
            (draft.finish(), mode)
        }
        gates::Gate::Closed(plan) => {
            let mode = plan
                .profile
                .as_deref()
                .and_then(|name| profiles.iter().find(|p| p.name() == name))
                .map_or(config.mode, |p| mode_of(p, config));
            (plan, mode)
        }
    })
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// The profile's own admission mode, else the webhook's.
fn mode_of(profile: &FabricProfile, config: &WebhookConfig) -> AdmissionMode {
    profile.spec.policy.mode.unwrap_or(config.mode)
}

fn to_json<T: serde::Serialize>(v: &T, what: &'static str) -> Result<JsonText, MutateError> {
    JsonText::of(v).map_err(|source| MutateError::Serialize { what, source })
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
