//! Which profile and signature a pod is held to ([`PodTarget`]).

use std::collections::BTreeMap;
use std::fmt;

use railguard_api::{FabricProfile, NodeFabric};

use crate::decision::ExtenderConfig;
use crate::pod::PodFacts;

/// What a pod is held to.
#[derive(Clone, Debug)]
pub enum PodTarget<'a> {
    /// Not a GPU pod: every node passes, scores are 0.
    PassThrough,
    /// Checked against a profile and rail-layout signature.
    Profile {
        profile: &'a FabricProfile,
        signature: String,
        /// `allow-uncertified` honored for this pod's namespace: the nodes of this profile's
        /// pool pass uncertified (an exemption never reaches another profile's nodes).
        exempt: bool,
    },
    /// A GPU pod that names no profile and requests no RDMA (the webhook did not see it, or
    /// let it through): on every node of a profile's pool it is held to that profile; nodes
    /// of no pool are not railguard's and pass.
    Pools(&'a [FabricProfile]),
    /// A training pod that cannot be checked; every node fails with this reason until that
    /// changes.
    Unplaceable(Unplaceable),
}

/// Why a training pod cannot be checked against any profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unplaceable {
    /// Its `railguard.io/profile` names no FabricProfile.
    UnknownProfile(String),
    /// It has no profile annotation and no FabricProfile is marked default.
    NoDefault,
    /// It has no profile annotation and these FabricProfiles are all marked default.
    SeveralDefaults(Vec<String>),
}

impl fmt::Display for Unplaceable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unplaceable::UnknownProfile(name) => write!(
                f,
                "railguard: pod asks for FabricProfile {name}, which does not exist"
            ),
            Unplaceable::NoDefault => f.write_str(
                "railguard: pod requests GPUs and RDMA without a railguard.io/profile annotation and no FabricProfile is marked default",
            ),
            Unplaceable::SeveralDefaults(names) => write!(
                f,
                "railguard: pod has no railguard.io/profile annotation and several FabricProfiles are marked default ({}); set one",
                names.join(", ")
            ),
        }
    }
}

/// Chooses what `pod` is held to. `namespace_labels` are the labels of the pod's
/// namespace when known (exemptions are honored only when the profile allows them).
pub fn target_for<'a>(
    pod: &PodFacts,
    profiles: &'a [FabricProfile],
    namespace_labels: Option<&BTreeMap<String, String>>,
    config: &ExtenderConfig,
) -> PodTarget<'a> {
    let profile = match &pod.profile {
        Some(name) => match profiles.iter().find(|p| p.name() == name) {
            Some(p) => p,
            None => return PodTarget::Unplaceable(Unplaceable::UnknownProfile(name.clone())),
        },
        None => {
            if !pod.requests_any(&config.gpu_resources) {
                return PodTarget::PassThrough;
            }
            if !requests_rdma(pod, profiles) {
                return PodTarget::Pools(profiles);
            }
            let defaults: Vec<&FabricProfile> =
                profiles.iter().filter(|p| p.spec.default).collect();
            match defaults.as_slice() {
                [p] => *p,
                [] => return PodTarget::Unplaceable(Unplaceable::NoDefault),
                many => {
                    let names = many.iter().map(|p| p.name().to_string()).collect();
                    return PodTarget::Unplaceable(Unplaceable::SeveralDefaults(names));
                }
            }
        }
    };
    let signature = pod
        .signature
        .clone()
        .unwrap_or_else(|| profile.spec.signature());
    let exempt = pod.allow_uncertified
        && namespace_labels
            .is_some_and(|labels| profile.spec.exemptions.allows(&pod.namespace, labels));
    PodTarget::Profile {
        profile,
        signature,
        exempt,
    }
}

/// Whether `node` is in `profile`'s pool: it carries every label of the profile's
/// nodeSelector (an empty selector claims every node).
pub fn in_pool(node: &NodeFabric, profile: &FabricProfile) -> bool {
    profile
        .spec
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
}

/// RDMA resources: any profile's RDMA resource name, or the `rdma/` resource domain.
fn requests_rdma(pod: &PodFacts, profiles: &[FabricProfile]) -> bool {
    pod.extended_resources.iter().any(|r| {
        r.starts_with("rdma/")
            || profiles
                .iter()
                .filter_map(|p| p.spec.rdma.as_ref())
                .any(|rdma| &rdma.resource_name == r)
    })
}
