//! `dra-claims`: a pod that claims its profile's aligned rails (`railguard-<profile>-<n>-rails`,
//! DRA, Kubernetes 1.37+) gets its NICs and GPUs from that claim, on the node the scheduler
//! allocates it on, and the fleet controller's device taints keep failed rails out. So
//! `affinity` (the certified-node rule), `rdma` (the RDMA device resource) and `network` (the
//! profile's Multus networks: the NIC driver attaches the allocated NICs) leave it alone;
//! this step records that decision: the mutation `dra-claims` in `railguard.io/mutations` and
//! a `dra` warning. The rest of the configuration (NCCL, IPC_LOCK, /dev/shm) is the same.

use crate::error::MutateError;
use crate::mutate::{Ctx, Draft, Mutation, WarningKind};

pub(crate) fn dra(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    let Some(claim) = &ctx.dra else {
        return Ok(());
    };
    draft.done.insert(Mutation::DraClaims);
    let rdma = ctx
        .profile
        .spec
        .rdma
        .as_ref()
        .map_or("RDMA resource", |r| r.resource_name.as_str());
    draft.plan.warn(
        WarningKind::Dra,
        format!(
            "DRA claim {}: node affinity, {rdma} and networks left to DRA",
            claim.source
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{in_ml, open, pod, profile, H100};

    #[test]
    fn a_claim_of_the_profiles_rails_is_recorded_and_warned() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {
                "containers": [{"name": "t", "resources": {"claims": [{"name": "rails"}]}}],
                "resourceClaims": [{"name": "rails", "resourceClaimTemplateName": "railguard-h100-ndr-4-rails"}]
            }
        }));
        let (profiles, ns, config) = in_ml(vec![profile(H100)]);
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        assert_eq!(ctx.dra.as_ref().unwrap().rails, 4);
        dra(&ctx, &mut draft).unwrap();
        assert!(draft.done.contains(&Mutation::DraClaims));
        assert!(draft.plan.ops.is_empty(), "a decision, no change");
        assert_eq!(draft.plan.warnings.len(), 1);
        assert_eq!(draft.plan.warnings[0].kind, WarningKind::Dra);
        assert_eq!(
            draft.plan.warnings[0].message,
            "DRA claim railguard-h100-ndr-4-rails: node affinity, rdma/rdma_shared_device_a and networks left to DRA"
        );
    }

    #[test]
    fn a_pod_without_claims_is_not_touched() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
        }));
        let (profiles, ns, config) = in_ml(vec![profile(H100)]);
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        dra(&ctx, &mut draft).unwrap();
        assert!(draft.done.is_empty() && draft.plan.warnings.is_empty());
    }
}
