//! GPU memory for the RDMA engine (GPUDirect RDMA): which GPU a rail's buffer lives on, the
//! CUDA driver that allocates it, and the order in which registration paths are tried.
//!
//! The driver (`libcuda.so.1`, or the library at [`GpuMemory::library`]) is loaded once, on
//! the first GPU-memory request, through `railguard-gpu`; a node without it answers every
//! GPU-memory request with [`RdmaError::GpuMemoryUnavailable`] and the reason, and its host
//! memory tests run as before. The registration calls themselves (`ibv_reg_dmabuf_mr`,
//! `ibv_reg_mr`) are verbs calls and live in [`super::verbs`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use railguard_api::error::error_chain;
use railguard_api::profile::GpuRegistration;
use railguard_gpu::{CudaDriver, Device, DeviceBuffer};
use serde::{Deserialize, Serialize};

use super::RdmaError;

/// How a GPU buffer is made visible to the HCA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegistrationPath {
    /// `cuMemGetHandleForAddressRange` exports a DMA-BUF, `ibv_reg_dmabuf_mr` registers it.
    DmaBuf,
    /// `ibv_reg_mr` on the device pointer; the kernel's nvidia-peermem resolves it.
    #[serde(rename = "peermem")]
    PeerMem,
}

impl RegistrationPath {
    pub fn as_str(self) -> &'static str {
        match self {
            RegistrationPath::DmaBuf => "dma-buf",
            RegistrationPath::PeerMem => "peermem",
        }
    }
}

impl std::fmt::Display for RegistrationPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The paths to try, in order, for a profile's setting. `Auto` prefers DMA-BUF: it needs no
/// out-of-tree kernel module and is what current drivers and NCCL use first.
pub fn registration_order(mode: GpuRegistration) -> &'static [RegistrationPath] {
    match mode {
        GpuRegistration::Auto => &[RegistrationPath::DmaBuf, RegistrationPath::PeerMem],
        GpuRegistration::DmaBuf => &[RegistrationPath::DmaBuf],
        GpuRegistration::PeerMem => &[RegistrationPath::PeerMem],
    }
}

/// A registration path that did not work, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationAttempt {
    pub path: RegistrationPath,
    pub error: String,
}

impl std::fmt::Display for RegistrationAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.error)
    }
}

/// Which GPU a buffer was on and how it was registered: the path that worked and the ones
/// tried before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRegistrationReport {
    pub gpu: u32,
    pub pci_bus_id: String,
    pub path: RegistrationPath,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<RegistrationAttempt>,
}

/// Why no path worked: every attempt, in order, as one reason.
pub fn no_path_reason(mode: GpuRegistration, attempts: &[RegistrationAttempt]) -> String {
    if attempts.is_empty() {
        return format!("no registration path to try for {mode:?}");
    }
    attempts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Where GPU buffers come from on this node.
#[derive(Clone)]
pub struct GpuMemory {
    /// The CUDA driver library; `None` lets the loader find `libcuda.so.1`.
    pub library: Option<PathBuf>,
    pub registration: GpuRegistration,
    /// PCI bus ids of the node's GPUs, by railguard's GPU index (discovery's order), so CUDA's
    /// own ordinal order never decides which GPU a rail is tested with.
    pub gpus: BTreeMap<u32, String>,
    driver: Arc<OnceLock<Result<Arc<CudaDriver>, String>>>,
}

impl std::fmt::Debug for GpuMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMemory")
            .field("library", &self.library)
            .field("registration", &self.registration)
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

impl Default for GpuMemory {
    fn default() -> Self {
        GpuMemory::new(None, GpuRegistration::Auto, BTreeMap::new())
    }
}

/// A GPU buffer ready for registration.
pub struct GpuBuffer {
    pub gpu: u32,
    pub device: Device,
    pub buffer: DeviceBuffer,
}

impl GpuMemory {
    pub fn new(
        library: Option<PathBuf>,
        registration: GpuRegistration,
        gpus: BTreeMap<u32, String>,
    ) -> Self {
        GpuMemory {
            library,
            registration,
            gpus,
            driver: Arc::new(OnceLock::new()),
        }
    }

    /// The loaded driver, or why there is none (the same answer for the process's lifetime:
    /// the library does not appear or vanish while the prober runs).
    fn driver(&self) -> Result<Arc<CudaDriver>, String> {
        self.driver
            .get_or_init(|| CudaDriver::load(self.library.as_deref()).map_err(|e| error_chain(&e)))
            .clone()
    }

    /// Allocates `len` bytes on GPU `gpu`, filled with a pattern.
    pub fn alloc(&self, gpu: u32, len: usize) -> Result<GpuBuffer, RdmaError> {
        let unavailable = |reason: String| RdmaError::GpuMemoryUnavailable { gpu, reason };
        let bus_id = self
            .gpus
            .get(&gpu)
            .ok_or_else(|| {
                unavailable(format!(
                    "this node has {} GPU(s) with a known PCI address; there is no GPU {gpu}",
                    self.gpus.len()
                ))
            })?
            .clone();
        let driver = self.driver().map_err(unavailable)?;
        let device = driver
            .device_by_pci_bus_id(&bus_id)
            .map_err(|e| unavailable(error_chain(&e)))?;
        let buffer = driver
            .alloc(&device, len)
            .map_err(|e| unavailable(error_chain(&e)))?;
        buffer
            .fill(0xa5)
            .map_err(|e| unavailable(error_chain(&e)))?;
        Ok(GpuBuffer {
            gpu,
            device,
            buffer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_tries_dma_buf_then_peermem_and_explicit_modes_try_one() {
        assert_eq!(
            registration_order(GpuRegistration::Auto),
            &[RegistrationPath::DmaBuf, RegistrationPath::PeerMem]
        );
        assert_eq!(
            registration_order(GpuRegistration::DmaBuf),
            &[RegistrationPath::DmaBuf]
        );
        assert_eq!(
            registration_order(GpuRegistration::PeerMem),
            &[RegistrationPath::PeerMem]
        );
    }

    #[test]
    fn paths_serialise_as_they_print() {
        for p in [RegistrationPath::DmaBuf, RegistrationPath::PeerMem] {
            assert_eq!(
                serde_json::to_value(p).ok(),
                Some(serde_json::Value::String(p.to_string()))
            );
        }
    }

    #[test]
    fn the_reason_names_every_failed_path_in_order() {
        let attempts = vec![
            RegistrationAttempt {
                path: RegistrationPath::DmaBuf,
                error: "ibv_reg_dmabuf_mr failed: Operation not supported".into(),
            },
            RegistrationAttempt {
                path: RegistrationPath::PeerMem,
                error: "ibv_reg_mr failed: Bad address".into(),
            },
        ];
        assert_eq!(
            no_path_reason(GpuRegistration::Auto, &attempts),
            "dma-buf: ibv_reg_dmabuf_mr failed: Operation not supported; peermem: ibv_reg_mr failed: Bad address"
        );
    }

    #[test]
    fn an_unknown_gpu_index_or_a_missing_driver_is_unavailable_with_the_reason() {
        let none = GpuMemory::new(None, GpuRegistration::Auto, BTreeMap::new());
        let e = none.alloc(0, 4096).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("GPU memory on gpu 0 is unavailable: this node has 0 GPU(s) with a known PCI address; there is no GPU 0")
        );
        let dir = std::env::temp_dir().join("railguard-no-such-libcuda.so.1");
        let absent = GpuMemory::new(
            Some(dir),
            GpuRegistration::Auto,
            BTreeMap::from([(0, "0000:04:00.0".to_string())]),
        );
        let e = absent
            .alloc(0, 4096)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("cannot load the CUDA driver library"), "{e}");
        assert!(e.contains("railguard-no-such-libcuda.so.1"), "{e}");
    }
}
