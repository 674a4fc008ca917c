//! The fleet controller (`railguard-prober fleet --watch`): watches Nodes and FabricProfiles
//! into reflector caches and, at most every `--settle-secs` after a change and at least
//! every `--interval-secs`, recomputes every profile's fleet from the caches. It then writes
//! only what differs from what the objects carry: the `RailguardFleetOutlier` condition
//! (and an Event when a node becomes or stops being an outlier), and `status.fleet` of the
//! profile (and a `FleetDrift` Event when a measurement starts drifting), and each node's
//! upkeep (`railguard_api::upkeep`): an expired certification's label flipped to
//! `pending`, and the `railguard.io/fabric-unhealthy` taint of profiles that ask for it.
//!
//! Every write is derived from cluster state, and the chart runs one replica with the
//! `Recreate` strategy; two controllers side by side would still write the same thing (the
//! taint patch carries the Node's resourceVersion, so one of two racing writes is refused
//! and retried on the next recomputation).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use railguard_api::fleet::OutlierAction;
use railguard_api::fleet::{reason, BaselineSnapshot, FleetStatus};
use railguard_api::invasive::{InvasiveStatus, STATUS_FRESH};
use railguard_api::node::{node_reference, NodeEvent};
use railguard_api::upkeep::{
    fleet_taint_wanted, holds_live_lease, node_upkeep, orphaned_run_patch, railguard_taint,
    upkeep_events, upkeep_patch, LeaseHold, NodeUpkeep, TaintWanted, UpkeepPolicy,
};
use railguard_api::{keys, FabricProfile, NodeFabric, ProfileObject};
use railguard_fleet::marks::{mark_event, node_condition, WantedCondition};
use railguard_fleet::{fleet_status, FleetAnalysis};
use railguard_kube::events::record_event;
use railguard_kube::node_writer::{NodeCondition, NodeWriter, OnConflict, Written};
use railguard_kube::store::Store;
use railguard_kube::watch::{watch_into, Config};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::metrics::FleetMetrics;
use super::FleetArgs;

/// Node writes in flight at once.
const WRITE_CONCURRENCY: usize = 8;

/// What the controller remembers between recomputations.
#[derive(Default)]
struct Memory {
    /// Each profile's baseline history, read once from its status, then kept here.
    history: BTreeMap<String, Vec<BaselineSnapshot>>,
    /// The last `status.fleet` written (without `computedAt`), to write only changes.
    written: BTreeMap<String, FleetStatus>,
    /// Measurements already reported as drifting, per profile.
    drifting: BTreeMap<String, BTreeSet<String>>,
    /// The Nodes decoded, reused while unchanged.
    fabrics: super::FabricCache,
    /// The last `status.invasive` written (without `computedAt`) and when.
    invasive_written: BTreeMap<String, (InvasiveStatus, Timestamp)>,
}

pub async fn run(client: Client, args: &FleetArgs) -> anyhow::Result<()> {
    let interval = Duration::from_secs(args.interval_secs.max(1));
    let settle = Duration::from_secs(args.settle_secs);
    let metrics = Arc::new(FleetMetrics::new(
        interval * 3 + settle + Duration::from_secs(60),
    ));
    let listener = railguard_runtime::bind(
        args.metrics_listen,
        "metrics and health",
        "--metrics-listen",
    )?;
    let stop = CancellationToken::new();
    let server = tokio::spawn(crate::health::serve(
        listener,
        metrics.clone(),
        stop.clone(),
    ));

    let changed = Arc::new(Notify::new());
    let nodes: Arc<Store<Node>> = Arc::new(Store::new("nodes"));
    let profiles: Arc<Store<ProfileObject>> = Arc::new(Store::new("fabricprofiles"));
    let watches = {
        let (nodes, profiles, client) = (nodes.clone(), profiles.clone(), client.clone());
        let (node_changed, profile_changed) = (changed.clone(), changed.clone());
        tokio::spawn(async move {
            tokio::join!(
                watch_into(
                    Api::<Node>::all(client.clone()),
                    Config::default(),
                    &nodes,
                    |n: &Node| Some(without_managed_fields(n)),
                    |_| node_changed.notify_one(),
                    |_| {},
                ),
                watch_into(
                    Api::<ProfileObject>::all(client),
                    Config::default(),
                    &profiles,
                    |p: &ProfileObject| Some(p.clone()),
                    |_| profile_changed.notify_one(),
                    |_| {},
                ),
            );
        })
    };
    let shutdown = railguard_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    tokio::select! {
        _ = async { tokio::join!(nodes.synced(), profiles.synced()) } => {}
        () = &mut shutdown => {
            stop.cancel();
            watches.abort();
            return Ok(());
        }
    }
    let leader = if args.leader_elect {
        let namespace = args
            .leader_election_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "default".to_string());
        let identity = args
            .leader_election_identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| {
                format!(
                    "{}-{}",
                    std::env::var("HOSTNAME").unwrap_or_else(|_| "fleet".into()),
                    std::process::id()
                )
            });
        let lease = railguard_kube::lease::LeaderLease::new(
            Api::namespaced(client.clone(), &namespace),
            LEASE_NAME,
            &identity,
            LEASE_DURATION,
        );
        let flag = lease.leader_flag();
        tokio::spawn(lease.run(stop.clone()));
        tracing::info!(lease = LEASE_NAME, %namespace, %identity, "leader election on");
        Some(flag)
    } else {
        None
    };
    // DRA: decided once at start-up, and said once.
    let mut dra_task = None;
    let dra = if !args.dra_taints {
        tracing::info!(
            "DRA device taints off (--dra-taints=false, the default; the chart's dra.deviceTaints)"
        );
        None
    } else {
        match super::dra::availability(&client).await? {
            super::dra::Availability::On => {
                let (caches, task) = super::dra::DraCaches::start(&client, changed.clone()).await?;
                dra_task = Some(task);
                tracing::info!("DRA device taints on: the API server serves resource.k8s.io/v1 DeviceTaintRules");
                Some(caches)
            }
            super::dra::Availability::NotServed => {
                tracing::info!("DRA device taints off: the API server does not serve resource.k8s.io/v1 DeviceTaintRules (Kubernetes before 1.37); rail health stays node-level");
                None
            }
            super::dra::Availability::Forbidden(why) => {
                tracing::warn!(reason = %why, "DRA device taints off: the API server serves DeviceTaintRules but this controller may not use them (install the chart against this cluster so it grants them)");
                None
            }
        }
    };
    tracing::info!(
        interval_secs = interval.as_secs(),
        settle_secs = settle.as_secs(),
        "fleet controller started"
    );
    let mut memory = Memory::default();
    loop {
        metrics.heartbeat();
        if let Some(flag) = &leader {
            if !flag.load(std::sync::atomic::Ordering::SeqCst) {
                // Not leading: another replica writes. Check again soon.
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
                continue;
            }
        }
        let started = Instant::now();
        let result = recompute(
            &client,
            &nodes,
            &profiles,
            args,
            &mut memory,
            &metrics,
            dra.as_ref(),
        )
        .instrument(tracing::info_span!("fleet_recomputation"))
        .await;
        metrics.recomputed(started.elapsed(), result.is_ok());
        match result {
            Ok(n) => tracing::info!(
                profiles = n,
                took_ms = started.elapsed().as_millis() as u64,
                "fleet recomputed"
            ),
            Err(e) => {
                tracing::warn!(error = %railguard_runtime::error_line(e.as_ref()), "fleet recomputation failed; retrying")
            }
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(interval) => {}
            () = changed.notified() => {
                metrics.heartbeat();
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(settle) => {}
                }
            }
        }
    }
    stop.cancel();
    watches.abort();
    if let Some(t) = dra_task {
        t.abort();
    }
    server.await.context("metrics server task")??;
    Ok(())
}

/// The Lease replicas of the fleet controller elect their writer with.
const LEASE_NAME: &str = "railguard-fleet";
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// A Node as the controller keeps it: without managedFields (most of a Node's bytes, and
/// nothing the fleet reads).
fn without_managed_fields(node: &Node) -> Node {
    let mut n = node.clone();
    n.metadata.managed_fields = None;
    n
}

/// One recomputation over the caches; returns the number of profiles looked at.
async fn recompute(
    client: &Client,
    nodes: &Store<Node>,
    profiles: &Store<ProfileObject>,
    args: &FleetArgs,
    memory: &mut Memory,
    metrics: &FleetMetrics,
    dra: Option<&super::dra::DraCaches>,
) -> anyhow::Result<usize> {
    let now = Timestamp::now();
    let only = args.profile.as_deref();
    let lease_namespace = args.lease_namespace.as_deref();
    let profiles: Vec<FabricProfile> = profiles
        .values()
        .iter()
        .filter_map(|o| o.decoded.as_ref().ok().cloned())
        .filter(|p| only.is_none_or(|n| n == p.name()))
        .collect();
    let nodes = nodes.values();
    memory
        .fabrics
        .refresh(nodes.iter().map(|n| n.as_ref()), now);
    let by_name: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n.as_ref())))
        .collect();
    let waiting: BTreeMap<String, Timestamp> = nodes
        .iter()
        .filter_map(|n| {
            let since = n
                .metadata
                .annotations
                .as_ref()?
                .get(keys::ANNOTATION_INVASIVE_WAITING)?
                .parse()
                .ok()?;
            Some((n.metadata.name.clone()?, since))
        })
        .collect();
    let mut analyses = Vec::new();
    let mut drift_series = Vec::new();
    let mut tainted = BTreeMap::new();
    let mut first_error = None;
    for p in &profiles {
        // Every line logged for one profile's fleet names it.
        async {
            let analysis = super::analyze(p, memory.fabrics.fabrics());
            if let Err(e) = mark_nodes(client, &analysis, &by_name).await {
                first_error.get_or_insert(e);
            }
            let dra_nodes = dra
                .map(|c| c.nodes_with_slices(&[&p.spec.dra.nic_driver, &p.spec.dra.gpu_driver]))
                .unwrap_or_default();
            let mut plans = upkeep_plans(p, &dra_nodes, &analysis, memory.fabrics.fabrics(), now);
            if let Some(ns) = lease_namespace {
                match restore_orphaned_runs(client, ns, p, memory.fabrics.fabrics(), &by_name, now)
                    .await
                {
                    // Those Nodes changed: their upkeep waits for the next recomputation.
                    Ok(restored) => plans.retain(|(name, _)| !restored.contains(name)),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            for (_, u) in &plans {
                if let TaintWanted::Set(reason) = u.taint {
                    *tainted.entry((p.name().to_string(), reason)).or_insert(0) += 1;
                }
            }
            if let Err(e) = upkeep_nodes(client, plans, &by_name).await {
                first_error.get_or_insert(e);
            }
            let invasive = super::invasive_status_of(p, memory.fabrics.fabrics(), &waiting, now);
            match write_status(client, p, &analysis, invasive, memory, now).await {
                Ok(status) => {
                    for d in &status.drift {
                        drift_series.push((
                            p.name().to_string(),
                            d.measurement.clone(),
                            d.worse_percent,
                        ));
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            analyses.push(analysis);
        }
        .instrument(tracing::info_span!("fleet_profile", profile = %p.name()))
        .await;
    }
    if let Some(caches) = dra {
        let fabrics: Vec<&NodeFabric> = memory.fabrics.fabrics().collect();
        match super::dra::reconcile(client, caches, &profiles, &analyses, &fabrics, now).await {
            Ok((wanted, applied, deleted)) => {
                metrics.publish_device_taints(wanted);
                if applied + deleted > 0 {
                    tracing::info!(wanted, applied, deleted, "device taint rules reconciled");
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    metrics.publish(&analyses, &drift_series);
    metrics.publish_taints(&tainted);
    match first_error {
        Some(e) => Err(e),
        None => Ok(profiles.len()),
    }
}

/// The upkeep of every node of `profile` (those labelled for it or certified for it), with
/// each node's state for messages.
/// `dra_nodes`: the nodes whose rails DRA devices carry (slices of the profile's drivers):
/// there a degraded node's bad rails are device taints, not a node taint.
fn upkeep_plans<'a>(
    profile: &FabricProfile,
    dra_nodes: &BTreeSet<String>,
    analysis: &FleetAnalysis,
    fabrics: impl Iterator<Item = &'a NodeFabric>,
    now: Timestamp,
) -> Vec<(String, NodeUpkeep)> {
    fabrics
        .filter(|f| super::profile_of(f) == Some(profile.name()))
        .map(|f| {
            let policy = UpkeepPolicy {
                taints: profile.spec.certification.taints,
                filter_outliers: profile.spec.fleet.outliers == OutlierAction::Filter,
                device_taints: dra_nodes.contains(&f.name),
            };
            let u = node_upkeep(f, policy, analysis.is_outlier(&f.name), now);
            (f.name.clone(), u)
        })
        .collect()
}

/// Writes each planned upkeep the Node does not carry yet (one merge patch each, label and
/// taints together, refused by the API server if the Node changed since the cache saw it;
/// the next recomputation retries), with its Events.
async fn upkeep_nodes(
    client: &Client,
    plans: Vec<(String, NodeUpkeep)>,
    nodes: &BTreeMap<&str, &Node>,
) -> anyhow::Result<()> {
    let writes: Vec<(&Node, NodeUpkeep, Value)> = plans
        .into_iter()
        .filter_map(|(name, u)| {
            let node = *nodes.get(name.as_str())?;
            let taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default();
            let u = NodeUpkeep {
                taint: fleet_taint_wanted(u.taint, taints),
                ..u
            };
            let patch = upkeep_patch(u, taints, node.metadata.resource_version.as_deref())?;
            Some((node, u, patch))
        })
        .collect();
    futures::stream::iter(writes)
        .map(|(node, u, patch)| write_upkeep(client, node, u, patch))
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// How far the probers' clocks (which stamp a Lease's renewal) may run behind this one.
const LEASE_CLOCK_SKEW: jiff::SignedDuration = jiff::SignedDuration::from_secs(5);

/// Gives each Node of `profile` that shows an invasive run no live slot Lease in
/// `namespace` names (its prober died mid-run) its certificate's state back
/// ([`orphaned_run_patch`]), with an `InvasiveRunOrphaned` Event. The Leases are listed
/// only when some Node shows a run. Returns the Nodes written.
async fn restore_orphaned_runs<'a>(
    client: &Client,
    namespace: &str,
    profile: &FabricProfile,
    fabrics: impl Iterator<Item = &'a NodeFabric>,
    nodes: &BTreeMap<&str, &Node>,
    now: Timestamp,
) -> anyhow::Result<BTreeSet<String>> {
    use k8s_openapi::api::coordination::v1::Lease;
    let mut restored = BTreeSet::new();
    let mut leases: Option<Vec<LeaseHold>> = None;
    for f in fabrics.filter(|f| super::profile_of(f) == Some(profile.name())) {
        let Some(node) = nodes.get(f.name.as_str()) else {
            continue;
        };
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default();
        let rv = node.metadata.resource_version.as_deref();
        // Would the Node be restored if nothing ran? Only then are the Leases read.
        if orphaned_run_patch(f, taints, rv, false, now).is_none() {
            continue;
        }
        if leases.is_none() {
            let list = Api::<Lease>::namespaced(client.clone(), namespace)
                .list(&Default::default())
                .await
                .with_context(|| format!("cannot list the invasive-slot Leases in {namespace}"))?;
            leases = Some(
                list.items
                    .into_iter()
                    .filter_map(|l| l.spec)
                    .map(|s| {
                        (
                            s.holder_identity,
                            s.renew_time.map(|t| t.0),
                            s.lease_duration_seconds,
                        )
                    })
                    .collect(),
            );
        }
        let alive = holds_live_lease(
            &f.name,
            leases.as_deref().unwrap_or_default(),
            now,
            LEASE_CLOCK_SKEW,
        );
        let Some(patch) = orphaned_run_patch(f, taints, rv, alive, now) else {
            continue;
        };
        let writer = NodeWriter::new(client.clone(), keys::FLEET_FIELD_MANAGER);
        let precondition = OnConflict::Precondition(rv.map(str::to_string));
        match writer.merge(&f.name, patch.clone(), &precondition).await {
            Ok(Written::Done(_)) => {}
            // The Node changed since the cache saw it (the run may just have ended): the
            // next recomputation looks again.
            Ok(Written::Conflict) => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot restore node {} after its prober's run was orphaned",
                        f.name
                    )
                })
            }
        }
        let ev = NodeEvent {
            reason: "InvasiveRunOrphaned",
            kind: "Warning",
            message: format!(
                "an invasive run's marks stayed after its prober stopped renewing its slot (died mid-run): the node is given back the state its certificate describes ({}={}), the testing taint lifted",
                keys::LABEL_FABRIC,
                patch["metadata"]["labels"][keys::LABEL_FABRIC].as_str().unwrap_or("unchanged"),
            ),
        };
        let involved = node_reference(&f.name, node.metadata.uid.clone());
        if let Err(e) = record(client, involved, &ev).await {
            tracing::warn!(node = %f.name, error = %railguard_runtime::error_chain(&e), "cannot record the InvasiveRunOrphaned event");
        }
        tracing::warn!(node = %f.name, message = %ev.message, "orphaned invasive run");
        restored.insert(f.name.clone());
    }
    Ok(restored)
}

async fn write_upkeep(
    client: &Client,
    node: &Node,
    upkeep: NodeUpkeep,
    patch: Value,
) -> anyhow::Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let before = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .and_then(railguard_taint)
        .and_then(|t| t.value.clone());
    // The taint list is written whole: decided on the Node as cached, or not at all.
    let precondition = OnConflict::Precondition(node.metadata.resource_version.clone());
    let written = NodeWriter::new(client.clone(), keys::FLEET_FIELD_MANAGER)
        .merge(&name, patch, &precondition)
        .await
        .with_context(|| {
            format!(
                "cannot write the {} taint or the expiry label on node {name}",
                keys::TAINT_FABRIC_UNHEALTHY
            )
        })?;
    if let Written::Conflict = written {
        tracing::info!(node = %name, "node changed since the cache saw it; its upkeep is decided again at the next recomputation");
        return Ok(());
    }
    let state = NodeFabric::from_node(node, Timestamp::now()).state.kind();
    for ev in upkeep_events(upkeep, before.as_deref(), state) {
        let involved = node_reference(&name, node.metadata.uid.clone());
        record(client, involved, &ev)
            .await
            .with_context(|| format!("cannot record event {} on node {name}", ev.reason))?;
        tracing::info!(node = %name, reason = ev.reason, message = %ev.message, "node upkeep");
    }
    Ok(())
}

/// The fleet condition a Node carries now: status, reason, message.
fn carried(node: &Node) -> Option<(&str, &str, &str)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == keys::CONDITION_FLEET_OUTLIER)?;
    Some((
        c.status.as_str(),
        c.reason.as_deref().unwrap_or_default(),
        c.message.as_deref().unwrap_or_default(),
    ))
}

/// Writes the condition of every node of the fleet whose condition differs from what it
/// should be, with the Event a change deserves.
async fn mark_nodes(
    client: &Client,
    analysis: &FleetAnalysis,
    nodes: &BTreeMap<&str, &Node>,
) -> anyhow::Result<()> {
    let writes: Vec<(&Node, WantedCondition, Option<String>)> = analysis
        .nodes
        .iter()
        .filter_map(|member| {
            let node = *nodes.get(member.name.as_str())?;
            let wanted = node_condition(analysis, Some(member));
            let now = carried(node);
            if now == Some((wanted.status, wanted.reason, wanted.message.as_str())) {
                return None;
            }
            Some((node, wanted, now.map(|(s, _, _)| s.to_string())))
        })
        .collect();
    futures::stream::iter(writes)
        .map(|(node, wanted, previous)| write_mark(client, node, wanted, previous))
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn write_mark(
    client: &Client,
    node: &Node,
    wanted: WantedCondition,
    previous: Option<String>,
) -> anyhow::Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    // A condition of its own type: the prober's own condition and the kubelet's stay as
    // they are, whatever else changed on the Node.
    let condition = NodeCondition {
        type_: keys::CONDITION_FLEET_OUTLIER,
        status: wanted.status,
        reason: wanted.reason,
        message: &wanted.message,
    };
    NodeWriter::new(client.clone(), keys::FLEET_FIELD_MANAGER)
        .set_condition(node, condition, &OnConflict::LastWriterWins)
        .await
        .with_context(|| {
            format!(
                "cannot set condition {} on node {name}",
                keys::CONDITION_FLEET_OUTLIER
            )
        })?;
    if let Some(ev) = mark_event(previous.as_deref(), &wanted) {
        let involved = node_reference(&name, node.metadata.uid.clone());
        record(client, involved, &ev)
            .await
            .with_context(|| format!("cannot record event {} on node {name}", ev.reason))?;
        tracing::info!(node = %name, reason = ev.reason, message = %ev.message, "fleet mark changed");
    }
    Ok(())
}

async fn record(
    client: &Client,
    involved: ObjectReference,
    ev: &NodeEvent,
) -> Result<(), kube::Error> {
    let instance = std::env::var("HOSTNAME").unwrap_or_else(|_| keys::FLEET_FIELD_MANAGER.into());
    record_event(client, involved, ev, keys::FLEET_FIELD_MANAGER, &instance).await
}

/// Writes `status.fleet` and `status.invasive` of the profile when either changed (and
/// `status.invasive` at least every third of [`STATUS_FRESH`], so daemons keep following its
/// queue), keeping the history in memory, and records a `FleetDrift` Event for measurements
/// that start drifting.
async fn write_status(
    client: &Client,
    profile: &FabricProfile,
    analysis: &FleetAnalysis,
    invasive: InvasiveStatus,
    memory: &mut Memory,
    now: Timestamp,
) -> anyhow::Result<FleetStatus> {
    let name = profile.name().to_string();
    let api = Api::<FabricProfile>::all(client.clone());
    if !memory.history.contains_key(&name) {
        let history = api
            .get_status(&name)
            .await
            .with_context(|| format!("cannot read FabricProfile {name}"))?
            .status
            .and_then(|s| s.fleet)
            .map(|f| f.history)
            .unwrap_or_default();
        memory.history.insert(name.clone(), history);
    }
    let history = memory.history.get(&name).cloned().unwrap_or_default();
    let status = fleet_status(&profile.spec.fleet, analysis, &history, now);
    let unchanged = memory.written.get(&name).is_some_and(|w| {
        let mut s = status.clone();
        s.computed_at = None;
        *w == s
    });
    let invasive_unchanged = memory
        .invasive_written
        .get(&name)
        .is_some_and(|(w, at)| *w == invasive && now.duration_since(*at) < STATUS_FRESH / 3);
    if !unchanged || !invasive_unchanged {
        let stamped = InvasiveStatus {
            computed_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
            ..invasive.clone()
        };
        let body = json!({
            "apiVersion": "railguard.io/v1alpha1",
            "kind": "FabricProfile",
            "metadata": { "name": name },
            "status": { "fleet": status, "invasive": stamped },
        });
        api.patch_status(
            &name,
            &PatchParams::apply(keys::FLEET_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .with_context(|| {
            format!("cannot write status.fleet and status.invasive of FabricProfile {name}")
        })?;
        let mut s = status.clone();
        s.computed_at = None;
        memory.written.insert(name.clone(), s);
        memory.history.insert(name.clone(), status.history.clone());
        memory
            .invasive_written
            .insert(name.clone(), (invasive, now));
    }
    let reported = memory.drifting.entry(name.clone()).or_default();
    let new: Vec<_> = status
        .drift
        .iter()
        .filter(|d| !reported.contains(&d.measurement))
        .collect();
    if let Some(first) = new.first() {
        let more = if new.len() > 1 {
            format!(" (and {} more measurements)", new.len() - 1)
        } else {
            String::new()
        };
        let ev = NodeEvent {
            reason: reason::DRIFT,
            kind: "Warning",
            message: format!(
                "fleet drift: {} median {:.1} is {:.1}% worse than its history ({:.1}){more}: a fleet-wide change (driver, firmware, fabric), not one node",
                first.measurement, first.current, first.worse_percent, first.reference
            ),
        };
        let involved = ObjectReference {
            api_version: Some("railguard.io/v1alpha1".into()),
            kind: Some("FabricProfile".into()),
            name: Some(name.clone()),
            uid: profile.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        record(client, involved, &ev).await.with_context(|| {
            format!(
                "cannot record event {} on FabricProfile {name}",
                reason::DRIFT
            )
        })?;
        tracing::warn!(profile = %name, message = %ev.message, "fleet drift");
    }
    *reported = status.drift.iter().map(|d| d.measurement.clone()).collect();
    Ok(status)
}
