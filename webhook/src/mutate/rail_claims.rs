//! Pods that claim railguard's aligned rails through DRA (Kubernetes 1.37+): a
//! `spec.resourceClaims[]` entry whose ResourceClaimTemplate (or ResourceClaim) is named
//! `railguard-<profile>-<n>-rails` ([`claim_template_name`]: the chart's templates of n GPUs
//! and n NICs, each GPU under the PCIe root of its NIC). DRA allocates such a pod's NICs and
//! GPUs on the node it picks, and the fleet controller's device taints keep failed rails out
//! of the allocation, so the webhook leaves node placement and the RDMA device resource to
//! DRA and still configures what does not depend on the allocation (NCCL, IPC_LOCK,
//! /dev/shm).

use k8s_openapi::api::core::v1::{Container, PodSpec};
use railguard_api::dra::claim_template_name;
use railguard_api::FabricProfile;

/// The largest rail count a claim name is recognised for.
pub(crate) const MAX_CLAIM_RAILS: u32 = 64;

/// One claim of aligned rails in a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RailClaim {
    /// The pod's name for the claim (`spec.resourceClaims[].name`, which containers name in
    /// `resources.claims`).
    pub(crate) claim: String,
    /// The ResourceClaimTemplate (or ResourceClaim) it references.
    pub(crate) source: String,
    /// The profile whose rails it claims.
    pub(crate) profile: String,
    /// How many aligned GPU+NIC pairs.
    pub(crate) rails: u32,
}

/// The profile among `profiles` and the rail count (1..=[`MAX_CLAIM_RAILS`]) whose
/// aligned-rails name `name` is, if any.
pub(crate) fn parse_claim_name<'p>(
    name: &str,
    profiles: &'p [FabricProfile],
) -> Option<(&'p FabricProfile, u32)> {
    profiles.iter().find_map(|p| {
        // Every such name holds the profile's name: most profiles are out at once.
        if !name.contains(p.name()) {
            return None;
        }
        (1..=MAX_CLAIM_RAILS)
            .find(|&n| claim_template_name(p.name(), n) == name)
            .map(|n| (p, n))
    })
}

/// The pod's claims of aligned rails of any of `profiles`, in `spec.resourceClaims` order.
/// Empty (and nothing allocated) for a pod without resource claims.
pub(crate) fn rail_claims(spec: &PodSpec, profiles: &[FabricProfile]) -> Vec<RailClaim> {
    spec.resource_claims
        .iter()
        .flatten()
        .filter_map(|rc| {
            [
                rc.resource_claim_template_name.as_deref(),
                rc.resource_claim_name.as_deref(),
            ]
            .into_iter()
            .flatten()
            .find_map(|source| {
                parse_claim_name(source, profiles).map(|(p, rails)| RailClaim {
                    claim: rc.name.clone(),
                    source: source.to_string(),
                    profile: p.name().to_string(),
                    rails,
                })
            })
        })
        .collect()
}

/// Whether container `c` uses one of `claims` (names it in `resources.claims`).
pub(crate) fn uses_claim(c: &Container, claims: &[RailClaim]) -> bool {
    !claims.is_empty()
        && c.resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .is_some_and(|cs| cs.iter().any(|u| claims.iter().any(|k| k.claim == u.name)))
}

/// The one profile the pod's claims name (none when they name none or several).
pub(crate) fn claimed_profile<'p>(
    claims: &[RailClaim],
    profiles: &'p [FabricProfile],
) -> Option<&'p FabricProfile> {
    let first = claims.first()?;
    if claims.iter().any(|c| c.profile != first.profile) {
        return None;
    }
    profiles.iter().find(|p| p.name() == first.profile)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{pod, profile, A100, H100, ROCE};

    fn profiles() -> Vec<FabricProfile> {
        vec![profile(A100), profile(H100), profile(ROCE)]
    }

    #[test]
    fn names_are_api_dras_for_every_rail_count_of_a_known_profile() {
        let ps = profiles();
        for p in &ps {
            for n in [1, 2, 4, 8, 16, 64] {
                let name = claim_template_name(p.name(), n);
                let (q, m) = parse_claim_name(&name, &ps).unwrap();
                assert_eq!((q.name(), m), (p.name(), n), "{name}");
            }
        }
        for name in [
            "railguard-h100-ndr-0-rails",
            "railguard-h100-ndr-65-rails",
            "railguard-h100-ndr-08-rails",
            "railguard-h100-ndr-8-rail",
            "railguard-h100-ndr-rails",
            "railguard-h200-8-rails",
            "h100-ndr-8-rails",
            "railguard-h100-ndr-nic",
            "",
        ] {
            assert!(parse_claim_name(name, &ps).is_none(), "{name}");
        }
    }

    #[test]
    fn template_and_claim_references_both_count() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"claims": [{"name": "rails"}]}},
                    {"name": "b", "resources": {"claims": [{"name": "other"}]}},
                    {"name": "c"}
                ],
                "resourceClaims": [
                    {"name": "rails", "resourceClaimTemplateName": "railguard-h100-ndr-8-rails"},
                    {"name": "shared", "resourceClaimName": "railguard-h100-ndr-2-rails"},
                    {"name": "other", "resourceClaimTemplateName": "gpu-any"}
                ]
            }
        }));
        let spec = p.spec.as_ref().unwrap();
        let ps = profiles();
        let claims = rail_claims(spec, &ps);
        assert_eq!(
            claims
                .iter()
                .map(|c| (
                    c.claim.as_str(),
                    c.source.as_str(),
                    c.profile.as_str(),
                    c.rails
                ))
                .collect::<Vec<_>>(),
            [
                ("rails", "railguard-h100-ndr-8-rails", "h100-ndr", 8),
                ("shared", "railguard-h100-ndr-2-rails", "h100-ndr", 2),
            ]
        );
        let uses: Vec<bool> = spec
            .containers
            .iter()
            .map(|c| uses_claim(c, &claims))
            .collect();
        assert_eq!(uses, [true, false, false]);
        assert_eq!(claimed_profile(&claims, &ps).unwrap().name(), "h100-ndr");
        let mut two = claims.clone();
        two.push(RailClaim {
            profile: "a100-hdr".into(),
            ..claims[0].clone()
        });
        assert!(
            claimed_profile(&two, &ps).is_none(),
            "two profiles: neither"
        );
        assert!(claimed_profile(&[], &ps).is_none());
    }
}
