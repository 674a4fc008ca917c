//! `rdma`: the profile's RDMA device resource (shared device: 1; per GPU: the container's
//! GPU count; per rail: the profile's rail count) in every target container that does not
//! name it already.

use railguard_api::pod::container_gpu_count;

use crate::error::MutateError;
use crate::mutate::container::has_resource;
use crate::mutate::{Ctx, Draft, Mutation};

pub(crate) fn rdma(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    let Some(r) = ctx.profile.spec.rdma.as_ref() else {
        return Ok(());
    };
    // A pod claiming its profile's aligned rails gets its NICs from DRA.
    if ctx.skip.contains(&Mutation::Rdma) || ctx.dra.is_some() {
        return Ok(());
    }
    for shadow in &mut draft.containers {
        let c = &shadow.container;
        let count = r.count(
            container_gpu_count(c, &ctx.config.gpu_resources),
            ctx.profile.spec.rails.len(),
        );
        if count > 0 && !has_resource(c, &r.resource_name) {
            shadow.add_extended_resource(&r.resource_name, count, &mut draft.plan.ops);
            draft.done.insert(Mutation::Rdma);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{apply_ops, open, pod_of, profile, H100};
    use crate::{NamespaceInfo, WebhookConfig};
    use railguard_api::profile::RdmaCountMode;

    fn count_for(mode: RdmaCountMode, resources: serde_json::Value) -> Option<String> {
        let p = pod_of(json!([{"name": "t", "resources": resources}]));
        let mut h = profile(H100);
        h.spec.rdma.as_mut().unwrap().count_mode = mode;
        let name = h.spec.rdma.as_ref().unwrap().resource_name.clone();
        let (profiles, ns, config) = (vec![h], NamespaceInfo::new("ml"), WebhookConfig::default());
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        rdma(&ctx, &mut draft).unwrap();
        let out = apply_ops(&p, &draft.plan.ops);
        let c = &out.spec.as_ref().unwrap().containers[0];
        let r = c.resources.as_ref().unwrap();
        let limit = r
            .limits
            .as_ref()
            .and_then(|m| m.get(&name))
            .map(|q| q.0.clone());
        let request = r
            .requests
            .as_ref()
            .and_then(|m| m.get(&name))
            .map(|q| q.0.clone());
        assert_eq!(limit, request, "extended resources: requests equal limits");
        limit
    }

    #[test]
    fn counts_per_mode() {
        let eight = json!({"limits": {"nvidia.com/gpu": "8"}});
        assert_eq!(
            count_for(RdmaCountMode::SharedDevice, eight.clone()).as_deref(),
            Some("1")
        );
        assert_eq!(
            count_for(RdmaCountMode::PerGpu, eight.clone()).as_deref(),
            Some("8")
        );
        assert_eq!(
            count_for(RdmaCountMode::PerRail, eight).as_deref(),
            Some("8")
        );
        let requests_only = json!({"requests": {"nvidia.com/gpu": "2"}});
        assert_eq!(
            count_for(RdmaCountMode::PerGpu, requests_only).as_deref(),
            Some("2")
        );
    }

    #[test]
    fn a_resource_the_user_named_is_theirs() {
        let resources = json!({"limits": {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "0"},
            "requests": {"rdma/rdma_shared_device_a": "0"}});
        assert_eq!(
            count_for(RdmaCountMode::SharedDevice, resources).as_deref(),
            Some("0")
        );
    }
}
