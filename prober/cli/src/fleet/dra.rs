//! The fleet controller's DRA part: on clusters serving `resource.k8s.io/v1` DeviceTaintRules
//! (Kubernetes 1.37), it keeps one rule per device of a failed, regressed, expired, long
//! pending or (per profile) outlier rail, and deletes its rules nothing calls for any more.
//! The decisions are `railguard_api::dra`'s; this module reads ResourceSlices and its own
//! rules from reflector caches and writes the difference (server-side apply, delete).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use railguard_api::dra::{
    self, plan_rules, rail_devices, rail_taint_reasons, rule_object, wanted_rules, ExistingRule,
    ResourceSlice, WantedRule,
};
use railguard_api::{keys, FabricProfile, NodeFabric};
use railguard_fleet::FleetAnalysis;
use railguard_kube::store::Store;
use railguard_kube::watch::{watch_into, Config};
use tokio::sync::Notify;

/// Rule writes in flight at once.
const WRITE_CONCURRENCY: usize = 8;

pub(crate) fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind))
}

/// Whether the DRA part can run here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// DeviceTaintRules are served and this controller may read slices and its rules.
    On,
    /// The API server does not serve `resource.k8s.io/v1` DeviceTaintRules (before 1.37).
    NotServed,
    /// Served, but this controller's RBAC does not let it read them (a chart rendered
    /// without DRA for a cluster that has it): said, and the rest of the controller runs.
    Forbidden(String),
}

/// Whether the API server serves DeviceTaintRules at `resource.k8s.io/v1`, and whether this
/// controller may list them and ResourceSlices.
pub async fn availability(client: &Client) -> anyhow::Result<Availability> {
    match client.list_api_group_resources(dra::API_VERSION).await {
        Ok(list) => {
            let has = |n: &str| list.resources.iter().any(|r| r.name == n);
            if !(has("devicetaintrules") && has("resourceslices")) {
                return Ok(Availability::NotServed);
            }
        }
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Availability::NotServed),
        Err(e) => {
            return Err(e).context("cannot read the API server's resource.k8s.io/v1 resources")
        }
    }
    for kind in ["ResourceSlice", "DeviceTaintRule"] {
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource(kind));
        match api
            .list_metadata(&kube::api::ListParams::default().limit(1))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 403 => {
                return Ok(Availability::Forbidden(format!(
                    "cannot list {kind}s: {}",
                    s.message
                )))
            }
            Err(e) => return Err(e).with_context(|| format!("cannot list {kind}s")),
        }
    }
    Ok(Availability::On)
}

/// The caches the DRA reconciliation reads.
pub struct DraCaches {
    slices: Arc<Store<DynamicObject>>,
    rules: Arc<Store<DynamicObject>>,
}

impl DraCaches {
    /// Starts the ResourceSlice and (railguard's own) DeviceTaintRule reflectors, each
    /// change waking the controller, and waits until both are filled.
    pub async fn start(
        client: &Client,
        changed: Arc<Notify>,
    ) -> anyhow::Result<(DraCaches, tokio::task::JoinHandle<()>)> {
        let slices_ar = resource("ResourceSlice");
        let rules_ar = resource("DeviceTaintRule");
        let slices: Arc<Store<DynamicObject>> = Arc::new(Store::new("resourceslices"));
        let rules: Arc<Store<DynamicObject>> = Arc::new(Store::new("devicetaintrules"));
        let task = {
            let (slices, rules, client) = (slices.clone(), rules.clone(), client.clone());
            let slice_changed = changed.clone();
            let selector = format!("{}={}", dra::LABEL_MANAGED_BY, dra::MANAGED_BY);
            tokio::spawn(async move {
                tokio::join!(
                    watch_into(
                        Api::<DynamicObject>::all_with(client.clone(), &slices_ar),
                        Config::default(),
                        &slices,
                        |o: &DynamicObject| Some(o.clone()),
                        |_| slice_changed.notify_one(),
                        |_| {},
                    ),
                    watch_into(
                        Api::<DynamicObject>::all_with(client, &rules_ar),
                        Config::default().labels(&selector),
                        &rules,
                        |o: &DynamicObject| Some(o.clone()),
                        |_| changed.notify_one(),
                        |_| {},
                    ),
                );
            })
        };
        tokio::join!(slices.synced(), rules.synced());
        Ok((DraCaches { slices, rules }, task))
    }

    fn slices(&self) -> Vec<ResourceSlice> {
        self.slices
            .values()
            .iter()
            .filter_map(|o| {
                let v = serde_json::to_value(o.as_ref()).ok()?;
                match serde_json::from_value::<ResourceSlice>(v) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!(slice = o.metadata.name.as_deref().unwrap_or(""), error = %e, "unreadable ResourceSlice; skipped");
                        None
                    }
                }
            })
            .collect()
    }

    /// The nodes with a node-local ResourceSlice of one of `drivers` (empty names ignored).
    pub fn nodes_with_slices(&self, drivers: &[&str]) -> BTreeSet<String> {
        self.slices
            .values()
            .iter()
            .filter_map(|o| {
                let spec = o.data.get("spec")?;
                let driver = spec.get("driver")?.as_str()?;
                let node = spec.get("nodeName")?.as_str()?;
                (!driver.is_empty() && drivers.contains(&driver)).then(|| node.to_string())
            })
            .collect()
    }

    fn rules(&self) -> Vec<ExistingRule> {
        self.rules
            .values()
            .iter()
            .filter_map(|o| ExistingRule::from_object(&serde_json::to_value(o.as_ref()).ok()?))
            .collect()
    }
}

/// The rules every profile's nodes call for now.
pub fn wanted(
    profiles: &[FabricProfile],
    analyses: &[FleetAnalysis],
    fabrics: &[&NodeFabric],
    slices: &[ResourceSlice],
    now: Timestamp,
) -> Vec<WantedRule> {
    let mut by_node: BTreeMap<&str, Vec<&ResourceSlice>> = BTreeMap::new();
    for s in slices {
        if let Some(n) = s.spec.node_name.as_deref() {
            by_node.entry(n).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for (p, analysis) in profiles.iter().zip(analyses) {
        let spec = &p.spec.dra;
        for f in fabrics
            .iter()
            .filter(|f| super::profile_of(f) == Some(p.name()))
        {
            let Some(cert) = f.state.certificate() else {
                continue;
            };
            let Some(node_slices) = by_node.get(f.name.as_str()) else {
                continue;
            };
            let devices = rail_devices(&f.name, cert, node_slices, spec);
            let outlier_rails: BTreeSet<String> = analysis
                .outliers
                .get(&f.name)
                .map(|os| {
                    os.iter()
                        .filter_map(|o| o.measurement.rail.clone())
                        .collect()
                })
                .unwrap_or_default();
            let reasons = rail_taint_reasons(f, spec, &outlier_rails, now);
            out.extend(wanted_rules(&f.name, &devices, &reasons, spec.taint_effect));
        }
    }
    out
}

/// One reconciliation: writes what differs; returns (rules wanted, applied, deleted).
pub async fn reconcile(
    client: &Client,
    caches: &DraCaches,
    profiles: &[FabricProfile],
    analyses: &[FleetAnalysis],
    fabrics: &[&NodeFabric],
    now: Timestamp,
) -> anyhow::Result<(usize, usize, usize)> {
    let slices = caches.slices();
    let want = wanted(profiles, analyses, fabrics, &slices, now);
    let plan = plan_rules(&want, &caches.rules());
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource("DeviceTaintRule"));
    let pp = PatchParams::apply(keys::FLEET_FIELD_MANAGER).force();
    let (applied, deleted) = (plan.apply.len(), plan.delete.len());
    futures::stream::iter(plan.apply.iter())
        .map(|rule| {
            let api = api.clone();
            let pp = pp.clone();
            async move {
                api.patch(&rule.name, &pp, &Patch::Apply(rule_object(rule)))
                    .await
                    .with_context(|| {
                        format!(
                            "cannot apply DeviceTaintRule {} ({} {} of node {}: {})",
                            rule.name, rule.device.kind.as_str(), rule.device.device, rule.node, rule.value
                        )
                    })?;
                tracing::info!(rule = %rule.name, node = %rule.node, rail = %rule.rail, device = %rule.device.device, driver = %rule.device.driver, value = %rule.value, effect = rule.effect.as_str(), "device taint applied");
                anyhow::Ok(())
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    futures::stream::iter(plan.delete.iter())
        .map(|name| {
            let api = api.clone();
            async move {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(anyhow::Error::new(e)
                            .context(format!("cannot delete DeviceTaintRule {name}")))
                    }
                }
                tracing::info!(rule = %name, "device taint removed");
                anyhow::Ok(())
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((want.len(), applied, deleted))
}
