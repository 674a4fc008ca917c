//! What a decision is made of: the [`Plan`] for one pod, its [`Outcome`], the [`Mutation`]s
//! it applies and the [`Warning`]s it returns.

use railguard_api::keys;

use crate::patch::PatchOp;

/// Admission warnings longer than this are clipped.
pub const MAX_WARNING_CHARS: usize = 119;

/// One part of the configuration railguard applies. The names are the values of the
/// `railguard.io/mutations` annotation and (but for `preflight` and `dra-claims`) of
/// `railguard.io/skip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mutation {
    NcclEnv,
    IpcLock,
    Shm,
    Rdma,
    Network,
    Affinity,
    Preflight,
    /// Not a change but a decision: the pod claims one of its profile's aligned-rails
    /// ResourceClaimTemplates, so DRA allocates its NICs (device taints keep failed rails
    /// out) and `affinity` and `rdma` leave it alone.
    DraClaims,
}

impl Mutation {
    pub const ALL: [Mutation; 8] = [
        Mutation::NcclEnv,
        Mutation::IpcLock,
        Mutation::Shm,
        Mutation::Rdma,
        Mutation::Network,
        Mutation::Affinity,
        Mutation::Preflight,
        Mutation::DraClaims,
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
            Mutation::DraClaims => "dra-claims",
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
    /// Opt-in scope: neither the namespace nor the pod carries the opt-in label.
    OutOfScope,
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
    /// Audit mode: admitted unchanged; the patch it would have applied is recorded.
    AuditMutate,
    /// Audit mode: admitted unchanged; the denial it would have given is recorded.
    AuditDeny,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Excluded => "excluded",
            Outcome::OutOfScope => "out-of-scope",
            Outcome::NotTraining => "not-training",
            Outcome::OptedOut => "opted-out",
            Outcome::NoProfile => "no-profile",
            Outcome::Unchanged => "unchanged",
            Outcome::Mutated => "mutated",
            Outcome::Denied => "denied",
            Outcome::AuditMutate => "audit-mutate",
            Outcome::AuditDeny => "audit-deny",
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
    /// Audit mode: what would have happened.
    Audit,
    /// The default profile's node pool contradicts the pod's own placement, or the pod
    /// claims another profile's aligned rails.
    ProfileMismatch,
    /// The pod claims its profile's aligned rails: placement and RDMA devices are DRA's.
    Dra,
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
            WarningKind::Audit => "audit",
            WarningKind::ProfileMismatch => "profile-mismatch",
            WarningKind::Dra => "dra",
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
    pub(crate) fn new(outcome: Outcome) -> Self {
        Self {
            outcome,
            profile: None,
            ops: Vec::new(),
            mutations: Vec::new(),
            warnings: Vec::new(),
            deny: None,
        }
    }

    pub(crate) fn warn(&mut self, kind: WarningKind, message: impl AsRef<str>) {
        self.warnings.push(Warning::new(kind, message));
    }

    pub(crate) fn deny(mut self, reason: String) -> Self {
        self.outcome = Outcome::Denied;
        self.ops.clear();
        self.mutations.clear();
        self.deny = Some(reason);
        self
    }

    /// The operations as a `json_patch::Patch`.
    #[cfg(test)]
    pub(crate) fn patch(&self) -> json_patch::Patch {
        crate::patch::to_patch(self.ops.clone())
    }
}
