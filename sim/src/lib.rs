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
        source: serde_yaml_ng::Error,
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

/// The node model file `--sim` names: a YAML path, or a model name in `models_dir`
/// (default: the models shipped in the source tree).
pub fn model_path(sim: &str, models_dir: Option<&std::path::Path>) -> std::path::PathBuf {
    let p = std::path::PathBuf::from(sim);
    if p.is_file() {
        return p;
    }
    let dir = models_dir
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    dir.join(format!("{sim}.yaml"))
}
