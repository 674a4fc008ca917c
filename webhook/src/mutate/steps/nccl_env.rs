//! `nccl-env`: the profile's NCCL variables (`NCCL_IB_HCA` in the exact-match form,
//! `NCCL_SOCKET_IFNAME`, `NCCL_CROSS_NIC`, then the profile's own list) in every target
//! container. A variable the user set stays; a contradiction is warned about.

use k8s_openapi::api::core::v1::EnvVar;
use railguard_api::keys::env;
use railguard_api::profile::parse_ib_hca;
use railguard_api::FabricProfile;

use crate::error::MutateError;
use crate::mutate::container::{env_var, find_env};
use crate::mutate::{Ctx, Draft, Mutation, WarningKind};

pub(crate) fn nccl_env(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    if ctx.skip.contains(&Mutation::NcclEnv) {
        return Ok(());
    }
    let desired = profile_env(ctx.profile, &ctx.ib_hca);
    for shadow in &mut draft.containers {
        let mut missing = Vec::new();
        for (var, value) in &desired {
            match find_env(&shadow.container, var) {
                None => missing.push(env_var(var, value)),
                Some(existing) => {
                    let container = &shadow.container.name;
                    if let Some(w) = env_conflict(container, var, existing, value, ctx.profile) {
                        draft.plan.warn(WarningKind::EnvConflict, w);
                    }
                }
            }
        }
        if !missing.is_empty() {
            draft.done.insert(Mutation::NcclEnv);
        }
        shadow.add_env(missing, &mut draft.plan.ops);
    }
    Ok(())
}

/// The env the profile injects, in a stable order; `ib_hca` is its `NCCL_IB_HCA`.
fn profile_env(profile: &FabricProfile, ib_hca: &str) -> Vec<(String, String)> {
    let nccl = &profile.spec.nccl;
    let mut out = vec![(env::NCCL_IB_HCA.to_string(), ib_hca.to_string())];
    if let Some(v) = &nccl.socket_ifname {
        out.push((env::NCCL_SOCKET_IFNAME.to_string(), v.clone()));
    }
    if let Some(v) = nccl.cross_nic {
        out.push((env::NCCL_CROSS_NIC.to_string(), v.to_string()));
    }
    for (k, v) in &nccl.env {
        if !out.iter().any(|(name, _)| name == k) {
            out.push((k.clone(), v.clone()));
        }
    }
    out
}

/// A warning when a variable the user set contradicts the profile (the user's value stays).
fn env_conflict(
    container: &str,
    var: &str,
    existing: &EnvVar,
    wanted: &str,
    profile: &FabricProfile,
) -> Option<String> {
    let value = existing.value.as_deref()?.trim();
    if value == wanted {
        return None;
    }
    if var == env::NCCL_IB_HCA {
        let list = parse_ib_hca(value).ok()?;
        if list.exclude {
            return Some(format!(
                "container {container}: NCCL_IB_HCA={value} excludes HCAs; profile {} uses {wanted}",
                profile.name()
            ));
        }
        // A subset of the profile's rails is the user's choice; an HCA outside it is not.
        let outside: Vec<&str> = list
            .entries
            .iter()
            .filter(|e| {
                !profile
                    .spec
                    .rails
                    .iter()
                    .any(|r| r.hca == e.hca && e.port.is_none_or(|p| p == r.port))
            })
            .map(|e| e.hca.as_str())
            .collect();
        if outside.is_empty() {
            return None;
        }
        return Some(format!(
            "container {container}: NCCL_IB_HCA names {} outside profile {}; kept",
            outside.join(","),
            profile.name()
        ));
    }
    Some(format!(
        "container {container}: {var}={value} kept; profile {} sets {wanted}",
        profile.name()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{apply_ops, open, pod_of, profile, H100};
    use crate::{NamespaceInfo, WebhookConfig};

    fn env(p: &k8s_openapi::api::core::v1::Pod, i: usize) -> Vec<(String, String)> {
        p.spec.as_ref().unwrap().containers[i]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn the_profile_env_follows_the_user_env_in_a_stable_order() {
        let p = pod_of(
            json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}},
            "env": [{"name": "MASTER_ADDR", "value": "m"}]}]),
        );
        let (profiles, ns, config) = (
            vec![profile(H100)],
            NamespaceInfo::new("ml"),
            WebhookConfig::default(),
        );
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        nccl_env(&ctx, &mut draft).unwrap();
        assert!(draft.done.contains(&Mutation::NcclEnv));
        let names: Vec<String> = env(&apply_ops(&p, &draft.plan.ops), 0)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names[..3],
            ["MASTER_ADDR", env::NCCL_IB_HCA, env::NCCL_SOCKET_IFNAME]
        );
        assert!(draft.plan.warnings.is_empty());
    }

    #[test]
    fn a_user_value_stays_and_a_contradiction_is_warned_about() {
        let p = pod_of(
            json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}},
            "env": [{"name": "NCCL_IB_HCA", "value": "^=mlx5_0"}, {"name": "NCCL_SOCKET_IFNAME", "value": "=eth0"}]}]),
        );
        let (profiles, ns, config) = (
            vec![profile(H100)],
            NamespaceInfo::new("ml"),
            WebhookConfig::default(),
        );
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        nccl_env(&ctx, &mut draft).unwrap();
        let out = env(&apply_ops(&p, &draft.plan.ops), 0);
        assert_eq!(
            out[0],
            (env::NCCL_IB_HCA.to_string(), "^=mlx5_0".to_string())
        );
        assert_eq!(draft.plan.warnings.len(), 1, "{:?}", draft.plan.warnings);
        assert!(draft.plan.warnings[0].message.contains("excludes HCAs"));
    }

    #[test]
    fn skipped_where_allowed() {
        let mut p =
            pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
        p.metadata.annotations =
            Some([("railguard.io/skip".to_string(), "nccl-env".to_string())].into());
        let ns = NamespaceInfo::new("ml").with_label("railguard.io/exemptions", "allowed");
        let (profiles, config) = (vec![profile(H100)], WebhookConfig::default());
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        nccl_env(&ctx, &mut draft).unwrap();
        assert!(draft.plan.ops.is_empty() && draft.done.is_empty());
    }
}
