//! `nccl-env`: the profile's NCCL settings in every target container. A variable the user
//! set stays; a contradiction is warned about.
//!
//! - `delivery: Env`: the variables (`NCCL_IB_HCA` in the exact-match form,
//!   `NCCL_SOCKET_IFNAME`, `NCCL_CROSS_NIC`, then the profile's own list).
//! - `delivery: Plugin`: `NCCL_ENV_PLUGIN` (railguard's NCCL environment plugin) and
//!   `RAILGUARD_NCCL_CONFIG` (the node file the prober writes), and read-only hostPath
//!   mounts of both directories at their host paths; the plugin answers the NCCL variables
//!   at run time from what was certified on the node the pod lands on.

use std::path::Path;

use k8s_openapi::api::core::v1::EnvVar;
use railguard_api::keys::env;
use railguard_api::profile::{parse_ib_hca, NcclDelivery};
use railguard_api::FabricProfile;

use crate::error::MutateError;
use crate::mutate::container::{env_var, find_env, Shadow};
use crate::mutate::{
    Ctx, Draft, Mutation, Plan, WarningKind, NCCL_CONFIG_VOLUME, NCCL_PLUGIN_VOLUME,
};

pub(crate) fn nccl_env(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    if ctx.skip.contains(&Mutation::NcclEnv) {
        return Ok(());
    }
    let mut desired = match ctx.profile.spec.nccl.delivery {
        NcclDelivery::Env => profile_env(ctx.profile, &ctx.ib_hca),
        NcclDelivery::Plugin => plugin_env(ctx),
    };
    // The fabric class is the profile's, the same on every node: injected in both modes.
    desired.extend(fabric_class_env(ctx.profile));
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
    if ctx.profile.spec.nccl.delivery == NcclDelivery::Plugin {
        plugin_mounts(ctx, draft)?;
    }
    Ok(())
}

/// What a `delivery: Plugin` container gets: which plugin NCCL loads, which node file it reads.
fn plugin_env(ctx: &Ctx<'_>) -> Vec<(String, String)> {
    vec![
        (
            env::NCCL_ENV_PLUGIN.to_string(),
            ctx.config.nccl_plugin_path.clone(),
        ),
        (
            env::NCCL_CONFIG.to_string(),
            ctx.config.nccl_config_path.clone(),
        ),
    ]
}

/// A hostPath directory the plugin needs in the container, mounted read-only at its host
/// path (so the paths of [`plugin_env`] hold inside the container too).
struct HostDir<'a> {
    volume: &'static str,
    path: &'a str,
    /// `Directory`: the plugin must be installed (a pod without it does not start, instead
    /// of running without the plugin); `DirectoryOrCreate`: the prober may not have written
    /// the node file yet, which the plugin reports itself.
    host_path_type: &'static str,
}

/// The directory of `file`: absolute and not `/` (never the host's root).
fn parent_dir<'a>(what: &'static str, file: &'a str) -> Result<&'a str, MutateError> {
    Path::new(file)
        .parent()
        .filter(|d| d.is_absolute() && d.parent().is_some())
        .and_then(Path::to_str)
        .ok_or_else(|| MutateError::NcclPath {
            what,
            path: file.to_string(),
        })
}

/// The plugin's and the node file's directories in every target container, and their
/// volumes in the pod (added once; kept when the pod has them, e.g. on reinvocation).
fn plugin_mounts(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    let plugin_dir = parent_dir("--nccl-plugin-path", &ctx.config.nccl_plugin_path)?;
    let config_dir = parent_dir("--nccl-config-path", &ctx.config.nccl_config_path)?;
    let mut dirs = vec![HostDir {
        volume: NCCL_PLUGIN_VOLUME,
        path: plugin_dir,
        host_path_type: "Directory",
    }];
    // Two mounts at one path would make the pod invalid; one directory serves both.
    if config_dir != plugin_dir {
        dirs.push(HostDir {
            volume: NCCL_CONFIG_VOLUME,
            path: config_dir,
            host_path_type: "DirectoryOrCreate",
        });
    }
    for dir in &dirs {
        let mut mounted = false;
        for shadow in &mut draft.containers {
            if mount_dir(shadow, dir, &mut draft.plan) {
                mounted = true;
            }
        }
        if mounted {
            draft.done.insert(Mutation::NcclEnv);
        }
        let in_pod = ctx
            .spec
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == dir.volume);
        if mounted && !in_pod {
            draft.add_volume(|o| {
                o.str("name", dir.volume).object("hostPath", |h| {
                    h.str("path", dir.path).str("type", dir.host_path_type);
                });
            });
        }
    }
    Ok(())
}

/// Mounts `dir` in the container unless something is mounted at its path already (ours on
/// reinvocation; the user's is kept, with a warning). Whether it added the mount.
fn mount_dir(shadow: &mut Shadow, dir: &HostDir<'_>, plan: &mut Plan) -> bool {
    let at_path = shadow
        .container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path.trim_end_matches('/') == dir.path);
    match at_path {
        Some(m) if m.name == dir.volume => false,
        Some(m) => {
            plan.warn(
                WarningKind::EnvConflict,
                format!(
                    "container {}: volume {} is mounted at {}; kept, the NCCL plugin may not load",
                    shadow.container.name, m.name, dir.path
                ),
            );
            false
        }
        None => {
            shadow.add_read_only_mount(dir.volume, dir.path, &mut plan.ops);
            true
        }
    }
}

/// `NCCL_IB_TC` and `NCCL_IB_SL` from the profile's `rdma.trafficClass`/`serviceLevel`: the
/// class railguard's RDMA tests measured in, so jobs ride the same (lossless) class.
fn fabric_class_env(profile: &FabricProfile) -> Vec<(String, String)> {
    let Some(rdma) = &profile.spec.rdma else {
        return Vec::new();
    };
    [
        (env::NCCL_IB_TC, rdma.traffic_class),
        (env::NCCL_IB_SL, rdma.service_level),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.to_string())))
    .collect()
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
    use crate::mutate::fixtures::{apply_ops, in_ml, open, pod_of, profile, H100};
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
        let (profiles, ns, config) = in_ml(vec![profile(H100)]);
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
        let (profiles, ns, config) = in_ml(vec![profile(H100)]);
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

    #[test]
    fn the_fabric_class_reaches_the_container_in_both_deliveries() {
        let p = pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]));
        let (ns, config) = (NamespaceInfo::new("ml"), WebhookConfig::default());
        for plugin in [false, true] {
            let mut h = if plugin {
                plugin_profile()
            } else {
                profile(H100)
            };
            let (ctx, mut draft) = open(&p, &ns, std::slice::from_ref(&h), &config);
            nccl_env(&ctx, &mut draft).unwrap();
            let names: Vec<String> = env(&apply_ops(&p, &draft.plan.ops), 0)
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            assert!(!names
                .iter()
                .any(|n| n == env::NCCL_IB_TC || n == env::NCCL_IB_SL));

            let rdma = h.spec.rdma.as_mut().unwrap();
            rdma.traffic_class = Some(106);
            rdma.service_level = Some(3);
            let (ctx, mut draft) = open(&p, &ns, std::slice::from_ref(&h), &config);
            nccl_env(&ctx, &mut draft).unwrap();
            let out = env(&apply_ops(&p, &draft.plan.ops), 0);
            assert!(
                out.contains(&(env::NCCL_IB_TC.to_string(), "106".to_string())),
                "{out:?}"
            );
            assert!(
                out.contains(&(env::NCCL_IB_SL.to_string(), "3".to_string())),
                "{out:?}"
            );
        }
    }

    fn plugin_profile() -> FabricProfile {
        let mut h = profile(H100);
        h.spec.nccl.delivery = NcclDelivery::Plugin;
        h
    }

    #[test]
    fn a_user_nccl_env_plugin_stays_with_a_warning() {
        let p = pod_of(
            json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}},
            "env": [{"name": "NCCL_ENV_PLUGIN", "value": "/opt/mine/libnccl-env-mine.so"}]}]),
        );
        let (profiles, ns, config) = in_ml(vec![plugin_profile()]);
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        nccl_env(&ctx, &mut draft).unwrap();
        let out = env(&apply_ops(&p, &draft.plan.ops), 0);
        assert_eq!(
            out[..2],
            [
                (
                    env::NCCL_ENV_PLUGIN.to_string(),
                    "/opt/mine/libnccl-env-mine.so".to_string()
                ),
                (
                    env::NCCL_CONFIG.to_string(),
                    "/run/railguard/nccl.json".to_string()
                ),
            ]
        );
        assert_eq!(draft.plan.warnings.len(), 1, "{:?}", draft.plan.warnings);
        assert!(draft.plan.warnings[0]
            .message
            .contains("NCCL_ENV_PLUGIN=/opt/mine/libnccl-env-mine.so kept"));
    }

    #[test]
    fn the_configured_paths_are_used_and_one_directory_is_mounted_once() {
        let p = pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]));
        let (profiles, ns) = (vec![plugin_profile()], NamespaceInfo::new("ml"));
        let config = WebhookConfig {
            nccl_plugin_path: "/var/lib/railguard/libnccl-env-railguard.so".into(),
            nccl_config_path: "/var/lib/railguard/nccl.json".into(),
            ..WebhookConfig::default()
        };
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        nccl_env(&ctx, &mut draft).unwrap();
        let out = apply_ops(&p, &draft.plan.ops);
        let spec = out.spec.as_ref().unwrap();
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        assert_eq!(
            volumes[0].host_path.as_ref().unwrap().path,
            "/var/lib/railguard"
        );
        assert_eq!(spec.containers[0].volume_mounts.as_ref().unwrap().len(), 1);

        for bad in ["libnccl-env-railguard.so", "/libnccl-env-railguard.so"] {
            let config = WebhookConfig {
                nccl_plugin_path: bad.into(),
                ..WebhookConfig::default()
            };
            let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
            assert!(
                matches!(
                    nccl_env(&ctx, &mut draft),
                    Err(MutateError::NcclPath { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_plugin_profile_is_skipped_where_allowed() {
        let mut p =
            pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
        p.metadata.annotations =
            Some([("railguard.io/skip".to_string(), "nccl-env".to_string())].into());
        let ns = NamespaceInfo::new("ml").with_label("railguard.io/exemptions", "allowed");
        let (profiles, config) = (vec![plugin_profile()], WebhookConfig::default());
        let (ctx, mut draft) = open(&p, &ns, &profiles, &config);
        nccl_env(&ctx, &mut draft).unwrap();
        assert!(draft.plan.ops.is_empty() && draft.done.is_empty());
    }
}
