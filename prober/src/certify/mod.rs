//! Certification: rail checks over a counters window, native RDMA and NCCL evidence, the
//! policy that turns evidence into a verdict ([`policy`], pure), the node's history
//! ([`history`]), the certificate record ([`record`]) and the comparison matrix
//! ([`matrix`]). [`run`] is the shell that gathers the evidence on a node.

pub mod cli;
pub mod evidence;
pub mod history;
pub mod matrix;
pub mod policy;
pub mod record;
pub mod run;

pub use evidence::{
    Evidence, NcclRunEvidence, PortReading, RailBench, ResourceExposure, ERROR_COUNTERS,
};
pub use policy::{assess, assess_passive, Assessment};
