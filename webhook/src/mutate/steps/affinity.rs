//! `affinity`: a required node affinity on `railguard.io/fabric=certified` and the profile
//! (and, unless the profile sets `certification.acceptSimulated`, on the absence of
//! `railguard.io/simulated`), ANDed into every required nodeSelectorTerm the pod has (terms
//! are ORed, so each needs it), so the pod lands only on nodes certified for its profile by
//! measurement.

use std::cell::RefCell;
use std::rc::Rc;

use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, PodSpec};
use railguard_api::keys;

use crate::error::MutateError;
use crate::json_text::{Array, JsonText, Object};
use crate::mutate::{Ctx, Draft, Mutation};
use crate::patch::{child, pointer, PatchOp};

pub(crate) fn affinity(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    // A pod claiming its profile's aligned rails (DRA) is placed by its claim: the device
    // taints keep failed rails out, so a degraded node's healthy pairs stay usable.
    if ctx.skip.contains(&Mutation::Affinity) || ctx.dra.is_some() {
        return Ok(());
    }
    let accept_simulated = ctx.profile.spec.certification.accept_simulated;
    if affinity_ops(
        ctx.spec,
        ctx.profile.name(),
        accept_simulated,
        &mut draft.plan.ops,
    ) {
        draft.done.insert(Mutation::Affinity);
    }
    Ok(())
}

fn required_expressions(profile: &str, accept_simulated: bool) -> Vec<NodeSelectorRequirement> {
    let mut wanted = vec![
        NodeSelectorRequirement {
            key: keys::LABEL_FABRIC.to_string(),
            operator: "In".to_string(),
            values: Some(vec![keys::fabric::CERTIFIED.to_string()]),
        },
        NodeSelectorRequirement {
            key: keys::LABEL_PROFILE.to_string(),
            operator: "In".to_string(),
            values: Some(vec![profile.to_string()]),
        },
    ];
    if !accept_simulated {
        // A simulated certificate proves nothing about the node's hardware.
        wanted.push(NodeSelectorRequirement {
            key: keys::LABEL_SIMULATED.to_string(),
            operator: "DoesNotExist".to_string(),
            values: None,
        });
    }
    wanted
}

fn write_requirement(o: &mut Object<'_>, r: &NodeSelectorRequirement) {
    o.str("key", &r.key).str("operator", &r.operator);
    // Exists and DoesNotExist take no values.
    if let Some(values) = &r.values {
        o.array("values", |v| {
            for value in values {
                v.str(value);
            }
        });
    }
}

fn push_requirements<'r>(
    a: &mut Array<'_>,
    rs: impl IntoIterator<Item = &'r NodeSelectorRequirement>,
) {
    for r in rs {
        a.object(|o| write_requirement(o, r));
    }
}

/// The JSON values the affinity step adds for one profile, written once per profile: only
/// pods that already carry required node selector terms need values built for them.
#[derive(Debug)]
struct AffinityTexts {
    /// `{"matchExpressions": [...]}`: one nodeSelectorTerm with both requirements.
    term: JsonText,
    /// `{"nodeSelectorTerms": [term]}`.
    selector: JsonText,
    /// `{"requiredDuringSchedulingIgnoredDuringExecution": selector}`.
    node_affinity: JsonText,
    /// `{"nodeAffinity": node_affinity}`.
    affinity: JsonText,
}

impl AffinityTexts {
    fn new(profile: &str, accept_simulated: bool) -> Self {
        let term = JsonText::object(|o| {
            o.array("matchExpressions", |a| {
                push_requirements(a, &required_expressions(profile, accept_simulated))
            });
        });
        let selector = JsonText::object(|o| {
            o.array("nodeSelectorTerms", |a| {
                a.json(&term);
            });
        });
        let node_affinity = JsonText::object(|o| {
            o.json("requiredDuringSchedulingIgnoredDuringExecution", &selector);
        });
        let affinity = JsonText::object(|o| {
            o.json("nodeAffinity", &node_affinity);
        });
        AffinityTexts {
            term,
            selector,
            node_affinity,
            affinity,
        }
    }

    /// The texts for `profile`, memoized per thread by name and simulation acceptance (they
    /// depend on nothing else).
    fn of(profile: &str, accept_simulated: bool) -> Rc<AffinityTexts> {
        const MEMO_SIZE: usize = 32;
        type Memo = Vec<((String, bool), Rc<AffinityTexts>)>;
        thread_local! {
            static MEMO: RefCell<Memo> = const { RefCell::new(Vec::new()) };
        }
        MEMO.with(|memo| {
            if let Some((_, texts)) = memo
                .borrow()
                .iter()
                .find(|((name, accept), _)| name == profile && *accept == accept_simulated)
            {
                return texts.clone();
            }
            let texts = Rc::new(AffinityTexts::new(profile, accept_simulated));
            let mut memo = memo.borrow_mut();
            if memo.len() >= MEMO_SIZE {
                memo.remove(0);
            }
            memo.push(((profile.to_string(), accept_simulated), texts.clone()));
            texts
        })
    }
}

/// ANDs the certified-node requirement into every required nodeSelectorTerm (terms are
/// ORed, so each needs it). Returns whether anything was added.
fn affinity_ops(
    spec: &PodSpec,
    profile: &str,
    accept_simulated: bool,
    out: &mut Vec<PatchOp>,
) -> bool {
    let texts = AffinityTexts::of(profile, accept_simulated);
    let affinity = spec.affinity.as_ref();
    let node = affinity.and_then(|a| a.node_affinity.as_ref());
    let required = node.and_then(|n| {
        n.required_during_scheduling_ignored_during_execution
            .as_ref()
    });
    let base = || -> PointerBuf {
        pointer([
            "spec",
            "affinity",
            "nodeAffinity",
            "requiredDuringSchedulingIgnoredDuringExecution",
        ])
    };
    match (affinity, node, required) {
        (None, _, _) => {
            out.push(PatchOp::add(
                pointer(["spec", "affinity"]),
                texts.affinity.clone(),
            ));
            true
        }
        (Some(_), None, _) => {
            out.push(PatchOp::add(
                pointer(["spec", "affinity", "nodeAffinity"]),
                texts.node_affinity.clone(),
            ));
            true
        }
        (Some(_), Some(_), None) => {
            out.push(PatchOp::add(base(), texts.selector.clone()));
            true
        }
        (Some(_), Some(_), Some(req)) if req.node_selector_terms.is_empty() => {
            out.push(PatchOp::add(
                child(&base(), ["nodeSelectorTerms", "-"]),
                texts.term.clone(),
            ));
            true
        }
        (Some(_), Some(_), Some(req)) => {
            let wanted = required_expressions(profile, accept_simulated);
            let base = base();
            let mut added = false;
            for (t, existing) in req.node_selector_terms.iter().enumerate() {
                let idx = t.to_string();
                let term_base = child(&base, ["nodeSelectorTerms", idx.as_str()]);
                let have = existing.match_expressions.as_deref().unwrap_or_default();
                let missing: Vec<&NodeSelectorRequirement> =
                    wanted.iter().filter(|w| !have.contains(w)).collect();
                if missing.is_empty() {
                    continue;
                }
                added = true;
                match &existing.match_expressions {
                    None => out.push(PatchOp::add(
                        child(&term_base, ["matchExpressions"]),
                        JsonText::array(|a| push_requirements(a, missing.iter().copied())),
                    )),
                    Some(_) => {
                        for m in missing {
                            out.push(PatchOp::add(
                                child(&term_base, ["matchExpressions", "-"]),
                                JsonText::object(|o| write_requirement(o, m)),
                            ));
                        }
                    }
                }
            }
            added
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{json, Value};

    use super::*;
    use crate::mutate::fixtures::{apply_ops, pod};

    fn terms(p: &Pod) -> Vec<Vec<String>> {
        let spec = p.spec.as_ref().unwrap();
        let req = spec
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap();
        req.node_selector_terms
            .iter()
            .map(|t| {
                t.match_expressions
                    .iter()
                    .flatten()
                    .map(|e| e.key.clone())
                    .collect()
            })
            .collect()
    }

    fn run(spec: Value) -> (Pod, bool) {
        run_accepting(spec, true)
    }

    fn run_accepting(spec: Value, accept_simulated: bool) -> (Pod, bool) {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": spec}));
        let mut ops = Vec::new();
        let added = affinity_ops(
            p.spec.as_ref().unwrap(),
            "h100-ndr",
            accept_simulated,
            &mut ops,
        );
        (apply_ops(&p, &ops), added)
    }

    /// A profile that does not accept simulated certificates keeps its pods off nodes
    /// labelled `railguard.io/simulated` (the label the prober writes with one), in every
    /// term; one that accepts them does not ask.
    #[test]
    fn simulated_nodes_are_excluded_unless_the_profile_accepts_them() {
        let (out, added) = run_accepting(json!({"containers": []}), false);
        assert!(added);
        assert_eq!(
            terms(&out),
            [[
                keys::LABEL_FABRIC,
                keys::LABEL_PROFILE,
                keys::LABEL_SIMULATED
            ]]
        );
        let spec = serde_json::to_value(out.spec.as_ref().unwrap()).unwrap();
        let term = &spec["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][2];
        assert_eq!(
            term,
            &json!({"key": "railguard.io/simulated", "operator": "DoesNotExist"})
        );
        let (again, added) = run_accepting(spec.clone(), false);
        assert!(!added, "already there");
        assert_eq!(again, out);
        // Existing terms each get it too.
        let (out, _) = run_accepting(
            json!({"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}),
            false,
        );
        assert_eq!(
            terms(&out),
            [[
                "zone",
                keys::LABEL_FABRIC,
                keys::LABEL_PROFILE,
                keys::LABEL_SIMULATED
            ]]
        );
    }

    #[test]
    fn every_shape_of_affinity_gets_the_requirement() {
        let required = |terms: Value| {
            json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
        };
        for spec in [
            json!({"containers": []}),
            json!({"containers": [], "affinity": {}}),
            json!({"containers": [], "affinity": {"nodeAffinity": {}}}),
            required(json!([])),
        ] {
            let (out, added) = run(spec.clone());
            assert!(added, "{spec}");
            assert_eq!(
                terms(&out),
                [[keys::LABEL_FABRIC, keys::LABEL_PROFILE]],
                "{spec}"
            );
        }
        let (out, added) = run(required(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
        ])));
        assert!(added);
        assert_eq!(
            terms(&out),
            [
                vec!["zone", keys::LABEL_FABRIC, keys::LABEL_PROFILE],
                vec![keys::LABEL_FABRIC, keys::LABEL_PROFILE]
            ]
        );
        let (again, added) = run(serde_json::to_value(out.spec.as_ref().unwrap()).unwrap());
        assert!(!added, "already there");
        assert_eq!(again, out);
    }
}
