//! railguard's kube-scheduler extender: keeps training pods off nodes whose RDMA fabric is
//! uncertified, expired or regressed, and prefers nodes with bandwidth headroom close to the
//! job's other pods. A node the fleet controller marked an outlier of its profile's fleet
//! (condition `RailguardFleetOutlier`) ranks last for a job's pods, or fails the filter where
//! the profile says `spec.fleet.outliers: Filter`.
//!
//! The decisions ([`decision::filter`], [`decision::prioritize`]) are pure functions over
//! [`railguard_api::NodeFabric`] values; [`server`] adapts the scheduler's HTTP protocol
//! ([`wire`]) and [`cache`] keeps the cluster state the decisions read.
#![forbid(unsafe_code)]

pub mod cache;
pub mod decision;
pub mod error;
pub mod pod;
pub mod wire;

pub use decision::{
    filter, prioritize, target_for, ExtenderConfig, FilterVerdicts, NodeSlot, PodTarget,
    RejectReason, Rejection,
};
pub use error::ExtenderError;
pub use pod::PodFacts;
