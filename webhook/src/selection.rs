//! Which FabricProfile a training pod gets. First match wins:
//! 1. the pod's `railguard.io/profile` annotation;
//! 2. a profile whose `nodeSelector` the pod's own nodeSelector / required node affinity
//!    selects (profiles are considered in the order given; the caches sort by name);
//! 3. the profile marked `default`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec};
use railguard_api::{keys, FabricProfile};

/// How the profile was chosen (for messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Annotation,
    NodeSelector,
    Default,
}

/// Why no profile applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoProfile {
    /// The annotation names a profile that does not exist.
    Unknown(String),
    /// Neither annotation, selector nor default.
    NoMatch,
}

impl NoProfile {
    pub fn message(&self) -> String {
        match self {
            NoProfile::Unknown(name) => format!(
                "railguard.io/profile names FabricProfile {name:?}, which does not exist: pod not configured"
            ),
            NoProfile::NoMatch => "no FabricProfile matches this GPU pod (no annotation, \
                 selector match or default): pod not configured"
                .to_string(),
        }
    }
}

pub fn choose<'p>(
    pod: &Pod,
    spec: &PodSpec,
    profiles: &'p [FabricProfile],
) -> Result<(&'p FabricProfile, Choice), NoProfile> {
    if let Some(name) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_PROFILE))
    {
        let name = name.trim();
        return profiles
            .iter()
            .find(|p| p.name() == name)
            .map(|p| (p, Choice::Annotation))
            .ok_or_else(|| NoProfile::Unknown(name.to_string()));
    }
    if let Some(p) = profiles
        .iter()
        .find(|p| pod_selects(spec, &p.spec.node_selector))
    {
        return Ok((p, Choice::NodeSelector));
    }
    profiles
        .iter()
        .find(|p| p.spec.default)
        .map(|p| (p, Choice::Default))
        .ok_or(NoProfile::NoMatch)
}

/// Whether the pod's placement constraints point at the node pool `pool` (the profile's
/// nodeSelector): they must name at least one of the pool's label keys, and every
/// constraint on those keys must accept the pool's value. Constraints on other keys (zone,
/// instance size) neither select nor exclude a pool.
pub fn pod_selects(spec: &PodSpec, pool: &BTreeMap<String, String>) -> bool {
    if pool.is_empty() {
        return false;
    }
    let mut names_pool = false;
    if let Some(sel) = &spec.node_selector {
        for (k, v) in sel {
            if let Some(pv) = pool.get(k) {
                if pv != v {
                    return false;
                }
                names_pool = true;
            }
        }
    }
    let terms = required_terms(spec);
    if terms.is_empty() {
        return names_pool;
    }
    // Terms are ORed: one term that accepts the pool (and the nodeSelector) suffices.
    terms.iter().any(|t| match term_on_pool(t, pool) {
        TermVerdict::Rejects => false,
        TermVerdict::Accepts { names_pool: n } => names_pool || n,
    })
}

/// The pod's required node-affinity terms (ORed), empty when it has none.
fn required_terms(spec: &PodSpec) -> &[NodeSelectorTerm] {
    spec.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
}

/// The pool label key on which the pod's own placement excludes the pool (a nodeSelector
/// value other than the pool's, or required node affinity whose every term rejects the
/// pool's value): the pod asks for other nodes than the profile's, so the profile's
/// configuration and affinity would make it unschedulable. None when nothing contradicts.
pub fn pod_excludes<'p>(spec: &PodSpec, pool: &'p BTreeMap<String, String>) -> Option<&'p str> {
    if let Some(sel) = &spec.node_selector {
        for (k, v) in sel {
            if let Some((key, pv)) = pool.get_key_value(k) {
                if pv != v {
                    return Some(key);
                }
            }
        }
    }
    let terms = required_terms(spec);
    let mut first = None;
    for term in terms {
        let rejecting = term.match_expressions.iter().flatten().find_map(|e| {
            pool.get_key_value(&e.key)
                .filter(|(_, v)| !requirement_accepts(e, Some(v)))
                .map(|(k, _)| k.as_str())
        });
        match rejecting {
            // One term that admits the pool's nodes: the pod can land there.
            None => return None,
            Some(key) => {
                first.get_or_insert(key);
            }
        }
    }
    first
}

enum TermVerdict {
    Rejects,
    Accepts { names_pool: bool },
}

fn term_on_pool(term: &NodeSelectorTerm, pool: &BTreeMap<String, String>) -> TermVerdict {
    let mut names = false;
    for e in term.match_expressions.iter().flatten() {
        if let Some(v) = pool.get(&e.key) {
            if !requirement_accepts(e, Some(v)) {
                return TermVerdict::Rejects;
            }
            names = true;
        }
    }
    TermVerdict::Accepts { names_pool: names }
}

fn requirement_accepts(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector};

    fn pool() -> BTreeMap<String, String> {
        BTreeMap::from([("nvidia.com/gpu.product".to_string(), "H100".to_string())])
    }

    fn with_terms(terms: Vec<Vec<(&str, &str, Vec<&str>)>>) -> PodSpec {
        PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: terms
                            .into_iter()
                            .map(|exprs| NodeSelectorTerm {
                                match_expressions: Some(
                                    exprs
                                        .into_iter()
                                        .map(|(k, op, vals)| NodeSelectorRequirement {
                                            key: k.into(),
                                            operator: op.into(),
                                            values: Some(
                                                vals.into_iter().map(String::from).collect(),
                                            ),
                                        })
                                        .collect(),
                                ),
                                match_fields: None,
                            })
                            .collect(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn node_selector_on_pool_key_selects() {
        let mut spec = PodSpec::default();
        assert!(!pod_selects(&spec, &pool()));
        spec.node_selector = Some(BTreeMap::from([
            ("nvidia.com/gpu.product".into(), "H100".into()),
            ("topology.kubernetes.io/zone".into(), "a".into()),
        ]));
        assert!(pod_selects(&spec, &pool()));
        spec.node_selector = Some(BTreeMap::from([(
            "nvidia.com/gpu.product".into(),
            "A100".into(),
        )]));
        assert!(!pod_selects(&spec, &pool()));
    }

    #[test]
    fn affinity_terms_are_ored() {
        let spec = with_terms(vec![
            vec![("nvidia.com/gpu.product", "In", vec!["A100"])],
            vec![("nvidia.com/gpu.product", "In", vec!["H100", "H200"])],
        ]);
        assert!(pod_selects(&spec, &pool()));
        let spec = with_terms(vec![vec![(
            "nvidia.com/gpu.product",
            "NotIn",
            vec!["H100"],
        )]]);
        assert!(!pod_selects(&spec, &pool()));
        // A term on other keys only does not point at the pool.
        let spec = with_terms(vec![vec![("zone", "In", vec!["a"])]]);
        assert!(!pod_selects(&spec, &pool()));
        let spec = with_terms(vec![vec![("nvidia.com/gpu.product", "Exists", vec![])]]);
        assert!(pod_selects(&spec, &pool()));
    }

    #[test]
    fn a_pod_that_asks_for_another_product_excludes_the_pool() {
        let mut spec = PodSpec::default();
        assert_eq!(
            pod_excludes(&spec, &pool()),
            None,
            "no placement of its own"
        );
        spec.node_selector = Some(BTreeMap::from([(
            "nvidia.com/gpu.product".into(),
            "H200".into(),
        )]));
        assert_eq!(pod_excludes(&spec, &pool()), Some("nvidia.com/gpu.product"));
        spec.node_selector = Some(BTreeMap::from([("zone".into(), "a".into())]));
        assert_eq!(pod_excludes(&spec, &pool()), None, "other keys say nothing");
        let spec = with_terms(vec![
            vec![("nvidia.com/gpu.product", "In", vec!["B200"])],
            vec![("nvidia.com/gpu.product", "NotIn", vec!["H100"])],
        ]);
        assert_eq!(
            pod_excludes(&spec, &pool()),
            Some("nvidia.com/gpu.product"),
            "every term rejects the pool"
        );
        let spec = with_terms(vec![
            vec![("nvidia.com/gpu.product", "In", vec!["B200"])],
            vec![("zone", "In", vec!["a"])],
        ]);
        assert_eq!(
            pod_excludes(&spec, &pool()),
            None,
            "a term on other keys admits the pool's nodes"
        );
        let spec = with_terms(vec![vec![(
            "nvidia.com/gpu.product",
            "In",
            vec!["H100", "H200"],
        )]]);
        assert_eq!(pod_excludes(&spec, &pool()), None);
    }

    #[test]
    fn empty_pool_selector_is_never_selected() {
        let spec = with_terms(vec![vec![("x", "Exists", vec![])]]);
        assert!(!pod_selects(&spec, &BTreeMap::new()));
    }
}
