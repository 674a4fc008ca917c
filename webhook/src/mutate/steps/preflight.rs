//! `preflight`: for a profile that asks for it, a `railguard-prober preflight` init container
//! that runs first, as the first target container looks after every container step
//! (resources, env including `RAILGUARD_SHM_SIZE`, mounts, security context), plus the
//! profile and signature it checks the node against. Needs the webhook's `--prober-image`.

use k8s_openapi::api::core::v1::Container;
use railguard_api::keys::env;

use crate::error::MutateError;
use crate::json_text::JsonText;
use crate::mutate::container::env_var;
use crate::mutate::{to_json, Ctx, Draft, Mutation, WarningKind, PREFLIGHT_CONTAINER};
use crate::patch::{pointer, PatchOp};

pub(crate) fn preflight(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    let spec = ctx.spec;
    let present = spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == PREFLIGHT_CONTAINER);
    if !ctx.profile.spec.preflight || present {
        return Ok(());
    }
    let name = ctx.profile.name();
    let Some(image) = &ctx.config.prober_image else {
        draft.plan.warn(
            WarningKind::Preflight,
            format!("profile {name} wants a preflight check but the webhook has no --prober-image"),
        );
        return Ok(());
    };
    let Some(base) = draft.containers.first() else {
        return Ok(());
    };
    let init = preflight_container(&base.container, image, name, &ctx.signature);
    let value = to_json(&init, "preflight init container")?;
    // First, so a misconfigured pod fails before any other init work.
    draft.plan.ops.push(match &spec.init_containers {
        None => PatchOp::add(
            pointer(["spec", "initContainers"]),
            JsonText::array(|a| {
                a.json(&value);
            }),
        ),
        Some(_) => PatchOp::add(pointer(["spec", "initContainers", "0"]), value),
    });
    draft.done.insert(Mutation::Preflight);
    Ok(())
}

/// The preflight init container: `base`'s resources, env, mounts and security context,
/// running `railguard-prober preflight` from the prober image.
fn preflight_container(base: &Container, image: &str, profile: &str, signature: &str) -> Container {
    let mut env = base.env.clone().unwrap_or_default();
    env.push(env_var(env::PROFILE, profile));
    env.push(env_var(env::SIGNATURE, signature));
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
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{apply_ops, open, pod_of, profile, H100};
    use crate::mutate::steps::ALL;
    use crate::{NamespaceInfo, WebhookConfig};

    /// Every step up to and including preflight, as `mutate()` runs them.
    fn run(p: &Pod, config: &WebhookConfig) -> (Pod, Draft) {
        let mut h = profile(H100);
        h.spec.preflight = true;
        let (profiles, ns) = (vec![h], NamespaceInfo::new("ml"));
        let (ctx, mut draft) = open(p, &ns, &profiles, config);
        for step in &ALL[..7] {
            step(&ctx, &mut draft).unwrap();
        }
        (apply_ops(p, &draft.plan.ops), draft)
    }

    fn env_value(c: &Container, name: &str) -> Option<String> {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn checks_the_shm_size_the_webhook_mounted() {
        let config = WebhookConfig {
            prober_image: Some("registry.example/railguard-prober:0.1.0".into()),
            ..WebhookConfig::default()
        };
        let p = pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]));
        let (out, draft) = run(&p, &config);
        assert!(draft.done.contains(&Mutation::Preflight));
        let spec = out.spec.unwrap();
        let init = &spec.init_containers.as_ref().unwrap()[0];
        let gpu = &spec.containers[0];
        assert_eq!(env_value(init, env::SHM_SIZE).as_deref(), Some("64Gi"));
        assert_eq!(env_value(gpu, env::SHM_SIZE).as_deref(), Some("64Gi"));
        assert_eq!(env_value(init, env::PROFILE).as_deref(), Some("h100-ndr"));
        assert_eq!(
            env_value(init, env::SIGNATURE),
            Some(profile(H100).spec.signature())
        );
        assert_eq!(init.volume_mounts, gpu.volume_mounts);
    }

    #[test]
    fn without_a_prober_image_a_warning() {
        let p = pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]));
        let (out, draft) = run(&p, &WebhookConfig::default());
        assert!(out.spec.unwrap().init_containers.is_none());
        assert_eq!(draft.plan.warnings[0].kind, WarningKind::Preflight);
    }
}
