//! Where a certification runs: this node, its FabricProfile, the simulation or the real
//! engines, and the Kubernetes client ([`NodeArgs::context`]); shared by `certify` and the
//! daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::certification::NodeContext;
use anyhow::Context;
use clap::{Args, ValueHint};
use kube::Client;
use railguard_api::profile::matching_profile;
use railguard_api::profile::NcclRunner;
use railguard_api::FabricProfile;
use railguard_prober::certify::run::{HostSoftware, NodeSetup, SoftwareSource};
use railguard_prober::nccl::native::NativeNccl;
use railguard_prober::publish::NodePublisher;
use railguard_prober::rdma::{GpuMemory, RdmaEngine, VerbsEngine};
use railguard_runtime::StartupError;
use railguard_sim::node::standin_env;
use railguard_sim::ModelSource;

use crate::discover::check_sysfs_root;
use crate::profile_source::UnusableProfile;
use crate::sim::{standin_path, SimulatedNode};

/// Node, profile, simulation and cluster options shared by `certify` and `daemon`.
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// This node's name (the Node object); defaults to the host name.
    #[arg(long, env = "RAILGUARD_NODE_NAME")]
    pub node: Option<String>,
    /// FabricProfile name: which profile of the cluster (or of --profile-file) to certify
    /// against (default: the one matching this node's rail layout, else the default one).
    #[arg(long, alias = "profile-name", env = "RAILGUARD_PROFILE")]
    pub profile: Option<String>,
    /// Read the FabricProfiles from this YAML file instead of the cluster.
    #[arg(long, env = "RAILGUARD_PROFILE_FILE", value_hint = ValueHint::FilePath)]
    pub profile_file: Option<PathBuf>,
    /// Simulate this node model (a name from the models directory, or a YAML path); its
    /// sysfs tree is written at start (test and demo only).
    #[arg(long, env = "RAILGUARD_SIM", conflicts_with = "sim_root")]
    pub sim: Option<String>,
    /// Simulate the node whose tree already exists here (written by `sim-sysfs`): read as
    /// the sysfs root as it is, with RDMA and NCCL simulated from its
    /// `railguard-sim/model.yaml` (test and demo only). Faults written into the tree are seen.
    #[arg(long, env = "RAILGUARD_SIM_ROOT", value_hint = ValueHint::DirPath, conflicts_with = "sysfs_root")]
    pub sim_root: Option<PathBuf>,
    /// Run `--sim`/`--sim-root` even on a machine whose /sys/class/infiniband lists RDMA
    /// devices (a simulated certificate must never stand for real hardware by accident).
    #[arg(long, env = "RAILGUARD_SIM_ON_RDMA_HOST")]
    pub sim_on_rdma_host: bool,
    /// Where node models live (for `--sim NAME`).
    #[arg(long, env = "RAILGUARD_MODELS_DIR", value_hint = ValueHint::DirPath)]
    pub models_dir: Option<PathBuf>,
    /// sysfs root to read (`/` on a node; the simulated tree with `--sim`).
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", value_hint = ValueHint::DirPath)]
    pub sysfs_root: Option<PathBuf>,
    /// kubeconfig for publishing; in-cluster config when absent.
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// nccl-tests binary, overriding the profile's (with `--sim`: the stand-in).
    #[arg(long, env = "RAILGUARD_NCCL_BINARY", value_hint = ValueHint::FilePath)]
    pub nccl_binary: Option<PathBuf>,
    /// The only paths a FabricProfile's `certification.ncclTests.binary` may name (set at
    /// install time): editing a profile must not run an arbitrary binary on every node.
    #[arg(
        long,
        env = "RAILGUARD_ALLOWED_NCCL_BINARIES",
        value_delimiter = ',',
        default_value = "/usr/local/bin/all_reduce_perf"
    )]
    pub allowed_nccl_binaries: Vec<String>,
    /// The CUDA driver library for GPU-memory RDMA tests (default: `libcuda.so.1` from the
    /// loader's path). Loaded at run time: a node without it still certifies host memory,
    /// and its GPU-memory rails say why they could not be measured.
    #[arg(long, env = "RAILGUARD_CUDA_LIBRARY", value_hint = ValueHint::FilePath)]
    pub cuda_library: Option<PathBuf>,
    /// The NCCL library of the prober's own collectives, the native loopback
    /// (`certification.ncclRunner: Native`, the default) and the campaign's pair tests
    /// (default: the image's `/usr/lib/railguard/nccl/libnccl.so.2` where it exists, else
    /// `libnccl.so.2` from the loader's path), loaded at run time like the CUDA driver.
    #[arg(long, env = "RAILGUARD_NCCL_LIBRARY", value_hint = ValueHint::FilePath)]
    pub nccl_library: Option<PathBuf>,
    /// Directory for NCCL debug logs of each run.
    #[arg(long, env = "RAILGUARD_LOG_DIR", default_value = "/tmp/railguard-nccl", value_hint = ValueHint::DirPath)]
    pub log_dir: PathBuf,
    /// Kill an NCCL run after this many seconds.
    #[arg(long, env = "RAILGUARD_NCCL_TIMEOUT_SECS", default_value_t = 1800)]
    pub nccl_timeout_secs: u64,
}

/// Refuses simulation where `class_dir` (`/sys/class/infiniband`) lists RDMA devices.
pub fn refuse_sim_on_rdma_host(class_dir: &std::path::Path) -> anyhow::Result<()> {
    let mut devices: Vec<String> = match std::fs::read_dir(class_dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => return Ok(()),
    };
    if devices.is_empty() {
        return Ok(());
    }
    devices.sort();
    anyhow::bail!(
        "refusing --sim on a machine with RDMA devices ({}): a simulated certificate must not stand for this node's hardware; pass --sim-on-rdma-host to simulate anyway",
        devices.join(", ")
    )
}

impl NodeArgs {
    pub fn node_name(&self) -> anyhow::Result<String> {
        if let Some(n) = &self.node {
            return Ok(n.clone());
        }
        let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("no --node given and the host name is unreadable")?;
        Ok(h.trim().to_string())
    }

    /// The node model `--sim` names.
    fn model_source(&self, sim: &str) -> ModelSource {
        ModelSource::resolve(sim, self.models_dir.as_deref())
    }

    pub async fn client(&self, required: bool) -> anyhow::Result<Option<Client>> {
        if self.kubeconfig.is_none() && !required {
            return Ok(None);
        }
        let client = crate::cluster_client(self.kubeconfig.as_deref()).await?;
        Ok(Some(client))
    }

    /// Resolves node, profile, simulation and engines (publishing with `client`). A `--sim`
    /// model's sysfs tree is (re)written first.
    pub async fn context(&self, client: Option<Client>) -> anyhow::Result<NodeContext> {
        let node = self.node_name()?;
        if (self.sim.is_some() || self.sim_root.is_some()) && !self.sim_on_rdma_host {
            refuse_sim_on_rdma_host(std::path::Path::new("/sys/class/infiniband"))?;
        }
        let sim = match (&self.sim, &self.sim_root) {
            (_, Some(root)) => Some(SimulatedNode::from_tree(root)?),
            (Some(name), None) => {
                let root = self
                    .sysfs_root
                    .clone()
                    .unwrap_or_else(|| std::env::temp_dir().join(format!("railguard-sim-{node}")));
                Some(SimulatedNode::write(&self.model_source(name), &root)?)
            }
            (None, None) => None,
        };
        let sysfs_root = match &sim {
            Some(s) => s.root.clone(),
            None => {
                let root = self
                    .sysfs_root
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/"));
                check_sysfs_root(&root, "--sysfs-root")?;
                root
            }
        };
        let profile = self
            .resolve_profile(client.as_ref(), &node, &sysfs_root)
            .await?;
        let (engine, software): (Arc<dyn RdmaEngine>, Arc<dyn SoftwareSource>) = match &sim {
            Some(s) => {
                let mut engine = s.engine(&node)?;
                // A simulated node with a CUDA library given (the test double in tests)
                // allocates its GPU buffers through the real driver path.
                if self.cuda_library.is_some() {
                    engine = engine.with_gpu_memory(self.gpu_memory(&sysfs_root, &profile));
                }
                (Arc::new(engine), Arc::new(s.software()))
            }
            None => (
                Arc::new(VerbsEngine {
                    gpu_memory: self.gpu_memory(&sysfs_root, &profile),
                    ..VerbsEngine::new()
                }),
                Arc::new(HostSoftware {
                    sysfs_root: sysfs_root.clone(),
                    use_nvml: true,
                }),
            ),
        };
        let native = profile.spec.certification.nccl_runner == NcclRunner::Native;
        let mut nccl_env = match &sim {
            Some(_) => standin_env(&sysfs_root, &node),
            None => Vec::new(),
        };
        let nccl_binary = match (&sim, &self.nccl_binary) {
            (_, Some(b)) => b.clone(),
            // Never run for a native profile: the image then needs no stand-in.
            (Some(_), None) if native => standin_path().unwrap_or_default(),
            (Some(_), None) => standin_path()?,
            (None, None) => {
                let spec = &profile.spec.certification.nccl_tests;
                if !native && !spec.binary_is_allowed(&self.allowed_nccl_binaries) {
                    // A profile edit, not the install: the daemon waits for it to be fixed.
                    return Err(UnusableProfile::binary_not_allowed(format!(
                        "FabricProfile {} names ncclTests.binary {}, which this prober may not run: \
                         the allowed binaries are {} (--allowed-nccl-binaries); fix the profile, \
                         or add the path to --allowed-nccl-binaries at install time (the chart's \
                         prober.allowedNcclBinaries)",
                        profile.name(),
                        spec.binary,
                        self.allowed_nccl_binaries.join(", ")
                    ))
                    .into());
                }
                PathBuf::from(&spec.binary)
            }
        };
        let mut native_nccl = NativeNccl {
            cuda_library: self.cuda_library.clone(),
            nccl_library: self.nccl_library.clone(),
            ..NativeNccl::new(
                std::env::current_exe()
                    .context("the native NCCL loopback runs this executable's nccl-ranks")?,
            )
        };
        if let (Some(s), true) = (&sim, native) {
            // A simulated node's NCCL is the test doubles, loaded by path as a node's
            // libraries are (given ones, the chart's gpuLibraries say, else built here), and
            // behaving as its model says.
            nccl_env.extend(railguard_sim::native::doubles_env(&s.model, &sysfs_root));
            if native_nccl.cuda_library.is_none() || native_nccl.nccl_library.is_none() {
                let built = railguard_sim::native::doubles(&sysfs_root)?;
                native_nccl.cuda_library.get_or_insert(built.cuda);
                native_nccl.nccl_library.get_or_insert(built.nccl);
            }
            native_nccl.max_message_bytes = Some(railguard_sim::native::MAX_MESSAGE_BYTES);
        }
        let setup = NodeSetup {
            sysfs_root,
            use_nvml: sim.is_none(),
            engine,
            nccl_binary,
            nccl_env,
            native_nccl,
            log_dir: self.log_dir.join(&node),
            nccl_timeout: Duration::from_secs(self.nccl_timeout_secs),
            software,
            simulated: sim.is_some(),
        };
        let publisher = client.map(|c| NodePublisher::new(c, node.clone()));
        Ok(NodeContext {
            node,
            profile,
            setup,
            publisher,
        })
    }

    /// GPU memory for the GPUDirect RDMA tests: the node's GPUs by railguard's index (as
    /// discovery numbers them, so a rail's GPU is the one its profile names) and the profile's
    /// registration setting. A node whose sysfs cannot be read has no GPUs to offer; the rails
    /// then report GPU memory as unavailable.
    fn gpu_memory(&self, sysfs_root: &Path, profile: &FabricProfile) -> GpuMemory {
        let gpus = match railguard_prober::discover::discover(sysfs_root, true) {
            Ok(d) => d.gpus,
            Err(e) => {
                tracing::warn!(error = %railguard_runtime::error_chain(&e), "cannot list GPUs for GPU-memory tests");
                Vec::new()
            }
        };
        GpuMemory::new(
            self.cuda_library.clone(),
            profile.spec.certification.gpu_registration,
            gpus.into_iter().map(|g| (g.index, g.pci_bus_id)).collect(),
        )
    }

    async fn resolve_profile(
        &self,
        client: Option<&Client>,
        node: &str,
        root: &Path,
    ) -> anyhow::Result<FabricProfile> {
        // In a cluster each profile is decoded on its own: an invalid one is skipped (and
        // named when this node would need it), never a failed list.
        let (profiles, invalid) =
            match (&self.profile_file, client) {
                (Some(path), _) => (
                    railguard_runtime::read_profiles(path, "--profile-file")?,
                    Vec::new(),
                ),
                (None, Some(c)) => crate::profile_source::cluster_profiles(c).await?,
                (None, None) => return Err(StartupError::new(
                    "no FabricProfiles to certify against",
                    "no --profile-file and no cluster",
                    "pass --profile-file FILE, or --kubeconfig (in a cluster: the service account)",
                )
                .into()),
            };
        if let Some(name) = &self.profile {
            if let Some(bad) = invalid.iter().find(|p| &p.name == name) {
                return Err(
                    UnusableProfile::invalid(format!("{bad} (--profile)"), &invalid).into(),
                );
            }
            let source = match &self.profile_file {
                Some(p) => format!("{} (--profile-file)", p.display()),
                None => "the cluster".to_string(),
            };
            let names: Vec<&str> = profiles.iter().map(|p| p.name()).collect();
            let held = format!("it holds {}", names.join(", "));
            let found = profiles.iter().find(|p| p.name() == name).cloned();
            if found.is_none() && self.profile_file.is_none() {
                // Not created yet, perhaps: the daemon waits for it.
                let msg =
                    format!("no FabricProfile named {name} (--profile) in the cluster ({held})");
                return Err(UnusableProfile::none(msg, &invalid).into());
            }
            return found
                .ok_or_else(|| {
                    StartupError::new(
                        format!("no FabricProfile named {name} (--profile) in {source}"),
                        held,
                        "name one of them, or omit --profile to pick the one matching this node's rail layout",
                    )
                    .into()
                });
        }
        // One profile is this node's only when no other was skipped as invalid.
        if profiles.len() == 1 && invalid.is_empty() {
            return profiles.into_iter().next().context("no profile");
        }
        // Several: the one whose rail layout this node has, else the default.
        if let Ok(found) = railguard_prober::discover::discover(root, false) {
            if let Some(p) = matching_profile(&profiles, &found.rail_layout()) {
                return Ok(p.clone());
            }
        }
        if let Some(p) = profiles.into_iter().find(|p| p.spec.default) {
            return Ok(p);
        }
        let mut msg =
            format!("no FabricProfile matches node {node}'s rail layout and none is default");
        for p in &invalid {
            msg.push_str(&format!("; skipped {p}"));
        }
        Err(UnusableProfile::none(msg, &invalid).into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::refuse_sim_on_rdma_host;

    #[test]
    fn simulation_is_refused_where_rdma_devices_exist() {
        let dir = tempfile::tempdir().unwrap();
        let class = dir.path().join("infiniband");
        assert!(
            refuse_sim_on_rdma_host(&class).is_ok(),
            "no class directory"
        );
        std::fs::create_dir(&class).unwrap();
        assert!(refuse_sim_on_rdma_host(&class).is_ok(), "no devices");
        std::fs::create_dir(class.join("mlx5_0")).unwrap();
        std::fs::create_dir(class.join("mlx5_1")).unwrap();
        let e = refuse_sim_on_rdma_host(&class).unwrap_err().to_string();
        assert!(e.contains("RDMA devices (mlx5_0, mlx5_1)"), "{e}");
        assert!(e.contains("--sim-on-rdma-host"), "{e}");
    }
}
