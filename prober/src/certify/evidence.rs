//! The plain data a certification judges. Shells (sysfs readers, the RDMA engine, the NCCL
//! runner) fill these; [`super::policy`] decides over them without IO.

use std::collections::{BTreeMap, BTreeSet};

use railguard_api::profile::Thresholds;
use railguard_api::LinkLayer;
use serde::Serialize;

use crate::nccl::NcclObservation;
use crate::rdma::GpuRegistrationReport;

/// Error counters judged over a check window. Traffic counters (`port_xmit_data`, ...) grow
/// on a healthy port and are never judged; a profile may add more names in `counterGrowth`.
pub const ERROR_COUNTERS: &[&str] = &[
    // InfiniBand port counters (`counters/`)
    "symbol_error",
    "port_rcv_errors",
    "link_downed",
    "link_error_recovery",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "VL15_dropped",
    // RoCE / mlx5 `hw_counters/`
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "implied_nak_seq_err",
    "req_cqe_error",
    "resp_cqe_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_local_length_error",
    "rx_icrc_encapsulated",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
];

/// The counters judged for a profile: the built-in error counters plus the profile's own.
pub fn watched_counters(thresholds: &Thresholds) -> BTreeSet<String> {
    ERROR_COUNTERS
        .iter()
        .map(|s| s.to_string())
        .chain(thresholds.counter_growth.keys().cloned())
        .collect()
}

/// One HCA port as read at one moment (`counters/` and `hw_counters/` merged).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PortReading {
    pub hca: String,
    pub port: u32,
    /// `ACTIVE`, `DOWN`, ...
    pub state: String,
    /// `5: LinkUp`, when readable.
    pub phys_state: Option<String>,
    pub link_layer: Option<LinkLayer>,
    pub rate_gbps: Option<f64>,
    pub counters: BTreeMap<String, u64>,
    /// The HCA's PCI function and its SR-IOV VFs (the certificate's DRA matching keys).
    pub pci_address: Option<String>,
    pub sriov_vfs: Vec<String>,
}

impl PortReading {
    pub fn id(&self) -> String {
        format!("{}:{}", self.hca, self.port)
    }
}

/// Native RDMA results of one rail (invasive).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RailBench {
    pub hca: String,
    pub port: u32,
    pub write_bw_host_gbps: Option<f64>,
    pub write_bw_gpu_gbps: Option<f64>,
    pub latency_us: Option<f64>,
    /// The GID table index the host-memory test ran on.
    pub gid_index: Option<u32>,
    /// The engine's error, when the rail could not be measured.
    pub error: Option<String>,
    /// Why GPU memory was not measured on this rail (no CUDA, no GPUDirect registration).
    pub gpu_unavailable: Option<String>,
    /// Latency of the smallest message from the rail's own GPU's memory, microseconds.
    pub latency_gpu_us: Option<f64>,
    /// Which GPU the GPU-memory test used and how its memory was registered.
    pub gpu_registration: Option<GpuRegistrationReport>,
    /// The runbook's affinity comparison: the same test from a GPU on the other socket.
    pub far_gpu: Option<FarGpuBench>,
}

/// RDMA WRITE from the memory of a GPU on the other socket than the rail's own GPUs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FarGpuBench {
    pub gpu: u32,
    pub write_bw_gbps: Option<f64>,
    /// Why it could not be measured.
    pub error: Option<String>,
}

/// One NCCL run (`main`, and the optional `gdr-off` / `socket` controls).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NcclRunEvidence {
    pub label: String,
    /// Environment that distinguishes the run (`NCCL_NET_GDR_LEVEL=LOC`, ...).
    pub env: Vec<(String, String)>,
    pub outcome: Result<NcclObservation, String>,
}

/// Label of the run that certifies: the node's NCCL loopback, one rank per GPU with
/// [`LOOPBACK_ENV`], so every byte goes GPU → NIC → NIC → GPU.
pub const RUN_MAIN: &str = "main";
/// Optional evidence of the GPU interconnect: P2P, SHM and NVLS as NCCL defaults them.
pub const RUN_NVLINK: &str = "nvlink";
/// What makes a one-node NCCL run cross the NICs: NCCL tries P2P, then SHM, then NET between
/// two GPUs (`src/transport.cc`); with P2P and SHM off the GPUs' path is NET
/// (`src/graph/paths.cc`), and NVLS (NVLink SHARP, `src/transport/nvls.cc`, default on where
/// NVSwitch supports it) would reduce in the switch instead.
pub const LOOPBACK_ENV: [(&str, &str); 3] = [
    ("NCCL_P2P_DISABLE", "1"),
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_NVLS_ENABLE", "0"),
];
/// Negative control: GPUDirect disabled (`NCCL_NET_GDR_LEVEL=LOC`), must be slower.
pub const RUN_GDR_OFF: &str = "gdr-off";
/// Comparison: sockets only (`NCCL_IB_DISABLE=1`).
pub const RUN_SOCKET: &str = "socket";

/// Whether the node advertises the profile's RDMA resource.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResourceExposure {
    pub resource: String,
    /// Allocatable quantity as the Node reports it; `None` when absent.
    pub allocatable: Option<String>,
}

/// Everything one certification run gathered.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Evidence {
    /// Port readings at the start of the check window.
    pub before: Vec<PortReading>,
    /// Port readings at the end of the check window.
    pub after: Vec<PortReading>,
    /// Native RDMA results (empty for a passive check).
    pub benches: Vec<RailBench>,
    /// NCCL runs (empty for a passive check).
    pub nccl: Vec<NcclRunEvidence>,
    /// Rail-layout signature of what discovery found on the node.
    pub layout_signature: Option<String>,
    /// Software baseline: `driver`, `cuda`, `kernel`, `fw_ver`, `ofed`, `nccl`, `nccl-tests`.
    pub software: BTreeMap<String, String>,
    /// RDMA resource exposure; `None` when not known (no Node at hand).
    pub exposure: Option<ResourceExposure>,
    /// Discovery's readiness findings at the end of the window (warning and above).
    pub findings: Vec<railguard_api::Finding>,
    /// Each GPU's PCI address (normalized, `0000:1b:00.0`) → the rail (`hca:port`) it uses:
    /// a finding about that GPU's link is a fault of that rail's GPU↔NIC path.
    pub gpu_rails: BTreeMap<String, String>,
    /// Rails the grey-rail judge holds grey (`hca:port` → its evidence), from the job's own
    /// traffic ([`crate::telemetry::grey`]); passive checks only.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub grey: BTreeMap<String, String>,
}
