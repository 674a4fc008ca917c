//! `gpu-check`: the GPU layers of the runbook on one node, through the same code the
//! certification uses — GPUs as NVML and sysfs see them, GPU memory through the CUDA driver
//! API (allocate, fill, copy back, export as DMA-BUF) and a one-GPU NCCL all-reduce through
//! the NCCL library — as one JSON report. A CPU-only node is skipped, not failed.
//!
//! [`gather`] does the IO (each layer's failure is recorded, never fatal to the report);
//! [`judge`] decides over the report.

use std::path::PathBuf;
use std::sync::Arc;

use railguard_api::error::error_chain;
use railguard_gpu::collective::SweepPoint;
use railguard_gpu::{CudaDriver, CudaError, Nccl};
use serde::Serialize;

/// What to check with.
#[derive(Debug, Clone)]
pub struct GpuCheckSpec {
    pub sysfs_root: PathBuf,
    pub cuda_library: Option<PathBuf>,
    pub nccl_library: Option<PathBuf>,
    /// Bytes per GPU allocation of the memory check.
    pub alloc_bytes: usize,
    /// All-reduce sizes, bytes.
    pub sizes: Vec<usize>,
    pub iterations: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuCheckReport {
    pub discovery: DiscoveryLayer,
    pub cuda: Layer<CudaLayer>,
    /// One entry per CUDA device.
    pub memory: Vec<MemoryCheck>,
    pub nccl: Layer<NcclLayer>,
    pub status: CheckStatus,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// A layer that either answered or failed with a reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Layer<T> {
    Ok(T),
    Error(String),
    /// Not tried, because a layer below it failed.
    NotRun(String),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryLayer {
    /// GPUs discovery found (NVML when it answered, else sysfs).
    pub gpus: Vec<DiscoveredGpu>,
    pub nvml: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredGpu {
    pub index: u32,
    pub pci_bus_id: String,
    pub numa: Option<u32>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CudaLayer {
    pub library: String,
    /// `cuDriverGetVersion`, e.g. 12040.
    pub version: i32,
    pub devices: Vec<CudaDevice>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CudaDevice {
    pub ordinal: i32,
    pub pci_bus_id: String,
    pub name: String,
    pub dma_buf_supported: bool,
    pub gpu_direct_rdma_supported: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryCheck {
    pub pci_bus_id: String,
    pub bytes: usize,
    /// Filled on the GPU and read back intact.
    pub round_trip: Check,
    /// A DMA-BUF exported for the allocation (what `ibv_reg_dmabuf_mr` would register);
    /// informational: drivers without DMA-BUF still do GPUDirect through nvidia-peermem.
    pub dma_buf: Check,
}

/// One check: `"ok"`, or `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Check {
    Ok,
    Error(String),
}

impl From<Result<(), String>> for Check {
    fn from(r: Result<(), String>) -> Self {
        match r {
            Ok(()) => Check::Ok,
            Err(e) => Check::Error(e),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclLayer {
    pub library: String,
    pub version: String,
    pub pci_bus_id: String,
    pub points: Vec<NcclPoint>,
}

/// One point of the sweep: the ranks' own point ([`crate::nccl::ranks::PairPoint`]).
pub type NcclPoint = crate::nccl::ranks::PairPoint;

impl From<&SweepPoint> for NcclPoint {
    fn from(p: &SweepPoint) -> Self {
        NcclPoint {
            bytes: p.bytes,
            time_us: p.time_us,
            algbw_gbps: p.algbw_gbps,
            busbw_gbps: p.busbw_gbps,
            wrong: p.wrong,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Pass,
    Fail,
    /// No GPU and no driver: nothing to check on this node.
    Skip,
}

/// Runs every layer it can.
pub fn gather(spec: &GpuCheckSpec) -> GpuCheckReport {
    let discovery = match crate::discover::discover(&spec.sysfs_root, true) {
        Ok(d) => DiscoveryLayer {
            nvml: d.gpus.iter().any(|g| g.name.is_some()),
            gpus: d
                .gpus
                .iter()
                .map(|g| DiscoveredGpu {
                    index: g.index,
                    pci_bus_id: g.pci_bus_id.clone(),
                    numa: g.numa,
                    name: g.name.clone(),
                })
                .collect(),
            error: None,
        },
        Err(e) => DiscoveryLayer {
            gpus: Vec::new(),
            nvml: false,
            error: Some(error_chain(&e)),
        },
    };
    let (cuda, memory, nccl) = match CudaDriver::load(spec.cuda_library.as_deref()) {
        Err(e) => {
            let absent = matches!(e, CudaError::Load { .. });
            let reason = error_chain(&e);
            let nccl = Layer::NotRun("no CUDA driver".into());
            let cuda = if absent {
                Layer::NotRun(reason)
            } else {
                Layer::Error(reason)
            };
            (cuda, Vec::new(), nccl)
        }
        Ok(driver) => check_with_driver(spec, &driver),
    };
    let mut report = GpuCheckReport {
        discovery,
        cuda,
        memory,
        nccl,
        status: CheckStatus::Skip,
        reasons: Vec::new(),
    };
    let (status, reasons) = judge(&report);
    report.status = status;
    report.reasons = reasons;
    report
}

fn check_with_driver(
    spec: &GpuCheckSpec,
    driver: &Arc<CudaDriver>,
) -> (Layer<CudaLayer>, Vec<MemoryCheck>, Layer<NcclLayer>) {
    let devices = match driver.devices() {
        Ok(d) => d,
        Err(e) => {
            let reason = error_chain(&e);
            return (
                Layer::Error(reason.clone()),
                Vec::new(),
                Layer::NotRun(reason),
            );
        }
    };
    let memory = devices
        .iter()
        .map(|d| {
            let buffer = driver.alloc(d, spec.alloc_bytes);
            let round_trip = match &buffer {
                Ok(b) => round_trip(b),
                Err(e) => Err(error_chain(e)),
            };
            let dma_buf = match &buffer {
                Ok(b) => b.export_dmabuf().map(drop).map_err(|e| error_chain(&e)),
                Err(e) => Err(error_chain(e)),
            };
            MemoryCheck {
                pci_bus_id: d.pci_bus_id.clone(),
                bytes: spec.alloc_bytes,
                round_trip: round_trip.into(),
                dma_buf: dma_buf.into(),
            }
        })
        .collect();
    let nccl = match devices.first() {
        None => Layer::NotRun("CUDA sees no GPU".into()),
        Some(first) => match one_gpu_all_reduce(spec, driver, first) {
            Ok(layer) => Layer::Ok(layer),
            Err(reason) => Layer::Error(reason),
        },
    };
    let cuda = Layer::Ok(CudaLayer {
        library: driver.path().to_string(),
        version: driver.version(),
        devices: devices
            .iter()
            .map(|d| CudaDevice {
                ordinal: d.ordinal,
                pci_bus_id: d.pci_bus_id.clone(),
                name: d.name.clone(),
                dma_buf_supported: d.dma_buf_supported,
                gpu_direct_rdma_supported: d.gpu_direct_rdma_supported,
            })
            .collect(),
    });
    (cuda, memory, nccl)
}

/// A pattern written on the GPU must read back intact.
fn round_trip(buffer: &railguard_gpu::DeviceBuffer) -> Result<(), String> {
    buffer.fill(0x5a).map_err(|e| error_chain(&e))?;
    let mut back = vec![0u8; buffer.len().min(1 << 20)];
    buffer
        .copy_to_host(&mut back)
        .map_err(|e| error_chain(&e))?;
    match back.iter().position(|&b| b != 0x5a) {
        None => Ok(()),
        Some(at) => Err(format!(
            "byte {at} read back as {:#04x}, expected 0x5a",
            back[at]
        )),
    }
}

fn one_gpu_all_reduce(
    spec: &GpuCheckSpec,
    driver: &Arc<CudaDriver>,
    device: &railguard_gpu::Device,
) -> Result<NcclLayer, String> {
    let nccl = Nccl::load(spec.nccl_library.as_deref()).map_err(|e| error_chain(&e))?;
    let stream = driver.stream(device).map_err(|e| error_chain(&e))?;
    let id = nccl.unique_id().map_err(|e| error_chain(&e))?;
    let mut comm = nccl
        .init_rank(&id, 1, 0, &stream)
        .map_err(|e| error_chain(&e))?;
    let points = comm
        .all_reduce_sweep(driver, device, &stream, &spec.sizes, 2, spec.iterations)
        .map_err(|e| error_chain(&e))?;
    Ok(NcclLayer {
        library: nccl.path().to_string(),
        version: nccl.version_string(),
        pci_bus_id: device.pci_bus_id.clone(),
        points: points.iter().map(NcclPoint::from).collect(),
    })
}

/// Pass when every layer answered and every result is correct; skip when the node has no
/// GPU and no driver; fail otherwise, with one reason per problem.
pub fn judge(report: &GpuCheckReport) -> (CheckStatus, Vec<String>) {
    let mut reasons = Vec::new();
    if let (Layer::NotRun(why), true) = (&report.cuda, report.discovery.gpus.is_empty()) {
        return (
            CheckStatus::Skip,
            vec![format!(
                "no NVIDIA GPU and no CUDA driver on this node ({why})"
            )],
        );
    }
    match &report.cuda {
        Layer::Ok(c) if c.devices.is_empty() => reasons.push("CUDA sees no GPU".to_string()),
        Layer::Ok(c) => {
            for g in &report.discovery.gpus {
                if !c.devices.iter().any(|d| d.pci_bus_id == g.pci_bus_id) {
                    reasons.push(format!(
                        "GPU {} ({}) is on the PCI bus but CUDA does not see it",
                        g.index, g.pci_bus_id
                    ));
                }
            }
        }
        Layer::Error(e) | Layer::NotRun(e) => reasons.push(format!("CUDA driver: {e}")),
    }
    for m in &report.memory {
        if let Check::Error(e) = &m.round_trip {
            reasons.push(format!("GPU {} memory: {e}", m.pci_bus_id));
        }
    }
    match &report.nccl {
        Layer::Ok(n) => {
            if n.points.is_empty() {
                reasons.push("NCCL all-reduce measured no size".to_string());
            }
            for p in n.points.iter().filter(|p| p.wrong > 0) {
                reasons.push(format!(
                    "NCCL all-reduce of {} bytes: {} wrong values",
                    p.bytes, p.wrong
                ));
            }
        }
        Layer::Error(e) => reasons.push(format!("NCCL: {e}")),
        Layer::NotRun(_) => {}
    }
    let status = if reasons.is_empty() {
        CheckStatus::Pass
    } else {
        CheckStatus::Fail
    };
    (status, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, bus: &str) -> DiscoveredGpu {
        DiscoveredGpu {
            index,
            pci_bus_id: bus.into(),
            numa: Some(0),
            name: None,
        }
    }

    fn report(gpus: Vec<DiscoveredGpu>, cuda: Layer<CudaLayer>) -> GpuCheckReport {
        GpuCheckReport {
            discovery: DiscoveryLayer {
                gpus,
                nvml: false,
                error: None,
            },
            cuda,
            memory: vec![],
            nccl: Layer::NotRun("no CUDA driver".into()),
            status: CheckStatus::Skip,
            reasons: vec![],
        }
    }

    fn device(bus: &str) -> CudaDevice {
        CudaDevice {
            ordinal: 0,
            pci_bus_id: bus.into(),
            name: "H200".into(),
            dma_buf_supported: true,
            gpu_direct_rdma_supported: true,
        }
    }

    #[test]
    fn a_cpu_only_node_is_skipped_and_a_gpu_without_driver_fails() {
        let none = report(vec![], Layer::NotRun("cannot load libcuda.so.1".into()));
        assert_eq!(judge(&none).0, CheckStatus::Skip);
        let orphan = report(
            vec![gpu(0, "0000:1b:00.0")],
            Layer::NotRun("cannot load libcuda.so.1".into()),
        );
        assert_eq!(
            judge(&orphan),
            (
                CheckStatus::Fail,
                vec!["CUDA driver: cannot load libcuda.so.1".to_string()]
            )
        );
    }

    #[test]
    fn every_layer_must_answer_correctly_to_pass() {
        let cuda = Layer::Ok(CudaLayer {
            library: "libcuda.so.1".into(),
            version: 12040,
            devices: vec![device("0000:1b:00.0")],
        });
        let mut r = report(vec![gpu(0, "0000:1b:00.0")], cuda.clone());
        r.nccl = Layer::Ok(NcclLayer {
            library: "libnccl.so.2".into(),
            version: "2.21.5".into(),
            pci_bus_id: "0000:1b:00.0".into(),
            points: vec![NcclPoint {
                bytes: 1 << 20,
                time_us: 10.0,
                algbw_gbps: 100.0,
                busbw_gbps: 0.0,
                wrong: 0,
            }],
        });
        assert_eq!(judge(&r), (CheckStatus::Pass, vec![]));

        let mut wrong = r.clone();
        if let Layer::Ok(n) = &mut wrong.nccl {
            n.points[0].wrong = 3;
        }
        assert_eq!(
            judge(&wrong).1,
            ["NCCL all-reduce of 1048576 bytes: 3 wrong values"]
        );

        let mut unseen = r.clone();
        unseen.discovery.gpus.push(gpu(1, "0000:9a:00.0"));
        assert_eq!(
            judge(&unseen).1,
            ["GPU 1 (0000:9a:00.0) is on the PCI bus but CUDA does not see it"]
        );

        let mut no_nccl = r;
        no_nccl.nccl = Layer::Error("cannot load NCCL from libnccl.so.2".into());
        assert_eq!(
            judge(&no_nccl),
            (
                CheckStatus::Fail,
                vec!["NCCL: cannot load NCCL from libnccl.so.2".to_string()]
            )
        );
    }
}
