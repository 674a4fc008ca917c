//! The one Node writer: every write railguard makes to a Node (the prober's certificate,
//! pending mark, run taint and condition; the campaign's findings; the fleet controller's
//! outlier condition, upkeep and orphan repair; the daemon's unusable-profile condition) goes
//! through [`NodeWriter`], under the writer's field manager. What a write does when the Node
//! changed since it was read is a parameter of each call ([`OnConflict`]), not a copy of
//! the write, and the retry pace after a conflict is one rule ([`after_conflict`]).
//!
//! Labels and annotations are server-side applied and forced: each manager owns its own.
//! Taints and other spec fields are JSON merge patches (taints are an atomic list: the
//! patch carries the whole list, so it must be decided on the Node as read). Conditions
//! are strategic merge patches of the status subresource (conditions merge by type; before
//! Kubernetes 1.22 managed fields do not tell the status subresource apart, so an apply
//! there by the same manager would drop the labels and annotation that manager applied).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

/// How often a caller that retries re-reads and writes again after conflicts.
pub const WRITE_ATTEMPTS: usize = 16;

/// What a write does when the Node changed since the caller read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnConflict {
    /// The write carries this resourceVersion as its precondition: if the Node changed it
    /// is refused and answered [`Written::Conflict`] (the caller reads again and decides
    /// again, or leaves it to its next pass). For writes decided on what the Node holds: a
    /// certificate merged with the other writer's, a whole taint list.
    Precondition(Option<String>),
    /// No precondition: the write lands on the Node as it is now. For writes that touch
    /// only the caller's own fields and do not depend on the rest (a condition of its own
    /// type, an annotation of its own).
    LastWriterWins,
}

/// What a write did.
#[derive(Clone, Debug)]
pub enum Written {
    /// Written: the Node as the API server returned it.
    Done(Box<Node>),
    /// Refused by the [`OnConflict::Precondition`]: the Node changed since it was read.
    Conflict,
}

/// A condition of railguard's on a Node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeCondition<'a> {
    pub type_: &'a str,
    pub status: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
}

/// Waits a little after the `attempt`th conflict: randomized and growing (20 ms to 640 ms),
/// so two writers that keep meeting stop meeting.
pub async fn after_conflict(attempt: usize) {
    use rand::Rng;
    let ceiling = 20u64 << attempt.min(5);
    let ms = rand::thread_rng().gen_range(ceiling / 2..=ceiling);
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// Whether `e` is the API server refusing a write whose precondition no longer holds.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Pure: the `lastTransitionTime` a condition written as `status` at `now` keeps: the one on
/// `node` when its condition of that type already has that status, else `now`.
pub fn transition_time(node: &Node, type_: &str, status: &str, now: &str) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.to_string())
        .unwrap_or_else(|| now.to_string())
}

/// Pure: `patch` with the precondition `on_conflict` asks for (a resourceVersion set, or
/// none at all, whatever the patch carried).
pub fn with_precondition(mut patch: Value, on_conflict: &OnConflict) -> Value {
    if let Some(obj) = patch.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            match on_conflict {
                OnConflict::Precondition(rv) => {
                    meta.insert("resourceVersion".into(), json!(rv));
                }
                OnConflict::LastWriterWins => {
                    meta.remove("resourceVersion");
                }
            }
            if meta.is_empty() {
                obj.remove("metadata");
            }
        }
    }
    patch
}

/// Writes Nodes under one field manager.
#[derive(Clone)]
pub struct NodeWriter {
    nodes: Api<Node>,
    manager: String,
}

impl NodeWriter {
    pub fn new(client: Client, manager: &str) -> Self {
        NodeWriter {
            nodes: Api::all(client),
            manager: manager.to_string(),
        }
    }

    /// The field manager this writer writes as.
    pub fn manager(&self) -> &str {
        &self.manager
    }

    /// A non-apply write under this writer's field manager.
    fn update_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.manager.clone()),
            ..PatchParams::default()
        }
    }

    /// Reads Node `name`.
    pub async fn get(&self, name: &str) -> Result<Node, kube::Error> {
        self.nodes.get(name).await
    }

    fn answer(result: Result<Node, kube::Error>) -> Result<Written, kube::Error> {
        match result {
            Ok(node) => Ok(Written::Done(Box::new(node))),
            Err(e) if is_conflict(&e) => Ok(Written::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Applies `labels` and `annotations` on Node `name` (forced: this manager owns them;
    /// one it applied before and leaves out now is removed).
    pub async fn apply_metadata(
        &self,
        name: &str,
        labels: &BTreeMap<&str, &str>,
        annotations: &BTreeMap<&str, &str>,
        on_conflict: &OnConflict,
    ) -> Result<Written, kube::Error> {
        let patch = with_precondition(
            json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": annotations,
                }
            }),
            on_conflict,
        );
        let pp = PatchParams::apply(&self.manager).force();
        Self::answer(self.nodes.patch(name, &pp, &Patch::Apply(&patch)).await)
    }

    /// A JSON merge patch of Node `name` (taints, labels, annotations).
    pub async fn merge(
        &self,
        name: &str,
        patch: Value,
        on_conflict: &OnConflict,
    ) -> Result<Written, kube::Error> {
        let patch = Patch::Merge(with_precondition(patch, on_conflict));
        Self::answer(self.nodes.patch(name, &self.update_params(), &patch).await)
    }

    /// Writes `condition` on `node` (as read): a strategic merge patch of the status, the
    /// heartbeat now, the transition time kept while the status stays
    /// ([`transition_time`]).
    pub async fn set_condition(
        &self,
        node: &Node,
        condition: NodeCondition<'_>,
        on_conflict: &OnConflict,
    ) -> Result<Written, kube::Error> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let transition = transition_time(node, condition.type_, condition.status, &now);
        let patch = json!({
            "status": {
                "conditions": [{
                    "type": condition.type_,
                    "status": condition.status,
                    "reason": condition.reason,
                    "message": condition.message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": transition,
                }]
            }
        });
        self.patch_status(&name, patch, on_conflict).await
    }

    /// A strategic merge patch of Node `name`'s status (conditions merge by type; a
    /// `$patch: delete` entry removes one).
    pub async fn patch_status(
        &self,
        name: &str,
        patch: Value,
        on_conflict: &OnConflict,
    ) -> Result<Written, kube::Error> {
        let patch = Patch::Strategic(with_precondition(patch, on_conflict));
        let pp = self.update_params();
        Self::answer(self.nodes.patch_status(name, &pp, &patch).await)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_precondition_is_what_the_caller_asks_for_whatever_the_patch_carried() {
        let patch = json!({"metadata": {"resourceVersion": "3", "labels": {"a": "b"}}});
        let checked = with_precondition(patch.clone(), &OnConflict::Precondition(Some("7".into())));
        assert_eq!(checked["metadata"]["resourceVersion"], "7");
        assert_eq!(checked["metadata"]["labels"]["a"], "b");
        let free = with_precondition(patch, &OnConflict::LastWriterWins);
        assert!(free["metadata"].get("resourceVersion").is_none(), "{free}");
        // A status patch without metadata stays without it when nothing is preconditioned.
        let status = with_precondition(json!({"status": {}}), &OnConflict::LastWriterWins);
        assert_eq!(status, json!({"status": {}}));
        let status = with_precondition(
            json!({"status": {}}),
            &OnConflict::Precondition(Some("9".into())),
        );
        assert_eq!(status["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_stays() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [{
                "type": "RailguardFabricReady", "status": "True",
                "lastTransitionTime": "2026-12-01T00:00:00Z"
            }]}
        }))
        .unwrap();
        let now = "2026-12-07T00:00:00Z";
        assert_eq!(
            transition_time(&node, "RailguardFabricReady", "True", now),
            "2026-12-01T00:00:00Z"
        );
        assert_eq!(
            transition_time(&node, "RailguardFabricReady", "False", now),
            now
        );
        assert_eq!(
            transition_time(&node, "RailguardFleetOutlier", "True", now),
            now
        );
    }
}
