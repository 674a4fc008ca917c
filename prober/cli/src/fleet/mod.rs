//! `railguard-prober fleet`: the fleet of every profile against its baseline. Report mode
//! lists Nodes and FabricProfiles once and prints the table (or JSON) and, with `--html`,
//! writes the report; `--watch` runs the fleet controller ([`controller`]), which marks
//! outliers on the Nodes and keeps the baseline and its history in the profiles' status.
//!
//! It runs apart from the extender on purpose: the extender sits on the scheduling path with
//! `ignorable: false`, reads the API only through caches and holds no write permission; the
//! controller writes conditions, Events and profile status, and its recomputation (linear in
//! nodes, see BENCHMARKS.md) never competes with a scheduling request.

pub mod controller;
pub mod dra;
pub mod metrics;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueHint};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use railguard_api::fleet::FleetStatus;
use railguard_api::{FabricProfile, FabricState, NodeFabric};
use railguard_fleet::{report, FleetAnalysis, FleetNode};
use serde::Serialize;

use crate::{Outcome, Status};

pub use metrics::METRIC_NAMES;

#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Only this FabricProfile (default: every valid profile of the cluster).
    #[arg(long, env = "RAILGUARD_PROFILE")]
    pub profile: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// Print the fleet as JSON instead of a table.
    #[arg(long, env = "RAILGUARD_FLEET_JSON")]
    pub json: bool,
    /// Also write the self-contained HTML report (heatmap, busbw distribution) here.
    #[arg(long, env = "RAILGUARD_FLEET_HTML", value_hint = ValueHint::FilePath)]
    pub html: Option<PathBuf>,
    /// Run as the fleet controller: mark outliers (Node condition RailguardFleetOutlier,
    /// Events), keep status.fleet of every profile, serve metrics; until SIGTERM.
    #[arg(long, env = "RAILGUARD_FLEET_WATCH")]
    pub watch: bool,
    /// Controller: recompute at least this often, seconds.
    #[arg(long, env = "RAILGUARD_FLEET_INTERVAL_SECS", default_value_t = 60)]
    pub interval_secs: u64,
    /// Controller: after a Node or profile changes, wait this long for more changes before
    /// recomputing, seconds (a recertification wave is one recomputation).
    #[arg(long, env = "RAILGUARD_FLEET_SETTLE_SECS", default_value_t = 5)]
    pub settle_secs: u64,
    /// Controller: keep DRA DeviceTaintRules for unhealthy rails where the API server serves
    /// `resource.k8s.io/v1` DeviceTaintRules (Kubernetes 1.37+); elsewhere nothing DRA runs.
    /// Off by default, as in the chart (`dra.deviceTaints`): a rule taints the device for
    /// every claim, not only railguard's.
    #[arg(long, env = "RAILGUARD_DRA_TAINTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub dra_taints: bool,
    /// Controller: write only while holding the Lease `railguard-fleet` (several replicas,
    /// one writer).
    #[arg(long, env = "RAILGUARD_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Controller: namespace of the leader Lease (default: $POD_NAMESPACE, else `default`).
    #[arg(long, env = "RAILGUARD_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Controller: this replica's identity in the Lease (default: $POD_NAME, else the host
    /// name and process id).
    #[arg(long, env = "RAILGUARD_LEADER_ELECTION_IDENTITY")]
    pub leader_election_identity: Option<String>,
    /// Controller: `/metrics`, `/healthz` and `/readyz` on this address.
    #[arg(long, env = "RAILGUARD_METRICS_LISTEN", default_value = "0.0.0.0:9464")]
    pub metrics_listen: SocketAddr,
    /// Controller: namespace of the probers' invasive-slot Leases (the daemons'
    /// `--lease-namespace`). A Node left `testing` or `pending` by a run that no live Lease
    /// there names (its prober died mid-run) is given back its certificate's state. Unset:
    /// such Nodes wait for their prober's restart.
    #[arg(long, env = "RAILGUARD_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
}

impl FleetArgs {
    pub async fn run(self) -> anyhow::Result<Outcome> {
        let client = crate::cluster_client(self.kubeconfig.as_deref()).await?;
        if self.watch {
            if self.json || self.html.is_some() {
                anyhow::bail!("--json and --html are for the report; --watch runs the controller");
            }
            controller::run(client, &self).await?;
            return Ok(Outcome::default());
        }
        self.report(&client).await
    }

    async fn report(&self, client: &Client) -> anyhow::Result<Outcome> {
        let (profiles, _invalid) = crate::profile_source::cluster_profiles(client).await?;
        let nodes = Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await
            .context("cannot list Nodes")?;
        // Against every valid profile, whichever --profile shows.
        let unprofiled = crate::unprofiled::unprofiled_gpu_nodes(&nodes.items, &profiles);
        let profiles = select(profiles, self.profile.as_deref())?;
        let now = Timestamp::now();
        let fabrics: Vec<NodeFabric> = nodes
            .items
            .iter()
            .map(|n| NodeFabric::from_node(n, now))
            .collect();
        let api = Api::<FabricProfile>::all(client.clone());
        let mut views = Vec::new();
        for p in &profiles {
            let analysis = analyze(p, fabrics.iter());
            // The baseline's history lives in the profile's status (the controller's).
            let status = api
                .get_status(p.name())
                .await
                .with_context(|| format!("cannot read FabricProfile {}", p.name()))?
                .status
                .and_then(|s| s.fleet);
            views.push((analysis, status));
        }
        if let Some(path) = &self.html {
            let analyses: Vec<FleetAnalysis> = views.iter().map(|(a, _)| a.clone()).collect();
            let html = railguard_fleet::html::render_html(&analyses, now);
            write_atomically(path, html.as_bytes())
                .with_context(|| format!("cannot write the report to {}", path.display()))?;
        }
        let any_outlier = views.iter().any(|(a, _)| !a.outliers.is_empty());
        let text = if self.json {
            let json = FleetView {
                profiles: views.iter().map(|(a, s)| ProfileView::of(a, s)).collect(),
                unprofiled,
            };
            let mut t = serde_json::to_string_pretty(&json)?;
            t.push('\n');
            t
        } else {
            let mut t = String::new();
            for (a, s) in &views {
                t.push_str(&report::table(a));
                if let Some(s) = s {
                    for d in &s.drift {
                        t.push_str(&format!(
                            "  drift: {} median {:.1} is {:.1}% worse than its history ({:.1})\n",
                            d.measurement, d.current, d.worse_percent, d.reference
                        ));
                    }
                }
                t.push('\n');
            }
            t.push_str(&unprofiled_section(&unprofiled));
            if let Some(path) = &self.html {
                t.push_str(&format!("report written to {}\n", path.display()));
            }
            t
        };
        Ok(Outcome::new(text, Status::fail_if(any_outlier)))
    }
}

/// The profiles to look at: all, or the one asked for (an error naming the others when it
/// is not among the valid ones).
fn select(profiles: Vec<FabricProfile>, only: Option<&str>) -> anyhow::Result<Vec<FabricProfile>> {
    let Some(name) = only else {
        return Ok(profiles);
    };
    let names: Vec<String> = profiles.iter().map(|p| p.name().to_string()).collect();
    let chosen: Vec<FabricProfile> = profiles.into_iter().filter(|p| p.name() == name).collect();
    if chosen.is_empty() {
        anyhow::bail!(
            "no valid FabricProfile {name:?} in the cluster (valid: {})",
            names.join(", ")
        );
    }
    Ok(chosen)
}

/// Decoded Nodes by name, kept while a Node's `resourceVersion` stays the same: decoding
/// the certificate JSON is most of a recomputation, and between two of them few Nodes change.
#[derive(Default)]
pub struct FabricCache {
    entries: HashMap<String, (Option<String>, NodeFabric)>,
}

impl FabricCache {
    /// Makes the cache hold exactly `nodes`, decoding those that are new or changed (or whose
    /// certificate has expired since it was decoded).
    pub fn refresh<'a>(&mut self, nodes: impl Iterator<Item = &'a Node>, now: Timestamp) {
        let mut old = std::mem::take(&mut self.entries);
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let rv = node.metadata.resource_version.clone();
            let kept = old.remove(&name).filter(|(seen, fabric)| {
                rv.is_some()
                    && *seen == rv
                    && !matches!(&fabric.state, FabricState::Certified(c) if c.is_expired(now))
            });
            let entry = kept.unwrap_or_else(|| (rv, NodeFabric::from_node(node, now)));
            self.entries.insert(name, entry);
        }
    }

    pub fn fabrics(&self) -> impl Iterator<Item = &NodeFabric> {
        self.entries.values().map(|(_, f)| f)
    }
}

/// The profile a node belongs to: its label, else its certificate's.
pub fn profile_of(n: &NodeFabric) -> Option<&str> {
    n.profile
        .as_deref()
        .or_else(|| n.state.certificate().map(|c| c.profile.as_str()))
}

/// Whether `f` is one of `profile`'s nodes for its slots: labelled or certified for it, or,
/// before its first run has labelled it (a cold node), selected by the profile's non-empty
/// `nodeSelector`, as the chart places the profile's probers. Without that a cold fleet
/// would count no nodes and a percentage would resolve to one slot.
pub fn counts_for_slots(profile: &railguard_api::FabricProfile, f: &NodeFabric) -> bool {
    match profile_of(f) {
        Some(p) => p == profile.name(),
        None => {
            let selector = &profile.spec.node_selector;
            !selector.is_empty()
                && selector
                    .iter()
                    .all(|(k, v)| f.labels.get(k).is_some_and(|l| l == v))
        }
    }
}

/// `status.invasive` of `profile` (without `computedAt`): its nodes, the slots its
/// `maxConcurrentInvasive` resolves to, and the queue of its nodes whose waiting mark
/// (`waiting`, from the Nodes' `railguard.io/invasive-waiting`) still counts at `now`.
pub fn invasive_status_of<'a>(
    profile: &railguard_api::FabricProfile,
    fabrics: impl Iterator<Item = &'a NodeFabric>,
    waiting: &BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> railguard_api::invasive::InvasiveStatus {
    use railguard_api::invasive::{invasive_status, waiting_mark_counts, WaitingNode};
    let mut nodes = 0u32;
    let mut queue = Vec::new();
    for f in fabrics.filter(|f| counts_for_slots(profile, f)) {
        nodes += 1;
        if waiting
            .get(&f.name)
            .is_some_and(|since| waiting_mark_counts(*since, now))
        {
            queue.push(WaitingNode {
                name: f.name.clone(),
                certified_at: f.state.certificate().map(|c| c.issued_at),
            });
        }
    }
    invasive_status(
        profile.spec.certification.max_concurrent_invasive,
        nodes,
        queue,
    )
}

/// The fleet input of one node.
pub fn fleet_node(n: &NodeFabric) -> FleetNode {
    FleetNode {
        name: n.name.clone(),
        state: n.state.kind(),
        certified: matches!(n.state, FabricState::Certified(_)),
        figures: n
            .state
            .certificate()
            .map(railguard_fleet::measurements)
            .unwrap_or_default(),
        healthy_rails: n.state.certificate().map_or(0, FleetNode::healthy_rails_of),
    }
}

/// Analyses the nodes of `profile` among `nodes`.
pub fn analyze<'a>(
    profile: &FabricProfile,
    nodes: impl Iterator<Item = &'a NodeFabric>,
) -> FleetAnalysis {
    let members: Vec<FleetNode> = nodes
        .filter(|n| profile_of(n) == Some(profile.name()))
        .map(fleet_node)
        .collect();
    railguard_fleet::analyze_fleet(profile.name(), &profile.spec.fleet, members)
}

/// Writes a file whole or not at all (a reader never sees half a report).
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// The table's `unprofiled` section: the GPU nodes no profile selects (none: one line
/// saying so).
fn unprofiled_section(nodes: &[String]) -> String {
    if nodes.is_empty() {
        return "unprofiled: none (every GPU node belongs to a FabricProfile)\n".into();
    }
    let mut s = format!(
        "unprofiled: {} GPU node(s) no FabricProfile selects, certified by nothing\n",
        nodes.len()
    );
    for n in nodes {
        s.push_str(&format!("  {n}\n"));
    }
    s
}

/// `--json`: the profiles' fleets and the GPU nodes that belong to none.
#[derive(Serialize)]
struct FleetView {
    /// One object per profile.
    profiles: Vec<ProfileView>,
    /// GPU nodes (`nvidia.com/gpu.present=true` or allocatable `nvidia.com/gpu`) that no
    /// valid profile's nodeSelector (nor their `railguard.io/profile` label) places, by name.
    unprofiled: Vec<String>,
}

/// One profile's fleet.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProfileView {
    profile: String,
    certified: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    no_baseline: Option<String>,
    /// Median and spread per measurement.
    baseline: BTreeMap<String, BaselineView>,
    nodes: Vec<NodeView>,
    /// Measurements that would have marked too much of the fleet.
    split: BTreeMap<String, usize>,
    /// From the controller's `status.fleet`; empty before it ran.
    drift: Vec<railguard_api::fleet::FleetDrift>,
}

#[derive(Serialize)]
struct BaselineView {
    median: f64,
    spread: f64,
    nodes: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeView {
    node: String,
    state: &'static str,
    outlier: bool,
    marks: Vec<String>,
    /// Worst signed distance from the baseline in spreads; null without a baseline.
    worst_distance_spreads: Option<f64>,
    /// Host write bandwidth relative to the baseline median, per rail.
    rail_relative: BTreeMap<String, f64>,
}

impl ProfileView {
    fn of(a: &FleetAnalysis, status: &Option<FleetStatus>) -> Self {
        let rails = report::rails(a);
        ProfileView {
            profile: a.profile.clone(),
            certified: a.certified,
            no_baseline: a.no_baseline.clone(),
            baseline: a
                .baseline
                .iter()
                .map(|(m, b)| {
                    (
                        m.to_string(),
                        BaselineView {
                            median: b.median,
                            spread: b.spread,
                            nodes: b.nodes,
                        },
                    )
                })
                .collect(),
            nodes: report::rows(a)
                .into_iter()
                .map(|r| NodeView {
                    outlier: !r.outliers.is_empty(),
                    rail_relative: rails
                        .iter()
                        .zip(&r.relative)
                        .filter_map(|(rail, v)| Some((rail.clone(), (*v)?)))
                        .collect(),
                    node: r.node,
                    state: r.state,
                    marks: r.outliers,
                    worst_distance_spreads: r.worst_distance,
                })
                .collect(),
            split: a.split.iter().map(|(m, n)| (m.to_string(), *n)).collect(),
            drift: status.as_ref().map(|s| s.drift.clone()).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railguard_api::Verdict;
    use railguard_sim::certificates as synth;

    fn node(name: &str, rv: &str, gbps: f64, profile: &FabricProfile) -> Node {
        let issued = Timestamp::now() - jiff::SignedDuration::from_hours(1);
        let cert = synth::certificate(profile, Verdict::Certified, issued, gbps, 360.0);
        let mut n = synth::node(&Node::default(), name, Some(&cert), &[]);
        n.metadata.resource_version = Some(rv.into());
        n
    }

    fn bw(cache: &FabricCache, name: &str) -> Option<f64> {
        let f = cache.fabrics().find(|f| f.name == name)?;
        f.state.certificate()?.rails.first()?.write_bw_host_gbps
    }

    #[test]
    fn a_cold_node_counts_for_the_slots_of_the_profile_that_selects_it() {
        let text = include_str!("../../../../api/fixtures/profiles/dgx-h100-ndr.yaml");
        let profile = railguard_api::profiles_from_yaml(text).unwrap().remove(0);
        assert!(
            !profile.spec.node_selector.is_empty(),
            "the fixture selects"
        );
        let now = Timestamp::now();
        let fabric = |labels: &[(&str, &str)], cert: bool| {
            let mut n = if cert {
                node("gpu-c", "1", 390.0, &profile)
            } else {
                Node::default()
            };
            n.metadata.name = Some("gpu-c".into());
            let l = n.metadata.labels.get_or_insert_with(Default::default);
            for (k, v) in labels {
                l.insert(k.to_string(), v.to_string());
            }
            NodeFabric::from_node(&n, now)
        };
        let selected: Vec<(&str, &str)> = profile
            .spec
            .node_selector
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // Cold (no label, no certificate) but selected: counted, and queued while waiting.
        let cold = fabric(&selected, false);
        assert!(counts_for_slots(&profile, &cold));
        assert!(!counts_for_slots(&profile, &fabric(&[], false)));
        // Labelled for another profile: not this one's, whatever it selects.
        let mut other = selected.clone();
        other.push((railguard_api::keys::LABEL_PROFILE, "a100-hdr"));
        assert!(!counts_for_slots(&profile, &fabric(&other, false)));
        assert!(
            counts_for_slots(&profile, &fabric(&[], true)),
            "certified for it"
        );
        let waiting = BTreeMap::from([("gpu-c".to_string(), now)]);
        let status = invasive_status_of(&profile, [&cold].into_iter(), &waiting, now);
        assert_eq!((status.nodes, status.waiting), (1, 1));
        assert_eq!(status.queue, ["gpu-c"]);
    }

    #[test]
    fn the_report_lists_unprofiled_gpu_nodes_under_their_own_key_and_heading() {
        let nodes = vec!["b200-1".to_string(), "l40s-2".to_string()];
        let section = unprofiled_section(&nodes);
        assert!(
            section.starts_with("unprofiled: 2 GPU node(s)"),
            "{section}"
        );
        assert!(section.contains("\n  b200-1\n  l40s-2\n"), "{section}");
        assert!(unprofiled_section(&[]).starts_with("unprofiled: none"));
        let json = serde_json::to_value(FleetView {
            profiles: Vec::new(),
            unprofiled: nodes,
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"profiles": [], "unprofiled": ["b200-1", "l40s-2"]})
        );
    }

    #[test]
    fn the_cache_keeps_unchanged_nodes_and_follows_changes_and_deletions() {
        let text = include_str!("../../../../api/fixtures/profiles/dgx-h100-ndr.yaml");
        let profile = railguard_api::profiles_from_yaml(text).unwrap().remove(0);
        let now = Timestamp::now();
        let mut cache = FabricCache::default();
        cache.refresh(
            [
                node("a", "1", 384.0, &profile),
                node("b", "1", 384.0, &profile),
            ]
            .iter(),
            now,
        );
        assert_eq!(cache.fabrics().count(), 2);
        // Same resourceVersion: the decoded state is kept (even though the object differs).
        cache.refresh(
            [
                node("a", "1", 100.0, &profile),
                node("b", "2", 300.0, &profile),
            ]
            .iter(),
            now,
        );
        assert_eq!(bw(&cache, "a"), Some(384.0));
        assert_eq!(bw(&cache, "b"), Some(300.0));
        // A node gone is gone; one without a resourceVersion is always decoded.
        let mut c = node("c", "1", 200.0, &profile);
        c.metadata.resource_version = None;
        cache.refresh([c.clone()].iter(), now);
        assert_eq!(cache.fabrics().count(), 1);
        c.metadata.annotations = None;
        c.metadata.labels = None;
        cache.refresh([c].iter(), now);
        assert_eq!(bw(&cache, "c"), None);
        // A certificate that expired since it was decoded is decoded again.
        let later = now + jiff::SignedDuration::from_hours(48);
        cache.refresh([node("a", "1", 384.0, &profile)].iter(), now);
        assert_eq!(cache.fabrics().next().unwrap().state.kind(), "certified");
        cache.refresh([node("a", "1", 384.0, &profile)].iter(), later);
        assert_eq!(cache.fabrics().next().unwrap().state.kind(), "expired");
    }
}
