//! The extender's view of the cluster: Nodes (as [`NodeFabric`](railguard_api::NodeFabric)),
//! bound GPU pods (for gang locality), Namespaces (for exemptions) and FabricProfiles, each
//! kept current by the shell's watches (`railguard_extender_cli::cache::ClusterState`, in
//! `railguard_kube`'s stores). Pure: the values and indexes the decisions read, no IO.
//!
//! The node watch receives whole Nodes (status included); the node cache keeps only what
//! decisions read (name, labels, allocatable, the parsed certificate and the fleet outlier
//! mark of the `RailguardFleetOutlier` condition), never managedFields, images or the other
//! conditions, and parses each certificate once per Node change instead of once per
//! scheduling call.

mod node_index;
mod nodes;
mod placements;
mod profiles;

pub use node_index::NodeIndex;
pub use nodes::CachedNode;
pub use placements::{bound_pod, BoundPod, JobPlacements};
pub use profiles::ProfileSet;
