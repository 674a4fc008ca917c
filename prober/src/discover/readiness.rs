//! GPUDirect RDMA readiness: platform facts (IOMMU, kernel, NVIDIA modules) read from the
//! sysfs root, and the pure findings over the inventory and the chosen rails.

use std::fs;
use std::path::Path;

use railguard_api::PathType;
use serde::{Deserialize, Serialize};

use super::attr::read_trimmed;
use super::pci::{AcsState, PciDevice};
use super::{AffinityMap, Finding, FindingKind, IndexOrder, Inventory, PortState, Rail, Severity};

/// Kernel and driver facts that decide whether GPUDirect RDMA can work.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Platform {
    /// Entries of `sys/class/iommu` (e.g. `dmar0`); empty when the IOMMU is off.
    pub iommu_units: Vec<String>,
    /// `proc/cmdline`, when readable.
    pub cmdline: Option<String>,
    /// `proc/sys/kernel/osrelease`.
    pub kernel: Option<String>,
    /// `sys/module/nvidia/version`; `None` when the driver is not loaded.
    pub nvidia_driver: Option<String>,
    /// From `proc/driver/nvidia/version`; `None` when unreadable.
    pub open_kernel_module: Option<bool>,
    /// `sys/module/nvidia_peermem` present.
    pub nvidia_peermem: bool,
}

/// IOMMU mode as far as the node tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IommuState {
    Off,
    Passthrough,
    Translated,
}

impl Platform {
    /// The IOMMU mode from `sys/class/iommu` and the kernel command line.
    pub fn iommu_state(&self) -> IommuState {
        let flags: Vec<&str> = self
            .cmdline
            .as_deref()
            .map(|c| c.split_whitespace().collect())
            .unwrap_or_default();
        let has = |f: &str| flags.contains(&f);
        if self.iommu_units.is_empty() || has("iommu=off") || has("intel_iommu=off") {
            IommuState::Off
        } else if has("iommu=pt") || has("amd_iommu=pt") || has("intel_iommu=pt") {
            IommuState::Passthrough
        } else {
            IommuState::Translated
        }
    }

    /// DMA-BUF GPU memory registration needs the open kernel module and Linux >= 5.12.
    pub fn dma_buf_possible(&self) -> bool {
        self.open_kernel_module == Some(true)
            && self
                .kernel
                .as_deref()
                .and_then(kernel_version)
                .is_some_and(|v| v >= (5, 12))
    }
}

/// `5.15.0-105-generic` -> (5, 15).
pub(crate) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

pub(crate) fn read_platform(root: &Path) -> Platform {
    let mut iommu_units: Vec<String> = fs::read_dir(root.join("sys/class/iommu"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    iommu_units.sort();
    Platform {
        iommu_units,
        cmdline: read_trimmed(&root.join("proc/cmdline")),
        kernel: read_trimmed(&root.join("proc/sys/kernel/osrelease")),
        nvidia_driver: read_trimmed(&root.join("sys/module/nvidia/version")),
        open_kernel_module: read_trimmed(&root.join("proc/driver/nvidia/version"))
            .map(|v| v.contains("Open Kernel Module")),
        nvidia_peermem: root.join("sys/module/nvidia_peermem").is_dir(),
    }
}

fn pci_path(addr: &str, file: &str) -> String {
    format!("sys/bus/pci/devices/{addr}/{file}")
}

fn link_finding(dev: &PciDevice, what: &str, severity: Severity) -> Option<Finding> {
    if !dev.link.is_downgraded() {
        return None;
    }
    let l = &dev.link;
    let show = |v: Option<u32>| v.map_or("?".into(), |v| format!("x{v}"));
    let speed = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v} GT/s"));
    Some(Finding {
        kind: FindingKind::PcieDowngrade,
        severity,
        subject: dev.address.clone(),
        message: format!(
            "{what} {} PCIe link runs at {} {} below its maximum {} {}",
            dev.address,
            show(l.current_width),
            speed(l.current_speed_gts),
            show(l.max_width),
            speed(l.max_speed_gts)
        ),
        evidence: vec![
            format!(
                "{} = {}",
                pci_path(&dev.address, "current_link_width"),
                show(l.current_width)
            ),
            format!(
                "{} = {}",
                pci_path(&dev.address, "max_link_width"),
                show(l.max_width)
            ),
            format!(
                "{} = {}",
                pci_path(&dev.address, "current_link_speed"),
                speed(l.current_speed_gts)
            ),
            format!(
                "{} = {}",
                pci_path(&dev.address, "max_link_speed"),
                speed(l.max_speed_gts)
            ),
        ],
    })
}

/// Bridges a packet crosses between two devices under one host bridge.
fn crossed_bridges<'a>(a: &'a PciDevice, b: &'a PciDevice) -> Vec<&'a str> {
    if a.host_bridge != b.host_bridge {
        return Vec::new();
    }
    let common = a
        .bridges
        .iter()
        .zip(&b.bridges)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        return Vec::new();
    }
    let mut out: Vec<&str> = a.bridges[common - 1..].iter().map(String::as_str).collect();
    out.extend(b.bridges[common..].iter().map(String::as_str));
    out
}

/// Readiness findings: PCIe downgrades, ACS redirect on GPU-HCA paths, IOMMU mode, GPU
/// memory registration, ports down or slower than their peers, unknown NUMA nodes, GPU
/// index order.
pub fn readiness_findings(inv: &Inventory, affinity: &AffinityMap, rails: &[Rail]) -> Vec<Finding> {
    let mut out = Vec::new();
    if inv.gpus.is_empty() {
        out.push(Finding {
            kind: FindingKind::NoGpus,
            severity: Severity::Warning,
            subject: "node".into(),
            message: "no NVIDIA GPU (vendor 0x10de, class 0x0300/0x0302) in the PCI tree".into(),
            evidence: vec!["sys/bus/pci/devices/*/{vendor,class}".into()],
        });
    }
    if inv.hcas.is_empty() {
        out.push(Finding {
            kind: FindingKind::NoRdmaDevices,
            severity: Severity::Critical,
            subject: "node".into(),
            message: "no RDMA devices under sys/class/infiniband".into(),
            evidence: vec!["sys/class/infiniband is empty or missing".into()],
        });
    }

    // PCIe links of GPUs and HCAs.
    for g in &inv.gpus {
        if let Some(dev) = inv.pci.get(&g.pci_bus_id) {
            out.extend(link_finding(
                dev,
                &format!("GPU{}", g.index),
                Severity::Critical,
            ));
        }
    }
    for h in &inv.hcas {
        let is_rail = rails.iter().any(|r| r.hca == h.name);
        if let Some(dev) = h.pci_bus_id.as_ref().and_then(|a| inv.pci.get(a)) {
            let sev = if is_rail {
                Severity::Critical
            } else {
                Severity::Warning
            };
            out.extend(link_finding(dev, &h.name, sev));
        }
    }

    // ACS on the bridges each GPU crosses to reach its preferred HCA.
    let mut acs_unknown: Vec<String> = Vec::new();
    let mut acs_seen = std::collections::BTreeSet::new();
    for e in &affinity.gpus {
        let Some(p) = &e.preferred else { continue };
        if p.path > PathType::Pxb {
            continue; // goes through the root complex anyway
        }
        let gpu = e.pci_bus_id.as_ref().and_then(|a| inv.pci.get(a));
        let hca = inv
            .hcas
            .iter()
            .find(|h| h.name == p.hca)
            .and_then(|h| h.pci_bus_id.as_ref())
            .and_then(|a| inv.pci.get(a));
        let (Some(gpu), Some(hca)) = (gpu, hca) else {
            continue;
        };
        for b in crossed_bridges(gpu, hca) {
            let Some(bridge) = inv.pci.get(b) else {
                continue;
            };
            match &bridge.acs {
                Some(AcsState::Redirect { control }) if acs_seen.insert(b.to_string()) => {
                    out.push(Finding {
                            kind: FindingKind::AcsRedirect,
                            severity: Severity::Critical,
                            subject: b.to_string(),
                            message: format!(
                                "ACS P2P redirect is on at bridge {b} between GPU{} and {}: GPUDirect traffic is forced up to the root complex",
                                e.index, p.hca
                            ),
                            evidence: vec![format!(
                                "{} ACS control = {control:#06x} (bit 2 request redirect, bit 3 completion redirect)",
                                pci_path(b, "config")
                            )],
                        });
                }
                Some(AcsState::Unknown { reason }) if acs_seen.insert(b.to_string()) => {
                    acs_unknown.push(format!("{}: {reason}", pci_path(b, "config")));
                }
                _ => {}
            }
        }
    }
    if !acs_unknown.is_empty() {
        out.push(Finding {
            kind: FindingKind::AcsUnknown,
            severity: Severity::Warning,
            subject: "node".into(),
            message: format!(
                "ACS state unknown on {} bridge(s) in GPU-HCA paths (reading extended PCI config space needs CAP_SYS_ADMIN; chart: prober.readPciConfigSpace=true)",
                acs_unknown.len()
            ),
            evidence: acs_unknown,
        });
    }

    // IOMMU.
    let p = &inv.platform;
    let cmdline_ev = format!(
        "proc/cmdline = {:?}",
        p.cmdline.as_deref().unwrap_or("<unreadable>")
    );
    let units_ev = format!("sys/class/iommu = [{}]", p.iommu_units.join(", "));
    match p.iommu_state() {
        IommuState::Off => out.push(Finding {
            kind: FindingKind::Iommu,
            severity: Severity::Info,
            subject: "node".into(),
            message: "IOMMU off: peer-to-peer DMA is not translated".into(),
            evidence: vec![units_ev, cmdline_ev],
        }),
        IommuState::Passthrough => out.push(Finding {
            kind: FindingKind::Iommu,
            severity: Severity::Info,
            subject: "node".into(),
            message: "IOMMU in passthrough mode (iommu=pt)".into(),
            evidence: vec![units_ev, cmdline_ev],
        }),
        IommuState::Translated => out.push(Finding {
            kind: FindingKind::Iommu,
            severity: Severity::Warning,
            subject: "node".into(),
            message: "IOMMU translates DMA (no iommu=pt): GPUDirect RDMA peer-to-peer may be slow or fail".into(),
            evidence: vec![units_ev, cmdline_ev],
        }),
    }

    // GPU memory registration.
    if !inv.gpus.is_empty() {
        let ev = vec![
            format!(
                "sys/module/nvidia_peermem {}",
                if p.nvidia_peermem {
                    "present"
                } else {
                    "absent"
                }
            ),
            format!(
                "sys/module/nvidia/version = {}",
                p.nvidia_driver.as_deref().unwrap_or("<absent>")
            ),
            format!(
                "proc/driver/nvidia/version open kernel module = {}",
                p.open_kernel_module
                    .map_or("unknown".into(), |b| b.to_string())
            ),
            format!(
                "proc/sys/kernel/osrelease = {}",
                p.kernel.as_deref().unwrap_or("<unreadable>")
            ),
        ];
        let (severity, message) = if p.nvidia_driver.is_none() {
            (
                Severity::Critical,
                "NVIDIA driver not loaded: no GPU memory registration".to_string(),
            )
        } else if p.nvidia_peermem {
            (
                Severity::Info,
                "GPU memory registration through nvidia_peermem".to_string(),
            )
        } else if p.dma_buf_possible() {
            (
                Severity::Info,
                "GPU memory registration through DMA-BUF (open kernel module, kernel >= 5.12)"
                    .to_string(),
            )
        } else {
            (
                Severity::Critical,
                "no GPU memory registration path: nvidia_peermem not loaded and DMA-BUF not possible (needs the open kernel module and kernel >= 5.12)".to_string(),
            )
        };
        out.push(Finding {
            kind: FindingKind::GpuMemoryRegistration,
            severity,
            subject: "node".into(),
            message,
            evidence: ev,
        });
    }

    // Ports: down, or slower than the other compute rails.
    let peer_rate = rails
        .iter()
        .filter(|r| r.state == PortState::Active)
        .filter_map(|r| r.rate_gbps)
        .fold(None, |acc: Option<f64>, r| {
            Some(acc.map_or(r, |a| a.max(r)))
        });
    for r in rails {
        let base = format!("sys/class/infiniband/{}/ports/{}", r.hca, r.port);
        if r.state != PortState::Active {
            out.push(Finding {
                kind: FindingKind::PortDown,
                severity: Severity::Critical,
                subject: format!("{}:{}", r.hca, r.port),
                message: format!("compute rail {}:{} is {}", r.hca, r.port, r.state.as_str()),
                evidence: vec![format!("{base}/state = {}", r.state.as_str())],
            });
        } else if let (Some(rate), Some(peer)) = (r.rate_gbps, peer_rate) {
            if rate + 0.01 < peer {
                out.push(Finding {
                    kind: FindingKind::PortRateLow,
                    severity: Severity::Warning,
                    subject: format!("{}:{}", r.hca, r.port),
                    message: format!(
                        "compute rail {}:{} runs at {rate} Gb/s, below its peers' {peer} Gb/s",
                        r.hca, r.port
                    ),
                    evidence: vec![format!("{base}/rate = {rate} Gb/sec")],
                });
            }
        }
    }

    // NUMA nodes the kernel does not know.
    for g in &inv.gpus {
        if g.numa.is_none() {
            out.push(numa_finding(&format!("GPU{}", g.index), &g.pci_bus_id));
        }
    }
    for h in &inv.hcas {
        if let (None, Some(addr)) = (h.numa, &h.pci_bus_id) {
            out.push(numa_finding(&h.name, addr));
        }
    }

    if inv.index_order == IndexOrder::Pci && !inv.gpus.is_empty() {
        out.push(Finding {
            kind: FindingKind::GpuIndexOrder,
            severity: Severity::Info,
            subject: "node".into(),
            message: "NVML not available: GPU indices are PCI bus order and may differ from CUDA/NVML indices".into(),
            evidence: vec!["Nvml::init() failed or was not attempted".into()],
        });
    }
    out
}

fn numa_finding(subject: &str, addr: &str) -> Finding {
    Finding {
        kind: FindingKind::NumaUnknown,
        severity: Severity::Warning,
        subject: subject.to_string(),
        message: format!(
            "{subject} ({addr}) has no known NUMA node; it is treated as not local to any CPU or device"
        ),
        evidence: vec![format!("{} = -1 or unreadable", pci_path(addr, "numa_node"))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(units: &[&str], cmdline: &str) -> Platform {
        Platform {
            iommu_units: units.iter().map(|s| s.to_string()).collect(),
            cmdline: Some(cmdline.into()),
            kernel: Some("5.15.0-105-generic".into()),
            nvidia_driver: Some("550.54.15".into()),
            open_kernel_module: Some(false),
            nvidia_peermem: true,
        }
    }

    #[test]
    fn iommu_modes() {
        assert_eq!(platform(&[], "quiet").iommu_state(), IommuState::Off);
        assert_eq!(
            platform(&["dmar0"], "intel_iommu=on iommu=pt").iommu_state(),
            IommuState::Passthrough
        );
        assert_eq!(
            platform(&["dmar0"], "intel_iommu=on").iommu_state(),
            IommuState::Translated
        );
    }

    #[test]
    fn dma_buf_needs_open_module_and_new_kernel() {
        let mut p = platform(&[], "");
        assert!(!p.dma_buf_possible());
        p.open_kernel_module = Some(true);
        assert!(p.dma_buf_possible());
        p.kernel = Some("5.4.0-150-generic".into());
        assert!(!p.dma_buf_possible());
        assert_eq!(kernel_version("6.8.0"), Some((6, 8)));
        assert_eq!(kernel_version("junk"), None);
    }
}
