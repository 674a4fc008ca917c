//! [`ClusterState`]: every cache of the extender, and the derived state kept in step with
//! them (job placements, the profile set, node prechecks and the node index).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use railguard_api::profile_list::InvalidProfiles;
use railguard_api::profile_list::{partition, ProfileObject};
use railguard_api::{FabricProfile, NodeFabric};

use crate::metrics::{CacheLabels, Metrics};
use railguard_extender::cache::{BoundPod, CachedNode, JobPlacements, NodeIndex, ProfileSet};
use railguard_extender::decision::ExtenderConfig;
use railguard_kube::store::{Applied, Store};

/// Everything the extender caches about the cluster.
#[derive(Debug)]
pub struct ClusterState {
    pub nodes: Store<CachedNode>,
    pub pods: Store<BoundPod>,
    /// Derived from `pods`: each job's nodes.
    pub jobs: JobPlacements,
    pub namespaces: Store<BTreeMap<String, String>>,
    /// The valid FabricProfiles (from `profile_objects` in cluster mode).
    pub profiles: Store<FabricProfile>,
    /// Every FabricProfile object as watched, each decoded on its own (valid or not).
    pub profile_objects: Store<ProfileObject>,
    /// The profiles skipped as invalid, for the log and the metric.
    invalid_profiles: Mutex<InvalidProfiles>,
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
            profile_objects: Store::new("fabricprofiles"),
            invalid_profiles: Mutex::default(),
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
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(ProfileSet::new(
            generation,
            list,
            &self.config.topology_keys,
        ));
        self.refresh_prechecks();
    }

    /// The profile watch saw a change: the valid objects become the profile store, the
    /// invalid ones are reported (warning log and `fabric_profiles_invalid`, once per change)
    /// and skipped, and the profile set is rebuilt.
    pub fn profile_objects_changed(&self, metrics: &Metrics) {
        let (valid, invalid) = partition(self.profile_objects.read().values().map(|o| o.as_ref()));
        let changes = self
            .invalid_profiles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(invalid);
        railguard_kube::log_profile_changes(&changes, "extender");
        railguard_kube::record_profile_changes(&changes, &metrics.profiles_invalid);
        self.replace_profiles(valid);
    }

    /// Replaces the valid profiles (and the profile list and prechecks derived from them).
    pub fn replace_profiles(&self, profiles: impl IntoIterator<Item = FabricProfile>) {
        self.profiles.replace(
            profiles
                .into_iter()
                .map(|p| (p.name().to_string(), Arc::new(p)))
                .collect(),
        );
        self.rebuild_profile_list();
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

    /// The node watch applied `applied`: an indexed node that changed replaces its own slot
    /// in the node index when that was the only write since the index was made; anything
    /// else (a node added or deleted, a relist, prechecks made for another profile set)
    /// runs [`ClusterState::refresh_prechecks`].
    pub fn node_changed(&self, applied: &Applied<CachedNode>) {
        if let Applied::Changed {
            old: Some(_),
            new: Some(new),
        } = applied
        {
            if self.replace_indexed_node(new) {
                return;
            }
        }
        self.refresh_prechecks();
    }

    fn replace_indexed_node(&self, new: &Arc<CachedNode>) -> bool {
        let _serial = self
            .refreshing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let set = self.profile_set();
        let nodes = self.nodes.read();
        let version = self.nodes.version();
        let current = self.node_index();
        // Exactly one write since the index, and it is this node's: it is still in the map.
        let only_this_write = version
            .checked_sub(1)
            .is_some_and(|before| current.is_current(before, set.generation))
            && new.generation == set.generation
            && nodes
                .get(&new.fabric.name)
                .is_some_and(|n| Arc::ptr_eq(n, new));
        let Some(index) = only_this_write
            .then(|| current.with_node(new, version, &set))
            .flatten()
        else {
            return false;
        };
        drop(nodes);
        *self
            .node_index
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(index);
        true
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use railguard_kube::store::{Applier, Change};

    fn object(name: &str, port: u64) -> ProfileObject {
        let text = include_str!("../../../../api/fixtures/profiles/dgx-h100-ndr.yaml");
        let profile = railguard_api::profiles_from_yaml(text).unwrap().remove(0);
        let mut v = serde_json::to_value(profile).unwrap();
        v["metadata"]["name"] = name.into();
        v["spec"]["rails"][0]["port"] = port.into();
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_invalid_profile_is_skipped_and_reported_and_the_others_served() {
        let state = ClusterState::new(ExtenderConfig::default());
        let metrics = Metrics::new();
        let mut applier = Applier::default();
        applier.apply(&state.profile_objects, Change::Restart);
        for o in [object("good", 1), object("bad", 4294967296)] {
            let key = o.name().to_string();
            applier.apply(&state.profile_objects, Change::Listed(key, Some(o)));
        }
        applier.apply(&state.profile_objects, Change::ListDone);
        state.profile_objects_changed(&metrics);
        assert!(!state.unsynced().contains(&"fabricprofiles"));
        let names: Vec<String> = state
            .profile_set()
            .profiles
            .iter()
            .map(|p| p.name().to_string())
            .collect();
        assert_eq!(names, ["good"]);
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("railguard_extender_fabric_profiles_invalid{profile=\"bad\"} 1"),
            "{text}"
        );
        // Fixed: served, and the metric is gone.
        applier.apply(
            &state.profile_objects,
            Change::Changed("bad".into(), Some(object("bad", 2))),
        );
        state.profile_objects_changed(&metrics);
        assert_eq!(state.profile_set().profiles.len(), 2);
        let text = metrics.encode().unwrap();
        assert!(!text.contains("profile=\"bad\""), "{text}");
    }
}

#[cfg(test)]
mod placements_tests {
    #![allow(clippy::unwrap_used)]
    use railguard_extender::cache::{BoundPod, JobPlacements};
    use railguard_kube::store::{Applied, Applier, Change, Store};

    /// What the job index must equal: a scan of every cached pod.
    fn scanned(store: &Store<BoundPod>, ns: &str, job: &(String, String)) -> Vec<String> {
        let mut nodes: Vec<String> = store
            .read()
            .values()
            .filter(|p| p.namespace == ns && &p.job == job)
            .map(|p| p.node.clone())
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    #[test]
    fn job_placements_follow_every_pod_change() {
        let store: Store<BoundPod> = Store::new("pods");
        let jobs = JobPlacements::default();
        let mut a = Applier::default();
        let mut apply = |change| match a.apply(&store, change) {
            Applied::Staged => {}
            Applied::Replaced => jobs.rebuild(&store.read()),
            Applied::Changed { old, new } => jobs.update(old.as_deref(), new.as_deref()),
        };
        let kind = "training.kubeflow.org/job-name".to_string();
        let llm = (kind.clone(), "llm".to_string());
        let other = (kind.clone(), "other".to_string());
        let pod = |ns: &str, node: &str, job: &(String, String)| BoundPod {
            namespace: ns.into(),
            node: node.into(),
            job: job.clone(),
        };
        let check = |jobs: &JobPlacements, store: &Store<BoundPod>| {
            for ns in ["a", "b"] {
                for job in [&llm, &other] {
                    assert_eq!(jobs.nodes(ns, job), scanned(store, ns, job), "{ns} {job:?}");
                }
            }
        };

        apply(Change::Restart);
        apply(Change::Listed("a/p0".into(), Some(pod("a", "n1", &llm))));
        apply(Change::Listed("a/p1".into(), Some(pod("a", "n1", &llm))));
        apply(Change::Listed("a/p2".into(), Some(pod("a", "n2", &llm))));
        apply(Change::Listed("b/p0".into(), Some(pod("b", "n3", &llm))));
        // Nothing is visible until the list completes.
        assert!(jobs.nodes("a", &llm).is_empty());
        apply(Change::ListDone);
        assert_eq!(jobs.nodes("a", &llm), ["n1", "n2"]);
        check(&jobs, &store);

        // Two pods share n1: it stays until both are gone.
        apply(Change::Changed("a/p0".into(), None));
        assert_eq!(jobs.nodes("a", &llm), ["n1", "n2"]);
        apply(Change::Changed("a/p1".into(), None));
        assert_eq!(jobs.nodes("a", &llm), ["n2"]);
        check(&jobs, &store);

        // A pod relabelled to another job, a finished pod (converted to None), a re-sent
        // identical object, and a pod of the same job name in another namespace.
        apply(Change::Changed("a/p2".into(), Some(pod("a", "n2", &other))));
        apply(Change::Changed("a/p3".into(), Some(pod("a", "n4", &llm))));
        apply(Change::Changed("a/p3".into(), Some(pod("a", "n4", &llm))));
        apply(Change::Changed("b/p0".into(), None));
        apply(Change::Changed("b/p0".into(), None));
        check(&jobs, &store);
        assert_eq!(jobs.nodes("a", &other), ["n2"]);
        assert!(jobs.nodes("b", &llm).is_empty());

        // A relist replaces everything, including jobs that vanished meanwhile.
        apply(Change::Restart);
        apply(Change::Listed("b/p9".into(), Some(pod("b", "n9", &other))));
        apply(Change::ListDone);
        check(&jobs, &store);
        assert!(jobs.nodes("a", &llm).is_empty());
        assert_eq!(jobs.nodes("b", &other), ["n9"]);
    }
}
