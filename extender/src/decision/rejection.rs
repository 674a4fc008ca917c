//! Why a node was rejected ([`RejectReason`]) and the message the scheduler shows
//! ([`Rejection`]).

use std::sync::Arc;

/// Why a node was rejected; also the `reason` label of the rejection metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectReason {
    NoCertificate,
    Unreadable,
    Pending,
    Failed,
    Degraded,
    Expired,
    OtherProfile,
    OtherSignature,
    RailMissing,
    RailUnhealthy,
    RailBelowThreshold,
    BusbwBelowThreshold,
    /// The fleet controller marked the node an outlier and the profile filters outliers.
    FleetOutlier,
    /// The certificate was made by a simulated engine and the profile does not set
    /// `certification.acceptSimulated`.
    Simulated,
    NotCached,
    Unplaceable,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::NoCertificate => "no_certificate",
            RejectReason::Unreadable => "unreadable",
            RejectReason::Pending => "pending",
            RejectReason::Failed => "failed",
            RejectReason::Degraded => "degraded",
            RejectReason::Expired => "expired",
            RejectReason::OtherProfile => "other_profile",
            RejectReason::OtherSignature => "other_signature",
            RejectReason::RailMissing => "rail_missing",
            RejectReason::RailUnhealthy => "rail_unhealthy",
            RejectReason::RailBelowThreshold => "rail_below_threshold",
            RejectReason::BusbwBelowThreshold => "busbw_below_threshold",
            RejectReason::FleetOutlier => "fleet_outlier",
            RejectReason::Simulated => "simulated",
            RejectReason::NotCached => "not_cached",
            RejectReason::Unplaceable => "unplaceable",
        }
    }

    /// Whether the node may become eligible without anyone repairing it: a pending
    /// certification finishes, an expired certificate is renewed, the cache catches up.
    /// Everything else needs a repair and a new certificate, so preemption on that node
    /// would evict pods for nothing.
    pub fn resolvable(self) -> bool {
        // Unplaceable (a profile that does not exist, or none to choose) is the pod's
        // problem, not the node's: preempting pods on any node cannot help it.
        matches!(
            self,
            RejectReason::Pending | RejectReason::Expired | RejectReason::NotCached
        )
    }
}

/// A rejected node: the reason and the one-line message the scheduler shows the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: RejectReason,
    /// Shared: a cached rejection is handed to every filter call without copying the text.
    pub message: Arc<str>,
}

impl Rejection {
    pub(crate) fn new(reason: RejectReason, message: impl AsRef<str>) -> Self {
        Rejection {
            reason,
            message: Arc::from(one_line(message.as_ref())),
        }
    }
}

/// Messages end up in one-line scheduling events; text from certificates may hold newlines.
fn one_line(s: &str) -> String {
    if s.contains(['\n', '\r']) {
        s.split(['\n', '\r'])
            .filter(|p| !p.trim().is_empty())
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        s.to_string()
    }
}

/// Bandwidths as operators write them: `196`, `196.4`.
pub(crate) fn num(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{:.0}", v.round())
    } else {
        format!("{v:.1}")
    }
}

pub(crate) fn first_reason(reasons: &[String]) -> String {
    match reasons {
        [] => String::new(),
        [one] => format!(": {one}"),
        [first, rest @ ..] => format!(": {first} (+{} more)", rest.len()),
    }
}
