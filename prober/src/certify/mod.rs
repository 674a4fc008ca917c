//! Certification: rail checks over a counters window, native RDMA and NCCL evidence, the
//! policy that turns evidence into a verdict ([`policy`], pure; passive healing: [`heal`]),
//! the node's history ([`history`]), the certificate record ([`record`]) and the comparison
//! matrix ([`matrix`]). [`run`] gathers the evidence on a node; one whole run (read the Node,
//! gather, assess, record, publish) is orchestrated by the prober shell (`certification`).

pub mod evidence;
pub mod heal;
pub mod history;
pub mod matrix;
pub mod policy;
pub mod record;
pub mod renewal;
pub mod run;
pub mod slots;

pub use evidence::{
    Evidence, NcclRunEvidence, PortReading, RailBench, ResourceExposure, ERROR_COUNTERS,
};
pub use policy::{assess, assess_passive, assess_passive_against, Assessment};
