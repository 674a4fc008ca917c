//! [`ClusterState`]: every cache of the extender, and the derived state kept in step with
//! them (job placements, the profile set, node prechecks and the node index).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use railguard_api::{FabricProfile, NodeFabric};

use crate::cache::{BoundPod, CachedNode, JobPlacements, NodeIndex, ProfileSet, Store};
use crate::decision::ExtenderConfig;
use crate::metrics::{CacheLabels, Metrics};

/// Everything the extender caches about the cluster.
#[derive(Debug)]
pub struct ClusterState {
    pub nodes: Store<CachedNode>,
    pub pods: Store<BoundPod>,
    /// Derived from `pods`: each job's nodes.
    pub jobs: JobPlacements,
    pub namespaces: Store<BTreeMap<String, String>>,
    pub profiles: Store<FabricProfile>,
    /// Profiles sorted by name, rebuilt on every profile change; handlers clone the Arc.
    profile_set: RwLock<Arc<ProfileSet>>,
    generation: AtomicU64,
    /// The node cache as the filter path reads it; see [`NodeIndex`].
    node_index: RwLock<Arc<NodeIndex>>,
    /// Serializes precheck refreshes (profile watch and node watch both start them).
    refreshing: Mutex<()>,
    pub config: ExtenderConfig,
}

impl ClusterState {
    pub fn new(config: ExtenderConfig) -> Self {
        ClusterState {
            nodes: Store::new("nodes"),
            pods: Store::new("pods"),
            jobs: JobPlacements::default(),
            namespaces: Store::new("namespaces"),
            profiles: Store::new("fabricprofiles"),
            profile_set: RwLock::new(Arc::new(ProfileSet::default())),
            generation: AtomicU64::new(0),
            node_index: RwLock::new(Arc::new(NodeIndex::default())),
            refreshing: Mutex::new(()),
            config,
        }
    }

    /// Names of the caches that have not finished their first list.
    pub fn unsynced(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, synced) in [
            (self.nodes.name, self.nodes.is_synced()),
            (self.pods.name, self.pods.is_synced()),
            (self.namespaces.name, self.namespaces.is_synced()),
            (self.profiles.name, self.profiles.is_synced()),
        ] {
            if !synced {
                out.push(name);
            }
        }
        out
    }

    pub fn profile_set(&self) -> Arc<ProfileSet> {
        self.profile_set
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The latest node index; check [`NodeIndex::is_current`] before trusting it.
    pub fn node_index(&self) -> Arc<NodeIndex> {
        self.node_index
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Rebuilds the profile set handlers read and every node's prechecks; the profile watch
    /// calls it on every change.
    pub fn rebuild_profile_list(&self) {
        let list: Vec<FabricProfile> = self
            .profiles
            .read()
            .values()
            .map(|p| (**p).clone())
            .collect();
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        *self
            .profile_set
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(ProfileSet::new(generation, list));
        self.refresh_prechecks();
    }

    /// Replaces the node cache with `nodes` (prechecked against the current profiles) and
    /// marks it synced.
    pub fn replace_nodes(&self, nodes: impl IntoIterator<Item = NodeFabric>) {
        let set = self.profile_set();
        self.nodes.replace(
            nodes
                .into_iter()
                .map(|n| (n.name.clone(), Arc::new(CachedNode::new(Arc::new(n), &set))))
                .collect(),
        );
        self.refresh_prechecks();
    }

    /// Recomputes the prechecks of nodes made for an older profile set, then the node index.
    /// Nodes converted while the profiles changed are caught by the refresh that follows
    /// their insert; until then handlers fall back to checking the certificate, which gives
    /// the same answer. The node watch calls this after every change.
    pub fn refresh_prechecks(&self) {
        let _serial = self
            .refreshing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let set = self.profile_set();
        self.refresh_stale_prechecks(&set);
        self.rebuild_node_index(&set);
    }

    fn rebuild_node_index(&self, set: &ProfileSet) {
        let nodes = self.nodes.read();
        // Read under the lock: no write is in flight, so this version names `nodes` exactly.
        let version = self.nodes.version();
        if self.node_index().is_current(version, set.generation) {
            return;
        }
        let index = Arc::new(NodeIndex::build(&nodes, version, set));
        drop(nodes);
        *self
            .node_index
            .write()
            .unwrap_or_else(PoisonError::into_inner) = index;
    }

    fn refresh_stale_prechecks(&self, set: &ProfileSet) {
        let stale: Vec<(String, Arc<CachedNode>)> = self
            .nodes
            .read()
            .iter()
            .filter(|(_, n)| n.generation != set.generation)
            .map(|(k, n)| (k.clone(), n.clone()))
            .collect();
        if stale.is_empty() {
            return;
        }
        // Computed outside the write lock, so filter calls keep reading meanwhile.
        let fresh: Vec<(String, Arc<CachedNode>, CachedNode)> = stale
            .into_iter()
            .map(|(k, old)| {
                let new = CachedNode::new(old.fabric.clone(), set);
                (k, old, new)
            })
            .collect();
        let mut map = self.nodes.write();
        for (key, old, new) in fresh {
            if let Some(current) = map.get_mut(&key) {
                if Arc::ptr_eq(current, &old) {
                    *current = Arc::new(new);
                } else if current.generation != set.generation {
                    // Replaced by the watch meanwhile with an older set; rare, done in place.
                    let redone = CachedNode::new(current.fabric.clone(), set);
                    *current = Arc::new(redone);
                }
            }
        }
    }

    /// The nodes where other pods of `job` in `namespace` run.
    /// Each node once, however many of the job's pods it runs.
    pub fn peers(&self, namespace: &str, job: &(String, String)) -> Vec<Arc<NodeFabric>> {
        let node_names = self.jobs.nodes(namespace, job);
        let nodes = self.nodes.read();
        node_names
            .iter()
            .filter_map(|n| nodes.get(n).map(|c| c.fabric.clone()))
            .collect()
    }

    /// Updates the cache gauges (called when metrics are scraped).
    pub fn record(&self, metrics: &Metrics) {
        for (name, age, len) in [
            (self.nodes.name, self.nodes.age(), self.nodes.len()),
            (self.pods.name, self.pods.age(), self.pods.len()),
            (
                self.namespaces.name,
                self.namespaces.age(),
                self.namespaces.len(),
            ),
            (self.profiles.name, self.profiles.age(), self.profiles.len()),
        ] {
            let labels = CacheLabels { cache: name };
            metrics
                .cache_age_seconds
                .get_or_create(&labels)
                .set(age.map_or(f64::NAN, |a| a.as_secs_f64()));
            metrics
                .cache_objects
                .get_or_create(&labels)
                .set(i64::try_from(len).unwrap_or(i64::MAX));
        }
    }
}
