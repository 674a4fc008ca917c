//! The output annotations, last: `railguard.io/profile`, `railguard.io/signature` and
//! `railguard.io/mutations` (what earlier admissions applied plus this one's steps), with
//! what the steps before asked to set (the merged networks). A value already right is left.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use railguard_api::keys;

use crate::error::MutateError;
use crate::json_text::{JsonText, Object};
use crate::mutate::{Ctx, Draft, Mutation};
use crate::patch::{pointer, PatchOp};

pub(crate) fn annotations(ctx: &Ctx<'_>, draft: &mut Draft) -> Result<(), MutateError> {
    let current = ctx.annotations;
    for (key, value) in [
        (keys::ANNOTATION_PROFILE, ctx.profile.name().to_string()),
        (keys::ANNOTATION_SIGNATURE, ctx.signature.clone()),
    ] {
        if current.get(key) != Some(&value) {
            draft.annotations.insert(key.to_string(), value);
        }
    }
    let mut all: BTreeSet<Mutation> = current
        .get(keys::ANNOTATION_MUTATIONS)
        .map(|v| {
            v.split(',')
                .filter_map(|p| Mutation::ALL.into_iter().find(|m| m.as_str() == p.trim()))
                .collect()
        })
        .unwrap_or_default();
    all.extend(draft.done.iter().copied());
    if !all.is_empty() {
        let value = all.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",");
        if current.get(keys::ANNOTATION_MUTATIONS) != Some(&value) {
            draft
                .annotations
                .insert(keys::ANNOTATION_MUTATIONS.to_string(), value);
        }
    }
    if draft.annotations.is_empty() {
        return Ok(());
    }
    let changes = std::mem::take(&mut draft.annotations);
    draft
        .plan
        .ops
        .extend(annotation_ops(&ctx.pod.metadata, &changes));
    Ok(())
}

/// The operations that set `changes` on an object with `metadata`, however much of
/// `/metadata/annotations` it has.
pub(crate) fn annotation_ops(
    metadata: &ObjectMeta,
    changes: &BTreeMap<String, String>,
) -> Vec<PatchOp> {
    if changes.is_empty() {
        return Vec::new();
    }
    // The map in key order, as serde writes a BTreeMap.
    let map = |o: &mut Object<'_>| {
        for (k, v) in changes {
            o.str(k, v);
        }
    };
    match &metadata.annotations {
        // An object with no metadata at all (or an empty one) has no `/metadata` to add
        // under: the whole map goes in at once (`add` replaces an empty `{}` too).
        None if *metadata == ObjectMeta::default() => vec![PatchOp::add(
            pointer(["metadata"]),
            JsonText::object(|o| {
                o.object("annotations", map);
            }),
        )],
        None => vec![PatchOp::add(
            pointer(["metadata", "annotations"]),
            JsonText::object(map),
        )],
        Some(existing) => changes
            .iter()
            .map(|(k, v)| {
                let path = pointer(["metadata", "annotations", k.as_str()]);
                let value = JsonText::string(v);
                if existing.contains_key(k) {
                    PatchOp::Replace { path, value }
                } else {
                    PatchOp::add(path, value)
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;
    use crate::mutate::fixtures::{apply_ops, in_ml, open, pod_of, profile, H100};

    fn run(p: &Pod, done: &[Mutation]) -> (Pod, Vec<PatchOp>) {
        let (profiles, ns, config) = in_ml(vec![profile(H100)]);
        let (ctx, mut draft) = open(p, &ns, &profiles, &config);
        draft.done.extend(done.iter().copied());
        annotations(&ctx, &mut draft).unwrap();
        (apply_ops(p, &draft.plan.ops), draft.plan.ops)
    }

    fn get<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
        p.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    #[test]
    fn mutations_accumulate_over_admissions_in_a_fixed_order() {
        let mut p =
            pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]));
        p.metadata.annotations = Some(
            [(
                keys::ANNOTATION_MUTATIONS.to_string(),
                "shm,bogus".to_string(),
            )]
            .into(),
        );
        let (out, ops) = run(&p, &[Mutation::NcclEnv]);
        assert_eq!(get(&out, keys::ANNOTATION_MUTATIONS), Some("nccl-env,shm"));
        assert_eq!(get(&out, keys::ANNOTATION_PROFILE), Some("h100-ndr"));
        assert!(
            ops.iter().any(|o| matches!(o, PatchOp::Replace { .. })),
            "{ops:?}"
        );
        let (_, again) = run(&out, &[]);
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn one_map_when_the_pod_has_none() {
        let p = pod_of(json!([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]));
        let (out, ops) = run(&p, &[]);
        assert_eq!(ops.len(), 1);
        assert_eq!(
            get(&out, keys::ANNOTATION_MUTATIONS),
            None,
            "nothing applied"
        );
        assert!(get(&out, keys::ANNOTATION_SIGNATURE).is_some());
    }
}
