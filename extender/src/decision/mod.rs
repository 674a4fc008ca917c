//! The extender's decisions, pure over plain data: which profile a pod is held to, which
//! nodes pass, and how the passing nodes rank.

mod check;
mod config;
mod filter;
mod prioritize;
mod rejection;
mod target;

pub use check::{check_node, precheck, Precheck};
pub use config::ExtenderConfig;
pub use filter::{filter, filter_by, FilterVerdicts, NodeSlot};
pub use prioritize::{
    prioritize, prioritize_scores, shift_lowest_to_zero, topology_keys_for, JobTopology,
    TopologyInterner,
};
pub use rejection::{RejectReason, Rejection};
pub use target::{in_pool, target_for, PodTarget, Unplaceable};
