//! `railguard-prober gpu-check`: the GPU layers of the runbook on this node (NVML/sysfs
//! discovery, GPU memory through the CUDA driver API, a one-GPU NCCL all-reduce), as JSON
//! (`railguard_prober::gpu_check`). A CPU-only node is skipped with exit status 0.

use std::path::PathBuf;

use clap::{Args, ValueHint};
use railguard_prober::gpu_check::{gather, CheckStatus, GpuCheckSpec};

use crate::{Outcome, Status};

#[derive(Args, Debug)]
pub struct GpuCheckArgs {
    /// sysfs root to read (`/` on a node).
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", default_value = "/", value_hint = ValueHint::DirPath)]
    pub sysfs_root: PathBuf,
    /// The CUDA driver library (default: `libcuda.so.1` from the loader's path).
    #[arg(long, env = "RAILGUARD_CUDA_LIBRARY", value_hint = ValueHint::FilePath)]
    pub cuda_library: Option<PathBuf>,
    /// The NCCL library (default: the image's `/usr/lib/railguard/nccl/libnccl.so.2`, the
    /// `nvidia-nccl-cu12` wheel's, where it exists, else `libnccl.so.2` from the loader's
    /// path).
    #[arg(long, env = "RAILGUARD_NCCL_LIBRARY", value_hint = ValueHint::FilePath)]
    pub nccl_library: Option<PathBuf>,
    /// Bytes allocated on each GPU for the memory check.
    #[arg(long, env = "RAILGUARD_ALLOC_BYTES", default_value_t = 64 << 20)]
    pub alloc_bytes: usize,
    /// All-reduce sizes, bytes.
    #[arg(
        long,
        env = "RAILGUARD_SIZES",
        value_delimiter = ',',
        default_value = "1048576,16777216,67108864"
    )]
    pub sizes: Vec<usize>,
    /// Timed all-reduces per size.
    #[arg(long, env = "RAILGUARD_ITERATIONS", default_value_t = 20)]
    pub iterations: u32,
}

impl GpuCheckArgs {
    pub fn run(self) -> anyhow::Result<Outcome> {
        if self.alloc_bytes == 0 || self.iterations == 0 || self.sizes.iter().any(|&s| s < 4) {
            anyhow::bail!(
                "--alloc-bytes and --iterations must be positive and every --sizes entry at least 4 bytes"
            );
        }
        let report = gather(&GpuCheckSpec {
            sysfs_root: self.sysfs_root,
            cuda_library: self.cuda_library,
            nccl_library: self.nccl_library,
            alloc_bytes: self.alloc_bytes,
            sizes: self.sizes,
            iterations: self.iterations,
        });
        let status = match report.status {
            CheckStatus::Pass | CheckStatus::Skip => Status::Pass,
            CheckStatus::Fail => Status::Fail,
        };
        Ok(Outcome::new(serde_json::to_string_pretty(&report)?, status))
    }
}
