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
