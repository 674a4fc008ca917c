//! Simulated nodes for the sim-* subcommands and `--sim`/`--sim-root` (tests and demos): the
//! shell builds them from `railguard-sim` and hands the library what real hardware would
//! give it, a sysfs root, an RDMA engine, a software source and an nccl-tests binary.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use railguard_sim::node::{rdma_model, STANDIN_BINARY};
use railguard_sim::rdma::SimulatedRdmaEngine;
use railguard_sim::software::ModelSoftware;
use railguard_sim::{write_sysfs, ModelSource, NodeModel, SIM_MODEL_PATH};

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
    pub fn run(&self) -> anyhow::Result<String> {
        // A YAML path, or the name of a built-in model.
        let model = ModelSource::resolve(&self.model.to_string_lossy(), None).load()?;
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

/// A simulated node whose sysfs tree exists at `root`.
pub struct SimulatedNode {
    pub model: NodeModel,
    pub root: PathBuf,
}

impl SimulatedNode {
    /// The node whose tree `sim-sysfs` (or an earlier `--sim`) wrote at `root`.
    pub fn from_tree(root: &Path) -> anyhow::Result<Self> {
        let path = root.join(SIM_MODEL_PATH);
        let model = NodeModel::load(&path).with_context(|| {
            format!(
                "cannot load the simulated node {} (write the tree with `railguard-prober sim-sysfs`)",
                path.display()
            )
        })?;
        Ok(SimulatedNode {
            model,
            root: root.to_path_buf(),
        })
    }

    /// Loads the model `source` and (re)writes its tree at `root`.
    pub fn write(source: &ModelSource, root: &Path) -> anyhow::Result<Self> {
        let model = source
            .load()
            .with_context(|| format!("cannot load node model {source}"))?;
        write_sysfs(&model, root)
            .with_context(|| format!("cannot write the simulated sysfs at {}", root.display()))?;
        Ok(SimulatedNode {
            model,
            root: root.to_path_buf(),
        })
    }

    /// The node's RDMA engine (its model's rails) as `node`.
    pub fn engine(&self, node: &str) -> anyhow::Result<SimulatedRdmaEngine> {
        SimulatedRdmaEngine::new(rdma_model(&self.model, node))
            .context("invalid simulated RDMA model")
    }

    /// The node's software facts.
    pub fn software(&self) -> ModelSoftware {
        ModelSoftware::new(&self.root, self.model.software.clone())
    }
}

/// The simulated `all_reduce_perf`, installed next to this binary.
pub fn standin_path() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the prober binary")?;
    let dir = exe.parent().context("prober binary has no directory")?;
    let p = dir.join(STANDIN_BINARY);
    if !p.is_file() {
        bail!(
            "simulated all_reduce_perf not found at {} (build it with `cargo build -p railguard-sim`, or pass --nccl-binary)",
            p.display()
        );
    }
    Ok(p)
}
