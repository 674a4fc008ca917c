//! Discovery: the node's GPUs, RDMA devices, their PCIe distance, the GPU-to-HCA affinity
//! map, the compute rails, the GPUDirect RDMA readiness findings and the rails' fabric
//! findings (Subnet Manager, RoCE GID, MTU, physical-layer counters), all read from a sysfs
//! root (`/` on a real node, a synthetic tree in tests and simulation).
//!
//! Shape: [`read`] adapts the filesystem into plain [`Inventory`] data; everything else
//! ([`classify_path`], [`affinity_map`], [`readiness_findings`], [`fabric_findings`],
//! [`analyze`]) is pure.

mod affinity;
mod attr;
mod error;
mod fabric;
pub mod gid;
mod ib;
mod nvml;
mod pci;
mod profile;
mod readiness;
mod render;

use std::collections::BTreeMap;
use std::path::Path;

use railguard_api::{LinkLayer, PathType, RailLayout, RailSpec};
use serde::{Deserialize, Serialize};

pub use affinity::{
    affinity_findings, affinity_map, classify_nics, GpuRef, NicCandidate, PairPath,
};
pub use attr::Attr;
pub use error::DiscoverError;
pub use fabric::{
    fabric_findings, gid_carrier, roce_path_mtu, GidCarrier, GidEntry, GidType, NetdevFacts,
    PhysicalCounter, PortFabric, MIN_ROCE_NETDEV_MTU, PHYSICAL_COUNTERS,
};
pub use ib::{read_hcas, read_port, read_port_counters};
pub use nvml::{nvml_cuda_version, nvml_gpus, NvmlError, NvmlGpu, NvmlReport};
pub use pci::{acs_from_config, classify_path, read_pci_devices, AcsState, PciDevice, PcieLink};
pub use profile::{profile_for, ProfileDefaults};
pub use readiness::{readiness_findings, IommuState, Platform};
pub use render::{render_table, AffinityJson};

/// A GPU as discovered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Index users see: NVML/CUDA order when NVML answered, PCI order otherwise
    /// (see [`Discovery::index_order`]).
    pub index: u32,
    /// PCI address, e.g. `0000:1b:00.0`.
    pub pci_bus_id: String,
    /// NUMA node; `None` when the kernel reports -1 (unknown, never assumed local).
    pub numa: Option<u32>,
    /// Product name from NVML, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `GPU-…` UUID from NVML, when known: what `NVIDIA_VISIBLE_DEVICES` names a GPU by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// Port state as the kernel reports it (`4: ACTIVE` -> `Active`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PortState {
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    /// Missing or unreadable `state` file, or a value we do not know.
    Unknown,
}

impl PortState {
    /// Parses the sysfs `state` file (`4: ACTIVE`, or just `ACTIVE`).
    pub fn from_sysfs(value: &str) -> Self {
        let name = value.trim().rsplit(':').next().unwrap_or("").trim();
        match name {
            "DOWN" => PortState::Down,
            "INIT" => PortState::Init,
            "ARMED" => PortState::Armed,
            "ACTIVE" => PortState::Active,
            "ACTIVE_DEFER" => PortState::ActiveDefer,
            _ => PortState::Unknown,
        }
    }

    /// The name used in certificates (`ACTIVE`, `DOWN`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
            PortState::ActiveDefer => "ACTIVE_DEFER",
            PortState::Unknown => "UNKNOWN",
        }
    }
}

/// One port of an RDMA device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HcaPort {
    pub port: u32,
    pub state: PortState,
    /// `phys_state` text, e.g. `5: LinkUp`; `None` when unreadable.
    pub phys_state: Option<String>,
    /// Link rate in Gb/s parsed from `rate` (`400 Gb/sec (4X NDR)`); `None` when unreadable.
    pub rate_gbps: Option<f64>,
    /// `None` when `link_layer` is missing or unknown.
    pub link_layer: Option<LinkLayer>,
    /// GID index 0, when readable.
    pub gid0: Option<String>,
    /// Netdev behind this port (`device/net/*` whose `dev_port` matches), when any.
    pub netdev: Option<String>,
    /// `counters/*` values (unreadable or non-numeric files are left out).
    pub counters: BTreeMap<String, u64>,
    /// `hw_counters/*` values.
    pub hw_counters: BTreeMap<String, u64>,
    /// Subnet Manager, GID table, netdev MTU and physical-layer counters, as read (see
    /// [`fabric_findings`]).
    #[serde(default)]
    pub fabric: PortFabric,
}

/// Whether a NIC carries GPU traffic or is a storage/management NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NicRole {
    Compute,
    Storage,
}

/// An RDMA device (`/sys/class/infiniband/<name>`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hca {
    pub name: String,
    /// PCI address of its function; `None` for a device without a PCI parent (e.g. rxe).
    pub pci_bus_id: Option<String>,
    pub numa: Option<u32>,
    pub fw_ver: Option<String>,
    pub node_guid: Option<String>,
    pub ports: Vec<HcaPort>,
    /// PCI addresses of its SR-IOV virtual functions (`device/virtfn*`), which DRA drivers
    /// publish as devices of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sriov_vfs: Vec<String>,
}

/// Everything read from the machine, before any decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// All PCI devices by address.
    pub pci: BTreeMap<String, PciDevice>,
    /// GPUs in index order.
    pub gpus: Vec<Gpu>,
    pub hcas: Vec<Hca>,
    /// How GPU indices were assigned.
    pub index_order: IndexOrder,
    pub platform: Platform,
    /// Problems met while reading (junk files, unreadable entries): they become findings.
    pub read_problems: Vec<Finding>,
}

/// Where GPU indices come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexOrder {
    /// NVML indices (what CUDA and users see).
    Nvml,
    /// PCI bus order, because NVML was not available; may differ from CUDA's numbering.
    #[default]
    Pci,
    /// The row order of a saved `nvidia-smi topo -m`.
    Topo,
}

/// A NIC choice for a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicChoice {
    pub hca: String,
    /// Port, `null` when unknown (from `topo -m`).
    pub port: Option<u32>,
    pub path: PathType,
}

/// An alternate NIC for a GPU (`port` left out when unknown).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlternateNic {
    pub hca: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    pub path: PathType,
}

/// One row of the affinity map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuAffinityEntry {
    pub index: u32,
    /// NUMA node, `null` when unknown.
    pub numa: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// `null` when the node has no compute NIC at all.
    pub preferred: Option<NicChoice>,
    pub alternates: Vec<AlternateNic>,
}

/// The GPU-to-NIC affinity map.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AffinityMap {
    pub gpus: Vec<GpuAffinityEntry>,
}

/// A compute rail: an HCA port and the GPUs that prefer it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rail {
    pub hca: String,
    pub port: u32,
    pub link_layer: Option<LinkLayer>,
    pub state: PortState,
    pub rate_gbps: Option<f64>,
    pub gpus: Vec<u32>,
    pub netdev: Option<String>,
    /// RoCE: the GID index NCCL chooses on this port ([`gid::nccl_roce_gid_index`]), which
    /// the RDMA tests run on too; `None` on InfiniBand (NCCL uses index 0 there) or when the
    /// GID table is unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u32>,
}

/// A NIC port and its role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NicSummary {
    pub hca: String,
    pub port: u32,
    pub role: NicRole,
    pub link_layer: Option<LinkLayer>,
    pub state: PortState,
    pub rate_gbps: Option<f64>,
    pub netdev: Option<String>,
    pub pci_bus_id: Option<String>,
    pub numa: Option<u32>,
}

// Findings are part of the certificate, so their types live in the shared model.
pub use railguard_api::finding::{Finding, FindingKind, Severity};

/// The result of discovery: inventory plus every decision made from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    pub gpus: Vec<Gpu>,
    pub hcas: Vec<Hca>,
    pub index_order: IndexOrder,
    /// GPU x NIC-port path types.
    pub paths: Vec<PairPath>,
    pub nics: Vec<NicSummary>,
    pub affinity: AffinityMap,
    pub rails: Vec<Rail>,
    pub findings: Vec<Finding>,
    pub platform: Platform,
}

impl Discovery {
    /// The compute rails in signature form (rate rounded to whole Gb/s; a rail whose rate
    /// or link layer is unknown takes its peers' most common value).
    pub fn rail_layout(&self) -> Vec<RailLayout> {
        profile::rail_layout(&self.rails)
    }

    /// The rail-layout signature of this node (`railguard_api::layout_signature`).
    pub fn signature(&self) -> String {
        railguard_api::layout_signature(&self.rail_layout())
    }

    /// The compute rails as FabricProfile rail specs.
    pub fn rail_specs(&self) -> Vec<RailSpec> {
        profile::rail_specs(&self.rails)
    }

    /// Findings at or above a severity.
    pub fn findings_at_least(&self, severity: Severity) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.severity >= severity)
    }
}

/// Reads the machine under `root` (NVML is consulted only when `use_nvml` is set and the
/// driver library loads).
pub fn read(root: &Path, use_nvml: bool) -> Result<Inventory, DiscoverError> {
    read_inventory(root, use_nvml)
}

/// Pure: every decision over an inventory.
pub fn analyze(inv: &Inventory) -> Discovery {
    affinity::analyze(inv)
}

/// Reads and analyzes the node under `root`. The usual entry point.
pub fn discover(root: &Path, use_nvml: bool) -> Result<Discovery, DiscoverError> {
    let inv = read(root, use_nvml)?;
    Ok(analyze(&inv))
}

/// Reads everything discovery needs from `root`.
fn read_inventory(root: &Path, use_nvml: bool) -> Result<Inventory, DiscoverError> {
    if !root.is_dir() {
        return Err(DiscoverError::NoRoot {
            path: root.display().to_string(),
        });
    }
    let (pci, mut read_problems) = pci::read_pci_devices(root)?;
    let (hcas, hca_problems) = ib::read_hcas_with_problems(root, &pci);
    read_problems.extend(hca_problems);
    let platform = readiness::read_platform(root);

    // PCI order first; NVML (when it answers) renumbers to what CUDA and users see.
    let mut gpus: Vec<Gpu> = pci
        .values()
        .filter(|d| d.is_gpu())
        .enumerate()
        .map(|(i, d)| Gpu {
            index: u32::try_from(i).unwrap_or(u32::MAX),
            pci_bus_id: d.address.clone(),
            numa: d.numa,
            name: None,
            uuid: None,
        })
        .collect();
    let mut index_order = IndexOrder::Pci;
    if use_nvml {
        if let Ok(report) = nvml::nvml_gpus() {
            if nvml::apply_nvml_order(&mut gpus, &report) {
                index_order = IndexOrder::Nvml;
            }
        }
    }
    Ok(Inventory {
        pci,
        gpus,
        hcas,
        index_order,
        platform,
        read_problems,
    })
}
