//! Recent admission decisions. The pods of one job or ReplicaSet come from one template, so at
//! admission they are the same Pod but for `managedFields` (whose timestamps change every
//! second); [`DecisionCache`] decides such a pod once and answers the rest of the job with the
//! same patch, warnings and denial.
//!
//! A hit is exact, never approximate: the entry's Pod (without `managedFields`), namespace,
//! profile snapshot and configuration must all equal the request's. [`mutate()`] is a pure
//! function of exactly those (it reads `managedFields` only for whether metadata is empty,
//! which the key keeps), so a hit returns what deciding again would return. This module's
//! tests and the webhook fuzz target hold answers through the cache equal to answers without
//! it.
//!
//! [`mutate()`]: crate::mutate()

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;

use crate::config::ProfileSet;
use crate::config::{NamespaceInfo, WebhookConfig};
use crate::mutate::{Plan, WarningKind};
use crate::patch::{write_patch, EncodedPatch};

/// How much the cache may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most decisions held; 0 turns the cache off.
    pub max_entries: usize,
    /// Most bytes held, counted as the pods' JSON plus their patches.
    pub max_bytes: usize,
    /// Pods larger than this (JSON bytes) are decided every time, not held.
    pub max_pod_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            max_entries: 256,
            max_bytes: 16 << 20,
            max_pod_bytes: 256 << 10,
        }
    }
}

impl CacheLimits {
    /// No cache: every pod is decided.
    pub const OFF: CacheLimits = CacheLimits {
        max_entries: 0,
        max_bytes: 0,
        max_pod_bytes: 0,
    };
}

/// Recent decisions, keyed by everything [`mutate()`](crate::mutate()) reads.
pub struct DecisionCache {
    limits: CacheLimits,
    held: Mutex<Held>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The entries, valid for one profile snapshot and one configuration.
#[derive(Default)]
struct Held {
    profiles: Option<ProfileSet>,
    config: Option<WebhookConfig>,
    entries: HashMap<u64, Arc<Entry>>,
    /// Insertion order, oldest first (each key once).
    order: VecDeque<u64>,
    bytes: usize,
}

struct Entry {
    /// The pod as decided, without `managedFields`.
    pod: Pod,
    /// `managedFields`: absent, empty or not (all `mutate()` can tell apart).
    managed_fields: Option<bool>,
    namespace: NamespaceInfo,
    decision: Arc<Decision>,
    bytes: usize,
}

impl Entry {
    fn matches(&self, pod: &Pod, managed_fields: Option<bool>, namespace: &NamespaceInfo) -> bool {
        self.managed_fields == managed_fields && self.namespace == *namespace && self.pod == *pod
    }
}

/// Whether a decision came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit,
    Miss,
}

impl Lookup {
    pub fn as_str(self) -> &'static str {
        match self {
            Lookup::Hit => "hit",
            Lookup::Miss => "miss",
        }
    }
}

impl DecisionCache {
    pub fn new(limits: CacheLimits) -> Self {
        Self {
            limits,
            held: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The decision for `pod` (whose JSON is `pod_bytes` long): the held one when an equal pod
    /// was decided under the same namespace, profiles and configuration, else `decide(&pod)`'s,
    /// which is then held (errors are not).
    pub fn decide<E>(
        &self,
        mut pod: Pod,
        pod_bytes: usize,
        namespace: &NamespaceInfo,
        profiles: &ProfileSet,
        config: &WebhookConfig,
        decide: impl FnOnce(&Pod) -> Result<Decision, E>,
    ) -> Result<(Arc<Decision>, Lookup), E> {
        if self.limits.max_entries == 0 || pod_bytes > self.limits.max_pod_bytes {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return Ok((Arc::new(decide(&pod)?), Lookup::Miss));
        }
        let managed = pod.metadata.managed_fields.take();
        let managed_shape = managed.as_ref().map(Vec::is_empty);
        let key = shape_hash(&pod, namespace);
        let candidate = self.lock_for(profiles, config).entries.get(&key).cloned();
        // Compared outside the lock: a deep comparison of two pods is the longest step here.
        if let Some(entry) = candidate.filter(|e| e.matches(&pod, managed_shape, namespace)) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok((entry.decision.clone(), Lookup::Hit));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        pod.metadata.managed_fields = managed;
        let decision = Arc::new(decide(&pod)?);
        pod.metadata.managed_fields = None;
        let bytes = pod_bytes + decision.patch.as_ref().map_or(0, |p| p.len());
        let entry = Arc::new(Entry {
            pod,
            managed_fields: managed_shape,
            namespace: namespace.clone(),
            decision: decision.clone(),
            bytes,
        });
        self.insert(key, entry, profiles, config);
        Ok((decision, Lookup::Miss))
    }

    /// Decisions answered from the cache, and decided, since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Decisions held now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // The held state is consistent between statements; a panic elsewhere leaves it usable.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The held entries, emptied first when the profiles or the configuration changed.
    fn lock_for(
        &self,
        profiles: &ProfileSet,
        config: &WebhookConfig,
    ) -> std::sync::MutexGuard<'_, Held> {
        let mut held = self.lock();
        let same = held
            .profiles
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, profiles))
            && held.config.as_ref() == Some(config);
        if !same {
            *held = Held {
                profiles: Some(profiles.clone()),
                config: Some(config.clone()),
                ..Held::default()
            };
        }
        held
    }

    fn insert(&self, key: u64, entry: Arc<Entry>, profiles: &ProfileSet, config: &WebhookConfig) {
        if entry.bytes > self.limits.max_bytes {
            return;
        }
        let mut held = self.lock_for(profiles, config);
        let added = entry.bytes;
        match held.entries.insert(key, entry) {
            Some(old) => held.bytes -= old.bytes,
            None => held.order.push_back(key),
        }
        held.bytes += added;
        while held.entries.len() > self.limits.max_entries || held.bytes > self.limits.max_bytes {
            let Some(oldest) = held.order.pop_front() else {
                break;
            };
            if let Some(old) = held.entries.remove(&oldest) {
                held.bytes -= old.bytes;
            }
        }
    }
}

/// A hash of the parts of a pod that tell one job's pods from another's; equality of the
/// whole pod is checked on a hit, so this only has to be cheap and spread entries.
fn shape_hash(pod: &Pod, namespace: &NamespaceInfo) -> u64 {
    let mut h = DefaultHasher::new();
    namespace.name.hash(&mut h);
    let meta = &pod.metadata;
    meta.name.hash(&mut h);
    meta.generate_name.hash(&mut h);
    meta.labels.hash(&mut h);
    meta.annotations.hash(&mut h);
    if let Some(spec) = &pod.spec {
        spec.hostname.hash(&mut h);
        for c in &spec.containers {
            c.name.hash(&mut h);
            c.image.hash(&mut h);
            for e in c.env.iter().flatten() {
                e.name.hash(&mut h);
                e.value.hash(&mut h);
            }
        }
    }
    h.finish()
}

/// Room for a full mutation's patch (an 8-GPU pod's is about 3 KiB), so writing it does not
/// grow the buffer.
const PATCH_CAPACITY: usize = 4096;

/// What [`mutate()`] decided for one pod, as the answer carries it: the part of an
/// [`Admission`](crate::review::Admission) that does not depend on the request's uid, so [`DecisionCache`] can hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// A [`Outcome`] name.
    ///
    /// [`Outcome`]: crate::Outcome
    pub outcome: &'static str,
    pub profile: Option<String>,
    pub patch: Option<Arc<EncodedPatch>>,
    pub warnings: Vec<String>,
    pub warning_kinds: Vec<WarningKind>,
    /// Set when the pod is denied.
    pub denial: Option<String>,
}

impl Decision {
    pub fn from_plan(mut plan: Plan) -> Self {
        let warning_kinds = plan.warnings.iter().map(|w| w.kind).collect();
        let warnings = plan.warnings.drain(..).map(|w| w.message).collect();
        let patch = (plan.deny.is_none() && !plan.ops.is_empty()).then(|| {
            let mut patch = String::with_capacity(PATCH_CAPACITY);
            write_patch(&plan.ops, &mut patch);
            Arc::new(EncodedPatch::new(patch.into_bytes()))
        });
        Self {
            outcome: plan.outcome.as_str(),
            profile: plan.profile,
            patch,
            warnings,
            warning_kinds,
            denial: plan.deny,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::Cell;

    use serde_json::{json, Value};

    use super::*;
    use crate::error::MutateError;
    use crate::mutate;

    const H100: &str = include_str!("../../api/fixtures/profiles/dgx-h100-ndr.yaml");
    const ROCE: &str = include_str!("../../api/fixtures/profiles/roce-cloud.yaml");

    fn profile_set() -> ProfileSet {
        Arc::new(
            [H100, ROCE]
                .iter()
                .flat_map(|y| railguard_api::profiles_from_yaml(y).unwrap())
                .collect(),
        )
    }

    /// A job's worker as kube-apiserver hands it to admission: a generated name still empty,
    /// managedFields stamped with the second it arrived.
    fn worker(second: u32) -> Value {
        json!({
            "metadata": {
                "generateName": "llama-worker-",
                "namespace": "ml",
                "labels": {"job-name": "llama"},
                "managedFields": [{
                    "manager": "kube-controller-manager", "operation": "Update",
                    "apiVersion": "v1", "time": format!("2026-12-02T06:00:{second:02}Z"),
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}
                }]
            },
            "spec": {"containers": [{
                "name": "pytorch", "image": "pytorch:2",
                "env": [{"name": "MASTER_ADDR", "value": "llama-master-0"}],
                "resources": {"limits": {"nvidia.com/gpu": "8"}}
            }]}
        })
    }

    fn pod(v: &Value) -> Pod {
        serde_json::from_value(v.clone()).unwrap()
    }

    /// What deciding `pod` afresh gives.
    fn fresh(pod: &Pod, ns: &NamespaceInfo, set: &ProfileSet, cfg: &WebhookConfig) -> Decision {
        Decision::from_plan(mutate(pod, ns, set, cfg).unwrap())
    }

    /// A cache with the fixture profiles, the default configuration and namespace `ml`,
    /// counting the calls to `mutate()` it makes.
    struct Fixture {
        cache: DecisionCache,
        set: ProfileSet,
        cfg: WebhookConfig,
        ns: NamespaceInfo,
        calls: Cell<usize>,
    }

    impl Fixture {
        fn new(limits: CacheLimits) -> Self {
            Self {
                cache: DecisionCache::new(limits),
                set: profile_set(),
                cfg: WebhookConfig::default(),
                ns: NamespaceInfo::new("ml"),
                calls: Cell::new(0),
            }
        }

        fn through(&self, v: &Value) -> (Arc<Decision>, Lookup) {
            self.through_with(v, &self.ns, &self.set, &self.cfg)
        }

        /// Decides `v` through the cache under these inputs.
        fn through_with(
            &self,
            v: &Value,
            ns: &NamespaceInfo,
            set: &ProfileSet,
            cfg: &WebhookConfig,
        ) -> (Arc<Decision>, Lookup) {
            let bytes = v.to_string().len();
            self.cache
                .decide(pod(v), bytes, ns, set, cfg, |p| {
                    self.calls.set(self.calls.get() + 1);
                    mutate(p, ns, set, cfg).map(Decision::from_plan)
                })
                .unwrap()
        }

        fn fresh(&self, v: &Value) -> Decision {
            fresh(&pod(v), &self.ns, &self.set, &self.cfg)
        }
    }

    #[test]
    fn a_jobs_pods_are_decided_once_and_answered_as_if_decided_each() {
        let f = Fixture::new(CacheLimits::default());
        for second in 0..20 {
            let v = worker(second);
            let (decision, lookup) = f.through(&v);
            let expected = if second == 0 {
                Lookup::Miss
            } else {
                Lookup::Hit
            };
            assert_eq!(lookup, expected);
            assert_eq!(*decision, f.fresh(&v));
        }
        assert_eq!(f.calls.get(), 1);
        assert_eq!(f.cache.counts(), (19, 1));
        let decision = f.through(&worker(3)).0;
        assert!(
            decision.patch.is_some(),
            "the worker is configured: {decision:?}"
        );
    }

    #[test]
    fn anything_the_decision_reads_that_differs_is_decided_again() {
        let f = Fixture::new(CacheLimits::default());
        let base = worker(0);
        f.through(&base);
        let edits: [fn(&mut Value); 11] = [
            |v| v["spec"]["containers"][0]["env"][0]["value"] = json!("llama-master-1"),
            |v| v["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("4"),
            |v| v["spec"]["containers"][0]["image"] = json!("pytorch:3"),
            |v| v["spec"]["hostname"] = json!("llama-3"),
            |v| v["spec"]["volumes"] = json!([{"name": "dshm", "emptyDir": {"medium": "Memory"}}]),
            |v| v["spec"]["securityContext"] = json!({"runAsUser": 1000}),
            |v| v["metadata"]["annotations"] = json!({"railguard.io/skip": "shm"}),
            |v| v["metadata"]["annotations"] = json!({"railguard.io/profile": "roce-cloud"}),
            |v| v["metadata"]["labels"]["team"] = json!("b"),
            |v| v["metadata"]["name"] = json!("llama-worker-0"),
            |v| v["metadata"]["namespace"] = json!("ml2"),
        ];
        for (i, edit) in edits.iter().enumerate() {
            let mut v = base.clone();
            edit(&mut v);
            let before = f.calls.get();
            let (decision, lookup) = f.through(&v);
            assert_eq!(
                (lookup, f.calls.get()),
                (Lookup::Miss, before + 1),
                "edit {i}"
            );
            assert_eq!(*decision, f.fresh(&v), "edit {i}");
        }
        // The namespace's labels, the profile snapshot and the configuration are inputs too.
        let labelled = NamespaceInfo::new("ml").with_label("railguard.io/exemptions", "allowed");
        let other_set = profile_set();
        let other_cfg = WebhookConfig {
            gpu_resources: vec!["amd.com/gpu".into()],
            ..WebhookConfig::default()
        };
        for (ns, set, cfg) in [
            (&labelled, &f.set, &f.cfg),
            (&f.ns, &other_set, &f.cfg),
            (&f.ns, &other_set, &other_cfg),
        ] {
            let before = f.calls.get();
            let (decision, lookup) = f.through_with(&base, ns, set, cfg);
            assert_eq!((lookup, f.calls.get()), (Lookup::Miss, before + 1));
            assert_eq!(*decision, fresh(&pod(&base), ns, set, cfg));
        }
    }

    #[test]
    fn managed_fields_alone_in_metadata_are_not_an_empty_metadata() {
        // mutate() adds /metadata to a pod without metadata, but /metadata/annotations to one
        // whose metadata holds only managedFields: the key keeps that apart.
        let f = Fixture::new(CacheLimits::default());
        let mut managed_only = worker(0);
        managed_only["metadata"] =
            json!({"managedFields": managed_only["metadata"]["managedFields"]});
        let mut bare = worker(0);
        bare["metadata"] = json!({});
        let mut emptied = worker(0);
        emptied["metadata"] = json!({"managedFields": []});
        for v in [&managed_only, &bare, &emptied] {
            let (decision, lookup) = f.through(v);
            assert_eq!(lookup, Lookup::Miss, "{v}");
            assert_eq!(*decision, f.fresh(v));
        }
        assert_ne!(f.fresh(&managed_only), f.fresh(&bare));
    }

    #[test]
    fn limits_bound_what_is_held() {
        let job = |i: usize| {
            let mut v = worker(0);
            v["metadata"]["labels"]["job-name"] = json!(format!("job-{i}"));
            v
        };
        let two = Fixture::new(CacheLimits {
            max_entries: 2,
            ..CacheLimits::default()
        });
        for i in 0..3 {
            two.through(&job(i));
        }
        assert_eq!(two.cache.len(), 2);
        assert_eq!(two.through(&job(2)).1, Lookup::Hit);
        assert_eq!(two.through(&job(0)).1, Lookup::Miss, "oldest evicted");

        let small = Fixture::new(CacheLimits {
            max_pod_bytes: 100,
            ..CacheLimits::default()
        });
        small.through(&job(0));
        assert!(
            small.cache.is_empty(),
            "a pod over max_pod_bytes is not held"
        );

        let few_bytes = Fixture::new(CacheLimits {
            max_bytes: 6000,
            ..CacheLimits::default()
        });
        for i in 0..10 {
            few_bytes.through(&job(i));
            assert!(few_bytes.cache.lock().bytes <= 6000);
        }
        assert!((1..10).contains(&few_bytes.cache.len()));

        let off = Fixture::new(CacheLimits::OFF);
        for _ in 0..3 {
            assert_eq!(off.through(&job(0)).1, Lookup::Miss);
        }
        assert_eq!((off.calls.get(), off.cache.len()), (3, 0));
    }

    #[test]
    fn errors_are_not_held() {
        let f = Fixture::new(CacheLimits::default());
        let failing = |_: &Pod| Err::<Decision, _>(MutateError::NoSpec);
        let held = f
            .cache
            .decide(pod(&worker(0)), 10, &f.ns, &f.set, &f.cfg, failing);
        assert!(held.is_err());
        assert!(f.cache.is_empty());
        assert_eq!(f.through(&worker(0)).1, Lookup::Miss);
    }
}
