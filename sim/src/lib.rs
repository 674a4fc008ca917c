//! railguard's simulation, kept out of the production crates: node models ([`NodeModel`],
//! the shipped ones built in: [`ModelSource`]),
//! the synthetic sysfs tree the real discovery code reads ([`write_sysfs`]), the simulated
//! RDMA engine ([`rdma::SimulatedRdmaEngine`], with a node model's rails and wire faults in
//! [`node`]), the software facts of a model ([`software::ModelSoftware`]), the
//! `all_reduce_perf` stand-in ([`standin`] and the `all_reduce_perf_sim` binary), the CUDA
//! and NCCL test doubles a simulated node's native NCCL loopback loads ([`native`]) and
//! synthetic certificates and Nodes ([`certificates`]), and fabrics with injected faults for
//! the campaign planner ([`campaign_faults`]).
//!
//! Production code reaches a simulated node only through the traits and paths real hardware
//! uses: a sysfs root, an [`railguard_prober::rdma::RdmaEngine`], a
//! [`railguard_prober::certify::run::SoftwareSource`], an nccl-tests binary and the
//! libraries of the native NCCL loopback.

mod builtin;
pub mod campaign_faults;
pub mod certificates;
mod load;
mod model;
pub mod native;
pub mod node;
pub mod rdma;
pub mod software;
pub mod standin;
mod sysfs;

pub use builtin::{builtin_model, ModelSource, BUILTIN_MODELS};
pub use model::{
    Fault, GpuModel, HcaModel, HostBridgeModel, IommuMode, LinkModel, ModelPortState,
    NcclBehaviour, NicModel, NodeModel, PciNodeModel, PlatformModel, PortModel, RoceGids,
    SocketModel, SoftwareVersions, SwitchModel, WriteBw,
};
pub use sysfs::{bump_counters, write_sysfs, SimulatedTree, SIM_MODEL_PATH};

/// A model could not be loaded, resolved or written.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read model {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse model {path}")]
    Yaml {
        path: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("no model file {name}, and no built-in model of that name (built in: {known})")]
    Unknown { name: String, known: String },
    #[error("model {model}: {message}")]
    Invalid { model: String, message: String },
    #[error("cannot write sysfs tree at {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
