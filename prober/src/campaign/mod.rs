//! Multi-node rail campaigns: pairwise RDMA tests between nodes of a profile, rail by rail,
//! that say which node, rail or link is at fault without testing all N² pairs.
//!
//! - [`plan`]: the pure planner and localization rules (no IO).

pub mod plan;
