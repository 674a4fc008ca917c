//! Publishing a certificate on the Node: one server-side apply (field manager
//! `railguard-prober`) for the labels and the certificate annotation, the
//! `RailguardFabricReady` condition through the status subresource, and an Event on the Node
//! (Certified, CertificationFailed, Regressed).
//!
//! A run reads the Node once ([`NodePublisher::read_state`], a [`NodeState`]) for what it
//! decides on (the previous certificate, the RDMA resource). Every write reads the Node again
//! and writes with that read's `resourceVersion` as a precondition, retried on a conflict, so
//! what another writer (the campaign coordinator) put there meanwhile is merged
//! ([`railguard_api::campaign_findings`]), never overwritten. Every write goes through
//! [`railguard_kube::node_writer`]. An API error is an error, never "no certificate".

pub mod nccl_node_file;
mod state;

pub use nccl_node_file::{nccl_node_file, write_if_changed, NodeFacts, RailFacts, WriteFileError};
pub use state::{held_by_named_taint, unavailable_for_tests, ConditionSeen, NodeState};

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use railguard_api::campaign_findings;
use railguard_api::node::node_reference;
pub use railguard_api::node::NodeEvent;
use railguard_api::{keys, Certificate, Verdict};
use railguard_kube::events::record_event;
use railguard_kube::node_writer::{NodeCondition, NodeWriter, OnConflict, Written};
use serde_json::json;

/// Why publishing failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot read node {node}")]
    GetNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot apply labels and certificate to node {node}")]
    Apply {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot set condition {} on node {node}", keys::CONDITION_FABRIC_READY)]
    Condition {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read FabricProfile {profile}")]
    GetProfile {
        profile: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot record event on node {node}")]
    Event {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot encode the certificate")]
    Encode {
        #[source]
        source: railguard_api::CertificateError,
    },
    #[error(
        "cannot write the {} taint on node {node}",
        keys::TAINT_FABRIC_UNHEALTHY
    )]
    Taint {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("node {node} kept changing while writing ({attempts} attempts)")]
    KeptChanging { node: String, attempts: usize },
}

pub use railguard_kube::node_writer::{after_conflict, WRITE_ATTEMPTS};

/// The raw certificate annotation of a Node.
fn annotation_of(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(keys::ANNOTATION_CERTIFICATE)
        .map(String::as_str)
}

/// Writes `RailguardFabricReady` as `(status, reason, message)` for the certificate whose
/// annotation is `annotation`, with `written` (the Node after that certificate's write) as the
/// precondition. When the Node's certificate is no longer `annotation`, a later writer
/// replaced it and writes its own condition: nothing is written (`Ok(None)`), so the
/// condition never describes an older certificate than the annotation. Returns the condition
/// as written.
pub async fn write_condition(
    writer: &NodeWriter,
    mut written: Node,
    annotation: &str,
    condition: (&str, &str, &str),
) -> Result<Option<ConditionSeen>, kube::Error> {
    let (status, reason, message) = condition;
    let name = written.metadata.name.clone().unwrap_or_default();
    let condition = NodeCondition {
        type_: keys::CONDITION_FABRIC_READY,
        status,
        reason,
        message,
    };
    for attempt in 0..WRITE_ATTEMPTS {
        if annotation_of(&written) != Some(annotation) {
            return Ok(None);
        }
        let precondition = OnConflict::Precondition(written.metadata.resource_version.clone());
        match writer
            .set_condition(&written, condition, &precondition)
            .await?
        {
            Written::Done(node) => return Ok(NodeState::of(&node).condition),
            Written::Conflict => {
                after_conflict(attempt).await;
                written = writer.get(&name).await?;
            }
        }
    }
    // Changing all along: whoever changes it writes a newer condition.
    Ok(None)
}

/// Pure: which Event (if any) a new certificate calls for. A passive check that changes
/// nothing records no Event; every invasive result does; a passive check that healed rails
/// records `RailHealedPassively` ([`crate::certify::heal::heal_event`]).
pub fn event_for(
    cert: &Certificate,
    previous: Option<&Certificate>,
    invasive: bool,
) -> Option<NodeEvent> {
    if !invasive {
        if let Some(ev) = crate::certify::heal::heal_event(cert, previous) {
            return Some(ev);
        }
    }
    let changed = previous.is_none_or(|p| p.verdict != cert.verdict);
    if !invasive && !changed {
        return None;
    }
    let reasons = cert.reasons.join("; ");
    let (reason, kind, message) = match cert.verdict {
        Verdict::Certified => (
            "Certified",
            "Normal",
            format!(
                "certified for profile {} (signature {}) until {}",
                cert.profile, cert.signature, cert.expires_at
            ),
        ),
        Verdict::Failed => ("CertificationFailed", "Warning", reasons),
        Verdict::Degraded => ("Regressed", "Warning", reasons),
        Verdict::Pending => return None,
    };
    Some(NodeEvent {
        reason,
        kind,
        message: truncate(&message, 1000),
    })
}

/// Pure: the condition for a certificate, `(status, reason, message)`.
pub fn condition_for(cert: &Certificate) -> (&'static str, &'static str, String) {
    match cert.verdict {
        Verdict::Certified => (
            "True",
            "Certified",
            format!(
                "certified for profile {} until {}",
                cert.profile, cert.expires_at
            ),
        ),
        Verdict::Failed => (
            "False",
            "CertificationFailed",
            truncate(&cert.reasons.join("; "), 1000),
        ),
        Verdict::Degraded => (
            "False",
            "Regressed",
            truncate(&cert.reasons.join("; "), 1000),
        ),
        Verdict::Pending => ("False", "Pending", "certification running".into()),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Writes to one Node (through [`NodeWriter`], as `railguard-prober`).
#[derive(Clone)]
pub struct NodePublisher {
    client: Client,
    node: String,
    writer: NodeWriter,
}

impl NodePublisher {
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        NodePublisher {
            writer: NodeWriter::new(client.clone(), keys::PROBER_FIELD_MANAGER),
            client,
            node: node.into(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// Reads the Node once: what a run needs to know of it ([`NodeState`]).
    pub async fn read_state(&self) -> Result<NodeState, PublishError> {
        Ok(NodeState::of(&self.get_node().await?))
    }

    async fn get_node(&self) -> Result<Node, PublishError> {
        self.writer
            .get(&self.node)
            .await
            .map_err(|source| PublishError::GetNode {
                node: self.node.clone(),
                source,
            })
    }

    /// Applies labels and the certificate annotation on the Node as `read`: `Ok(None)` when
    /// the Node changed since (a conflict; read again and merge again). The
    /// `railguard.io/simulated` label goes with the certificate applied (`simulated`): one
    /// apply, so no reader sees one without the other, and an apply without it removes it.
    async fn apply_metadata(
        &self,
        read: &Node,
        mut labels: BTreeMap<&str, &str>,
        annotation: Option<&str>,
        simulated: bool,
    ) -> Result<Option<Node>, PublishError> {
        if simulated && annotation.is_some() {
            labels.insert(keys::LABEL_SIMULATED, keys::SIMULATED);
        }
        let annotations: BTreeMap<&str, &str> = annotation
            .map(|a| (keys::ANNOTATION_CERTIFICATE, a))
            .into_iter()
            .collect();
        let precondition = OnConflict::Precondition(read.metadata.resource_version.clone());
        match self
            .writer
            .apply_metadata(&self.node, &labels, &annotations, &precondition)
            .await
        {
            Ok(Written::Done(node)) => Ok(Some(*node)),
            Ok(Written::Conflict) => Ok(None),
            Err(source) => Err(PublishError::Apply {
                node: self.node.clone(),
                source,
            }),
        }
    }

    fn kept_changing(&self) -> PublishError {
        PublishError::KeptChanging {
            node: self.node.clone(),
            attempts: WRITE_ATTEMPTS,
        }
    }

    /// Writes the run's taint (`railguard_api::upkeep::run_taint_patch`): a merge patch with
    /// the read's resourceVersion, read again after a conflict.
    pub async fn set_run_taint(
        &self,
        run: railguard_api::upkeep::RunTaint,
    ) -> Result<(), PublishError> {
        for attempt in 0..WRITE_ATTEMPTS {
            let node = self.get_node().await?;
            let taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default();
            let Some(patch) = railguard_api::upkeep::run_taint_patch(
                run,
                taints,
                node.metadata.resource_version.as_deref(),
            ) else {
                return Ok(());
            };
            // The taint list is written whole: decided on this read, or not at all.
            let precondition = OnConflict::Precondition(node.metadata.resource_version.clone());
            match self.writer.merge(&self.node, patch, &precondition).await {
                Ok(Written::Done(_)) => return Ok(()),
                Ok(Written::Conflict) => after_conflict(attempt).await,
                Err(source) => {
                    return Err(PublishError::Taint {
                        node: self.node.clone(),
                        source,
                    })
                }
            }
        }
        Err(self.kept_changing())
    }

    /// Applies the labels `labels_for` picks for the Node as read, keeping the certificate
    /// annotation on it, retried on a conflict from a fresh read; afterwards `state` is
    /// that read (with the fabric label written). Returns the Node as written.
    async fn relabel_keeping_certificate(
        &self,
        state: &mut NodeState,
        labels_for: impl for<'a> Fn(&'a NodeState) -> BTreeMap<&'static str, String>,
    ) -> Result<Node, PublishError> {
        for attempt in 0..WRITE_ATTEMPTS {
            let node = self.get_node().await?;
            let fresh = NodeState::of(&node);
            let annotation = annotation_of(&node).filter(|_| fresh.certificate.is_some());
            let wanted = labels_for(&fresh);
            let labels = wanted.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let simulated = fresh.certificate.as_ref().is_some_and(|c| c.simulated);
            let Some(written) = self
                .apply_metadata(&node, labels, annotation, simulated)
                .await?
            else {
                after_conflict(attempt).await;
                continue;
            };
            *state = fresh;
            state.fabric_label = state::fabric_label_of(&written);
            return Ok(written);
        }
        Err(self.kept_changing())
    }

    /// Marks the node `pending` while an invasive run is under way, keeping the certificate
    /// on the Node (so no job lands mid-test, and nothing is lost if the run dies).
    pub async fn mark_pending(
        &self,
        state: &mut NodeState,
        profile: &str,
        signature: &str,
    ) -> Result<(), PublishError> {
        let written = self
            .relabel_keeping_certificate(state, |_| {
                BTreeMap::from([
                    (keys::LABEL_FABRIC, keys::fabric::PENDING.to_string()),
                    (keys::LABEL_PROFILE, profile.to_string()),
                    (keys::LABEL_SIGNATURE, signature.to_string()),
                ])
            })
            .await?;
        let pending = Certificate {
            verdict: Verdict::Pending,
            ..state
                .certificate
                .clone()
                .unwrap_or_else(|| placeholder(profile, signature))
        };
        let annotation = annotation_of(&written).unwrap_or_default().to_string();
        let condition = condition_for(&pending);
        self.set_condition(state, written, &annotation, condition)
            .await
    }

    /// Gives the Node back the state the certificate on it describes, after an invasive run
    /// that marked it `pending` was abandoned (shutdown): its labels and condition follow the
    /// certificate again; without one the fabric label is removed (never certified, never
    /// left pending). Returns the certificate on the Node.
    pub async fn restore_after_interrupted_run(
        &self,
        state: &mut NodeState,
        profile: &str,
        signature: &str,
    ) -> Result<Option<Certificate>, PublishError> {
        let written = self
            .relabel_keeping_certificate(state, |fresh| match &fresh.certificate {
                Some(c) => BTreeMap::from([
                    (
                        keys::LABEL_FABRIC,
                        c.fabric_label(Timestamp::now()).to_string(),
                    ),
                    (keys::LABEL_PROFILE, c.profile.clone()),
                    (keys::LABEL_SIGNATURE, c.signature.clone()),
                ]),
                // Applying without the fabric label removes the prober's pending mark.
                None => BTreeMap::from([
                    (keys::LABEL_PROFILE, profile.to_string()),
                    (keys::LABEL_SIGNATURE, signature.to_string()),
                ]),
            })
            .await?;
        let cert = state.certificate.clone();
        let condition = match &cert {
            Some(c) => condition_for(c),
            None => (
                "False",
                "Interrupted",
                "certification was interrupted before it finished".into(),
            ),
        };
        let annotation = annotation_of(&written).unwrap_or_default().to_string();
        self.set_condition(state, written, &annotation, condition)
            .await?;
        Ok(cert)
    }

    /// Publishes a certificate: labels + annotation (one apply), condition, Event. The
    /// certificate on the Node is read again first and the campaign's part of it carried
    /// into `cert` ([`campaign_findings::carry_campaign`]). Returns the certificate as published;
    /// afterwards `state` holds it.
    pub async fn publish(
        &self,
        state: &mut NodeState,
        cert: &Certificate,
        invasive: bool,
    ) -> Result<Certificate, PublishError> {
        for attempt in 0..WRITE_ATTEMPTS {
            let node = self.get_node().await?;
            let fresh = NodeState::of(&node);
            let mut merged = cert.clone();
            if let Some(Err(e)) = fresh
                .certificate
                .as_ref()
                .map(campaign_findings::stored_campaign_findings)
            {
                tracing::warn!(error = %e, "the certificate's campaign findings are unreadable; ignored");
            }
            campaign_findings::carry_campaign(&mut merged, fresh.certificate.as_ref());
            let annotation = merged
                .to_annotation()
                .map_err(|source| PublishError::Encode { source })?;
            let labels = BTreeMap::from([
                (keys::LABEL_FABRIC, merged.fabric_label(Timestamp::now())),
                (keys::LABEL_PROFILE, merged.profile.as_str()),
                (keys::LABEL_SIGNATURE, merged.signature.as_str()),
            ]);
            let Some(written) = self
                .apply_metadata(&node, labels, Some(&annotation), merged.simulated)
                .await?
            else {
                after_conflict(attempt).await;
                continue;
            };
            let previous = fresh.certificate.clone();
            *state = fresh;
            state.fabric_label = state::fabric_label_of(&written);
            self.set_condition(state, written, &annotation, condition_for(&merged))
                .await?;
            if let Some(ev) = event_for(&merged, previous.as_ref(), invasive) {
                self.record_event(state, &ev).await?;
            }
            state.certificate = Some(merged.clone());
            return Ok(merged);
        }
        Err(self.kept_changing())
    }

    async fn set_condition(
        &self,
        state: &mut NodeState,
        written: Node,
        annotation: &str,
        condition: (&'static str, &'static str, String),
    ) -> Result<(), PublishError> {
        let (status, reason, message) = condition;
        let seen = write_condition(
            &self.writer,
            written,
            annotation,
            (status, reason, &message),
        )
        .await
        .map_err(|source| PublishError::Condition {
            node: self.node.clone(),
            source,
        })?;
        if let Some(seen) = seen {
            state.condition = Some(seen);
        }
        Ok(())
    }

    /// Records `ev` as an Event on the Node.
    pub async fn record_event(
        &self,
        state: &NodeState,
        ev: &NodeEvent,
    ) -> Result<(), PublishError> {
        record_event(
            &self.client,
            node_reference(&self.node, state.uid.clone()),
            ev,
            keys::PROBER_FIELD_MANAGER,
            &self.node,
        )
        .await
        .map_err(|source| PublishError::Event {
            node: self.node.clone(),
            source,
        })?;
        Ok(())
    }

    /// The measurements on which profile `profile`'s fleet drifted (`status.fleet.drift`, as
    /// the fleet controller wrote it); empty when it wrote none.
    pub async fn fleet_drift(
        &self,
        profile: &str,
    ) -> Result<std::collections::BTreeSet<String>, PublishError> {
        let object = Api::<railguard_api::FabricProfile>::all(self.client.clone())
            .get(profile)
            .await
            .map_err(|source| PublishError::GetProfile {
                profile: profile.to_string(),
                source,
            })?;
        Ok(object
            .status
            .and_then(|s| s.fleet)
            .map(|f| f.drift.into_iter().map(|d| d.measurement).collect())
            .unwrap_or_default())
    }

    /// Sets (`Some(since)`) or clears `railguard.io/invasive-waiting`: the daemon waits for
    /// an invasive slot (a merge patch of that one annotation; the fleet controller queues
    /// waiting nodes by it).
    pub async fn mark_invasive_waiting(
        &self,
        since: Option<Timestamp>,
    ) -> Result<(), PublishError> {
        let value = since.map(|t| t.to_string());
        self.merge_annotations(json!({keys::ANNOTATION_INVASIVE_WAITING: value}))
            .await
    }

    /// Merges `annotations` (a `null` value removes one) into the Node's: a merge patch, so
    /// the annotation belongs to no field manager and whoever writes last wins.
    async fn merge_annotations(&self, annotations: serde_json::Value) -> Result<(), PublishError> {
        let patch = json!({"metadata": {"annotations": annotations}});
        self.writer
            .merge(&self.node, patch, &OnConflict::LastWriterWins)
            .await
            .map_err(|source| PublishError::Apply {
                node: self.node.clone(),
                source,
            })?;
        Ok(())
    }

    /// `status.invasive` of `profile` (the fleet controller's slot count and queue), if any.
    pub async fn invasive_status(
        &self,
        profile: &str,
    ) -> Result<Option<railguard_api::invasive::InvasiveStatus>, PublishError> {
        let api = Api::<railguard_api::FabricProfile>::all(self.client.clone());
        let object = api
            .get_opt(profile)
            .await
            .map_err(|source| PublishError::GetProfile {
                profile: profile.to_string(),
                source,
            })?;
        Ok(object.and_then(|p| p.status).and_then(|s| s.invasive))
    }

    /// Clears `railguard.io/recertify` after honouring it (a merge patch: the annotation
    /// belongs to whoever set it, not to the prober's apply).
    pub async fn clear_recertify(&self) -> Result<(), PublishError> {
        self.merge_annotations(json!({keys::ANNOTATION_RECERTIFY: null}))
            .await
    }
}

fn placeholder(profile: &str, signature: &str) -> Certificate {
    let now = Timestamp::now();
    Certificate::new(profile, signature, Verdict::Pending, now, now)
}
