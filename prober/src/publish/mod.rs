//! Publishing a certificate on the Node: one server-side apply (field manager
//! `railguard-prober`) for the labels and the certificate annotation, the
//! `RailguardFabricReady` condition through the status subresource, and an Event on the Node
//! (Certified, CertificationFailed, Regressed).
//!
//! A run reads the Node once ([`NodePublisher::read_state`], a [`NodeState`]) and every later
//! write works from that snapshot, updating it as it goes.

mod state;

pub use state::{ConditionSeen, NodeState};

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use railguard_api::{keys, Certificate, Verdict};
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
}

/// The Event a published certificate deserves, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// `Certified`, `CertificationFailed` or `Regressed`.
    pub reason: &'static str,
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    pub message: String,
}

/// Pure: which Event (if any) a new certificate calls for. A passive check that changes
/// nothing records no Event; every invasive result does.
pub fn event_for(
    cert: &Certificate,
    previous: Option<&Certificate>,
    invasive: bool,
) -> Option<NodeEvent> {
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

/// Writes to one Node.
#[derive(Clone)]
pub struct NodePublisher {
    client: Client,
    node: String,
}

impl NodePublisher {
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        NodePublisher {
            client,
            node: node.into(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Reads the Node once: what a run needs to know of it ([`NodeState`]).
    pub async fn read_state(&self) -> Result<NodeState, PublishError> {
        let node = self
            .nodes()
            .get(&self.node)
            .await
            .map_err(|source| PublishError::GetNode {
                node: self.node.clone(),
                source,
            })?;
        Ok(NodeState::of(&node))
    }

    async fn apply_metadata(
        &self,
        labels: BTreeMap<&str, &str>,
        annotation: Option<String>,
    ) -> Result<(), PublishError> {
        let mut annotations = serde_json::Map::new();
        if let Some(a) = annotation {
            annotations.insert(keys::ANNOTATION_CERTIFICATE.into(), json!(a));
        }
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": labels,
                "annotations": annotations,
            }
        });
        let pp = PatchParams::apply(keys::PROBER_FIELD_MANAGER).force();
        self.nodes()
            .patch(&self.node, &pp, &Patch::Apply(&patch))
            .await
            .map_err(|source| PublishError::Apply {
                node: self.node.clone(),
                source,
            })?;
        Ok(())
    }

    /// Marks the node `pending` while an invasive run is under way, keeping the previous
    /// certificate (so no job lands mid-test, and nothing is lost if the run dies).
    pub async fn mark_pending(
        &self,
        state: &mut NodeState,
        profile: &str,
        signature: &str,
    ) -> Result<(), PublishError> {
        let previous = state.certificate.as_ref();
        let annotation = match previous {
            Some(c) => Some(
                c.to_annotation()
                    .map_err(|source| PublishError::Encode { source })?,
            ),
            None => None,
        };
        let labels = BTreeMap::from([
            (keys::LABEL_FABRIC, keys::fabric::PENDING),
            (keys::LABEL_PROFILE, profile),
            (keys::LABEL_SIGNATURE, signature),
        ]);
        self.apply_metadata(labels, annotation).await?;
        let pending = Certificate {
            verdict: Verdict::Pending,
            ..previous
                .cloned()
                .unwrap_or_else(|| placeholder(profile, signature))
        };
        self.set_condition(state, &pending).await
    }

    /// Publishes a certificate: labels + annotation (one apply), condition, Event. The
    /// certificate `state` held is the previous one; afterwards `state` holds `cert`.
    pub async fn publish(
        &self,
        state: &mut NodeState,
        cert: &Certificate,
        invasive: bool,
    ) -> Result<(), PublishError> {
        let annotation = cert
            .to_annotation()
            .map_err(|source| PublishError::Encode { source })?;
        let labels = BTreeMap::from([
            (keys::LABEL_FABRIC, cert.verdict.as_label()),
            (keys::LABEL_PROFILE, cert.profile.as_str()),
            (keys::LABEL_SIGNATURE, cert.signature.as_str()),
        ]);
        self.apply_metadata(labels, Some(annotation)).await?;
        self.set_condition(state, cert).await?;
        if let Some(ev) = event_for(cert, state.certificate.as_ref(), invasive) {
            self.record_event(state, &ev).await?;
        }
        state.certificate = Some(cert.clone());
        Ok(())
    }

    async fn set_condition(
        &self,
        state: &mut NodeState,
        cert: &Certificate,
    ) -> Result<(), PublishError> {
        let (status, reason, message) = condition_for(cert);
        let now = Timestamp::now();
        // Keep lastTransitionTime when the status did not change.
        let transition = match &state.condition {
            Some(c) if c.status == status => c.last_transition.unwrap_or(now),
            _ => now,
        };
        // A strategic merge patch (conditions merge by type): before Kubernetes 1.22 managed
        // fields do not tell the status subresource apart, so an apply here by the same
        // manager would drop the labels and annotation that manager applied.
        let patch = json!({
            "status": {
                "conditions": [{
                    "type": keys::CONDITION_FABRIC_READY,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now.to_string(),
                    "lastTransitionTime": transition.to_string(),
                }]
            }
        });
        let pp = PatchParams {
            field_manager: Some(keys::PROBER_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        self.nodes()
            .patch_status(&self.node, &pp, &Patch::Strategic(&patch))
            .await
            .map_err(|source| PublishError::Condition {
                node: self.node.clone(),
                source,
            })?;
        state.condition = Some(ConditionSeen {
            status: status.to_string(),
            last_transition: Some(transition),
        });
        Ok(())
    }

    async fn record_event(&self, state: &NodeState, ev: &NodeEvent) -> Result<(), PublishError> {
        let now = Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.railguard-", self.node)),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.node.clone()),
                uid: state.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some(ev.reason.into()),
            message: Some(ev.message.clone()),
            type_: Some(ev.kind.into()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some(keys::PROBER_FIELD_MANAGER.into()),
            reporting_instance: Some(self.node.clone()),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some(keys::PROBER_FIELD_MANAGER.into()),
                host: Some(self.node.clone()),
            }),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &event)
            .await
            .map_err(|source| PublishError::Event {
                node: self.node.clone(),
                source,
            })?;
        Ok(())
    }

    /// Clears `railguard.io/recertify` after honouring it (a merge patch: the annotation
    /// belongs to whoever set it, not to the prober's apply).
    pub async fn clear_recertify(&self) -> Result<(), PublishError> {
        let patch = json!({"metadata": {"annotations": {keys::ANNOTATION_RECERTIFY: null}}});
        self.nodes()
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| PublishError::Apply {
                node: self.node.clone(),
                source,
            })?;
        Ok(())
    }
}

fn placeholder(profile: &str, signature: &str) -> Certificate {
    let now = Timestamp::now();
    Certificate {
        version: railguard_api::certificate::CERTIFICATE_VERSION,
        generation: 0,
        issued_at: now,
        expires_at: now,
        profile: profile.to_string(),
        signature: signature.to_string(),
        node: None,
        verdict: Verdict::Pending,
        reasons: Vec::new(),
        rails: Vec::new(),
        gpus: Vec::new(),
        nccl: None,
        findings: Vec::new(),
        software: BTreeMap::new(),
        passive_checked_at: None,
        history: Vec::new(),
        extra: BTreeMap::new(),
    }
}
