//! `--gpu-resources`: what makes a pod a GPU pod, for the daemon (no invasive run while one
//! is on the node) and the campaign (such a node is left out, and its endpoint refuses).

use clap::Args;
use railguard_api::FabricProfile;

#[derive(Args, Debug, Clone)]
pub struct GpuResourceArgs {
    /// Resources that make a pod a GPU pod: names, or patterns where `*` stands for any
    /// characters (MIG slices `nvidia.com/mig-*`, time-sliced `nvidia.com/gpu.shared`).
    /// While one is on a node, the node gets no invasive run and no campaign test.
    #[arg(
        long = "gpu-resources",
        alias = "gpu-resource",
        env = "RAILGUARD_GPU_RESOURCES",
        value_delimiter = ',',
        default_value = "nvidia.com/gpu,nvidia.com/gpu.shared,nvidia.com/mig-*"
    )]
    pub gpu_resources: Vec<String>,
}

impl GpuResourceArgs {
    /// The resources that put a node in use under `profile`: the GPUs and the profile's RDMA
    /// resource (a storage client on the same HCAs is traffic a test would disturb too).
    pub fn in_use_resources(&self, profile: &FabricProfile) -> Vec<String> {
        let mut resources = self.gpu_resources.clone();
        if let Some(r) = &profile.spec.rdma {
            resources.push(r.resource_name.clone());
        }
        resources
    }
}
