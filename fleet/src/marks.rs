//! What the fleet controller writes on a Node: the `RailguardFleetOutlier` condition it
//! wants there, and the Event a change of it deserves. Pure: the controller compares what
//! [`node_condition`] wants with what the Node carries and writes only a difference.

use railguard_api::fleet::reason;

use super::{FleetAnalysis, FleetNode};
use railguard_api::node::NodeEvent;

/// The most outlier marks a condition message names (the worst ones); the rest are counted.
pub const MAX_MARKS_IN_MESSAGE: usize = 4;

/// The `RailguardFleetOutlier` condition a node should carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedCondition {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The condition for `member` of `analysis.nodes`, or for a node outside the fleet (`None`).
pub fn node_condition(analysis: &FleetAnalysis, member: Option<&FleetNode>) -> WantedCondition {
    if let Some(why) = &analysis.no_baseline {
        return WantedCondition {
            status: "Unknown",
            reason: reason::NO_BASELINE,
            message: format!("profile {} has no fleet baseline: {why}", analysis.profile),
        };
    }
    match member {
        Some(n) if n.certified => {}
        Some(n) => {
            return WantedCondition {
                status: "Unknown",
                reason: reason::NO_BASELINE,
                message: format!(
                    "the node is {}: only certified nodes are held to the fleet baseline",
                    n.state
                ),
            }
        }
        None => {
            return WantedCondition {
                status: "Unknown",
                reason: reason::NO_BASELINE,
                message: format!("the node is not in profile {}'s fleet", analysis.profile),
            }
        }
    }
    let node = member.map(|n| n.name.as_str()).unwrap_or_default();
    match analysis.outliers.get(node) {
        Some(marks) => {
            let mut message = marks
                .iter()
                .take(MAX_MARKS_IN_MESSAGE)
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            if marks.len() > MAX_MARKS_IN_MESSAGE {
                message.push_str(&format!(
                    "; and {} more",
                    marks.len() - MAX_MARKS_IN_MESSAGE
                ));
            }
            message.push_str(&format!(
                " (profile {}, {} certified nodes)",
                analysis.profile, analysis.certified
            ));
            WantedCondition {
                status: "True",
                reason: reason::OUTLIER,
                message,
            }
        }
        None => WantedCondition {
            status: "False",
            reason: reason::WITHIN_BASELINE,
            message: format!(
                "every measurement is within the fleet baseline of profile {} ({} certified nodes)",
                analysis.profile, analysis.certified
            ),
        },
    }
}

/// The Event for a change of the condition from `previous_status` (what the Node carried,
/// `None` when it had no such condition) to `wanted`: becoming an outlier is a Warning,
/// ceasing to be one a Normal event; other changes are not news.
pub fn mark_event(previous_status: Option<&str>, wanted: &WantedCondition) -> Option<NodeEvent> {
    let was = previous_status == Some("True");
    let is = wanted.status == "True";
    match (was, is) {
        (false, true) => Some(NodeEvent {
            kind: "Warning",
            reason: reason::OUTLIER,
            message: wanted.message.clone(),
        }),
        (true, false) => Some(NodeEvent {
            kind: "Normal",
            reason: reason::OUTLIER_CLEARED,
            message: wanted.message.clone(),
        }),
        _ => None,
    }
}
