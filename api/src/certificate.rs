//! The certificate record the prober stores on a Node in the `railguard.io/certificate`
//! annotation. Versioned (`version`); readers tolerate fields they do not know, and keep
//! them when they round-trip a record.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::error::CertificateError;
use crate::signature::LinkLayer;

/// The certificate format version this crate writes.
pub const CERTIFICATE_VERSION: u32 = 1;
/// Upper bound on an annotation we are willing to parse (the API server caps all
/// annotations of an object at 256 KiB).
pub const MAX_CERTIFICATE_BYTES: usize = 256 * 1024;

/// Outcome of a certification, also the value of the `railguard.io/fabric` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Certified,
    Degraded,
    Failed,
    Pending,
}

impl Verdict {
    pub fn as_label(self) -> &'static str {
        match self {
            Verdict::Certified => crate::keys::fabric::CERTIFIED,
            Verdict::Degraded => crate::keys::fabric::DEGRADED,
            Verdict::Failed => crate::keys::fabric::FAILED,
            Verdict::Pending => crate::keys::fabric::PENDING,
        }
    }

    pub fn from_label(v: &str) -> Option<Self> {
        match v {
            "certified" => Some(Verdict::Certified),
            "degraded" => Some(Verdict::Degraded),
            "failed" => Some(Verdict::Failed),
            "pending" => Some(Verdict::Pending),
            _ => None,
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_label())
    }
}

/// Health of one rail in a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RailVerdict {
    Healthy,
    Degraded,
    Failed,
}

/// What failed on a rail, in the form a DRA taint's value takes (`railguard.io/rail=<fault>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RailFault {
    /// Port missing, not ACTIVE or not LinkUp.
    LinkDown,
    /// Link layer or rate not the profile's.
    LinkRate,
    /// Error counters grew beyond the profile's allowance.
    Errors,
    /// The host-memory RDMA write test failed or fell below the threshold.
    Rdma,
    /// Small-message latency above the profile's maximum.
    Latency,
    /// GPUDirect RDMA: GPU-memory registration or bandwidth (the GPU↔NIC path).
    Gpudirect,
    /// The PCIe link of the rail's GPU or NIC trained below its capability.
    Pcie,
    /// A pairwise test against peers (campaign) failed on this rail.
    Wire,
    /// The job's own traffic showed the rail grey (passive telemetry): an outlier among the
    /// rails the job uses, a retransmit or error burst, or NCCL WQE stalls.
    Grey,
    /// Failed for a reason without a finer class.
    Failed,
}

impl RailFault {
    pub fn as_str(self) -> &'static str {
        match self {
            RailFault::LinkDown => "link-down",
            RailFault::LinkRate => "link-rate",
            RailFault::Errors => "errors",
            RailFault::Rdma => "rdma",
            RailFault::Latency => "latency",
            RailFault::Gpudirect => "gpudirect",
            RailFault::Pcie => "pcie",
            RailFault::Wire => "wire",
            RailFault::Grey => "grey",
            RailFault::Failed => "failed",
        }
    }

    /// Whether the fault lies on the GPU↔NIC path, so the rail's GPU is suspect too.
    pub fn on_gpu_path(self) -> bool {
        matches!(self, RailFault::Gpudirect | RailFault::Pcie)
    }
}

/// PCIe distance between a GPU and an HCA, in NCCL / `nvidia-smi topo -m` terms, closest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PathType {
    /// Same PCIe switch, at most one bridge.
    #[serde(rename = "PIX")]
    Pix,
    /// Several PCIe bridges, no host bridge.
    #[serde(rename = "PXB")]
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    #[serde(rename = "PHB")]
    Phb,
    /// Across host bridges within one NUMA node.
    #[serde(rename = "NODE")]
    Node,
    /// Across the CPU interconnect (QPI/UPI/xGMI).
    #[serde(rename = "SYS")]
    Sys,
}

impl PathType {
    pub fn as_str(self) -> &'static str {
        match self {
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Phb => "PHB",
            PathType::Node => "NODE",
            PathType::Sys => "SYS",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "PIX" => Some(PathType::Pix),
            "PXB" => Some(PathType::Pxb),
            "PHB" => Some(PathType::Phb),
            "NODE" => Some(PathType::Node),
            "SYS" => Some(PathType::Sys),
            _ => None,
        }
    }
}

impl std::fmt::Display for PathType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Network transport NCCL chose between nodes (or within one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Transport {
    #[serde(rename = "IB")]
    Ib,
    Socket,
    #[serde(rename = "P2P")]
    P2p,
    #[serde(rename = "SHM")]
    Shm,
}

/// Results for one rail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RailResult {
    pub hca: String,
    pub port: u32,
    /// PCI address of the HCA's function (`0000:8a:00.0`): how DRA NIC devices are matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// PCI addresses of the HCA's SR-IOV virtual functions (sysfs `virtfn*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sriov_vfs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<LinkLayer>,
    /// Port state as read (`ACTIVE`, `DOWN`, ...), empty when the port is missing.
    #[serde(default)]
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bw_host_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bw_gpu_gbps: Option<f64>,
    /// HCA-loopback small-message latency from host memory, microseconds: `ib_write_lat`'s
    /// typical (median) half round trip of a 2-byte ping-pong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    /// The GID table index the rail's RDMA tests ran on: on RoCE the one NCCL chooses
    /// (RoCE v2 in the address family, `ncclIbGetGidIndex`), on InfiniBand the port GID 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u32>,
    /// Error counter growth over the check window, by counter name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counter_deltas: BTreeMap<String, u64>,
    pub verdict: RailVerdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// The classes of the failures in `reasons`, first the one that names the taint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<RailFault>,
    /// Wire health from pairwise tests with peers (campaigns).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wire: Vec<WireResult>,
    /// GPUDirect RDMA on this rail: the GPU tested, how its memory was registered, and the
    /// runbook's comparison with a GPU on the other socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory: Option<GpuMemoryResult>,
    /// Set while a passive check's failure holds the rail (passive healing,
    /// `certification.passiveHealWindows`): how long it has been clean, how often it failed
    /// again, and what it was before. Absent on every rail an invasive run judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive_hold: Option<PassiveHold>,
}

/// A rail held by a passive failure (`link-down`, `link-rate`, `errors`) until it heals
/// passively: it stays failed until `cleanWindows` reaches the profile's
/// `passiveHealWindows` doubled once per flap (N, 2N, 4N, at most 8N), then shows `before`
/// again and stays held (a further failure is one more flap) for as many clean checks again;
/// then the hold goes. Kept in the certificate so that it survives a prober restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PassiveHold {
    /// Consecutive clean passive checks since the rail's last passive failure.
    #[serde(default)]
    pub clean_windows: u32,
    /// Passive failures of the rail after the first, during the hold.
    #[serde(default)]
    pub flaps: u32,
    /// The rail as it was before its first passive failure: what a heal restores.
    pub before: RailBefore,
}

/// What a rail was before a passive failure held it ([`PassiveHold::before`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RailBefore {
    pub verdict: RailVerdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<RailFault>,
}

/// Key of the node's passive hold in the certificate JSON ([`Certificate::passive_hold`]).
pub const PASSIVE_HOLD_KEY: &str = "passiveHold";

/// The node's side of passive healing: the verdict and reasons the node had before a passive
/// rail failure changed them, restored when every held rail has healed and nothing else
/// failed. Absent when no passive failure holds the node's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePassiveHold {
    pub before: NodeBefore,
}

/// The node's verdict and reasons before a passive failure ([`NodePassiveHold::before`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeBefore {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// The GPU-memory test of a rail (its bandwidth is [`RailResult::write_bw_gpu_gbps`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuMemoryResult {
    /// The rail's own GPU (railguard's index).
    pub gpu: u32,
    /// The registration path that worked: `dma-buf` or `peermem`.
    pub registration: String,
    /// Paths tried before it and why they failed (`dma-buf: ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
    /// The same half round trip as [`RailResult::latency_us`], from GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    /// A GPU on the other socket, tested the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far_gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far_write_bw_gbps: Option<f64>,
}

impl RailResult {
    /// Rail `hca`:`port` judged `verdict`, with nothing measured or read yet: what a caller
    /// fills in.
    pub fn new(hca: &str, port: u32, verdict: RailVerdict) -> Self {
        RailResult {
            hca: hca.to_string(),
            port,
            pci_address: None,
            sriov_vfs: Vec::new(),
            faults: Vec::new(),
            link_layer: None,
            state: String::new(),
            rate_gbps: None,
            write_bw_host_gbps: None,
            write_bw_gpu_gbps: None,
            latency_us: None,
            gid_index: None,
            counter_deltas: BTreeMap::new(),
            verdict,
            reasons: Vec::new(),
            wire: Vec::new(),
            gpu_memory: None,
            passive_hold: None,
        }
    }

    pub fn id(&self) -> String {
        format!("{}:{}", self.hca, self.port)
    }
}

/// One pairwise test of a rail against a peer node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireResult {
    pub peer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bw_gbps: Option<f64>,
    /// Post to completion of one signaled small write to the peer, microseconds: about a
    /// round trip, not the loopback's `ib_write_lat` half round trip (no ping-pong between
    /// nodes yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tested_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A GPU and the HCA it should use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuAffinity {
    /// GPU index (NVML order when NVML was available, otherwise PCI order).
    pub gpu: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    pub preferred_hca: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    pub path: PathType,
    /// NUMA node, `None` when the kernel reports -1 (unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
}

/// NCCL results of a certification run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclResult {
    /// Stable large-message bus bandwidth of the NCCL loopback (one rank per GPU, P2P, SHM
    /// and NVLS off: every byte through the NICs), GB/s.
    #[serde(
        default,
        rename = "busbwPlateauGBps",
        alias = "busbwPlateauGbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub busbw_plateau_gbps: Option<f64>,
    /// Ranks of the loopback run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<u32>,
    /// Plateau of the optional NVLink run (P2P on), GB/s.
    #[serde(
        default,
        rename = "nvlinkBusbwGBps",
        skip_serializing_if = "Option::is_none"
    )]
    pub nvlink_busbw_gbps: Option<f64>,
    #[serde(
        default,
        rename = "algbwGBps",
        alias = "algbwGbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub algbw_gbps: Option<f64>,
    #[serde(
        default,
        rename = "avgBusbwGBps",
        alias = "avgBusbwGbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub avg_busbw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdr: Option<bool>,
    #[serde(default)]
    pub wrong: u64,
    /// HCAs NCCL actually used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hcas: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
}

/// A past result kept for regression detection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub issued_at: Timestamp,
    pub verdict: Verdict,
    #[serde(
        default,
        rename = "busbwPlateauGBps",
        alias = "busbwPlateauGbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub busbw_plateau_gbps: Option<f64>,
    /// Host-memory write bandwidth per rail (`hca:port` -> Gb/s).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rail_write_bw_gbps: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub software: BTreeMap<String, String>,
}

/// What last renewed a certificate's validity without an invasive run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RenewedBy {
    /// The jobs' own traffic: every rail carried healthy, symmetric traffic and the passive
    /// checks were clean while GPU pods held back the invasive run.
    Traffic,
}

/// A renewal of a certificate by passive evidence: what it rests on and what it does not
/// prove. `issuedAt` stays the last invasive pass; `expiresAt` moves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficRenewal {
    pub renewed_by: RenewedBy,
    pub renewed_at: Timestamp,
    /// The traffic window the renewal rests on.
    pub window_start: Timestamp,
    pub window_end: Timestamp,
    /// Bytes each rail (`hca:port`) sent and received in the window.
    pub bytes_per_rail: BTreeMap<String, u64>,
    /// Renewals since the last invasive pass (bounded by the prober).
    pub renewals: u32,
    /// What passive evidence does not prove (an invasive run does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_proven: Vec<String>,
}

/// The certificate stored on a Node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    /// Format version, see [`CERTIFICATE_VERSION`].
    pub version: u32,
    /// Increases with every certificate the prober publishes for the node.
    pub generation: u64,
    pub issued_at: Timestamp,
    pub expires_at: Timestamp,
    pub profile: String,
    pub signature: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Rails that passed (healthy or regressed but within the hard rules): a `degraded`
    /// node with some usable rails still serves DRA claims on those rails' GPU↔NIC pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usable_rails: Option<u32>,
    #[serde(default)]
    pub rails: Vec<RailResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuAffinity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclResult>,
    /// Readiness and fabric findings of the run (warning and above), with their evidence;
    /// the profile's `certification.fatalFindings` decides which of them failed the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<crate::finding::Finding>,
    /// Software baseline (driver, CUDA, kernel, firmware, OFED, NCCL, nccl-tests digest).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub software: BTreeMap<String, String>,
    /// When the last passive check ran (counters, link state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive_checked_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// Made by a simulated RDMA engine and the stand-in `all_reduce_perf` (`--sim`), not by
    /// measuring hardware.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
    /// The last renewal by the jobs' own traffic since the last invasive pass, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal: Option<TrafficRenewal>,
    /// Fields written by newer versions, kept on round trips.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Certificate {
    /// A certificate of `verdict` for `profile` and `signature`, valid from `issued_at` to
    /// `expires_at`, generation 0 and without evidence: what a caller fills in.
    pub fn new(
        profile: &str,
        signature: &str,
        verdict: Verdict,
        issued_at: Timestamp,
        expires_at: Timestamp,
    ) -> Self {
        Certificate {
            version: CERTIFICATE_VERSION,
            generation: 0,
            issued_at,
            expires_at,
            profile: profile.to_string(),
            signature: signature.to_string(),
            node: None,
            verdict,
            reasons: Vec::new(),
            usable_rails: None,
            rails: Vec::new(),
            gpus: Vec::new(),
            nccl: None,
            findings: Vec::new(),
            software: BTreeMap::new(),
            passive_checked_at: None,
            history: Vec::new(),
            simulated: false,
            renewal: None,
            extra: BTreeMap::new(),
        }
    }

    /// Parses a certificate annotation. Rejects oversize input, malformed JSON and
    /// versions newer than this reader understands.
    pub fn from_annotation(value: &str) -> Result<Self, CertificateError> {
        if value.len() > MAX_CERTIFICATE_BYTES {
            return Err(CertificateError::TooLarge { bytes: value.len() });
        }
        if value.trim().is_empty() {
            return Err(CertificateError::Empty);
        }
        // Check the version first, so a future format gets a version error, not a field error.
        let raw: serde_json::Value =
            serde_json::from_str(value).map_err(|source| CertificateError::Json { source })?;
        let version = raw
            .get("version")
            .ok_or(CertificateError::MissingVersion)?
            .as_u64()
            .ok_or(CertificateError::MissingVersion)?;
        if version == 0 || version > u64::from(CERTIFICATE_VERSION) {
            return Err(CertificateError::UnsupportedVersion { version });
        }
        serde_json::from_value(raw).map_err(|source| CertificateError::Json { source })
    }

    /// The annotation value (compact JSON).
    /// The certificate an object's annotations carry (`railguard.io/certificate`): `None`
    /// without one, else the annotation parsed. The one way every component reads a Node's
    /// certificate.
    pub fn of_annotations(
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Option<Result<Self, CertificateError>> {
        annotations?
            .get(crate::keys::ANNOTATION_CERTIFICATE)
            .map(|raw| Certificate::from_annotation(raw))
    }

    pub fn to_annotation(&self) -> Result<String, CertificateError> {
        serde_json::to_string(self).map_err(|source| CertificateError::Json { source })
    }

    /// Whether the certificate has expired at `now`.
    /// The `railguard.io/fabric` label this certificate stands for at `now`: its verdict,
    /// except that a certification past `expiresAt` is `pending` (it awaits renewal, and
    /// every selector on `certified` stops matching). The prober, the campaign and the
    /// fleet controller all write this, so none of them undoes another's label.
    pub fn fabric_label(&self, now: Timestamp) -> &'static str {
        match self.verdict {
            Verdict::Certified if self.is_expired(now) => crate::keys::fabric::PENDING,
            v => v.as_label(),
        }
    }

    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// The value of the `railguard.io/simulated` label that goes with this certificate:
    /// `"true"` for a simulated one, absent for a measured one.
    pub fn simulated_label(&self) -> Option<&'static str> {
        self.simulated.then_some(crate::keys::SIMULATED)
    }

    pub fn rail(&self, hca: &str, port: u32) -> Option<&RailResult> {
        self.rails.iter().find(|r| r.hca == hca && r.port == port)
    }
}

/// Key of the NCCL pair results in the certificate JSON ([`Certificate::nccl_pairs`]).
pub const NCCL_PAIRS_KEY: &str = "ncclPairs";

/// One NCCL all-reduce pair test of a campaign against a peer node: the full node (every GPU,
/// every rail) or one rail (`NCCL_IB_HCA` limited to it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclPairResult {
    pub peer: String,
    /// `hca:port` of a per-rail test; absent for the full-node test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<String>,
    /// Bus bandwidth at the sweep's largest size, GB/s (nccl-tests units).
    #[serde(
        default,
        rename = "busbwGBps",
        alias = "busbwGbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub busbw_gbps: Option<f64>,
    #[serde(
        default,
        rename = "algbwGBps",
        alias = "algbwGbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub algbw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdr: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrong: Option<u64>,
    /// HCA ports NCCL used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hcas: Vec<String>,
    /// Within the profile's limits (correct result, NET/IB, GDR as expected, busbw).
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tested_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl NcclPairResult {
    /// `node` for the full-node test, else the rail.
    pub fn scope(&self) -> &str {
        self.rail.as_deref().unwrap_or("node")
    }
}

// The pair results live in the record's extension map under NCCL_PAIRS_KEY: every writer of
// this version keeps `extra` on round trips, and no constructor of a Certificate changes.
impl Certificate {
    /// The NCCL pair results of the last campaign that ran them (empty when none did, or
    /// when the entry is unreadable).
    pub fn nccl_pairs(&self) -> Vec<NcclPairResult> {
        self.extra
            .get(NCCL_PAIRS_KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// Replaces the NCCL pair results (an empty list removes the entry).
    pub fn set_nccl_pairs(&mut self, pairs: &[NcclPairResult]) {
        match serde_json::to_value(pairs) {
            Ok(v) if !pairs.is_empty() => {
                self.extra.insert(NCCL_PAIRS_KEY.to_string(), v);
            }
            _ => {
                self.extra.remove(NCCL_PAIRS_KEY);
            }
        }
    }
}

// The node's passive hold lives in the extension map under PASSIVE_HOLD_KEY, as the NCCL pair
// results do: every writer of this version keeps `extra`, an invasive certificate starts
// without it (and so clears it), and no constructor of a Certificate changes.
impl Certificate {
    /// The node's passive hold (`None` when there is none, or the entry is unreadable: then
    /// the node keeps its verdict until an invasive run, as without passive healing).
    pub fn passive_hold(&self) -> Option<NodePassiveHold> {
        self.extra
            .get(PASSIVE_HOLD_KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// Sets or (`None`) removes the node's passive hold.
    pub fn set_passive_hold(&mut self, hold: Option<&NodePassiveHold>) {
        match hold.map(serde_json::to_value) {
            Some(Ok(v)) => {
                self.extra.insert(PASSIVE_HOLD_KEY.to_string(), v);
            }
            _ => {
                self.extra.remove(PASSIVE_HOLD_KEY);
            }
        }
    }
}

/// Formats a duration in seconds the way operators read it: `2h10m`, `45s`, `3d4h`.
pub fn human_duration(secs: i64) -> String {
    let s = secs.unsigned_abs();
    let (d, h, m, sec) = (s / 86400, (s % 86400) / 3600, (s % 3600) / 60, s % 60);
    let out = if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{sec}s")
    } else {
        format!("{sec}s")
    };
    if secs < 0 {
        format!("-{out}")
    } else {
        out
    }
}
