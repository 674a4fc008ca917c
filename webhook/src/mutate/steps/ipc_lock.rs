//! `ipc-lock`: the IPC_LOCK capability (RDMA pins memory) in every target container that
//! lacks it, unless the gates found Pod Security would reject it.

use crate::error::MutateError;
use crate::mutate::container::{has_ipc_lock, IPC_LOCK};
use crate::mutate::{Ctx, Draft, Mutation};

pub(crate) fn ipc_lock(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    if !ctx.ipc_lock {
        return Ok(());
    }
    for shadow in &mut draft.containers {
        if !has_ipc_lock(&shadow.container) {
            shadow.add_capability(IPC_LOCK, &mut draft.plan.ops);
            draft.done.insert(Mutation::IpcLock);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{apply_ops, in_ml, open, pod_of, profile, H100};
    use crate::{NamespaceInfo, WebhookConfig};

    #[test]
    fn added_next_to_other_capabilities_and_not_twice() {
        let p = pod_of(json!([
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}},
             "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}},
             "securityContext": {"capabilities": {"add": ["CAP_IPC_LOCK"]}}},
            {"name": "sidecar"}
        ]));
        let (profiles, ns, config) = in_ml(vec![profile(H100)]);
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        ipc_lock(&ctx, &mut draft).unwrap();
        assert_eq!(draft.plan.ops.len(), 1);
        let out = apply_ops(&p, &draft.plan.ops);
        let caps = |i: usize| {
            out.spec.as_ref().unwrap().containers[i]
                .security_context
                .as_ref()
                .and_then(|s| s.capabilities.as_ref())
                .and_then(|c| c.add.clone())
        };
        assert_eq!(caps(0).unwrap(), ["NET_ADMIN", "IPC_LOCK"]);
        assert_eq!(caps(1).unwrap(), ["CAP_IPC_LOCK"]);
        assert_eq!(caps(2), None, "not a target");
    }

    #[test]
    fn not_added_where_pod_security_rejects_it() {
        let p = pod_of(json!([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
        let ns =
            NamespaceInfo::new("ml").with_label("pod-security.kubernetes.io/enforce", "baseline");
        let (profiles, config) = (vec![profile(H100)], WebhookConfig::default());
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        ipc_lock(&ctx, &mut draft).unwrap();
        assert!(draft.plan.ops.is_empty());
        assert!(draft.done.is_empty());
    }
}
