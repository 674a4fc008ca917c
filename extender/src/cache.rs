//! The extender's view of the cluster: Nodes (as [`NodeFabric`]), bound GPU pods (for gang
//! locality), Namespaces (for exemptions) and FabricProfiles, each kept current by a watch.
//!
//! The node cache keeps only what decisions read (name, labels, allocatable and the parsed
//! certificate), never managedFields, images or conditions, and parses each certificate
//! once per Node change instead of once per scheduling call.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hashbrown::{DefaultHashBuilder, HashTable};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use railguard_api::{FabricProfile, NodeFabric};

use crate::decision::{precheck, ExtenderConfig, NodeSlot, Precheck};
use crate::metrics::{CacheLabels, Metrics};
use crate::pod::PodFacts;

/// One keyed cache fed by a watch.
#[derive(Debug)]
pub struct Store<V> {
    pub name: &'static str,
    map: RwLock<HashMap<String, Arc<V>>>,
    /// Bumped by every write, so derived indexes can tell whether they are current.
    version: AtomicU64,
    synced: AtomicBool,
    last_heard: Mutex<Option<Instant>>,
}

impl<V> Store<V> {
    pub fn new(name: &'static str) -> Self {
        Store {
            name,
            map: RwLock::new(HashMap::new()),
            version: AtomicU64::new(0),
            synced: AtomicBool::new(false),
            last_heard: Mutex::new(None),
        }
    }

    /// Read access; a panic elsewhere while writing cannot leave a half-applied map (every
    /// write is a single insert, remove or swap), so a poisoned lock is still consistent.
    pub fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Arc<V>>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, key: &str) -> Option<Arc<V>> {
        self.read().get(key).cloned()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Number of writes so far. Read under [`Store::read`] it names exactly the content seen.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Time since the API server last sent this cache anything.
    pub fn age(&self) -> Option<Duration> {
        self.last_heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|t| t.elapsed())
    }

    fn heard(&self) {
        *self
            .last_heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<V>>> {
        let guard = self.map.write().unwrap_or_else(PoisonError::into_inner);
        // Bumped while holding the lock: a reader comparing versions either sees the bump or
        // reads the map before this write.
        self.version.fetch_add(1, Ordering::AcqRel);
        guard
    }

    /// Replaces the whole content (end of a list) and marks the cache synced.
    pub fn replace(&self, items: HashMap<String, Arc<V>>) {
        *self.write() = items;
        self.synced.store(true, Ordering::Release);
    }

    /// Sets or removes one key; returns the value it replaced.
    pub fn set(&self, key: String, value: Option<V>) -> Option<Arc<V>> {
        match value {
            Some(v) => self.write().insert(key, Arc::new(v)),
            None => self.write().remove(&key),
        }
    }
}

/// A watch event reduced to what a [`Store`] needs: the object's key and its converted
/// value (`None` when the object is deleted or not of interest).
#[derive(Debug)]
pub enum Change<V> {
    /// A (re)list starts.
    Restart,
    /// An object seen while listing.
    Listed(String, Option<V>),
    /// The list is complete.
    ListDone,
    /// An object changed after the list.
    Changed(String, Option<V>),
}

/// What one [`Change`] did to a store, for indexes derived from it.
#[derive(Debug)]
pub enum Applied<V> {
    /// Buffered (a list in progress); readers see nothing new yet.
    Staged,
    /// A complete list replaced the whole content.
    Replaced,
    /// One key changed: its value before and after (`None`: absent).
    Changed {
        old: Option<Arc<V>>,
        new: Option<Arc<V>>,
    },
}

/// Applies changes to a store, buffering a list so readers never see half of one.
#[derive(Debug)]
pub struct Applier<V> {
    staging: Option<HashMap<String, Arc<V>>>,
}

impl<V> Default for Applier<V> {
    fn default() -> Self {
        Applier { staging: None }
    }
}

impl<V> Applier<V> {
    pub fn apply(&mut self, store: &Store<V>, change: Change<V>) -> Applied<V> {
        let applied = match change {
            Change::Restart => {
                self.staging = Some(HashMap::new());
                Applied::Staged
            }
            Change::Listed(key, value) => {
                let staging = self.staging.get_or_insert_with(HashMap::new);
                match value {
                    Some(v) => {
                        staging.insert(key, Arc::new(v));
                    }
                    None => {
                        staging.remove(&key);
                    }
                }
                Applied::Staged
            }
            Change::ListDone => {
                store.replace(self.staging.take().unwrap_or_default());
                Applied::Replaced
            }
            Change::Changed(key, value) => {
                let new = value.map(Arc::new);
                let old = match &new {
                    Some(v) => store.write().insert(key, v.clone()),
                    None => store.write().remove(&key),
                };
                Applied::Changed { old, new }
            }
        };
        store.heard();
        applied
    }
}

/// A pod bound to a node that matters for gang locality.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub namespace: String,
    pub node: String,
    pub job: (String, String),
}

/// A bound, not finished GPU pod of a job; `None` for every other pod.
pub fn bound_pod(pod: &Pod, config: &ExtenderConfig) -> Option<BoundPod> {
    let node = pod
        .spec
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let facts = PodFacts::from_pod(pod, &config.job_label_keys);
    if !facts.requests_any(&config.gpu_resources) {
        return None;
    }
    Some(BoundPod {
        namespace: facts.namespace,
        node,
        job: facts.job?,
    })
}

/// `(namespace, job label key, job name)`.
type JobKey = (String, String, String);

/// Where each job's bound GPU pods run: job → node → number of its pods there. Kept in step
/// with the pods cache on every change, so gang scoring reads one job's nodes instead of
/// scanning every bound pod in the cluster on each `/prioritize`.
#[derive(Debug, Default)]
pub struct JobPlacements {
    jobs: RwLock<HashMap<JobKey, BTreeMap<String, u32>>>,
}

impl JobPlacements {
    fn key(namespace: &str, job: &(String, String)) -> JobKey {
        (namespace.to_string(), job.0.clone(), job.1.clone())
    }

    /// Rebuilds from the whole pods cache (after a list).
    pub fn rebuild(&self, pods: &HashMap<String, Arc<BoundPod>>) {
        let mut jobs: HashMap<JobKey, BTreeMap<String, u32>> = HashMap::new();
        for p in pods.values() {
            *jobs
                .entry(Self::key(&p.namespace, &p.job))
                .or_default()
                .entry(p.node.clone())
                .or_default() += 1;
        }
        *self.jobs.write().unwrap_or_else(PoisonError::into_inner) = jobs;
    }

    /// Moves one pod from `old` to `new` (either may be absent).
    pub fn update(&self, old: Option<&BoundPod>, new: Option<&BoundPod>) {
        if old == new {
            return;
        }
        let mut jobs = self.jobs.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(o) = old {
            let key = Self::key(&o.namespace, &o.job);
            if let Some(nodes) = jobs.get_mut(&key) {
                if let Some(n) = nodes.get_mut(&o.node) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        nodes.remove(&o.node);
                    }
                }
                if nodes.is_empty() {
                    jobs.remove(&key);
                }
            }
        }
        if let Some(n) = new {
            *jobs
                .entry(Self::key(&n.namespace, &n.job))
                .or_default()
                .entry(n.node.clone())
                .or_default() += 1;
        }
    }

    /// The distinct nodes running pods of `job` in `namespace`, sorted.
    pub fn nodes(&self, namespace: &str, job: &(String, String)) -> Vec<String> {
        self.jobs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&Self::key(namespace, job))
            .map(|nodes| nodes.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// The valid FabricProfiles, as handlers and the node cache read them.
#[derive(Debug, Default)]
pub struct ProfileSet {
    /// Bumped on every profile change; node prechecks carry the generation they were made for.
    pub generation: u64,
    /// Sorted by name.
    pub profiles: Vec<FabricProfile>,
    /// Each profile's own rail-layout signature (what the webhook writes on pods), same order.
    pub signatures: Vec<String>,
}

impl ProfileSet {
    pub fn new(generation: u64, mut profiles: Vec<FabricProfile>) -> Self {
        profiles.sort_by(|a, b| a.name().cmp(b.name()));
        let signatures = profiles.iter().map(|p| p.spec.signature()).collect();
        ProfileSet {
            generation,
            profiles,
            signatures,
        }
    }

    /// Position of `profile` when `signature` is its own; prechecks exist only for those.
    pub fn index_of(&self, profile: &str, signature: &str) -> Option<usize> {
        self.profiles
            .iter()
            .zip(&self.signatures)
            .position(|(p, s)| p.name() == profile && s == signature)
    }
}

/// A cached Node: its fabric state and its verdict for every profile, computed when the node
/// or the profiles change so that a filter call only compares expiry times.
#[derive(Clone, Debug)]
pub struct CachedNode {
    pub fabric: Arc<NodeFabric>,
    /// Generation of the [`ProfileSet`] `prechecks` were made for.
    pub generation: u64,
    /// One per profile of that set, in its order, each for the profile's own signature.
    pub prechecks: Vec<Precheck>,
}

impl CachedNode {
    pub fn new(fabric: Arc<NodeFabric>, profiles: &ProfileSet) -> Self {
        let prechecks = profiles
            .profiles
            .iter()
            .zip(&profiles.signatures)
            .map(|(p, s)| precheck(&fabric, p, s))
            .collect();
        CachedNode {
            fabric,
            generation: profiles.generation,
            prechecks,
        }
    }

    /// The precheck for profile `index` of `profiles`, unless it was made for another set.
    pub fn precheck(&self, profiles: &ProfileSet, index: usize) -> Option<&Precheck> {
        if self.generation == profiles.generation {
            self.prechecks.get(index)
        } else {
            None
        }
    }
}

/// The node cache laid out for the filter path. A `/filter` call looks up thousands of names;
/// through the node map each lookup compares its key behind a heap pointer and then follows
/// `Arc<CachedNode>` and its precheck vector into a heap full of certificates, a cache miss
/// at every step. Here the names sit in one arena, the hash table holds slot numbers, and
/// each profile's prechecks are one contiguous array, so a lookup stays in a few hundred
/// kilobytes that the CPU caches hold.
///
/// Rebuilt whole after a node or profile change (cheap next to the watch event that caused
/// it). Handlers use it only while [`NodeIndex::is_current`] says it reflects the node cache
/// and the profile set they decide with; otherwise they read the node cache (same answers).
#[derive(Debug, Default)]
pub struct NodeIndex {
    /// [`Store::version`] of the node cache this index was built from.
    nodes_version: u64,
    /// [`ProfileSet::generation`] of the prechecks.
    generation: u64,
    /// Every node name, back to back.
    names: String,
    /// Slot `i`'s name is `names[ends[i - 1]..ends[i]]` (from 0 for slot 0).
    ends: Vec<u32>,
    /// Slot numbers, hashed by name.
    table: HashTable<u32>,
    /// foldhash instead of SipHash: node names come from the API server (the node watch) and
    /// from kube-scheduler (requests), both trusted, so flooding resistance buys nothing and
    /// SipHash would cost more than the rest of a lookup.
    hasher: DefaultHashBuilder,
    fabrics: Vec<Arc<NodeFabric>>,
    /// `prechecks[profile * len + slot]`; `None` where the node's prechecks were made for an
    /// older profile set (decisions then check its certificate instead).
    prechecks: Vec<Option<Precheck>>,
}

impl NodeIndex {
    /// Indexes `nodes` (the node cache at `nodes_version`) for the profiles of `set`.
    pub fn build(
        nodes: &HashMap<String, Arc<CachedNode>>,
        nodes_version: u64,
        set: &ProfileSet,
    ) -> Self {
        let len = nodes.len();
        let mut index = NodeIndex {
            nodes_version,
            generation: set.generation,
            names: String::with_capacity(nodes.keys().map(String::len).sum()),
            ends: Vec::with_capacity(len),
            table: HashTable::with_capacity(len),
            hasher: DefaultHashBuilder::default(),
            fabrics: Vec::with_capacity(len),
            prechecks: Vec::with_capacity(len * set.profiles.len()),
        };
        // Sorted, so slots (and the arena) follow name order whatever the map's order.
        let mut entries: Vec<(&String, &Arc<CachedNode>)> = nodes.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (name, cached) in &entries {
            let Ok(end) = u32::try_from(index.names.len() + name.len()) else {
                // Over 4 GiB of names: leave the rest to the node cache path.
                break;
            };
            let slot = index.ends.len() as u32;
            index.names.push_str(name);
            index.ends.push(end);
            index.fabrics.push(cached.fabric.clone());
            let hash = index.hasher.hash_one(name.as_str());
            let (names, ends, hasher) = (&index.names, &index.ends, &index.hasher);
            index.table.insert_unique(hash, slot, |&s| {
                hasher.hash_one(name_at(names, ends, s as usize))
            });
        }
        let indexed = index.ends.len();
        for p in 0..set.profiles.len() {
            index.prechecks.extend(
                entries[..indexed]
                    .iter()
                    .map(|(_, cached)| cached.precheck(set, p).cloned()),
            );
        }
        index
    }

    /// Whether this index reflects the node cache at `nodes_version` and the profile set of
    /// `generation`.
    pub fn is_current(&self, nodes_version: u64, generation: u64) -> bool {
        self.nodes_version == nodes_version && self.generation == generation
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The slot of the node called `name`.
    pub fn lookup(&self, name: &str) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |&s| {
                name_at(&self.names, &self.ends, s as usize) == name
            })
            .map(|&s| s as usize)
    }

    /// The decision input for `name`: its fabric and, when `profile` (a position in the
    /// profile set this index was built for) is given, its precheck for that profile.
    pub fn slot<'a>(&'a self, name: &'a str, profile: Option<usize>) -> NodeSlot<'a> {
        match self.lookup(name) {
            Some(slot) => NodeSlot {
                name,
                fabric: self.fabrics.get(slot).map(|f| &**f),
                precheck: profile
                    .and_then(|p| self.prechecks.get(p * self.len() + slot))
                    .and_then(Option::as_ref),
            },
            None => NodeSlot::new(name, None),
        }
    }
}

fn name_at<'a>(names: &'a str, ends: &[u32], slot: usize) -> &'a str {
    let start = match slot {
        0 => 0,
        _ => ends.get(slot - 1).map_or(0, |&e| e as usize),
    };
    let end = ends.get(slot).map_or(start, |&e| e as usize);
    names.get(start..end).unwrap_or_default()
}

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

    /// Runs the four watches until the returned future is dropped.
    pub async fn run(self: Arc<Self>, client: Client, metrics: Arc<Metrics>) {
        let nodes = watch(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            &self.nodes,
            &metrics,
            |n: &Node| {
                let fabric = NodeFabric::from_node(n, Timestamp::now());
                Some(CachedNode::new(Arc::new(fabric), &self.profile_set()))
            },
            |_| self.refresh_prechecks(),
        );
        let config = self.config.clone();
        let pods = watch(
            Api::<Pod>::all(client.clone()),
            // Only bound pods matter for locality.
            watcher::Config::default().fields("spec.nodeName!="),
            &self.pods,
            &metrics,
            move |p: &Pod| bound_pod(p, &config),
            |applied| match applied {
                Applied::Staged => {}
                Applied::Replaced => self.jobs.rebuild(&self.pods.read()),
                Applied::Changed { old, new } => self.jobs.update(old.as_deref(), new.as_deref()),
            },
        );
        let namespaces = watch(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
            &self.namespaces,
            &metrics,
            |ns: &Namespace| Some(ns.labels().clone()),
            |_| {},
        );
        let profiles = watch(
            Api::<FabricProfile>::all(client),
            watcher::Config::default(),
            &self.profiles,
            &metrics,
            |p: &FabricProfile| match p.validate() {
                Ok(()) => Some(p.clone()),
                Err(e) => {
                    tracing::warn!(profile = p.name(), error = %e, "ignoring invalid FabricProfile");
                    None
                }
            },
            |_| self.rebuild_profile_list(),
        );
        tokio::join!(nodes, pods, namespaces, profiles);
    }
}

fn key_of<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.clone().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    }
}

async fn watch<K, V>(
    api: Api<K>,
    config: watcher::Config,
    store: &Store<V>,
    metrics: &Metrics,
    convert: impl Fn(&K) -> Option<V>,
    on_change: impl Fn(&Applied<V>),
) where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    let mut applier = Applier::default();
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(Event::Init) => Change::Restart,
            Ok(Event::InitApply(obj)) => Change::Listed(key_of(&obj), convert(&obj)),
            Ok(Event::InitDone) => {
                tracing::info!(cache = store.name, "cache listed");
                Change::ListDone
            }
            Ok(Event::Apply(obj)) => Change::Changed(key_of(&obj), convert(&obj)),
            Ok(Event::Delete(obj)) => Change::Changed(key_of(&obj), None),
            Err(e) => {
                metrics
                    .watch_errors
                    .get_or_create(&CacheLabels { cache: store.name })
                    .inc();
                tracing::warn!(cache = store.name, error = %e, "watch failed; retrying");
                continue;
            }
        };
        let applied = applier.apply(store, change);
        if !matches!(applied, Applied::Staged) {
            on_change(&applied);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_is_applied_atomically_and_marks_synced() {
        let store: Store<u32> = Store::new("t");
        store.set("old".into(), Some(1));
        let mut a = Applier::default();
        a.apply(&store, Change::Restart);
        a.apply(&store, Change::Listed("x".into(), Some(7)));
        // Readers still see the previous content until the list is complete.
        assert!(store.get("x").is_none());
        assert!(!store.is_synced());
        a.apply(&store, Change::Listed("skip".into(), None));
        a.apply(&store, Change::ListDone);
        assert!(store.is_synced());
        assert_eq!(store.get("x").as_deref(), Some(&7));
        assert!(store.get("old").is_none(), "objects not relisted are gone");
        a.apply(&store, Change::Changed("x".into(), None));
        assert!(store.is_empty());
        assert!(store.age().is_some());
    }

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

    #[test]
    fn bound_pod_keeps_only_running_gpu_job_pods() {
        let cfg = ExtenderConfig::default();
        let mk = |node: Option<&str>, phase: &str, gpu: bool, job: bool| -> Pod {
            let mut labels = serde_json::Map::new();
            if job {
                labels.insert("training.kubeflow.org/job-name".into(), "llm".into());
            }
            let limits = if gpu {
                serde_json::json!({"nvidia.com/gpu": "8"})
            } else {
                serde_json::json!({"cpu": "1"})
            };
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ml", "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        assert_eq!(
            bound_pod(&mk(Some("n1"), "Running", true, true), &cfg),
            Some(BoundPod {
                namespace: "ml".into(),
                node: "n1".into(),
                job: ("training.kubeflow.org/job-name".into(), "llm".into())
            })
        );
        assert_eq!(bound_pod(&mk(None, "Pending", true, true), &cfg), None);
        assert_eq!(
            bound_pod(&mk(Some("n1"), "Succeeded", true, true), &cfg),
            None
        );
        assert_eq!(
            bound_pod(&mk(Some("n1"), "Running", false, true), &cfg),
            None
        );
        assert_eq!(
            bound_pod(&mk(Some("n1"), "Running", true, false), &cfg),
            None
        );
    }
}
