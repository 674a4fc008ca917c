//! `railguard-prober sim-sysfs --model FILE --out DIR`: writes a synthetic sysfs tree.

use std::path::PathBuf;

use clap::Args;

use super::{write_sysfs, ModelError, NodeModel};

/// `railguard-prober sim-sysfs --model FILE --out DIR`
#[derive(Args, Debug, Clone)]
pub struct SimSysfsArgs {
    /// Node model YAML (see prober/models/).
    #[arg(long, env = "RAILGUARD_SIM_MODEL")]
    pub model: PathBuf,
    /// Directory to write the tree under (use it as --sysfs-root).
    #[arg(long, env = "RAILGUARD_SIM_OUT")]
    pub out: PathBuf,
}

impl SimSysfsArgs {
    pub fn run(&self) -> Result<String, ModelError> {
        let model = NodeModel::load(&self.model)?;
        write_sysfs(&model, &self.out)?;
        Ok(format!(
            "wrote model {} ({} GPUs, {} HCAs) under {}\n",
            model.name,
            model.gpus().len(),
            model.hcas().len(),
            self.out.display()
        ))
    }
}
