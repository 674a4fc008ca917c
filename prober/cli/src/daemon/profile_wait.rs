//! The daemon's start while this node's FabricProfile cannot be used
//! ([`UnusableProfile`]): the Node's condition and the metrics say why, a GPU node no
//! profile matches gets its `Unprofiled` Event, and it looks again every poll.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use railguard_api::keys;
use railguard_api::node::node_reference;
use railguard_api::profile_list::InvalidProfiles;
use railguard_kube::events::record_event;
use railguard_kube::node_writer::{NodeCondition, NodeWriter, OnConflict};
use tokio_util::sync::CancellationToken;

use super::Metrics;
use crate::certification::NodeContext;
use crate::node_context::NodeArgs;
use crate::profile_source::{unusable_condition, UnusableProfile, REASON_NO_PROFILE};

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

/// Sets `RailguardFabricReady` from [`unusable_condition`] (a strategic merge patch of the
/// status, conditions merge by type; the transition time kept when the status is unchanged).
async fn report_on_node(client: &Client, node: &str, u: &UnusableProfile) -> anyhow::Result<()> {
    let writer = NodeWriter::new(client.clone(), keys::PROBER_FIELD_MANAGER);
    let current = writer
        .get(node)
        .await
        .with_context(|| format!("cannot read node {node}"))?;
    let (status, reason, message) = unusable_condition(u);
    let condition = NodeCondition {
        type_: keys::CONDITION_FABRIC_READY,
        status,
        reason,
        message: &message,
    };
    // Nothing to merge with: the condition says why nothing is checked, whatever else the
    // Node holds.
    writer
        .set_condition(&current, condition, &OnConflict::LastWriterWins)
        .await
        .with_context(|| {
            format!(
                "cannot set condition {} on node {node}",
                keys::CONDITION_FABRIC_READY
            )
        })?;
    Ok(())
}
