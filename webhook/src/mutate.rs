//! The pure admission decision: which pods are training pods, which profile they get, and
//! the typed patch that configures them for it.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, NodeSelectorRequirement, Pod, PodSpec, ResourceRequirements,
    SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use railguard_api::profile::{parse_ib_hca, Enforcement, RdmaCountMode};
use railguard_api::quantity::parse_bytes;
use railguard_api::{keys, FabricProfile, FabricProfileSpec, RailSpec};
use serde_json::{json, Value};

use crate::config::{NamespaceInfo, WebhookConfig};
use crate::error::MutateError;
use crate::patch::{child, pointer, PatchOp};
use crate::{networks, runbook, selection};

/// Name of the memory-backed volume railguard mounts at `/dev/shm`.
pub const SHM_VOLUME: &str = "railguard-shm";
/// Name of the preflight init container.
pub const PREFLIGHT_CONTAINER: &str = "railguard-preflight";
const IPC_LOCK: &str = "IPC_LOCK";
/// Admission warnings longer than this are clipped.
pub const MAX_WARNING_CHARS: usize = 119;

/// One part of the configuration railguard applies. The names are the values of the
/// `railguard.io/mutations` annotation and (but for `preflight`) of `railguard.io/skip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mutation {
    NcclEnv,
    IpcLock,
    Shm,
    Rdma,
    Network,
    Affinity,
    Preflight,
}

impl Mutation {
    pub const ALL: [Mutation; 7] = [
        Mutation::NcclEnv,
        Mutation::IpcLock,
        Mutation::Shm,
        Mutation::Rdma,
        Mutation::Network,
        Mutation::Affinity,
        Mutation::Preflight,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mutation::NcclEnv => "nccl-env",
            Mutation::IpcLock => "ipc-lock",
            Mutation::Shm => "shm",
            Mutation::Rdma => "rdma",
            Mutation::Network => "network",
            Mutation::Affinity => "affinity",
            Mutation::Preflight => "preflight",
        }
    }

    /// Parses a `railguard.io/skip` part (only the parts listed in `keys::SKIP_PARTS`).
    pub fn from_skip_part(part: &str) -> Option<Self> {
        keys::SKIP_PARTS
            .contains(&part)
            .then(|| Mutation::ALL.into_iter().find(|m| m.as_str() == part))
            .flatten()
    }
}

/// What happened to the pod, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The namespace is excluded.
    Excluded,
    /// No GPU container and no `inject: "true"`.
    NotTraining,
    /// `inject: "false"` honored.
    OptedOut,
    /// No profile applies (a warning says why).
    NoProfile,
    /// Already configured: empty patch.
    Unchanged,
    Mutated,
    Denied,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Excluded => "excluded",
            Outcome::NotTraining => "not-training",
            Outcome::OptedOut => "opted-out",
            Outcome::NoProfile => "no-profile",
            Outcome::Unchanged => "unchanged",
            Outcome::Mutated => "mutated",
            Outcome::Denied => "denied",
        }
    }
}

/// The kind of an admission warning (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WarningKind {
    NoProfile,
    ExemptionIgnored,
    InvalidAnnotation,
    EnvConflict,
    UnsafeNccl,
    PodSecurity,
    Network,
    Preflight,
    NotPod,
    Internal,
}

impl WarningKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::NoProfile => "no-profile",
            WarningKind::ExemptionIgnored => "exemption-ignored",
            WarningKind::InvalidAnnotation => "invalid-annotation",
            WarningKind::EnvConflict => "env-conflict",
            WarningKind::UnsafeNccl => "unsafe-nccl",
            WarningKind::PodSecurity => "pod-security",
            WarningKind::Network => "network",
            WarningKind::Preflight => "preflight",
            WarningKind::NotPod => "not-pod",
            WarningKind::Internal => "internal",
        }
    }
}

/// An admission warning: at most [`MAX_WARNING_CHARS`] characters, no control characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub kind: WarningKind,
    pub message: String,
}

impl Warning {
    pub fn new(kind: WarningKind, message: impl AsRef<str>) -> Self {
        let clean: String = message
            .as_ref()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let message = if clean.chars().count() > MAX_WARNING_CHARS {
            let mut s: String = clean.chars().take(MAX_WARNING_CHARS - 1).collect();
            s.push('…');
            s
        } else {
            clean
        };
        Self { kind, message }
    }
}

/// The decision for one pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub outcome: Outcome,
    /// The profile applied (or that denied the pod).
    pub profile: Option<String>,
    pub ops: Vec<PatchOp>,
    /// Mutations this plan applies (new ones only).
    pub mutations: Vec<Mutation>,
    pub warnings: Vec<Warning>,
    /// Set when the pod must be rejected; `ops` is then empty.
    pub deny: Option<String>,
}

impl Plan {
    fn new(outcome: Outcome) -> Self {
        Self {
            outcome,
            profile: None,
            ops: Vec::new(),
            mutations: Vec::new(),
            warnings: Vec::new(),
            deny: None,
        }
    }

    fn warn(&mut self, kind: WarningKind, message: impl AsRef<str>) {
        self.warnings.push(Warning::new(kind, message));
    }

    fn deny(mut self, reason: String) -> Self {
        self.outcome = Outcome::Denied;
        self.ops.clear();
        self.mutations.clear();
        self.deny = Some(reason);
        self
    }

    /// The operations as a `json_patch::Patch`.
    pub fn patch(&self) -> json_patch::Patch {
        crate::patch::to_patch(self.ops.clone())
    }

    /// Moves the operations out as a `json_patch::Patch` (no copy on the serving path).
    pub fn take_patch(&mut self) -> json_patch::Patch {
        crate::patch::to_patch(std::mem::take(&mut self.ops))
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
    let spec = pod.spec.as_ref().ok_or(MutateError::NoSpec)?;
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
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
    let gpu_containers: Vec<usize> = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(_, c)| gpu_count(c, &config.gpu_resources) > 0)
        .map(|(i, _)| i)
        .collect();
    if gpu_containers.is_empty() && !inject_true {
        return Ok(plan);
    }
    // A pod opted in without GPUs gets the configuration in every container.
    let targets: Vec<usize> = if gpu_containers.is_empty() {
        (0..spec.containers.len()).collect()
    } else {
        gpu_containers
    };

    let profile = match selection::choose(pod, spec, profiles) {
        Ok((p, _)) => p,
        Err(why) => {
            plan.outcome = if inject_false {
                Outcome::OptedOut
            } else {
                plan.warn(WarningKind::NoProfile, why.message());
                Outcome::NoProfile
            };
            return Ok(plan);
        }
    };
    let name = profile.name();
    plan.profile = Some(name.to_string());
    let signature = profile_signature(&profile.spec);
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
            return Ok(plan);
        }
        plan.warn(
            WarningKind::ExemptionIgnored,
            ignored("railguard.io/inject=false"),
        );
    }
    let mut skip = BTreeSet::new();
    if let Some(value) = annotations.get(keys::ANNOTATION_SKIP) {
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
        if !skip.is_empty() && !exemptions_allowed {
            plan.warn(WarningKind::ExemptionIgnored, ignored("railguard.io/skip"));
            skip.clear();
        }
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

    let own_and_user = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter(|c| c.name != PREFLIGHT_CONTAINER);
    let findings = runbook::scan(own_and_user);
    if !findings.is_empty() {
        if profile.spec.policy.unsafe_nccl == Enforcement::Deny {
            let vars: BTreeSet<&str> = findings.iter().map(|f| f.variable).collect();
            let reason = format!(
                "profile {name} denies unsafe NCCL settings: {}",
                vars.into_iter().collect::<Vec<_>>().join(", ")
            );
            plan.warnings.extend(
                findings
                    .iter()
                    .map(|f| Warning::new(WarningKind::UnsafeNccl, &f.message)),
            );
            return Ok(plan.deny(reason));
        }
        plan.warnings.extend(
            findings
                .iter()
                .map(|f| Warning::new(WarningKind::UnsafeNccl, &f.message)),
        );
    }

    // IPC_LOCK versus Pod Security Admission, which runs after mutation.
    let mut ipc_lock = profile.spec.ipc_lock && !skip.contains(&Mutation::IpcLock);
    if ipc_lock && targets.iter().any(|&i| !has_ipc_lock(&spec.containers[i])) {
        if let Some(level) = namespace
            .labels
            .get(keys::LABEL_POD_SECURITY_ENFORCE)
            .filter(|l| matches!(l.as_str(), "baseline" | "restricted"))
        {
            let msg = format!(
                "namespace {} has {}={level}, which rejects IPC_LOCK",
                namespace.name,
                keys::LABEL_POD_SECURITY_ENFORCE
            );
            if profile.spec.policy.pod_security_conflict == Enforcement::Deny {
                return Ok(plan.deny(format!("profile {name} needs IPC_LOCK but {msg}")));
            }
            plan.warn(WarningKind::PodSecurity, format!("{msg}: not added"));
            ipc_lock = false;
        }
    }

    let mut done = BTreeSet::new();
    let desired_env = profile_env(profile);
    let shm = !skip.contains(&Mutation::Shm) && !spec.host_ipc.unwrap_or(false);
    let rdma = profile
        .spec
        .rdma
        .as_ref()
        .filter(|_| !skip.contains(&Mutation::Rdma));
    let want_preflight = profile.spec.preflight && config.prober_image.is_some();
    let mut preflight_base: Option<Container> = None;
    for &i in &targets {
        let c = &spec.containers[i];
        let mut ch = ContainerChanges::default();
        if !skip.contains(&Mutation::NcclEnv) {
            for (var, value) in &desired_env {
                match find_env(c, var) {
                    None => ch.env.push(EnvVar {
                        name: var.clone(),
                        value: Some(value.clone()),
                        value_from: None,
                    }),
                    Some(existing) => {
                        if let Some(w) = env_conflict(&c.name, var, existing, value, profile) {
                            plan.warn(WarningKind::EnvConflict, w);
                        }
                    }
                }
            }
        }
        ch.ipc_lock = ipc_lock && !has_ipc_lock(c);
        ch.shm_mount = shm && !mounts_dev_shm(c);
        if let Some(r) = rdma {
            let count = match r.count_mode {
                RdmaCountMode::SharedDevice => 1,
                RdmaCountMode::PerGpu => gpu_count(c, &config.gpu_resources),
                RdmaCountMode::PerRail => profile.spec.rails.len() as u64,
            };
            if count > 0 && !has_resource(c, &r.resource_name) {
                ch.rdma = Some((r.resource_name.clone(), count));
            }
        }
        ch.record(&mut done);
        ch.ops(i, c, &mut plan.ops)?;
        if want_preflight && preflight_base.is_none() {
            let mut mutated = c.clone();
            ch.apply(&mut mutated);
            preflight_base = Some(mutated);
        }
    }
    if done.contains(&Mutation::Shm) && !spec.volumes.iter().flatten().any(|v| v.name == SHM_VOLUME)
    {
        let mut empty_dir = json!({"medium": "Memory"});
        if let Some(size) = &profile.spec.shm_size {
            empty_dir["sizeLimit"] = Value::String(size.clone());
        }
        let value = json!({"name": SHM_VOLUME, "emptyDir": empty_dir});
        plan.ops.push(match &spec.volumes {
            None => PatchOp::add(pointer(["spec", "volumes"]), Value::Array(vec![value])),
            Some(_) => PatchOp::add(pointer(["spec", "volumes", "-"]), value),
        });
    }

    let mut annotation_changes: BTreeMap<String, String> = BTreeMap::new();
    if !profile.spec.networks.is_empty()
        && !skip.contains(&Mutation::Network)
        && !spec.host_network.unwrap_or(false)
    {
        let pod_ns = pod.metadata.namespace.as_deref().unwrap_or(&namespace.name);
        let existing = annotations
            .get(keys::ANNOTATION_MULTUS_NETWORKS)
            .map(String::as_str);
        match networks::merge(existing, &profile.spec.networks, pod_ns) {
            Ok(Some(merged)) => {
                annotation_changes.insert(keys::ANNOTATION_MULTUS_NETWORKS.to_string(), merged);
                done.insert(Mutation::Network);
            }
            Ok(None) => {}
            Err(e) => plan.warn(
                WarningKind::Network,
                format!(
                    "{}: {e}; networks not added",
                    keys::ANNOTATION_MULTUS_NETWORKS
                ),
            ),
        }
    }

    if !skip.contains(&Mutation::Affinity) && affinity_ops(spec, name, &mut plan.ops)? {
        done.insert(Mutation::Affinity);
    }

    if profile.spec.preflight
        && !spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == PREFLIGHT_CONTAINER)
    {
        match (&config.prober_image, preflight_base) {
            (Some(image), Some(base)) => {
                let init = preflight_container(&base, image, name, &signature);
                let value = to_value(&init, "preflight init container")?;
                // First, so a misconfigured pod fails before any other init work.
                plan.ops.push(match &spec.init_containers {
                    None => PatchOp::add(
                        pointer(["spec", "initContainers"]),
                        Value::Array(vec![value]),
                    ),
                    Some(_) => PatchOp::add(pointer(["spec", "initContainers", "0"]), value),
                });
                done.insert(Mutation::Preflight);
            }
            (None, _) => plan.warn(
                WarningKind::Preflight,
                format!(
                    "profile {name} wants a preflight check but the webhook has no --prober-image"
                ),
            ),
            (Some(_), None) => {}
        }
    }

    // Output annotations: profile, signature and the union of all mutations so far.
    for (key, value) in [
        (keys::ANNOTATION_PROFILE, name.to_string()),
        (keys::ANNOTATION_SIGNATURE, signature),
    ] {
        if annotations.get(key) != Some(&value) {
            annotation_changes.insert(key.to_string(), value);
        }
    }
    let mut all: BTreeSet<Mutation> = annotations
        .get(keys::ANNOTATION_MUTATIONS)
        .map(|v| {
            v.split(',')
                .filter_map(|p| Mutation::ALL.into_iter().find(|m| m.as_str() == p.trim()))
                .collect()
        })
        .unwrap_or_default();
    all.extend(done.iter().copied());
    if !all.is_empty() {
        let value = all.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",");
        if annotations.get(keys::ANNOTATION_MUTATIONS) != Some(&value) {
            annotation_changes.insert(keys::ANNOTATION_MUTATIONS.to_string(), value);
        }
    }
    if !annotation_changes.is_empty() {
        match &pod.metadata.annotations {
            None => plan.ops.push(PatchOp::add(
                pointer(["metadata", "annotations"]),
                to_value(&annotation_changes, "annotations")?,
            )),
            Some(existing) => {
                for (k, v) in annotation_changes {
                    let path = pointer(["metadata", "annotations", k.as_str()]);
                    plan.ops.push(if existing.contains_key(&k) {
                        PatchOp::Replace {
                            path,
                            value: Value::String(v),
                        }
                    } else {
                        PatchOp::add(path, Value::String(v))
                    });
                }
            }
        }
    }

    plan.mutations = done.into_iter().collect();
    plan.outcome = if plan.ops.is_empty() {
        Outcome::Unchanged
    } else {
        Outcome::Mutated
    };
    Ok(plan)
}

/// What one container gets.
#[derive(Default)]
struct ContainerChanges {
    env: Vec<EnvVar>,
    ipc_lock: bool,
    shm_mount: bool,
    rdma: Option<(String, u64)>,
}

impl ContainerChanges {
    fn record(&self, done: &mut BTreeSet<Mutation>) {
        if !self.env.is_empty() {
            done.insert(Mutation::NcclEnv);
        }
        if self.ipc_lock {
            done.insert(Mutation::IpcLock);
        }
        if self.shm_mount {
            done.insert(Mutation::Shm);
        }
        if self.rdma.is_some() {
            done.insert(Mutation::Rdma);
        }
    }

    fn ops(&self, index: usize, c: &Container, out: &mut Vec<PatchOp>) -> Result<(), MutateError> {
        let idx = index.to_string();
        let base = pointer(["spec", "containers", idx.as_str()]);
        if !self.env.is_empty() {
            let vars = self
                .env
                .iter()
                .map(|e| json!({"name": e.name, "value": e.value.as_deref().unwrap_or_default()}));
            match &c.env {
                None => out.push(PatchOp::add(child(&base, ["env"]), vars.collect())),
                Some(_) => {
                    for v in vars {
                        out.push(PatchOp::add(child(&base, ["env", "-"]), v));
                    }
                }
            }
        }
        if self.ipc_lock {
            let sc = c.security_context.as_ref();
            let caps = sc.and_then(|s| s.capabilities.as_ref());
            out.push(match (sc, caps, caps.and_then(|c| c.add.as_ref())) {
                (None, _, _) => PatchOp::add(
                    child(&base, ["securityContext"]),
                    json!({"capabilities": {"add": [IPC_LOCK]}}),
                ),
                (Some(_), None, _) => PatchOp::add(
                    child(&base, ["securityContext", "capabilities"]),
                    json!({"add": [IPC_LOCK]}),
                ),
                (Some(_), Some(_), None) => PatchOp::add(
                    child(&base, ["securityContext", "capabilities", "add"]),
                    json!([IPC_LOCK]),
                ),
                (Some(_), Some(_), Some(_)) => PatchOp::add(
                    child(&base, ["securityContext", "capabilities", "add", "-"]),
                    json!(IPC_LOCK),
                ),
            });
        }
        if self.shm_mount {
            let mount = json!({"name": SHM_VOLUME, "mountPath": "/dev/shm"});
            out.push(match &c.volume_mounts {
                None => PatchOp::add(child(&base, ["volumeMounts"]), Value::Array(vec![mount])),
                Some(_) => PatchOp::add(child(&base, ["volumeMounts", "-"]), mount),
            });
        }
        if let Some((resource, count)) = &self.rdma {
            let n = Value::String(count.to_string());
            match &c.resources {
                None => out.push(PatchOp::add(
                    child(&base, ["resources"]),
                    json!({"limits": {resource.as_str(): n.clone()}, "requests": {resource.as_str(): n}}),
                )),
                Some(r) => {
                    // Extended resources need equal requests and limits.
                    for (field, map) in [("limits", &r.limits), ("requests", &r.requests)] {
                        out.push(match map {
                            None => PatchOp::add(
                                child(&base, ["resources", field]),
                                json!({resource.as_str(): n.clone()}),
                            ),
                            Some(_) => PatchOp::add(
                                child(&base, ["resources", field, resource.as_str()]),
                                n.clone(),
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The same changes on a typed container (for the preflight copy).
    fn apply(&self, c: &mut Container) {
        c.env
            .get_or_insert_with(Vec::new)
            .extend(self.env.iter().cloned());
        if self.ipc_lock {
            c.security_context
                .get_or_insert_with(SecurityContext::default)
                .capabilities
                .get_or_insert_with(Capabilities::default)
                .add
                .get_or_insert_with(Vec::new)
                .push(IPC_LOCK.to_string());
        }
        if self.shm_mount {
            c.volume_mounts
                .get_or_insert_with(Vec::new)
                .push(shm_mount());
        }
        if let Some((resource, count)) = &self.rdma {
            let r = c
                .resources
                .get_or_insert_with(ResourceRequirements::default);
            for map in [&mut r.limits, &mut r.requests] {
                map.get_or_insert_with(BTreeMap::new)
                    .insert(resource.clone(), Quantity(count.to_string()));
            }
        }
    }
}

fn shm_mount() -> VolumeMount {
    VolumeMount {
        name: SHM_VOLUME.to_string(),
        mount_path: "/dev/shm".to_string(),
        ..Default::default()
    }
}

fn to_value<T: serde::Serialize>(v: &T, what: &'static str) -> Result<Value, MutateError> {
    serde_json::to_value(v).map_err(|source| MutateError::Serialize { what, source })
}

/// The profile's rail-layout signature, memoized per thread: hashing the canonical layout
/// costs more than the rest of a mutation, and a cluster has a handful of layouts. The key
/// is the full rail list, so an edited profile never gets a stale signature.
fn profile_signature(spec: &FabricProfileSpec) -> String {
    const MEMO_SIZE: usize = 32;
    thread_local! {
        static MEMO: RefCell<Vec<(Vec<RailSpec>, String)>> = const { RefCell::new(Vec::new()) };
    }
    MEMO.with(|memo| {
        if let Some((_, sig)) = memo.borrow().iter().find(|(rails, _)| *rails == spec.rails) {
            return sig.clone();
        }
        let sig = spec.signature();
        let mut memo = memo.borrow_mut();
        if memo.len() >= MEMO_SIZE {
            memo.remove(0);
        }
        memo.push((spec.rails.clone(), sig.clone()));
        sig
    })
}

/// The env the profile injects, in a stable order.
fn profile_env(profile: &FabricProfile) -> Vec<(String, String)> {
    let nccl = &profile.spec.nccl;
    let mut out = vec![("NCCL_IB_HCA".to_string(), profile.spec.nccl_ib_hca())];
    if let Some(v) = &nccl.socket_ifname {
        out.push(("NCCL_SOCKET_IFNAME".to_string(), v.clone()));
    }
    if let Some(v) = nccl.cross_nic {
        out.push(("NCCL_CROSS_NIC".to_string(), v.to_string()));
    }
    for (k, v) in &nccl.env {
        if !out.iter().any(|(name, _)| name == k) {
            out.push((k.clone(), v.clone()));
        }
    }
    out
}

fn find_env<'c>(c: &'c Container, name: &str) -> Option<&'c EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

/// A warning when a variable the user set contradicts the profile (the user's value stays).
fn env_conflict(
    container: &str,
    var: &str,
    existing: &EnvVar,
    wanted: &str,
    profile: &FabricProfile,
) -> Option<String> {
    let value = existing.value.as_deref()?.trim();
    if value == wanted {
        return None;
    }
    if var == "NCCL_IB_HCA" {
        let list = parse_ib_hca(value).ok()?;
        if list.exclude {
            return Some(format!(
                "container {container}: NCCL_IB_HCA={value} excludes HCAs; profile {} uses {wanted}",
                profile.name()
            ));
        }
        // A subset of the profile's rails is the user's choice; an HCA outside it is not.
        let outside: Vec<&str> = list
            .entries
            .iter()
            .filter(|e| {
                !profile
                    .spec
                    .rails
                    .iter()
                    .any(|r| r.hca == e.hca && e.port.is_none_or(|p| p == r.port))
            })
            .map(|e| e.hca.as_str())
            .collect();
        if outside.is_empty() {
            return None;
        }
        return Some(format!(
            "container {container}: NCCL_IB_HCA names {} outside profile {}; kept",
            outside.join(","),
            profile.name()
        ));
    }
    Some(format!(
        "container {container}: {var}={value} kept; profile {} sets {wanted}",
        profile.name()
    ))
}

/// GPUs a container asks for (limits first: for extended resources they equal requests).
fn gpu_count(c: &Container, gpu_resources: &[String]) -> u64 {
    let Some(r) = &c.resources else { return 0 };
    gpu_resources
        .iter()
        .map(|name| {
            r.limits
                .as_ref()
                .and_then(|m| m.get(name))
                .or_else(|| r.requests.as_ref().and_then(|m| m.get(name)))
                .and_then(|q| parse_bytes(&q.0).ok())
                .map_or(0, |n| u64::try_from(n).unwrap_or(u64::MAX))
        })
        .fold(0u64, u64::saturating_add)
}

fn has_resource(c: &Container, name: &str) -> bool {
    c.resources.as_ref().is_some_and(|r| {
        r.limits.as_ref().is_some_and(|m| m.contains_key(name))
            || r.requests.as_ref().is_some_and(|m| m.contains_key(name))
    })
}

fn has_ipc_lock(c: &Container) -> bool {
    let Some(sc) = &c.security_context else {
        return false;
    };
    sc.privileged.unwrap_or(false)
        || sc
            .capabilities
            .as_ref()
            .and_then(|caps| caps.add.as_ref())
            .is_some_and(|add| add.iter().any(|a| a == IPC_LOCK || a == "CAP_IPC_LOCK"))
}

fn mounts_dev_shm(c: &Container) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path.trim_end_matches('/') == "/dev/shm")
}

fn required_expressions(profile: &str) -> [NodeSelectorRequirement; 2] {
    [
        NodeSelectorRequirement {
            key: keys::LABEL_FABRIC.to_string(),
            operator: "In".to_string(),
            values: Some(vec![keys::fabric::CERTIFIED.to_string()]),
        },
        NodeSelectorRequirement {
            key: keys::LABEL_PROFILE.to_string(),
            operator: "In".to_string(),
            values: Some(vec![profile.to_string()]),
        },
    ]
}

fn requirement_json(r: &NodeSelectorRequirement) -> Value {
    json!({"key": r.key, "operator": r.operator, "values": r.values.as_deref().unwrap_or_default()})
}

/// ANDs the certified-node requirement into every required nodeSelectorTerm (terms are
/// ORed, so each needs it). Returns whether anything was added.
fn affinity_ops(
    spec: &PodSpec,
    profile: &str,
    out: &mut Vec<PatchOp>,
) -> Result<bool, MutateError> {
    let wanted = required_expressions(profile);
    let term = json!({"matchExpressions": wanted.iter().map(requirement_json).collect::<Value>()});
    let selector = json!({"nodeSelectorTerms": [term.clone()]});
    let affinity = spec.affinity.as_ref();
    let node = affinity.and_then(|a| a.node_affinity.as_ref());
    let required = node.and_then(|n| {
        n.required_during_scheduling_ignored_during_execution
            .as_ref()
    });
    let base: PointerBuf = pointer([
        "spec",
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
    ]);
    match (affinity, node, required) {
        (None, _, _) => {
            out.push(PatchOp::add(
                pointer(["spec", "affinity"]),
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}),
            ));
            Ok(true)
        }
        (Some(_), None, _) => {
            out.push(PatchOp::add(
                pointer(["spec", "affinity", "nodeAffinity"]),
                json!({"requiredDuringSchedulingIgnoredDuringExecution": selector}),
            ));
            Ok(true)
        }
        (Some(_), Some(_), None) => {
            out.push(PatchOp::add(base, selector));
            Ok(true)
        }
        (Some(_), Some(_), Some(req)) if req.node_selector_terms.is_empty() => {
            out.push(PatchOp::add(child(&base, ["nodeSelectorTerms", "-"]), term));
            Ok(true)
        }
        (Some(_), Some(_), Some(req)) => {
            let mut added = false;
            for (t, existing) in req.node_selector_terms.iter().enumerate() {
                let idx = t.to_string();
                let term_base = child(&base, ["nodeSelectorTerms", idx.as_str()]);
                let have = existing.match_expressions.as_deref().unwrap_or_default();
                let missing: Vec<&NodeSelectorRequirement> =
                    wanted.iter().filter(|w| !have.contains(w)).collect();
                if missing.is_empty() {
                    continue;
                }
                added = true;
                match &existing.match_expressions {
                    None => out.push(PatchOp::add(
                        child(&term_base, ["matchExpressions"]),
                        missing.iter().map(|m| requirement_json(m)).collect(),
                    )),
                    Some(_) => {
                        for m in missing {
                            out.push(PatchOp::add(
                                child(&term_base, ["matchExpressions", "-"]),
                                requirement_json(m),
                            ));
                        }
                    }
                }
            }
            Ok(added)
        }
    }
}

/// The preflight init container: the GPU container's resources, env, mounts and security
/// context (after mutation), running `railguard-prober preflight` from the prober image.
fn preflight_container(base: &Container, image: &str, profile: &str, signature: &str) -> Container {
    let mut env = base.env.clone().unwrap_or_default();
    env.push(EnvVar {
        name: "RAILGUARD_PROFILE".to_string(),
        value: Some(profile.to_string()),
        value_from: None,
    });
    env.push(EnvVar {
        name: "RAILGUARD_SIGNATURE".to_string(),
        value: Some(signature.to_string()),
        value_from: None,
    });
    Container {
        name: PREFLIGHT_CONTAINER.to_string(),
        image: Some(image.to_string()),
        command: Some(vec![
            "railguard-prober".to_string(),
            "preflight".to_string(),
        ]),
        env: Some(env),
        resources: base.resources.clone(),
        volume_mounts: base.volume_mounts.clone(),
        security_context: base.security_context.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "mutate_tests.rs"]
mod tests;
