//! Simulated nodes: the node model ([`NodeModel`]) and the synthetic sysfs tree generator
//! ([`write_sysfs`]) that the real discovery code reads.

pub mod cli;
mod load;
mod model;
mod sysfs;

pub use model::{
    Fault, GpuModel, HcaModel, HostBridgeModel, IommuMode, LinkModel, ModelPortState,
    NcclBehaviour, NicModel, NodeModel, PciNodeModel, PlatformModel, PortModel, SocketModel,
    SoftwareVersions, SwitchModel, WriteBw,
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
        source: serde_yaml::Error,
    },
    #[error("model {model}: {message}")]
    Invalid { model: String, message: String },
    #[error("cannot write sysfs tree at {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
