//! GPUs through NVML, when the driver library is present. NVML order is what CUDA and users
//! see; PCI order may differ. Kept behind [`nvml_gpus`] so discovery works without a driver.

use serde::{Deserialize, Serialize};

use super::Gpu;

/// One GPU as NVML reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvmlGpu {
    pub index: u32,
    /// Normalized to sysfs form, e.g. `0000:1b:00.0`.
    pub pci_bus_id: String,
    pub name: Option<String>,
    /// `GPU-…` UUID (`nvmlDeviceGetUUID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Active NVLinks.
    pub nvlinks_active: u32,
    /// NVML indices of GPUs this one can reach peer-to-peer (read and write OK).
    pub p2p_peers: Vec<u32>,
}

/// What NVML said about the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvmlReport {
    pub driver_version: Option<String>,
    pub gpus: Vec<NvmlGpu>,
}

/// NVML's `00000000:1B:00.0` -> sysfs `0000:1b:00.0`.
pub(crate) fn normalize_bus_id(id: &str) -> String {
    let lower = id.trim().trim_end_matches('\0').to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// Why NVML could not describe the GPUs (the NVML error is part of the message).
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("NVML unavailable: {0}")]
    Unavailable(nvml_wrapper::error::NvmlError),
    #[error("NVML device count: {0}")]
    DeviceCount(nvml_wrapper::error::NvmlError),
    #[error("NVML device {index}: {error}")]
    Device {
        index: u32,
        error: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML PCI info of GPU {index}: {error}")]
    PciInfo {
        index: u32,
        error: nvml_wrapper::error::NvmlError,
    },
}

/// Queries NVML. Fails cleanly (with the reason) when the driver library is not there.
pub fn nvml_gpus() -> Result<NvmlReport, NvmlError> {
    use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
    use nvml_wrapper::Nvml;

    let nvml = Nvml::init().map_err(NvmlError::Unavailable)?;
    let count = nvml.device_count().map_err(NvmlError::DeviceCount)?;
    let mut devices = Vec::new();
    for i in 0..count {
        let d = nvml
            .device_by_index(i)
            .map_err(|error| NvmlError::Device { index: i, error })?;
        devices.push(d);
    }
    let mut gpus = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        let bus = d
            .pci_info()
            .map_err(|error| NvmlError::PciInfo { index, error })?;
        // NVML knows up to 18 links on current parts; an error means "no such link".
        let nvlinks_active = (0..18)
            .filter(|l| d.link_wrapper_for(*l).is_active().unwrap_or(false))
            .count();
        let p2p_peers = devices
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter(|(_, other)| {
                matches!(
                    d.p2p_status(other, P2pCapabilitiesIndex::Read),
                    Ok(P2pStatus::Ok)
                ) && matches!(
                    d.p2p_status(other, P2pCapabilitiesIndex::Write),
                    Ok(P2pStatus::Ok)
                )
            })
            .map(|(j, _)| u32::try_from(j).unwrap_or(u32::MAX))
            .collect();
        gpus.push(NvmlGpu {
            index,
            pci_bus_id: normalize_bus_id(&bus.bus_id),
            name: d.name().ok(),
            uuid: d.uuid().ok(),
            nvlinks_active: u32::try_from(nvlinks_active).unwrap_or(0),
            p2p_peers,
        });
    }
    Ok(NvmlReport {
        driver_version: nvml.sys_driver_version().ok(),
        gpus,
    })
}

/// The CUDA version the loaded driver supports (`12.4`), from NVML; `None` without a driver.
pub fn nvml_cuda_version() -> Option<String> {
    let v = nvml_wrapper::Nvml::init()
        .ok()?
        .sys_cuda_driver_version()
        .ok()?;
    Some(format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// Renumbers sysfs GPUs by NVML index (matched on PCI address). Returns false, leaving PCI
/// order, unless NVML accounts for every GPU found in sysfs.
pub(crate) fn apply_nvml_order(gpus: &mut [Gpu], report: &NvmlReport) -> bool {
    if report.gpus.len() != gpus.len() || gpus.is_empty() {
        return false;
    }
    let mut renumbered = gpus.to_vec();
    for g in renumbered.iter_mut() {
        let Some(n) = report.gpus.iter().find(|n| n.pci_bus_id == g.pci_bus_id) else {
            return false;
        };
        g.index = n.index;
        g.name = n.name.clone();
        g.uuid = n.uuid.clone();
    }
    renumbered.sort_by_key(|g| g.index);
    gpus.clone_from_slice(&renumbered);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalized() {
        assert_eq!(normalize_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("0000:1b:00.0"), "0000:1b:00.0");
    }

    fn gpu(i: u32, bus: &str) -> Gpu {
        Gpu {
            index: i,
            pci_bus_id: bus.into(),
            numa: Some(0),
            name: None,
            uuid: None,
        }
    }

    #[test]
    fn nvml_order_replaces_pci_order_only_when_complete() {
        let mut gpus = vec![gpu(0, "0000:1b:00.0"), gpu(1, "0000:43:00.0")];
        let nv = |i: u32, bus: &str| NvmlGpu {
            index: i,
            pci_bus_id: bus.into(),
            name: Some("H100".into()),
            uuid: Some(format!("GPU-{i}")),
            nvlinks_active: 18,
            p2p_peers: vec![],
        };
        let report = NvmlReport {
            driver_version: None,
            gpus: vec![nv(0, "0000:43:00.0"), nv(1, "0000:1b:00.0")],
        };
        assert!(apply_nvml_order(&mut gpus, &report));
        assert_eq!(gpus[0].pci_bus_id, "0000:43:00.0");
        assert_eq!(gpus[1].pci_bus_id, "0000:1b:00.0");
        // The UUID goes with the GPU (matched by PCI address), not with its old index.
        assert_eq!(
            (gpus[0].uuid.as_deref(), gpus[1].uuid.as_deref()),
            (Some("GPU-0"), Some("GPU-1"))
        );
        let partial = NvmlReport {
            driver_version: None,
            gpus: vec![nv(0, "0000:43:00.0")],
        };
        let mut again = vec![gpu(0, "0000:1b:00.0"), gpu(1, "0000:43:00.0")];
        assert!(!apply_nvml_order(&mut again, &partial));
        assert_eq!(again[0].pci_bus_id, "0000:1b:00.0");
    }

    #[test]
    fn nvml_init_fails_cleanly_without_a_driver() {
        // No NVIDIA driver on build machines: must be an error, not a panic. On a GPU
        // machine it succeeds and reports at least one GPU.
        match nvml_gpus() {
            Ok(r) => assert!(!r.gpus.is_empty()),
            Err(e) => assert!(e.to_string().starts_with("NVML")),
        }
    }
}
