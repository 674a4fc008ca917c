//! `network`: the profile's Multus networks merged into the pod's
//! `k8s.v1.cni.cncf.io/networks` annotation, in the form the user wrote it. Not for
//! hostNetwork pods, nor for pods claiming their rails through DRA: the NIC driver (dranet)
//! moves the allocated NICs into the pod, and a Multus SR-IOV attachment on top would take
//! a second interface on the same rails. An annotation that does not parse is left alone,
//! with a warning.

use railguard_api::keys;

use crate::error::MutateError;
use crate::mutate::{Ctx, Draft, Mutation, WarningKind};
use crate::networks;

pub(crate) fn network(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    let wanted = &ctx.profile.spec.networks;
    if wanted.is_empty()
        || ctx.skip.contains(&Mutation::Network)
        || ctx.spec.host_network.unwrap_or(false)
        || ctx.dra.is_some()
    {
        return Ok(());
    }
    let pod_ns = ctx
        .pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or(&ctx.namespace.name);
    let existing = ctx
        .annotations
        .get(keys::ANNOTATION_MULTUS_NETWORKS)
        .map(String::as_str);
    match networks::merge(existing, wanted, pod_ns) {
        Ok(Some(merged)) => {
            draft
                .annotations
                .insert(keys::ANNOTATION_MULTUS_NETWORKS.to_string(), merged);
            draft.done.insert(Mutation::Network);
        }
        Ok(None) => {}
        Err(e) => draft.plan.warn(
            WarningKind::Network,
            format!(
                "{}: {}; networks not added",
                keys::ANNOTATION_MULTUS_NETWORKS,
                railguard_api::error::error_chain(&e)
            ),
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{in_ml, open, pod_of, profile, ROCE};

    fn run(networks: Option<&str>) -> Draft {
        let mut p =
            pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]));
        if let Some(n) = networks {
            p.metadata.annotations =
                Some([(keys::ANNOTATION_MULTUS_NETWORKS.to_string(), n.to_string())].into());
        }
        let mut roce = profile(ROCE);
        roce.spec.default = true;
        let (profiles, ns, config) = in_ml(vec![roce]);
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        network(&ctx, &mut draft).unwrap();
        draft
    }

    #[test]
    fn the_profile_networks_join_the_user_list() {
        let draft = run(Some("storage-net"));
        let merged = &draft.annotations[keys::ANNOTATION_MULTUS_NETWORKS];
        assert!(
            merged.starts_with("storage-net,gpu-rdma/sriov-rdma-0"),
            "{merged}"
        );
        assert!(draft.done.contains(&Mutation::Network));
    }

    #[test]
    fn an_annotation_that_does_not_parse_is_left_with_a_warning() {
        let draft = run(Some("[{\"name\": "));
        assert!(draft.annotations.is_empty());
        assert_eq!(draft.plan.warnings[0].kind, WarningKind::Network);
        assert!(draft.done.is_empty());
    }

    #[test]
    fn a_pod_claiming_its_rails_through_dra_gets_no_multus_networks() {
        let p = pod_of(json!([{"name": "t", "resources": {"claims": [{"name": "rails"}]}}]));
        let mut p = p;
        if let Some(spec) = p.spec.as_mut() {
            spec.resource_claims = Some(vec![serde_json::from_value(json!({
                "name": "rails", "resourceClaimTemplateName": "railguard-roce-cloud-8-rails"
            }))
            .unwrap()]);
        }
        let mut roce = profile(ROCE);
        roce.spec.default = true;
        let (profiles, ns, config) = in_ml(vec![roce]);
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        assert!(ctx.dra.is_some(), "recognised as a DRA pod");
        network(&ctx, &mut draft).unwrap();
        assert!(draft.annotations.is_empty());
        assert!(!draft.done.contains(&Mutation::Network));
    }
}
