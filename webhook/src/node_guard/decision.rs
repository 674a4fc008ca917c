//! The pure decision: who may change which of railguard's Node outputs. No IO: the caller
//! hands in both versions of the Node, the requester as the API server authenticated it and
//! what its cache knows of the requester's pod.

use std::collections::BTreeMap;
use std::fmt;

use railguard_api::{keys, Certificate};
use serde::Deserialize;
use serde_json::Value;

use crate::review::UserInfo;

/// `userInfo.extra` key of a bound service-account token: the pod it is bound to.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// `userInfo.extra` key of a bound service-account token: that pod's uid.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// `userInfo.extra` key set from Kubernetes 1.30 on: the node of the pod the token is bound
/// to (checked when present; the pod cache decides either way).
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// One of railguard's published outputs on a Node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Output {
    Label(&'static str),
    Annotation(&'static str),
    Condition(&'static str),
}

/// The outputs the guard protects: what the prober and the campaign publish and the
/// extender, the webhook's injected affinity and operators read as the certification, and
/// the fleet controller's outlier mark (with a profile's `spec.fleet.outliers: Filter`,
/// whoever sets it takes a node out of scheduling, whoever clears it hides an outlier).
/// Operator inputs under `railguard.io/` (`railguard.io/recertify`, pool labels that a
/// profile's nodeSelector names, `railguard.io/peer-endpoint`) are not in it.
pub const PROTECTED: &[Output] = &{
    // The certification, then the outlier mark: one list, so the two cannot drift apart.
    let mut all = [Output::Condition(keys::CONDITION_FLEET_OUTLIER); CERTIFICATION.len() + 1];
    let mut i = 0;
    while i < CERTIFICATION.len() {
        all[i] = CERTIFICATION[i];
        i += 1;
    }
    all
};

/// The certification: what a node's own prober may change (everything protected but the
/// fleet's outlier mark, which compares the node with the others and is not the node's to
/// judge).
pub(crate) const PROBER_MAY_CHANGE: &[Output] = &CERTIFICATION;

const CERTIFICATION: [Output; 6] = [
    Output::Label(keys::LABEL_FABRIC),
    Output::Label(keys::LABEL_PROFILE),
    Output::Label(keys::LABEL_SIGNATURE),
    Output::Label(keys::LABEL_SIMULATED),
    Output::Annotation(keys::ANNOTATION_CERTIFICATE),
    Output::Condition(keys::CONDITION_FABRIC_READY),
];

/// The outputs the campaign coordinator may change: its findings move the verdict (label,
/// certificate, condition); the profile and the rail layout a node is certified for stay
/// the prober's.
pub(crate) const CAMPAIGN_MAY_CHANGE: &[Output] = &[
    Output::Label(keys::LABEL_FABRIC),
    Output::Annotation(keys::ANNOTATION_CERTIFICATE),
    Output::Condition(keys::CONDITION_FABRIC_READY),
];

/// The outputs the fleet controller may change: its outlier mark, nothing of a
/// certificate, and the fabric label only to take an expired certification out of
/// service ([`fleet_change`]).
pub(crate) const FLEET_MAY_CHANGE: &[Output] = &[
    Output::Condition(keys::CONDITION_FLEET_OUTLIER),
    Output::Label(keys::LABEL_FABRIC),
];

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Output::Label(k) => write!(f, "label {k}"),
            Output::Annotation(k) => write!(f, "annotation {k}"),
            Output::Condition(t) => write!(f, "condition {t}"),
        }
    }
}

/// The parts of a Node the guard reads (everything else is ignored, so any Node decodes).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct NodeView {
    #[serde(default)]
    pub metadata: MetaView,
    #[serde(default)]
    pub status: Option<StatusView>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct MetaView {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct StatusView {
    #[serde(default)]
    pub conditions: Option<Vec<Value>>,
}

impl NodeView {
    /// The value of `output` on this Node. A condition is every entry of that type, by
    /// status, reason and message: its timestamps say nothing about the node.
    fn value(&self, output: Output) -> Option<Value> {
        match output {
            Output::Label(k) => self.label(k).map(|v| Value::String(v.to_string())),
            Output::Annotation(k) => self.annotation(k).map(|v| Value::String(v.to_string())),
            Output::Condition(t) => {
                let entries: Vec<Value> = self
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|c| c.get("type").and_then(Value::as_str) == Some(t))
                    .map(|c| {
                        let field = |k: &str| c.get(k).cloned().unwrap_or(Value::Null);
                        Value::Array(vec![field("status"), field("reason"), field("message")])
                    })
                    .collect();
                (!entries.is_empty()).then_some(Value::Array(entries))
            }
        }
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// Its certificate ([`Certificate::of_annotations`]).
    pub fn certificate(&self) -> Option<Result<Certificate, railguard_api::CertificateError>> {
        Certificate::of_annotations(self.metadata.annotations.as_ref())
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
}

/// The protected outputs that differ between `old` (None: a CREATE) and `new`.
pub fn changed_outputs(old: Option<&NodeView>, new: &NodeView) -> Vec<Output> {
    PROTECTED
        .iter()
        .copied()
        .filter(|&o| old.and_then(|n| n.value(o)) != new.value(o))
        .collect()
}

/// Who writes railguard's outputs, as configured at install.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardPolicy {
    /// The release namespace: where the fleet controller's service account lives.
    pub namespace: String,
    /// Where the prober and campaign service accounts and the prober pods live: the release
    /// namespace, or the `privileged` Pod Security namespace the chart's
    /// `prober.namespace.name` splits them into.
    pub prober_namespace: String,
    /// The probers' ServiceAccount.
    pub prober_service_account: String,
    /// The campaign coordinator's ServiceAccount, when a campaign is installed.
    pub campaign_service_account: Option<String>,
    /// The fleet controller's ServiceAccount, when the fleet controller is installed.
    pub fleet_service_account: Option<String>,
    /// Groups allowed to change any output (break-glass repair), e.g. `system:masters`.
    pub allowed_groups: Vec<String>,
}

fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

impl GuardPolicy {
    /// The probers' user name, `system:serviceaccount:<prober ns>:<sa>`.
    pub fn prober_user(&self) -> String {
        service_account_user(&self.prober_namespace, &self.prober_service_account)
    }

    /// The campaign coordinator's user name (in the probers' namespace), when one is
    /// configured.
    pub fn campaign_user(&self) -> Option<String> {
        self.campaign_service_account
            .as_deref()
            .map(|sa| service_account_user(&self.prober_namespace, sa))
    }

    /// Whether `user` is the probers' service account (its requests need a pod lookup).
    pub fn is_prober(&self, user: &UserInfo) -> bool {
        user.username == self.prober_user()
    }

    /// Whether `user` is the campaign coordinator's service account.
    pub fn is_campaign(&self, user: &UserInfo) -> bool {
        self.campaign_user().is_some_and(|u| user.username == u)
    }

    /// The fleet controller's user name, when one is configured.
    pub fn fleet_user(&self) -> Option<String> {
        self.fleet_service_account
            .as_deref()
            .map(|sa| service_account_user(&self.namespace, sa))
    }

    /// Whether `user` is the fleet controller's service account.
    pub fn is_fleet(&self, user: &UserInfo) -> bool {
        self.fleet_user().is_some_and(|u| user.username == u)
    }
}

/// What the webhook's cache knows of a prober pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodLookup {
    /// The pod is in the cache of prober pods.
    Found(ProberPod),
    /// The cache has synced and does not hold it.
    Missing,
    /// The cache has not listed the prober pods yet (the webhook just started).
    NotSynced,
}

/// The facts of a cached prober pod the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProberPod {
    pub uid: Option<String>,
    /// `spec.nodeName`: None until the pod is scheduled.
    pub node_name: Option<String>,
    pub service_account: Option<String>,
}

/// Who was allowed to change the outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The prober running on that very node.
    OwnProber { pod: String },
    /// The campaign coordinator, recording findings.
    Campaign,
    /// The fleet controller, marking (or clearing) an outlier.
    Fleet,
    /// A member of an allowed (break-glass) group.
    AllowedGroup { group: String },
}

impl Writer {
    /// The metrics label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Writer::OwnProber { .. } => "prober",
            Writer::Campaign => "campaign",
            Writer::Fleet => "fleet",
            Writer::AllowedGroup { .. } => "allowed-group",
        }
    }
}

/// The guard's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No protected output changed: nothing to guard (kubelet status updates, other labels).
    Untouched,
    Allowed(Writer),
    Denied(Denial),
}

/// Why a change was refused; the message reaches the requester (`kubectl`, the prober log).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    /// `writers` names who may write what was changed ([`writers`]).
    #[error("{user} may not change railguard's outputs on node {node} ({changed}): {writers}")]
    NotAWriter {
        user: String,
        node: String,
        changed: String,
        writers: String,
    },
    #[error(
        "the railguard prober may change only node {node}'s certification, not its \
         {changed}: the fleet controller writes that, comparing the node with its fleet"
    )]
    ProberBeyondCertification { node: String, changed: String },
    #[error(
        "the prober's token names no pod ({EXTRA_POD_NAME}): only a service-account token \
         bound to the prober's pod (a projected serviceAccountToken volume) proves which \
         node it runs on"
    )]
    ProberTokenNotBound,
    #[error(
        "prober pod {namespace}/{pod} is not in the webhook's cache of prober pods yet (the \
         webhook started moments ago or the pod was just created): retry shortly"
    )]
    ProberPodNotSynced { namespace: String, pod: String },
    #[error(
        "prober pod {namespace}/{pod} is not a known prober pod (not in the webhook's cache \
         of pods with the prober's labels; if it was created a moment ago, retry)"
    )]
    ProberPodUnknown { namespace: String, pod: String },
    #[error("the token's pod uid {token_uid} is not prober pod {pod}'s ({pod_uid})")]
    ProberPodUidMismatch {
        pod: String,
        token_uid: String,
        pod_uid: String,
    },
    #[error("prober pod {pod} runs as service account {found}, not {expected}")]
    ProberPodServiceAccount {
        pod: String,
        found: String,
        expected: String,
    },
    #[error(
        "prober pod {pod} runs on node {pod_node}, not {node}: a prober certifies its own \
         node only"
    )]
    ProberOfOtherNode {
        pod: String,
        pod_node: String,
        node: String,
    },
    #[error("the token is bound to a pod on node {token_node}, not {node}")]
    TokenOfOtherNode { token_node: String, node: String },
    #[error("prober pod {pod} is not scheduled to a node yet")]
    ProberPodUnscheduled { pod: String },
    #[error("a node is never created with railguard's certification ({changed}) set")]
    CreatedCertified { changed: String },
    #[error(
        "the campaign coordinator may change only the fabric label, the certificate and \
         the RailguardFabricReady condition of node {node}, not its {changed}"
    )]
    CampaignBeyondFindings { node: String, changed: String },
    #[error(
        "the fleet controller may change only the {condition} condition of node {node}, \
         not its {changed}"
    )]
    FleetBeyondOutlier {
        node: String,
        changed: String,
        condition: &'static str,
    },
    #[error(
        "the fleet controller may change node {node}'s {label} label only from certified to \
         pending when its certificate has expired, or from pending back to what the node's \
         certificate says when a prober died mid-run: {problem}"
    )]
    FleetLabelNotExpiry {
        node: String,
        label: &'static str,
        problem: String,
    },
    #[error(
        "the campaign coordinator records findings in node {node}'s existing certificate; \
         {problem}"
    )]
    CampaignCertificate { node: String, problem: String },
    #[error(
        "node {node}'s new certificate was made by a simulated engine (simulated: true) and \
         profile {profile} does not set certification.acceptSimulated: a simulated \
         certificate never certifies real hardware (run the prober without --sim, or set \
         acceptSimulated on a profile whose nodes are simulated)"
    )]
    SimulatedCertificate { node: String, profile: String },
    #[error(
        "node {node}'s new certificate was made by a simulated engine (simulated: true) for \
         profile {profile}, which is not in the webhook's profile cache (a profile created a \
         moment ago, or none of that name): retry shortly"
    )]
    SimulatedCertificateUnknownProfile { node: String, profile: String },
}

/// A write that stores a simulated certificate (`simulated: true`) on a Node is refused
/// unless its profile accepts simulation (`profile_accepts` answers the profile's
/// `certification.acceptSimulated`, None when the profile is unknown): whoever runs the
/// prober with `--sim` on a real cluster must not certify a node by it. Only a changed
/// certificate is read, so kubelet updates and pending marks cost a comparison.
pub fn check_simulated(
    change: NodeChange<'_>,
    profile_accepts: impl FnOnce(&str) -> Option<bool>,
) -> Result<(), Denial> {
    let key = keys::ANNOTATION_CERTIFICATE;
    let new = change.new.annotation(key);
    if change.old.and_then(|o| o.annotation(key)) == new {
        return Ok(());
    }
    // A certificate that does not parse is the readers' problem (they refuse it); the other
    // checks of the writer already ran.
    let Some(cert) = new.and_then(|raw| Certificate::from_annotation(raw).ok()) else {
        return Ok(());
    };
    if !cert.simulated {
        return Ok(());
    }
    let (node, profile) = (change.node.to_string(), cert.profile.clone());
    match profile_accepts(&cert.profile) {
        Some(true) => Ok(()),
        Some(false) => Err(Denial::SimulatedCertificate { node, profile }),
        None => Err(Denial::SimulatedCertificateUnknownProfile { node, profile }),
    }
}

/// One Node change, as the API server presents it.
#[derive(Clone, Copy, Debug)]
pub struct NodeChange<'a> {
    /// The Node's name.
    pub node: &'a str,
    /// Before the change; None for a CREATE.
    pub old: Option<&'a NodeView>,
    pub new: &'a NodeView,
    pub user: &'a UserInfo,
    /// When the API server asked (a certificate's expiry is judged against it).
    pub now: jiff::Timestamp,
}

/// Decides one change. `lookup` is asked for a prober pod by name (the pod the prober's
/// token is bound to), only when the prober's service account changed an output.
pub fn decide(
    change: NodeChange<'_>,
    policy: &GuardPolicy,
    lookup: impl FnOnce(&str) -> PodLookup,
) -> Decision {
    let changed = changed_outputs(change.old, change.new);
    if changed.is_empty() {
        return Decision::Untouched;
    }
    let user = change.user;
    if let Some(group) = user
        .groups
        .iter()
        .find(|g| policy.allowed_groups.iter().any(|a| a == *g))
    {
        return Decision::Allowed(Writer::AllowedGroup {
            group: group.clone(),
        });
    }
    let listed = list(&changed);
    if change.old.is_none() {
        // No prober, campaign or fleet controller creates Nodes: only a kubelet (--node-labels) or a tenant
        // would register one already certified.
        return Decision::Denied(Denial::CreatedCertified { changed: listed });
    }
    let verdict = if policy.is_prober(user) {
        prober_change(change, &changed, policy, lookup)
    } else if policy.is_campaign(user) {
        campaign_change(change, &changed)
    } else if policy.is_fleet(user) {
        fleet_change(change, &changed)
    } else {
        Err(Denial::NotAWriter {
            user: if user.username.is_empty() {
                "an anonymous requester".to_string()
            } else {
                format!("user {:?}", user.username)
            },
            node: change.node.to_string(),
            changed: listed,
            writers: writers(&changed, change.node, policy),
        })
    };
    match verdict {
        Ok(writer) => Decision::Allowed(writer),
        Err(denial) => Decision::Denied(denial),
    }
}

/// Who writes the `changed` outputs of `node`, for a denial: the certification's writers,
/// the fleet controller for its outlier mark, or both.
fn writers(changed: &[Output], node: &str, policy: &GuardPolicy) -> String {
    let mut parts = Vec::new();
    if changed.iter().any(|o| PROBER_MAY_CHANGE.contains(o)) {
        parts.push(format!(
            "only the node's own railguard prober ({} in a pod on {node}) and the campaign \
             coordinator write its certification; operators ask for a new run with the {} \
             annotation",
            policy.prober_user(),
            keys::ANNOTATION_RECERTIFY
        ));
    }
    if changed.contains(&Output::Condition(keys::CONDITION_FLEET_OUTLIER)) {
        let fleet = policy
            .fleet_user()
            .unwrap_or_else(|| "none is configured".to_string());
        parts.push(format!(
            "only the fleet controller ({fleet}) writes the {} condition",
            keys::CONDITION_FLEET_OUTLIER
        ));
    }
    parts.join("; ")
}

/// The `changed` outputs that are not among `may_change`.
fn beyond(changed: &[Output], may_change: &[Output]) -> Vec<Output> {
    changed
        .iter()
        .copied()
        .filter(|o| !may_change.contains(o))
        .collect()
}

fn list(outputs: &[Output]) -> String {
    outputs
        .iter()
        .map(Output::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Exactly one value of an extra attribute, or None.
fn single<'a>(user: &'a UserInfo, key: &str) -> Option<&'a str> {
    match user.extra.get(key).map(Vec::as_slice) {
        Some([one]) if !one.is_empty() => Some(one.as_str()),
        _ => None,
    }
}

fn prober_change(
    change: NodeChange<'_>,
    changed: &[Output],
    policy: &GuardPolicy,
    lookup: impl FnOnce(&str) -> PodLookup,
) -> Result<Writer, Denial> {
    let node = change.node;
    let user = change.user;
    let beyond = beyond(changed, PROBER_MAY_CHANGE);
    if !beyond.is_empty() {
        return Err(Denial::ProberBeyondCertification {
            node: node.to_string(),
            changed: list(&beyond),
        });
    }
    let pod_name = single(user, EXTRA_POD_NAME).ok_or(Denial::ProberTokenNotBound)?;
    if let Some(token_node) = single(user, EXTRA_NODE_NAME) {
        if token_node != node {
            return Err(Denial::TokenOfOtherNode {
                token_node: token_node.to_string(),
                node: node.to_string(),
            });
        }
    }
    let pod = match lookup(pod_name) {
        PodLookup::Found(pod) => pod,
        PodLookup::Missing => {
            return Err(Denial::ProberPodUnknown {
                namespace: policy.prober_namespace.clone(),
                pod: pod_name.to_string(),
            })
        }
        PodLookup::NotSynced => {
            return Err(Denial::ProberPodNotSynced {
                namespace: policy.prober_namespace.clone(),
                pod: pod_name.to_string(),
            })
        }
    };
    if let (Some(token_uid), Some(pod_uid)) = (single(user, EXTRA_POD_UID), pod.uid.as_deref()) {
        if token_uid != pod_uid {
            return Err(Denial::ProberPodUidMismatch {
                pod: pod_name.to_string(),
                token_uid: token_uid.to_string(),
                pod_uid: pod_uid.to_string(),
            });
        }
    }
    // The cache selects pods by label, and labels are whatever the pod's creator wrote.
    let service_account = pod.service_account.as_deref().unwrap_or("default");
    if service_account != policy.prober_service_account {
        return Err(Denial::ProberPodServiceAccount {
            pod: pod_name.to_string(),
            found: service_account.to_string(),
            expected: policy.prober_service_account.clone(),
        });
    }
    match pod.node_name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) if n == node => Ok(Writer::OwnProber {
            pod: pod_name.to_string(),
        }),
        Some(other) => Err(Denial::ProberOfOtherNode {
            pod: pod_name.to_string(),
            pod_node: other.to_string(),
            node: node.to_string(),
        }),
        None => Err(Denial::ProberPodUnscheduled {
            pod: pod_name.to_string(),
        }),
    }
}

fn campaign_change(change: NodeChange<'_>, changed: &[Output]) -> Result<Writer, Denial> {
    let node = change.node;
    let beyond = beyond(changed, CAMPAIGN_MAY_CHANGE);
    if !beyond.is_empty() {
        return Err(Denial::CampaignBeyondFindings {
            node: node.to_string(),
            changed: list(&beyond),
        });
    }
    if changed.contains(&Output::Annotation(keys::ANNOTATION_CERTIFICATE)) {
        let problem = |p: String| Denial::CampaignCertificate {
            node: node.to_string(),
            problem: p,
        };
        let read = |view: Option<&NodeView>, which: &str| {
            let raw = view
                .and_then(|v| v.annotation(keys::ANNOTATION_CERTIFICATE))
                .ok_or_else(|| problem(format!("the {which} node has no certificate")))?;
            Certificate::from_annotation(raw).map_err(|e| {
                problem(format!(
                    "the {which} certificate does not parse: {}",
                    railguard_api::error::error_chain(&e)
                ))
            })
        };
        let before = read(change.old, "current")?;
        let after = read(Some(change.new), "new")?;
        for (what, a, b) in [
            ("profile", &before.profile, &after.profile),
            ("signature", &before.signature, &after.signature),
        ] {
            if a != b {
                return Err(problem(format!(
                    "it may not change the {what} ({a} to {b})"
                )));
            }
        }
        if before.node != after.node {
            return Err(problem("it may not change the node it names".to_string()));
        }
    }
    Ok(Writer::Campaign)
}

fn fleet_change(change: NodeChange<'_>, changed: &[Output]) -> Result<Writer, Denial> {
    let node = change.node;
    let beyond = beyond(changed, FLEET_MAY_CHANGE);
    if !beyond.is_empty() {
        return Err(Denial::FleetBeyondOutlier {
            node: node.to_string(),
            changed: list(&beyond),
            condition: keys::CONDITION_FLEET_OUTLIER,
        });
    }
    if changed.contains(&Output::Label(keys::LABEL_FABRIC)) {
        if let Err(expiry) = expiry_flip(change) {
            orphan_restore(change).map_err(|restore| Denial::FleetLabelNotExpiry {
                node: node.to_string(),
                label: keys::LABEL_FABRIC,
                problem: format!("{expiry}; {restore}"),
            })?;
        }
    }
    Ok(Writer::Fleet)
}

/// The other label change the fleet controller makes: a run's `pending` mark back to the
/// label the node's own (unchanged) certificate gives now, after the prober that marked it
/// died mid-run (its slot Lease expired). It certifies nothing the prober did not: the
/// label becomes what the prober's certificate already says.
fn orphan_restore(change: NodeChange<'_>) -> Result<(), String> {
    let before = change.old.and_then(|v| v.label(keys::LABEL_FABRIC));
    let after = change.new.label(keys::LABEL_FABRIC);
    if before != Some(keys::fabric::PENDING) {
        return Err("only a pending mark is given back to its certificate".to_string());
    }
    let cert = change
        .new
        .certificate()
        .ok_or_else(|| "the node has no certificate to give it back to".to_string())?
        .map_err(|e| {
            format!(
                "its certificate does not parse: {}",
                railguard_api::error::error_chain(&e)
            )
        })?;
    let wanted = cert.fabric_label(change.now);
    if wanted == keys::fabric::PENDING || after != Some(wanted) {
        return Err(format!(
            "its certificate gives {wanted}, not {}",
            after.unwrap_or("(none)")
        ));
    }
    Ok(())
}

/// The one label change the fleet controller makes: `certified` to `pending` on a node
/// whose certificate (left as it is, so its verdict stays certified) expired before `now`.
/// Anything else would let the controller certify or fail a node, which is the prober's.
fn expiry_flip(change: NodeChange<'_>) -> Result<(), String> {
    let before = change.old.and_then(|v| v.label(keys::LABEL_FABRIC));
    let after = change.new.label(keys::LABEL_FABRIC);
    if before != Some(keys::fabric::CERTIFIED) || after != Some(keys::fabric::PENDING) {
        return Err(format!(
            "this changes it from {} to {}",
            before.unwrap_or("(none)"),
            after.unwrap_or("(none)")
        ));
    }
    let cert = change
        .new
        .certificate()
        .ok_or_else(|| "the node has no certificate".to_string())?
        .map_err(|e| {
            format!(
                "its certificate does not parse: {}",
                railguard_api::error::error_chain(&e)
            )
        })?;
    if cert.fabric_label(change.now) != keys::fabric::PENDING {
        return Err(format!(
            "its {} certificate expires at {}",
            cert.verdict, cert.expires_at
        ));
    }
    Ok(())
}

/// Strips a Node to its protected outputs.
pub fn keep_outputs(node: &mut k8s_openapi::api::core::v1::Node) {
    let (labels, annotations, conditions): (Vec<&str>, Vec<&str>, Vec<&str>) = PROTECTED
        .iter()
        .fold(Default::default(), |(mut l, mut a, mut c), o| {
            match *o {
                Output::Label(k) => l.push(k),
                Output::Annotation(k) => a.push(k),
                Output::Condition(t) => c.push(t),
            }
            (l, a, c)
        });
    let meta = &mut node.metadata;
    meta.managed_fields.get_or_insert_with(Vec::new).clear();
    meta.labels
        .get_or_insert_with(Default::default)
        .retain(|k, _| labels.contains(&k.as_str()));
    meta.annotations
        .get_or_insert_with(Default::default)
        .retain(|k, _| annotations.contains(&k.as_str()));
    node.spec = None;
    if let Some(status) = node.status.as_mut() {
        let kept = status
            .conditions
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| conditions.contains(&c.type_.as_str()))
            .collect();
        *status = Default::default();
        status.conditions = Some(kept);
    }
}
