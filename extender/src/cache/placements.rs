//! Bound GPU pods reduced to what gang locality needs, and where each job's pods run.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::core::v1::Pod;

use crate::decision::ExtenderConfig;
use crate::pod::PodFacts;

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
    if railguard_api::pod::is_finished(pod) {
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

    /// Calls `visit` with each distinct node running pods of `job` in `namespace`, in name
    /// order, without copying the names.
    pub fn each_node(&self, namespace: &str, job: &(String, String), mut visit: impl FnMut(&str)) {
        let jobs = self.jobs.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(nodes) = jobs.get(&Self::key(namespace, job)) {
            nodes.keys().for_each(|n| visit(n));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cache::store::{Applied, Applier, Change, Store};

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
