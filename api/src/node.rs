//! Reading a Node into its fabric state. This is the one place that interprets the
//! labels and the certificate annotation; extender, webhook tests and demo all use it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::certificate::{human_duration, Certificate, Verdict};
use crate::fleet::OutlierMark;
use crate::keys;

/// The fabric state of a Node at a point in time.
#[derive(Clone, Debug, PartialEq)]
pub enum FabricState {
    /// No railguard label and no certificate: the prober never ran here.
    Absent,
    /// Certification is running or has not finished; `previous` is the last certificate.
    Pending { previous: Option<Box<Certificate>> },
    /// Certified and not expired.
    Certified(Box<Certificate>),
    /// Certified with at least one rail degraded; not eligible.
    Degraded(Box<Certificate>),
    /// The last certification failed.
    Failed(Box<Certificate>),
    /// The certificate expired `expired_for_secs` seconds ago and awaits renewal.
    Expired {
        certificate: Box<Certificate>,
        expired_for_secs: i64,
    },
    /// The Node carries railguard metadata we cannot trust; `reason` says why.
    Unreadable { reason: String },
}

impl FabricState {
    /// Short name for metrics and tables.
    pub fn kind(&self) -> &'static str {
        match self {
            FabricState::Absent => "absent",
            FabricState::Pending { .. } => "pending",
            FabricState::Certified(_) => "certified",
            FabricState::Degraded(_) => "degraded",
            FabricState::Failed(_) => "failed",
            FabricState::Expired { .. } => "expired",
            FabricState::Unreadable { .. } => "unreadable",
        }
    }

    /// The certificate behind the state, if any.
    pub fn certificate(&self) -> Option<&Certificate> {
        match self {
            FabricState::Certified(c) | FabricState::Degraded(c) | FabricState::Failed(c) => {
                Some(c)
            }
            FabricState::Expired { certificate, .. } => Some(certificate),
            FabricState::Pending { previous } => previous.as_deref(),
            FabricState::Absent | FabricState::Unreadable { .. } => None,
        }
    }
}

/// A Node as railguard sees it: name, fabric state and the labels used for placement.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeFabric {
    pub name: String,
    /// Value of `railguard.io/profile`, if labelled.
    pub profile: Option<String>,
    /// Value of `railguard.io/signature`, if labelled.
    pub signature: Option<String>,
    pub state: FabricState,
    /// All node labels (topology keys are read from here).
    pub labels: BTreeMap<String, String>,
    /// Allocatable extended resources and their quantities, as strings.
    pub allocatable: BTreeMap<String, String>,
    /// Set when the fleet controller marked the node an outlier of its profile's fleet
    /// (condition `RailguardFleetOutlier` is `True`).
    pub fleet_outlier: Option<OutlierMark>,
}

impl NodeFabric {
    /// Interprets a Node at time `now`. Never fails: bad metadata becomes
    /// [`FabricState::Unreadable`] with a reason an operator can act on.
    pub fn from_node(node: &Node, now: Timestamp) -> NodeFabric {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| a.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
            .unwrap_or_default();
        let certificate = Certificate::of_annotations(node.metadata.annotations.as_ref());
        let mut state = interpret_certificate(&labels, certificate, now);
        // A certificate counts only on the Node it names: copied elsewhere it proves nothing.
        if let Some(named) = state.certificate().and_then(|c| c.node.clone()) {
            if named != name {
                state = FabricState::Unreadable {
                    reason: format!(
                        "annotation {} is the certificate of node {named}, not {name}",
                        keys::ANNOTATION_CERTIFICATE
                    ),
                };
            }
        }
        let fleet_outlier = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == keys::CONDITION_FLEET_OUTLIER && c.status == "True")
            })
            .map(|c| OutlierMark {
                message: c.message.clone().unwrap_or_default(),
            });
        NodeFabric {
            name,
            profile: labels.get(keys::LABEL_PROFILE).cloned(),
            signature: labels.get(keys::LABEL_SIGNATURE).cloned(),
            state,
            labels,
            allocatable,
            fleet_outlier,
        }
    }
}

/// The pure core of [`NodeFabric::from_node`], from the annotation's text.
pub fn interpret(
    labels: &BTreeMap<String, String>,
    annotation: Option<&str>,
    now: Timestamp,
) -> FabricState {
    interpret_certificate(labels, annotation.map(Certificate::from_annotation), now)
}

/// [`interpret`] with the annotation already parsed ([`Certificate::of_annotations`]).
pub fn interpret_certificate(
    labels: &BTreeMap<String, String>,
    certificate: Option<Result<Certificate, crate::CertificateError>>,
    now: Timestamp,
) -> FabricState {
    let label = labels.get(keys::LABEL_FABRIC).map(String::as_str);
    let label_verdict = match label {
        None => None,
        Some(v) => match Verdict::from_label(v) {
            Some(v) => Some(v),
            None => {
                return FabricState::Unreadable {
                    reason: format!(
                        "label {}={v:?} is not certified, degraded, failed or pending",
                        keys::LABEL_FABRIC
                    ),
                }
            }
        },
    };
    let certificate = match certificate {
        None => None,
        Some(parsed) => match parsed {
            Ok(c) => Some(Box::new(c)),
            Err(e) => {
                return FabricState::Unreadable {
                    reason: format!(
                        "annotation {} is unreadable: {e}",
                        keys::ANNOTATION_CERTIFICATE
                    ),
                }
            }
        },
    };
    match (label_verdict, certificate) {
        (None, None) => FabricState::Absent,
        (Some(Verdict::Pending), previous) => FabricState::Pending { previous },
        (Some(v), None) => FabricState::Unreadable {
            reason: format!(
                "label {}={v} but the node has no certificate",
                keys::LABEL_FABRIC
            ),
        },
        (label, Some(cert)) => {
            if let Some(l) = label {
                if l != cert.verdict {
                    return FabricState::Unreadable {
                        reason: format!(
                            "label {}={l} disagrees with certificate verdict {}",
                            keys::LABEL_FABRIC,
                            cert.verdict
                        ),
                    };
                }
            }
            for (key, value) in [
                (keys::LABEL_PROFILE, &cert.profile),
                (keys::LABEL_SIGNATURE, &cert.signature),
            ] {
                if let Some(l) = labels.get(key) {
                    if l != value {
                        return FabricState::Unreadable {
                            reason: format!("label {key}={l} disagrees with certificate ({value})"),
                        };
                    }
                }
            }
            // The label is what a node affinity can see of the certificate's simulated
            // mark; a certificate without its label (or the reverse) is not to be trusted.
            let simulated = labels.get(keys::LABEL_SIMULATED).map(String::as_str);
            if simulated != cert.simulated_label() {
                return FabricState::Unreadable {
                    reason: match simulated {
                        Some(v) => format!(
                            "label {}={v} disagrees with the certificate ({})",
                            keys::LABEL_SIMULATED,
                            if cert.simulated {
                                "simulated"
                            } else {
                                "measured, not simulated"
                            }
                        ),
                        None => format!(
                            "the certificate is simulated but the node lacks label {}={}",
                            keys::LABEL_SIMULATED,
                            keys::SIMULATED
                        ),
                    },
                };
            }
            match cert.verdict {
                Verdict::Pending => FabricState::Pending {
                    previous: Some(cert),
                },
                Verdict::Failed => FabricState::Failed(cert),
                Verdict::Degraded => FabricState::Degraded(cert),
                Verdict::Certified => {
                    if cert.is_expired(now) {
                        let expired_for_secs = now.as_second() - cert.expires_at.as_second();
                        FabricState::Expired {
                            certificate: cert,
                            expired_for_secs,
                        }
                    } else {
                        FabricState::Certified(cert)
                    }
                }
            }
        }
    }
}

impl std::fmt::Display for FabricState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FabricState::Absent => f.write_str("no certificate"),
            FabricState::Pending { .. } => f.write_str("certification pending"),
            FabricState::Certified(c) => write!(f, "certified for {} ({})", c.profile, c.signature),
            FabricState::Degraded(c) => write!(f, "degraded: {}", c.reasons.join("; ")),
            FabricState::Failed(c) => write!(f, "failed: {}", c.reasons.join("; ")),
            FabricState::Expired {
                expired_for_secs, ..
            } => {
                write!(
                    f,
                    "certificate expired {} ago",
                    human_duration(*expired_for_secs)
                )
            }
            FabricState::Unreadable { reason } => write!(f, "unreadable: {reason}"),
        }
    }
}

/// An Event about a Node that railguard records (a certification's outcome, a healed rail,
/// the fleet controller's marks and upkeep): the values; the shells write the Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// `Certified`, `CertificationFailed`, `Regressed` or `RailHealedPassively`.
    pub reason: &'static str,
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    pub message: String,
}

/// Where Events about cluster-scoped objects (Nodes, FabricProfiles) are recorded.
pub const EVENT_NAMESPACE: &str = "default";

/// The longest Event message railguard writes, in characters (events.k8s.io caps a note at
/// 1 KiB; `kubectl describe` shows no more).
pub const EVENT_MESSAGE_CHARS: usize = 1024;

impl NodeEvent {
    /// The core v1 Event about `involved`, reported by `component` from `instance`, at `now`.
    /// Core v1, in [`EVENT_NAMESPACE`]: Kubernetes 1.20's events.k8s.io/v1 refuses a
    /// cluster-scoped `regarding` in a namespace.
    pub fn to_event(
        &self,
        involved: ObjectReference,
        component: &str,
        instance: &str,
        now: Timestamp,
    ) -> Event {
        let name = involved.name.clone().unwrap_or_default();
        Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.railguard-")),
                namespace: Some(EVENT_NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            involved_object: involved,
            reason: Some(self.reason.into()),
            message: Some(self.message.chars().take(EVENT_MESSAGE_CHARS).collect()),
            type_: Some(self.kind.into()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some(component.into()),
            reporting_instance: Some(instance.into()),
            source: Some(EventSource {
                component: Some(component.into()),
                host: Some(instance.into()),
            }),
            ..Event::default()
        }
    }
}

/// The reference an Event about Node `name` carries.
pub fn node_reference(name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_string()),
        uid,
        ..ObjectReference::default()
    }
}
