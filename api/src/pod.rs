//! What makes a pod a GPU pod, defined once for the webhook, the extender and the prober.
//!
//! One zero rule for every caller: a resource counts when its quantity parses to a non-zero
//! value (`0`, `0.0`, `+0` and `0Gi` are all zero). Extended resources must have requests
//! equal to limits, and a limit alone implies the request, so limits are read first.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity::parse_bytes;

/// Whether a quantity string is zero (or empty). The apiserver has validated the quantities of
/// a stored pod; one that does not parse is not zero, so it is never silently ignored.
pub fn is_zero_quantity(q: &str) -> bool {
    let t = q.trim();
    t.is_empty() || parse_bytes(t).is_ok_and(|n| n == 0)
}

/// How many of `resource` a container asks for (limits first). An unparsable quantity counts
/// as one: it is present, and never read as "none".
pub fn container_resource_count(c: &Container, resource: &str) -> u64 {
    let Some(r) = &c.resources else { return 0 };
    let q = r
        .limits
        .as_ref()
        .and_then(|m| m.get(resource))
        .or_else(|| r.requests.as_ref().and_then(|m| m.get(resource)));
    match q {
        None => 0,
        Some(q) if is_zero_quantity(&q.0) => 0,
        Some(q) => parse_bytes(q.0.trim()).map_or(1, |n| u64::try_from(n).unwrap_or(u64::MAX)),
    }
}

/// GPUs a container asks for, summed over the GPU resource names.
pub fn container_gpu_count(c: &Container, gpu_resources: &[String]) -> u64 {
    gpu_resources
        .iter()
        .map(|name| container_resource_count(c, name))
        .fold(0u64, u64::saturating_add)
}

/// Whether any container (init containers included) of the pod asks for a GPU.
pub fn requests_gpu(pod: &Pod, gpu_resources: &[String]) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| container_gpu_count(c, gpu_resources) > 0)
    })
}

/// Whether the pod has finished (`Succeeded` or `Failed`) and so holds no resources.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether the pod holds (or will hold) a GPU: not finished, and asking for one.
pub fn holds_gpu(pod: &Pod, gpu_resources: &[String]) -> bool {
    !is_finished(pod) && requests_gpu(pod, gpu_resources)
}

/// Whether resource `name` matches `pattern`: the same name, or with each `*` standing for
/// any run of characters. The NVIDIA device plugin names a GPU's shares as it is configured
/// (`nvidia.com/mig-1g.10gb` under the mixed MIG strategy, `nvidia.com/gpu.shared` for
/// time-slicing with `renameByDefault`), so a fixed list would miss the next profile.
pub fn resource_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return false;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    let Some((last, middle)) = tail.split_last() else {
        // No `*`: the whole name.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether any container (init containers included) asks for a non-zero quantity of a
/// resource matching one of `patterns` ([`resource_matches`]).
pub fn requests_matching(pod: &Pod, patterns: &[String]) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| {
                let Some(r) = &c.resources else { return false };
                r.limits
                    .iter()
                    .chain(r.requests.iter())
                    .flat_map(|m| m.iter())
                    .any(|(name, q)| {
                        !is_zero_quantity(&q.0)
                            && patterns.iter().any(|p| resource_matches(p, name))
                    })
            })
    })
}

/// Whether the pod holds (or will hold) devices an invasive test would disturb: not
/// finished, and asking for a resource matching one of `resources` (the GPUs, their MIG and
/// time-sliced shares, and the profile's RDMA resource, so a storage client on the same HCAs
/// counts) or holding any DRA claim (a GPU or NIC allocated through `resource.k8s.io` shows
/// up as `spec.resourceClaims`, not as a resource request).
pub fn holds_devices(pod: &Pod, resources: &[String]) -> bool {
    let claims = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty());
    !is_finished(pod) && (claims || requests_matching(pod, resources))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn gpu() -> Vec<String> {
        vec!["nvidia.com/gpu".to_string()]
    }

    fn with_resources(kind: &str, value: &str, phase: Option<&str>) -> Pod {
        let mut p = serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "c", "resources": {kind: {"nvidia.com/gpu": value}}}
            ]}
        });
        if let Some(phase) = phase {
            p["status"] = serde_json::json!({"phase": phase});
        }
        pod(p)
    }

    #[test]
    fn resource_patterns_match_mig_and_time_sliced_names() {
        for (pattern, name, want) in [
            ("nvidia.com/gpu", "nvidia.com/gpu", true),
            ("nvidia.com/gpu", "nvidia.com/gpu.shared", false),
            ("nvidia.com/gpu", "nvidia.com/gp", false),
            ("nvidia.com/gpu.shared", "nvidia.com/gpu.shared", true),
            ("nvidia.com/mig-*", "nvidia.com/mig-1g.10gb", true),
            ("nvidia.com/mig-*", "nvidia.com/mig-", true),
            ("nvidia.com/mig-*", "nvidia.com/gpu", false),
            ("nvidia.com/*", "nvidia.com/gpu", true),
            ("*.com/gpu", "nvidia.com/gpu", true),
            ("nvidia.com/mig-*.*gb", "nvidia.com/mig-3g.40gb", true),
            ("nvidia.com/mig-*.*gb", "nvidia.com/mig-3g", false),
            ("a*a", "a", false),
            ("*", "anything", true),
        ] {
            assert_eq!(resource_matches(pattern, name), want, "{pattern} {name}");
        }
    }

    #[test]
    fn a_mig_or_time_sliced_pod_holds_devices_under_the_default_patterns() {
        let patterns: Vec<String> = [
            "nvidia.com/gpu",
            "nvidia.com/gpu.shared",
            "nvidia.com/mig-*",
        ]
        .map(String::from)
        .to_vec();
        let of = |name: &str, q: &str| {
            pod(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {name: q}}}]}
            }))
        };
        assert!(holds_devices(&of("nvidia.com/mig-1g.10gb", "1"), &patterns));
        assert!(holds_devices(&of("nvidia.com/gpu.shared", "2"), &patterns));
        assert!(holds_devices(&of("nvidia.com/gpu", "8"), &patterns));
        assert!(!holds_devices(
            &of("nvidia.com/mig-1g.10gb", "0"),
            &patterns
        ));
        assert!(!holds_devices(&of("cpu", "4"), &patterns));
        // Exact names still mean exactly that name.
        assert!(!holds_devices(&of("nvidia.com/mig-1g.10gb", "1"), &gpu()));
    }

    #[test]
    fn every_spelling_of_zero_is_zero() {
        for z in ["0", "0.0", "+0", "0Gi", " 0 ", ""] {
            assert!(is_zero_quantity(z), "{z:?}");
        }
        for nz in ["1", "0.5", "8", "1k", "junk"] {
            assert!(!is_zero_quantity(nz), "{nz:?}");
        }
    }

    #[test]
    fn limits_or_requests_make_a_gpu_pod() {
        assert!(requests_gpu(&with_resources("limits", "8", None), &gpu()));
        assert!(requests_gpu(&with_resources("requests", "1", None), &gpu()));
        assert!(!requests_gpu(&with_resources("limits", "0", None), &gpu()));
        assert!(!requests_gpu(
            &with_resources("limits", "0.0", None),
            &gpu()
        ));
        assert!(!requests_gpu(
            &with_resources("limits", "8", None),
            &["amd.com/gpu".to_string()]
        ));
    }

    #[test]
    fn init_containers_count() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "c"}],
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }));
        assert!(requests_gpu(&p, &gpu()));
    }

    #[test]
    fn finished_pods_hold_no_gpu() {
        assert!(holds_gpu(
            &with_resources("limits", "8", Some("Running")),
            &gpu()
        ));
        assert!(holds_gpu(&with_resources("limits", "8", None), &gpu()));
        assert!(!holds_gpu(
            &with_resources("limits", "8", Some("Succeeded")),
            &gpu()
        ));
        assert!(!holds_gpu(
            &with_resources("limits", "8", Some("Failed")),
            &gpu()
        ));
    }

    #[test]
    fn counts_sum_over_resource_names_and_prefer_limits() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "4", "amd.com/gpu": "2"},
                "requests": {"nvidia.com/gpu": "3"}
            }}]}
        }));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let both = vec!["nvidia.com/gpu".to_string(), "amd.com/gpu".to_string()];
        assert_eq!(container_gpu_count(c, &both), 6);
        assert_eq!(container_resource_count(c, "nvidia.com/gpu"), 4);
        assert_eq!(container_resource_count(c, "rdma/x"), 0);
    }

    #[test]
    fn rdma_users_and_dra_claims_hold_devices_too() {
        let resources = vec!["nvidia.com/gpu".to_string(), "rdma/hca".to_string()];
        let rdma = pod(serde_json::json!({
            "metadata": {"name": "storage"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"rdma/hca": "1"}}}]}
        }));
        assert!(holds_devices(&rdma, &resources));
        assert!(!holds_gpu(&rdma, &gpu()));
        let claim = pod(serde_json::json!({
            "metadata": {"name": "dra"},
            "spec": {"containers": [{"name": "c"}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight"}]}
        }));
        assert!(holds_devices(&claim, &resources));
        let done = pod(serde_json::json!({
            "metadata": {"name": "dra"},
            "spec": {"containers": [{"name": "c"}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimName": "x"}]},
            "status": {"phase": "Succeeded"}
        }));
        assert!(!holds_devices(&done, &resources));
        let cpu = pod(serde_json::json!({
            "metadata": {"name": "cpu"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}
        }));
        assert!(!holds_devices(&cpu, &resources));
    }
}
