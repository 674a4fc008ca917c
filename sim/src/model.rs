//! The node model: a simulated GPU node described in YAML (`prober/models/*.yaml`).
//!
//! One model drives every simulated layer: [`crate::write_sysfs`] turns its PCIe tree,
//! HCA ports and platform into a sysfs tree that the real discovery code reads; the
//! certification simulation reads the per-port benchmark figures (`write_bw_gbps`,
//! `latency_us`, `counter_growth`) and the node's `nccl` behaviour from it.
//!
//! Everything except the PCIe tree has a serde default, so a model only states what it
//! cares about. A model may also be an overlay: `base: other.yaml` plus `faults: [...]`
//! (see [`Fault`]), resolved by [`NodeModel::load`].
//!
//! PCIe tree: each socket has host bridges (`pci0000:BB`); each child of a host bridge hangs
//! off its own root port; each child of a `switch` hangs off its own downstream port. So a
//! GPU and an HCA in one switch are PIX, in two switches below a common switch PXB, under
//! different root ports of one host bridge PHB, under two host bridges of a socket NODE,
//! on different sockets SYS. Bus numbers are assigned depth-first from the host bridge's
//! `bus`, so PCI order follows the YAML order.

use std::collections::BTreeMap;

use railguard_api::{LinkLayer, Transport};
use serde::{Deserialize, Serialize};

/// A simulated node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeModel {
    /// Model name, e.g. `dgx-h100`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Another model file this one starts from (relative to this file); resolved by `load`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Faults applied on top of the base (or of this model's own tree).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
    #[serde(default)]
    pub software: SoftwareVersions,
    #[serde(default)]
    pub platform: PlatformModel,
    #[serde(default)]
    pub nccl: NcclBehaviour,
    /// CPU sockets (NUMA nodes) with their PCIe trees. Empty in an overlay (taken from base).
    #[serde(default)]
    pub sockets: Vec<SocketModel>,
}

/// Software versions the node reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SoftwareVersions {
    /// NVIDIA driver version (`sys/module/nvidia/version`).
    pub driver: String,
    /// CUDA version the driver supports.
    pub cuda: String,
    /// Kernel release (`proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// HCA firmware (`fw_ver`), unless an HCA sets its own.
    pub fw_ver: String,
    /// OFED / rdma-core release.
    pub ofed: String,
}

impl Default for SoftwareVersions {
    fn default() -> Self {
        Self {
            driver: "550.54.15".into(),
            cuda: "12.4".into(),
            kernel: "5.15.0-105-generic".into(),
            fw_ver: "28.39.1002".into(),
            ofed: "MLNX_OFED_LINUX-24.01-0.3.3.1".into(),
        }
    }
}

/// IOMMU configuration of the simulated platform.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IommuMode {
    /// No IOMMU groups (`/sys/class/iommu` empty), nothing on the command line.
    #[default]
    Off,
    /// IOMMU on, `iommu=pt`: DMA is not translated for host devices.
    Passthrough,
    /// IOMMU on with translation (`intel_iommu=on` without `iommu=pt`): peer-to-peer DMA
    /// is translated and may be redirected or blocked.
    Translated,
}

/// Kernel and driver facts that decide whether GPUDirect RDMA can work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlatformModel {
    pub iommu: IommuMode,
    /// Full kernel command line; derived from `iommu` when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// `nvidia_peermem` loaded (`sys/module/nvidia_peermem`).
    pub nvidia_peermem: bool,
    /// NVIDIA open kernel module (needed, with a recent kernel, for DMA-BUF).
    pub open_kernel_module: bool,
    /// NVIDIA driver loaded at all (`sys/module/nvidia`).
    pub nvidia_driver: bool,
}

impl Default for PlatformModel {
    fn default() -> Self {
        Self {
            iommu: IommuMode::Off,
            cmdline: None,
            nvidia_peermem: true,
            open_kernel_module: false,
            nvidia_driver: true,
        }
    }
}

/// How NCCL's `all_reduce_perf` behaves on this node (for the simulated nccl-tests binary).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NcclBehaviour {
    /// Large-message busbw plateau of the node's NCCL loopback (P2P and SHM off: every ring
    /// hop leaves one GPU's NIC and enters the next GPU's), GB/s: about one rail's line rate
    /// (NDR 400 Gb/s = 50 GB/s; public single-node figures for GPUs without NVLink over IB NDR
    /// read 40-50 GB/s).
    pub busbw_gbps: f64,
    /// Plateau with P2P on (NVLink/NVSwitch), GB/s: 8x H100 SXM5 reads 460-480 in public
    /// nccl-tests figures; 8x A100 SXM4 232 (prober/fixtures/nccl-tests/superbench-a100-1x8...).
    pub nvlink_busbw_gbps: f64,
    /// Inter-node transport NCCL reports (`IB` or `Socket` for a fallback).
    pub transport: Transport,
    /// GPUDirect RDMA in use (`GDRDMA` in the NCCL log).
    pub gdr: bool,
    /// `#wrong` reported per size (0 when healthy).
    pub wrong: u64,
    pub nccl_version: String,
}

impl Default for NcclBehaviour {
    fn default() -> Self {
        Self {
            busbw_gbps: 46.5,
            nvlink_busbw_gbps: 470.0,
            transport: Transport::Ib,
            gdr: true,
            wrong: 0,
            nccl_version: "2.21.5".into(),
        }
    }
}

/// One CPU socket and the PCIe trees behind it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SocketModel {
    /// NUMA node id written to devices' `numa_node` (unless a device overrides it).
    pub numa: u32,
    /// CPU list, e.g. `0-55,112-167`.
    #[serde(default)]
    pub cpus: String,
    pub host_bridges: Vec<HostBridgeModel>,
}

/// A PCIe host bridge (root complex), `pci<domain>:<bus>` in sysfs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostBridgeModel {
    #[serde(default)]
    pub domain: u16,
    /// Root bus number; downstream buses are numbered from `bus + 1`.
    pub bus: u8,
    /// Each child sits behind its own root port.
    pub children: Vec<PciNodeModel>,
}

/// A node of the PCIe tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PciNodeModel {
    /// A PCIe switch: an upstream port and one downstream port per child.
    Switch(SwitchModel),
    Gpu(GpuModel),
    /// A single-function RDMA NIC.
    Hca(HcaModel),
    /// A multi-function RDMA NIC (e.g. a dual-port NIC exposing mlx5_1 and mlx5_2).
    Nic(NicModel),
}

/// A PCIe switch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchModel {
    /// Name used by faults (e.g. `sw-gpu0`).
    #[serde(default)]
    pub name: String,
    /// ACS P2P Request/Completion Redirect enabled on the downstream ports.
    #[serde(default)]
    pub acs_redirect: bool,
    /// Link of the upstream port.
    #[serde(default)]
    pub link: LinkModel,
    pub children: Vec<PciNodeModel>,
}

/// A PCIe link (`current_link_*` / `max_link_*`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkModel {
    pub width: u32,
    pub max_width: u32,
    /// GT/s (32 = Gen5, 16 = Gen4).
    pub speed_gts: f64,
    pub max_speed_gts: f64,
}

impl Default for LinkModel {
    fn default() -> Self {
        Self {
            width: 16,
            max_width: 16,
            speed_gts: 32.0,
            max_speed_gts: 32.0,
        }
    }
}

/// A GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModel {
    /// NVML/CUDA index of this GPU.
    pub index: u32,
    #[serde(default = "default_gpu_name")]
    pub name: String,
    /// PCI device id (0x2330 = H100 SXM5 80GB).
    #[serde(default = "default_gpu_device")]
    pub device_id: u16,
    /// PCI class (0x030200 = 3D controller, 0x030000 = VGA).
    #[serde(default = "default_gpu_class")]
    pub class: u32,
    #[serde(default)]
    pub link: LinkModel,
    /// Overrides the socket's NUMA node (-1 = unknown, as some firmware reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
}

fn default_gpu_name() -> String {
    "NVIDIA H100 80GB HBM3".into()
}
fn default_gpu_device() -> u16 {
    0x2330
}
fn default_gpu_class() -> u32 {
    0x030200
}

/// A multi-function NIC: one PCI device, one RDMA device per function.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicModel {
    pub functions: Vec<HcaModel>,
}

/// An RDMA device (one PCI function).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HcaModel {
    /// RDMA device name, e.g. `mlx5_0`.
    pub name: String,
    /// PCI device id (0x1021 = ConnectX-7, 0x101b = ConnectX-6).
    #[serde(default = "default_hca_device")]
    pub device_id: u16,
    /// Firmware version; the node's `software.fw_ver` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fw_ver: Option<String>,
    #[serde(default)]
    pub link: LinkModel,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    #[serde(default = "default_ports")]
    pub ports: Vec<PortModel>,
}

fn default_hca_device() -> u16 {
    0x1021
}
fn default_ports() -> Vec<PortModel> {
    vec![PortModel::default()]
}

/// Port state in a model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ModelPortState {
    Down,
    Init,
    Armed,
    #[default]
    Active,
}

/// Simulated RDMA WRITE bandwidth of a port, Gb/s.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WriteBw {
    /// From host memory; 96% of the link rate when unset (0 when the port is not active).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<f64>,
    /// From GPU memory (GPUDirect); 94% of the link rate when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<f64>,
}

/// One HCA port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortModel {
    pub port: u32,
    pub state: ModelPortState,
    /// Link rate, Gb/s (400 = NDR / 400GbE, 200 = HDR).
    pub rate_gbps: u32,
    pub link_layer: LinkLayer,
    /// Netdev behind the port (IPoIB or the RoCE interface).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    /// MTU of the netdev (and of its VLAN); 4092 (IPoIB) or 9000 (RoCE) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// `sm_lid` of an InfiniBand port (0: no Subnet Manager); a port that is down shows 0.
    pub sm_lid: u32,
    /// Which RoCE GIDs the port's GID table holds (Ethernet ports).
    pub roce_gids: RoceGids,
    /// RoCE traffic runs on VLAN `<netdev>.<vlan>`: the GIDs belong to that VLAN device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The GIDs belong to this netdev instead (a misconfiguration: not the port's netdev).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid_netdev: Option<String>,
    /// Start values of `counters/*` (unlisted standard counters start at 0).
    pub counters: BTreeMap<String, u64>,
    /// Start values of `hw_counters/*`.
    pub hw_counters: BTreeMap<String, u64>,
    /// How much each counter (`counters/` or `hw_counters/`) grows per simulated run.
    pub counter_growth: BTreeMap<String, u64>,
    pub write_bw_gbps: WriteBw,
    /// Small-message RDMA WRITE latency, microseconds: `ib_write_lat`'s half round trip.
    pub latency_us: f64,
}

impl Default for PortModel {
    fn default() -> Self {
        Self {
            port: 1,
            state: ModelPortState::Active,
            rate_gbps: 400,
            link_layer: LinkLayer::Ib,
            netdev: None,
            mtu: None,
            sm_lid: 1,
            roce_gids: RoceGids::default(),
            vlan: None,
            gid_netdev: None,
            counters: BTreeMap::new(),
            hw_counters: BTreeMap::new(),
            counter_growth: BTreeMap::new(),
            write_bw_gbps: WriteBw::default(),
            latency_us: 2.5,
        }
    }
}

/// The RoCE GIDs of a port: the kernel adds a RoCE v1 and a RoCE v2 GID per address of the
/// netdev (link-local and IPv4-mapped here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoceGids {
    /// v1 and v2 GIDs, as the kernel sets them up (healthy).
    #[default]
    V1AndV2,
    /// Only RoCE v1 GIDs (RoCE v2 disabled).
    V1Only,
    /// No GIDs at all (no address on the netdev).
    None,
}

impl PortModel {
    /// The netdev the port's GIDs belong to: `gid_netdev`, else the VLAN on the netdev,
    /// else the netdev.
    pub fn gid_netdev(&self) -> Option<String> {
        if let Some(n) = &self.gid_netdev {
            return Some(n.clone());
        }
        let netdev = self.netdev.as_ref()?;
        Some(match self.vlan {
            Some(id) => format!("{netdev}.{id}"),
            None => netdev.clone(),
        })
    }

    /// The netdev MTU the port's netdev reports.
    pub fn netdev_mtu(&self) -> u32 {
        self.mtu.unwrap_or(match self.link_layer {
            LinkLayer::Ib => 4092,
            LinkLayer::Roce => 9000,
        })
    }

    /// Simulated RDMA WRITE bandwidth (Gb/s) from host or GPU memory.
    pub fn simulated_write_bw_gbps(&self, gpu_memory: bool) -> f64 {
        if self.state != ModelPortState::Active {
            return 0.0;
        }
        let (set, share) = if gpu_memory {
            (self.write_bw_gbps.gpu, 0.94)
        } else {
            (self.write_bw_gbps.host, 0.96)
        };
        set.unwrap_or(f64::from(self.rate_gbps) * share)
    }
}

/// A fault applied to a model (in `faults:`), so fault models stay small overlays.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Fault {
    /// Move an HCA (with its switch branch left behind) to a new root port on the first
    /// host bridge of the other socket.
    HcaFarSocket { hca: String },
    /// Take a port down.
    PortDown { hca: String, port: u32 },
    /// Lower a port's link rate (e.g. NDR 400 -> 200).
    PortRate {
        hca: String,
        port: u32,
        rate_gbps: u32,
    },
    /// Train a device's PCIe link narrower than its maximum (GPU `gpuN` or HCA name).
    PcieWidth { device: String, width: u32 },
    /// Train a device's PCIe link slower than its maximum.
    PcieSpeed { device: String, speed_gts: f64 },
    /// Enable ACS P2P redirect on a named switch.
    AcsRedirect { switch: String },
    /// Make a device report `numa_node` -1 (GPU `gpuN` or HCA name).
    NumaUnknown { device: String },
    /// Make a port's counter grow per run.
    CounterGrowth {
        hca: String,
        port: u32,
        counter: String,
        per_run: u64,
    },
    /// Start a port's counter at a value (e.g. `symbol_error` from a marginal cable).
    CounterValue {
        hca: String,
        port: u32,
        counter: String,
        value: u64,
    },
    /// An InfiniBand port that knows no Subnet Manager (`sm_lid` 0).
    NoSubnetManager { hca: String, port: u32 },
    /// Change which RoCE GIDs a port has (e.g. `v1-only`).
    RoceGids {
        hca: String,
        port: u32,
        gids: RoceGids,
    },
    /// Put a port's GIDs on another netdev than its own.
    GidNetdev {
        hca: String,
        port: u32,
        netdev: String,
    },
    /// Set the MTU of a port's netdev (e.g. 1500 on a RoCE rail).
    NetdevMtu { hca: String, port: u32, mtu: u32 },
    /// Run a port's RDMA WRITE bandwidth (from host and GPU memory) at `percent` of what it
    /// would be: a marginal cable or optic that still links at full rate.
    PortBandwidth {
        hca: String,
        port: u32,
        percent: f64,
    },
}
