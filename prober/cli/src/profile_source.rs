//! Where the prober's FabricProfile comes from in a cluster, and what it does when that
//! profile cannot be used.
//!
//! Profiles are listed as [`ProfileObject`]s, each decoded and validated on its own: one
//! invalid profile (say a port past `u32`, or an `intervalSeconds` not below `ttlSeconds`)
//! never hides the valid ones. When the profile this node needs is invalid (or no profile
//! matches it, or it names an nccl-tests binary outside `--allowed-nccl-binaries`), the error
//! is an [`UnusableProfile`]:
//!
//! - `railguard-prober certify` prints it and exits 2 (a configuration error);
//! - `railguard-prober daemon` does not exit (no crash-loop): it sets the Node's
//!   `RailguardFabricReady` condition to `Unknown` with reason `InvalidProfile` (or
//!   `NoProfile`, or `NcclBinaryNotAllowed`) and the message saying which profile and field, keeps `/healthz` and
//!   `/metrics` served (`railguard_prober_fabric_profiles_invalid{profile}`), looks again
//!   every `--poll-ms`, and starts certifying as soon as the profile is fixed. The certificate
//!   already on the Node is left as it is. A GPU node that no profile matches (`NoProfile`)
//!   also gets one Warning Event `Unprofiled` and `railguard_prober_unprofiled` 1
//!   ([`crate::unprofiled`]).

use std::time::Duration;

use crate::certification::NodeContext;
use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use railguard_api::node::node_reference;
use railguard_api::profile_list::InvalidProfiles;
use railguard_api::profile_list::{partition, ProfileObject};
use railguard_api::{keys, FabricProfile, InvalidProfile};
use railguard_kube::events::record_event;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::certify::NodeArgs;
use crate::daemon::Metrics;

/// Condition reason: the profile this node needs is invalid.
pub const REASON_INVALID_PROFILE: &str = "InvalidProfile";
/// Condition reason: no valid profile matches this node (and none is default).
pub const REASON_NO_PROFILE: &str = "NoProfile";
/// Condition reason: the profile names an nccl-tests binary this prober may not run.
pub const REASON_NCCL_BINARY_NOT_ALLOWED: &str = "NcclBinaryNotAllowed";

/// The profile this node needs cannot be used; `reason` is the condition reason.
#[derive(Debug)]
pub struct UnusableProfile {
    pub reason: &'static str,
    pub message: String,
    /// The invalid profiles seen, for the metric.
    pub invalid: Vec<InvalidProfile>,
}

impl std::fmt::Display for UnusableProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UnusableProfile {}

impl UnusableProfile {
    pub fn invalid(message: String, invalid: &[InvalidProfile]) -> Self {
        UnusableProfile {
            reason: REASON_INVALID_PROFILE,
            message,
            invalid: invalid.to_vec(),
        }
    }

    /// The profile is valid but names `ncclTests.binary` outside the install-time allow list.
    pub fn binary_not_allowed(message: String) -> Self {
        UnusableProfile {
            reason: REASON_NCCL_BINARY_NOT_ALLOWED,
            message,
            invalid: Vec::new(),
        }
    }

    pub fn none(message: String, invalid: &[InvalidProfile]) -> Self {
        UnusableProfile {
            reason: if invalid.is_empty() {
                REASON_NO_PROFILE
            } else {
                REASON_INVALID_PROFILE
            },
            message,
            invalid: invalid.to_vec(),
        }
    }
}

/// Every FabricProfile of the cluster, each object decoded on its own: the valid ones and
/// the invalid ones (both sorted by name), each invalid one logged.
pub async fn cluster_profiles(
    client: &Client,
) -> anyhow::Result<(Vec<FabricProfile>, Vec<InvalidProfile>)> {
    let api: Api<ProfileObject> = Api::all(client.clone());
    let list = api
        .list(&Default::default())
        .await
        .context("cannot list FabricProfiles")?;
    let (valid, invalid) = partition(&list.items);
    for p in &invalid {
        tracing::warn!(profile = %p.name, generation = p.generation, reason = %p.reason, "skipping invalid FabricProfile");
    }
    Ok((valid, invalid))
}

/// One named FabricProfile of the cluster, decoded and validated; an invalid one is an
/// [`UnusableProfile`] naming the field.
pub async fn cluster_profile(client: &Client, name: &str) -> anyhow::Result<FabricProfile> {
    let api: Api<ProfileObject> = Api::all(client.clone());
    let object = api
        .get(name)
        .await
        .with_context(|| format!("cannot read FabricProfile {name}"))?;
    object.decoded.map_err(|e| {
        let message = e.to_string();
        UnusableProfile::invalid(message, std::slice::from_ref(&e)).into()
    })
}

/// The daemon's start: the node's context once its profile is usable. While it is not (an
/// [`UnusableProfile`]), the Node's condition and the metric say why, and it looks again
/// every `poll`. `Ok(None)`: stopped while waiting. Other errors are returned as they are.
pub async fn wait_for_context(
    args: &NodeArgs,
    client: &Client,
    metrics: &Metrics,
    poll: Duration,
    stop: &CancellationToken,
) -> anyhow::Result<Option<NodeContext>> {
    let mut reported: Option<String> = None;
    let mut invalid = InvalidProfiles::default();
    // Whether this node was looked at as a GPU node no profile matches (and its Event, if
    // one was due, posted): once per process, not per poll.
    let mut unprofiled_checked = false;
    loop {
        metrics.heartbeat();
        match args.context(Some(client.clone())).await {
            Ok(ctx) => {
                let changes = invalid.replace([]);
                metrics.record_invalid_profiles(&changes);
                metrics.set_unprofiled(false);
                if reported.is_some() {
                    tracing::info!(
                        profile = ctx.profile.name(),
                        "FabricProfile usable again; starting"
                    );
                }
                return Ok(Some(ctx));
            }
            Err(e) => {
                let Some(unusable) = e.downcast_ref::<UnusableProfile>() else {
                    return Err(e);
                };
                let changes = invalid.replace(unusable.invalid.iter().cloned());
                metrics.record_invalid_profiles(&changes);
                if unusable.reason != REASON_NO_PROFILE {
                    metrics.set_unprofiled(false);
                } else if !unprofiled_checked {
                    let node = args.node_name()?;
                    match report_unprofiled(client, &node, unusable, metrics).await {
                        Ok(()) => unprofiled_checked = true,
                        Err(e) => {
                            tracing::warn!(node = %node, error = %format!("{e:#}"), "cannot report the node as unprofiled")
                        }
                    }
                }
                if reported.as_deref() != Some(unusable.message.as_str()) {
                    tracing::warn!(
                        reason = unusable.reason,
                        error = %unusable.message,
                        retry_in_ms = u64::try_from(poll.as_millis()).unwrap_or(u64::MAX),
                        "this node's FabricProfile cannot be used; waiting for it to be fixed"
                    );
                    let node = args.node_name()?;
                    match report_on_node(client, &node, unusable).await {
                        Ok(()) => reported = Some(unusable.message.clone()),
                        Err(e) => {
                            tracing::warn!(node = %node, error = %format!("{e:#}"), "cannot set the node condition")
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(None),
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// A GPU node that no profile matches: `railguard_prober_unprofiled` 1 and one Warning
/// Event `Unprofiled` on the Node ([`crate::unprofiled::unprofiled_event`]).
async fn report_unprofiled(
    client: &Client,
    node: &str,
    u: &UnusableProfile,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    let current = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .with_context(|| format!("cannot read node {node}"))?;
    let Some(ev) = crate::unprofiled::unprofiled_event(u.reason, &current, &u.message) else {
        metrics.set_unprofiled(false);
        return Ok(());
    };
    metrics.set_unprofiled(true);
    let involved = node_reference(node, current.metadata.uid.clone());
    record_event(client, involved, &ev, keys::PROBER_FIELD_MANAGER, node)
        .await
        .with_context(|| format!("cannot record the {} Event on node {node}", ev.reason))?;
    tracing::warn!(node = %node, "GPU node matches no FabricProfile; Event {} posted", ev.reason);
    Ok(())
}

/// The condition the Node carries while its profile cannot be used: `Unknown` (the prober
/// checks nothing), the reason, and what to fix.
pub fn unusable_condition(u: &UnusableProfile) -> (&'static str, &'static str, String) {
    (
        "Unknown",
        u.reason,
        format!(
            "{}; the prober checks nothing on this node until a valid FabricProfile for it exists (the certificate is left as it is)",
            u.message
        ),
    )
}

/// Sets `RailguardFabricReady` from [`unusable_condition`] (a strategic merge patch of the
/// status, conditions merge by type; the transition time kept when the status is unchanged).
async fn report_on_node(client: &Client, node: &str, u: &UnusableProfile) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get(node)
        .await
        .with_context(|| format!("cannot read node {node}"))?;
    let (status, reason, message) = unusable_condition(u);
    let now = jiff::Timestamp::now().to_string();
    let transition = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == keys::CONDITION_FABRIC_READY))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.to_string())
        .unwrap_or_else(|| now.clone());
    let patch = json!({
        "status": { "conditions": [{
            "type": keys::CONDITION_FABRIC_READY,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
        }]}
    });
    let pp = PatchParams {
        field_manager: Some(keys::PROBER_FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    nodes
        .patch_status(node, &pp, &Patch::Strategic(&patch))
        .await
        .with_context(|| {
            format!(
                "cannot set condition {} on node {node}",
                keys::CONDITION_FABRIC_READY
            )
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_condition_names_the_profile_problem_and_what_happens_meanwhile() {
        let bad = InvalidProfile {
            name: "h100".into(),
            generation: Some(2),
            reason: "spec.rails[0].port: invalid value".into(),
        };
        let u = UnusableProfile::invalid(bad.to_string(), std::slice::from_ref(&bad));
        let (status, reason, message) = unusable_condition(&u);
        assert_eq!((status, reason), ("Unknown", "InvalidProfile"));
        assert!(
            message.starts_with("FabricProfile \"h100\" is invalid: spec.rails[0].port"),
            "{message}"
        );
        assert!(message.contains("checks nothing"), "{message}");
        assert_eq!(
            UnusableProfile::none("none".into(), &[]).reason,
            "NoProfile"
        );
        assert_eq!(
            UnusableProfile::none("none".into(), &[bad]).reason,
            "InvalidProfile"
        );
    }
}
