//! `shm`: a memory-backed `/dev/shm` (NCCL's SHM transport outgrows the runtime's 64 MiB) in
//! every target container without one, the `railguard-shm` volume behind it, and
//! `RAILGUARD_SHM_SIZE` (its size limit) next to every mount of it, so preflight checks the
//! size actually mounted. Not for hostIPC pods: their `/dev/shm` is the node's.

use railguard_api::keys::env;

use crate::error::MutateError;
use crate::mutate::container::{dev_shm_mount, env_var, find_env};
use crate::mutate::{Ctx, Draft, Mutation, SHM_VOLUME};

const MOUNT_PATH: &str = "/dev/shm";

pub(crate) fn shm(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    if ctx.skip.contains(&Mutation::Shm) || ctx.spec.host_ipc.unwrap_or(false) {
        return Ok(());
    }
    let existing = ctx
        .spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == SHM_VOLUME);
    // The size of the volume the mounts use: the one already in the pod (a reinvocation, a
    // container added later), else the one added below.
    let size = match existing {
        Some(volume) => volume
            .empty_dir
            .as_ref()
            .filter(|e| e.medium.as_deref() == Some("Memory"))
            .and_then(|e| e.size_limit.as_ref())
            .map(|q| q.0.clone()),
        None => ctx.profile.spec.shm_size.clone(),
    };
    let mut mounted = false;
    for shadow in &mut draft.containers {
        let ops_before = draft.plan.ops.len();
        if dev_shm_mount(&shadow.container).is_none() {
            shadow.add_mount(SHM_VOLUME, MOUNT_PATH, &mut draft.plan.ops);
            mounted = true;
        }
        let ours = dev_shm_mount(&shadow.container).is_some_and(|m| m.name == SHM_VOLUME);
        if let (true, Some(size)) = (ours, &size) {
            if find_env(&shadow.container, env::SHM_SIZE).is_none() {
                shadow.add_env(vec![env_var(env::SHM_SIZE, size)], &mut draft.plan.ops);
            }
        }
        if draft.plan.ops.len() > ops_before {
            draft.done.insert(Mutation::Shm);
        }
    }
    if mounted && existing.is_none() {
        draft.add_volume(|o| {
            o.str("name", SHM_VOLUME).object("emptyDir", |e| {
                e.str("medium", "Memory");
                if let Some(size) = &size {
                    e.str("sizeLimit", size);
                }
            });
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::core::v1::{Container, Pod};
    use serde_json::{json, Value};

    use super::*;
    use crate::mutate::fixtures::{apply_ops, in_ml, open, pod_of, profile, H100};

    fn gpu(name: &str) -> Value {
        json!({"name": name, "resources": {"limits": {"nvidia.com/gpu": "8"}}})
    }

    fn run(p: &Pod) -> (Pod, Vec<Mutation>) {
        let (profiles, ns, config) = in_ml(vec![profile(H100)]);
        let (ctx, mut draft) = open(p, &ns, &profiles, &config);
        shm(&ctx, &mut draft).unwrap();
        (
            apply_ops(p, &draft.plan.ops),
            draft.done.into_iter().collect(),
        )
    }

    fn shm_size(c: &Container) -> Option<String> {
        find_env(c, env::SHM_SIZE).and_then(|e| e.value.clone())
    }

    #[test]
    fn mounts_a_sized_memory_volume_and_says_its_size() {
        let (out, done) = run(&pod_of(json!([gpu("t")])));
        assert_eq!(done, [Mutation::Shm]);
        let spec = out.spec.unwrap();
        let volume = &spec.volumes.as_ref().unwrap()[0];
        let empty_dir = volume.empty_dir.as_ref().unwrap();
        assert_eq!(volume.name, SHM_VOLUME);
        assert_eq!(empty_dir.medium.as_deref(), Some("Memory"));
        assert_eq!(empty_dir.size_limit.as_ref().unwrap().0, "64Gi");
        let c = &spec.containers[0];
        assert_eq!(dev_shm_mount(c).unwrap().name, SHM_VOLUME);
        assert_eq!(shm_size(c).as_deref(), Some("64Gi"));
    }

    #[test]
    fn a_kept_volume_gives_its_own_size_to_a_container_added_later() {
        let mut p = pod_of(json!([gpu("a"), gpu("b")]));
        let spec = p.spec.as_mut().unwrap();
        spec.volumes = Some(vec![serde_json::from_value(
            json!({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}),
        )
        .unwrap()]);
        spec.containers[0] = serde_json::from_value(json!({
            "name": "a", "resources": {"limits": {"nvidia.com/gpu": "8"}},
            "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
            "env": [{"name": env::SHM_SIZE, "value": "16Gi"}]
        }))
        .unwrap();
        let (out, done) = run(&p);
        assert_eq!(done, [Mutation::Shm]);
        let spec = out.spec.unwrap();
        assert_eq!(spec.volumes.as_ref().unwrap().len(), 1, "no second volume");
        for c in &spec.containers {
            assert_eq!(shm_size(c).as_deref(), Some("16Gi"), "{}", c.name);
        }
        let (again, done) = run(&Pod {
            spec: Some(spec),
            ..p
        });
        assert!(done.is_empty(), "idempotent: {again:?}");
    }

    #[test]
    fn a_user_dev_shm_is_kept_without_a_size() {
        let p = pod_of(
            json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm/"}]}]),
        );
        let (out, done) = run(&p);
        assert!(done.is_empty());
        assert_eq!(out, p);
    }

    #[test]
    fn host_ipc_pods_get_none() {
        let mut p = pod_of(json!([gpu("t")]));
        p.spec.as_mut().unwrap().host_ipc = Some(true);
        let (out, done) = run(&p);
        assert!(done.is_empty());
        assert_eq!(out, p);
    }
}
