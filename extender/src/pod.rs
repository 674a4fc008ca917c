//! What the extender needs to know about a pod, read once per request.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use railguard_api::keys;
use railguard_api::pod::is_zero_quantity;

/// The facts of a pod that drive filtering and scoring.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    /// `railguard.io/profile` annotation (written by the webhook or the user).
    pub profile: Option<String>,
    /// `railguard.io/signature` annotation (written by the webhook).
    pub signature: Option<String>,
    /// `railguard.io/allow-uncertified: "true"`.
    pub allow_uncertified: bool,
    /// Extended resources (names with a `/`) requested by any container with a non-zero
    /// quantity (the zero rule of [`railguard_api::pod`], shared with the webhook and prober).
    pub extended_resources: BTreeSet<String>,
    /// The pod's job, `(label key, value)`: the first configured job label key it carries.
    pub job: Option<(String, String)>,
}

impl PodFacts {
    /// Reads a pod. `job_label_keys` are tried in order.
    pub fn from_pod(pod: &Pod, job_label_keys: &[String]) -> PodFacts {
        let meta = &pod.metadata;
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
        let labels = meta.labels.as_ref();
        let job = labels.and_then(|l| {
            job_label_keys
                .iter()
                .find_map(|k| l.get(k).map(|v| (k.clone(), v.clone())))
        });
        let mut extended_resources = BTreeSet::new();
        if let Some(spec) = &pod.spec {
            let containers = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten());
            for c in containers {
                collect_extended(c, &mut extended_resources);
            }
        }
        PodFacts {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            profile: annotation(keys::ANNOTATION_PROFILE).filter(|p| !p.is_empty()),
            signature: annotation(keys::ANNOTATION_SIGNATURE).filter(|s| !s.is_empty()),
            allow_uncertified: annotation(keys::ANNOTATION_ALLOW_UNCERTIFIED).as_deref()
                == Some("true"),
            extended_resources,
            job,
        }
    }

    /// Whether the pod requests any of the given resources.
    pub fn requests_any(&self, resources: &[String]) -> bool {
        resources
            .iter()
            .any(|r| self.extended_resources.contains(r))
    }
}

fn collect_extended(c: &Container, out: &mut BTreeSet<String>) {
    let Some(res) = &c.resources else { return };
    // Extended resources must have requests == limits; a limit alone implies the request.
    for map in [&res.requests, &res.limits].into_iter().flatten() {
        collect_from(map, out);
    }
}

fn collect_from(
    map: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    out: &mut BTreeSet<String>,
) {
    for (name, q) in map {
        if name.contains('/') && !is_zero_quantity(&q.0) {
            out.insert(name.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn reads_annotations_resources_and_job() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "w-0", "namespace": "ml",
                "labels": {"jobset.sigs.k8s.io/jobset-name": "llama", "batch.kubernetes.io/job-name": "llama-w"},
                "annotations": {"railguard.io/profile": "h100-ndr", "railguard.io/signature": "abc",
                                "railguard.io/allow-uncertified": "true"}},
            "spec": {"containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1", "cpu": "4"}}},
                {"name": "side", "resources": {"requests": {"example.com/zero": "0"}}}
            ]}
        }));
        let keys: Vec<String> = railguard_api::keys::DEFAULT_JOB_LABEL_KEYS
            .iter()
            .map(|s| s.to_string())
            .collect();
        let f = PodFacts::from_pod(&p, &keys);
        assert_eq!(f.profile.as_deref(), Some("h100-ndr"));
        assert_eq!(f.signature.as_deref(), Some("abc"));
        assert!(f.allow_uncertified);
        assert_eq!(
            f.extended_resources.iter().collect::<Vec<_>>(),
            ["nvidia.com/gpu", "rdma/rdma_shared_device_a"]
        );
        // jobset key comes before the batch key in the configured order.
        assert_eq!(
            f.job,
            Some(("jobset.sigs.k8s.io/jobset-name".into(), "llama".into()))
        );
        assert_eq!((f.namespace.as_str(), f.name.as_str()), ("ml", "w-0"));
    }

    #[test]
    fn allow_uncertified_needs_exactly_true() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "annotations": {"railguard.io/allow-uncertified": "yes"}},
            "spec": {"containers": [{"name": "c"}]}
        }));
        assert!(!PodFacts::from_pod(&p, &[]).allow_uncertified);
    }

    /// A GPU pod for the extender is a GPU pod for the webhook and the prober, whatever the
    /// spelling of the quantity.
    #[test]
    fn gpu_pods_are_the_ones_the_shared_predicate_names() {
        let gpu = railguard_api::keys::DEFAULT_GPU_RESOURCES
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>();
        for q in [
            "8", "1", "0", "0.0", "+0", "0Gi", "0m", "500m", "1k", "junk",
        ] {
            for kind in ["limits", "requests"] {
                let p = pod(serde_json::json!({
                    "metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "c",
                        "resources": {kind: {"nvidia.com/gpu": q}}}]}
                }));
                assert_eq!(
                    PodFacts::from_pod(&p, &[]).requests_any(&gpu),
                    railguard_api::pod::requests_gpu(&p, &gpu),
                    "{kind} {q:?}"
                );
            }
        }
    }
}
